package metrics

import (
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/internal/endpoint"
)

func TestMetricsExposition(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m := New(reg)
	a := &endpoint.Endpoint{ID: 0, Name: "http://127.0.0.1:1", KVCapacityTokens: 100}
	b := &endpoint.Endpoint{ID: 1, Name: "http://127.0.0.1:2"}
	b.SetHealthy(false)
	a.Start(10)
	a.SetSnapshot(&endpoint.Snapshot{At: time.Unix(100, 0)})
	m.now = func() time.Time { return time.Unix(102, 0) }
	m.WatchEndpoints(func() []*endpoint.Endpoint { return []*endpoint.Endpoint{a, b} })
	m.WatchIndex(func() (int, int64) { return 3, 96 })
	m.Requests.WithLabelValues("m", a.Name, Status(200)).Inc()
	m.Requests.WithLabelValues("m", b.Name, Status(502)).Inc()
	m.TTFT.WithLabelValues("m").Observe(0.05)

	want := `
# HELP kvroute_endpoint_healthy 1 when the endpoint passes health checks and is not ejected, else 0.
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
# HELP kvroute_index_entries Entries (block, endpoint) in the policy's prefix index.
# TYPE kvroute_index_entries gauge
kvroute_index_entries 3
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"kvroute_endpoint_healthy", "kvroute_endpoint_in_flight_requests", "kvroute_endpoint_snapshot_age_seconds", "kvroute_index_entries"); err != nil {
		t.Error(err)
	}
	m.ForgetEndpoint(b.Name)
	if n := testutil.CollectAndCount(m.Requests); n != 1 {
		t.Errorf("after ForgetEndpoint: %d request series, want 1", n)
	}
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint %s: %s", p.Metric, p.Text)
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
	m := New(reg)
	m.WatchEndpoints(func() []*endpoint.Endpoint { return []*endpoint.Endpoint{{Name: "http://127.0.0.1:1"}} })
	m.WatchIndex(func() (int, int64) { return 0, 0 })
	m.Requests.WithLabelValues("m", "http://127.0.0.1:1", "200").Inc()
	m.TTFT.WithLabelValues("m").Observe(0.1)
	m.Retries.WithLabelValues("http://127.0.0.1:1", "connect_error").Inc()
	rec := httptest.NewRecorder()
	promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	cmd := exec.Command(path, "check", "metrics")
	cmd.Stdin = rec.Body
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Errorf("promtool check metrics: %v\n%s", err, out)
	}
}
