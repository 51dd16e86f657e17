package app

import (
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/route"
	"github.com/kvroute/kvroute/internal/testlog"
)

// probedEngine answers /health 200 and counts those checks; anything else is a 404.
type probedEngine struct {
	srv    *httptest.Server
	checks atomic.Int32
}

func newProbedEngine(t *testing.T) *probedEngine {
	e := &probedEngine{}
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			e.checks.Add(1)
			return
		}
		http.NotFound(w, r)
	}))
	t.Cleanup(e.srv.Close)
	return e
}

// TestEjectionEndsAtPassingHealthCheck: an endpoint ejected after failures to connect (its
// engine restarting, for less than a health interval) is back at the first health check sent
// after the ejection that passes, said so in the log and in the metrics, not after
// health.ejection_time (30 s: QA's soak had a quarter of the fleet idle that long at each
// engine restart). An endpoint ejected by the refusal rule stays out while its checks pass.
func TestEjectionEndsAtPassingHealthCheck(t *testing.T) {
	a, b := newProbedEngine(t), newProbedEngine(t)
	const interval = 500 * time.Millisecond
	yaml := fmt.Sprintf("scrape: {disabled: true}\nhealth: {interval: %v, timeout: 400ms}\nserver: {shutdown_timeout: 10s}\nendpoints:\n"+
		"  - {url: %q, models: [m], engine: vllm}\n  - {url: %q, models: [m], engine: vllm}\n", interval, a.srv.URL, b.srv.URL)
	cfg, err := config.Parse([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	var logs testlog.Buffer
	r, err := NewRouter(cfg, slog.New(slog.NewJSONHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	runRouter(t, r)
	waitUntil(t, "the first health checks", func() bool { return a.checks.Load() > 0 && b.checks.Load() > 0 })
	epA, epB := r.pool.ByName(a.srv.URL), r.pool.ByName(b.srv.URL)

	// a's connections are refused passive_failures times in a row (its engine restarting):
	// ejected for 30 s.
	for range cfg.Health.PassiveFailures {
		r.outlier.Failed(epA, route.FailConnect)
	}
	ejected, before := time.Now(), a.checks.Load() // perhaps one more in flight, sent before the ejection
	if r.outlier.EjectedUntil(epA).IsZero() {
		t.Fatal("a not ejected after passive_failures failures to connect")
	}
	const back = "endpoint back from ejection: its health check passed"
	waitUntil(t, "a back from ejection", func() bool { return r.outlier.EjectedUntil(epA).IsZero() })
	t.Logf("a back %v after its ejection (health.interval %v, health.ejection_time %v)",
		time.Since(ejected).Round(time.Millisecond), interval, cfg.Health.EjectionTime.D())
	if n := a.checks.Load() - before; n > 2 {
		t.Errorf("a back after %d health checks since its ejection: want the first one sent after it", n)
	}
	waitUntil(t, "the line saying why", func() bool { return logs.Count(back) > 0 })
	if n := logs.Count(back); n != 1 {
		t.Errorf("%q said %d times, want once", back, n)
	}
	_, m := get(t, r.AdminHandler(), "/metrics")
	for _, want := range []string{
		fmt.Sprintf("kvroute_endpoint_ejected{endpoint=%q} 0\n", a.srv.URL),
		fmt.Sprintf("kvroute_endpoint_ejections_total{endpoint=%q,reason=\"failures\"} 1\n", a.srv.URL),
	} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}

	// b refuses what a serves: ejected by the refusal rule (30 answers each: the tallies fade
	// on the wall clock, 20 in a row falling short of refusal_volume 20 by a hair). Its engine
	// answers /health all the same; the checks that pass after the ejection end nothing.
	for range 30 {
		r.outlier.Succeeded(epA)
	}
	for range 30 {
		r.outlier.Refused(epB)
	}
	until := r.outlier.EjectedUntil(epB)
	if until.IsZero() {
		t.Fatal("b not ejected after refusing 30 of 30 while a served 30 of 30")
	}
	// The third check from now was sent after the second had passed, itself begun after the
	// ejection: by then, a check sent after the ejection has passed and been told.
	from := b.checks.Load()
	waitUntil(t, "two health checks of b since its ejection", func() bool { return b.checks.Load() >= from+3 })
	if got := r.outlier.EjectedUntil(epB); !got.Equal(until) {
		t.Errorf("b's ejection by the refusal rule: until %v after its health checks passed, want %v", got, until)
	}
	if n := logs.Count(back); n != 1 {
		t.Errorf("%q said %d times, want once (a alone)", back, n)
	}
}

// TestRestartLoadingEndsAtPassingHealthCheck: an engine restarted under load whose ejection
// mixes its cut streams and refused connections with 503s (llama.cpp's "Loading model", which
// its /health answers too while it loads) is back at the first check that passes after one
// failed, both since the ejection: the prober tells the outlier of failed checks (OnFailed).
// Its checks passing all along (an engine failing requests behind a live /health), the same
// ejection runs its time.
func TestRestartLoadingEndsAtPassingHealthCheck(t *testing.T) {
	var loading atomic.Bool
	var checks, failed atomic.Int32
	eng := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/health" {
			http.NotFound(w, r)
			return
		}
		checks.Add(1)
		if loading.Load() {
			failed.Add(1)
			http.Error(w, `{"error":{"code":503,"message":"Loading model"}}`, http.StatusServiceUnavailable)
		}
	}))
	t.Cleanup(eng.Close)
	b := newProbedEngine(t)
	const interval = 500 * time.Millisecond
	yaml := fmt.Sprintf("scrape: {disabled: true}\nhealth: {interval: %v, timeout: 400ms, unhealthy_threshold: 100}\nserver: {shutdown_timeout: 10s}\nendpoints:\n"+
		"  - {url: %q, models: [m], engine: vllm}\n  - {url: %q, models: [m], engine: vllm}\n", interval, eng.URL, b.srv.URL)
	cfg, err := config.Parse([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	r, err := NewRouter(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	runRouter(t, r)
	waitUntil(t, "the first health checks", func() bool { return checks.Load() > 0 && b.checks.Load() > 0 })
	ep := r.pool.ByName(eng.URL)
	restart := func() {
		t.Helper()
		r.outlier.Failed(ep, route.FailCut)
		r.outlier.Failed(ep, route.FailConnect)
		for range cfg.Health.PassiveFailures - 2 {
			r.outlier.Failed(ep, route.FailUnavailable)
		}
		if r.outlier.EjectedUntil(ep).IsZero() {
			t.Fatal("not ejected after a cut stream, a refused connection and 503s")
		}
	}

	// Its checks pass all along: three checks since the ejection end nothing.
	restart()
	until, from := r.outlier.EjectedUntil(ep), checks.Load()
	waitUntil(t, "three health checks since the ejection", func() bool { return checks.Load() >= from+3 })
	if got := r.outlier.EjectedUntil(ep); !got.Equal(until) {
		t.Fatalf("ejected until %v after checks that passed all along, want %v", got, until)
	}
	r.outlier.Forget(ep)

	// Loading: its checks fail, then pass once it is loaded.
	loading.Store(true)
	restart()
	from = failed.Load()
	waitUntil(t, "two failed checks since the ejection", func() bool { return failed.Load() >= from+2 })
	if r.outlier.EjectedUntil(ep).IsZero() {
		t.Fatal("back while its checks failed")
	}
	loading.Store(false)
	ready := time.Now()
	waitUntil(t, "back from ejection", func() bool { return r.outlier.EjectedUntil(ep).IsZero() })
	t.Logf("back %v after it was ready (health.interval %v)", time.Since(ready).Round(time.Millisecond), interval)
	if d := time.Since(ready); d > 3*interval {
		t.Errorf("back %v after it was ready, want within about a health interval (%v)", d, interval)
	}
}
