package tenant

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/internal/metrics"
)

// BenchmarkMiddleware is the gate's cost per request: key digest and lookup, limits, headers;
// with a tokens-per-minute limit also reading and estimating a 4 KiB body; with metrics also
// counting the request per tenant and status.
func BenchmarkMiddleware(b *testing.B) {
	for _, tc := range []struct {
		name, limits string
		metrics      bool
	}{
		{"requests", "{requests_per_minute: 1000000000}", false},
		{"requests+metrics", "{requests_per_minute: 1000000000}", true},
		{"requests+tokens", "{requests_per_minute: 1000000000, tokens_per_minute: 1000000000000}", false},
	} {
		b.Run(tc.name, func(b *testing.B) {
			g, _ := newTestGate(b, "tenants: [{name: a, api_keys: [\""+HashKey("k")+"\"], limits: "+tc.limits+"}]\n", nil)
			if tc.metrics {
				g.m = metrics.NewTenantMetrics(prometheus.NewRegistry())
				g.m.SetTenants([]string{"a"})
			}
			h := middleware(g, http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
			body := chat(strings.Repeat("lorem ipsum ", 340))
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body))
				r.Header.Set("Authorization", "Bearer k")
				w := httptest.NewRecorder()
				h.ServeHTTP(w, r)
				if w.Code != http.StatusOK {
					b.Fatalf("status %d", w.Code)
				}
			}
		})
	}
}
