package prefix

import "math"

// Depth returns how many entries of endpoint ep were used at or after stamp: the size an LRU
// of ep's blocks needs to still hold the block last used at stamp (its reuse distance, itself
// included), at most limit. Within the run of ep's newest entries that were stamped one after
// the other (most often the last request's blocks, which is where a probe's stamp lies) the
// answer is counted from the stamps, at once; deeper, it walks ep's LRU from its most recent
// end and stops after limit entries, so it costs O(min(depth, limit)).
func (x *Index) Depth(ep int, stamp int64, limit int) int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	if ep < 0 || ep >= len(x.eps) {
		return 0
	}
	// The list's stamps fall strictly from its head: within the run, the entries at or after
	// stamp are the run's first runTop - stamp + 1.
	if e := &x.eps[ep]; e.run > 0 && stamp <= e.runTop && stamp > e.runTop-int64(e.run) {
		return max(0, min(int(e.runTop-stamp)+1, limit))
	}
	return x.depthWalk(ep, stamp, limit)
}

// depthWalk is Depth by walking ep's list from its head.
func (x *Index) depthWalk(ep int, stamp int64, limit int) int {
	d := 0
	for ni := x.eps[ep].head; ni != 0 && d < limit; ni = x.node(ni).next {
		if x.node(ni).stamp < stamp {
			break
		}
		d++
	}
	return d
}

// CapacityEstimate learns the capacity of an LRU cache that the router cannot see (an engine
// that says neither how much it keeps nor what it found) from what happened to requests the
// index predicted it held: a hit at depth d (the LRU had to hold d blocks for it, see Depth)
// says the capacity is at least d, a miss at depth d says it is below d. The estimate is the
// threshold that contradicts the fewest recent observations (newer ones weigh more), the middle
// of the band between the deepest hits and the shallowest misses it leaves: one stray report
// moves it little, and old evidence fades as the engine or the traffic changes.
//
// An index sized by the estimate alone would make no prediction deeper than it, so evidence
// would only ever come from below: a stray miss near the top would lower it, and nothing would
// raise it again. The index is to be sized CapacityHeadroom times the estimate: the band above
// it is where a cache larger (or smaller) than believed shows. The zero value is ready; it is
// not safe for concurrent use.
type CapacityEstimate struct {
	obs  [capacityWindow]capacityObs
	n    int // observations held (at most capacityWindow)
	next int // where the next one goes
	last int // the last estimate, 0 before the first
}

type capacityObs struct {
	depth int
	hit   bool
}

const (
	// capacityWindow is how many observations are kept.
	capacityWindow = 64
	// capacityDecay is the weight of an observation one newer than another, relative to it:
	// the newest counts about five times as much as one 32 observations old.
	capacityDecay = 0.95
	// capacityMinEvidence is the (decayed) weight of observations needed before a first
	// estimate: about the last eight requests.
	capacityMinEvidence = 6
)

// CapacityHeadroom is how much larger than CapacityEstimate's estimate the index is to be, so
// that evidence also comes from above the estimate.
const CapacityHeadroom = 1.1

// Observe records a request whose prefix the index placed depth blocks deep in the endpoint's
// LRU, and whether the engine had it (hit). A non-positive depth says nothing and is ignored.
func (c *CapacityEstimate) Observe(depth int, hit bool) {
	if depth <= 0 {
		return
	}
	c.obs[c.next] = capacityObs{depth: depth, hit: hit}
	c.next = (c.next + 1) % capacityWindow
	c.n = min(c.n+1, capacityWindow)
}

// Estimate returns the capacity in blocks, and false while the evidence is too thin to say
// (too few observations, or hits only and no estimate yet: a cache at least as large as the
// deepest hit, which the caller's fallback already assumes).
func (c *CapacityEstimate) Estimate() (int, bool) {
	var weights [capacityWindow]float64
	var total, misses float64
	deepestHit := 0
	w := 1.0
	for k := range c.n {
		i := (c.next - 1 - k + capacityWindow) % capacityWindow // newest first
		weights[i] = w
		total += w
		if c.obs[i].hit {
			deepestHit = max(deepestHit, c.obs[i].depth)
		} else {
			misses += w
		}
		w *= capacityDecay
	}
	if total < capacityMinEvidence {
		return c.last, c.last > 0
	}
	if misses == 0 {
		if c.last == 0 {
			return 0, false
		}
		c.last = max(c.last, deepestHit)
		return c.last, true
	}
	// A threshold C (capacity: the LRU holds depths 1..C) is contradicted by every hit deeper
	// than C and every miss at most C deep. The error only changes at observed depths, so the
	// candidates are each hit's depth and each miss's depth less one.
	best, lo, hi := math.Inf(1), 0, 0
	for k := range c.n {
		cand := c.obs[k].depth
		if !c.obs[k].hit {
			cand--
		}
		e := 0.0
		for j := range c.n {
			o := c.obs[j]
			if o.hit && o.depth > cand || !o.hit && o.depth <= cand {
				e += weights[j]
			}
		}
		switch {
		case e < best-1e-9:
			best, lo, hi = e, cand, cand
		case e <= best+1e-9:
			lo, hi = min(lo, cand), max(hi, cand)
		}
	}
	// Every threshold in [lo, hi] explains the evidence equally well when the minimisers form
	// one band; past the deepest hit lies the first miss, so the band's middle is the guess.
	if hi == lo {
		// Only the boundary itself: a miss's depth less one or a hit's depth. Take the middle
		// up to the next observed depth above it, which contradicts more.
		next := math.MaxInt
		for k := range c.n {
			if d := c.obs[k].depth; d > lo && d < next {
				next = d
			}
		}
		if next != math.MaxInt {
			hi = next - 1
		}
	}
	c.last = max(1, lo+(hi-lo)/2)
	return c.last, true
}
