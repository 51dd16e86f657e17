package metrics

import "github.com/prometheus/client_golang/prometheus"

// Reload results, the values of kvroute_config_reloads_total's result label.
const (
	ReloadOK    = "ok"
	ReloadError = "error"
)

// ReloadsVec is kvroute_config_reloads_total. Counting a reload by its result also sets
// kvroute_config_last_reload_successful (1 for ok, 0 for error) and, for ok,
// kvroute_config_last_reload_success_timestamp_seconds, as Prometheus and Alertmanager export
// theirs: wherever a reload is counted (the router's Reload, the config watcher's Rejected for a
// file that does not load), the gauges follow, and a rejected config, still on disk for a
// restart to fail on, shows until a reload applies.
type ReloadsVec struct {
	*prometheus.CounterVec
	m *Metrics
}

// WithLabelValues returns the counter of result (ReloadOK or ReloadError), which sets the
// last-reload gauges as it counts.
func (v *ReloadsVec) WithLabelValues(lvs ...string) prometheus.Counter {
	return reloadCounter{Counter: v.CounterVec.WithLabelValues(lvs...), m: v.m, ok: len(lvs) == 1 && lvs[0] == ReloadOK}
}

// reloadCounter counts reloads of one result and sets the gauges.
type reloadCounter struct {
	prometheus.Counter
	m  *Metrics
	ok bool
}

func (c reloadCounter) Inc() {
	c.Counter.Inc()
	c.m.reloaded(c.ok)
}

func (c reloadCounter) Add(v float64) {
	c.Counter.Add(v)
	if v > 0 {
		c.m.reloaded(c.ok)
	}
}

// ConfigReload counts a config reload by its result (ok: applied), which sets the last-reload
// gauges.
func (m *Metrics) ConfigReload(ok bool) {
	result := ReloadError
	if ok {
		result = ReloadOK
	}
	m.Reloads.WithLabelValues(result).Inc()
}

// reloaded sets the last-reload gauges after a load of the config that was applied (ok) or
// rejected.
func (m *Metrics) reloaded(ok bool) {
	if !ok {
		m.lastReloadOK.Set(0)
		return
	}
	m.lastReloadOK.Set(1)
	m.lastReloadAt.Set(float64(m.now().UnixMilli()) / 1000)
}
