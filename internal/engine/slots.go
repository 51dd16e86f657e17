package engine

// slotCache is a KV cache of whole sequences, as ollama keeps one (Profile.CacheSlots): a fixed
// number of slots, each holding the tokens of the one sequence that last used it, prompt and
// output. A block cache stores a prefix once however many requests share it, and evicts block by
// block; a slot cache holds one copy of a shared prefix per slot that uses it, and a slot is
// reused whole. Under prefix-aware routing that difference is the hit rate: three requests of a
// group on one instance take three of its four slots.
//
// The rule is ollama v0.17.4's InputCache.findBestCacheSlot (runner/ollamarunner/cache.go, used
// under OLLAMA_MULTIUSER_CACHE=1), applied when a request takes one of the OLLAMA_NUM_PARALLEL
// sequence seats:
//
//   - every slot, busy or free, is compared with the prompt; the longest common prefix wins,
//     the lowest slot on a tie;
//   - when that slot is free and its whole content is a prefix of the prompt (it is empty, or
//     holds exactly an earlier part of this conversation), the request continues in it;
//   - otherwise the request takes the free slot loaded least recently (never-used slots first,
//     lowest first), dropping what it held, and the longest prefix is copied into it from the
//     winner, busy or not (a busy slot holds what it has computed so far);
//   - the request then reuses that prefix, less its last token when it covers the whole prompt.
//
// Recency is the time a slot was last taken (ollama sets lastUsed when it loads a slot), not when
// it was freed. ollama compares tokens; the engine model knows a prompt by its full blocks'
// hashes, so a match is counted in whole blocks (as the block cache counts its hits), and tokens
// past a prompt's full blocks (a partial block, the output) match nothing. There is no
// preemption: a running sequence owns its slot, whose size (the KV capacity over the slots, as
// ollama divides its kv size by the parallel count) Submit checks. The running sequences still
// take their blocks from the block pool, which none can exhaust then, so that the block cache's
// per-step path has no branch for slots; the pool's prefix cache stays empty.
type slotCache struct {
	slots []cacheSlot
	// loads counts slot loads: a slot's lastUsed is the value at its last load.
	loads uint64
}

// cacheSlot is one slot. A busy slot's content is its sequence's: the prompt blocks it has
// computed. A free slot keeps its own copy of what its last sequence left.
type cacheSlot struct {
	seq      *seq     // the sequence using the slot, nil when free
	hashes   []uint64 // free: the full prompt blocks held
	tokens   int      // free: the tokens held
	lastUsed uint64   // loads at the slot's last load; 0 for never
}

func newSlotCache(n int) *slotCache {
	return &slotCache{slots: make([]cacheSlot, n)}
}

// content returns the block hashes and token count slot i holds now.
func (c *slotCache) content(i, blockSize int) ([]uint64, int) {
	sl := &c.slots[i]
	if s := sl.seq; s != nil {
		return s.hashes[:min(len(s.hashes), s.computed/blockSize)], s.computed
	}
	return sl.hashes, sl.tokens
}

// load gives s a slot by ollama's rule and returns the tokens of its prompt held there (before
// the engine's cap on a hit). The caller guarantees a free slot: no more sequences run than
// there are slots.
func (c *slotCache) load(s *seq, blockSize int) int {
	longest, best, oldest := -1, -1, -1
	for i := range c.slots {
		h, _ := c.content(i, blockSize)
		if n := commonPrefix(h, s.hashes); n > longest {
			longest, best = n, i
		}
		if c.slots[i].seq == nil && (oldest < 0 || c.slots[i].lastUsed < c.slots[oldest].lastUsed) {
			oldest = i
		}
	}
	target := oldest
	if _, tokens := c.content(best, blockSize); c.slots[best].seq == nil && longest*blockSize == tokens {
		target = best
	}
	// The prefix copied from best (or kept in target) is s's own first longest blocks, so a busy
	// slot's content, s's computed tokens, stands for it: nothing to copy here.
	c.loads++
	sl := &c.slots[target]
	sl.seq, sl.lastUsed = s, c.loads
	s.slot = int32(target)
	return longest * blockSize
}

// release frees s's slot, which keeps the tokens s computed.
func (c *slotCache) release(s *seq, blockSize int) {
	sl := &c.slots[s.slot]
	h, tokens := c.content(int(s.slot), blockSize)
	sl.hashes = append(sl.hashes[:0], h...)
	sl.tokens = tokens
	sl.seq = nil
}

// freeBlocks returns the blocks the free slots hold.
func (c *slotCache) freeBlocks(blockSize int) int {
	n := 0
	for i := range c.slots {
		if c.slots[i].seq == nil {
			n += ceilDiv(c.slots[i].tokens, blockSize)
		}
	}
	return n
}

// commonPrefix is the number of leading elements a and b share.
func commonPrefix(a, b []uint64) int {
	n := min(len(a), len(b))
	for i := range n {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}

// slotAdmit is admit for a slot cache: s takes a slot and reuses what it holds.
func (e *Engine) slotAdmit(s *seq, budget int) (int, bool) {
	bs := e.cfg.BlockSize
	hit := capHit(e.slots.load(s, bs), s.tokens(), bs)
	chunk := min(s.tokens()-hit, budget)
	// The slot holds the sequence; the pool's blocks only count it (Submit and MaxNumSeqs <=
	// CacheSlots keep them from running out). cachedBlocks past every hash: schedule offers
	// nothing to the pool's prefix cache.
	s.blocks = e.alloc(s.blocks, ceilDiv(hit+chunk, bs))
	s.computed, s.hit, s.cachedBlocks = hit, hit, len(s.hashes)
	if !s.counted {
		s.counted = true
		e.stats.PrefixQueryTokens += int64(s.prompt)
		e.stats.PrefixHitTokens += int64(hit)
	}
	return chunk, true
}

// SeqBlocks is the most KV blocks one request can use: NumBlocks, or one slot's share of them in
// a slot cache (NumBlocks / CacheSlots). Like Config, it may be called while another goroutine
// drives the engine.
func (e *Engine) SeqBlocks() int {
	if e.slots != nil {
		return e.cfg.NumBlocks / len(e.slots.slots)
	}
	return e.cfg.NumBlocks
}
