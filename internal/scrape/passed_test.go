package scrape

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/testlog"
)

// TestProber_OnPassed: each check that passes tells OnPassed, with when its request was sent:
// before the engine had it, so that an ejection begun while a check was in flight is not
// taken as judged by it. A check that fails tells OnFailed instead, as sent.
func TestProber_OnPassed(t *testing.T) {
	var mu sync.Mutex
	var arrived time.Time
	status := http.StatusOK
	eng := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/health" {
			http.NotFound(w, r)
			return
		}
		mu.Lock()
		arrived = time.Now()
		code := status
		mu.Unlock()
		w.WriteHeader(code)
	}))
	defer eng.Close()
	pool, ep := onePool(t, endpoint.Spec{Name: eng.URL, Engine: "vllm", Models: []string{"m"}})
	pr := New(pool, eng.Client(), Options{}, nil)
	var told, failed []time.Time
	pr.OnFailed = func(e *endpoint.Endpoint, sent time.Time, _ CheckFailure) { failed = append(failed, sent) }
	pr.OnPassed = func(e *endpoint.Endpoint, sent time.Time) {
		if e != ep {
			t.Errorf("OnPassed told of %s, want %s", e.Name, ep.Name)
		}
		told = append(told, sent)
	}
	ctx := context.Background()
	start := time.Now()
	if err := pr.Check(ctx, ep); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	got := arrived
	mu.Unlock()
	if len(told) != 1 || told[0].Before(start) || told[0].After(got) || len(failed) != 0 {
		t.Fatalf("OnPassed told %v: want once, sent between %v (Check called) and %v (the engine had it)", told, start, got)
	}
	mu.Lock()
	status = http.StatusServiceUnavailable
	mu.Unlock()
	before := time.Now()
	if err := pr.Check(ctx, ep); err == nil {
		t.Fatal("a 503 check passed")
	}
	mu.Lock()
	got = arrived
	mu.Unlock()
	if len(told) != 1 {
		t.Errorf("OnPassed told %d times after a check that failed, want still 1", len(told))
	}
	if len(failed) != 1 || failed[0].Before(before) || failed[0].After(got) {
		t.Errorf("OnFailed told %v: want once, sent between %v (Check called) and %v (the engine had it)", failed, before, got)
	}
}

// TestProber_FailedCheckBelowThreshold: a failed check that leaves the endpoint in rotation
// (below unhealthy_threshold) is said at info, the check that takes it out at warn; a first
// check decides alone, and its warning says so (first_check), for its consecutive_failures 1
// would read as a threshold ignored.
func TestProber_FailedCheckBelowThreshold(t *testing.T) {
	eng := newFakeEngine(t, "")
	pool, ep := onePool(t, endpoint.Spec{Name: eng.srv.URL, Engine: "vllm", Models: []string{"m"}})
	var logs testlog.Buffer
	pr := New(pool, eng.srv.Client(), Options{UnhealthyThreshold: 3}, slog.New(slog.NewJSONHandler(&logs, nil)))
	ctx := context.Background()
	type line struct {
		Level, Msg string
		Failures   float64
		First      bool
	}
	saidIn := func(logs *testlog.Buffer) []line {
		var out []line
		for _, l := range logs.JSONLines(t) {
			if l["consecutive_failures"] != nil {
				f, _ := l["first_check"].(bool)
				out = append(out, line{l["level"].(string), l["msg"].(string), l["consecutive_failures"].(float64), f})
			}
		}
		return out
	}
	said := func() []line { return saidIn(&logs) }
	_ = pr.Check(ctx, ep)
	eng.status.Store(http.StatusServiceUnavailable)
	const below = "endpoint health check failed: still in rotation below unhealthy_threshold"
	want := []line{{"INFO", below, 1, false}, {"INFO", below, 2, false}, {"WARN", "endpoint unhealthy", 3, false}}
	for i := range want {
		_ = pr.Check(ctx, ep)
		if got := said(); len(got) != i+1 || got[i] != want[i] {
			t.Fatalf("after %d failed checks: lines %+v, want the last %+v", i+1, got, want[i])
		}
	}
	// Unhealthy: more failures say nothing more.
	_ = pr.Check(ctx, ep)
	if got := said(); len(got) != len(want) {
		t.Errorf("a failure of an unhealthy endpoint said %+v", got[len(want):])
	}

	// Another prober's first check fails: the endpoint is out at once, said at warn as such.
	var logs2 testlog.Buffer
	pool2, ep2 := onePool(t, endpoint.Spec{Name: eng.srv.URL, Engine: "vllm", Models: []string{"m"}})
	pr2 := New(pool2, eng.srv.Client(), Options{UnhealthyThreshold: 3}, slog.New(slog.NewJSONHandler(&logs2, nil)))
	_ = pr2.Check(ctx, ep2)
	if got := saidIn(&logs2); len(got) != 1 || got[0] != (line{"WARN", "endpoint unhealthy", 1, true}) || ep2.Healthy() {
		t.Errorf("first check failed: lines %+v, healthy %v; want one warning with first_check, out", got, ep2.Healthy())
	}
}
