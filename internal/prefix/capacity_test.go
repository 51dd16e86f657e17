package prefix

import (
	"math/rand/v2"
	"testing"
)

func TestIndex_Depth(t *testing.T) {
	x := NewIndex(IndexConfig{DefaultCapacity: 100})
	a := chain(1, 2, 3)
	b := chain(7, 8)
	x.Insert(0, a, 10) // stamps 12 (block 0), 11, 10 (block 2)
	x.Insert(0, b, 20) // stamps 21, 20
	x.Insert(1, b, 30)
	_, runs := x.MatchRuns(0, a, nil)
	last, ok := StampAt(runs, 2, 3)
	if !ok {
		t.Fatal("no stamp for a's last block")
	}
	// Holding a's last block takes the whole of a and b: 5 entries.
	if got := x.Depth(0, last, 100); got != 5 {
		t.Errorf("Depth(a's last block) = %d, want 5", got)
	}
	if got := x.Depth(0, last, 3); got != 3 {
		t.Errorf("Depth with limit 3 = %d, want 3", got)
	}
	_, runs = x.MatchRuns(0, b, nil)
	last, _ = StampAt(runs, 1, 2)
	if got := x.Depth(0, last, 100); got != 2 {
		t.Errorf("Depth(b's last block) = %d, want 2 (endpoint 1's entries do not count)", got)
	}
	x.Insert(0, a, 40) // a is most recent again
	_, runs = x.MatchRuns(0, b, nil)
	last, _ = StampAt(runs, 1, 2)
	if got := x.Depth(0, last, 100); got != 5 {
		t.Errorf("Depth(b's last block) after a's reuse = %d, want 5", got)
	}
	if got := x.Depth(5, 1, 100); got != 0 {
		t.Errorf("Depth of an unknown endpoint = %d, want 0", got)
	}
}

// lruOutcome is what an LRU cache of capacity c does with a prefix depth blocks deep, the
// answer flipped with probability noise (a report that lies, a TTFT misread).
func lruOutcome(r *rand.Rand, depth, c int, noise float64) bool {
	hit := depth <= c
	if r.Float64() < noise {
		hit = !hit
	}
	return hit
}

func TestCapacityEstimate_Converges(t *testing.T) {
	for _, tc := range []struct {
		name     string
		capacity int
		noise    float64
	}{
		{"clean", 400, 0},
		{"noisy", 400, 0.1},
		{"small", 30, 0.05},
		{"large", 20000, 0.05},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(1, uint64(tc.capacity)))
			var c CapacityEstimate
			for range 300 {
				d := 1 + r.IntN(3*tc.capacity)
				c.Observe(d, lruOutcome(r, d, tc.capacity, tc.noise))
			}
			got, ok := c.Estimate()
			if !ok {
				t.Fatal("no estimate after 300 observations")
			}
			if rel := float64(got)/float64(tc.capacity) - 1; rel < -0.15 || rel > 0.15 {
				t.Errorf("estimate %d for capacity %d (%+.0f%%), want within 15%%", got, tc.capacity, 100*rel)
			}
		})
	}
}

// An index sized by the estimate (with its headroom) only predicts hits shallower than that:
// the estimate must still come down from a fallback far too large, go up when the cache grows
// and down when it shrinks.
func TestCapacityEstimate_ClosedLoop(t *testing.T) {
	r := rand.New(rand.NewPCG(2, 3))
	var c CapacityEstimate
	size := 65536 // the index's fallback
	run := func(capacity, n int) {
		for range n {
			d := 1 + r.IntN(min(size, 4*capacity))
			c.Observe(d, lruOutcome(r, d, capacity, 0.05))
			if est, ok := c.Estimate(); ok {
				size = min(int(float64(est)*CapacityHeadroom), 65536)
			}
		}
	}
	for _, step := range []struct{ capacity, n int }{{500, 400}, {1000, 600}, {200, 600}} {
		run(step.capacity, step.n)
		est, _ := c.Estimate()
		if rel := float64(est)/float64(step.capacity) - 1; rel < -0.15 || rel > 0.15 {
			t.Errorf("estimate %d for a cache of %d blocks (%+.0f%%), want within 15%%", est, step.capacity, 100*rel)
		}
	}
}

func TestCapacityEstimate_ThinEvidence(t *testing.T) {
	var c CapacityEstimate
	c.Observe(100, false)
	c.Observe(0, true) // no depth: ignored
	if _, ok := c.Estimate(); ok {
		t.Error("an estimate from one observation")
	}
	var h CapacityEstimate
	for d := range 50 {
		h.Observe(10+d, true)
	}
	if got, ok := h.Estimate(); ok {
		t.Errorf("hits only, never a miss: estimate %d, want none (the fallback stands)", got)
	}
}
