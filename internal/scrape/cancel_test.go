package scrape

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/testlog"
)

// TestProber_StoppedIsNotFailed: a scrape or a health check that the caller stops (the router
// shuts down, the endpoint leaves the pool) has not failed: no warning, the endpoint stays
// healthy, and its failure streaks do not grow. A real failure afterwards is still the first of
// its streak.
func TestProber_StoppedIsNotFailed(t *testing.T) {
	arrived := make(chan string, 4)
	release := make(chan struct{})
	defer close(release)
	const (
		answering = iota
		hanging
		failing
	)
	var mode atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch mode.Load() {
		case answering:
			return
		case failing:
			http.Error(w, "boom", http.StatusInternalServerError)
			return
		}
		select {
		case arrived <- r.URL.Path:
		default:
		}
		select { // answers only once the caller gives up
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	pool, ep := onePool(t, endpoint.Spec{Name: srv.URL, Engine: "vllm", MetricsPath: "/metrics"})
	var log testlog.Buffer
	pr := New(pool, srv.Client(), Options{HealthTimeout: time.Minute, ScrapeTimeout: time.Minute, UnhealthyThreshold: 1},
		slog.New(slog.NewJSONHandler(&log, nil)))
	if err := pr.Check(context.Background(), ep); err != nil { // a failed scrape is warned about from now on
		t.Fatal(err)
	}
	mode.Store(hanging)

	stopped := func(call func(context.Context) error, path string) {
		t.Helper()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		errc := make(chan error, 1)
		go func() { errc <- call(ctx) }()
		select {
		case got := <-arrived:
			if got != path {
				t.Fatalf("the engine got %s, want %s", got, path)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s did not reach the engine", path)
		}
		cancel()
		select {
		case err := <-errc:
			if err == nil {
				t.Errorf("%s stopped: no error", path)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s did not stop", path)
		}
	}
	stopped(func(ctx context.Context) error { return pr.Scrape(ctx, ep) }, "/metrics")
	stopped(func(ctx context.Context) error { return pr.Check(ctx, ep) }, "/health")
	if w := warnings(t, &log); len(w) != 0 {
		t.Errorf("warnings for a stopped scrape and check: %q", w)
	}
	if !ep.Healthy() {
		t.Error("a stopped health check made the endpoint unhealthy")
	}
	pr.mu.Lock()
	fails, scrapeFails := pr.st(ep).fail, pr.st(ep).scrapeFails
	pr.mu.Unlock()
	if fails != 0 || scrapeFails != 0 {
		t.Errorf("failure streaks: checks %d, scrapes %d, want 0 and 0", fails, scrapeFails)
	}

	mode.Store(failing)
	if err := pr.Scrape(context.Background(), ep); err == nil {
		t.Fatal("a 500: no error")
	}
	if w := warnings(t, &log); len(w) != 1 {
		t.Errorf("after a failed scrape: warnings %q, want the one of its streak", w)
	}
}
