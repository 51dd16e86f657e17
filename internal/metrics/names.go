package metrics

import (
	"fmt"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/internal/endpoint"
)

// Names returns the name of every metric family a router exports (histograms under their base
// name, without _bucket, _sum or _count), sorted: what the dashboard and the alerting rules
// may query.
func Names() ([]string, error) {
	reg := prometheus.NewRegistry()
	populated(reg)
	mfs, err := reg.Gather()
	if err != nil {
		return nil, fmt.Errorf("gathering the router's metrics: %w", err)
	}
	var out []string
	for _, mf := range mfs {
		out = append(out, mf.GetName())
	}
	slices.Sort(out)
	return out, nil
}

// populated is New with one endpoint of each kind of state, a discovery source and a tenant,
// so that every family has a series.
func populated(reg prometheus.Registerer) *Metrics {
	m := New(reg)
	ep := &endpoint.Endpoint{Name: "http://127.0.0.1:1"}
	ep.SetSnapshot(&endpoint.Snapshot{At: time.Now(), PrefixQueries: 10, PrefixHits: 5})
	ep.Progressed(time.Now().UnixNano())
	m.EndpointAdded(ep.Name, []string{"m"})
	m.DiscoverySource("file")
	m.Tenant.SetTenants([]string{"t"})
	m.WatchEndpoints(func() []*endpoint.Endpoint { return []*endpoint.Endpoint{ep} })
	m.WatchIndex(func() (int, int64) { return 0, 0 })
	m.WatchPrefillRate(func(*endpoint.Endpoint) float64 { return 1000 })
	m.WatchLearnedCapacity(func(*endpoint.Endpoint) int { return 1000 })
	m.PickDuration.Observe(0)
	as := NewAutoscale(reg, 0)
	ae := &endpoint.Endpoint{Name: ep.Name, Models: []string{"m"}}
	now := time.Now()
	ae.SetSnapshot(&endpoint.Snapshot{At: now.Add(-time.Second), PrefixQueries: 1})
	as.Watch(func() []*endpoint.Endpoint { return []*endpoint.Endpoint{ae} }, func(*endpoint.Endpoint) float64 { return 1000 })
	as.WatchCacheValue(func(*endpoint.Endpoint) (float64, bool) { return 0, true })
	as.Figures() // the first sample: the gathering's is the second
	ae.SetSnapshot(&endpoint.Snapshot{At: now, PrefixQueries: 2})
	p := NewPeers(reg)
	p.WatchPeers(func() map[string]time.Time { return map[string]time.Time{"r2": time.Now()} })
	p.Lag.Observe(0)
	return m
}
