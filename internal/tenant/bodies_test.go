package tenant

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/internal/metrics"
	"github.com/kvroute/kvroute/internal/openai"
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

// TestTakeBody: a tenant holds at most bodyLimit bodies being received; the next waits
// bodyWait, then is refused 429 concurrency_limit_exceeded with Retry-After, counted under
// ReasonBodies, until one is done. Another tenant is not held back, nor one without a bound.
func TestTakeBody(t *testing.T) {
	ctx := context.Background()
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
		if oe := g.TakeBody(ctx, tight, 0, http.Header{}); oe != nil {
			t.Fatalf("body %d: %v; want it taken (4 for max_concurrent 2)", i+1, oe)
		}
	}
	h := http.Header{}
	start := time.Now()
	oe := g.TakeBody(ctx, tight, 0, h)
	if waited := time.Since(start); waited < bodyWait {
		t.Errorf("the 5th body was refused after %v; want it to wait %v for a place first", waited, bodyWait)
	}
	if oe == nil || oe.Status != http.StatusTooManyRequests || *oe.Code != "concurrency_limit_exceeded" || h.Get("Retry-After") != "1" {
		t.Fatalf("the 5th body: %v, Retry-After %q; want 429 concurrency_limit_exceeded, Retry-After 1", oe, h.Get("Retry-After"))
	}
	if n := testutil.ToFloat64(g.m.Rejections.WithLabelValues("tight", ReasonBodies)); n != 1 {
		t.Errorf("%v rejections counted under %s, want 1", n, ReasonBodies)
	}
	for i := range 100 {
		if oe := g.TakeBody(ctx, open, 0, http.Header{}); oe != nil {
			t.Fatalf("open's body %d: %v; want no bound without max_concurrent nor a connection cap", i+1, oe)
		}
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if oe := g.TakeBody(short, open, 400, http.Header{}); oe == nil || oe.Status != 499 {
		t.Errorf("open's 101st body under a cap of 400 connections, its client gone while it waited: %v; want 499 client_gone (a quarter: 100)", oe)
	}
	g.BodyDone(tight)
	if oe := g.TakeBody(ctx, tight, 0, http.Header{}); oe != nil {
		t.Errorf("a body after one was done: %v; want it taken", oe)
	}
	if g.TakeBody(ctx, nil, 0, http.Header{}) != nil {
		t.Error("no tenant (authentication off): refused; want nothing taken")
	}
	g.BodyDone(nil)
}

// TestTakeBodyWaits: a body beyond its tenant's bound takes the place another body gives back
// while it waits, rather than being refused (a burst of slow bodies of one client); each place
// given back goes to one waiter.
func TestTakeBodyWaits(t *testing.T) {
	g, id := fullOfBodies(t)
	ctx := context.Background()
	got := make(chan *openai.Error, 2)
	for range 2 {
		go func() { got <- g.TakeBody(ctx, id, 0, http.Header{}) }()
	}
	time.Sleep(20 * time.Millisecond) // both waiting (or about to: either way one place is theirs)
	g.BodyDone(id)
	select {
	case oe := <-got:
		if oe != nil {
			t.Fatalf("a waiting body after a place was given back: %v; want the place taken", oe)
		}
	case <-time.After(bodyWait / 2):
		t.Fatal("no waiting body took the place given back")
	}
	if oe := <-got; oe == nil || oe.Status != http.StatusTooManyRequests {
		t.Fatalf("the second waiter, no place given back: %v; want 429 after %v", oe, bodyWait)
	}
	id.state.mu.Lock()
	n := id.state.bodies
	id.state.mu.Unlock()
	if n != minBodies {
		t.Errorf("%d bodies held, want %d", n, minBodies)
	}
}

// TestTakeBodyWaitersBounded: no more bodies wait than the tenant has places; the next is
// refused at once (each waiter holds a connection), and places given back go to the waiters in
// the order they came, not to a newcomer.
func TestTakeBodyWaitersBounded(t *testing.T) {
	g, id := fullOfBodies(t)
	ctx := context.Background()
	waiting := func() int {
		id.state.mu.Lock()
		defer id.state.mu.Unlock()
		return len(id.state.bodyWaiters)
	}
	got := make([]chan *openai.Error, minBodies)
	for i := range got {
		got[i] = make(chan *openai.Error, 1)
		go func() { got[i] <- g.TakeBody(ctx, id, 0, http.Header{}) }()
		for deadline := time.Now().Add(bodyWait / 2); waiting() != i+1; {
			if time.Now().After(deadline) {
				t.Fatalf("waiter %d not waiting: %d wait", i+1, waiting())
			}
			time.Sleep(time.Millisecond)
		}
	}
	start := time.Now()
	if oe := g.TakeBody(ctx, id, 0, http.Header{}); oe == nil || oe.Status != http.StatusTooManyRequests {
		t.Fatalf("a body beyond %d waiting: %v; want 429 at once", minBodies, oe)
	} else if d := time.Since(start); d > bodyWait/2 {
		t.Errorf("a body beyond the waiters was refused after %v; want at once", d)
	}
	for i := range got {
		g.BodyDone(id)
		select {
		case oe := <-got[i]:
			if oe != nil {
				t.Fatalf("waiter %d after a place was given back: %v", i+1, oe)
			}
		case <-time.After(bodyWait / 2):
			t.Fatalf("waiter %d (first in line) did not take the place given back", i+1)
		}
	}
	id.state.mu.Lock()
	n := id.state.bodies
	id.state.mu.Unlock()
	if n != minBodies || waiting() != 0 {
		t.Errorf("%d bodies held and %d waiting, want %d and 0", n, waiting(), minBodies)
	}
}

// fullOfBodies returns a gate whose one tenant (max_concurrent 1) holds as many bodies being
// received as it may (minBodies), and that tenant's identity.
func fullOfBodies(t *testing.T) (*Gate, *Identity) {
	t.Helper()
	g, _ := newTestGate(t, `tenants:
  - {name: tight, api_keys: ["`+HashKey("sk-tight")+`"], limits: {max_concurrent: 1}}
`, nil)
	id, oe := g.Authenticate(http.Header{"Authorization": {"Bearer sk-tight"}})
	if oe != nil {
		t.Fatal(oe)
	}
	for i := range minBodies {
		if oe := g.TakeBody(context.Background(), id, 0, http.Header{}); oe != nil {
			t.Fatalf("body %d: %v", i+1, oe)
		}
	}
	return g, id
}
