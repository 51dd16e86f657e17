package metrics

import (
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Unauthenticated is the tenant label of requests refused for a missing or unknown API key.
// Configured tenant names are 1-64 characters, so the empty value never collides with one.
const Unauthenticated = ""

// Queue-wait buckets: a bucket at 0 for the requests that did not wait (most of them: a
// quantile over them reads 0, not an interpolation inside the first bucket), sub-millisecond
// steps for a queue that drains at once, then up to a few times the default overload.max_wait
// (30 s).
var queueWaitBuckets = []float64{0, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120}

// Series made at 0 for every configured tenant: the statuses its requests may be answered
// with, and the reasons the gate may refuse them for (the error code, or which rate limit).
var (
	tenantStatuses = []string{"200", "400", "404", "408", "413", "429", "431", "499", "500", "502", "503", "504"}
	tenantReasons  = []string{"requests_per_minute", "tokens_per_minute", "request_too_large", "concurrency_limit_exceeded", "overloaded", "client_gone", "max_output_tokens", "request_bodies"}
)

// Series made at 0 for Unauthenticated while authentication is on: 401 for a missing or wrong
// key, 400 for a request with more than one.
var (
	unauthenticatedStatuses = []string{"400", "401"}
	unauthenticatedReasons  = []string{"missing_api_key", "invalid_api_key", "multiple_api_keys"}
)

// TenantMetrics are the per-tenant collectors of the tenant gate. The tenant label takes only
// the configured names (and Unauthenticated): SetTenants, called with each config, deletes
// the series of tenants that left it, and requests of a tenant that is no longer configured
// (still in flight across a reload) are not counted, so a removed tenant's series do not come
// back. The methods are safe on a nil *TenantMetrics (they do nothing).
type TenantMetrics struct {
	Requests         *prometheus.CounterVec   // tenant, status
	Rejections       *prometheus.CounterVec   // tenant, reason
	QueueWait        *prometheus.HistogramVec // tenant
	PromptTokens     *prometheus.CounterVec   // tenant
	CompletionTokens *prometheus.CounterVec   // tenant
	load             tenantLoad               // in flight, queued (tenantload.go)

	// mu orders counting (read side) against SetTenants' deletions (write side), so that a
	// count of a tenant being removed lands before its series are deleted or not at all.
	mu   sync.RWMutex
	live map[string]bool
}

// NewTenantMetrics builds the per-tenant collectors and registers them with reg. No tenant
// is counted until SetTenants names it (Unauthenticated always is).
func NewTenantMetrics(reg prometheus.Registerer) *TenantMetrics {
	m := &TenantMetrics{
		Requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_tenant_requests_total",
			Help: "Requests answered by tenant (empty: refused for a missing or unknown API key) and HTTP status; authentication on only.",
		}, []string{"tenant", "status"}),
		Rejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_tenant_rejections_total",
			Help: "Requests refused by the tenant gate, by tenant and reason (the error code answered).",
		}, []string{"tenant", "reason"}),
		QueueWait: prometheus.NewHistogramVec(histogramOpts(prometheus.HistogramOpts{
			Name:    "kvroute_tenant_queue_wait_seconds",
			Help:    "Time admitted requests waited in the overload queue (0 when they did not wait).",
			Buckets: queueWaitBuckets,
		}), []string{"tenant"}),
		PromptTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_tenant_prompt_tokens_total",
			Help: "Prompt tokens settled per tenant (engine-reported, else the router's estimate).",
		}, []string{"tenant"}),
		CompletionTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_tenant_completion_tokens_total",
			Help: "Completion tokens settled per tenant (engine-reported, else one per content event a stream relayed before it was cut).",
		}, []string{"tenant"}),
		load: newTenantLoad(),
		live: map[string]bool{Unauthenticated: true},
	}
	reg.MustRegister(m.Requests, m.Rejections, m.QueueWait, m.PromptTokens, m.CompletionTokens)
	reg.MustRegister(m.load.collectors()...)
	return m
}

// SetTenants sets the configured tenant names (none: authentication is off), deletes every
// series of a tenant not among them, and makes the series of the others at 0: requests by
// status, refusals by reason, queue wait, tokens, requests in flight and queued, and, while
// there are tenants, the refusals of unauthenticated requests.
func (m *TenantMetrics) SetTenants(names []string) {
	if m == nil {
		return
	}
	live := make(map[string]bool, len(names)+1)
	live[Unauthenticated] = true
	for _, n := range names {
		live[n] = true
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for n := range m.live {
		if !live[n] || (n == Unauthenticated && len(names) == 0) {
			l := prometheus.Labels{"tenant": n}
			m.Requests.DeletePartialMatch(l)
			m.Rejections.DeletePartialMatch(l)
			m.QueueWait.DeletePartialMatch(l)
			m.PromptTokens.DeletePartialMatch(l)
			m.CompletionTokens.DeletePartialMatch(l)
			m.load.deleteTenant(n)
		}
	}
	m.live = live
	if len(names) == 0 {
		return
	}
	for _, s := range unauthenticatedStatuses {
		m.Requests.WithLabelValues(Unauthenticated, s)
	}
	for _, r := range unauthenticatedReasons {
		m.Rejections.WithLabelValues(Unauthenticated, r)
	}
	for _, n := range names {
		for _, s := range tenantStatuses {
			m.Requests.WithLabelValues(n, s)
		}
		for _, r := range tenantReasons {
			m.Rejections.WithLabelValues(n, r)
		}
		m.QueueWait.WithLabelValues(n)
		m.PromptTokens.WithLabelValues(n)
		m.CompletionTokens.WithLabelValues(n)
		m.load.makeTenant(n)
	}
}

// Request counts one answered request of tenant with HTTP status code.
func (m *TenantMetrics) Request(tenant string, code int) {
	if m == nil {
		return
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.live[tenant] {
		m.Requests.WithLabelValues(tenant, strconv.Itoa(code)).Inc()
	}
}

// Rejection counts one refusal of tenant's request by the gate, reason being the error code.
func (m *TenantMetrics) Rejection(tenant, reason string) {
	if m == nil {
		return
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.live[tenant] {
		m.Rejections.WithLabelValues(tenant, reason).Inc()
	}
}

// Waited observes how long one admitted request of tenant waited for admission.
func (m *TenantMetrics) Waited(tenant string, d time.Duration) {
	if m == nil {
		return
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.live[tenant] {
		m.QueueWait.WithLabelValues(tenant).Observe(max(0, d.Seconds()))
	}
}

// Tokens counts one request's settled usage for tenant.
func (m *TenantMetrics) Tokens(tenant string, prompt, completion int) {
	if m == nil {
		return
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.live[tenant] {
		m.PromptTokens.WithLabelValues(tenant).Add(float64(max(0, prompt)))
		m.CompletionTokens.WithLabelValues(tenant).Add(float64(max(0, completion)))
	}
}
