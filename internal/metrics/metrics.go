// Package metrics holds the router's Prometheus collectors, built by New from a Registerer:
// no package-level state, so tests and several routers in one process each get their own.
// Every name has the kvroute_ prefix and base units (seconds, tokens, bytes). Label values are
// bounded: models and endpoints come from the configuration (an unknown model is counted as
// "unknown"), statuses are HTTP codes.
package metrics

import (
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/internal/endpoint"
)

// UnknownModel is the model label of requests for a model no endpoint serves.
const UnknownModel = "unknown"

// NoEndpoint is the endpoint label of requests that reached no endpoint.
const NoEndpoint = "none"

// TTFT buckets cover 1 ms to 160 s, like vLLM's time_to_first_token_seconds.
var ttftBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80, 160}

var e2eBuckets = []float64{0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 60, 120, 240, 480, 960}

var pickBuckets = []float64{1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 5e-3, 1e-2}

// Metrics are the router's collectors.
type Metrics struct {
	Requests         *prometheus.CounterVec   // model, endpoint, status
	TTFT             *prometheus.HistogramVec // model
	Duration         *prometheus.HistogramVec // model
	PromptTokens     *prometheus.CounterVec   // model
	CompletionTokens *prometheus.CounterVec   // model
	PredictedCached  *prometheus.CounterVec   // model
	EngineCached     *prometheus.CounterVec   // model
	// CachedReported counts prompt tokens of requests whose engine reported cached_tokens, the
	// denominator of the engine hit rate (engines that never report it would skew it).
	CachedReported *prometheus.CounterVec // model
	PickDuration   prometheus.Histogram
	Retries        *prometheus.CounterVec // endpoint, reason
	Ejections      *prometheus.CounterVec // endpoint
	Rewrites       prometheus.Counter
	Reloads        *prometheus.CounterVec // result
	// DiscoveryErrors counts failed discovery updates (a file that does not load, a name that
	// does not resolve); DiscoveredEndpoints is what each source gives now. source is "file" or
	// "dns:<name>", from the config: bounded.
	DiscoveryErrors     *prometheus.CounterVec // source
	DiscoveredEndpoints *prometheus.GaugeVec   // source
	// Tenant holds the per-tenant collectors, which the tenant gate updates.
	Tenant *TenantMetrics

	endpoints atomic.Pointer[func() []*endpoint.Endpoint]
	index     atomic.Pointer[func() (int, int64)]
	now       func() time.Time
}

// New builds the collectors and registers them with reg.
func New(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_requests_total", Help: "Requests answered, by model, endpoint (none when no endpoint was reached) and HTTP status.",
		}, []string{"model", "endpoint", "status"}),
		TTFT: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "kvroute_ttft_seconds", Help: "Time to first token of streamed requests, measured at the router from request arrival to the first event.",
			Buckets: ttftBuckets,
		}, []string{"model"}),
		Duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "kvroute_request_duration_seconds", Help: "End-to-end request duration at the router.",
			Buckets: e2eBuckets,
		}, []string{"model"}),
		PromptTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_prompt_tokens_total", Help: "Prompt tokens routed (engine-reported, else the router's estimate).",
		}, []string{"model"}),
		CompletionTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_completion_tokens_total", Help: "Completion tokens reported by the engines.",
		}, []string{"model"}),
		PredictedCached: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_predicted_cached_tokens_total", Help: "Prompt tokens the policy's index predicted the chosen endpoint had cached.",
		}, []string{"model"}),
		EngineCached: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_engine_cached_tokens_total", Help: "Prompt tokens the engines reported as cached (usage.prompt_tokens_details.cached_tokens).",
		}, []string{"model"}),
		CachedReported: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_cache_reported_prompt_tokens_total", Help: "Prompt tokens of requests whose engine reported cached tokens: the denominator of the engine hit rate.",
		}, []string{"model"}),
		PickDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "kvroute_pick_duration_seconds", Help: "Time the policy took to rank the candidates.",
			Buckets: pickBuckets,
		}),
		Retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_retries_total", Help: "Requests sent to the next ranked endpoint after a failure of this one, by reason (connect_error, unavailable).",
		}, []string{"endpoint", "reason"}),
		Ejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_endpoint_ejections_total", Help: "Passive ejections of an endpoint after consecutive connection errors.",
		}, []string{"endpoint"}),
		Rewrites: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvroute_normalize_rewrites_total", Help: "Requests whose prompt was rewritten to its normalised form before forwarding.",
		}),
		Reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_config_reloads_total", Help: "Configuration reloads, by result (ok, error).",
		}, []string{"result"}),
		DiscoveryErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_discovery_errors_total", Help: "Failed discovery updates (a file that does not load, a DNS name that does not resolve), by source; the endpoints in force stay.",
		}, []string{"source"}),
		DiscoveredEndpoints: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kvroute_discovery_endpoints", Help: "Endpoints each discovery source gives now.",
		}, []string{"source"}),
		Tenant: NewTenantMetrics(reg),
		now:    time.Now,
	}
	reg.MustRegister(m.Requests, m.TTFT, m.Duration, m.PromptTokens, m.CompletionTokens,
		m.PredictedCached, m.EngineCached, m.CachedReported, m.PickDuration, m.Retries,
		m.Ejections, m.Rewrites, m.Reloads, m.DiscoveryErrors, m.DiscoveredEndpoints, (*stateCollector)(m))
	return m
}

