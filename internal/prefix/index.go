package prefix

import (
	"math"
	"sync"
	"unsafe"
)

// IndexConfig sizes an Index.
type IndexConfig struct {
	// DefaultCapacity is the number of blocks an endpoint's LRU holds until SetCapacity gives
	// its real KV capacity. It must be positive.
	DefaultCapacity int
	// MaxEntries caps the (block, endpoint) entries of all endpoints together, whatever their
	// capacities say; 0 means no cap. When it is reached, the least recently used entry of the
	// endpoint holding the most entries goes first.
	MaxEntries int
}

// Index is the approximate picture of which endpoint probably still holds which blocks: one LRU
// per endpoint, sized like that endpoint's KV cache, so that it forgets what the engine has
// evicted. Endpoints are named by their dense integer ID.
//
// Blocks are inserted from the last to the first, so a block is always more recent than any of
// its descendants (as in vLLM, whose free queue evicts a request's tail blocks first): an LRU
// eviction never leaves a child without its parent, and what an endpoint holds stays a set of
// whole prefixes.
//
// Memory: a global open-addressing table from block hash to an entry (8 bytes a slot, 16 an
// entry), and one node (32 bytes) per (block, endpoint) pair that links the endpoint's LRU and
// the block's holders. Entries and nodes live in fixed-size chunks: an index of millions of
// nodes grows without copying them, and without the old copy's memory on top of the new.
// It is safe for concurrent use: lookups share a read lock.
type Index struct {
	mu      sync.RWMutex
	cfg     IndexConfig
	table   []uint64    // slotOf(hash, entry index + 1); 0 when empty; len is a power of two
	entries [][]ixEntry // in chunks of chunkLen, so that growing never copies
	nodes   [][]ixNode  // in chunks of chunkLen
	nEnt    uint32      // entries ever allocated (live or free)
	nNod    uint32      // nodes ever allocated (live or free)
	freeE   uint32      // head of the free entry list (index + 1)
	freeN   uint32      // head of the free node list (index + 1)
	nEntry  int         // live entries (distinct blocks)
	nNode   int         // live nodes ((block, endpoint) pairs)
	eps     []ixEndpoint
	last    int64     // last stamp handed out
	cuts    uint64    // nodes ever unlinked from a list: Insert's run is whole while it stays put
	marks   uint64    // changes ever made to an endpoint's list: ixEndpoint.mark's clock
	removed uint64    // nodes ever removed (evicted, dropped, forgotten)
	found   []uint32  // Insert's scratch: each block's entry before the touches
	tables  sync.Pool // *[]uint64: MatchAmong's positions tables for over 32 candidates

	// resized, when set (tests), is called between two steps of Resize, the lock released.
	resized func()
}

type ixEntry struct {
	hash uint64
	head uint32 // first holder node + 1; next free entry + 1 when free
	n    uint32 // holders
}

type ixNode struct {
	stamp      int64  // when it was last inserted or touched (strictly increasing per index)
	entry      uint32 // the block
	ep         uint32 // the endpoint
	prev, next uint32 // endpoint's LRU list, + 1; prev is more recent
	nextHolder uint32 // next node of the same block, + 1; next free node when free
}

type ixEndpoint struct {
	head, tail uint32 // most and least recent node, + 1
	n          int
	cap        int // 0: DefaultCapacity
	// The first run nodes of the list are stamped runTop, runTop - 1, ..., runTop - run + 1
	// (a request's blocks, inserted together, are): Depth counts within them without walking.
	// run is a lower bound (0 says nothing), kept by pushFront, unlink and insert.
	run    int
	runTop int64
	// mark is Index.marks at the last change to the list (an insert, a node pushed or
	// unlinked); 0 after Remove. Reinsert skips an insert when it has not moved.
	mark uint64
}

// NewIndex builds an empty index. A non-positive DefaultCapacity means 4,096 blocks.
func NewIndex(cfg IndexConfig) *Index {
	return &Index{cfg: cfg.orDefaults(), table: make([]uint64, 1024)}
}

// orDefaults is cfg with its defaults in place of what is out of range.
func (cfg IndexConfig) orDefaults() IndexConfig {
	if cfg.DefaultCapacity <= 0 {
		cfg.DefaultCapacity = 4096
	}
	if cfg.MaxEntries < 0 {
		cfg.MaxEntries = 0
	}
	return cfg
}

