package prefix

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// insertRef is Insert block by block, from the last to the first, with no shortcut: the
// reference for Insert's head-run path.
func (x *Index) insertRef(ep int, blocks []uint64, now int64) {
	if ep < 0 || len(blocks) == 0 {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	x.endpoint(ep)
	for i := len(blocks) - 1; i >= 0; i-- {
		x.touch(ep, x.findOrAdd(blocks[i]), x.stamp(now))
		x.trim(ep)
	}
}

type lruEntry struct {
	Hash  uint64
	Stamp int64
}

// lists returns every endpoint's LRU list, most recent first.
func (x *Index) lists() [][]lruEntry {
	x.mu.RLock()
	defer x.mu.RUnlock()
	out := make([][]lruEntry, len(x.eps))
	for ep := range x.eps {
		for ni := x.eps[ep].head; ni != 0; ni = x.node(ni).next {
			n := x.node(ni)
			out[ep] = append(out[ep], lruEntry{x.entry(n.entry).hash, n.stamp})
		}
	}
	return out
}

// indexSeeds adds the index fuzz targets' seeds: (seed, capacity, maxEntries) as fuzzConfig
// reads them.
func indexSeeds(f *testing.F) {
	f.Add(uint64(1), uint8(40), uint8(0))
	f.Add(uint64(2), uint8(200), uint8(3))
	f.Add(uint64(3), uint8(12), uint8(1))
}

// fuzzConfig is an index of small capacities: 1 to 64 blocks per endpoint, and no bound on the
// entries (0) or 8 to 2,040.
func fuzzConfig(capacity, maxEntries uint8) IndexConfig {
	return IndexConfig{DefaultCapacity: int(capacity%64) + 1, MaxEntries: int(maxEntries) * 8}
}

// FuzzInsertHeadRun drives Insert and insertRef with the same requests, conversations that
// grow, share prefixes, repeat a block or run into small capacities, and checks that every
// endpoint's list, order and stamps, is the same after each; and InsertTwice against an
// insertRef, and a second one where the first removed anything.
func FuzzInsertHeadRun(f *testing.F) {
	indexSeeds(f)
	f.Fuzz(func(t *testing.T, seed uint64, capacity, maxEntries uint8) {
		r := rand.New(rand.NewPCG(seed, 9))
		cfg := fuzzConfig(capacity, maxEntries)
		fast, ref := NewIndex(cfg), NewIndex(cfg)
		var convs conversations
		now := int64(0)
		for step := range 200 {
			blocks := convs.next(r)
			ep := r.IntN(3)
			now += int64(r.IntN(3)) // stamps collide, as clocks do
			switch r.IntN(4) {
			case 0, 1:
				fast.Insert(ep, blocks, now)
				ref.insertRef(ep, blocks, now)
			case 2: // the request ends: inserted again
				fast.Insert(ep, blocks, now)
				ref.insertRef(ep, blocks, now)
				fast.Insert(ep, blocks, now)
				ref.insertRef(ep, blocks, now)
			case 3: // routed and ended at once: inserted again only if the first insert removed anything
				fast.InsertTwice(ep, blocks, now)
				removed := ref.removed
				ref.insertRef(ep, blocks, now)
				if ref.removed != removed {
					ref.insertRef(ep, blocks, now)
				}
			}
			if want, got := ref.lists(), fast.lists(); !equalLists(want, got) {
				t.Fatalf("step %d: lists differ (-ref +Insert):\n%s", step, cmp.Diff(want, got))
			}
		}
	})
}

// conversations are the prompts of the index's fuzz targets: four conversations, one of which
// grows at each step (starting over, now and then, from a prefix of another one, or repeating
// one of its own blocks); what is sent is that conversation, or now and then a prefix of it.
type conversations [4][]uint64

// next grows one of the conversations and returns what is sent.
func (cs *conversations) next(r *rand.Rand) []uint64 {
	c := r.IntN(len(cs))
	switch r.IntN(6) {
	case 0: // a new conversation, sharing a prefix with another one
		o := cs[r.IntN(len(cs))]
		cs[c] = append([]uint64(nil), o[:r.IntN(len(o)+1)]...)
	case 1: // a repeated block
		if len(cs[c]) > 0 {
			cs[c] = append(cs[c], cs[c][r.IntN(len(cs[c]))])
		}
	}
	for range r.IntN(12) {
		cs[c] = append(cs[c], r.Uint64N(1<<20)+1)
	}
	blocks := cs[c]
	if r.IntN(3) == 0 && len(blocks) > 0 {
		blocks = blocks[:r.IntN(len(blocks))+1]
	}
	return blocks
}

func equalLists(a, b [][]lruEntry) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !slices.Equal(a[i], b[i]) {
			return false
		}
	}
	return true
}

