package policy

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/prefix"
)

// overlapCost is NVIDIA Dynamo's KV-aware router: for each worker,
//
//	cost = overlap_score_weight x blocks still to prefill + active blocks on the worker
//
// and the lowest cost wins (temperature 0: no sampling; ties at random). Without KV events
// (approximate mode) the router records each request's blocks on the worker it chose and lets
// every entry expire ttl after it was recorded. Published defaults: overlap_score_weight 1.0,
// router temperature 0, ttl 120 s.
//
// Differences from the original: blocks are the request's 16-token blocks; a worker's active
// blocks are the router's own count of the prompt blocks of its requests in flight (Dynamo
// counts the blocks its active sequences occupy, which grow with decoding); the index is
// kvroute's prefix.Index with a per-worker LRU cap (index_blocks) besides the ttl.
type overlapCost struct {
	clock   Clock
	rnd     *lockedRand
	weight  float64
	ttl     time.Duration
	index   *prefix.Index
	expired atomic.Int64          // last Expire, unix ns
	eps     *epTable[*ocEndpoint] // by slot: the endpoint's name in index

	mu     sync.Mutex
	flight map[*Request]ocFlight // while in flight
}

// ocEndpoint is what overlap-cost keeps of an endpoint besides its index entries.
type ocEndpoint struct {
	active atomic.Int64 // blocks of its requests in flight
}

// ocFlight is a request in flight: its endpoint's state and its blocks.
type ocFlight struct {
	ep     *ocEndpoint
	blocks int64
}

func newOverlapCost(env Env, p Params) (Picker, error) {
	r := env.params(p)
	oc := &overlapCost{
		clock:  env.Clock,
		rnd:    newLockedRand(env),
		weight: r.Float("overlap_score_weight", 1.0),
		ttl:    r.Duration("ttl", 120*time.Second),
		flight: map[*Request]ocFlight{},
	}
	blocks := r.Int("index_blocks", 1<<20)
	r.Require(oc.weight >= 0, "overlap_score_weight=%g must not be negative", oc.weight)
	r.Require(oc.ttl > 0, "ttl=%s must be positive", oc.ttl)
	r.Require(blocks > 0, "index_blocks=%d must be positive", blocks)
	if err := r.Check(); err != nil {
		return nil, err
	}
	if oc.clock == nil {
		oc.clock = WallClock{}
	}
	oc.index = prefix.NewIndex(prefix.IndexConfig{DefaultCapacity: blocks})
	oc.eps = newEPTable(oc.clock, func(slot int, reused bool) *ocEndpoint {
		if reused {
			oc.index.Remove(slot) // what a late call wrote there after the last one left
		}
		return &ocEndpoint{}
	})
	return oc, nil
}

func requestBlocks(req *Request) int64 {
	if req.BlockTokens <= 0 {
		return int64(len(req.Blocks))
	}
	return int64((req.PromptTokens + req.BlockTokens - 1) / req.BlockTokens)
}

// Pick ranks by cost, lowest first; among equal lowest costs a random one goes first.
func (oc *overlapCost) Pick(req *Request, c []*endpoint.Endpoint) ([]*endpoint.Endpoint, error) {
	n := len(c)
	if n == 0 {
		return nil, ErrNoCandidate
	}
	now := oc.clock.Now().UnixNano()
	// Expiry sweeps at most once a second: entries live ttl, give or take a second.
	if last := oc.expired.Load(); now-last >= int64(time.Second) && oc.expired.CompareAndSwap(last, now) {
		oc.index.Expire(now - int64(oc.ttl))
	}
	var buf [32]int // on the stack for a fleet of up to 32
	slots := append(buf[:0], make([]int, n)...)
	var states [32]*ocEndpoint
	eps := append(states[:0], make([]*ocEndpoint, n)...)
	oc.eps.gather(c, slots, eps)
	runs := make([]int32, n)
	oc.index.MatchAmong(runs, slots, req.Blocks)
	total := requestBlocks(req)
	cost := make([]float64, n)
	for i := range c {
		prefill := max(total-int64(runs[i]), 0)
		cost[i] = oc.weight * float64(prefill)
		if eps[i] != nil {
			cost[i] += float64(eps[i].active.Load())
		}
	}
	best, ties := 0, 0
	for i := range cost {
		switch {
		case cost[i] < cost[best]:
			best, ties = i, 1
		case cost[i] == cost[best]:
			ties++
		}
	}
	if ties > 1 {
		k := oc.rnd.IntN(ties)
		for i := range cost {
			if cost[i] == cost[best] {
				if k == 0 {
					best = i
					break
				}
				k--
			}
		}
	}
	return rankByScore(c, cost, false, best), nil
}

// Routed records the request's blocks on ep and adds them to its active blocks.
// One routed to an endpoint that left and is forgotten is not counted.
func (oc *overlapCost) Routed(req *Request, ep *endpoint.Endpoint) {
	slot, st, ok := oc.eps.get(ep)
	if !ok {
		return
	}
	oc.index.Insert(slot, req.Blocks, oc.clock.Now().UnixNano())
	b := requestBlocks(req)
	st.active.Add(b)
	oc.mu.Lock()
	oc.flight[req] = ocFlight{ep: st, blocks: b}
	oc.mu.Unlock()
}

// FirstToken does nothing.
func (oc *overlapCost) FirstToken(*Request, *endpoint.Endpoint, time.Duration) {}

// Done removes the request's blocks from ep's active blocks.
func (oc *overlapCost) Done(req *Request, _ *endpoint.Endpoint, _ Result) {
	oc.mu.Lock()
	f, ok := oc.flight[req]
	delete(oc.flight, req)
	oc.mu.Unlock()
	if ok {
		f.ep.active.Add(-f.blocks)
	}
}

// Removed forgets ep.
func (oc *overlapCost) Removed(ep *endpoint.Endpoint) {
	if slot, _, ok := oc.eps.release(ep.ID); ok {
		oc.index.Remove(slot)
	}
}

// IndexSize returns the index's entries and bytes.
func (oc *overlapCost) IndexSize() (int, int64) { return oc.index.Size() }
