package metrics

import "github.com/prometheus/client_golang/prometheus"

// tenantLoad are the per-tenant gauges of what the gate holds now: requests admitted and not
// yet ended (each with a concurrency slot and a token reservation), and requests waiting in
// the admission queue. Both are set to the gate's own counts, never added to, so that a
// tenant removed and added back while its requests were in flight reads right again at its
// next change.
type tenantLoad struct {
	InFlight *prometheus.GaugeVec // tenant
	Queued   *prometheus.GaugeVec // tenant
}

func newTenantLoad() tenantLoad {
	return tenantLoad{
		InFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kvroute_tenant_in_flight",
			Help: "Requests of the tenant admitted by the gate and not yet ended (what limits.max_concurrent counts); authentication on only.",
		}, []string{"tenant"}),
		Queued: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kvroute_tenant_queued",
			Help: "Requests of the tenant waiting in the admission queue (overload settings); authentication on only.",
		}, []string{"tenant"}),
	}
}

// collectors returns the gauges, for registration.
func (l tenantLoad) collectors() []prometheus.Collector {
	return []prometheus.Collector{l.InFlight, l.Queued}
}

// deleteTenant deletes the gauges' series of tenant; make makes them at 0.
func (l tenantLoad) deleteTenant(tenant string) {
	l.InFlight.DeleteLabelValues(tenant)
	l.Queued.DeleteLabelValues(tenant)
}

func (l tenantLoad) makeTenant(tenant string) {
	l.InFlight.WithLabelValues(tenant)
	l.Queued.WithLabelValues(tenant)
}

// SetInFlight sets how many requests of tenant are in flight (admitted, not yet ended).
func (m *TenantMetrics) SetInFlight(tenant string, n int) {
	if m != nil {
		m.setLoad(m.load.InFlight, tenant, n)
	}
}

// SetQueued sets how many requests of tenant wait in the admission queue.
func (m *TenantMetrics) SetQueued(tenant string, n int) {
	if m != nil {
		m.setLoad(m.load.Queued, tenant, n)
	}
}

// setLoad sets g's series of tenant, a configured one (Unauthenticated never holds a request).
func (m *TenantMetrics) setLoad(g *prometheus.GaugeVec, tenant string, n int) {
	if tenant == Unauthenticated {
		return
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.live[tenant] {
		g.WithLabelValues(tenant).Set(float64(n))
	}
}