// SetCapacity sets endpoint ep's LRU size in blocks (its KV capacity / block tokens); entries
// above it are evicted at once. blocks <= 0 restores the default.
func (x *Index) SetCapacity(ep, blocks int) {
	if ep < 0 {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	e := x.endpoint(ep)
	if blocks < 0 {
		blocks = 0
	}
	e.cap = blocks
	x.trim(ep)
}

// Resize gives the index the sizes of cfg, as NewIndex would have, keeping what it holds where
// they allow, and returns the entries it evicted to fit them: a policy given other sizes keeps
// its index, and what is learned while it resizes, instead of copying it into a new one (2.5 s
// for a million entries, and what the old one learned meanwhile lost). Each endpoint that reset
// names (asked under the lock; nil: none) takes the default capacity again.
//
// A shrink evicts in steps of at most about resizeBatch entries, the lock released between
// them: lookups and inserts meanwhile wait for one step at most. The sizes in force step down
// from what the index holds to cfg's, so that an insert between two steps evicts no more than
// one entry for one it adds. Calls must not overlap.
func (x *Index) Resize(cfg IndexConfig, reset func(ep int) bool) (evicted int) {
	cfg = cfg.orDefaults()
	for first := true; ; first = false {
		x.mu.Lock()
		if first && reset != nil {
			for ep := range x.eps {
				if x.eps[ep].cap != 0 && reset(ep) {
					x.eps[ep].cap = 0
				}
			}
		}
		removed := x.removed
		done := x.resizeStep(cfg)
		evicted += int(x.removed - removed)
		x.mu.Unlock()
		if done {
			return evicted
		}
		if x.resized != nil {
			x.resized()
		}
	}
}

// resizeBatch is how many entries one lock hold of Resize evicts, at most about: some 1 ms on a
// fleet of ten endpoints.
const resizeBatch = 4096

// resizeStep moves the sizes in force one step towards cfg's, evicting what they no longer
// hold, and reports whether they are cfg's. The caller holds the lock.
func (x *Index) resizeStep(cfg IndexConfig) bool {
	// The default steps down to what the fullest endpoint of the default capacity holds, less
	// a share of a step for each of those over cfg's default.
	most, over := 0, 0
	for i := range x.eps {
		if e := &x.eps[i]; e.cap == 0 && e.n > cfg.DefaultCapacity {
			most, over = max(most, e.n), over+1
		}
	}
	x.cfg.DefaultCapacity = cfg.DefaultCapacity
	if over > 0 {
		x.cfg.DefaultCapacity = max(cfg.DefaultCapacity, most-max(resizeBatch/over, 1))
	}
	removed := x.removed
	for i := range x.eps {
		for e := &x.eps[i]; e.cap == 0 && e.n > x.cfg.DefaultCapacity; {
			x.removeNode(e.tail)
		}
	}
	if x.removed != removed || x.cfg.DefaultCapacity != cfg.DefaultCapacity {
		return false // the global cap's turn comes once the default is cfg's
	}
	x.cfg.MaxEntries = cfg.MaxEntries
	if cfg.MaxEntries > 0 && x.nNode > cfg.MaxEntries {
		x.cfg.MaxEntries = max(cfg.MaxEntries, x.nNode-resizeBatch)
	}
	x.trimTotal()
	return x.cfg == cfg
}

// Sizes returns the sizes in force: NewIndex's, or the last Resize's (while one runs, its
// step's).
func (x *Index) Sizes() IndexConfig {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return x.cfg
}

// Capacity returns endpoint ep's LRU size in blocks.
func (x *Index) Capacity(ep int) int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	if ep < 0 || ep >= len(x.eps) || x.eps[ep].cap == 0 {
		return x.cfg.DefaultCapacity
	}
	return x.eps[ep].cap
}

func (x *Index) capOf(ep int) int {
	if c := x.eps[ep].cap; c > 0 {
		return c
	}
	return x.cfg.DefaultCapacity
}

func (x *Index) endpoint(ep int) *ixEndpoint {
	for ep >= len(x.eps) {
		x.eps = append(x.eps, ixEndpoint{})
	}
	return &x.eps[ep]
}

