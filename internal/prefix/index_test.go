package prefix

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func chain(keys ...uint64) []uint64 { return Chain(nil, Seed("m", ""), keys) }

func match(x *Index, n int, blocks []uint64) []int32 {
	runs := make([]int32, n)
	x.Match(runs, blocks)
	return runs
}

func TestIndex_InsertMatch(t *testing.T) {
	x := NewIndex(IndexConfig{DefaultCapacity: 100})
	a := chain(1, 2, 3, 4)
	b := chain(1, 2, 9)
	x.Insert(0, a, 1)
	x.Insert(2, b, 2)
	if diff := cmp.Diff([]int32{4, 0, 2}, match(x, 3, a)); diff != "" {
		t.Errorf("match a (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]int32{2, 0, 3}, match(x, 3, b)); diff != "" {
		t.Errorf("match b (-want +got):\n%s", diff)
	}
	// Runs shorter than len(endpoints) are fine: endpoint 2 is just not reported.
	if diff := cmp.Diff([]int32{2, 0}, match(x, 2, b)); diff != "" {
		t.Errorf("short runs (-want +got):\n%s", diff)
	}
	if got := x.Blocks(); got != 5 {
		t.Errorf("Blocks = %d, want 5 distinct", got)
	}
	if n, _ := x.Size(); n != 7 {
		t.Errorf("entries = %d, want 7", n)
	}
	// A chain that only shares a later content key shares nothing (hashes are chained).
	if diff := cmp.Diff([]int32{0, 0, 0}, match(x, 3, chain(2, 3, 4))); diff != "" {
		t.Errorf("unchained match (-want +got):\n%s", diff)
	}
}

func TestIndex_LRUEvictsOldestTailFirst(t *testing.T) {
	x := NewIndex(IndexConfig{DefaultCapacity: 4})
	a := chain(1, 2, 3) // 3 entries
	b := chain(7, 8)    // 2 entries: total 5 > 4, so a's last block goes
	x.Insert(0, a, 1)
	x.Insert(0, b, 2)
	if got := match(x, 1, a)[0]; got != 2 {
		t.Fatalf("after overflow a run = %d, want 2 (tail block evicted first)", got)
	}
	if got := match(x, 1, b)[0]; got != 2 {
		t.Fatalf("b run = %d, want 2", got)
	}
	// Touch a's prefix by inserting it again: now b is oldest and loses its tail.
	x.Insert(0, a[:2], 3)
	c := chain(5)
	x.Insert(0, c, 4)
	if got := match(x, 1, b)[0]; got != 1 {
		t.Errorf("b run = %d, want 1 after b became the oldest", got)
	}
	if got := match(x, 1, a)[0]; got != 2 {
		t.Errorf("a run = %d, want 2 (recently touched)", got)
	}
	if got := x.Len(0); got != 4 {
		t.Errorf("Len = %d, want capacity 4", got)
	}
}

func TestIndex_SetCapacityTrims(t *testing.T) {
	x := NewIndex(IndexConfig{DefaultCapacity: 10})
	a := chain(1, 2, 3, 4, 5, 6)
	x.Insert(1, a, 1)
	x.SetCapacity(1, 2)
	if got, want := match(x, 2, a), []int32{0, 2}; !slices.Equal(got, want) {
		t.Errorf("after SetCapacity(2): %v, want %v", got, want)
	}
	if x.Capacity(1) != 2 || x.Capacity(0) != 10 || x.Capacity(99) != 10 {
		t.Errorf("Capacity = %d %d %d", x.Capacity(1), x.Capacity(0), x.Capacity(99))
	}
}

func TestIndex_ForgetDropsOlderEntries(t *testing.T) {
	x := NewIndex(IndexConfig{DefaultCapacity: 100})
	old := chain(1, 2, 3)
	x.Insert(0, old, 10)
	mid := chain(4, 5)
	x.Insert(0, mid, 20)
	// The engine says it had only 1 block of old: old[1] (stamp around 10) was evicted, and
	// everything not newer.
	n, stamps := x.MatchOne(0, old, nil)
	if n != 3 || len(stamps) != 3 {
		t.Fatalf("MatchOne = %d, %v", n, stamps)
	}
	dropped := x.Forget(0, stamps[1])
	if dropped != 2 {
		t.Errorf("Forget dropped %d, want 2 (old[1], old[2])", dropped)
	}
	if got := match(x, 1, old)[0]; got != 1 {
		t.Errorf("old run = %d, want 1", got)
	}
	if got := match(x, 1, mid)[0]; got != 2 {
		t.Errorf("newer entries must survive, mid run = %d", got)
	}
	if x.Forget(5, 1e18) != 0 {
		t.Errorf("Forget on an unknown endpoint dropped something")
	}
}

func TestIndex_RemovePurgesEndpoint(t *testing.T) {
	x := NewIndex(IndexConfig{DefaultCapacity: 100})
	a := chain(1, 2, 3)
	x.Insert(0, a, 1)
	x.Insert(1, a, 2)
	x.SetCapacity(1, 50)
	x.Remove(1)
	if diff := cmp.Diff([]int32{3, 0}, match(x, 2, a)); diff != "" {
		t.Errorf("after Remove(1) (-want +got):\n%s", diff)
	}
	if x.Len(1) != 0 || x.Capacity(1) != 100 {
		t.Errorf("Len %d Capacity %d after Remove", x.Len(1), x.Capacity(1))
	}
	x.Remove(0)
	if n, _ := x.Size(); n != 0 || x.Blocks() != 0 {
		t.Errorf("index not empty: %d entries, %d blocks", n, x.Blocks())
	}
}

func TestIndex_GlobalCapEvictsFromFullest(t *testing.T) {
	x := NewIndex(IndexConfig{DefaultCapacity: 100, MaxEntries: 5})
	x.Insert(0, chain(1, 2, 3, 4), 1)
	x.Insert(1, chain(9, 8), 2) // 6 > 5: endpoint 0 (fullest) loses its oldest
	if n, _ := x.Size(); n != 5 {
		t.Errorf("entries = %d, want cap 5", n)
	}
	if x.Len(0) != 3 || x.Len(1) != 2 {
		t.Errorf("Len = %d, %d; want 3, 2", x.Len(0), x.Len(1))
	}
}

func TestIndex_DropUndoesAnInsert(t *testing.T) {
	x := NewIndex(IndexConfig{DefaultCapacity: 100})
	a := chain(1, 2)
	b := chain(1, 2, 3, 4)
	x.Insert(0, a, 1)
	x.Insert(0, b, 2) // never reached the engine: undo what it added
	if got := x.Drop(0, b[2:]); got != 2 {
		t.Errorf("Drop = %d, want 2", got)
	}
	if diff := cmp.Diff([]int32{2}, match(x, 1, b)); diff != "" {
		t.Errorf("after Drop (-want +got):\n%s", diff)
	}
	if x.Drop(0, chain(9)) != 0 || x.Drop(7, b) != 0 {
		t.Errorf("Drop of unknown blocks or endpoint dropped something")
	}
}

func TestIndex_Expire(t *testing.T) {
	x := NewIndex(IndexConfig{DefaultCapacity: 100})
	a, b := chain(1, 2), chain(3)
	x.Insert(0, a, 100)
	x.Insert(1, b, 200)
	if got := x.Expire(150); got != 2 {
		t.Errorf("Expire dropped %d, want 2", got)
	}
	if diff := cmp.Diff([]int32{0, 1}, match(x, 2, b)); diff != "" {
		t.Errorf("b after Expire (-want +got):\n%s", diff)
	}
}

// Property: the index agrees with a plain reference model (per endpoint, an ordered list of
// blocks, most recent first) over random inserts, removals and corrections.
func TestIndex_AgreesWithModel(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 99))
	const eps, capacity = 4, 40
	x := NewIndex(IndexConfig{DefaultCapacity: capacity})
	model := make([][]uint64, eps)
	var prompts [][]uint64
	for i := 0; i < 30; i++ {
		keys := []uint64{uint64(r.IntN(3))}
		for j := r.IntN(12); j > 0; j-- {
			keys = append(keys, uint64(r.IntN(4)))
		}
		prompts = append(prompts, chain(keys...))
	}
	now := int64(0)
	for step := 0; step < 3000; step++ {
		ep := r.IntN(eps)
		p := prompts[r.IntN(len(prompts))]
		switch op := r.IntN(20); {
		case op < 16:
			now++
			x.Insert(ep, p, now)
			for i := len(p) - 1; i >= 0; i-- {
				l := slices.DeleteFunc(model[ep], func(h uint64) bool { return h == p[i] })
				model[ep] = append([]uint64{p[i]}, l...)
			}
			if len(model[ep]) > capacity {
				model[ep] = model[ep][:capacity]
			}
		case op < 17:
			x.Remove(ep)
			model[ep] = nil
		default:
			runs := match(x, eps, p)
			linear := make([]int32, eps)
			x.MatchLinear(linear, p)
			if !slices.Equal(runs, linear) {
				t.Fatalf("step %d: Match %v, MatchLinear %v", step, runs, linear)
			}
			for e := 0; e < eps; e++ {
				want := 0
				for want < len(p) && slices.Contains(model[e], p[want]) {
					want++
				}
				if int(runs[e]) != want {
					t.Fatalf("step %d: endpoint %d run %d, model says %d", step, e, runs[e], want)
				}
			}
		}
	}
	lens := make([]int, len(model))
	for e := range model {
		lens[e] = len(model[e])
	}
	checkLens(t, x, lens)
}

