package prefix

import (
	"math/rand/v2"
	"testing"
)

// TestHoldsAndMatchRunsAgreeWithMatchOne checks the bisections against the block-by-block
// walk while endpoints insert, forget, drop and evict overlapping chains.
func TestHoldsAndMatchRunsAgreeWithMatchOne(t *testing.T) {
	r := rand.New(rand.NewPCG(2, 7))
	const eps = 3
	x := NewIndex(IndexConfig{DefaultCapacity: 60, MaxEntries: 150})
	var prompts [][]uint64
	for range 40 {
		keys := []uint64{uint64(r.IntN(2))}
		for j := r.IntN(40); j > 0; j-- {
			keys = append(keys, uint64(r.IntN(3)))
		}
		prompts = append(prompts, chain(keys...))
	}
	now := int64(0)
	checked := 0
	for step := range 5000 {
		ep := r.IntN(eps)
		p := prompts[r.IntN(len(prompts))]
		switch op := r.IntN(20); {
		case op < 12:
			now += int64(r.IntN(3)) // equal times: the stamps count on from the last
			x.Insert(ep, p, now)
		case op == 12:
			if n, stamps := x.MatchOne(ep, p, nil); n > 0 {
				x.Forget(ep, stamps[r.IntN(n)])
			}
		case op == 13:
			n, _ := x.MatchOne(ep, p, nil)
			x.Drop(ep, p[n:])
		default:
			want, stamps := x.MatchOne(ep, p, nil)
			if got := x.Holds(ep, p); got != want {
				t.Fatalf("step %d: Holds = %d, MatchOne %d", step, got, want)
			}
			held, runs := x.MatchRuns(ep, p, nil)
			if held != want {
				t.Fatalf("step %d: MatchRuns holds %d, MatchOne %d", step, held, want)
			}
			for i := range want {
				if s, ok := StampAt(runs, i, held); !ok || s != stamps[i] {
					t.Fatalf("step %d: block %d stamp %d (%v) from runs %v, MatchOne %d", step, i, s, ok, runs, stamps[i])
				}
			}
			if _, ok := StampAt(runs, held, held); ok {
				t.Fatalf("step %d: a stamp past the held blocks", step)
			}
			checked++
		}
	}
	if checked < 1000 {
		t.Errorf("only %d checks", checked)
	}
}

func TestMatchRunsOfOneInsertIsOneRun(t *testing.T) {
	x := NewIndex(IndexConfig{DefaultCapacity: 10000})
	keys := make([]uint64, 6250)
	for i := range keys {
		keys[i] = uint64(i)
	}
	p := chain(keys...)
	x.Insert(4, p[:3000], 100)
	x.Insert(4, p, 200)
	held, runs := x.MatchRuns(4, p, nil)
	if held != len(p) || len(runs) != 1 || runs[0].From != 0 {
		t.Errorf("MatchRuns = %d, %v; want all %d blocks in one run", held, runs, len(p))
	}
	if x.Holds(5, p) != 0 || x.Holds(4, p[:10]) != 10 {
		t.Errorf("Holds of another endpoint %d, of a prefix %d", x.Holds(5, p), x.Holds(4, p[:10]))
	}
}
