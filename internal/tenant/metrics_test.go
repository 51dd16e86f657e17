package tenant

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/metrics"
	"github.com/kvroute/kvroute/internal/metrics/metricstest"
)

// tenantSeries gathers reg's kvroute_tenant_* series that are not 0 as "name{label=value,...}"
// -> value; histograms as their _count and _sum. The series made at 0 for each tenant are
// left out here and checked by allTenantSeries.
func tenantSeries(t *testing.T, reg prometheus.Gatherer) map[string]float64 {
	t.Helper()
	out := allTenantSeries(t, reg)
	for k, v := range out {
		if v == 0 {
			delete(out, k)
		}
	}
	return out
}

// allTenantSeries is tenantSeries with the series at 0.
func allTenantSeries(t *testing.T, reg prometheus.Gatherer) map[string]float64 {
	t.Helper()
	return metricstest.Values(t, reg, "kvroute_tenant_")
}

// newMeteredGate is newTestGate with tenant metrics on a registry of its own.
func newMeteredGate(t *testing.T, cfg string, opt Options) (*Gate, *fakeClock, *prometheus.Registry) {
	t.Helper()
	clk := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	reg := prometheus.NewPedanticRegistry()
	opt.Now, opt.Metrics = clk.Now, metrics.NewTenantMetrics(reg)
	opt.Getenv = func(string) string { return testSecret }
	g, err := New(testConfig(t, cfg), opt)
	if err != nil {
		t.Fatal(err)
	}
	return g, clk, reg
}

func bearer(key string) map[string]string { return map[string]string{"Authorization": "Bearer " + key} }

