package scrape

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/google/go-cmp/cmp"
	"github.com/kvroute/kvroute/internal/endpoint"
)

// fakeEngine serves /health (and /v1/models) with a settable status and /metrics from a fixture.
type fakeEngine struct {
	status  atomic.Int32
	checks  atomic.Int32
	scrapes atomic.Int32
	paths   chan string
	metrics []byte
	srv     *httptest.Server
}

func newFakeEngine(t *testing.T, fixture string) *fakeEngine {
	t.Helper()
	f := &fakeEngine{paths: make(chan string, 100)}
	f.status.Store(http.StatusOK)
	if fixture != "" {
		b, err := os.ReadFile(filepath.Join("testdata", fixture))
		if err != nil {
			t.Fatal(err)
		}
		f.metrics = b
	}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case f.paths <- r.URL.Path:
		default:
		}
		switch r.URL.Path {
		case "/metrics":
			f.scrapes.Add(1)
			_, _ = w.Write(f.metrics)
		default:
			f.checks.Add(1)
			code := int(f.status.Load())
			w.WriteHeader(code)
			if code == http.StatusServiceUnavailable {
				_, _ = w.Write([]byte(`{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}`))
			}
		}
	}))
	t.Cleanup(f.srv.Close)
	return f
}

// next returns the paths of the engine's next n requests ("" for one that did not come within
// 5 s).
func (f *fakeEngine) next(t *testing.T, n int) []string {
	t.Helper()
	out := make([]string, n)
	for i := range out {
		select {
		case out[i] = <-f.paths:
		case <-time.After(5 * time.Second):
		}
	}
	return out
}

// waitFor polls cond until it holds, failing t after 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond) // polling with a deadline
	}
}

func onePool(t testing.TB, spec endpoint.Spec) (*endpoint.Pool, *endpoint.Endpoint) {
	t.Helper()
	p := endpoint.NewPool()
	if _, err := p.Update([]endpoint.Spec{spec}); err != nil {
		t.Fatal(err)
	}
	return p, p.ByName(spec.Name)
}

func TestProber_ThresholdsStepByStep(t *testing.T) {
	eng := newFakeEngine(t, "")
	pool, ep := onePool(t, endpoint.Spec{Name: eng.srv.URL, Engine: "llamacpp", MetricsPath: "/metrics"})
	pr := New(pool, eng.srv.Client(), Options{HealthyThreshold: 2, UnhealthyThreshold: 2}, nil)
	ctx := context.Background()

	steps := []struct {
		name        string
		status      int
		wantErr     bool
		wantHealthy bool
	}{
		{"ok", 200, false, true},
		{"loading once: still healthy", 503, true, true},
		{"loading twice: unhealthy", 503, true, false},
		{"ok once: still unhealthy", 200, false, false},
		{"ok twice: healthy", 200, false, true},
		{"one failure", 500, true, true},
		{"a success resets the failure streak", 200, false, true},
		{"one failure again: still healthy", 500, true, true},
	}
	for _, s := range steps {
		eng.status.Store(int32(s.status))
		err := pr.Check(ctx, ep)
		if (err != nil) != s.wantErr {
			t.Fatalf("%s: err = %v", s.name, err)
		}
		if ep.Healthy() != s.wantHealthy || ep.Available() != s.wantHealthy {
			t.Fatalf("%s: healthy = %v, want %v", s.name, ep.Healthy(), s.wantHealthy)
		}
	}
	if got := <-eng.paths; got != "/health" {
		t.Errorf("llama.cpp health path = %q, want /health", got)
	}
	st := pr.Status(ep)
	if !strings.Contains(st.LastCheckError, "Loading model") && !strings.Contains(st.LastCheckError, "status 500") {
		t.Errorf("status = %+v, want the last error", st)
	}
	if st.ConsecutiveFailures != 1 {
		t.Errorf("consecutive failures = %d, want 1", st.ConsecutiveFailures)
	}
}

func TestProber_FirstCheckDecides(t *testing.T) {
	eng := newFakeEngine(t, "")
	pool, ep := onePool(t, endpoint.Spec{Name: eng.srv.URL, Engine: "vllm"})
	pr := New(pool, eng.srv.Client(), Options{HealthyThreshold: 3, UnhealthyThreshold: 3}, nil)
	eng.status.Store(http.StatusServiceUnavailable)
	_ = pr.Check(context.Background(), ep)
	if ep.Healthy() {
		t.Fatal("an endpoint down at its first check should leave rotation at once")
	}
	eng.status.Store(http.StatusOK)
	for i := 1; i <= 3; i++ {
		_ = pr.Check(context.Background(), ep)
		if got, want := ep.Healthy(), i == 3; got != want {
			t.Fatalf("after %d good checks: healthy = %v, want %v", i, got, want)
		}
	}
}