func TestIndex_ConcurrentUse(t *testing.T) {
	x := NewIndex(IndexConfig{DefaultCapacity: 64})
	done := make(chan struct{})
	for g := 0; g < 4; g++ {
		go func(g int) {
			defer func() { done <- struct{}{} }()
			runs := make([]int32, 4)
			for i := 0; i < 300; i++ {
				p := chain(uint64(g), uint64(i%7), uint64(i%5))
				x.Insert(g, p, int64(i))
				x.Match(runs, p)
				if runs[g] == 0 {
					t.Errorf("goroutine %d: own insert not visible", g)
					return
				}
			}
		}(g)
	}
	for g := 0; g < 4; g++ {
		<-done
	}
}

// TestIndex_AgreesWithModelAtScale is TestIndex_AgreesWithModel with enough blocks for the
// hash table to grow many times, probe runs to be long and the entries and nodes to fill
// several chunks, and with whole endpoints removed now and then (mass deletion).
func TestIndex_AgreesWithModelAtScale(t *testing.T) {
	r := rand.New(rand.NewPCG(2, 7))
	const eps, capacity = 3, 5000
	x := NewIndex(IndexConfig{DefaultCapacity: capacity})
	// model[ep] is the endpoint's LRU: block -> last use; the least recent goes first.
	model := make([]map[uint64]int64, eps)
	for e := range model {
		model[e] = map[uint64]int64{}
	}
	var prompts [][]uint64
	for i := 0; i < 300; i++ {
		keys := []uint64{uint64(r.IntN(20))}
		for j := r.IntN(120); j > 0; j-- {
			keys = append(keys, uint64(r.IntN(1000)))
		}
		prompts = append(prompts, chain(keys...))
	}
	tick := int64(0)
	for step := 0; step < 2000; step++ {
		ep := r.IntN(eps)
		p := prompts[r.IntN(len(prompts))]
		switch op := r.IntN(100); {
		case op < 80:
			x.Insert(ep, p, int64(step))
			for i := len(p) - 1; i >= 0; i-- {
				tick++
				model[ep][p[i]] = tick
				if len(model[ep]) > capacity {
					oldest, at := uint64(0), int64(-1)
					for h, s := range model[ep] {
						if at < 0 || s < at {
							oldest, at = h, s
						}
					}
					delete(model[ep], oldest)
				}
			}
		case op < 81:
			x.Remove(ep)
			clear(model[ep])
		default:
			runs := match(x, eps, p)
			for e := 0; e < eps; e++ {
				want := 0
				for want < len(p) {
					if _, ok := model[e][p[want]]; !ok {
						break
					}
					want++
				}
				if int(runs[e]) != want {
					t.Fatalf("step %d: endpoint %d run %d, model says %d", step, e, runs[e], want)
				}
			}
		}
	}
	lens := make([]int, len(model))
	for e := range model {
		lens[e] = len(model[e])
	}
	checkLens(t, x, lens)
	if x.nNod <= chunkLen || x.nEnt <= chunkLen || len(x.table) < 8192 {
		t.Errorf("%d nodes, %d entries, %d slots: too few to test chunks and growth", x.nNod, x.nEnt, len(x.table))
	}
}

// checkLens compares the index's per-endpoint lengths and its total size with a model's.
func checkLens(t *testing.T, x *Index, lens []int) {
	t.Helper()
	total := 0
	for e, n := range lens {
		if x.Len(e) != n {
			t.Errorf("endpoint %d: Len %d, model %d", e, x.Len(e), n)
		}
		total += n
	}
	if n, _ := x.Size(); n != total {
		t.Errorf("entries %d, model %d", n, total)
	}
}
