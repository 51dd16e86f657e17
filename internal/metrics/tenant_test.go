package metrics

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/internal/metrics/metricstest"
)

func TestTenantMetrics(t *testing.T) {
	var none *TenantMetrics // the gate without metrics: every method is a no-op
	none.SetTenants([]string{"a"})
	none.Request("a", 200)
	none.Rejection("a", "rate_limit_exceeded")
	none.Waited("a", time.Second)
	none.Tokens("a", 1, 1)

	reg := prometheus.NewPedanticRegistry()
	m := NewTenantMetrics(reg)
	m.Request("a", 200) // not configured yet: not counted
	m.SetTenants([]string{"a", "b"})
	m.Request("a", 200)
	m.Request("b", 429)
	m.Request(Unauthenticated, 401)
	m.Rejection("b", "rate_limit_exceeded")
	m.Rejection(Unauthenticated, "missing_api_key")
	m.Waited("a", 0)
	m.Waited("b", 2*time.Second)
	m.Tokens("a", 100, 20)
	m.Tokens("b", -1, 5) // never negative (a counter would panic)
	m.SetTenants([]string{"a"})
	m.Request("b", 200) // in flight across the reload: not counted

	got := metricstest.Values(t, reg, "kvroute_tenant_")
	nonZero := map[string]float64{}
	for k, v := range got {
		if v != 0 {
			nonZero[k] = v
		}
	}
	want := map[string]float64{
		`kvroute_tenant_completion_tokens_total{tenant=a}`:                20,
		`kvroute_tenant_prompt_tokens_total{tenant=a}`:                    100,
		`kvroute_tenant_rejections_total{reason=missing_api_key,tenant=}`: 1,
		`kvroute_tenant_requests_total{status=200,tenant=a}`:              1,
		`kvroute_tenant_requests_total{status=401,tenant=}`:               1,
		`kvroute_tenant_queue_wait_seconds_count{tenant=a}`:               1,
	}
	if diff := cmp.Diff(want, nonZero); diff != "" {
		t.Errorf("tenant series not at 0 (-want +got):\n%s", diff)
	}
	// a (still configured) keeps its series at 0, b (removed) has none left.
	for _, k := range []string{`kvroute_tenant_requests_total{status=429,tenant=a}`, `kvroute_tenant_rejections_total{reason=overloaded,tenant=a}`,
		`kvroute_tenant_rejections_total{reason=invalid_api_key,tenant=}`, `kvroute_tenant_rejections_total{reason=multiple_api_keys,tenant=}`,
		`kvroute_tenant_requests_total{status=400,tenant=}`, `kvroute_tenant_requests_total{status=504,tenant=a}`} {
		if v, ok := got[k]; !ok || v != 0 {
			t.Errorf("%s = %v (present %v), want 0", k, v, ok)
		}
	}
	for k := range got {
		if strings.HasSuffix(k, "tenant=b}") {
			t.Errorf("b was removed, yet %s", k)
		}
	}
	if n, want := testutil.CollectAndCount(m.Requests), len(tenantStatuses)+len(unauthenticatedStatuses); n != want {
		t.Errorf("%d request series, want %d: a's statuses and the unauthenticated 400 and 401", n, want)
	}
	m.SetTenants(nil) // authentication off: no tenant series at all
	if got := metricstest.Values(t, reg, "kvroute_tenant_"); len(got) != 0 {
		t.Errorf("authentication off, yet %v", got)
	}
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint %s: %s", p.Metric, p.Text)
	}
}
