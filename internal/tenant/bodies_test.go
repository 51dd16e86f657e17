package tenant

import (
	"net/http"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/internal/metrics"
)

func TestBodyLimit(t *testing.T) {
	for _, tc := range []struct {
		maxConc, conns, want int
	}{
		{0, 0, 0},       // nothing known: no bound
		{2, 0, 4},       // twice max_concurrent, at least 4
		{1, 0, 4},       // at least 4
		{10, 0, 20},     // twice max_concurrent
		{0, 300, 75},    // a quarter of the connections
		{3000, 300, 75}, // the lower of the two
		{2, 300, 4},
		{0, 8, 4}, // at least 4
	} {
		if got, _ := bodyLimit(tc.maxConc, tc.conns); got != tc.want {
			t.Errorf("bodyLimit(%d, %d) = %d, want %d", tc.maxConc, tc.conns, got, tc.want)
		}
	}
}

// TestTakeBody: a tenant holds at most bodyLimit bodies being received; the next is refused 429
// concurrency_limit_exceeded with Retry-After, counted under ReasonBodies, until one is done.
// Another tenant is not held back, nor one without a bound.
func TestTakeBody(t *testing.T) {
	g, _ := newTestGate(t, `tenants:
  - {name: tight, api_keys: ["`+HashKey("sk-tight")+`"], limits: {max_concurrent: 2}}
  - {name: open, api_keys: ["`+HashKey("sk-open")+`"]}
`, nil)
	reg := prometheus.NewRegistry()
	g.m = metrics.NewTenantMetrics(reg)
	g.m.SetTenants([]string{"tight", "open"})
	id := func(key string) *Identity {
		id, oe := g.Authenticate(http.Header{"Authorization": {"Bearer " + key}})
		if oe != nil {
			t.Fatal(oe)
		}
		return id
	}
	tight, open := id("sk-tight"), id("sk-open")
	for i := range 4 {
		if oe := g.TakeBody(tight, 0, http.Header{}); oe != nil {
			t.Fatalf("body %d: %v; want it taken (4 for max_concurrent 2)", i+1, oe)
		}
	}
	h := http.Header{}
	oe := g.TakeBody(tight, 0, h)
	if oe == nil || oe.Status != http.StatusTooManyRequests || *oe.Code != "concurrency_limit_exceeded" || h.Get("Retry-After") != "1" {
		t.Fatalf("the 5th body: %v, Retry-After %q; want 429 concurrency_limit_exceeded, Retry-After 1", oe, h.Get("Retry-After"))
	}
	if n := testutil.ToFloat64(g.m.Rejections.WithLabelValues("tight", ReasonBodies)); n != 1 {
		t.Errorf("%v rejections counted under %s, want 1", n, ReasonBodies)
	}
	for i := range 100 {
		if oe := g.TakeBody(open, 0, http.Header{}); oe != nil {
			t.Fatalf("open's body %d: %v; want no bound without max_concurrent nor a connection cap", i+1, oe)
		}
	}
	if oe := g.TakeBody(open, 400, http.Header{}); oe == nil {
		t.Errorf("open's 101st body under a cap of 400 connections was taken; want it refused (a quarter: 100)")
	}
	g.BodyDone(tight)
	if oe := g.TakeBody(tight, 0, http.Header{}); oe != nil {
		t.Errorf("a body after one was done: %v; want it taken", oe)
	}
	if g.TakeBody(nil, 0, http.Header{}) != nil {
		t.Error("no tenant (authentication off): refused; want nothing taken")
	}
	g.BodyDone(nil)
}
