package policy

import (
	"testing"
	"time"
)

func TestTTFTEvidence(t *testing.T) {
	for _, tc := range []struct {
		name             string
		ttft, warm, cold float64
		want             int
	}{
		{"at the warm prediction", 0.05, 0.05, 0.4, 1},
		{"faster than warm", 0.03, 0.05, 0.4, 1},
		{"at the cold prediction", 0.4, 0.05, 0.4, -1},
		{"slower than cold", 0.9, 0.05, 0.4, -1},
		{"nearer cold on the log scale", 0.25, 0.05, 0.4, -1},
		{"halfway on the log scale: ambiguous", 0.1414, 0.05, 0.4, 0},
		{"predictions within 1.5x: ambiguous", 0.05, 0.05, 0.07, 0},
		{"no TTFT", 0, 0.05, 0.4, 0},
	} {
		if got := ttftEvidence(tc.ttft, tc.warm, tc.cold); got != tc.want {
			t.Errorf("%s: ttftEvidence(%g, %g, %g) = %d, want %d", tc.name, tc.ttft, tc.warm, tc.cold, got, tc.want)
		}
	}
}

// slotEngine is an engine that keeps the prompts of its last n distinct groups and says
// neither its capacity nor its hits; each group's prompt is the same 20 blocks.
type slotEngine struct {
	n      int
	recent []uint64 // groups, most recent first
}

func (e *slotEngine) serve(g uint64) (hit bool) {
	for i, r := range e.recent {
		if r == g {
			hit = i < e.n
			e.recent = append(e.recent[:i], e.recent[i+1:]...)
			break
		}
	}
	e.recent = append([]uint64{g}, e.recent...)
	return hit
}

// An endpoint of unknown capacity that keeps 3 prompts of 20 blocks: the policy learns 60 to
// 80 blocks from the TTFTs (warm about 22 ms, cold 52 ms at the prior speed), and sizes its
// index by it, so that it stops predicting what the engine has evicted.
func TestPrefixAware_LearnsCapacityFromTTFT(t *testing.T) {
	pa, clk := newPA(t, nil)
	eps := newEndpoints(1, 0)
	eng := &slotEngine{n: 3}
	groups := []uint64{0, 1, 2, 0, 1, 3, 4, 5, 0, 2, 6, 1, 1, 7, 3}
	for i := range 300 {
		g := groups[i%len(groups)] + 10*uint64(i/150) // new groups half way
		r := req("r", 0, seq(1000*g, 20)...)
		route(t, pa, r, eps)
		ttft := 52 * time.Millisecond
		if eng.serve(g) {
			ttft = 22 * time.Millisecond
		}
		finish(pa, r, eps[0], ttft, -1)
		clk.t = clk.t.Add(time.Second)
	}
	got := pa.LearnedKVTokens(0)
	if got < 60*16 || got > 80*16 {
		t.Errorf("learned %d tokens, want 960..1280 (3 prompts of 320 keep, 4 do not)", got)
	}
	if c := pa.index.Capacity(0); c > 90 {
		t.Errorf("index holds %d blocks, want it sized by the learned capacity (at most 90)", c)
	}
	// The engine's reports turn out wrong wholesale (the audit makes it blind): what was learned
	// from them goes, the index returns to the fallback, and nothing is learned while blind.
	pa.SetCacheBlind(eps[0], true)
	if got, c := pa.LearnedKVTokens(0), pa.index.Capacity(0); got != 0 || c != 65536 {
		t.Errorf("after turning blind: learned %d tokens, index %d blocks; want 0 and the fallback 65536", got, c)
	}
	for i := range 30 {
		r := req("r", 0, seq(1000*uint64(i%5), 20)...)
		route(t, pa, r, eps)
		finish(pa, r, eps[0], 52*time.Millisecond, -1)
		clk.t = clk.t.Add(time.Second)
	}
	if got := pa.LearnedKVTokens(0); got != 0 {
		t.Errorf("learned %d tokens while blind, want none", got)
	}
}

// Evidence that cannot tell a hit from a miss teaches nothing: prompts so short that the warm
// and cold predictions are within 1.5x of each other (the 20 ms overhead dominates), and
// requests that shared the engine with another one.
func TestPrefixAware_AmbiguousTTFTIgnored(t *testing.T) {
	pa, clk := newPA(t, nil)
	eps := newEndpoints(1, 0)
	for i := range 100 {
		r := req("r", 0, seq(1000*uint64(i%5), 2)...)
		route(t, pa, r, eps)
		finish(pa, r, eps[0], time.Duration(10+i%7*20)*time.Millisecond, -1)
		clk.t = clk.t.Add(time.Second)
	}
	// Misses by their TTFT, but each arrives while another waits on the endpoint.
	for i := range 100 {
		a := req("a", 0, seq(1000*uint64(i%5), 20)...)
		b := req("b", 0, seq(1000*uint64(i%5+1), 20)...)
		route(t, pa, a, eps)
		route(t, pa, b, eps)
		finish(pa, a, eps[0], 200*time.Millisecond, -1)
		finish(pa, b, eps[0], 400*time.Millisecond, -1)
		clk.t = clk.t.Add(time.Second)
	}
	if got := pa.LearnedKVTokens(0); got != 0 {
		t.Errorf("learned %d tokens from ambiguous evidence, want none", got)
	}
	if c := pa.index.Capacity(0); c != 65536 {
		t.Errorf("index holds %d blocks, want the fallback 65536", c)
	}
}
