// Package metrics holds the router's Prometheus collectors, built by New from a Registerer:
// no package-level state, so tests and several routers in one process each get their own.
// Every name has the kvroute_ prefix and base units (seconds, tokens, bytes). Label values are
// bounded: models and endpoints come from the configuration (an unknown model is counted as
// "unknown"), or, for an endpoint whose config names no model, from its engine's list
// (MaxLearntModels at most, the rest "other"); statuses are HTTP codes.
//
// Counters and histograms exist at 0 before their first event: Prometheus cannot tell a
// series that appears at 1 from one that was always 1, so rate() and increase() would miss the
// first reload, refusal, retry or ejection. New makes the series of the router itself,
// EndpointAdded those of an endpoint and its models, EndpointServes those of the models an
// engine lists where the config names none, DiscoverySource those of a discovery source,
// TenantMetrics.SetTenants those of the tenants; ForgetEndpoint and SetTenants delete them
// again when the endpoint or tenant leaves, and what its requests still in flight count when
// they end is not counted, so that they stay deleted (live.go).
package metrics

import (
	"cmp"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/route"
	"github.com/kvroute/kvroute/internal/version"
)

// UnknownModel is the model label of requests for a model no endpoint serves.
const UnknownModel = "unknown"

// OtherModel is the model label of requests for a model that no endpoint lists but one that
// serves every model takes.
const OtherModel = "other"

// NoEndpoint is the endpoint label of requests that reached no endpoint.
const NoEndpoint = "none"

// Retry reasons of kvroute_retries_total: the names of the retryable route.Failure classes.
const (
	RetryConnectError = "connect_error"
	RetryUnavailable  = "unavailable"
	RetryBusy         = "busy"
	RetryTimeout      = "timeout"
	RetryLost         = "lost"
	RetryServerError  = "server_error"
	RetryNotServed    = "not_served"
)

// Ejection reasons of kvroute_endpoint_ejections_total: what decided passive health checking
// (route.Outlier) to take the endpoint out.
const (
	// EjectFailures: this router's own consecutive failures there (connection errors, 5xx,
	// timeouts, lost requests, cut streams) reached health.passive_failures.
	EjectFailures = "failures"
	// EjectPeerFailures: the engine's failures counted with those the other router replicas
	// saw (their events; failures to connect left out, which may be one replica's path alone)
	// reached health.passive_failures where this router's own had not; or a replica that
	// starts was told of a peer's ejection in progress for such failures.
	EjectPeerFailures = "peer_failures"
	// EjectRefusals: the refusal rule: the endpoint answered 4xx to far more of its requests
	// than the rest of the fleet did (health.refusal_percent).
	EjectRefusals = "refusals"
)

// EjectReasons lists them.
var EjectReasons = []string{EjectFailures, EjectPeerFailures, EjectRefusals}

// RetryReasons lists them: the failures that are always retried and those retried once per
// request (route.Failure.RetryableOnce).
var RetryReasons = []string{RetryConnectError, RetryUnavailable, RetryBusy, RetryTimeout, RetryLost, RetryServerError, RetryNotServed}

// MovedReasons are the reasons of kvroute_requests_moved_total: why a request's first
// endpoint was not the policy's pick (route.Call.Moved).
var MovedReasons = []string{route.MovedPin, route.MovedBackoff, route.MovedWarmUp, route.MovedCacheProbe, route.MovedRefused}

// Statuses made at 0 for every endpoint and model it serves: those whose first occurrence on
// an endpoint must show in rate() and increase(), the server errors and the 429 of a busy
// engine, relayed or made by the router (502 response unreadable, 504 no attempt answered in
// time). The others come at their first occurrence: 200 (a rate of successes loses one
// request of a new endpoint, nothing more), 400 (the engine refused the client's request),
// 499 (the client left) and whatever else an engine answers. With all eight at 0, 500
// endpoints listing 20 models made 80,168 series of kvroute_requests_total and a /metrics of
// 7.7 MB at idle; with these five, 50,168 and 5.2 MB.
var endpointStatuses = []string{"429", "500", "502", "503", "504"}

// Statuses made at 0 with endpoint "none" for every model label: the router's own answers
// when no endpoint was reached (400 bad body, 401 no or wrong key, 404 unknown model, 413 too
// large, 429 over a tenant limit, 499 client gone, 502 no endpoint reachable, 503 no healthy
// endpoint or overloaded).
var refusalStatuses = []string{"400", "401", "404", "413", "429", "499", "502", "503"}

// Histogram buckets. Classic buckets stay for every Prometheus and for the dashboard; native
// histograms (nativeFactor) give scrapers that negotiate them a resolution of about 10 %.
// docs/operations.md says why each range.
var (
	// TTFT: 1 ms (an idle engine with everything cached) to 60 s (a long prompt behind a
	// queue), neighbours at most 1.5x apart, so a quantile read between two buckets is off by
	// less than that factor.
	ttftBuckets = decades(0.001, 60, 1, 1.5, 2, 3, 4, 6, 8)
	// Request duration: 1 ms (a refusal, an instant engine) to 1000 s (a long generation),
	// neighbours at most 2x apart.
	e2eBuckets = decades(0.001, 1000, 1, 2, 3, 5)
	// Pick duration: 1 µs to 10 ms; a pick is microseconds.
	pickBuckets = []float64{1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 5e-3, 1e-2}
)