// WatchEndpoints sets the function the per-endpoint gauges (in flight, pending prefill,
// health, snapshot age) read at scrape time, so they never go stale when endpoints leave.
func (m *Metrics) WatchEndpoints(f func() []*endpoint.Endpoint) { m.endpoints.Store(&f) }

// WatchIndex sets the function the index gauges (entries, bytes) read at scrape time.
func (m *Metrics) WatchIndex(f func() (entries int, bytes int64)) { m.index.Store(&f) }

// Status formats an HTTP status code as a label value.
func Status(code int) string { return strconv.Itoa(code) }

// ForgetEndpoint deletes the series of an endpoint that left the pool, so the label set stays
// bounded through reloads.
func (m *Metrics) ForgetEndpoint(name string) {
	m.Requests.DeletePartialMatch(prometheus.Labels{"endpoint": name})
	m.Retries.DeletePartialMatch(prometheus.Labels{"endpoint": name})
	m.Ejections.DeletePartialMatch(prometheus.Labels{"endpoint": name})
}

var (
	descInFlight = prometheus.NewDesc("kvroute_endpoint_in_flight_requests",
		"Requests forwarded to the endpoint and not finished.", []string{"endpoint"}, nil)
	descPending = prometheus.NewDesc("kvroute_endpoint_pending_prefill_tokens",
		"Prompt tokens forwarded to the endpoint that have not reached their first token.", []string{"endpoint"}, nil)
	descHealthy = prometheus.NewDesc("kvroute_endpoint_healthy",
		"1 when the endpoint passes health checks and is not ejected, else 0.", []string{"endpoint"}, nil)
	descAge = prometheus.NewDesc("kvroute_endpoint_snapshot_age_seconds",
		"Age of the endpoint's last scraped engine metrics.", []string{"endpoint"}, nil)
	descKV = prometheus.NewDesc("kvroute_endpoint_kv_capacity_tokens",
		"The endpoint's KV-cache capacity in tokens (scraped cache_config_info, else configured; 0 unknown).", []string{"endpoint"}, nil)
	descEntries = prometheus.NewDesc("kvroute_index_entries",
		"Entries (block, endpoint) in the policy's prefix index.", nil, nil)
	descBytes = prometheus.NewDesc("kvroute_index_bytes",
		"Approximate memory of the policy's prefix index.", nil, nil)
)

// stateCollector reads endpoint and index state at scrape time.
type stateCollector Metrics

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descInFlight, descPending, descHealthy, descAge, descKV, descEntries, descBytes} {
		ch <- d
	}
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	if f := c.endpoints.Load(); f != nil {
		now := c.now()
		for _, e := range (*f)() {
			ch <- prometheus.MustNewConstMetric(descInFlight, prometheus.GaugeValue, float64(e.InFlight()), e.Name)
			ch <- prometheus.MustNewConstMetric(descPending, prometheus.GaugeValue, float64(e.PendingPrefill()), e.Name)
			h := 0.0
			if e.Healthy() {
				h = 1
			}
			ch <- prometheus.MustNewConstMetric(descHealthy, prometheus.GaugeValue, h, e.Name)
			ch <- prometheus.MustNewConstMetric(descKV, prometheus.GaugeValue, float64(e.KVTokens()), e.Name)
			if s := e.Snapshot(); s != nil && !s.At.IsZero() {
				ch <- prometheus.MustNewConstMetric(descAge, prometheus.GaugeValue, now.Sub(s.At).Seconds(), e.Name)
			}
		}
	}
	if f := c.index.Load(); f != nil {
		n, b := (*f)()
		ch <- prometheus.MustNewConstMetric(descEntries, prometheus.GaugeValue, float64(n))
		ch <- prometheus.MustNewConstMetric(descBytes, prometheus.GaugeValue, float64(b))
	}
}
