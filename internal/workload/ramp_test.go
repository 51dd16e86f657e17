package workload

import (
	"math"
	"testing"
	"time"
)

// TestRamp: a steady stream ramped from 0.5 to 1.5 times its rate keeps its order and its mean
// rate, arrives at half the rate at the start and 1.5 times it at the end.
func TestRamp(t *testing.T) {
	reqs := make([]Request, 10001)
	for i := range reqs {
		reqs[i] = Request{ID: i, Arrival: 5*time.Second + time.Duration(i)*100*time.Millisecond} // 10/s for 1000 s
	}
	out := Ramp(reqs, 0.5, 1.5)
	if reqs[1].Arrival != 5*time.Second+100*time.Millisecond {
		t.Fatal("Ramp changed its input")
	}
	for i := range out {
		if out[i].ID != i || (i > 0 && out[i].Arrival < out[i-1].Arrival) {
			t.Fatalf("request %d: id %d at %v after %v: order lost", i, out[i].ID, out[i].Arrival, out[i-1].Arrival)
		}
	}
	if out[0].Arrival != 5*time.Second || out[len(out)-1].Arrival != 5*time.Second+1000*time.Second {
		t.Errorf("span %v..%v, want 5s..1005s (mean rate kept: 2 / (0.5 + 1.5) = 1)", out[0].Arrival, out[len(out)-1].Arrival)
	}
	rate := func(from, to int) float64 { // requests per second between two indexes
		return float64(to-from) / (out[to].Arrival - out[from].Arrival).Seconds()
	}
	for _, c := range []struct {
		from, to int
		want     float64
	}{{0, 100, 5}, {len(out) - 101, len(out) - 1, 15}} {
		if got := rate(c.from, c.to); math.Abs(got-c.want) > 0.1 {
			t.Errorf("rate between requests %d and %d: %.2f/s, want %.1f/s", c.from, c.to, got, c.want)
		}
	}
	// Halfway through the new span the rate is the mean: 10/s.
	mid := 0
	for out[mid].Arrival < 5*time.Second+500*time.Second {
		mid++
	}
	if got := rate(mid-50, mid+50); math.Abs(got-10) > 0.1 {
		t.Errorf("rate at mid-span: %.2f/s, want 10/s", got)
	}
	// Falling ramps work too; nonsense changes nothing.
	down := Ramp(reqs, 2, 1)
	if got := down[len(down)-1].Arrival - down[0].Arrival; math.Abs(got.Seconds()-1000/1.5) > 1e-6 {
		t.Errorf("falling ramp: span %v, want %gs", got, 1000/1.5)
	}
	for _, ft := range [][2]float64{{0, 1}, {1, math.Inf(1)}, {1, 1}, {math.NaN(), 1}} {
		same := Ramp(reqs, ft[0], ft[1])
		if same[77].Arrival != reqs[77].Arrival {
			t.Errorf("Ramp(%v, %v) changed arrivals", ft[0], ft[1])
		}
	}
}
