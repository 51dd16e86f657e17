package tenant

import (
	"math"
	"net/http"
	"strconv"
	"testing"
	"time"
)

// A bucket's debt is at most maxDebtMinutes of its refill, and the wait it reports at most
// maxWait, whatever it is charged: a charge of 9e18 units, settled, made the wait overflow
// time.Duration (a 429 saying "retry in -2562047h47m16.853s", for good).
func TestBucketDebtBounded(t *testing.T) {
	t0 := time.Unix(1000, 0)
	b := newBucket(60, t0) // one a second
	b.adjust(t0, -9e18)
	if want := -maxDebtMinutes * 60.0; b.tokens != want {
		t.Errorf("after a charge of 9e18: %v units, want %v (maxDebtMinutes of refill)", b.tokens, want)
	}
	ok, wait := b.take(t0, 60)
	if ok || wait != maxWait {
		t.Errorf("take(60) in the deepest debt = %v, %v; want false, %v", ok, wait, maxWait)
	}
	if _, wait := b.take(t0, math.NaN()); wait < 0 || wait > maxWait {
		t.Errorf("take(NaN) says wait %v", wait)
	}
	b.adjust(t0, math.NaN()) // nothing
	if _, reset := b.remaining(t0); reset != maxWait {
		t.Errorf("reset after a NaN adjust: %v, want %v", reset, maxWait)
	}
	if ok, _ := b.take(t0.Add(maxWait), 60); !ok {
		t.Errorf("after %v the bucket is not full again", maxWait)
	}
}

// A tenant whose answer's usage says 9e18 completion tokens (an engine's miscount) owes at
// most maxDebtMinutes of its limit: its next request is refused with a positive wait of at
// most an hour and a minute, and admitted once that has passed. Its expected completion is at
// most its limit, so that a request without max_tokens reserves no more than the limit it
// would anyway. Before, the settlement computed in ints wrapped (t.est-prompt-completion),
// the wait overflowed, and every later request without max_tokens reserved the whole limit.
func TestEndAbsurdUsage(t *testing.T) {
	g, clk := newTestGate(t, "tenants: [{name: a, api_keys: [\""+HashKey("k")+"\"], limits: {tokens_per_minute: 10000}}]\n", nil)
	id, oe := g.Authenticate(http.Header{"Authorization": {"Bearer k"}})
	if oe != nil {
		t.Fatal(oe)
	}
	tk, oe := g.Take(id, Demand{Prompt: 5, Seqs: 1}, http.Header{})
	if oe != nil {
		t.Fatal(oe)
	}
	tk.Learn(9e18)
	tk.End(http.StatusOK, 5, 9_000_000_000_000_000_000)

	s := id.state
	s.mu.Lock()
	expected, tokens := s.expected, s.tok.tokens
	s.mu.Unlock()
	if expected != 10000 {
		t.Errorf("expected completion after an answer of 9e18: %v, want 10000 (the limit)", expected)
	}
	if want := -maxDebtMinutes * 10000.0; tokens != want {
		t.Errorf("the bucket after the settlement: %v, want %v", tokens, want)
	}
	h := http.Header{}
	if _, oe := g.Take(id, Demand{Prompt: 5, Seqs: 1, MaxTokens: 10}, h); oe == nil {
		t.Fatal("admitted in a debt of an hour's tokens")
	}
	ms, err := strconv.ParseInt(h.Get("retry-after-ms"), 10, 64)
	if err != nil || ms <= 0 || time.Duration(ms)*time.Millisecond > maxWait {
		t.Errorf("retry-after-ms %q, want 1 to %d", h.Get("retry-after-ms"), maxWait.Milliseconds())
	}
	if reset, err := time.ParseDuration(h.Get("x-ratelimit-reset-tokens")); err != nil || reset <= 0 || reset > maxWait {
		t.Errorf("x-ratelimit-reset-tokens %q, want within (0, %v]", h.Get("x-ratelimit-reset-tokens"), maxWait)
	}
	clk.Add(time.Duration(ms) * time.Millisecond)
	tk, oe = g.Take(id, Demand{Prompt: 5, Seqs: 1, MaxTokens: 10}, http.Header{})
	if oe != nil {
		t.Fatalf("after the Retry-After it was given: %v", oe)
	}
	tk.End(http.StatusOK, -3, -7) // negative counts charge nothing, refund no more than reserved
	s.mu.Lock()
	tokens = s.tok.tokens
	s.mu.Unlock()
	if tokens > s.tok.limit {
		t.Errorf("the bucket holds %v, more than its limit", tokens)
	}
}
