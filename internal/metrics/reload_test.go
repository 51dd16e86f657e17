package metrics

import (
	"cmp"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/internal/metrics/metricstest"
	"github.com/kvroute/kvroute/internal/version"
)

// TestConfigReloadGauges: the last reload's result and the time of the last applied one, as
// Prometheus and Alertmanager export theirs. The config loaded at start counts as applied; a
// rejected reload sets the result to 0 and leaves the time; the next applied one sets both.
func TestConfigReloadGauges(t *testing.T) {
	start := time.Now()
	m, reg, clk := newTestMetrics()
	read := func() [4]float64 {
		s := metricstest.Values(t, reg, "kvroute_config_")
		return [4]float64{s[`kvroute_config_last_reload_successful{}`], s[`kvroute_config_last_reload_success_timestamp_seconds{}`],
			s[`kvroute_config_reloads_total{result=ok}`], s[`kvroute_config_reloads_total{result=error}`]}
	}
	got := read()
	if got[0] != 1 || got[1] < float64(start.Unix()) || got[1] > float64(time.Now().Unix()+1) || got[2] != 0 || got[3] != 0 {
		t.Errorf("at start: successful, timestamp, ok, error = %v; want 1, the start (%d), 0, 0", got, start.Unix())
	}
	m.ConfigReload(false)
	clk.add(time.Minute)
	if want := [4]float64{0, got[1], 0, 1}; read() != want {
		t.Errorf("after a rejected reload: %v, want %v", read(), want)
	}
	m.ConfigReload(true)
	if want := [4]float64{1, float64(clk.t.Unix()), 1, 1}; read() != want {
		t.Errorf("after an applied reload: %v, want %v", read(), want)
	}
	// A file that does not load, counted as kvroute serve's config watcher counts it.
	m.Reloads.WithLabelValues(ReloadError).Inc()
	m.ConfigReload(false)
	if want := [4]float64{0, float64(clk.t.Unix()), 1, 3}; read() != want {
		t.Errorf("after two rejected reloads: %v, want %v", read(), want)
	}
	clk.add(time.Minute)
	m.Reloads.WithLabelValues(ReloadOK).Add(1)
	if want := [4]float64{1, float64(clk.t.Unix()), 2, 3}; read() != want {
		t.Errorf("after a reload counted with Add: %v, want %v", read(), want)
	}
	lint(t, reg)
}

// TestBuildInfo: kvroute_build_info is 1, labelled with what kvroute version prints.
func TestBuildInfo(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	New(reg)
	v := version.Get()
	want := map[string]float64{
		`kvroute_build_info{goversion=` + cmp.Or(v.GoVersion, version.Unknown) + `,revision=` + v.Revision + `,version=` + v.Version + `}`: 1,
	}
	if diff := gocmp.Diff(want, metricstest.Values(t, reg, "kvroute_build_info")); diff != "" {
		t.Errorf("build info (-want +got):\n%s", diff)
	}
	lint(t, reg)
}
