package app

import (
	"log/slog"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/internal/metrics"
)

// TestEjectionReasonCounted: each kind of ejection passive health checking tells the router of
// is counted under its own reason of kvroute_endpoint_ejections_total: this replica's own
// consecutive failures, the fleet's (peers' failures counted in), and the refusal rule.
func TestEjectionReasonCounted(t *testing.T) {
	e := newFakeEngine(t)
	r, err := NewRouter(routerConfig(t, "", e.srv.URL), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ep := r.pool.ByName(e.srv.URL)
	oc := r.outlierConfig(r.Config())
	oc.OnEject(ep, 30*time.Second, false)
	oc.OnEject(ep, 30*time.Second, true)
	oc.OnEject(ep, 60*time.Second, true)
	oc.OnRefusals(ep, 30*time.Second, 0.95, 0.02)
	got := map[string]float64{}
	for _, reason := range metrics.EjectReasons {
		got[reason] = testutil.ToFloat64(r.Metrics().Ejections.WithLabelValues(e.srv.URL, reason))
	}
	want := map[string]float64{metrics.EjectFailures: 1, metrics.EjectPeerFailures: 2, metrics.EjectRefusals: 1}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ejections by reason (-want +got):\n%s", diff)
	}
}
