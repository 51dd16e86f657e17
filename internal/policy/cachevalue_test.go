package policy

import (
	"math"
	"testing"
	"time"
)

// TestPrefixAware_CacheValue: an endpoint's cache value is the blocks only it holds, decaying
// with the time since a request used them; blocks another endpoint holds too are worth
// nothing, since losing the endpoint does not lose them.
func TestPrefixAware_CacheValue(t *testing.T) {
	pa, clk := newPA(t, nil)
	eps := newEndpoints(3, 1<<20)
	route := func(ep int, r *Request) {
		pa.Routed(r, eps[ep])
		pa.FirstToken(r, eps[ep], 50*time.Millisecond)
		pa.Done(r, eps[ep], Result{OK: true, CachedTokens: -1, PromptTokens: r.PromptTokens})
	}
	system := seq(1, 8)
	route(0, req("a", 0, append(system, seq(100, 10)...)...)) // 10 blocks of its own on 0
	route(1, req("b", 0, append(system, seq(200, 4)...)...))  // 4 on 1; the system prompt on both
	route(2, req("c", 0, system...))                          // nothing of its own on 2

	want := []float64{10, 4, 0}
	for i, e := range eps {
		if got := pa.CacheValue(e); math.Abs(got-want[i]) > 1e-6 {
			t.Errorf("endpoint %d: cache value %g, want %g", i, got, want[i])
		}
	}
	// Five minutes later, unused: each block counts 1/e.
	clk.t = clk.t.Add(CacheValueWindow)
	if got, want := pa.CacheValue(eps[0]), 10/math.E; math.Abs(got-want) > 1e-6 {
		t.Errorf("a window later: %g, want %g", got, want)
	}
	// The conversation on 0 goes on: its blocks are new again, and its new turn adds 2.
	route(0, req("a2", 0, append(append(system, seq(100, 10)...), 300, 301)...))
	if got := pa.CacheValue(eps[0]); math.Abs(got-12) > 1e-6 {
		t.Errorf("after the next turn: %g, want 12", got)
	}
	// Endpoint 1's conversation moves to 2: 1 holds nothing alone any more.
	route(2, req("b2", 0, append(system, seq(200, 4)...)...))
	if got := pa.CacheValue(eps[1]); got != 0 {
		t.Errorf("endpoint 1 after 2 took its conversation: %g, want 0", got)
	}
	pa.Removed(eps[0])
	if got := pa.CacheValue(eps[0]); got != 0 {
		t.Errorf("removed endpoint: %g, want 0", got)
	}
}

// TestCacheValuer: prefix-aware is the policy that can tell what a cache is worth; the
// baselines that keep no index cannot.
func TestCacheValuer(t *testing.T) {
	for _, name := range Names() {
		p, err := New(name, nil, Env{Clock: WallClock{}})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		_, ok := p.(CacheValuer)
		if want := name == "prefix-aware"; ok != want {
			t.Errorf("%s implements CacheValuer: %v, want %v", name, ok, want)
		}
	}
}