// Native histogram resolution: each bucket at most 10 % wider than the last (schema 3), at
// most 160 buckets per series before the resolution halves, reset at most hourly to regain it.
const (
	nativeFactor     = 1.1
	nativeMaxBuckets = 160
	nativeMinReset   = time.Hour
)

// decades returns steps x 10^k from lo up to hi (inclusive), for every decade in between.
func decades(lo, hi float64, steps ...float64) []float64 {
	var out []float64
	for d := lo; d <= hi; d *= 10 {
		for _, s := range steps {
			// Rounded to 12 significant digits so that 0.001*3 reads 0.003 in the exposition.
			v, _ := strconv.ParseFloat(strconv.FormatFloat(d*s, 'g', 12, 64), 64)
			if v <= hi {
				out = append(out, v)
			}
		}
	}
	return out
}

// histogramOpts is opts with the native histogram settings.
func histogramOpts(opts prometheus.HistogramOpts) prometheus.HistogramOpts {
	opts.NativeHistogramBucketFactor = nativeFactor
	opts.NativeHistogramMaxBucketNumber = nativeMaxBuckets
	opts.NativeHistogramMinResetDuration = nativeMinReset
	return opts
}

// Metrics are the router's collectors.
//
// The vectors with an endpoint or a model label are CounterVec and HistogramVec: an event of
// an endpoint that has left the fleet, or of a model no endpoint serves any more, is not
// counted (live.go), so that their series, once deleted, stay deleted.
type Metrics struct {
	Requests *CounterVec // model, endpoint, status
	// RequestErrors counts the requests settled with an error_type on their access line, by
	// that type and error_code (bounded: RequestError), on the endpoint and model that
	// kvroute_requests_total names: what its status alone cannot tell apart (a 502's bad
	// event, cut stream, error event or lost connection; a 499's client gone or stalled).
	// Count it with RequestError.
	RequestErrors    *CounterVec   // model, endpoint, error_type, error_code
	TTFT             *HistogramVec // model
	Duration         *HistogramVec // model
	PromptTokens     *CounterVec   // model
	CompletionTokens *CounterVec   // model
	PredictedCached  *CounterVec   // model
	EngineCached     *CounterVec   // model
	// CachedReported counts prompt tokens of requests whose engine reported cached_tokens, the
	// denominator of the engine hit rate (engines that never report it would skew it).
	CachedReported *CounterVec // model
	// EndpointPredictedCached is PredictedCached by endpoint, to set beside each engine's own
	// prefix-cache hits (scraped): the two should move together.
	EndpointPredictedCached *CounterVec // endpoint
	PickDuration            prometheus.Histogram
	Retries                 *CounterVec // endpoint, reason
	Moved                   *CounterVec // endpoint, reason
	Ejections               *CounterVec // endpoint, reason: count them with EndpointEjected
	// CacheBlind is 1 while an endpoint's engine reports far fewer cached tokens than the
	// router predicted (a silent zero hit: the router then routes there on load alone), and
	// CacheBlindEvents counts such verdicts. Set them with EndpointCacheBlind.
	CacheBlind       *prometheus.GaugeVec // endpoint
	CacheBlindEvents *CounterVec          // endpoint
	Rewrites         prometheus.Counter
	// Held and HeldSeconds count the requests held before picking (route.Lifecycle.Hold: as a
	// replica, placed once the peers' placements of the same moment are heard; with one router,
	// placed once the last step of the queue it would join has started) and the time held.
	Held        prometheus.Counter
	HeldSeconds prometheus.Counter
	// Reloads counts the config reloads by result; lastReloadOK and lastReloadAt say whether
	// the last one was applied, and when the last applied one was (reload.go).
	Reloads      *ReloadsVec // result
	lastReloadOK prometheus.Gauge
	lastReloadAt prometheus.Gauge
	// DiscoveryErrors counts failed discovery updates (a file that does not load, a name that
	// does not resolve); DiscoveredEndpoints is what each source gives now. source is "file" or
	// "dns:<name>", from the config: bounded.
	DiscoveryErrors     *prometheus.CounterVec // source
	DiscoveredEndpoints *prometheus.GaugeVec   // source
	// Tenant holds the per-tenant collectors, which the tenant gate updates.
	Tenant *TenantMetrics

	endpoints   atomic.Pointer[func() []*endpoint.Endpoint]
	index       atomic.Pointer[func() (int, int64)]
	prefillRate atomic.Pointer[func(*endpoint.Endpoint) float64]
	learnedKV   atomic.Pointer[func(*endpoint.Endpoint) int] // capacity.go
	now         func() time.Time
	// discarded is what CounterVec gives for an event that is not counted: never exported.
	discarded prometheus.Counter

	// mu is held alone to change the endpoints and their series, shared to count (live.go).
	mu sync.RWMutex
	// tracking: EndpointAdded has been called, and the endpoints counted are those in served.
	tracking bool
	served   map[string][]string  // endpoint -> the model labels its series were made for
	anyModel map[string]bool      // endpoints without a model list: they serve every model
	ejected  map[string]*ejection // endpoint -> its passive ejections
	// lists are the models the engines of endpoints without a model list say they serve
	// (EndpointServes), and learnt the labels made of them, MaxLearntModels at most (learnt.go).
	lists  map[string][]string
	learnt []string
	// labels is every model label with series, for ModelLabel; nil after a change.
	labels atomic.Pointer[map[string]bool]
}