// TestTenantMetrics drives the middleware with good and bad keys and every limit, then reads
// the counters.
func TestTenantMetrics(t *testing.T) {
	g, _, reg := newMeteredGate(t, `tenants:
  - {name: a, api_keys: ["`+HashKey("ka")+`"], limits: {requests_per_minute: 2}}
  - {name: b, api_keys: ["`+HashKey("kb")+`"]}
  - {name: c, api_keys: ["`+HashKey("kc")+`"], limits: {tokens_per_minute: 600}}
  - {name: d, api_keys: ["`+HashKey("kd")+`"], limits: {max_concurrent: 1}}
`, Options{})
	var h http.Handler
	var nested int // status of a request of d sent while d's first one is in flight
	var atStart map[string]float64
	h = middleware(g, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Used") != "" {
			used(w, 400, 200) // the engine reports more than the estimate
		}
		if r.Header.Get("X-Nested") != "" {
			nested = do(h, bearer("kd"), chat("x")).Code
		}
		if s := r.Header.Get("X-Status"); s != "" {
			code, _ := strconv.Atoi(s)
			w.WriteHeader(code)
			return
		}
		w.(http.Flusher).Flush() // as the proxy does for streams: counts as 200
		_, _ = w.Write([]byte("{}"))
	}))
	long := chat(strings.Repeat("word ", 1000)) // over c's tokens per minute whatever happens
	for i, tc := range []struct {
		hdr  map[string]string
		body string
		want int
	}{
		{nil, chat("x"), 401},
		{bearer("nope"), chat("x"), 401},
		{map[string]string{"api-key": "nope"}, chat("x"), 401},
		{bearer("ka"), chat("x"), 200},
		{bearer("ka"), chat("x"), 200},
		{bearer("ka"), chat("x"), 429}, // requests per minute
		{map[string]string{"Authorization": "Bearer kb", "X-Status": "404"}, chat("x"), 404},
		{map[string]string{"Authorization": "Bearer kb", "X-Status": "503"}, chat("x"), 503},
		{bearer("kc"), long, 429}, // request_too_large
		{map[string]string{"Authorization": "Bearer kc", "X-Used": "1"}, chat("x"), 200},
		{map[string]string{"Authorization": "Bearer kd", "X-Nested": "1"}, chat("x"), 200},
	} {
		if i == 0 {
			atStart = allTenantSeries(t, reg)
		}
		if w := do(h, tc.hdr, tc.body); w.Code != tc.want {
			t.Fatalf("request %d: status %d, want %d", i, w.Code, tc.want)
		}
	}
	if nested != http.StatusTooManyRequests {
		t.Fatalf("d's second request in flight: %d, want 429", nested)
	}
	// c's engine reported more than the estimate: c owes tokens and is refused, retryably.
	if w := do(h, bearer("kc"), chat("x")); w.Code != http.StatusTooManyRequests {
		t.Fatalf("c in debt: %d, want 429", w.Code)
	}

	want := map[string]float64{
		// Every request that took its limits settles its tokens: 3 estimated for chat("x").
		`kvroute_tenant_prompt_tokens_total{tenant=a}`:       6,
		`kvroute_tenant_prompt_tokens_total{tenant=b}`:       6,
		`kvroute_tenant_prompt_tokens_total{tenant=d}`:       3,
		`kvroute_tenant_requests_total{status=401,tenant=}`:  3,
		`kvroute_tenant_requests_total{status=200,tenant=a}`: 2,
		`kvroute_tenant_requests_total{status=429,tenant=a}`: 1,
		`kvroute_tenant_requests_total{status=404,tenant=b}`: 1,
		`kvroute_tenant_requests_total{status=503,tenant=b}`: 1,
		`kvroute_tenant_requests_total{status=200,tenant=c}`: 1,
		`kvroute_tenant_requests_total{status=429,tenant=c}`: 2,
		`kvroute_tenant_requests_total{status=200,tenant=d}`: 1,
		`kvroute_tenant_requests_total{status=429,tenant=d}`: 1,

		`kvroute_tenant_rejections_total{reason=missing_api_key,tenant=}`:             1,
		`kvroute_tenant_rejections_total{reason=invalid_api_key,tenant=}`:             2,
		`kvroute_tenant_rejections_total{reason=requests_per_minute,tenant=a}`:        1,
		`kvroute_tenant_rejections_total{reason=request_too_large,tenant=c}`:          1,
		`kvroute_tenant_rejections_total{reason=tokens_per_minute,tenant=c}`:          1,
		`kvroute_tenant_rejections_total{reason=concurrency_limit_exceeded,tenant=d}`: 1,

		`kvroute_tenant_prompt_tokens_total{tenant=c}`:     400,
		`kvroute_tenant_completion_tokens_total{tenant=c}`: 200,
	}
	if diff := cmp.Diff(want, tenantSeries(t, reg)); diff != "" {
		t.Errorf("tenant series (-want +got):\n%s", diff)
	}
	// Every series counted above existed at 0 before the first request, so that Prometheus
	// sees its first increase.
	for k := range want {
		if v, ok := atStart[k]; !ok || v != 0 {
			t.Errorf("%s: %v at start (present %v), want a series at 0", k, v, ok)
		}
	}
}

// TestTenantMetricsAdmission: the time a request waited for admission (0 when it went at
// once), and overload refusals.
func TestTenantMetricsAdmission(t *testing.T) {
	pool := endpoint.NewPool()
	if _, err := pool.Update([]endpoint.Spec{{Name: "http://127.0.0.1:1"}}); err != nil {
		t.Fatal(err)
	}
	eps := pool.All()
	g, clk, reg := newMeteredGate(t, "tenants: [{name: a, api_keys: [\""+HashKey("k")+"\"]}, {name: b, api_keys: [\""+HashKey("kb")+"\"]}]\n"+
		"overload: {max_waiting_per_endpoint: 4, max_wait: 1h, queue_size: 1}\n", Options{Poll: time.Millisecond})
	a, b := &Identity{Name: "a"}, &Identity{Name: "b"}
	admit := func(id *Identity) error {
		release, err := g.Admit(context.Background(), id, eps)
		if release != nil {
			release()
		}
		return err
	}
	if err := admit(a); err != nil { // free: straight through
		t.Fatal(err)
	}
	eps[0].SetSnapshot(&endpoint.Snapshot{At: time.Now(), Waiting: 10})
	done := make(chan error, 1)
	go func() { done <- admit(a) }()
	deadline := time.Now().Add(5 * time.Second)
	for g.Waiting() != 1 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if g.Waiting() != 1 {
		t.Fatal("the request did not wait while the endpoint was saturated")
	}
	if err := admit(b); err == nil || !strings.Contains(err.Error(), "503") {
		t.Fatalf("second waiter in a queue of 1: %v, want 503", err)
	}
	if err := admit(nil); err == nil { // authentication off: refused, not counted
		t.Fatal("a request without identity got past a full queue")
	}
	clk.Add(1500 * time.Millisecond)
	eps[0].SetSnapshot(&endpoint.Snapshot{At: time.Now(), Waiting: 0})
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("admitted with an error: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("not admitted after the endpoint freed up")
	}
	want := map[string]float64{
		`kvroute_tenant_queue_wait_seconds_count{tenant=a}`:           2,
		`kvroute_tenant_queue_wait_seconds_sum{tenant=a}`:             1.5,
		`kvroute_tenant_rejections_total{reason=overloaded,tenant=b}`: 1,
	}
	if diff := cmp.Diff(want, tenantSeries(t, reg)); diff != "" {
		t.Errorf("tenant series (-want +got):\n%s", diff)
	}
}

