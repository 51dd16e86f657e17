package route

import (
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/policy"
)

// TestStallSpanAllowsPrefill: where the policy predicts no TTFT, a stall watch allows for the
// prompt's own prefill at the rate its endpoint has shown (MaxSlowdown times it), so that an
// engine computing one long prompt and nothing else is not given up at StallTimeout; a hung
// engine holding a short prompt still is, at StallTimeout. The QA case: a 102,869-token prompt
// given up at 10 s on an engine that needed ~11 s for it (round-robin, simulated).
func TestStallSpanAllowsPrefill(t *testing.T) {
	const stall = 10 * time.Second
	clk := &stepClock{t: time.Unix(1000, 0)}
	eps := pool(t, "a", "b", "c")
	a, b, c := eps[0], eps[1], eps[2]
	health := NewOutlier(OutlierConfig{Consecutive: 10, MaxEjectedPercent: 100}, clk)
	lc, err := New(Config{Picker: &script{order: []string{"a", "b", "c"}}, Clock: clk, Attempts: 3, StallTimeout: stall, Health: health})
	if err != nil {
		t.Fatal(err)
	}
	begin := func(lc *Lifecycle, id string, prompt int) *Call {
		t.Helper()
		call, err := lc.Begin(&policy.Request{ID: id, PromptTokens: prompt}, eps, "", clk.t)
		if err != nil {
			t.Fatal(err)
		}
		return call
	}
	// serve has ep answer a request of prompt tokens, cached of them cached (-1: not said),
	// its first token after ttft.
	serve := func(ep *endpoint.Endpoint, prompt, cached int, ttft time.Duration) {
		t.Helper()
		call := begin(lc, "teach", prompt)
		if got := call.Next(); got != a {
			t.Fatalf("first attempt on %v, want a", got)
		}
		for call.Endpoint() != ep {
			call.Fail(FailStatus)
			call.Next()
		}
		clk.t = clk.t.Add(ttft)
		call.FirstToken()
		clk.t = clk.t.Add(time.Second)
		call.Finish(Outcome{OK: true, CachedTokens: cached})
	}

	// Before a has shown its rate: 10,000 tokens a second stand in, 20 times a 100k-token
	// prompt's 10 s; a 1,000-token prompt keeps the stall timeout.
	for _, tc := range []struct {
		prompt int
		want   time.Duration
	}{{100_000, 200 * time.Second}, {1_000, stall}, {0, stall}} {
		call := begin(lc, "unknown", tc.prompt)
		call.Next()
		if got := call.Stall().After(); got != tc.want {
			t.Errorf("%d tokens, no rate known: watched for %v, want %v", tc.prompt, got, tc.want)
		}
		call.Finish(Outcome{})
	}

	// a computes 50,000 tokens of 60,000 (10,000 cached) in 10 s: 5,000 tokens a second. An
	// answer that does not say what was cached teaches nothing (b's, a 1 ms first token).
	serve(a, 60_000, 10_000, 10*time.Second)
	serve(b, 60_000, -1, time.Millisecond)
	if got := a.PrefillRate(); got != 5000 {
		t.Fatalf("a's prefill rate %v, want 5000", got)
	}
	if got := b.PrefillRate(); got != 0 {
		t.Fatalf("b's prefill rate %v after an answer that did not say what was cached, want 0", got)
	}

	// A 100k-token prompt on a, alone there: its prefill takes 20 s, with no answer from a
	// meanwhile. It is not stalled at 10 s, nor at 21 s; its first token comes at 20 s.
	call := begin(lc, "long", 100_000)
	call.Next()
	w := call.Stall()
	if w.After() < 20*time.Second {
		t.Errorf("a 20 s prefill watched for %v", w.After())
	}
	sent := clk.t
	for _, at := range []time.Duration{stall + time.Millisecond, 21 * time.Second} {
		if stalled, _ := w.Due(sent.Add(at).UnixNano()); stalled {
			t.Errorf("a 100k-token prompt on a 5,000 tokens/s engine given up as stalled after %v", at)
		}
	}
	if a.StalledSince() != 0 {
		t.Fatal("a marked stalled while it computed the prompt")
	}
	clk.t = clk.t.Add(20 * time.Second)
	call.FirstToken()
	clk.t = clk.t.Add(time.Second)
	call.Finish(Outcome{OK: true, CachedTokens: 0})

	// The same with the round-robin policy, wherever it sends the prompt (b and c as fast).
	b.LearnPrefill(5000, time.Second, clk.t.UnixNano())
	c.LearnPrefill(5000, time.Second, clk.t.UnixNano())
	rr, err := policy.New("round-robin", nil, policy.Env{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	rlc, err := New(Config{Picker: rr, Clock: clk, Attempts: 3, StallTimeout: stall, Health: health})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		call := begin(rlc, "rr", 100_000)
		ep := call.Next()
		w := call.Stall()
		if stalled, _ := w.Due(clk.t.Add(stall + time.Second).UnixNano()); stalled || w.After() < 20*time.Second {
			t.Errorf("round-robin, request %d on %s: watched for %v, stalled at 11 s: %v", i, ep.Name, w.After(), stalled)
		}
		call.Finish(Outcome{})
	}

	// a hangs: a 1,000-token prompt is given up at the stall timeout, as before.
	clk.t = clk.t.Add(time.Minute)
	call = begin(lc, "short", 1_000)
	call.Next()
	w = call.Stall()
	if w.After() != stall {
		t.Errorf("a 1,000-token prompt watched for %v, want the stall timeout %v", w.After(), stall)
	}
	if stalled, _ := w.Due(clk.t.Add(stall).UnixNano()); !stalled || a.StalledSince() == 0 {
		t.Errorf("a hung engine holding a 1,000-token prompt for %v: stalled %v, marked %v", stall, stalled, a.StalledSince() != 0)
	}
	call.Finish(Outcome{})

	// A policy's prediction, where it makes one, decides: 20 times 1 s, whatever the prompt.
	plc, err := New(Config{Picker: predicting{&script{order: []string{"b", "c"}}, time.Second}, Clock: clk, Attempts: 2, StallTimeout: stall, Health: health})
	if err != nil {
		t.Fatal(err)
	}
	call = begin(plc, "predicted", 100_000)
	call.Next()
	if got := call.Stall().After(); got != 20*time.Second {
		t.Errorf("predicted 1 s: watched for %v, want 20s", got)
	}
	call.Finish(Outcome{})
}

// TestPrefillSpan: MaxSlowdown times the prefill, bounded; nothing for no tokens.
func TestPrefillSpan(t *testing.T) {
	for _, tc := range []struct {
		tokens int
		rate   float64
		want   time.Duration
	}{
		{0, 5000, 0},
		{-5, 5000, 0},
		{100_000, 5000, 400 * time.Second},
		{100_000, 0, 200 * time.Second}, // fallbackPrefillRate
		{5_000, 0, 10 * time.Second},
		{1 << 40, 1e-9, maxPrefillSpan},
	} {
		if got := prefillSpan(tc.tokens, tc.rate); got != tc.want {
			t.Errorf("prefillSpan(%d, %v) = %v, want %v", tc.tokens, tc.rate, got, tc.want)
		}
	}
}
