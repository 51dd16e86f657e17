package prefix

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestIndex_MatchAmongAgreesWithMatch is a property test: for random indexes and random
// candidate lists (high IDs, IDs nobody inserted, negative ones, repeats), MatchAmong's
// runs[i] is Match's runs[eps[i]], and FillAmong's fill[i] and tails[i] are Fill's.
func TestIndex_MatchAmongAgreesWithMatch(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for round := range 200 {
		x := NewIndex(IndexConfig{DefaultCapacity: 40})
		// IDs from base to hi, close together (a direct table) or spread (a hashed one).
		base := r.IntN(2) * 20_000
		hi := base + []int{4, 40, 200, 5000}[round%4] + r.IntN(10)
		ids := make([]int, 1+r.IntN(12))
		for i := range ids {
			ids[i] = base + r.IntN(hi-base)
		}
		now := int64(0)
		for range 60 {
			keys := make([]uint64, 1+r.IntN(12))
			for k := range keys {
				keys[k] = uint64(r.IntN(3)) // few distinct keys: shared prefixes
			}
			now++
			x.Insert(ids[r.IntN(len(ids))], chain(keys...), now)
		}
		eps := make([]int, 1+r.IntN(40))
		for i := range eps {
			switch r.IntN(8) {
			case 0:
				eps[i] = base + r.IntN(hi-base+10)
			case 1:
				eps[i] = -1 - r.IntN(3)
			case 2:
				eps[i] = math.MaxUint32 + r.IntN(3)
			default:
				eps[i] = ids[r.IntN(len(ids))]
			}
		}
		if round%5 == 0 { // consecutive IDs, as a fleet that came up together lists them
			first := base + r.IntN(hi-base)
			for i := range eps {
				eps[i] = first + i
			}
		}
		blocks := chain(0, 0, 1, 2, 0, 1, 2, 1, 0, 2, 1, 0)[:r.IntN(13)]
		all := make([]int32, hi+10)
		x.Match(all, blocks)
		fill, tails := make([]float64, hi+10), make([]int64, hi+10)
		x.Fill(fill, tails)
		want, wantFill, wantTails := make([]int32, len(eps)), make([]float64, len(eps)), make([]int64, len(eps))
		for i, ep := range eps {
			if ep >= 0 && ep < len(all) {
				want[i], wantFill[i], wantTails[i] = all[ep], fill[ep], tails[ep]
			}
		}
		got := make([]int32, len(eps))
		for i := range got {
			got[i] = -7 // MatchAmong overwrites whatever was there
		}
		x.MatchAmong(got, eps, blocks)
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("round %d: MatchAmong(%v) (-want +got):\n%s", round, eps, diff)
		}
		gotFill, gotTails := make([]float64, len(eps)), make([]int64, len(eps))
		x.FillAmong(gotFill, gotTails, eps)
		if diff := cmp.Diff(wantFill, gotFill); diff != "" {
			t.Fatalf("round %d: FillAmong fill (-want +got):\n%s", round, diff)
		}
		if diff := cmp.Diff(wantTails, gotTails); diff != "" {
			t.Fatalf("round %d: FillAmong tails (-want +got):\n%s", round, diff)
		}
	}
}

// TestIndex_MatchAmongHighIDs is the case that MatchAmong is for: endpoint IDs are never
// reused, so after discovery churn a fleet of three can have IDs in the millions. The answer
// is by position and nothing is allocated, however high the IDs and however many candidates.
func TestIndex_MatchAmongHighIDs(t *testing.T) {
	x := NewIndex(IndexConfig{DefaultCapacity: 100})
	a := chain(1, 2, 3, 4)
	x.Insert(3_000_007, a, 1)
	x.Insert(3_000_001, a[:2], 2)
	x.Insert(5, a[:1], 3)
	eps := []int{3_000_001, 9_999_999, 3_000_007, 5}
	runs := make([]int32, len(eps))
	x.MatchAmong(runs, eps, a)
	if diff := cmp.Diff([]int32{2, 0, 4, 1}, runs); diff != "" {
		t.Errorf("runs (-want +got):\n%s", diff)
	}
	for _, n := range []int{1, 8, 32, 64, 200} {
		// In the pool's order (consecutive IDs: no table) and reversed (a table).
		up, down := make([]int, n), make([]int, n)
		for i := range up {
			up[i], down[n-1-i] = 3_000_000+i, 3_000_000+i
		}
		for _, eps := range [][]int{up, down} {
			runs := make([]int32, n)
			if allocs := testing.AllocsPerRun(100, func() { x.MatchAmong(runs, eps, a) }); allocs != 0 {
				t.Errorf("MatchAmong among %d: %v allocations, want none", n, allocs)
			}
			for i, ep := range eps {
				want := map[int]int32{3_000_001: 2, 3_000_007: 4}[ep]
				if runs[i] != want {
					t.Errorf("MatchAmong among %d: runs[%d] (ID %d) = %d, want %d", n, i, ep, runs[i], want)
				}
			}
		}
	}
}

// BenchmarkIndex_MatchAmong is BenchmarkIndex_Match by candidate position: what a pick pays
// for asking by position (IDs 0..63: a direct table; every fourth ID: a hashed one).
func BenchmarkIndex_MatchAmong(b *testing.B) {
	x, req := benchFleet(b, 1<<20)
	for _, step := range []int{1, 4} {
		eps := make([]int, 64)
		for i := range eps {
			eps[i] = i * step
		}
		runs := make([]int32, len(eps))
		b.Run(fmt.Sprintf("blocks=2048/id-step=%d", step), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				x.MatchAmong(runs, eps, req)
			}
			if runs[5/step] != map[int]int32{1: 2048, 4: 32}[step] || runs[60/step] != 32 {
				b.Fatalf("runs = %v", runs)
			}
		})
	}
}