// TestTenantMetricsReload: a tenant removed from the config loses its series, even with a
// request in flight across the reload; kept tenants keep theirs.
func TestTenantMetricsReload(t *testing.T) {
	two := "tenants: [{name: a, api_keys: [\"" + HashKey("ka") + "\"]}, {name: b, api_keys: [\"" + HashKey("kb") + "\"], limits: {requests_per_minute: 1}}]\n"
	g, clk, reg := newMeteredGate(t, two, Options{})
	h := middleware(g, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if p := r.Header.Get("X-Prompt"); p != "" {
			n, _ := strconv.Atoi(p)
			used(w, n, n/2)
		}
		if r.Header.Get("X-Reload") != "" { // b's request is in flight while b is removed
			if err := g.Reload(testConfig(t, "tenants: [{name: a, api_keys: [\""+HashKey("ka")+"\"]}]\n")); err != nil {
				t.Error(err)
			}
		}
		_, _ = w.Write([]byte("{}"))
	}))
	do(h, map[string]string{"Authorization": "Bearer ka", "X-Prompt": "0"}, chat("x"))
	do(h, map[string]string{"Authorization": "Bearer kb", "X-Prompt": "10"}, chat("x"))
	do(h, bearer("kb"), chat("x")) // 429
	do(h, nil, chat("x"))
	before := map[string]float64{
		`kvroute_tenant_requests_total{status=200,tenant=a}`:                   1,
		`kvroute_tenant_requests_total{status=200,tenant=b}`:                   1,
		`kvroute_tenant_requests_total{status=429,tenant=b}`:                   1,
		`kvroute_tenant_requests_total{status=401,tenant=}`:                    1,
		`kvroute_tenant_rejections_total{reason=missing_api_key,tenant=}`:      1,
		`kvroute_tenant_rejections_total{reason=requests_per_minute,tenant=b}`: 1,
		`kvroute_tenant_prompt_tokens_total{tenant=b}`:                         10,
		`kvroute_tenant_completion_tokens_total{tenant=b}`:                     5,
	}
	if diff := cmp.Diff(before, tenantSeries(t, reg)); diff != "" {
		t.Fatalf("before the reload (-want +got):\n%s", diff)
	}
	// A minute later b may send again: reload without b while that request is in flight.
	clk.Add(time.Minute)
	// Settled after the reload: not counted.
	if w := do(h, map[string]string{"Authorization": "Bearer kb", "X-Reload": "1", "X-Prompt": "7"}, chat("x")); w.Code != http.StatusOK {
		t.Fatalf("b's request across the reload: %d", w.Code)
	}
	if w := do(h, bearer("kb"), chat("x")); w.Code != http.StatusUnauthorized {
		t.Fatalf("b's key after b was removed: %d, want 401", w.Code)
	}
	want := map[string]float64{
		`kvroute_tenant_requests_total{status=200,tenant=a}`:              1,
		`kvroute_tenant_requests_total{status=401,tenant=}`:               2,
		`kvroute_tenant_rejections_total{reason=missing_api_key,tenant=}`: 1,
		`kvroute_tenant_rejections_total{reason=invalid_api_key,tenant=}`: 1,
	}
	if diff := cmp.Diff(want, tenantSeries(t, reg)); diff != "" {
		t.Errorf("after removing b (-want +got):\n%s", diff)
	}
	for k := range allTenantSeries(t, reg) {
		if strings.HasSuffix(k, "tenant=b}") {
			t.Errorf("after removing b: %s is still there", k)
		}
	}
	// b comes back, a minute later (its limits go on from where it left them): counted
	// afresh.
	clk.Add(time.Minute)
	if err := g.Reload(testConfig(t, two)); err != nil {
		t.Fatal(err)
	}
	do(h, bearer("kb"), chat("x"))
	if got := tenantSeries(t, reg)[`kvroute_tenant_requests_total{status=200,tenant=b}`]; got != 1 {
		t.Errorf("b re-added: %v requests with 200, want 1", got)
	}
}

