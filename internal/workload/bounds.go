package workload

import (
	"cmp"
	"slices"

	"github.com/kvroute/kvroute/internal/prefix"
)

// arrivalOrder returns the indices of reqs in arrival order (stable for equal arrivals).
func arrivalOrder(reqs []Request) []int {
	order := make([]int, len(reqs))
	for i := range order {
		order[i] = i
	}
	if !slices.IsSortedFunc(reqs, func(a, b Request) int { return cmp.Compare(a.Arrival, b.Arrival) }) {
		slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(reqs[a].Arrival, reqs[b].Arrival) })
	}
	return order
}

// blockWalk visits a request's workload blocks in order with what the bounds need: the chained
// hash of the prefix up to each block (ids chained from seed 0, so the Mooncake convention need
// not hold) and how many of the request's engine blocks of blockSize tokens end inside it.
// Engine block j ends at token (j+1)*blockSize and belongs to the workload block holding its
// last token, as in Keys, so the engine blocks a request holds in one workload block are always
// a leading run of those the block can hold, and the bounds can count whole runs per workload
// block instead of single engine blocks.
type blockWalk struct {
	hashes []uint64
	counts []int
	engine int // engine blocks of the request: len(Keys(nil, r, blockSize))
}

func (w *blockWalk) load(r *Request, blockSize int) {
	w.hashes, w.counts = w.hashes[:0], w.counts[:0]
	w.engine = 0
	if r.BlockTokens < 1 {
		return
	}
	w.engine = min(r.PromptTokens/blockSize, len(r.Blocks)*r.BlockTokens/blockSize)
	var h uint64
	for b, id := range r.Blocks {
		before := b * r.BlockTokens / blockSize // engine blocks ending before workload block b
		if before >= w.engine {
			break
		}
		h = prefix.Next(h, id)
		w.hashes = append(w.hashes, h)
		w.counts = append(w.counts, min((b+1)*r.BlockTokens/blockSize, w.engine)-before)
	}
}

// InfiniteCacheHitRate is the token-weighted prefix hit rate of one cache that never evicts,
// fed the whole workload in arrival order: each request's hit is the longest run of its leading
// engine blocks of blockSize tokens (Keys, chained) that an earlier request already stored, in
// whole-block tokens, over all prompt tokens. It bounds what any placement can reach. It is 0
// for an empty workload or a blockSize below 1.
func InfiniteCacheHitRate(reqs []Request, blockSize int) float64 {
	if blockSize < 1 {
		return 0
	}
	// held maps a workload block's chained hash to the engine blocks of it already stored.
	held := map[uint64]int{}
	var hit, total int64
	var w blockWalk
	for _, i := range arrivalOrder(reqs) {
		r := &reqs[i]
		total += int64(r.PromptTokens)
		w.load(r, blockSize)
		run, missed := 0, false
		for k, h := range w.hashes {
			c, s := w.counts[k], held[h]
			if !missed {
				run += min(c, s)
				missed = s < c
			}
			if c > s {
				held[h] = c
			}
		}
		hit += int64(run * blockSize)
	}
	if total == 0 {
		return 0
	}
	return float64(hit) / float64(total)
}

// LRUHitRate is the token-weighted prefix hit rate of one LRU cache of capacityTokens tokens,
// counted in engine blocks of blockSize tokens (capacityTokens/blockSize blocks), fed the
// workload in arrival order. A request's hit is the longest run of its leading blocks present,
// in whole-block tokens. Then all its blocks are stored or refreshed, from its last block to its
// first, so that, as in vLLM's free queue, a prompt's tail is evicted before its head, and only
// then are the least recent blocks evicted to fit, so that a request never evicts its own
// prefix to store its tail (they are in use while it runs). It is 0
// for an empty workload, a blockSize below 1 or a capacity under one block.
func LRUHitRate(reqs []Request, blockSize int, capacityTokens int) float64 {
	if blockSize < 1 || capacityTokens < blockSize {
		return 0
	}
	c := newSegmentLRU(capacityTokens / blockSize)
	var hit, total int64
	var w blockWalk
	for _, i := range arrivalOrder(reqs) {
		r := &reqs[i]
		total += int64(r.PromptTokens)
		w.load(r, blockSize)
		hit += int64(c.request(&w) * blockSize)
	}
	if total == 0 {
		return 0
	}
	return float64(hit) / float64(total)
}