func TestProber_GenericHealthPathAndOverride(t *testing.T) {
	eng := newFakeEngine(t, "")
	// Models named: the health path is read, then (on first contact) the model list, to
	// compare it with the config.
	pool, ep := onePool(t, endpoint.Spec{Name: eng.srv.URL, Engine: "openai", Models: []string{"m"}})
	pr := New(pool, eng.srv.Client(), Options{}, nil)
	if err := pr.Check(context.Background(), ep); err != nil {
		t.Fatal(err)
	}
	if got := eng.next(t, 2); got[0] != "/v1/models" || got[1] != "/v1/models" {
		t.Errorf("generic health path, then the model list = %q, want /v1/models twice", got)
	}
	pool2, ep2 := onePool(t, endpoint.Spec{Name: eng.srv.URL, Engine: "vllm", HealthPath: "/ping", Models: []string{"m"}})
	pr2 := New(pool2, eng.srv.Client(), Options{}, nil)
	_ = pr2.Check(context.Background(), ep2)
	if got := eng.next(t, 2); got[0] != "/ping" || got[1] != "/v1/models" {
		t.Errorf("overridden health path, then the model list = %q, want /ping, /v1/models", got)
	}
}

func TestProber_CheckTimeoutAndRefused(t *testing.T) {
	block := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-block:
		case <-r.Context().Done():
		}
	}))
	defer slow.Close()
	defer close(block)
	pool, ep := onePool(t, endpoint.Spec{Name: slow.URL, Engine: "vllm"})
	pr := New(pool, slow.Client(), Options{HealthTimeout: 50 * time.Millisecond, UnhealthyThreshold: 1}, nil)
	if err := pr.Check(context.Background(), ep); err == nil {
		t.Fatal("a hung health check should time out")
	}
	if ep.Healthy() {
		t.Error("a timed-out check with threshold 1 should mark the endpoint unhealthy")
	}

	dead := httptest.NewServer(http.NotFoundHandler())
	url := dead.URL
	dead.Close() // nothing listens there now
	pool, ep = onePool(t, endpoint.Spec{Name: url, Engine: "vllm"})
	pr = New(pool, nil, Options{UnhealthyThreshold: 1}, nil)
	if err := pr.Check(context.Background(), ep); err == nil || ep.Healthy() {
		t.Errorf("refused connection: err = %v healthy = %v, want an error and unhealthy", err, ep.Healthy())
	}
}

func TestProber_Scrape(t *testing.T) {
	eng := newFakeEngine(t, "vllm.txt")
	pool, ep := onePool(t, endpoint.Spec{Name: eng.srv.URL, Engine: "vllm", MetricsPath: "/metrics"})
	now := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	pr := New(pool, eng.srv.Client(), Options{Now: func() time.Time { return now }}, nil)
	if err := pr.Scrape(context.Background(), ep); err != nil {
		t.Fatal(err)
	}
	s := ep.Snapshot()
	if s == nil || !s.At.Equal(now) || s.Running != 21 || ep.KVTokens() != 16*57672 {
		t.Fatalf("snapshot = %+v, want the fixture stamped %v", s, now)
	}

	// Over the size limit: an error, and the old snapshot stays.
	pr.SetOptions(Options{MaxMetricsBytes: 100, Now: func() time.Time { return now.Add(time.Second) }})
	if err := pr.Scrape(context.Background(), ep); err == nil || !strings.Contains(err.Error(), "too large") {
		t.Errorf("err = %v, want too large", err)
	}
	if ep.Snapshot() != s {
		t.Error("a failed scrape replaced the snapshot")
	}
	if st := pr.Status(ep); !strings.Contains(st.LastScrapeError, "too large") {
		t.Errorf("status = %+v, want the scrape error", st)
	}
}