// TestTenantMetricsAuthOff: without authentication there are no tenants and nothing is counted.
func TestTenantMetricsAuthOff(t *testing.T) {
	cfg, err := config.Parse([]byte("endpoints: [{url: \"http://127.0.0.1:1\"}]\nauth: {mode: none}\n"))
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	g, err := New(cfg, Options{Metrics: metrics.NewTenantMetrics(reg)})
	if err != nil {
		t.Fatal(err)
	}
	if w := do(middleware(g, &echo{}), nil, chat("x")); w.Code != http.StatusOK {
		t.Fatalf("auth off: %d", w.Code)
	}
	if got := allTenantSeries(t, reg); len(got) != 0 {
		t.Errorf("auth off, yet tenant series: %v", got)
	}
}

// A request whose client goes away while it waits for admission is counted as client_gone, not
// as a refusal for overload; Lookup (the admin port's explain) counts no refusal at all.
func TestTenantMetricsClientGoneAndLookup(t *testing.T) {
	pool := endpoint.NewPool()
	if _, err := pool.Update([]endpoint.Spec{{Name: "http://127.0.0.1:1"}}); err != nil {
		t.Fatal(err)
	}
	eps := pool.All()
	g, _, reg := newMeteredGate(t, "tenants: [{name: a, api_keys: [\""+HashKey("k")+"\"]}]\n"+
		"overload: {max_waiting_per_endpoint: 4, max_wait: 1h, queue_size: 8}\n", Options{Poll: time.Millisecond})
	eps[0].SetSnapshot(&endpoint.Snapshot{At: time.Now(), Waiting: 10})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		release, err := g.Admit(ctx, &Identity{Name: "a"}, eps)
		if release != nil {
			release()
		}
		done <- err
	}()
	deadline := time.Now().Add(5 * time.Second)
	for g.Waiting() != 1 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if g.Waiting() != 1 {
		t.Fatal("the request did not wait while the endpoint was saturated")
	}
	cancel()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("admitted although its client went away and the endpoint stayed saturated")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("still waiting after its client went away")
	}

	for _, h := range []http.Header{
		{},
		{"Authorization": {"Bearer wrong"}},
		{"Authorization": {"Bearer k"}, "Api-Key": {"other"}},
	} {
		if _, oe := g.Lookup(h); oe == nil {
			t.Errorf("Lookup(%v) found a tenant", h)
		}
	}
	if id, oe := g.Lookup(http.Header{"Authorization": {"Bearer k"}}); oe != nil || id == nil || id.Name != "a" {
		t.Errorf("Lookup with a's key: %v, %v; want tenant a", id, oe)
	}

	want := map[string]float64{`kvroute_tenant_rejections_total{reason=client_gone,tenant=a}`: 1}
	if diff := cmp.Diff(want, tenantSeries(t, reg)); diff != "" {
		t.Errorf("tenant series (-want +got):\n%s", diff)
	}
}
