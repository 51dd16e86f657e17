package metrics

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
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

	want := `
# HELP kvroute_tenant_completion_tokens_total Completion tokens settled per tenant (engine-reported).
# TYPE kvroute_tenant_completion_tokens_total counter
kvroute_tenant_completion_tokens_total{tenant="a"} 20
# HELP kvroute_tenant_prompt_tokens_total Prompt tokens settled per tenant (engine-reported, else the router's estimate).
# TYPE kvroute_tenant_prompt_tokens_total counter
kvroute_tenant_prompt_tokens_total{tenant="a"} 100
# HELP kvroute_tenant_rejections_total Requests refused by the tenant gate, by tenant and reason (the error code answered).
# TYPE kvroute_tenant_rejections_total counter
kvroute_tenant_rejections_total{reason="missing_api_key",tenant=""} 1
# HELP kvroute_tenant_requests_total Requests answered by tenant (empty: refused for a missing or unknown API key) and HTTP status; authentication on only.
# TYPE kvroute_tenant_requests_total counter
kvroute_tenant_requests_total{status="200",tenant="a"} 1
kvroute_tenant_requests_total{status="401",tenant=""} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "kvroute_tenant_requests_total",
		"kvroute_tenant_rejections_total", "kvroute_tenant_prompt_tokens_total", "kvroute_tenant_completion_tokens_total"); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(m.QueueWait); n != 1 {
		t.Errorf("%d queue-wait series after removing b, want 1 (a)", n)
	}
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint %s: %s", p.Metric, p.Text)
	}
}
