package proxy

import (
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/internal/endpoint"
)

// selfFixture is a router (instance id) whose endpoints are urls and, where self is set, its
// own address, ranked first.
func selfFixture(t *testing.T, id string, self bool, urls ...string) *fixture {
	t.Helper()
	f := newFixture(t)
	f.h.Instance = id
	var specs []endpoint.Spec
	if self {
		specs = append(specs, spec(f.srv.URL, "m"))
	}
	for _, u := range urls {
		specs = append(specs, spec(u, "m"))
	}
	if _, err := f.pool.Update(specs); err != nil {
		t.Fatal(err)
	}
	for _, s := range specs {
		f.pk.order = append(f.pk.order, s.Name)
	}
	return f
}

// A router whose only endpoint is itself (its discovery lists its own address) sends a request
// to itself once, and that hop answers 508 routing_loop without sending it on: one nested
// request, not thousands. Every answer names the router's instance.
func TestRoutingLoop(t *testing.T) {
	f := selfFixture(t, "r1", true)
	resp, body := f.post(t, "/v1/chat/completions", chatBody)
	f.wait(t) // the outer request: the inner one (the hop) finished first
	select {
	case <-f.done:
		t.Fatal("the router handled a third request: the loop went on")
	default:
	}
	if resp.StatusCode != http.StatusLoopDetected || errorCode(body) != "routing_loop" ||
		!strings.Contains(string(body), "discovery lists its own address") {
		t.Errorf("client got %d %s, want 508 routing_loop saying the discovery lists the router's own address", resp.StatusCode, body)
	}
	if got := resp.Header.Get(InstanceHeader); got != "r1" {
		t.Errorf("%s = %q, want r1", InstanceHeader, got)
	}
	if got := testutil.ToFloat64(f.h.Metrics.Requests.WithLabelValues("m", f.srv.URL, "508")); got != 1 {
		t.Errorf("requests_total{endpoint=self,status=508} = %v, want 1 (the outer request, answered by the hop)", got)
	}

	// Every answer carries the instance, a path the router does not serve included.
	resp, _ = f.post(t, "/api/tags", "")
	if resp.StatusCode != http.StatusNotFound || resp.Header.Get(InstanceHeader) != "r1" {
		t.Errorf("GET /api/tags: %d, %s %q; want 404 naming r1", resp.StatusCode, InstanceHeader, resp.Header.Get(InstanceHeader))
	}
}

// A router whose discovery lists itself beside an engine: a request that goes to itself first
// comes back answered 508, nothing computed, and goes on to the engine.
func TestRoutingLoopFailsOver(t *testing.T) {
	e := newFakeEngine(t)
	f := selfFixture(t, "r1", true, e.srv.URL)
	resp, body := f.post(t, "/v1/chat/completions", chatBody)
	f.wait(t)
	if resp.StatusCode != http.StatusOK || len(e.received()) != 1 {
		t.Fatalf("status %d %s, engine got %d requests; want the engine's 200", resp.StatusCode, body, len(e.received()))
	}
	if got := testutil.ToFloat64(f.h.Metrics.Retries.WithLabelValues(f.srv.URL, "unavailable")); got != 1 {
		t.Errorf("retries{endpoint=self,unavailable} = %v, want 1", got)
	}
}

// Two tiers of routers (one in front of routers) work: each adds its id to what the engines
// get, and the client sees the front router's.
func TestRouterTiers(t *testing.T) {
	var mu sync.Mutex
	var via []string
	e := newFakeEngine(t)
	inner := e.srv.Config.Handler
	e.srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		via = append(via, r.Header.Get(ViaHeader))
		mu.Unlock()
		inner.ServeHTTP(w, r)
	})
	back := selfFixture(t, "back", false, e.srv.URL)
	front := selfFixture(t, "front", false, back.srv.URL)
	resp, body := front.post(t, "/v1/chat/completions", chatBody)
	back.wait(t)
	if resp.StatusCode != http.StatusOK || resp.Header.Get(InstanceHeader) != "front" {
		t.Fatalf("status %d %s, %s %q; want 200 from the front router", resp.StatusCode, body, InstanceHeader, resp.Header.Get(InstanceHeader))
	}
	mu.Lock()
	defer mu.Unlock()
	if len(via) != 1 || via[0] != "front,back" {
		t.Errorf("the engine got %s %q, want \"front,back\"", ViaHeader, via)
	}

	// A request that has passed maxHops routers is taken for a loop.
	hops := strings.Repeat("x,", maxHops-1) + "x"
	resp, body = back.post(t, "/v1/chat/completions", chatBody, ViaHeader, hops)
	if resp.StatusCode != http.StatusLoopDetected || errorCode(body) != "routing_loop" {
		t.Errorf("after %d routers: %d %s, want 508 routing_loop", maxHops, resp.StatusCode, body)
	}
}

// A client's long Via header (it may write one of any length the server lets in) is read only
// as far as the hop limit: 250,000 ids cost what maxHops do (before, a slice of them all: 4 MB).
func TestViaHeaderReadToTheLimit(t *testing.T) {
	h := &Handler{Instance: "r1"}
	h.instanceHeader = []string{"r1"}
	long := http.Header{ViaHeader: {strings.Repeat("ab,", 250000)}}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	if _, err := h.hops(long); err == nil {
		t.Fatal("250,000 hops: no routing loop said")
	}
	runtime.ReadMemStats(&after)
	if b := after.TotalAlloc - before.TotalAlloc; b > 64<<10 {
		t.Errorf("%d bytes allocated to read a long %s header; want it read only to the hop limit", b, ViaHeader)
	}
}