func TestProber_RunFollowsPool(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	eng := newFakeEngine(t, "sglang.txt")
	eng2 := newFakeEngine(t, "tgi.txt")
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()

	pool, ep := onePool(t, endpoint.Spec{Name: eng.srv.URL, Engine: "sglang", MetricsPath: "/metrics"})
	pr := New(pool, client, Options{HealthInterval: 10 * time.Millisecond, ScrapeInterval: 10 * time.Millisecond}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- pr.Run(ctx) }()

	waitFor(t, "the first scrape", func() bool { return ep.Snapshot() != nil })
	if ep.Snapshot().Running != 37 {
		t.Errorf("running = %d, want 37", ep.Snapshot().Running)
	}
	waitFor(t, "repeated checks", func() bool { return eng.checks.Load() >= 3 })

	// Swap the endpoint: the old one stops being probed, the new one starts.
	if _, err := pool.Update([]endpoint.Spec{{Name: eng2.srv.URL, Engine: "tgi", MetricsPath: "/metrics"}}); err != nil {
		t.Fatal(err)
	}
	ep2 := pool.ByName(eng2.srv.URL)
	waitFor(t, "the new endpoint's scrape", func() bool { return ep2.Snapshot() != nil })
	waitFor(t, "the removed endpoint's state dropped", func() bool { return pr.Status(ep).LastCheck.IsZero() })
	if ep2.Snapshot().Waiting != 4 {
		t.Errorf("tgi waiting = %d, want 4", ep2.Snapshot().Waiting)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	eng.srv.Close()
	eng2.srv.Close()
	client.CloseIdleConnections()
}

// TestProber_ListsModels: an endpoint configured without models learns what its engine serves;
// it then serves those (either as listed or with ollama's ":latest"), and no other.
func TestProber_ListsModels(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/api/version":
			_, _ = io.WriteString(w, `{"version":"0.17.4"}`)
		case "/v1/models":
			_, _ = io.WriteString(w, `{"object":"list","data":[{"id":"tiny:latest","object":"model","owned_by":"library"},{"id":"big:q4","object":"model"}]}`)
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	pool, ep := onePool(t, endpoint.Spec{Name: srv.URL, Engine: "ollama"})
	pr := New(pool, srv.Client(), Options{}, nil)
	if !ep.Serves("anything") {
		t.Fatal("before the models are known the endpoint serves any model")
	}
	if err := pr.Check(context.Background(), ep); err != nil {
		t.Fatal(err)
	}
	for model, want := range map[string]bool{"tiny": true, "tiny:latest": true, "big:q4": true, "big": false, "other": false} {
		if got := ep.Serves(model); got != want {
			t.Errorf("Serves(%q) = %v, want %v", model, got, want)
		}
	}
	if diff := cmp.Diff([]string{"big:q4", "tiny:latest"}, pool.Models()); diff != "" {
		t.Errorf("pool models (-want +got):\n%s", diff)
	}
	if !pool.HasModel("tiny") || pool.HasModel("big") {
		t.Errorf("HasModel(tiny) %v, HasModel(big) %v", pool.HasModel("tiny"), pool.HasModel("big"))
	}
}

func TestUntilTick(t *testing.T) {
	const s = time.Second
	for _, c := range []struct{ elapsed, interval, want time.Duration }{
		{0, s, s}, // the first round at the epoch: the next tick
		{10 * time.Millisecond, s, 990 * time.Millisecond}, // a round that took 10 ms
		{1300 * time.Millisecond, s, 700 * time.Millisecond},
		{1600 * time.Millisecond, s, 1400 * time.Millisecond}, // 0.4 s to a tick is too close: the one after
		{3500 * time.Millisecond, s, 500 * time.Millisecond},  // exactly half an interval: that tick
		{7200 * time.Millisecond, 5 * s, 2800 * time.Millisecond},
		{2 * s, s, s}, // on a tick: the next one
	} {
		if got := untilTick(c.elapsed, c.interval); got != c.want {
			t.Errorf("untilTick(%v, %v) = %v, want %v", c.elapsed, c.interval, got, c.want)
		}
		// Every wait ends on the interval's grid.
		if end := c.elapsed + untilTick(c.elapsed, c.interval); end%c.interval != 0 {
			t.Errorf("untilTick(%v, %v) ends at %v, off the grid", c.elapsed, c.interval, end)
		}
	}
}

// TestProber_UnhealthyInterval: an endpoint whose check failed is checked every
// UnhealthyInterval, not HealthInterval: an engine still loading when the router starts is in
// rotation within about that of answering, and once it passes, it is checked at the slower
// pace again.
func TestProber_UnhealthyInterval(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	eng := newFakeEngine(t, "")
	eng.status.Store(http.StatusServiceUnavailable) // loading the model
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	pool, ep := onePool(t, endpoint.Spec{Name: eng.srv.URL, Engine: "vllm", Models: []string{"m"}})
	pr := New(pool, client, Options{HealthInterval: time.Hour, UnhealthyInterval: 20 * time.Millisecond}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- pr.Run(ctx) }()
	defer func() {
		cancel()
		<-done
		eng.srv.Close()
		client.CloseIdleConnections()
	}()
	waitFor(t, "the first check to take it out", func() bool { return !ep.Healthy() })
	waitFor(t, "checks while it is out", func() bool { return eng.checks.Load() >= 3 })
	eng.status.Store(http.StatusOK)
	back := time.Now()
	waitFor(t, "the endpoint back in rotation", ep.Healthy)
	if d := time.Since(back); d > 5*time.Second {
		t.Errorf("back %v after its engine answered", d)
	}
	n := eng.checks.Load()
	time.Sleep(200 * time.Millisecond)
	if got := eng.checks.Load() - n; got > 1 {
		t.Errorf("%d checks in 200 ms once healthy, want the hourly pace (at most the one in progress)", got)
	}
}
