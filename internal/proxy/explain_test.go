package proxy

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/metrics/metricstest"
	"github.com/kvroute/kvroute/internal/tenant"
)

// /debug/explain (the admin port) checks the tenant's key as the API does, and counts nothing
// in the API's tenant metrics, refusals included.
func TestExplainCountsNothing(t *testing.T) {
	f := newFixture(t, spec("http://127.0.0.1:1", "m"))
	tm := f.h.Metrics.Tenant
	f.h.Gate = tenantGate(t, tm, `tenants: [{name: t1, api_keys: ["`+tenant.HashKey("sk-1")+`"]}]`)
	explain := func(hdr http.Header) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, "/debug/explain", strings.NewReader(chatBody))
		r.Header = hdr
		w := httptest.NewRecorder()
		f.h.ServeExplain(w, r)
		return w
	}
	for _, tc := range []struct {
		hdr  http.Header
		want int
	}{
		{http.Header{}, http.StatusUnauthorized},
		{http.Header{"Authorization": {"Bearer wrong"}}, http.StatusUnauthorized},
		{http.Header{"Authorization": {"Bearer sk-1"}, "Api-Key": {"sk-2"}}, http.StatusBadRequest},
	} {
		w := explain(tc.hdr)
		if w.Code != tc.want || (tc.want == http.StatusUnauthorized) != (w.Header().Get("WWW-Authenticate") != "") {
			t.Errorf("%v: %d, WWW-Authenticate %q; want %d, and the header with a 401", tc.hdr, w.Code, w.Header().Get("WWW-Authenticate"), tc.want)
		}
	}
	w := explain(http.Header{"Authorization": {"Bearer sk-1"}})
	var ex Explanation
	if err := json.Unmarshal(w.Body.Bytes(), &ex); w.Code != http.StatusOK || err != nil || ex.Tenant != "t1" {
		t.Errorf("with t1's key: %d %s", w.Code, w.Body.Bytes())
	}
	for k, v := range metricstest.Values(t, f.reg, "kvroute_tenant_") {
		if v != 0 {
			t.Errorf("%s = %v after explain calls, want 0", k, v)
		}
	}
}
