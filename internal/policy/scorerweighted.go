package policy

import (
	"time"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/prefix"
)

// scorerWeighted is the llm-d router / Gateway API Inference Extension endpoint picker: each
// scorer gives every candidate a score in [0, 1], the weighted sum decides, the maximum wins
// and ties are broken at random. Scorers and published defaults:
//   - prefix (weight 3): matched / total blocks of the prompt, stopping at the first miss, in an
//     approximate index that keeps an LRU of 31,250 blocks of 64 characters per endpoint and
//     records each request's blocks on the endpoint it was sent to;
//   - queue (weight 2): (max - waiting) / (max - min) over the candidates, from the scraped
//     number of waiting requests (1 for all when they are equal);
//   - kv-cache utilisation (weight 2): 1 - scraped KV usage.
//
// Differences from the original: the blocks are kvroute's 16-token blocks of 64 bytes of
// canonical text (llm-d's are 64 characters, the same length for ASCII), and an endpoint never
// scraped scores as empty (0 waiting, 0 KV usage).
type scorerWeighted struct {
	clock                Clock
	rnd                  *lockedRand
	wPrefix, wQueue, wKV float64
	index                *prefix.Index
	eps                  *epTable[struct{}] // the endpoints' slots: their names in index
}

func newScorerWeighted(env Env, p Params) (Picker, error) {
	r := env.params(p)
	sw := &scorerWeighted{
		clock:   env.Clock,
		rnd:     newLockedRand(env),
		wPrefix: r.Float("prefix_weight", 3),
		wQueue:  r.Float("queue_weight", 2),
		wKV:     r.Float("kv_weight", 2),
	}
	lru := r.Int("lru_blocks", 31250)
	r.Require(sw.wPrefix >= 0 && sw.wQueue >= 0 && sw.wKV >= 0, "prefix_weight, queue_weight and kv_weight must not be negative")
	r.Require(lru > 0, "lru_blocks=%d must be positive", lru)
	if err := r.Check(); err != nil {
		return nil, err
	}
	if sw.clock == nil {
		sw.clock = WallClock{}
	}
	sw.index = prefix.NewIndex(prefix.IndexConfig{DefaultCapacity: lru})
	sw.eps = indexTable(sw.clock, sw.index)
	return sw, nil
}

// Pick ranks by weighted score; among equal best scores a random one goes first.
func (sw *scorerWeighted) Pick(req *Request, c []*endpoint.Endpoint) ([]*endpoint.Endpoint, error) {
	n := len(c)
	if n == 0 {
		return nil, ErrNoCandidate
	}
	var buf [32]int // on the stack for a fleet of up to 32
	runs := matchRuns(sw.index, sw.eps, c, req.Blocks, append(buf[:0], make([]int, n)...))
	waiting := make([]float64, n)
	kv := make([]float64, n)
	minQ, maxQ := 0.0, 0.0
	for i, e := range c {
		if s := e.Snapshot(); s != nil {
			waiting[i], kv[i] = float64(s.Waiting), s.KVUsage
		}
		if i == 0 || waiting[i] < minQ {
			minQ = waiting[i]
		}
		if i == 0 || waiting[i] > maxQ {
			maxQ = waiting[i]
		}
	}
	score := make([]float64, n)
	for i := range c {
		pre := 0.0
		if len(req.Blocks) > 0 {
			pre = float64(runs[i]) / float64(len(req.Blocks))
		}
		q := 1.0
		if maxQ > minQ {
			q = (maxQ - waiting[i]) / (maxQ - minQ)
		}
		score[i] = sw.wPrefix*pre + sw.wQueue*q + sw.wKV*(1-min(max(kv[i], 0), 1))
	}
	best := 0
	ties := 0
	for i := range score {
		switch {
		case score[i] > score[best]:
			best, ties = i, 1
		case score[i] == score[best]:
			ties++
		}
	}
	if ties > 1 {
		k := sw.rnd.IntN(ties)
		for i := range score {
			if score[i] == score[best] {
				if k == 0 {
					best = i
					break
				}
				k--
			}
		}
	}
	return rankByScore(c, score, true, best), nil
}

// Routed records the request's blocks on ep.
func (sw *scorerWeighted) Routed(req *Request, ep *endpoint.Endpoint) {
	if slot, _, ok := sw.eps.get(ep); ok { // (not one that left and is forgotten)
		sw.index.Insert(slot, req.Blocks, sw.clock.Now().UnixNano())
	}
}

// FirstToken does nothing.
func (sw *scorerWeighted) FirstToken(*Request, *endpoint.Endpoint, time.Duration) {}

// Done does nothing.
func (sw *scorerWeighted) Done(*Request, *endpoint.Endpoint, Result) {}

// Removed drops ep's LRU.
func (sw *scorerWeighted) Removed(ep *endpoint.Endpoint) {
	if slot, _, ok := sw.eps.release(ep.ID); ok {
		sw.index.Remove(slot)
	}
}

// IndexSize returns the index's entries and bytes.
func (sw *scorerWeighted) IndexSize() (int, int64) { return sw.index.Size() }
