package metrics

import (
	"fmt"
	"math"
	"net/http/httptest"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/metrics/metricstest"
)

// fakeClock is a settable clock for m.now.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time      { return c.t }
func (c *fakeClock) add(d time.Duration) { c.t = c.t.Add(d) }

// newTestMetrics is New on a pedantic registry of its own, with a settable clock.
func newTestMetrics() (*Metrics, *prometheus.Registry, *fakeClock) {
	reg := prometheus.NewPedanticRegistry()
	m := New(reg)
	clk := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	m.now = clk.now
	return m, reg, clk
}

func seriesOf(t *testing.T, g prometheus.Gatherer) map[string]float64 {
	return metricstest.Values(t, g, "")
}

func TestMetricsExposition(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m := New(reg)
	a := &endpoint.Endpoint{ID: 0, Name: "http://127.0.0.1:1", KVCapacityTokens: 100}
	b := &endpoint.Endpoint{ID: 1, Name: "http://127.0.0.1:2"}
	m.EndpointAdded(a.Name, []string{"m"})
	m.EndpointAdded(b.Name, []string{"m"})
	b.SetHealthy(false)
	b.Stalled(time.Unix(90, 0).UnixNano(), time.Unix(100, 0).UnixNano()) // a stall watch found it stalled
	a.Start(10)
	a.SetSnapshot(&endpoint.Snapshot{At: time.Unix(100, 0), Running: 3, Waiting: 2, KVUsage: 0.25, PrefixQueries: 1000, PrefixHits: 400})
	a.Progressed(time.Unix(101, 500_000_000).UnixNano())
	m.now = func() time.Time { return time.Unix(102, 0) }
	m.WatchEndpoints(func() []*endpoint.Endpoint { return []*endpoint.Endpoint{a, b} })
	m.WatchIndex(func() (int, int64) { return 3, 96 })
	m.WatchPrefillRate(func(e *endpoint.Endpoint) float64 {
		if e == a {
			return 5 // tokens/s: 10 pending tokens are 2 s of prefill
		}
		return 0 // unknown: no prediction exported
	})
	// Only b's capacity is unknown: a's configured one stands whatever the policy learned.
	m.WatchLearnedCapacity(func(*endpoint.Endpoint) int { return 4096 })
	m.Requests.WithLabelValues("m", a.Name, Status(200)).Inc()
	m.Requests.WithLabelValues("m", b.Name, Status(502)).Inc()
	m.TTFT.WithLabelValues("m").Observe(0.05)

	want := `
# HELP kvroute_endpoint_healthy 1 when the endpoint passes its health checks, else 0. An endpoint ejected for failed requests keeps its health here: kvroute_endpoint_ejected says so.
# TYPE kvroute_endpoint_healthy gauge
kvroute_endpoint_healthy{endpoint="http://127.0.0.1:1"} 1
kvroute_endpoint_healthy{endpoint="http://127.0.0.1:2"} 0
# HELP kvroute_endpoint_in_flight_requests Requests forwarded to the endpoint and not finished.
# TYPE kvroute_endpoint_in_flight_requests gauge
kvroute_endpoint_in_flight_requests{endpoint="http://127.0.0.1:1"} 1
kvroute_endpoint_in_flight_requests{endpoint="http://127.0.0.1:2"} 0
# HELP kvroute_endpoint_snapshot_age_seconds Age of the endpoint's last scraped engine metrics.
# TYPE kvroute_endpoint_snapshot_age_seconds gauge
kvroute_endpoint_snapshot_age_seconds{endpoint="http://127.0.0.1:1"} 2
# HELP kvroute_endpoint_last_answer_age_seconds Time since the engine last answered anything: a first token, a stream's event or a complete answer (seen by this router or a peer replica), or more work in its scraped token counters. Absent until it has; with requests in flight, a growing value is a stalled engine (limits.stall_timeout).
# TYPE kvroute_endpoint_last_answer_age_seconds gauge
kvroute_endpoint_last_answer_age_seconds{endpoint="http://127.0.0.1:1"} 0.5
# HELP kvroute_endpoint_stalled 1 while a stall watch, this router's or a peer replica's, has found the engine stalled (it held a stream without its first token for limits.stall_timeout or longer, and answered nothing at all meanwhile) and it has not answered since, else 0: it goes after the other endpoints, but for a request every 30 s (one for all replicas that share their events).
# TYPE kvroute_endpoint_stalled gauge
kvroute_endpoint_stalled{endpoint="http://127.0.0.1:1"} 0
kvroute_endpoint_stalled{endpoint="http://127.0.0.1:2"} 1
# HELP kvroute_endpoint_prefill_rate_tokens_per_second The endpoint's prefill rate as the policy has calibrated it, in the router's tokens per second (prefix-aware: from the first tokens it sees, and where answers come whole from the engines' scraped TTFT histograms); absent with a policy that has none.
# TYPE kvroute_endpoint_prefill_rate_tokens_per_second gauge
kvroute_endpoint_prefill_rate_tokens_per_second{endpoint="http://127.0.0.1:1"} 5
# HELP kvroute_endpoint_predicted_ttft_seconds Prefill work the router has queued on the endpoint over its calibrated prefill rate: the least time to first token a new request there would wait.
# TYPE kvroute_endpoint_predicted_ttft_seconds gauge
kvroute_endpoint_predicted_ttft_seconds{endpoint="http://127.0.0.1:1"} 2
# HELP kvroute_endpoint_engine_waiting_requests Requests waiting in the engine's queue, as last scraped from the engine.
# TYPE kvroute_endpoint_engine_waiting_requests gauge
kvroute_endpoint_engine_waiting_requests{endpoint="http://127.0.0.1:1"} 2
# HELP kvroute_endpoint_engine_kv_usage_ratio Share of the engine's KV cache in use (0 to 1), as last scraped from the engine.
# TYPE kvroute_endpoint_engine_kv_usage_ratio gauge
kvroute_endpoint_engine_kv_usage_ratio{endpoint="http://127.0.0.1:1"} 0.25
# HELP kvroute_endpoint_engine_prefix_cache_hit_tokens_total Prompt tokens the engine found in its prefix cache (vLLM prefix_cache_hits, SGLang cached tokens), as last scraped.
# TYPE kvroute_endpoint_engine_prefix_cache_hit_tokens_total counter
kvroute_endpoint_engine_prefix_cache_hit_tokens_total{endpoint="http://127.0.0.1:1"} 400
# HELP kvroute_endpoint_learned_kv_capacity_tokens The KV-cache capacity, in the engine's tokens, that the router learned from the endpoint's hits and misses because none is configured (kv_tokens) or scraped; the endpoint's index is sized by it. Absent while none is learned.
# TYPE kvroute_endpoint_learned_kv_capacity_tokens gauge
kvroute_endpoint_learned_kv_capacity_tokens{endpoint="http://127.0.0.1:2"} 4096
# HELP kvroute_index_entries Entries (block, endpoint) in the policy's prefix index.
# TYPE kvroute_index_entries gauge
kvroute_index_entries 3
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"kvroute_endpoint_healthy", "kvroute_endpoint_in_flight_requests", "kvroute_endpoint_snapshot_age_seconds",
		"kvroute_endpoint_last_answer_age_seconds", "kvroute_endpoint_stalled", "kvroute_endpoint_prefill_rate_tokens_per_second", "kvroute_endpoint_predicted_ttft_seconds", "kvroute_endpoint_engine_waiting_requests",
		"kvroute_endpoint_engine_kv_usage_ratio", "kvroute_endpoint_engine_prefix_cache_hit_tokens_total",
		"kvroute_endpoint_learned_kv_capacity_tokens", "kvroute_index_entries"); err != nil {
		t.Error(err)
	}
	before := testutil.CollectAndCount(m.Requests)
	m.ForgetEndpoint(b.Name)
	if n := testutil.CollectAndCount(m.Requests); n != before-len(endpointStatuses) {
		t.Errorf("after ForgetEndpoint: %d request series, want %d (%d less: b's statuses)", n, before-len(endpointStatuses), len(endpointStatuses))
	}
	for k := range seriesOf(t, reg) {
		if strings.Contains(k, b.Name) && !strings.HasPrefix(k, "kvroute_endpoint_healthy") &&
			!strings.HasPrefix(k, "kvroute_endpoint_in_flight") && !strings.HasPrefix(k, "kvroute_endpoint_pending") &&
			!strings.HasPrefix(k, "kvroute_endpoint_stalled") &&
			!strings.HasPrefix(k, "kvroute_endpoint_kv_capacity") && !strings.HasPrefix(k, "kvroute_endpoint_learned_kv_capacity") {
			// The gauges above read the watched endpoints, which still list b here.
			t.Errorf("after ForgetEndpoint: %s is still there", k)
		}
	}
	lint(t, reg)
}

func lint(t *testing.T, reg prometheus.Gatherer) {
	t.Helper()
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint %s: %s", p.Metric, p.Text)
	}
}

// TestSeriesAtZero: every series a router with one endpoint, a discovery source and a tenant
// will count exists at 0 before its first event, and a scrape after one event of each shows
// 1: what Prometheus needs to see the first reload, refusal, retry, ejection and 429.
func TestSeriesAtZero(t *testing.T) {
	m, reg, clk := newTestMetrics()
	const ep = "http://127.0.0.1:1"
	m.EndpointAdded(ep, []string{"m"})
	m.DiscoverySource("file")
	m.Tenant.SetTenants([]string{"t"})
	watched := []string{
		`kvroute_config_reloads_total{result=ok}`,
		`kvroute_config_reloads_total{result=error}`,
		`kvroute_discovery_errors_total{source=file}`,
		`kvroute_requests_total{endpoint=` + ep + `,model=m,status=429}`,
		`kvroute_requests_total{endpoint=` + ep + `,model=m,status=500}`,
		`kvroute_requests_total{endpoint=` + ep + `,model=m,status=502}`,
		`kvroute_requests_total{endpoint=` + ep + `,model=m,status=503}`,
		`kvroute_requests_total{endpoint=` + ep + `,model=m,status=504}`,
		`kvroute_requests_total{endpoint=none,model=m,status=429}`,
		`kvroute_requests_total{endpoint=none,model=m,status=503}`,
		`kvroute_requests_total{endpoint=none,model=unknown,status=401}`,
		`kvroute_requests_total{endpoint=none,model=unknown,status=404}`,
		`kvroute_retries_total{endpoint=` + ep + `,reason=connect_error}`,
		`kvroute_retries_total{endpoint=` + ep + `,reason=unavailable}`,
		`kvroute_requests_moved_total{endpoint=` + ep + `,reason=cache_probe}`,
		`kvroute_endpoint_ejections_total{endpoint=` + ep + `,reason=failures}`,
		`kvroute_endpoint_ejections_total{endpoint=` + ep + `,reason=peer_failures}`,
		`kvroute_endpoint_ejections_total{endpoint=` + ep + `,reason=refusals}`,
		`kvroute_endpoint_ejected_seconds_total{endpoint=` + ep + `}`,
		`kvroute_endpoint_ejected{endpoint=` + ep + `}`,
		`kvroute_endpoint_predicted_cached_tokens_total{endpoint=` + ep + `}`,
		`kvroute_predicted_cached_tokens_total{model=m}`,
		`kvroute_engine_cached_tokens_total{model=m}`,
		`kvroute_ttft_seconds_count{model=m}`,
		`kvroute_request_duration_seconds_count{model=m}`,
		`kvroute_request_duration_seconds_count{model=unknown}`,
		`kvroute_tenant_requests_total{status=429,tenant=t}`,
		`kvroute_tenant_requests_total{status=401,tenant=}`,
		`kvroute_tenant_requests_total{status=400,tenant=}`,
		`kvroute_tenant_rejections_total{reason=requests_per_minute,tenant=t}`,
		`kvroute_tenant_rejections_total{reason=tokens_per_minute,tenant=t}`,
		`kvroute_tenant_rejections_total{reason=overloaded,tenant=t}`,
		`kvroute_tenant_rejections_total{reason=missing_api_key,tenant=}`,
		`kvroute_tenant_rejections_total{reason=invalid_api_key,tenant=}`,
		`kvroute_tenant_rejections_total{reason=multiple_api_keys,tenant=}`,
		`kvroute_tenant_queue_wait_seconds_count{tenant=t}`,
	}
	scrape := func() map[string]float64 {
		t.Helper()
		got := seriesOf(t, reg)
		out := map[string]float64{}
		for _, k := range watched {
			v, ok := got[k]
			if !ok {
				v = math.NaN() // absent: what Prometheus would not see
			}
			out[k] = v
		}
		return out
	}
	first := scrape()
	for k, v := range first {
		if v != 0 {
			t.Errorf("first scrape: %s = %v, want a series at 0", k, v)
		}
	}
	// Every counter and histogram family the router registers has series from the start.
	for _, mf := range mustGather(t, reg) {
		if typ := mf.GetType(); (typ == dto.MetricType_COUNTER || typ == dto.MetricType_HISTOGRAM) && len(mf.GetMetric()) == 0 {
			t.Errorf("%s has no series at start", mf.GetName())
		}
	}

	m.Reloads.WithLabelValues("ok").Inc()
	m.Reloads.WithLabelValues("error").Inc()
	m.DiscoveryErrors.WithLabelValues("file").Inc()
	for _, s := range []struct{ ep, model, status string }{{ep, "m", "429"}, {ep, "m", "500"}, {ep, "m", "502"}, {ep, "m", "503"}, {ep, "m", "504"},
		{NoEndpoint, "m", "429"}, {NoEndpoint, "m", "503"}, {NoEndpoint, UnknownModel, "401"}, {NoEndpoint, UnknownModel, "404"}} {
		m.Requests.WithLabelValues(s.model, s.ep, s.status).Inc()
	}
	m.Retries.WithLabelValues(ep, RetryConnectError).Inc()
	m.Retries.WithLabelValues(ep, RetryUnavailable).Inc()
	m.Moved.WithLabelValues(ep, "cache_probe").Inc()
	for _, r := range EjectReasons {
		m.EndpointEjected(ep, r, 0) // one ejection, continued: one second ejected
	}
	clk.add(time.Second)
	m.PredictedCachedTokens("m", ep, 1)
	m.PredictedCachedTokens("m", ep, -1) // no prediction: not counted
	m.EngineCached.WithLabelValues("m").Inc()
	m.TTFT.WithLabelValues("m").Observe(0.1)
	m.Duration.WithLabelValues("m").Observe(0.1)
	m.Duration.WithLabelValues(UnknownModel).Observe(0.001)
	m.Tenant.Request("t", 429)
	m.Tenant.Request(Unauthenticated, 401)
	m.Tenant.Request(Unauthenticated, 400)
	for _, r := range []string{"requests_per_minute", "tokens_per_minute", "overloaded", "client_gone"} {
		m.Tenant.Rejection("t", r)
	}
	m.Tenant.Rejection(Unauthenticated, "missing_api_key")
	m.Tenant.Rejection(Unauthenticated, "invalid_api_key")
	m.Tenant.Rejection(Unauthenticated, "multiple_api_keys")
	m.Tenant.Waited("t", 0)

	want := map[string]float64{}
	for _, k := range watched {
		want[k] = 1
	}
	if diff := cmp.Diff(want, scrape()); diff != "" {
		t.Errorf("second scrape, after one event of each (-want +got):\n%s", diff)
	}
	lint(t, reg)
}

// TestEndpointStatusesAtZero: an endpoint's requests are made at 0 for the statuses whose
// first occurrence must show (the server errors, a busy engine's 429), per model it serves,
// and no others: 200, 400 and 499 come at their first occurrence, as an engine's 422 does.
func TestEndpointStatusesAtZero(t *testing.T) {
	m, reg, _ := newTestMetrics()
	const ep = "http://127.0.0.1:1"
	m.EndpointAdded(ep, []string{"m1", "m2"})
	statuses := func() map[string][]string {
		out := map[string][]string{}
		for k := range metricstest.Values(t, reg, "kvroute_requests_total") {
			if rest, ok := strings.CutPrefix(k, "kvroute_requests_total{endpoint="+ep+",model="); ok {
				model, status, _ := strings.Cut(strings.TrimSuffix(rest, "}"), ",status=")
				out[model] = append(out[model], status)
			}
		}
		for _, s := range out {
			slices.Sort(s)
		}
		return out
	}
	want := map[string][]string{"m1": {"429", "500", "502", "503", "504"}, "m2": {"429", "500", "502", "503", "504"}}
	if diff := cmp.Diff(want, statuses()); diff != "" {
		t.Errorf("statuses at 0 by model (-want +got):\n%s", diff)
	}
	m.Requests.WithLabelValues("m1", ep, "200").Inc()
	want["m1"] = []string{"200", "429", "500", "502", "503", "504"}
	if diff := cmp.Diff(want, statuses()); diff != "" {
		t.Errorf("after a first 200 (-want +got):\n%s", diff)
	}
}

func mustGather(t *testing.T, g prometheus.Gatherer) []*dto.MetricFamily {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	return mfs
}

// TestEjectedTime: an ejection counts once and its time runs until the endpoint is readmitted
// (or re-added), the ejection in progress included at each scrape.
func TestEjectedTime(t *testing.T) {
	m, reg, clk := newTestMetrics()
	const ep = "http://127.0.0.1:1"
	m.EndpointAdded(ep, nil)
	read := func() [3]float64 {
		s := seriesOf(t, reg)
		return [3]float64{s[`kvroute_endpoint_ejections_total{endpoint=`+ep+`,reason=failures}`],
			s[`kvroute_endpoint_ejected{endpoint=`+ep+`}`], s[`kvroute_endpoint_ejected_seconds_total{endpoint=`+ep+`}`]}
	}
	steps := []struct {
		do   func()
		want [3]float64 // ejections, ejected, ejected seconds
	}{
		{func() {}, [3]float64{0, 0, 0}},
		{func() { m.EndpointReadmitted(ep) }, [3]float64{0, 0, 0}}, // healthy already: nothing to end
		{func() { m.EndpointEjected(ep, EjectFailures, 0); clk.add(2 * time.Second) }, [3]float64{1, 1, 2}},
		{func() { m.EndpointEjected(ep, EjectFailures, 0); clk.add(time.Second) }, [3]float64{2, 1, 3}}, // counted, same ejection
		{func() { m.EndpointReadmitted(ep); clk.add(10 * time.Second) }, [3]float64{2, 0, 3}},
		{func() { m.EndpointEjected(ep, EjectFailures, 0); clk.add(500 * time.Millisecond) }, [3]float64{3, 1, 3.5}},
		{func() { m.EndpointAdded(ep, nil); clk.add(time.Second) }, [3]float64{3, 0, 3.5}}, // re-added: starts healthy
	}
	for i, s := range steps {
		s.do()
		if got := read(); got != s.want {
			t.Errorf("step %d: ejections, ejected, seconds = %v, want %v", i, got, s.want)
		}
	}
	m.ForgetEndpoint(ep)
	for k := range seriesOf(t, reg) {
		if strings.Contains(k, ep) {
			t.Errorf("after ForgetEndpoint: %s is still there", k)
		}
	}
	lint(t, reg)
}

// TestModelSeries: an endpoint's models get their per-model series; an endpoint that serves
// every model gets those of the others' models and "other"; a model loses its series when the
// last endpoint serving it leaves.
func TestModelSeries(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m := New(reg)
	m.EndpointAdded("a", []string{"m1"})
	m.EndpointAdded("c", nil) // before b: it gets m2 when b comes
	m.EndpointAdded("b", []string{"m1", "m2"})
	models := func() []string {
		var out []string
		for k := range metricstest.Values(t, reg, "kvroute_ttft_seconds") {
			if m, ok := strings.CutPrefix(k, "kvroute_ttft_seconds_count{model="); ok {
				out = append(out, strings.TrimSuffix(m, "}"))
			}
		}
		slices.Sort(out)
		return out
	}
	requests := func(ep string) []string {
		var out []string
		for k := range metricstest.Values(t, reg, "kvroute_requests_total") {
			if strings.Contains(k, "endpoint="+ep+",") {
				out = append(out, k)
			}
		}
		return out
	}
	if diff := cmp.Diff([]string{"m1", "m2", "other"}, models()); diff != "" {
		t.Errorf("TTFT series by model (-want +got):\n%s", diff)
	}
	if n := len(requests("c")); n != 3*len(endpointStatuses) {
		t.Errorf("c (every model): %d request series, want %d (m1, m2, other)", n, 3*len(endpointStatuses))
	}
	m.ForgetEndpoint("b")
	if diff := cmp.Diff([]string{"m1", "m2", "other"}, models()); diff != "" {
		t.Errorf("after b left, c still serves m2 (-want +got):\n%s", diff)
	}
	m.ForgetEndpoint("c")
	if diff := cmp.Diff([]string{"m1"}, models()); diff != "" {
		t.Errorf("after c left (-want +got):\n%s", diff)
	}
	for k := range metricstest.Values(t, reg, "kvroute_") {
		if strings.Contains(k, "model=m2") || strings.Contains(k, "model=other") {
			t.Errorf("after the last endpoint of m2 and other left: %s", k)
		}
	}
	if _, ok := seriesOf(t, reg)[`kvroute_requests_total{endpoint=none,model=unknown,status=404}`]; !ok {
		t.Error("the refusals of unknown models went with the endpoints")
	}
	// a re-added with another model: m1 goes (a was its last endpoint), m3 comes.
	m.EndpointAdded("a", []string{"m3"})
	if diff := cmp.Diff([]string{"m3"}, models()); diff != "" {
		t.Errorf("a re-added with m3 instead of m1 (-want +got):\n%s", diff)
	}
	if n := len(requests("a")); n != len(endpointStatuses) {
		t.Errorf("a re-added: %d request series, want %d (m3 only)", n, len(endpointStatuses))
	}
}

// TestBuckets: the classic buckets cover what each histogram measures, at the resolution
// docs/operations.md promises; the histograms are native too.
func TestBuckets(t *testing.T) {
	for _, c := range []struct {
		name       string
		b          []float64
		first      float64
		atLeast    float64 // the last bucket is at least this
		widest     float64 // no bucket more than this many times its lower neighbour
		subMilli   int     // buckets above 0 and under 1 ms
		bucketAt0  bool
		bucketsMax int
	}{
		{"ttft", ttftBuckets, 0.001, 60, 1.5, 0, false, 40},
		{"request duration", e2eBuckets, 0.001, 600, 2, 0, false, 30},
		{"queue wait", queueWaitBuckets, 0, 60, 3, 3, true, 25},
	} {
		b := c.b
		if b[0] != c.first || b[len(b)-1] < c.atLeast || len(b) > c.bucketsMax {
			t.Errorf("%s: %d buckets %v..%v, want %v..>=%v, at most %d", c.name, len(b), b[0], b[len(b)-1], c.first, c.atLeast, c.bucketsMax)
		}
		sub := 0
		for i, v := range b {
			if i > 0 && v <= b[i-1] {
				t.Errorf("%s: %v after %v, not increasing", c.name, v, b[i-1])
			}
			if i > 0 && b[i-1] > 0 && v/b[i-1] > c.widest+1e-9 {
				t.Errorf("%s: %v is %.2fx %v, want at most %vx", c.name, v, v/b[i-1], b[i-1], c.widest)
			}
			if v > 0 && v < 0.001 {
				sub++
			}
		}
		if sub != c.subMilli || (b[0] == 0) != c.bucketAt0 {
			t.Errorf("%s: %d sub-millisecond buckets, bucket at 0 %v; want %d, %v", c.name, sub, b[0] == 0, c.subMilli, c.bucketAt0)
		}
	}
	if got := ttftBuckets[:8]; !slices.Equal(got, []float64{0.001, 0.0015, 0.002, 0.003, 0.004, 0.006, 0.008, 0.01}) {
		t.Errorf("ttft buckets start %v: not rounded to the exact steps", got)
	}

	reg := prometheus.NewRegistry()
	m := New(reg)
	m.TTFT.WithLabelValues("m").Observe(0.05)
	m.Duration.WithLabelValues("m").Observe(0.05)
	m.PickDuration.Observe(1e-5)
	m.Tenant.SetTenants([]string{"t"})
	m.Tenant.Waited("t", 0)
	for _, mf := range mustGather(t, reg) {
		for _, s := range mf.GetMetric() {
			h := s.GetHistogram()
			if h == nil || h.GetSampleCount() == 0 {
				continue
			}
			if h.Schema == nil || len(h.GetBucket()) == 0 {
				t.Errorf("%s: schema %v, %d classic buckets: want both native and classic", mf.GetName(), h.Schema, len(h.GetBucket()))
			}
		}
	}
	// All waits 0: every quantile is 0, not an interpolation inside the first bucket.
	wait := mustGather(t, reg)
	for _, mf := range wait {
		if mf.GetName() == "kvroute_tenant_queue_wait_seconds" {
			b := mf.GetMetric()[0].GetHistogram().GetBucket()[0]
			if b.GetUpperBound() != 0 || b.GetCumulativeCount() != 1 {
				t.Errorf("queue wait of 0: first bucket le=%v holds %d, want le=0 holding 1", b.GetUpperBound(), b.GetCumulativeCount())
			}
		}
	}
}

// TestEjectionReasons: kvroute_endpoint_ejections_total tells the three reasons apart, each
// series there at 0 from when the endpoint joins, each counting its own ejections, while the
// ejected gauge and time stay one per endpoint; all of them go when the endpoint leaves.
func TestEjectionReasons(t *testing.T) {
	m, reg, clk := newTestMetrics()
	const ep = "http://127.0.0.1:1"
	m.EndpointAdded(ep, []string{"m"})
	ejections := func() map[string]float64 { return metricstest.Values(t, reg, "kvroute_endpoint_ejec") }
	want := map[string]float64{
		`kvroute_endpoint_ejections_total{endpoint=` + ep + `,reason=failures}`:      0,
		`kvroute_endpoint_ejections_total{endpoint=` + ep + `,reason=peer_failures}`: 0,
		`kvroute_endpoint_ejections_total{endpoint=` + ep + `,reason=refusals}`:      0,
		`kvroute_endpoint_ejected{endpoint=` + ep + `}`:                              0,
		`kvroute_endpoint_ejected_seconds_total{endpoint=` + ep + `}`:                0,
	}
	if diff := cmp.Diff(want, ejections()); diff != "" {
		t.Errorf("joined (-want +got):\n%s", diff)
	}
	m.EndpointEjected(ep, EjectRefusals, 10*time.Second)
	clk.add(20 * time.Second)
	m.EndpointEjected(ep, EjectPeerFailures, 10*time.Second)
	clk.add(20 * time.Second)
	m.EndpointEjected(ep, EjectPeerFailures, 0)
	clk.add(5 * time.Second)
	want[`kvroute_endpoint_ejections_total{endpoint=`+ep+`,reason=refusals}`] = 1
	want[`kvroute_endpoint_ejections_total{endpoint=`+ep+`,reason=peer_failures}`] = 2
	want[`kvroute_endpoint_ejected{endpoint=`+ep+`}`] = 1
	want[`kvroute_endpoint_ejected_seconds_total{endpoint=`+ep+`}`] = 25
	if diff := cmp.Diff(want, ejections()); diff != "" {
		t.Errorf("after one ejection for refusals and two for peers' failures (-want +got):\n%s", diff)
	}
	m.ForgetEndpoint(ep)
	if got := ejections(); len(got) != 0 {
		t.Errorf("after ForgetEndpoint: %v", got)
	}
}

// TestPromtool runs `promtool check metrics` on the exposition when promtool is installed
// (CI installs it with the Debian package prometheus).
func TestPromtool(t *testing.T) {
	path, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool not installed")
	}
	reg := prometheus.NewRegistry()
	m := populated(reg)
	const ep = "http://127.0.0.1:1"
	m.Requests.WithLabelValues("m", ep, "200").Inc()
	m.TTFT.WithLabelValues("m").Observe(0.1)
	m.Retries.WithLabelValues(ep, RetryConnectError).Inc()
	m.EndpointEjected(ep, EjectFailures, 0)
	rec := httptest.NewRecorder()
	promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	cmd := exec.Command(path, "check", "metrics")
	cmd.Stdin = rec.Body
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Errorf("promtool check metrics: %v\n%s", err, out)
	}
}

// TestNames: Names lists every family, including those read at scrape time.
func TestNames(t *testing.T) {
	names, err := Names()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"kvroute_requests_total", "kvroute_ttft_seconds", "kvroute_pick_duration_seconds",
		"kvroute_endpoint_ejected_seconds_total", "kvroute_endpoint_predicted_ttft_seconds", "kvroute_endpoint_prefill_rate_tokens_per_second",
		"kvroute_endpoint_engine_prefix_cache_hit_tokens_total", "kvroute_index_bytes", "kvroute_discovery_endpoints",
		"kvroute_tenant_queue_wait_seconds", "kvroute_model_load", "kvroute_endpoint_cache_value_tokens"} {
		if !slices.Contains(names, want) {
			t.Errorf("Names() lacks %s: %v", want, names)
		}
	}
	// As many names as New describes families: none is left without a series.
	reg := &countingRegisterer{Registerer: prometheus.NewRegistry()}
	New(reg)
	NewAutoscale(reg, 0)
	NewPeers(reg)
	if len(names) != reg.descs {
		t.Errorf("Names() gives %d names, New describes %d families", len(names), reg.descs)
	}
}

// countingRegisterer counts the descriptors of what is registered with it.
type countingRegisterer struct {
	prometheus.Registerer
	descs int
}

func (c *countingRegisterer) Register(col prometheus.Collector) error {
	ch := make(chan *prometheus.Desc)
	go func() { col.Describe(ch); close(ch) }()
	for range ch {
		c.descs++
	}
	return c.Registerer.Register(col)
}

func (c *countingRegisterer) MustRegister(cols ...prometheus.Collector) {
	for _, col := range cols {
		if err := c.Register(col); err != nil {
			panic(err)
		}
	}
}

// BenchmarkForgetEndpoints: 2,000 endpoints leave the pool at once (a discovery file emptied),
// forgotten one by one (as until 7 December 2026) or together.
func BenchmarkForgetEndpoints(b *testing.B) {
	const n = 2000
	names := make([]string, n)
	for i := range names {
		names[i] = "http://10.0.0.1:" + strconv.Itoa(8000+i)
	}
	for _, together := range []bool{false, true} {
		b.Run(fmt.Sprintf("together=%v", together), func(b *testing.B) {
			for b.Loop() {
				b.StopTimer()
				m := New(prometheus.NewRegistry())
				for _, name := range names {
					m.EndpointAdded(name, []string{"m"})
					m.Retries.WithLabelValues(name, RetryTimeout).Inc()
				}
				b.StartTimer()
				if together {
					m.ForgetEndpoints(names)
				} else {
					for _, name := range names {
						m.ForgetEndpoint(name)
					}
				}
			}
		})
	}
}

// TestForgetEndpointsTogether: endpoints forgotten together (in one pass over the series) lose
// exactly their series, and a model loses its own once no endpoint left serves it.
func TestForgetEndpointsTogether(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg)
	var gone []string
	for i := range 20 {
		name := "http://10.0.0.1:" + strconv.Itoa(8000+i)
		model := "shared"
		if i < 18 {
			gone = append(gone, name)
			if i == 0 {
				model = "only-gone"
			}
		}
		m.EndpointAdded(name, []string{model})
		m.Retries.WithLabelValues(name, RetryTimeout).Inc()
	}
	m.ForgetEndpoints(gone)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	kept := map[string]bool{}
	for _, f := range families {
		for _, s := range f.GetMetric() {
			for _, l := range s.GetLabel() {
				switch {
				case l.GetName() == "endpoint" && slices.Contains(gone, l.GetValue()):
					t.Errorf("%s: a forgotten endpoint's series %v", f.GetName(), s.GetLabel())
				case l.GetName() == "endpoint" && l.GetValue() != NoEndpoint:
					kept[l.GetValue()] = true
				case l.GetName() == "model" && l.GetValue() == "only-gone":
					t.Errorf("%s: the series of a model nobody serves %v", f.GetName(), s.GetLabel())
				}
			}
		}
	}
	if len(kept) != 2 {
		t.Errorf("endpoints left in the series: %v, want the 2 not forgotten", kept)
	}
}
