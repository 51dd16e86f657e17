package policy

import (
	"time"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/prefix"
)

// cacheAware is the SGLang router's cache_aware policy. It keeps an approximate radix tree of
// the prompts sent to each worker. When the load is imbalanced, (max - min) in flight >
// balance_abs_threshold AND max > balance_rel_threshold x min, it sends the request to the
// least loaded worker (and still records it in that worker's tree). Otherwise it finds the
// worker with the longest prefix match; if matched / prompt > cache_threshold the request goes
// there, else to the worker whose tree is smallest. Trees are evicted by size.
// Published defaults (sgl-router): balance_abs_threshold 64, balance_rel_threshold 1.5,
// cache_threshold 0.3 (0.5 in older releases), max_tree_size 2^26 characters.
//
// Differences from the original: the tree is kvroute's block index (prefix.Index: one LRU per
// worker of whole 64-byte blocks, which is what a radix tree over characters degenerates to at
// block granularity), its size cap is max_tree_size / 64 blocks per worker and it is evicted
// continuously (LRU) rather than by a periodic sweep; the match ratio is matched blocks x block
// tokens over prompt tokens rather than characters over characters.
type cacheAware struct {
	clock    Clock
	absThr   int
	relThr   float64
	cacheThr float64
	index    *prefix.Index
	eps      *epTable[struct{}] // the endpoints' slots: their names in index
}

func newCacheAware(env Env, p Params) (Picker, error) {
	r := env.params(p)
	ca := &cacheAware{
		clock:    env.Clock,
		absThr:   r.Int("balance_abs_threshold", 64),
		relThr:   r.Float("balance_rel_threshold", 1.5),
		cacheThr: r.Float("cache_threshold", 0.3),
	}
	treeChars := r.Int("max_tree_size", 1<<26)
	r.Require(ca.absThr >= 0, "balance_abs_threshold=%d must not be negative", ca.absThr)
	r.Require(ca.relThr >= 1, "balance_rel_threshold=%g must be at least 1", ca.relThr)
	r.Require(ca.cacheThr >= 0 && ca.cacheThr <= 1, "cache_threshold=%g must be in 0..1", ca.cacheThr)
	r.Require(treeChars >= prefix.BlockBytes(prefix.DefaultBlockTokens), "max_tree_size=%d must be at least one block (64 characters)", treeChars)
	if err := r.Check(); err != nil {
		return nil, err
	}
	if ca.clock == nil {
		ca.clock = WallClock{}
	}
	ca.index = prefix.NewIndex(prefix.IndexConfig{DefaultCapacity: treeChars / prefix.BlockBytes(prefix.DefaultBlockTokens)})
	ca.eps = indexTable(ca.clock, ca.index)
	return ca, nil
}

// Pick applies SGLang's rule and ranks the rest by the same criterion.
func (ca *cacheAware) Pick(req *Request, c []*endpoint.Endpoint) ([]*endpoint.Endpoint, error) {
	n := len(c)
	if n == 0 {
		return nil, ErrNoCandidate
	}
	minL, maxL := c[0].InFlight(), c[0].InFlight()
	for _, e := range c {
		minL, maxL = min(minL, e.InFlight()), max(maxL, e.InFlight())
	}
	score := make([]float64, n)
	if maxL-minL > ca.absThr && float64(maxL) > ca.relThr*float64(minL) {
		for i, e := range c {
			score[i] = float64(e.InFlight())
		}
		return rankByScore(c, score, false, -1), nil
	}
	var buf [32]int // on the stack for a fleet of up to 32
	slots := append(buf[:0], make([]int, n)...)
	runs := matchRuns(ca.index, ca.eps, c, req.Blocks, slots)
	best := 0
	for i := range c {
		score[i] = float64(runs[i])
		if score[i] > score[best] {
			best = i
		}
	}
	ratio := 0.0
	if req.PromptTokens > 0 {
		ratio = score[best] * float64(req.BlockTokens) / float64(req.PromptTokens)
	}
	if ratio > ca.cacheThr {
		return rankByScore(c, score, true, best), nil
	}
	for i := range c {
		score[i] = float64(ca.index.Len(slots[i]))
	}
	return rankByScore(c, score, false, -1), nil
}

// Routed records the prompt in ep's tree.
func (ca *cacheAware) Routed(req *Request, ep *endpoint.Endpoint) {
	if slot, _, ok := ca.eps.get(ep); ok { // (not one that left and is forgotten)
		ca.index.Insert(slot, req.Blocks, ca.clock.Now().UnixNano())
	}
}

// FirstToken does nothing: the policy does not learn from latency.
func (ca *cacheAware) FirstToken(*Request, *endpoint.Endpoint, time.Duration) {}

// Done does nothing: SGLang's load counts are the router's in-flight counts.
func (ca *cacheAware) Done(*Request, *endpoint.Endpoint, Result) {}

// Removed drops ep's tree.
func (ca *cacheAware) Removed(ep *endpoint.Endpoint) {
	if slot, _, ok := ca.eps.release(ep.ID); ok {
		ca.index.Remove(slot)
	}
}

// IndexSize returns the trees' entries and bytes.
func (ca *cacheAware) IndexSize() (int, int64) { return ca.index.Size() }