// ejection is an endpoint's time out of rotation by passive health checking, whatever the reason.
type ejection struct {
	since time.Time     // start of the ejection in progress; zero when none
	until time.Time     // its planned end; zero: until EndpointReadmitted
	total time.Duration // ejections that have ended
}

// end is when e's ejection in progress ends as seen at now: its planned end once passed, now
// while it runs.
func (e *ejection) end(now time.Time) (time.Time, bool) {
	if !e.until.IsZero() && !now.Before(e.until) {
		return e.until, false
	}
	return now, true
}

// New builds the collectors, registers them with reg, and makes the router's own series (config
// reloads by result, refusals of unknown models) at 0.
func New(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Requests: byModelEndpoint(prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_requests_total", Help: "Requests answered, by model, endpoint (none when no endpoint was reached) and HTTP status.",
		}, []string{"model", "endpoint", "status"})),
		RequestErrors: byModelEndpoint(prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_request_errors_total", Help: "Requests answered with an error, by model, endpoint (as kvroute_requests_total names them), and the access line's error_type and error_code (stream_bad_event, stream_cut, stream_error, upstream_error with upstream_bad_answer or upstream_connection_lost, client_write_stall, service_unavailable_error with no_healthy_endpoint, overloaded or shutting_down...; other: an engine's own type or code).",
		}, []string{"model", "endpoint", "error_type", "error_code"})),
		TTFT: byModelH(prometheus.NewHistogramVec(histogramOpts(prometheus.HistogramOpts{
			Name: "kvroute_ttft_seconds", Help: "Time to first token of streamed requests, measured at the router from request arrival to the first event.",
			Buckets: ttftBuckets,
		}), []string{"model"})),
		Duration: byModelH(prometheus.NewHistogramVec(histogramOpts(prometheus.HistogramOpts{
			Name: "kvroute_request_duration_seconds", Help: "End-to-end request duration at the router.",
			Buckets: e2eBuckets,
		}), []string{"model"})),
		PromptTokens: byModel(prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_prompt_tokens_total", Help: "Prompt tokens routed (engine-reported, else the router's estimate).",
		}, []string{"model"})),
		CompletionTokens: byModel(prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_completion_tokens_total", Help: "Completion tokens reported by the engines.",
		}, []string{"model"})),
		PredictedCached: byModel(prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_predicted_cached_tokens_total", Help: "Prompt tokens the policy's index predicted the chosen endpoint had cached.",
		}, []string{"model"})),
		EngineCached: byModel(prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_engine_cached_tokens_total", Help: "Prompt tokens the engines reported as cached (usage.prompt_tokens_details.cached_tokens).",
		}, []string{"model"})),
		CachedReported: byModel(prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_cache_reported_prompt_tokens_total", Help: "Prompt tokens of requests whose engine reported cached tokens: the denominator of the engine hit rate.",
		}, []string{"model"})),
		EndpointPredictedCached: byEndpoint(prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_endpoint_predicted_cached_tokens_total", Help: "Prompt tokens the policy's index predicted the endpoint had cached, for the requests it answered.",
		}, []string{"endpoint"})),
		PickDuration: prometheus.NewHistogram(histogramOpts(prometheus.HistogramOpts{
			Name: "kvroute_pick_duration_seconds", Help: "Time the policy took to rank the candidates.",
			Buckets: pickBuckets,
		})),
		Retries: byEndpoint(prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_retries_total", Help: "Requests sent to the next ranked endpoint after a failure of this one, by reason (connect_error; unavailable: a 503; busy: a 429; timeout: no first token or answer in time; lost: the connection lost before any byte reached the client; server_error: a 500, 502 or 504; not_served: a 404, the engine does not serve the model). lost and server_error are retried once per request.",
		}, []string{"endpoint", "reason"})),
		Moved: byEndpoint(prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_requests_moved_total", Help: "Requests whose first endpoint was not the policy's pick, by that endpoint and why (pin: previous_response_id; backoff: the pick answered 429 or stalled; warm_up: the pick joined recently; cache_probe: a probe of this cache-blind endpoint).",
		}, []string{"endpoint", "reason"})),
		Ejections: byEndpoint(prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_endpoint_ejections_total", Help: "Passive ejections of an endpoint, by reason (failures: this router's own consecutive failures there, connection errors, 5xx, timeouts, lost requests, cut streams; peer_failures: the engine's consecutive failures counted with those the other router replicas saw, or a peer's ejection told to a replica that starts; refusals: it answered 4xx to far more of its requests than the rest of the fleet).",
		}, []string{"endpoint", "reason"})),
		CacheBlind: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kvroute_endpoint_cache_blind",
			Help: "1 while the engine reports far fewer cached tokens than the router predicted (a silent zero hit: wrong salt, tokenizer or block size, caching off); the router then routes there on load alone.",
		}, []string{"endpoint"}),
		CacheBlindEvents: byEndpoint(prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_endpoint_cache_blind_total",
			Help: "Times the engine's cache reports were found far below the router's predictions (kvroute_endpoint_cache_blind went to 1).",
		}, []string{"endpoint"})),
		Rewrites: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvroute_normalize_rewrites_total", Help: "Requests whose prompt was rewritten to its normalised form before forwarding.",
		}),
		Held: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvroute_replica_held_total", Help: "Requests held before picking: as one of several replicas, a sync delay or a few, to place them knowing what the peers placed at the same moment; with one router (prefix-aware), until the last prefill step of the queue they would join has started, so as not to share it.",
		}),
		HeldSeconds: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvroute_replica_held_seconds_total", Help: "Time requests were held before picking (kvroute_replica_held_total), in seconds; it counts in their time to first token.",
		}),
		Reloads: &ReloadsVec{CounterVec: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_config_reloads_total", Help: "Configuration reloads, by result (ok, error).",
		}, []string{"result"})},
		DiscoveryErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_discovery_errors_total", Help: "Failed discovery updates (a file that does not load, a DNS name that does not resolve), by source; the endpoints in force stay.",
		}, []string{"source"}),
		DiscoveredEndpoints: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kvroute_discovery_endpoints", Help: "Endpoints each discovery source gives now.",
		}, []string{"source"}),
		lastReloadOK: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvroute_config_last_reload_successful", Help: "1 when the last config reload was applied (or none was tried since start), 0 when it was rejected: the config file on disk then does not load, and a restart would fail with it.",
		}),
		lastReloadAt: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvroute_config_last_reload_success_timestamp_seconds", Help: "Time of the last config load that was applied (the start, or a reload), in seconds since the epoch.",
		}),
		Tenant:    NewTenantMetrics(reg),
		now:       time.Now,
		discarded: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvroute_discarded_total", Help: "Events not counted (never registered)."}),
		served:    map[string][]string{},
		anyModel:  map[string]bool{},
		ejected:   map[string]*ejection{},
		lists:     map[string][]string{},
	}
	for _, v := range []*CounterVec{m.Requests, m.RequestErrors, m.PromptTokens, m.CompletionTokens, m.PredictedCached, m.EngineCached,
		m.CachedReported, m.EndpointPredictedCached, m.Retries, m.Moved, m.Ejections, m.CacheBlindEvents} {
		v.m = m
	}
	m.TTFT.m, m.Duration.m, m.Reloads.m = m, m, m
	build := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "kvroute_build_info", Help: "Always 1: the build of kvroute running, by version, VCS revision and Go toolchain (as kvroute version prints them).",
	}, []string{"version", "revision", "goversion"})
	reg.MustRegister(m.Requests, m.RequestErrors, m.TTFT, m.Duration, m.PromptTokens, m.CompletionTokens,
		m.PredictedCached, m.EngineCached, m.CachedReported, m.EndpointPredictedCached, m.PickDuration,
		m.Retries, m.Moved, m.Ejections, m.CacheBlind, m.CacheBlindEvents, m.Rewrites, m.Held, m.HeldSeconds, m.Reloads,
		m.lastReloadOK, m.lastReloadAt, build, m.DiscoveryErrors, m.DiscoveredEndpoints, (*stateCollector)(m))
	m.Reloads.WithLabelValues("ok")
	m.Reloads.WithLabelValues("error")
	// New is built with the config the router starts with: that load is the last applied.
	m.reloaded(true)
	v := version.Get()
	build.WithLabelValues(v.Version, v.Revision, cmp.Or(v.GoVersion, version.Unknown)).Set(1)
	m.modelSeries(UnknownModel)
	return m
}

