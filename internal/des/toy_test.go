package des

import (
	"fmt"
	"time"

	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/prefix"
)

// toyEngine is an engine whose timing a test can work out by hand. A step takes 1 ms plus
// 0.1 ms per prompt token it computes. Each step prefills at most one waiting request (its first
// token comes at the end of that step) and gives every running request one more token. Its
// prefix cache never forgets. It rejects prompts above capTokens.
type toyEngine struct {
	blockSize int
	capTokens int
	cache     map[uint64]bool
	waiting   []*toyReq
	running   []*toyReq
	stats     engine.Stats
}

type toyReq struct {
	r      engine.Request
	out    int
	cached int
}

func newToy(blockSize, capTokens int) *toyEngine {
	return &toyEngine{blockSize: blockSize, capTokens: capTokens, cache: map[uint64]bool{}}
}

func (e *toyEngine) Submit(_ time.Duration, r engine.Request) error {
	if r.PromptTokens > e.capTokens {
		return fmt.Errorf("prompt of %d tokens exceeds the KV capacity of %d", r.PromptTokens, e.capTokens)
	}
	e.waiting = append(e.waiting, &toyReq{r: r})
	e.stats.Waiting = len(e.waiting)
	return nil
}

func (e *toyEngine) Step(now time.Duration) (time.Duration, []engine.Event, bool) {
	if len(e.waiting) == 0 && len(e.running) == 0 {
		return 0, nil, false
	}
	d := time.Millisecond
	var evs []engine.Event
	var still []*toyReq
	for _, q := range e.running {
		q.out++
		if q.out >= q.r.OutputTokens {
			evs = append(evs, engine.Event{Kind: engine.EventFinished, ReqID: q.r.ID, CachedTokens: q.cached, OutputTokens: q.out})
			e.stats.Finished++
			continue
		}
		still = append(still, q)
	}
	e.running = still
	if len(e.waiting) > 0 {
		q := e.waiting[0]
		e.waiting = e.waiting[1:]
		h := prefix.Seed("toy", q.r.Salt)
		hit := true
		for _, k := range q.r.BlockKeys {
			h = prefix.Next(h, k)
			if hit && e.cache[h] && (q.cached+e.blockSize) < q.r.PromptTokens {
				q.cached += e.blockSize
			} else {
				hit = false
			}
			e.cache[h] = true
		}
		d += time.Duration(q.r.PromptTokens-q.cached) * 100 * time.Microsecond
		e.stats.PrefixQueryTokens += int64(q.r.PromptTokens)
		e.stats.PrefixHitTokens += int64(q.cached)
		q.out = 1
		evs = append(evs, engine.Event{Kind: engine.EventFirstToken, ReqID: q.r.ID, CachedTokens: q.cached, OutputTokens: 1})
		if q.r.OutputTokens <= 1 {
			evs = append(evs, engine.Event{Kind: engine.EventFinished, ReqID: q.r.ID, CachedTokens: q.cached, OutputTokens: 1})
			e.stats.Finished++
		} else {
			e.running = append(e.running, q)
		}
	}
	end := now + d
	for i := range evs {
		evs[i].At = end
	}
	e.stats.Busy += d
	e.stats.Running = len(e.running)
	e.stats.Waiting = len(e.waiting)
	e.stats.UsedBlocks = len(e.running)
	e.stats.TotalBlocks = 100
	return end, evs, true
}

func (e *toyEngine) Stats() engine.Stats { return e.stats }
