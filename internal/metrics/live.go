package metrics

import (
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// A request still in flight on an endpoint that has left the fleet (a reload, DNS or
// Kubernetes discovery: a pod replaced mid-stream) is counted when it ends, after
// ForgetEndpoints deleted the endpoint's series. Counted as before, it would make them again,
// at 1, and nothing would ever delete them: series growing with every pod replaced under load.
// So the vectors with an endpoint or a model label count through CounterVec and HistogramVec,
// whose WithLabelValues gives a counter that counts nothing for an endpoint that has left, or a
// model that has lost its series (no endpoint serves it any more). What such a request did is
// in its access line, and in the series without those labels. TenantMetrics does the same for
// a tenant removed from the config.
//
// An endpoint just added to the pool is counted from EndpointAdded on, which the router calls
// right after the pool's update: an event there in between (a connection refused within that
// moment) is not counted.
//
// Until EndpointAdded is first called (a Handler used without a router: tests, benchmarks),
// every endpoint and model is counted: nothing says which endpoints there are.

// noLabel is the position of a label a vector does not have.
const noLabel = -1

// CounterVec is a counter vector whose WithLabelValues counts only endpoints in the fleet and
// models with series (see above). Its other methods are prometheus.CounterVec's.
type CounterVec struct {
	*prometheus.CounterVec
	m               *Metrics
	model, endpoint int // positions of the model and endpoint labels, noLabel when none
}

// WithLabelValues returns the counter of the label values lvs, or one that is never exported
// when they name an endpoint that has left or a model without series. Hold it no longer than
// the event it counts.
func (v *CounterVec) WithLabelValues(lvs ...string) prometheus.Counter {
	// The read lock orders making the series against ForgetEndpoints' deletion of them: a
	// series is made before it is deleted, or not at all. The counter returned may be counted
	// after a deletion: it is then no longer the registry's, and nothing is exported.
	v.m.mu.RLock()
	defer v.m.mu.RUnlock()
	if !v.m.countsLocked(lvs, v.model, v.endpoint) {
		return v.m.discarded
	}
	return v.CounterVec.WithLabelValues(lvs...)
}

// HistogramVec is a histogram vector whose WithLabelValues observes only models with series,
// as CounterVec does.
type HistogramVec struct {
	*prometheus.HistogramVec
	m     *Metrics
	model int
}

// WithLabelValues returns the histogram of the label values lvs, or an observer that keeps
// nothing when they name a model without series.
func (v *HistogramVec) WithLabelValues(lvs ...string) prometheus.Observer {
	v.m.mu.RLock()
	defer v.m.mu.RUnlock()
	if !v.m.countsLocked(lvs, v.model, noLabel) {
		return discardObserver
	}
	return v.HistogramVec.WithLabelValues(lvs...)
}

var discardObserver = prometheus.ObserverFunc(func(float64) {})

// countsLocked reports whether an event with label values lvs is counted: its endpoint (at
// position endpoint) is in the fleet or NoEndpoint, and its model (at position model) has
// series. The caller holds m.mu, either way.
func (m *Metrics) countsLocked(lvs []string, model, endpoint int) bool {
	if !m.tracking {
		return true
	}
	if endpoint != noLabel && endpoint < len(lvs) && !m.endpointLiveLocked(lvs[endpoint]) {
		return false
	}
	if model != noLabel && model < len(lvs) && !m.modelLiveLocked(lvs[model]) {
		return false
	}
	return true
}

// endpointLiveLocked reports whether the endpoint name is counted: in the fleet
// (EndpointAdded and not forgotten since), or NoEndpoint.
func (m *Metrics) endpointLiveLocked(name string) bool {
	if name == NoEndpoint || !m.tracking {
		return true
	}
	_, ok := m.served[name]
	return ok
}

// modelLiveLocked reports whether the model label has series: a model some endpoint serves
// (spelt with or without ollama's ":latest", as the proxy may label it either way), or
// UnknownModel or OtherModel, which any request may be labelled with.
func (m *Metrics) modelLiveLocked(model string) bool {
	if model == UnknownModel || model == OtherModel {
		return true
	}
	labels := m.labelsLocked()
	if labels[model] {
		return true
	}
	if base, ok := strings.CutSuffix(model, latest); ok && labels[base] {
		return true
	}
	return labels[model+latest]
}

// labelsLocked returns every model label with series, made again after a change of the
// endpoints or their lists. The caller holds m.mu, either way: the writers, which hold it
// alone, drop the set at every change.
func (m *Metrics) labelsLocked() map[string]bool {
	if l := m.labels.Load(); l != nil {
		return *l
	}
	all := map[string]bool{}
	for _, ls := range m.served {
		for _, l := range ls {
			all[l] = true
		}
	}
	m.labels.Store(&all)
	return all
}
