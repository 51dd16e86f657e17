package engine

// block is the state of one KV block. Blocks live in one preallocated slice and are named by
// their index; the free queue links them through prev and next.
type block struct {
	hash   uint64
	ref    int32
	prev   int32
	next   int32
	cached bool // hash is valid and byHash points here
	free   bool // in the free list (never-used blocks are free but not listed)
}

// blockPool holds the KV blocks, the LRU free queue and the prefix cache. A block with ref 0 is
// free, ordered by eviction priority: first the blocks never used, in id order (they stand for
// the head of vLLM's initial queue and are kept out of the list, so that a new pool costs nothing
// to set up), then the list, front first. A listed block may still be cached; it is evicted only
// when it is popped to hold new tokens.
type blockPool struct {
	blocks     []block // NumBlocks blocks, then the list's sentinel
	sentinel   int32
	fresh      int32 // blocks [fresh, sentinel) have never been used
	numFree    int
	cachedFree int
	byHash     hashTable
}

func newBlockPool(n int) blockPool {
	p := blockPool{
		blocks:   make([]block, n+1),
		sentinel: int32(n),
		numFree:  n,
		byHash:   newHashTable(n),
	}
	s := &p.blocks[n]
	s.prev, s.next = p.sentinel, p.sentinel
	return p
}

// pushBack appends block id at the tail of the free queue (evicted last).
func (p *blockPool) pushBack(id int32) {
	b := &p.blocks[id]
	s := &p.blocks[p.sentinel]
	b.prev, b.next = s.prev, p.sentinel
	p.blocks[s.prev].next = id
	s.prev = id
	b.free = true
	p.numFree++
	if b.cached {
		p.cachedFree++
	}
}

// unlink takes block id out of the free queue.
func (p *blockPool) unlink(id int32) {
	b := &p.blocks[id]
	p.blocks[b.prev].next = b.next
	p.blocks[b.next].prev = b.prev
	b.free = false
	p.numFree--
	if b.cached {
		p.cachedFree--
	}
}

// touch takes a reference on a cached block found by a prefix lookup.
func (p *blockPool) touch(id int32) {
	if p.blocks[id].ref == 0 {
		p.unlink(id)
	}
	p.blocks[id].ref++
}

// release drops a reference; the last one puts the block at the tail of the free queue.
func (p *blockPool) release(id int32) {
	b := &p.blocks[id]
	b.ref--
	if b.ref == 0 {
		p.pushBack(id)
	}
}

// alloc pops the least recently freed block for new tokens. When it still held a cached prefix
// block, that block is evicted and its hash returned with evicted true. The caller has checked
// that a block is free.
func (p *blockPool) alloc() (id int32, evicted uint64, ok bool) {
	id = p.take()
	evicted, ok = p.evict(id)
	return id, evicted, ok
}

// take is alloc without the eviction: the block may still be cached until evict is called. The
// caller has checked that a block is free.
func (p *blockPool) take() int32 {
	if p.fresh < p.sentinel {
		id := p.fresh
		p.fresh++
		p.numFree--
		p.blocks[id].ref = 1
		return id
	}
	id := p.blocks[p.sentinel].next
	p.unlink(id)
	p.blocks[id].ref = 1
	return id
}

// evict drops the cached prefix block that block id (just taken) still holds, returning its
// hash with ok true.
func (p *blockPool) evict(id int32) (hash uint64, ok bool) {
	b := &p.blocks[id]
	if !b.cached {
		return 0, false
	}
	hash = b.hash
	p.byHash.delete(hash, id)
	b.cached, b.hash = false, 0
	return hash, true
}

// register makes block id the cached copy of hash, unless another block already is.
func (p *blockPool) register(id int32, hash uint64) bool {
	if !p.byHash.insert(hash, id, p.blocks) {
		return false
	}
	b := &p.blocks[id]
	b.hash, b.cached = hash, true
	if b.free {
		p.cachedFree++
	}
	return true
}