// Insert records that endpoint ep now holds blocks (a request's chained hashes, in order), at
// time now (any monotonic clock in nanoseconds). Blocks it already held become most recent.
//
// The leading blocks that are already ep's most recent entries, in order (the request before
// on ep shared them, or this request was inserted when it was routed and again when it ended),
// are not looked up: they are found by walking ep's list from its head, and made most recent
// at the end by moving them as one segment. On a 100k-token prompt (6,250 blocks) that skips
// thousands of table probes and list moves, each likely a cache miss. The result, stamps
// included, is what inserting every block in turn gives.
func (x *Index) Insert(ep int, blocks []uint64, now int64) {
	if ep < 0 || len(blocks) == 0 {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	x.insert(ep, blocks, now)
}

// InsertTwice leaves the index as InsertMark(ep, blocks, now) and then Reinsert with its mark
// would, stamps included: a request routed and ended at once (a router replica replaying
// another's request whose end came with its start) is inserted when it is routed and again,
// unless nothing changed, when it ends (policy.Completer must leave the policy as those calls
// do). Nothing happens in between, so the second insert is made only when the first removed
// anything (InsertMark's mark 0): once, otherwise, with the first insert's stamps.
func (x *Index) InsertTwice(ep int, blocks []uint64, now int64) {
	if ep < 0 || len(blocks) == 0 {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	removed := x.removed
	x.insert(ep, blocks, now)
	if x.removed != removed {
		x.insert(ep, blocks, now)
	}
}

// InsertMark is Insert, and returns ep's mark after it: Reinsert with that mark inserts the
// blocks again only if ep's list changed since. The mark is 0 (Reinsert always inserts) when
// the insert removed anything, anywhere: ep may then not hold all of blocks (its capacity, or
// the index's, cut them), and inserting them again could add some once room is made.
func (x *Index) InsertMark(ep int, blocks []uint64, now int64) uint64 {
	if ep < 0 || len(blocks) == 0 {
		return 0
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	removed := x.removed
	x.insert(ep, blocks, now)
	if x.removed != removed {
		return 0
	}
	return x.eps[ep].mark
}

// Reinsert is Insert(ep, blocks, now), skipped when ep's list has not changed since the insert
// of the same blocks that returned mark (InsertMark): ep then still holds every one of the
// blocks, as its most recent entries, in order, and inserting them again would add, move and
// evict nothing, only stamp them anew (they keep the first insert's, older by the time between
// the two, and still newer than every other entry of ep). It reports whether it inserted.
func (x *Index) Reinsert(ep int, blocks []uint64, now int64, mark uint64) bool {
	if ep < 0 || len(blocks) == 0 {
		return false
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if mark != 0 && ep < len(x.eps) && x.eps[ep].mark == mark {
		return false
	}
	x.insert(ep, blocks, now)
	return true
}

// changed moves ep's mark: its list, or the stamps in it, changed.
func (x *Index) changed(ep uint32) {
	x.marks++
	x.eps[ep].mark = x.marks
}

// insert is Insert with the lock held.
//
// Its stamps are known before it starts: rest's blocks (touched from the last) take base,
// base + 1, ..., and the run's then go on from there, so that the run's block j gets top - j
// whatever the run's length. headRun stamps the run as it walks it, and when nothing cuts the
// run meanwhile it is not walked again (on a request inserted when routed and again when done,
// the second insert is one walk of the list instead of two).
func (x *Index) insert(ep int, blocks []uint64, now int64) {
	x.endpoint(ep)
	x.changed(uint32(ep))
	// headRun stamps nodes in place, out of the list's order until they move to the front:
	// the run is built anew from rest's touches, and set at the end.
	x.eps[ep].run = 0
	base := max(now, x.last+1) // what x.stamp(now) will give first
	top := base + int64(len(blocks)) - 1
	first, last, k := x.headRun(ep, blocks, top)
	rest := blocks[k:]
	cuts := x.cuts
	// Look every other block up first: independent probes of the table, each likely a cache
	// miss, overlap in the CPU where the touches' own work would keep them apart. A block found
	// here may have been evicted by the time its turn comes (trim), its entry freed or reused
	// for another block: the entry is used only if it still holds that hash.
	found := x.found[:0]
	for _, h := range rest {
		found = append(found, x.find(h))
	}
	x.found = found
	for i := len(rest) - 1; i >= 0; i-- {
		ei := found[i]
		if ei == 0 || x.entry(ei).hash != rest[i] || x.entry(ei).n == 0 {
			ei = x.findOrAdd(rest[i])
		}
		x.touch(ep, ei, x.stamp(now))
		x.trim(ep)
	}
	if k == 0 {
		return
	}
	// The run, if the touches above left it whole, moves to the front as one segment (an
	// eviction or a block repeated in rest may have cut it: then block by block). When they
	// unlinked no node at all (rest's blocks were all new to ep and nothing was evicted, or
	// rest is empty: a request inserted again when it ends), the run is whole as headRun found
	// it, stamped as headRun stamped it, and is not walked again. Otherwise a touch may have
	// stamped one of its nodes anew (the head's, which a touch leaves in place): it is
	// stamped again as it is checked.
	if x.cuts != cuts {
		if last = x.runEnd(ep, first, blocks[:k]); last != 0 {
			x.stampRun(first, last, x.stamp(now)+int64(k)-1)
		}
	}
	if last != 0 {
		x.last = top
		x.moveFront(ep, first, last)
		// The segment, stamped top down to top - k + 1, is in front of rest's nodes, whose
		// run goes on from top - k when their touches unlinked nothing (else a touch may have
		// moved one of the segment's own nodes, a repeated block, into that run).
		e := &x.eps[ep]
		if x.cuts == cuts && e.run > 0 && e.runTop == top-int64(k) {
			e.run += k
		} else {
			e.run = k
		}
		e.runTop = top
		return
	}
	for i := k - 1; i >= 0; i-- {
		x.touch(ep, x.findOrAdd(blocks[i]), x.stamp(now))
		x.trim(ep)
	}
}

// headRun returns ep's most recent node, the last node of the run, and how many leading blocks
// (k) are ep's most recent nodes, in order; last is 0 when k is. It stamps the run's node j
// with top - j.
func (x *Index) headRun(ep int, blocks []uint64, top int64) (first, last uint32, k int) {
	first = x.eps[ep].head
	for ni := first; ni != 0 && k < len(blocks); k++ {
		n := x.node(ni)
		if x.entry(n.entry).hash != blocks[k] {
			break
		}
		n.stamp = top - int64(k)
		last, ni = ni, n.next
	}
	return first, last, k
}

// runEnd returns the last node of the segment of ep's list that starts at node first and holds
// run's blocks in order, or 0 when it does not (any more).
func (x *Index) runEnd(ep int, first uint32, run []uint64) uint32 {
	ni, last := first, uint32(0)
	for _, h := range run {
		if ni == 0 {
			return 0
		}
		n := x.node(ni)
		if int(n.ep) != ep || n.entry == 0 || x.entry(n.entry).hash != h {
			return 0
		}
		last, ni = ni, n.next
	}
	return last
}

// stampRun stamps the segment first..last of a list s, s - 1, ..., as touching its nodes
// from the last to the first would.
func (x *Index) stampRun(first, last uint32, s int64) {
	for ni := first; ; ni = x.node(ni).next {
		x.node(ni).stamp = s
		s--
		if ni == last {
			break
		}
	}
}

// moveFront makes the segment first..last of ep's list its most recent.
func (x *Index) moveFront(ep int, first, last uint32) {
	e := &x.eps[ep]
	if e.head == first {
		return
	}
	f, l := x.node(first), x.node(last)
	// Cut the segment out...
	x.node(f.prev).next = l.next
	if l.next != 0 {
		x.node(l.next).prev = f.prev
	} else {
		e.tail = f.prev
	}
	// ...and put it in front.
	f.prev, l.next = 0, e.head
	x.node(e.head).prev = last
	e.head = first
}

func (x *Index) stamp(now int64) int64 {
	if now <= x.last {
		now = x.last + 1
	}
	x.last = now
	return now
}

// touch makes (entry ei, ep) the most recent node of ep, creating it if needed.
func (x *Index) touch(ep int, ei uint32, stamp int64) {
	en := x.entry(ei)
	for ni := en.head; ni != 0; ni = x.node(ni).nextHolder {
		if int(x.node(ni).ep) == ep {
			x.unlink(ni) // with its old stamp, which says where it was
			x.node(ni).stamp = stamp
			x.pushFront(ni)
			return
		}
	}
	ni := x.allocNode()
	*x.node(ni) = ixNode{stamp: stamp, entry: ei, ep: uint32(ep), nextHolder: en.head}
	en.head = ni
	en.n++
	x.pushFront(ni)
	x.eps[ep].n++
	x.nNode++
}

// trim evicts from ep until it fits its capacity, and from the fullest endpoint until the
// global cap holds.
func (x *Index) trim(ep int) {
	for x.eps[ep].n > x.capOf(ep) {
		x.removeNode(x.eps[ep].tail)
	}
	x.trimTotal()
}

// trimTotal evicts from the fullest endpoint until the global cap holds.
func (x *Index) trimTotal() {
	for x.cfg.MaxEntries > 0 && x.nNode > x.cfg.MaxEntries {
		victim := 0
		for i := range x.eps {
			if x.eps[i].n > x.eps[victim].n {
				victim = i
			}
		}
		x.removeNode(x.eps[victim].tail)
	}
}

func (x *Index) pushFront(ni uint32) {
	n := x.node(ni)
	x.changed(n.ep)
	e := &x.eps[n.ep]
	n.prev, n.next = 0, e.head
	if e.head != 0 {
		x.node(e.head).prev = ni
	}
	e.head = ni
	if e.tail == 0 {
		e.tail = ni
	}
	if e.run > 0 && n.stamp == e.runTop+1 {
		e.run++
	} else {
		e.run = 1
	}
	e.runTop = n.stamp
}

func (x *Index) unlink(ni uint32) {
	x.cuts++
	n := x.node(ni)
	x.changed(n.ep)
	e := &x.eps[n.ep]
	// A node of the run (its stamp in the run's range: stamps are unique) cuts it where it was.
	if e.run > 0 && n.stamp <= e.runTop && n.stamp > e.runTop-int64(e.run) {
		e.run = int(e.runTop - n.stamp)
	}
	if n.prev != 0 {
		x.node(n.prev).next = n.next
	} else {
		e.head = n.next
	}
	if n.next != 0 {
		x.node(n.next).prev = n.prev
	} else {
		e.tail = n.prev
	}
	n.prev, n.next = 0, 0
}

// removeNode drops one (block, endpoint) pair, and the block when nobody holds it any more.
func (x *Index) removeNode(ni uint32) {
	x.removed++
	x.unlink(ni)
	n := *x.node(ni)
	en := x.entry(n.entry)
	if en.head == ni {
		en.head = n.nextHolder
	} else {
		for p := en.head; p != 0; p = x.node(p).nextHolder {
			if x.node(p).nextHolder == ni {
				x.node(p).nextHolder = n.nextHolder
				break
			}
		}
	}
	en.n--
	x.eps[n.ep].n--
	x.nNode--
	*x.node(ni) = ixNode{nextHolder: x.freeN}
	x.freeN = ni
	if en.n == 0 {
		x.deleteEntry(n.entry)
	}
}

func (x *Index) allocNode() uint32 {
	if x.freeN != 0 {
		ni := x.freeN
		x.freeN = x.node(ni).nextHolder
		return ni
	}
	if x.nNod&(chunkLen-1) == 0 {
		x.nodes = append(x.nodes, make([]ixNode, chunkLen))
	}
	x.nNod++
	return x.nNod
}

// chunkLen is the number of entries or nodes in one chunk (64 or 128 KiB).
const (
	chunkBits = 12
	chunkLen  = 1 << chunkBits
)

// node returns node ni (an index + 1).
func (x *Index) node(ni uint32) *ixNode {
	i := ni - 1
	return &x.nodes[i>>chunkBits][i&(chunkLen-1)]
}

// entry returns entry ei (an index + 1).
func (x *Index) entry(ei uint32) *ixEntry {
	i := ei - 1
	return &x.entries[i>>chunkBits][i&(chunkLen-1)]
}

// Match writes into runs[ep], for every endpoint ep < len(runs), how many leading blocks of
// blocks that endpoint holds (the longest prefix it could serve from cache). blocks must be a
// whole chain from the first block, as inserted. It allocates nothing.
//
// Because what an endpoint holds is a set of whole prefixes (see Index), the holders of block
// k+1 are a subset of the holders of block k, so the number of holders never grows along the
// chain and only the positions where it drops matter: Match bisects for them, in
// O(d log n) lookups for n blocks and d distinct run lengths, and never more than n.
func (x *Index) Match(runs []int32, blocks []uint64) {
	x.match(runs, positions{}, blocks)
}

// MatchAmong writes into runs[i] how many leading blocks of blocks endpoint eps[i] holds: Match
// by position in a candidate list rather than by endpoint ID. Its cost grows with len(eps) and
// the holders of blocks, never with the IDs themselves, which are never reused: the highest
// grows with every endpoint a fleet has ever had, while a request is matched against the few
// it has now. runs must have room for len(eps). It allocates nothing once warm.
func (x *Index) MatchAmong(runs []int32, eps []int, blocks []uint64) {
	runs = runs[:len(eps)]
	if len(eps) == 0 {
		return
	}
	// Consecutive IDs (a fleet that came up or rolled over together, as the pool lists it)
	// need no table: position is ID - eps[0].
	first, last := eps[0], eps[len(eps)-1]
	if first >= 0 && last < math.MaxUint32 && last-first == len(eps)-1 {
		i := 1
		for i < len(eps) && eps[i] == first+i {
			i++
		}
		if i == len(eps) {
			x.match(runs, positions{base: first}, blocks)
			return
		}
	}
	var buf [64]uint64 // the table for up to 32 candidates
	table := buf[:]
	if 2*len(eps) > len(buf) {
		p, _ := x.tables.Get().(*[]uint64)
		if p == nil {
			p = new([]uint64)
		}
		defer x.tables.Put(p)
		if cap(*p) < 4*len(eps) { // newPositions takes at most 4x (a power of two >= 2x)
			*p = make([]uint64, 4*len(eps))
		}
		table = (*p)[:cap(*p)]
	}
	m := newPositions(table, eps)
	x.match(runs, m, blocks)
	if m.dup {
		for i, ep := range eps {
			if ep >= 0 && ep < math.MaxUint32 {
				runs[i] = runs[m.of(uint32(ep), len(runs))]
			}
		}
	}
}

// match is Match with the endpoints' positions in runs given by m.
func (x *Index) match(runs []int32, m positions, blocks []uint64) {
	clear(runs)
	if len(blocks) == 0 {
		return
	}
	x.mu.RLock()
	defer x.mu.RUnlock()
	c0 := x.holders(blocks[0])
	if c0 == 0 {
		return
	}
	x.bisect(runs, m, blocks, 0, len(blocks), c0, 0)
}

// holders returns how many endpoints hold hash.
func (x *Index) holders(h uint64) uint32 {
	if ei := x.find(h); ei != 0 {
		return x.entry(ei).n
	}
	return 0
}

// bisect finds the run ends in (lo, hi], knowing that cLo endpoints hold blocks[lo] and cHi
// hold blocks[hi] (none when hi == len(blocks)).
func (x *Index) bisect(runs []int32, m positions, blocks []uint64, lo, hi int, cLo, cHi uint32) {
	for cLo != cHi {
		if hi == lo+1 {
			// Every endpoint holding blocks[lo] but not blocks[hi] has its run end here; the
			// ones that hold both get a larger value later or earlier: keep the maximum.
			ei := x.find(blocks[lo])
			if ei == 0 {
				// Nobody holds blocks[lo] but someone holds blocks[hi]: a Drop took a block
				// whose descendants another request had added. No run ends here.
				return
			}
			for ni := x.entry(ei).head; ni != 0; {
				n := x.node(ni)
				i := -1 // m.of(n.ep, len(runs)), with the direct path inlined
				if m.hashed {
					i = m.find(n.ep)
				} else {
					i = m.direct(n.ep, len(runs))
				}
				if i >= 0 && runs[i] < int32(hi) {
					runs[i] = int32(hi)
				}
				ni = n.nextHolder
			}
			return
		}
		mid := lo + (hi-lo)/2
		cMid := x.holders(blocks[mid])
		x.bisect(runs, m, blocks, mid, hi, cMid, cHi)
		hi, cHi = mid, cMid
	}
}

// MatchLinear is Match by walking the chain block by block: the reference Match is checked
// against, and the fallback for callers that cannot promise whole chains.
func (x *Index) MatchLinear(runs []int32, blocks []uint64) {
	clear(runs)
	x.mu.RLock()
	defer x.mu.RUnlock()
	for i, h := range blocks {
		ei := x.find(h)
		if ei == 0 {
			return
		}
		advanced := false
		for ni := x.entry(ei).head; ni != 0; {
			n := x.node(ni)
			if int(n.ep) < len(runs) && runs[n.ep] == int32(i) {
				runs[n.ep] = int32(i + 1)
				advanced = true
			}
			ni = n.nextHolder
		}
		if !advanced {
			return
		}
	}
}

// MatchOne returns how many leading blocks endpoint ep holds, and appends to stamps the stamp
// of each of them (newest first along the chain is not guaranteed; one per matched block).
func (x *Index) MatchOne(ep int, blocks []uint64, stamps []int64) (int, []int64) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	for i, h := range blocks {
		ei := x.find(h)
		if ei == 0 {
			return i, stamps
		}
		found := false
		for ni := x.entry(ei).head; ni != 0; ni = x.node(ni).nextHolder {
			if int(x.node(ni).ep) == ep {
				stamps = append(stamps, x.node(ni).stamp)
				found = true
				break
			}
		}
		if !found {
			return i, stamps
		}
	}
	return len(blocks), stamps
}

// Forget drops every entry of endpoint ep last touched at or before stamp. It is the
// correction for an engine that reported fewer cached tokens than the index predicted: the
// engine has evicted the missing block, and with it, being LRU, everything older. It returns
// the number of entries dropped.
func (x *Index) Forget(ep int, stamp int64) int {
	x.mu.Lock()
	defer x.mu.Unlock()
	if ep < 0 || ep >= len(x.eps) {
		return 0
	}
	dropped := 0
	for t := x.eps[ep].tail; t != 0 && x.node(t).stamp <= stamp; t = x.eps[ep].tail {
		x.removeNode(t)
		dropped++
	}
	return dropped
}

// Drop removes blocks from endpoint ep, last first: for a request that was recorded by Insert
// but never reached the engine. Pass only the blocks it added (those past what ep held
// before), so that what ep holds stays a set of whole prefixes. It returns the number dropped.
func (x *Index) Drop(ep int, blocks []uint64) int {
	x.mu.Lock()
	defer x.mu.Unlock()
	if ep < 0 || ep >= len(x.eps) {
		return 0
	}
	dropped := 0
	for i := len(blocks) - 1; i >= 0; i-- {
		ei := x.find(blocks[i])
		if ei == 0 {
			continue
		}
		for ni := x.entry(ei).head; ni != 0; ni = x.node(ni).nextHolder {
			if int(x.node(ni).ep) == ep {
				x.removeNode(ni)
				dropped++
				break
			}
		}
	}
	return dropped
}

// Expire drops every entry of every endpoint last touched before the given time (for indexes
// whose entries live a fixed time without confirmation). It returns the number dropped.
func (x *Index) Expire(before int64) int {
	x.mu.Lock()
	defer x.mu.Unlock()
	dropped := 0
	for ep := range x.eps {
		for t := x.eps[ep].tail; t != 0 && x.node(t).stamp < before; t = x.eps[ep].tail {
			x.removeNode(t)
			dropped++
		}
	}
	return dropped
}

// Remove purges endpoint ep: it holds nothing any more, and its capacity returns to the default.
func (x *Index) Remove(ep int) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if ep < 0 || ep >= len(x.eps) {
		return
	}
	for t := x.eps[ep].tail; t != 0; t = x.eps[ep].tail {
		x.removeNode(t)
	}
	x.eps[ep] = ixEndpoint{}
}

// Fill writes, for every endpoint ep < len(fill) (tails must be as long), how full its LRU is
// (entries / capacity, 0..1) into fill[ep], and the stamp of its least recently used entry
// into tails[ep] when it is full, else 0: new blocks on a full endpoint evict entries of that
// age, so the older it is, the less useful what they push out.
func (x *Index) Fill(fill []float64, tails []int64) {
	clear(fill)
	clear(tails)
	x.mu.RLock()
	defer x.mu.RUnlock()
	for ep := range min(len(fill), len(tails), len(x.eps)) {
		fill[ep], tails[ep] = x.fillOf(ep)
	}
}

// FillAmong writes into fill[i] and tails[i] what Fill writes for endpoint eps[i], in time
// that grows with len(eps) only (see MatchAmong). fill and tails must have room for len(eps).
func (x *Index) FillAmong(fill []float64, tails []int64, eps []int) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	for i, ep := range eps {
		fill[i], tails[i] = 0, 0
		if ep >= 0 && ep < len(x.eps) {
			fill[i], tails[i] = x.fillOf(ep)
		}
	}
}

// fillOf is Fill's answer for ep, which must be < len(x.eps).
func (x *Index) fillOf(ep int) (fill float64, tail int64) {
	e := &x.eps[ep]
	c := x.capOf(ep)
	if e.tail != 0 && e.n >= c {
		tail = x.node(e.tail).stamp
	}
	return float64(e.n) / float64(c), tail
}

// Len returns the entries endpoint ep holds.
func (x *Index) Len(ep int) int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	if ep < 0 || ep >= len(x.eps) {
		return 0
	}
	return x.eps[ep].n
}