// segmentLRU is an LRU cache of engine blocks grouped by workload block. The engine blocks held
// of one workload block are always a leading run (a request touches a leading run, tail first,
// and eviction takes the least recent), and their recency never rises with the offset, so the
// run splits into segments of equal recency: one list node each, not one per engine block. The
// least recent node is always the last segment of its workload block, and eviction trims its
// tail one block at a time, exactly as a per-block LRU would.
type segmentLRU struct {
	capacity, used int
	first          map[uint64]*segment // workload block hash -> its lowest-offset segment
	head, tail     *segment            // most and least recent
}

type segment struct {
	hash  uint64
	count int      // engine blocks in this segment
	next  *segment // the same workload block's next segment (higher offsets, older)
	newer *segment
	older *segment
}

func newSegmentLRU(capacity int) *segmentLRU {
	return &segmentLRU{capacity: capacity, first: map[uint64]*segment{}}
}

// request looks up a request's blocks, returning the engine blocks of its cached prefix, then
// stores them all, tail first, and evicts to fit.
func (c *segmentLRU) request(w *blockWalk) int {
	run := 0
	for k, h := range w.hashes {
		held := c.held(h)
		run += min(w.counts[k], held)
		if held < w.counts[k] {
			break
		}
	}
	for k := len(w.hashes) - 1; k >= 0; k-- {
		c.touch(w.hashes[k], w.counts[k])
	}
	c.evict()
	return run
}

// held returns how many leading engine blocks of workload block h are cached.
func (c *segmentLRU) held(h uint64) int {
	n := 0
	for s := c.first[h]; s != nil; s = s.next {
		n += s.count
	}
	return n
}

// touch makes the first n engine blocks of workload block h the most recent, storing those
// missing. It does not evict: a request's own blocks are in use until it is stored whole.
func (c *segmentLRU) touch(h uint64, n int) {
	if n < 1 {
		return
	}
	// Take the segments covering [0, n) out; a segment straddling n keeps its part beyond n.
	covered := 0
	s := c.first[h]
	for s != nil && covered+s.count <= n {
		covered += s.count
		c.unlink(s)
		s = s.next
	}
	if s != nil && covered < n {
		s.count -= n - covered
		covered = n
	}
	c.used += n - covered
	seg := &segment{hash: h, count: n, next: s}
	c.first[h] = seg
	c.pushFront(seg)
}

// evict drops least recent blocks until the cache fits.
func (c *segmentLRU) evict() {
	for c.used > c.capacity {
		c.evictOne()
	}
}

// evictOne drops the last engine block of the least recent segment.
func (c *segmentLRU) evictOne() {
	s := c.tail
	s.count--
	c.used--
	if s.count > 0 {
		return
	}
	c.unlink(s)
	// s is the last segment of its workload block: cut it off the block's chain.
	if f := c.first[s.hash]; f == s {
		delete(c.first, s.hash)
	} else {
		for f.next != s {
			f = f.next
		}
		f.next = nil
	}
}

func (c *segmentLRU) pushFront(s *segment) {
	s.newer, s.older = nil, c.head
	if c.head != nil {
		c.head.newer = s
	}
	c.head = s
	if c.tail == nil {
		c.tail = s
	}
}

func (c *segmentLRU) unlink(s *segment) {
	if s.newer != nil {
		s.newer.older = s.older
	} else {
		c.head = s.older
	}
	if s.older != nil {
		s.older.newer = s.newer
	} else {
		c.tail = s.newer
	}
	s.newer, s.older = nil, nil
}

// RandomPlacementHitRate is the token-weighted prefix hit rate when each request goes to one of
// instances at random (drawn from seed), each instance an LRU cache of capacityTokens tokens
// counted as in LRUHitRate: what a router blind to prefixes gets from caching alone. Set
// against LRUHitRate of the pooled capacity, it shows what placement can win. It is 0 for an
// empty workload, instances below 1, a blockSize below 1 or a capacity under one block.
func RandomPlacementHitRate(reqs []Request, blockSize, instances, capacityTokens int, seed uint64) float64 {
	if blockSize < 1 || instances < 1 || capacityTokens < blockSize {
		return 0
	}
	caches := make([]*segmentLRU, instances)
	for i := range caches {
		caches[i] = newSegmentLRU(capacityTokens / blockSize)
	}
	rng := newRand(seed, "random-placement")
	var hit, total int64
	var w blockWalk
	for _, i := range arrivalOrder(reqs) {
		r := &reqs[i]
		c := caches[rng.IntN(instances)]
		total += int64(r.PromptTokens)
		w.load(r, blockSize)
		hit += int64(c.request(&w) * blockSize)
	}
	if total == 0 {
		return 0
	}
	return float64(hit) / float64(total)
}