// byModel, byEndpoint and byModelEndpoint make v a CounterVec whose first label is the model
// or the endpoint, or whose first two are both; byModelH makes a HistogramVec of v, whose first
// label is the model. New sets their Metrics.
func byModel(v *prometheus.CounterVec) *CounterVec {
	return &CounterVec{CounterVec: v, model: 0, endpoint: noLabel}
}

func byEndpoint(v *prometheus.CounterVec) *CounterVec {
	return &CounterVec{CounterVec: v, model: noLabel, endpoint: 0}
}

func byModelEndpoint(v *prometheus.CounterVec) *CounterVec {
	return &CounterVec{CounterVec: v, model: 0, endpoint: 1}
}

func byModelH(v *prometheus.HistogramVec) *HistogramVec {
	return &HistogramVec{HistogramVec: v, model: 0}
}

// WatchEndpoints sets the function the per-endpoint gauges (in flight, pending prefill,
// health, snapshot age, the engine's scraped load and cache) read at scrape time, so they
// never go stale when endpoints leave.
func (m *Metrics) WatchEndpoints(f func() []*endpoint.Endpoint) { m.endpoints.Store(&f) }

// WatchIndex sets the function the index gauges (entries, bytes) read at scrape time.
func (m *Metrics) WatchIndex(f func() (entries int, bytes int64)) { m.index.Store(&f) }