// Size returns the (block, endpoint) entries of all endpoints and the bytes the index holds
// (its tables as allocated, including spare room).
func (x *Index) Size() (entries int, bytes int64) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	bytes = int64(cap(x.table))*8 +
		int64(len(x.entries))*chunkLen*int64(unsafe.Sizeof(ixEntry{})) +
		int64(len(x.nodes))*chunkLen*int64(unsafe.Sizeof(ixNode{})) +
		int64(cap(x.eps))*int64(unsafe.Sizeof(ixEndpoint{}))
	return x.nNode, bytes
}

// Blocks returns the distinct blocks held by at least one endpoint.
func (x *Index) Blocks() int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return x.nEntry
}

// The hash table: linear probing on the block hash itself (already an xxhash output, so its low
// bits are uniform), at most 3/4 full, backward-shift deletion (no tombstones). A slot keeps the
// hash's low 32 bits beside the entry index, so that a probe reads the entry only when those
// match, and deletion finds every slot's home without reading entries at all: each entry read
// was a cache miss, and probes were most of the index's time.

const slotIndex = 1<<32 - 1 // a slot's entry index bits

// slotOf is the table slot for entry ei of hash h.
func slotOf(h uint64, ei uint32) uint64 { return h<<32 | uint64(ei) }

// home is the slot where the probe for slot s's hash starts, in a table of mask+1 slots.
func (x *Index) home(s, mask uint64) uint64 {
	if mask > slotIndex {
		// Not reachable with uint32 entry indexes in practice (billions of entries), but a
		// table this large needs more hash bits than a slot keeps.
		return x.entry(uint32(s)).hash & mask
	}
	return s >> 32 & mask
}

