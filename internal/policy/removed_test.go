package policy

import (
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/endpoint"
)

// TestPrefixAware_RemovedEndpoint: an endpoint removed with requests in flight is forgotten
// for good: their ends, and a request sent there after it left, put nothing back in the
// index (they re-inserted their blocks there, for ever: nothing removes an endpoint twice),
// and a request's end on an endpoint that a peer's Removed reset is not taken off its new
// queue (its pending work went negative).
func TestPrefixAware_RemovedEndpoint(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	pk, err := New("prefix-aware", nil, Env{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	pa := pk.(*prefixAware)
	pool := endpoint.NewPool()
	specs := func(names ...string) []endpoint.Spec {
		s := make([]endpoint.Spec, len(names))
		for i, n := range names {
			s[i] = endpoint.Spec{Name: n, KVCapacityTokens: 1 << 20}
		}
		return s
	}
	if _, err := pool.Update(specs("a", "b")); err != nil {
		t.Fatal(err)
	}
	a, b := pool.ByName("a"), pool.ByName("b")
	r1, r2, r3 := req("1", 5, seq(100, 8)...), req("2", 5, seq(100, 8)...), req("3", 5, seq(300, 8)...)
	pa.Routed(r1, a)
	pa.Routed(r3, b)
	pa.FirstToken(r1, a, time.Millisecond)
	pa.Routed(r2, a)
	entries, _ := pa.IndexSize()
	if entries != 16 || pa.PredictCached(r1, a) != 128 {
		t.Fatalf("index holds %d entries, a holds %d tokens of r1; want 16 and 128", entries, pa.PredictCached(r1, a))
	}
	d, err := pool.Update(specs("b"))
	if err != nil || len(d.Removed) != 1 || d.Removed[0] != a {
		t.Fatalf("update: %+v, %v", d, err)
	}
	pa.Removed(a)
	pa.Done(r1, a, Result{OK: true, CachedTokens: 0, PromptTokens: r1.PromptTokens})
	pa.FirstToken(r2, a, time.Millisecond)
	pa.Done(r2, a, Result{OK: false, CachedTokens: -1})
	late := req("4", 5, seq(100, 8)...)
	pa.Routed(late, a) // picked before a left, sent after
	pa.SetCacheBlind(a, true)
	pa.Done(late, a, Result{OK: true, CachedTokens: -1, PromptTokens: late.PromptTokens})
	if entries, _ := pa.IndexSize(); entries != 8 || pa.PredictCached(r1, a) != 0 {
		t.Errorf("after a left, index holds %d entries and a %d tokens of r1; want b's 8 and 0", entries, pa.PredictCached(r1, a))
	}
	// A peer replica saw b leave (its Removed) while it is still here, with r3 in flight: b
	// starts afresh, and r3's end is not taken off its new queue.
	pa.Removed(b)
	if _, err := pa.Pick(r1, []*endpoint.Endpoint{b}); err != nil {
		t.Fatal(err)
	}
	pa.FirstToken(r3, b, time.Millisecond)
	pa.Done(r3, b, Result{OK: true, CachedTokens: -1, PromptTokens: r3.PromptTokens})
	if s := pa.state(b.ID); s.pending.Load() != 0 || s.waiting.Load() != 0 {
		t.Errorf("b's new state has %d work of %d requests pending, want none", s.pending.Load(), s.waiting.Load())
	}
}