// WatchPrefillRate sets the function that gives an endpoint's prefill rate in tokens per
// second (0: unknown), read at scrape time for kvroute_endpoint_predicted_ttft_seconds. The
// prefix-aware policy's PrefillRate fits; unset, that gauge is not exported.
func (m *Metrics) WatchPrefillRate(f func(*endpoint.Endpoint) float64) { m.prefillRate.Store(&f) }

// Status formats an HTTP status code as a label value.
func Status(code int) string { return strconv.Itoa(code) }

// EndpointAdded makes the series of an endpoint that joined the pool at 0: its requests by
// status for each model it serves (and the router's refusals of those models), its retries,
// moves and ejections by reason, its ejected time and predicted cached tokens, and the per-model series of its models.
// models are the endpoint's model list; empty means it serves every model, and its series are
// made for OtherModel and every model another endpoint lists, now or when one is added later.
// Calling it again for an endpoint re-added with a new spec ends an ejection in progress: the
// new endpoint starts healthy.
func (m *Metrics) EndpointAdded(name string, models []string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.tracking = true
	old := m.served[name]
	m.served[name] = nil
	if len(models) == 0 {
		m.anyModel[name] = true
		labels := []string{OtherModel}
		for _, ls := range m.served {
			labels = append(labels, ls...)
		}
		slices.Sort(labels)
		m.serveLocked(name, slices.Compact(labels))
	} else {
		delete(m.anyModel, name)
		delete(m.lists, name) // its engine's list no longer decides anything
		m.serveLocked(name, models)
		for e := range m.anyModel { // they serve these models too
			m.serveLocked(e, models)
		}
	}
	if len(m.lists) > 0 || len(m.learnt) > 0 {
		// A configured model frees a learnt label's place; an endpoint re-added without a
		// model list keeps what its engine listed, and only that.
		m.syncLearntLocked(name)
	}
	m.labels.Store(nil)
	// Re-added with another model list: the models it no longer serves lose its series.
	old = slices.DeleteFunc(old, func(model string) bool { return slices.Contains(m.served[name], model) })
	for _, model := range old {
		m.Requests.DeletePartialMatch(prometheus.Labels{"model": model, "endpoint": name})
		m.RequestErrors.DeletePartialMatch(prometheus.Labels{"model": model, "endpoint": name})
	}
	m.dropModelsLocked(old)
	// m.mu is held: the vectors' own WithLabelValues, which take it, would wait for good.
	for _, r := range RetryReasons {
		m.Retries.CounterVec.WithLabelValues(name, r)
	}
	for _, r := range MovedReasons {
		m.Moved.CounterVec.WithLabelValues(name, r)
	}
	for _, r := range EjectReasons {
		m.Ejections.CounterVec.WithLabelValues(name, r)
	}
	m.CacheBlind.WithLabelValues(name)
	m.CacheBlindEvents.CounterVec.WithLabelValues(name)
	m.EndpointPredictedCached.CounterVec.WithLabelValues(name)
	if e := m.ejected[name]; e != nil {
		m.endEjectionLocked(e)
	} else {
		m.ejected[name] = &ejection{}
	}
}

// serveLocked records that endpoint serves models and makes their series at 0.
func (m *Metrics) serveLocked(endpoint string, models []string) {
	for _, model := range models {
		if slices.Contains(m.served[endpoint], model) {
			continue
		}
		m.served[endpoint] = append(m.served[endpoint], model)
		m.modelSeries(model)
		for _, s := range endpointStatuses {
			m.Requests.CounterVec.WithLabelValues(model, endpoint, s)
		}
		for _, e := range endpointErrors {
			m.RequestErrors.CounterVec.WithLabelValues(model, endpoint, e.Type, e.Code)
		}
	}
}

// modelSeries makes the per-model series of model at 0, with the refusals of its requests.
// UnknownModel gets only the refusals and the duration: nothing is forwarded for it. It
// makes them through the vectors' own prometheus methods: the caller may hold m.mu.
func (m *Metrics) modelSeries(model string) {
	for _, s := range refusalStatuses {
		m.Requests.CounterVec.WithLabelValues(model, NoEndpoint, s)
	}
	for _, e := range refusalErrors {
		m.RequestErrors.CounterVec.WithLabelValues(model, NoEndpoint, e.Type, e.Code)
	}
	m.Duration.HistogramVec.WithLabelValues(model)
	if model == UnknownModel {
		return
	}
	m.TTFT.HistogramVec.WithLabelValues(model)
	for _, c := range []*CounterVec{m.PromptTokens, m.CompletionTokens, m.PredictedCached, m.EngineCached, m.CachedReported} {
		c.CounterVec.WithLabelValues(model)
	}
}