func (x *Index) find(h uint64) uint32 {
	mask := uint64(len(x.table) - 1)
	tag := h << 32
	for i := h & mask; ; i = (i + 1) & mask {
		s := x.table[i]
		if s == 0 {
			return 0
		}
		if s&^slotIndex == tag && x.entry(uint32(s)).hash == h {
			return uint32(s)
		}
	}
}

func (x *Index) findOrAdd(h uint64) uint32 {
	if ei := x.find(h); ei != 0 {
		return ei
	}
	if (x.nEntry+1)*4 > len(x.table)*3 {
		x.grow()
	}
	var ei uint32
	if x.freeE != 0 {
		ei = x.freeE
		x.freeE = x.entry(ei).head
	} else {
		if x.nEnt&(chunkLen-1) == 0 {
			x.entries = append(x.entries, make([]ixEntry, chunkLen))
		}
		x.nEnt++
		ei = x.nEnt
	}
	*x.entry(ei) = ixEntry{hash: h}
	mask := uint64(len(x.table) - 1)
	i := h & mask
	for x.table[i] != 0 {
		i = (i + 1) & mask
	}
	x.table[i] = slotOf(h, ei)
	x.nEntry++
	return ei
}

func (x *Index) grow() {
	old := x.table
	x.table = make([]uint64, 2*len(old))
	mask := uint64(len(x.table) - 1)
	for _, s := range old {
		if s == 0 {
			continue
		}
		i := x.home(s, mask)
		for x.table[i] != 0 {
			i = (i + 1) & mask
		}
		x.table[i] = s
	}
}

func (x *Index) deleteEntry(ei uint32) {
	h := x.entry(ei).hash
	mask := uint64(len(x.table) - 1)
	i := h & mask
	for uint32(x.table[i]) != ei {
		i = (i + 1) & mask
	}
	// Backward shift: move later members of the probe run into the hole when their home slot
	// allows it.
	for j := (i + 1) & mask; x.table[j] != 0; j = (j + 1) & mask {
		home := x.home(x.table[j], mask)
		if (j-home)&mask >= (j-i)&mask {
			x.table[i] = x.table[j]
			i = j
		}
	}
	x.table[i] = 0
	*x.entry(ei) = ixEntry{head: x.freeE}
	x.freeE = ei
	x.nEntry--
}
