package prefix

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

// heldWhole returns, for each endpoint < n, how many of chains (each inserted on one endpoint)
// it holds whole.
func heldWhole(x *Index, n int, chains [][]uint64) []int {
	out := make([]int, n)
	for _, c := range chains {
		for ep, run := range match(x, n, c) {
			if int(run) == len(c) {
				out[ep]++
			}
		}
	}
	return out
}

// notHeld returns the positions in chains of those ep does not hold whole.
func notHeld(x *Index, ep int, chains [][]uint64) []int {
	var out []int
	for i, c := range chains {
		if int(match(x, ep+1, c)[ep]) != len(c) {
			out = append(out, i)
		}
	}
	return out
}

// TestIndexResize: Resize gives an index the sizes NewIndex would: an endpoint of the default
// capacity keeps its newest blocks up to the new default, one given a capacity keeps it (unless
// reset names it: then the default), the global cap takes the fullest endpoint's oldest first,
// and a larger size evicts nothing and lets the index grow to it.
func TestIndexResize(t *testing.T) {
	x := NewIndex(IndexConfig{DefaultCapacity: 100})
	// Chains of 4 blocks: endpoint 0 gets 20 (80 blocks), 1 gets 10 (40 blocks, capacity 60), 2
	// gets 10 (capacity 50, reset to the default below).
	x.SetCapacity(1, 60)
	x.SetCapacity(2, 50)
	var chains [][]uint64
	var of [3][][]uint64 // each endpoint's, oldest first
	stamp := int64(0)
	for i := range 40 {
		ep := 0
		if i%4 == 1 {
			ep = 1
		} else if i%4 == 3 {
			ep = 2
		}
		c := chain(uint64(1000*i+1), uint64(1000*i+2), uint64(1000*i+3), uint64(1000*i+4))
		chains = append(chains, c)
		of[ep] = append(of[ep], c)
		stamp++
		x.Insert(ep, c, stamp)
	}
	if diff := cmp.Diff([]int{20, 10, 10}, heldWhole(x, 3, chains)); diff != "" {
		t.Fatalf("before (-want +got):\n%s", diff)
	}
	// Default 20 blocks: endpoint 0 keeps its 5 newest chains, 1 all (its own capacity), and 2,
	// reset, its 5 newest.
	evicted := x.Resize(IndexConfig{DefaultCapacity: 20}, func(ep int) bool { return ep == 2 })
	if evicted != 60+20 {
		t.Errorf("evicted %d entries, want 80", evicted)
	}
	if diff := cmp.Diff([]int{5, 10, 5}, heldWhole(x, 3, chains)); diff != "" {
		t.Errorf("after the default shrank (-want +got):\n%s", diff)
	}
	for _, ep := range []int{0, 2} {
		if lost := notHeld(x, ep, of[ep][len(of[ep])-5:]); len(lost) > 0 {
			t.Errorf("endpoint %d lost %v of its 5 newest chains", ep, lost)
		}
	}
	if got := []int{x.Capacity(0), x.Capacity(1), x.Capacity(2)}; !cmp.Equal(got, []int{20, 60, 20}) {
		t.Errorf("capacities %v, want [20 60 20]", got)
	}
	// A global cap of 60 entries (80 held): endpoint 1, the fullest, gives its 5 oldest chains.
	if evicted := x.Resize(IndexConfig{DefaultCapacity: 20, MaxEntries: 60}, nil); evicted != 20 {
		t.Errorf("the global cap evicted %d entries, want 20", evicted)
	}
	if diff := cmp.Diff([]int{5, 5, 5}, heldWhole(x, 3, chains)); diff != "" {
		t.Errorf("after the global cap (-want +got):\n%s", diff)
	}
	// Larger again: nothing goes, and the index grows to the new sizes.
	if evicted := x.Resize(IndexConfig{DefaultCapacity: 40}, nil); evicted != 0 {
		t.Errorf("growing evicted %d entries", evicted)
	}
	for i := range 5 {
		stamp++
		x.Insert(0, chain(uint64(90_000+10*i+1), uint64(90_000+10*i+2), uint64(90_000+10*i+3), uint64(90_000+10*i+4)), stamp)
	}
	if got := x.Len(0); got != 40 {
		t.Errorf("endpoint 0 holds %d entries after growing, want 40 (the new default)", got)
	}
	if got := x.Sizes(); got != (IndexConfig{DefaultCapacity: 40}) {
		t.Errorf("sizes %+v after, want the last Resize's", got)
	}
}

// TestIndexResizeSteps: a shrink evicts in steps, the lock released between them (a lookup and
// an insert run there), and an insert between two steps evicts no more than it adds: the sizes
// in force step down from what the index holds. Before, a new size took a copy of the whole
// index, under the old one's read lock for its walk.
func TestIndexResizeSteps(t *testing.T) {
	const eps, per = 4, 5 * resizeBatch
	x := NewIndex(IndexConfig{DefaultCapacity: per})
	stamp := int64(0)
	var last [eps][]uint64
	for ep := range eps {
		for i := range per / 8 {
			keys := make([]uint64, 8)
			for k := range keys {
				keys[k] = uint64(ep)<<40 | uint64(i)<<8 | uint64(k)
			}
			stamp++
			last[ep] = chain(keys...)
			x.Insert(ep, last[ep], stamp)
		}
	}
	steps := 0
	x.resized = func() {
		steps++
		if steps > 100 {
			t.Fatal("more than 100 steps")
		}
		before, _ := x.Size()
		if runs := match(x, eps, last[0]); runs[0] != 8 {
			t.Errorf("step %d: endpoint 0's newest chain matched %v, want held", steps, runs)
		}
		stamp++
		x.Insert(steps%eps, chain(uint64(1)<<50|uint64(steps)), stamp)
		if after, _ := x.Size(); after < before {
			t.Errorf("step %d: an insert of one block took the index from %d to %d entries", steps, before, after)
		}
	}
	// Half the default and a global cap of a quarter of what is held: 3/4 of the entries go.
	evicted := x.Resize(IndexConfig{DefaultCapacity: per / 2, MaxEntries: eps * per / 4}, nil)
	if n, _ := x.Size(); n != eps*per/4 {
		t.Errorf("%d entries after, want %d", n, eps*per/4)
	}
	if want := eps * per * 3 / 4; evicted < want-steps || evicted > want+steps {
		t.Errorf("evicted %d, want about %d", evicted, want)
	}
	if min := evicted/resizeBatch - 2; steps < min {
		t.Errorf("%d steps for %d evictions, want at least %d (at most %d a step)", steps, evicted, min, resizeBatch)
	}
	for ep := range eps {
		if runs := match(x, eps, last[ep]); runs[ep] != 8 {
			t.Errorf("endpoint %d's newest chain matched %v after, want held", ep, runs)
		}
	}
}