// ForgetEndpoint deletes the series of an endpoint that left the pool, and the per-model
// series of models no endpoint serves any more, so the label set stays bounded through
// reloads.
func (m *Metrics) ForgetEndpoint(name string) { m.ForgetEndpoints([]string{name}) }

// ForgetEndpoints is ForgetEndpoint for several endpoints at once. A few are deleted one by one
// (DeletePartialMatch scans every series of a metric for each); more, in one pass over each
// metric's series (reading each series costs more than its scan, but once): one by one,
// removing N endpoints cost N times the series of all of them, 18 s for 4,000 (a discovery
// file emptied, a Service scaled down). BenchmarkForgetEndpoints: 2,000 at once, 5.4 s one by
// one, 0.11 s in one pass.
func (m *Metrics) ForgetEndpoints(names []string) {
	if len(names) == 0 {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	set := make(map[string]bool, len(names))
	var gone []string
	for _, name := range names {
		set[name] = true
		for _, model := range m.served[name] {
			if !slices.Contains(gone, model) {
				gone = append(gone, model)
			}
		}
		delete(m.served, name)
		delete(m.anyModel, name)
		delete(m.ejected, name)
		delete(m.lists, name)
	}
	for _, v := range []deleter{m.Requests, m.RequestErrors, m.Retries, m.Moved, m.Ejections, m.CacheBlind, m.CacheBlindEvents, m.EndpointPredictedCached} {
		deleteWhere(v, "endpoint", set)
	}
	m.dropModelsLocked(gone)
	if len(m.lists) > 0 || len(m.learnt) > 0 {
		m.syncLearntLocked("") // a model only they listed goes from the others too
	}
	m.labels.Store(nil)
}

// onePassFrom is how many values deleteWhere deletes in one pass over the series rather than
// one DeletePartialMatch each (measured: a pass costs about as much as 20 scans).
const onePassFrom = 16

// dropModelsLocked deletes the per-model series of those of models that no endpoint serves
// any more (UnknownModel's stay: New made them).
func (m *Metrics) dropModelsLocked(models []string) {
	served := map[string]bool{UnknownModel: true}
	for _, ls := range m.served {
		for _, model := range ls {
			served[model] = true
		}
	}
	drop := map[string]bool{}
	for _, model := range models {
		if !served[model] {
			drop[model] = true
		}
	}
	if len(drop) == 0 {
		return
	}
	for _, v := range []deleter{m.Requests, m.RequestErrors, m.TTFT, m.Duration, m.PromptTokens, m.CompletionTokens, m.PredictedCached, m.EngineCached, m.CachedReported} {
		deleteWhere(v, "model", drop)
	}
}

// deleter is a metric vector: its series, and deletion by their labels.
type deleter interface {
	prometheus.Collector
	Delete(prometheus.Labels) bool
	DeletePartialMatch(prometheus.Labels) int
}

// deleteWhere deletes the series of v whose label is one of values: for a few values, one
// DeletePartialMatch each; for more, reading v's series once.
func deleteWhere(v deleter, label string, values map[string]bool) {
	if len(values) < onePassFrom {
		for value := range values {
			v.DeletePartialMatch(prometheus.Labels{label: value})
		}
		return
	}
	ch := make(chan prometheus.Metric, 64)
	go func() {
		v.Collect(ch)
		close(ch)
	}()
	var doomed []prometheus.Labels
	for s := range ch {
		var pb dto.Metric
		if s.Write(&pb) != nil {
			continue
		}
		ls := make(prometheus.Labels, len(pb.GetLabel()))
		for _, lp := range pb.GetLabel() {
			ls[lp.GetName()] = lp.GetValue()
		}
		if values[ls[label]] {
			doomed = append(doomed, ls)
		}
	}
	for _, ls := range doomed {
		v.Delete(ls)
	}
}

// DiscoverySource makes the series of a discovery source ("file", "dns:<name>") at 0.
func (m *Metrics) DiscoverySource(source string) {
	m.DiscoveryErrors.WithLabelValues(source)
	m.DiscoveredEndpoints.WithLabelValues(source)
}

// EndpointEjected counts a passive ejection of the endpoint for reason (one of EjectReasons)
// and starts its ejected time, which runs for d (0: until EndpointReadmitted), or until
// EndpointReadmitted if that comes first. It is the only way kvroute_endpoint_ejections_total
// should be counted. An ejection of an endpoint that has left the fleet (it came late) is not.
// The ejected time and kvroute_endpoint_ejected are the endpoint's, whatever the reason: an
// ejection that continues another (a longer one, for another reason) is one time out.
func (m *Metrics) EndpointEjected(name, reason string, d time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.endpointLiveLocked(name) {
		return
	}
	m.Ejections.CounterVec.WithLabelValues(name, reason).Inc()
	e := m.ejected[name]
	if e == nil {
		e = &ejection{}
		m.ejected[name] = e
	}
	now := m.now()
	if !e.since.IsZero() {
		if _, running := e.end(now); running {
			if d > 0 && !e.until.IsZero() {
				e.until = now.Add(d) // a longer ejection continues this one
			}
			return
		}
		m.endEjectionLocked(e)
	}
	e.since, e.until = now, time.Time{}
	if d > 0 {
		e.until = now.Add(d)
	}
}

// EndpointReadmitted ends the endpoint's ejection in progress, if any: call it whenever the
// endpoint is healthy again (a passing health check).
func (m *Metrics) EndpointReadmitted(name string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e := m.ejected[name]; e != nil {
		m.endEjectionLocked(e)
	}
}

func (m *Metrics) endEjectionLocked(e *ejection) {
	if !e.since.IsZero() {
		end, _ := e.end(m.now())
		e.total += max(0, end.Sub(e.since))
		e.since, e.until = time.Time{}, time.Time{}
	}
}

// EndpointCacheBlind records the cache audit's verdict on the endpoint (see
// kvroute_endpoint_cache_blind); one on an endpoint that has left the fleet is not recorded.
func (m *Metrics) EndpointCacheBlind(name string, blind bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if !m.endpointLiveLocked(name) {
		return
	}
	v := 0.0
	if blind {
		v = 1
		m.CacheBlindEvents.CounterVec.WithLabelValues(name).Inc()
	}
	m.CacheBlind.WithLabelValues(name).Set(v)
}

// PredictedCachedTokens counts the cached tokens the policy predicted on the endpoint that
// answered a request of model (n < 0: no prediction, nothing counted).
func (m *Metrics) PredictedCachedTokens(model, endpoint string, n int) {
	if n < 0 {
		return
	}
	m.PredictedCached.WithLabelValues(model).Add(float64(n))
	if endpoint != NoEndpoint {
		m.EndpointPredictedCached.WithLabelValues(endpoint).Add(float64(n))
	}
}

var (
	descInFlight = prometheus.NewDesc("kvroute_endpoint_in_flight_requests",
		"Requests forwarded to the endpoint and not finished.", []string{"endpoint"}, nil)
	descPending = prometheus.NewDesc("kvroute_endpoint_pending_prefill_tokens",
		"Prompt tokens forwarded to the endpoint that have not reached their first token.", []string{"endpoint"}, nil)
	descHealthy = prometheus.NewDesc("kvroute_endpoint_healthy",
		"1 when the endpoint passes its health checks, else 0. An endpoint ejected for failed requests keeps its health here: kvroute_endpoint_ejected says so.", []string{"endpoint"}, nil)
	descAge = prometheus.NewDesc("kvroute_endpoint_snapshot_age_seconds",
		"Age of the endpoint's last scraped engine metrics.", []string{"endpoint"}, nil)
	descLastAnswer = prometheus.NewDesc("kvroute_endpoint_last_answer_age_seconds",
		"Time since the engine last answered anything: a first token, a stream's event or a complete answer (seen by this router or a peer replica), or more work in its scraped token counters. Absent until it has; with requests in flight, a growing value is a stalled engine (limits.stall_timeout).", []string{"endpoint"}, nil)
	descStalled = prometheus.NewDesc("kvroute_endpoint_stalled",
		"1 while a stall watch, this router's or a peer replica's, has found the engine stalled (it held a stream without its first token for limits.stall_timeout or longer, and answered nothing at all meanwhile) and it has not answered since, else 0: it goes after the other endpoints, but for a request every 30 s (one for all replicas that share their events).", []string{"endpoint"}, nil)
	descKV = prometheus.NewDesc("kvroute_endpoint_kv_capacity_tokens",
		"The endpoint's KV-cache capacity in tokens (scraped cache_config_info, else configured; 0 unknown).", []string{"endpoint"}, nil)
	descPrefillRate = prometheus.NewDesc("kvroute_endpoint_prefill_rate_tokens_per_second",
		"The endpoint's prefill rate as the policy has calibrated it, in the router's tokens per second (prefix-aware: from the first tokens it sees, and where answers come whole from the engines' scraped TTFT histograms); absent with a policy that has none.", []string{"endpoint"}, nil)
	descPredictedTTFT = prometheus.NewDesc("kvroute_endpoint_predicted_ttft_seconds",
		"Prefill work the router has queued on the endpoint over its calibrated prefill rate: the least time to first token a new request there would wait.", []string{"endpoint"}, nil)
	descEjected = prometheus.NewDesc("kvroute_endpoint_ejected",
		"1 while the endpoint is ejected after consecutive failures (outlier detection: health.passive_failures, for health.ejection_time or longer), else 0.", []string{"endpoint"}, nil)
	descEjectedSeconds = prometheus.NewDesc("kvroute_endpoint_ejected_seconds_total",
		"Time the endpoint has spent ejected after consecutive failures (outlier detection), the ejection in progress included: rate() is the share of time out of rotation.", []string{"endpoint"}, nil)
	descEngineRunning = prometheus.NewDesc("kvroute_endpoint_engine_running_requests",
		"Requests in the engine's running batch, as last scraped from the engine.", []string{"endpoint"}, nil)
	descEngineWaiting = prometheus.NewDesc("kvroute_endpoint_engine_waiting_requests",
		"Requests waiting in the engine's queue, as last scraped from the engine.", []string{"endpoint"}, nil)
	descEngineKVUsage = prometheus.NewDesc("kvroute_endpoint_engine_kv_usage_ratio",
		"Share of the engine's KV cache in use (0 to 1), as last scraped from the engine.", []string{"endpoint"}, nil)
	descEngineQueries = prometheus.NewDesc("kvroute_endpoint_engine_prefix_cache_query_tokens_total",
		"Prompt tokens the engine looked up in its prefix cache (vLLM prefix_cache_queries, SGLang prompt tokens), as last scraped.", []string{"endpoint"}, nil)
	descEngineHits = prometheus.NewDesc("kvroute_endpoint_engine_prefix_cache_hit_tokens_total",
		"Prompt tokens the engine found in its prefix cache (vLLM prefix_cache_hits, SGLang cached tokens), as last scraped.", []string{"endpoint"}, nil)
	descEntries = prometheus.NewDesc("kvroute_index_entries",
		"Entries (block, endpoint) in the policy's prefix index.", nil, nil)
	descBytes = prometheus.NewDesc("kvroute_index_bytes",
		"Approximate memory of the policy's prefix index.", nil, nil)
)

// stateCollector reads endpoint and index state at scrape time.
type stateCollector Metrics

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descInFlight, descPending, descHealthy, descAge, descLastAnswer, descStalled, descKV, descPrefillRate, descPredictedTTFT,
		descEjected, descEjectedSeconds, descEngineRunning, descEngineWaiting, descEngineKVUsage, descEngineQueries,
		descEngineHits, descEntries, descBytes, descLearnedKV} {
		ch <- d
	}
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	now := c.now()
	gauge := func(d *prometheus.Desc, v float64, name string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, name)
	}
	if f := c.endpoints.Load(); f != nil {
		var rate func(*endpoint.Endpoint) float64
		if r := c.prefillRate.Load(); r != nil {
			rate = *r
		}
		for _, e := range (*f)() {
			gauge(descInFlight, float64(e.InFlight()), e.Name)
			gauge(descPending, float64(e.PendingPrefill()), e.Name)
			h := 0.0
			if e.Healthy() {
				h = 1
			}
			gauge(descHealthy, h, e.Name)
			gauge(descKV, float64(e.KVTokens()), e.Name)
			if f := c.learnedKV.Load(); f != nil && e.KVTokens() == 0 {
				if v := (*f)(e); v > 0 {
					gauge(descLearnedKV, float64(v), e.Name)
				}
			}
			if rate != nil {
				if r := rate(e); r > 0 {
					gauge(descPrefillRate, r, e.Name)
					gauge(descPredictedTTFT, float64(e.PendingPrefill())/r, e.Name)
				}
			}
			if at := e.LastProgress(); at > 0 {
				gauge(descLastAnswer, max(0, now.Sub(time.Unix(0, at)).Seconds()), e.Name)
			}
			stalled := 0.0
			if e.StalledSince() > 0 {
				stalled = 1
			}
			gauge(descStalled, stalled, e.Name)
			if s := e.Snapshot(); s != nil && !s.At.IsZero() {
				gauge(descAge, now.Sub(s.At).Seconds(), e.Name)
				gauge(descEngineRunning, float64(s.Running), e.Name)
				gauge(descEngineWaiting, float64(s.Waiting), e.Name)
				gauge(descEngineKVUsage, s.KVUsage, e.Name)
				ch <- prometheus.MustNewConstMetric(descEngineQueries, prometheus.CounterValue, s.PrefixQueries, e.Name)
				ch <- prometheus.MustNewConstMetric(descEngineHits, prometheus.CounterValue, s.PrefixHits, e.Name)
			}
		}
	}
	c.mu.RLock()
	for name, e := range c.ejected {
		on, total := 0.0, e.total
		if !e.since.IsZero() {
			end, running := e.end(now)
			total += max(0, end.Sub(e.since))
			if running {
				on = 1
			}
		}
		gauge(descEjected, on, name)
		ch <- prometheus.MustNewConstMetric(descEjectedSeconds, prometheus.CounterValue, total.Seconds(), name)
	}
	c.mu.RUnlock()
	if f := c.index.Load(); f != nil {
		n, b := (*f)()
		ch <- prometheus.MustNewConstMetric(descEntries, prometheus.GaugeValue, float64(n))
		ch <- prometheus.MustNewConstMetric(descBytes, prometheus.GaugeValue, float64(b))
	}
}
