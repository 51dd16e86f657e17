package tenant

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/openai"
)

// waitForBodyWaiters waits until n of id's bodies wait for a place.
func waitForBodyWaiters(t *testing.T, id *Identity, n int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		id.state.mu.Lock()
		got := len(id.state.bodyWaiters)
		id.state.mu.Unlock()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d bodies waiting, want %d", got, n)
		}
	}
}

// A reload that raises a tenant's max_concurrent, or lifts it, or a replica count that raises
// its share, lets the request bodies waiting for a place in at once, and a newcomer after
// them: before, the waiters and the newcomer were refused after bodyWait (1 s) with 16 places
// free.
func TestReloadLetsWaitingBodiesIn(t *testing.T) {
	key := HashKey("sk-tight")
	tenants := func(limits string) string {
		return `tenants:
  - {name: tight, api_keys: ["` + key + `"], limits: ` + limits + `}
`
	}
	for _, tc := range []struct {
		name string
		// limits and replicas are the tenant's limits and the replica count before the change:
		// a bound of minBodies on bodies either way.
		limits   string
		replicas int
		change   func(t *testing.T, g *Gate)
	}{
		{"raised", "{max_concurrent: 1}", 1, func(t *testing.T, g *Gate) {
			if err := g.Reload(testConfig(t, tenants("{max_concurrent: 10}"))); err != nil {
				t.Fatal(err)
			}
		}},
		{"lifted", "{max_concurrent: 1}", 1, func(t *testing.T, g *Gate) {
			if err := g.Reload(testConfig(t, tenants("{}"))); err != nil {
				t.Fatal(err)
			}
		}},
		// max_concurrent 4 shared among 4 replicas is 1 each; one replica left has all 4
		// (a bound of 8).
		{"replicas", "{max_concurrent: 4}", 4, func(t *testing.T, g *Gate) { g.SetReplicas(1) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g, _ := newTestGate(t, tenants(tc.limits), nil)
			g.SetReplicas(tc.replicas)
			id, oe := g.Authenticate(http.Header{"Authorization": {"Bearer sk-tight"}})
			if oe != nil {
				t.Fatal(oe)
			}
			ctx := context.Background()
			for range minBodies {
				if oe := g.TakeBody(ctx, id, 0, http.Header{}); oe != nil {
					t.Fatal(oe)
				}
			}
			got := make(chan *openai.Error, 2)
			for range 2 {
				go func() { got <- g.TakeBody(ctx, id, 0, http.Header{}) }()
			}
			waitForBodyWaiters(t, id, 2)
			start := time.Now()
			tc.change(t, g)
			for range 2 {
				select {
				case oe := <-got:
					if oe != nil {
						t.Errorf("a waiting body refused with places free: %v", oe)
					}
				case <-time.After(bodyWait / 2):
					t.Fatalf("a waiting body still waits %v after the change (bodyWait %v)", time.Since(start), bodyWait)
				}
			}
			if oe := g.TakeBody(ctx, id, 0, http.Header{}); oe != nil {
				t.Errorf("a newcomer after the change: %v", oe)
			}
			if d := time.Since(start); d >= bodyWait/2 {
				t.Errorf("the waiters and the newcomer took %v", d)
			}
		})
	}
}

// A body refused at the end of its wait names the bound in force then, not the one it found
// when it came: a reload lowering max_concurrent from 10 to 1 while it waited made its
// refusal say "at most 20 at a time" where 4 were allowed.
func TestBodyRefusalNamesBoundInForce(t *testing.T) {
	key := HashKey("sk-tight")
	tenants := func(limits string) string {
		return `tenants:
  - {name: tight, api_keys: ["` + key + `"], limits: ` + limits + `}
`
	}
	g, _ := newTestGate(t, tenants("{max_concurrent: 10}"), nil)
	id, oe := g.Authenticate(http.Header{"Authorization": {"Bearer sk-tight"}})
	if oe != nil {
		t.Fatal(oe)
	}
	ctx := context.Background()
	for range 20 { // the bound: twice max_concurrent
		if oe := g.TakeBody(ctx, id, 0, http.Header{}); oe != nil {
			t.Fatal(oe)
		}
	}
	got := make(chan *openai.Error, 1)
	go func() { got <- g.TakeBody(ctx, id, 0, http.Header{}) }()
	waitForBodyWaiters(t, id, 1)
	if err := g.Reload(testConfig(t, tenants("{max_concurrent: 1}"))); err != nil {
		t.Fatal(err)
	}
	var refused *openai.Error
	select {
	case refused = <-got:
	case <-time.After(5 * bodyWait):
		t.Fatalf("the waiting body still waits %v after its wait (%v)", 5*bodyWait, bodyWait)
	}
	if refused == nil {
		t.Fatal("a body admitted with 20 bodies being received against a bound of 4")
	}
	if want := "at most 4 at a time (twice limits.max_concurrent)"; !strings.Contains(refused.Message, want) {
		t.Errorf("refusal %q, want it to say %q", refused.Message, want)
	}
}