// hashes returns every endpoint's blocks, most recent first, without their stamps.
func hashes(lists [][]lruEntry) [][]uint64 {
	out := make([][]uint64, len(lists))
	for ep, l := range lists {
		for _, e := range l {
			out[ep] = append(out[ep], e.Hash)
		}
	}
	return out
}

// FuzzReinsertSkipsOnlyNoOps drives two indexes with the same requests, each inserted when
// routed and again when done, with other requests, corrections, drops and removals in between;
// one inserts again with Reinsert and the mark InsertMark gave, the other always. Every
// endpoint's blocks, in order, must be the same after each step: Reinsert skips only inserts
// that would have changed nothing but stamps.
func FuzzReinsertSkipsOnlyNoOps(f *testing.F) {
	indexSeeds(f)
	f.Fuzz(func(t *testing.T, seed uint64, capacity, maxEntries uint8) {
		r := rand.New(rand.NewPCG(seed, 11))
		cfg := fuzzConfig(capacity, maxEntries)
		skip, ref := NewIndex(cfg), NewIndex(cfg)
		type flight struct {
			ep     int
			blocks []uint64
			mark   uint64
		}
		var convs conversations
		var flights []flight
		now := int64(0)
		skipped := 0
		for step := range 300 {
			now += int64(r.IntN(3))
			switch op := r.IntN(10); {
			case op < 5 || len(flights) == 0: // a request is routed
				blocks := slices.Clone(convs.next(r))
				ep := r.IntN(3)
				flights = append(flights, flight{ep, blocks, skip.InsertMark(ep, blocks, now)})
				ref.Insert(ep, blocks, now)
			case op < 8: // one ends, the last most often (requests one at a time)
				i := len(flights) - 1
				if r.IntN(3) == 0 {
					i = r.IntN(len(flights))
				}
				fl := flights[i]
				flights = slices.Delete(flights, i, i+1)
				if !skip.Reinsert(fl.ep, fl.blocks, now, fl.mark) {
					skipped++
				}
				ref.Insert(fl.ep, fl.blocks, now)
			case op == 8: // a correction or a failed request's drop
				ep := r.IntN(3)
				if r.IntN(2) == 0 {
					// Stamps differ between the two: the same position in both lists, the
					// same blocks forgotten (the stamps fall along a list).
					if lists := ref.lists(); ep < len(lists) && len(lists[ep]) > 0 {
						pos := r.IntN(len(lists[ep]))
						skip.Forget(ep, skip.lists()[ep][pos].Stamp)
						ref.Forget(ep, lists[ep][pos].Stamp)
					}
				} else {
					blocks := convs.next(r)
					skip.Drop(ep, blocks)
					ref.Drop(ep, blocks)
				}
			default: // an endpoint leaves
				ep := r.IntN(3)
				skip.Remove(ep)
				ref.Remove(ep)
			}
			if want, got := hashes(ref.lists()), hashes(skip.lists()); !cmp.Equal(want, got) {
				t.Fatalf("step %d: blocks differ (-Insert +Reinsert):\n%s", step, cmp.Diff(want, got))
			}
		}
		if testing.Verbose() {
			t.Logf("%d inserts skipped", skipped)
		}
	})
}

// TestReinsertSkipsWhenNothingChanged: Reinsert skips while the endpoint's list is as its
// InsertMark left it, whatever other endpoints do, and inserts once it changed or when the
// first insert evicted.
func TestReinsertSkipsWhenNothingChanged(t *testing.T) {
	x := NewIndex(IndexConfig{DefaultCapacity: 8})
	a, b := chain(1, 2, 3), chain(7, 8)
	mark := x.InsertMark(0, a, 1)
	x.Insert(1, b, 2) // another endpoint
	if x.Reinsert(0, a, 3, mark) {
		t.Error("inserted again although endpoint 0 did not change")
	}
	mark = x.InsertMark(0, a, 4)
	x.Insert(0, b, 5)
	if !x.Reinsert(0, a, 6, mark) {
		t.Error("skipped although endpoint 0 took other blocks since")
	}
	if diff := cmp.Diff([]uint64{a[0], a[1], a[2], b[0], b[1]}, hashes(x.lists())[0]); diff != "" {
		t.Errorf("endpoint 0 (-want +got):\n%s", diff)
	}
	small := NewIndex(IndexConfig{DefaultCapacity: 2})
	if mark := small.InsertMark(0, a, 1); mark != 0 {
		t.Errorf("an insert that evicted its own blocks gave mark %d, want 0", mark)
	}
}
