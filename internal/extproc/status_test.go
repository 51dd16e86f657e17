package extproc

import (
	"log/slog"
	"strings"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/internal/metrics/metricstest"
	"github.com/kvroute/kvroute/internal/proxy"
	"github.com/kvroute/kvroute/internal/testlog"
)

// TestBadStatus: an answer whose :status is not a status (not a number, or outside 100..599),
// or one no API request gets (a redirect, a protocol switch), is the engine's bad answer, not a 200: settled as a 502 from that endpoint (requests_total,
// the policy told it failed, passive health), an upstream error on the access line, and one
// warning that shows the value, cut short.
func TestBadStatus(t *testing.T) {
	long := strings.Repeat("9", 200)
	for _, bad := range []string{"abc", "", "99", "600", "2000", "+20", " 200", "20x", "0", "-200", long, "302", "301", "101"} {
		t.Run(bad[:min(len(bad), 8)], func(t *testing.T) {
			var logs testlog.Buffer
			f := newFixture(t, []string{ep1}, func(h *proxy.Handler) { h.Logger = slog.New(slog.NewJSONHandler(&logs, nil)) })
			e, _ := f.routed(t, plainChat)
			e.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
				Headers: headerMap(":status", bad, "content-type", "application/json")}}})
			e.recv()
			e.send(respBody(jsonAnswer, true))
			if got, _ := e.streamedBody(true); got != jsonAnswer {
				t.Errorf("answer passed on as %q", got)
			}
			e.close()
			f.streamEnded(t)

			v := metricstest.Values(t, f.reg, "kvroute_requests_total")
			if got := v["kvroute_requests_total{endpoint="+ep1+",model=m,status=502}"]; got != 1 {
				t.Errorf("requests_total 502 = %v, want 1 (%v)", got, v)
			}
			if got := v["kvroute_requests_total{endpoint="+ep1+",model=m,status=200}"]; got != 0 {
				t.Errorf("requests_total 200 = %v, want 0", got)
			}
			if diff := cmp.Diff([]string{"routed " + ep1, "done " + ep1 + " ok=false cached=false"}, f.pk.events()); diff != "" {
				t.Errorf("policy events (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff([]string{ep1 + " server_error"}, f.health.failures()); diff != "" {
				t.Errorf("failures (-want +got):\n%s", diff)
			}
			var warns []map[string]any
			var access map[string]any
			for _, l := range logs.JSONLines(t) {
				switch {
				case l["level"] == "WARN":
					warns = append(warns, l)
				case l["msg"] == "request":
					access = l
				}
			}
			if len(warns) != 1 {
				t.Fatalf("%d warnings, want 1: %v", len(warns), warns)
			}
			logged, _ := warns[0]["status"].(string)
			if want := bad[:min(len(bad), maxStatusLog)]; !strings.HasPrefix(logged, want) || len(logged) > maxStatusLog+3 {
				t.Errorf("warning's status %q, want %q cut to %d bytes", logged, bad, maxStatusLog)
			}
			if access["status"] != 502.0 || access["error_type"] != "upstream_error" {
				t.Errorf("access line: status %v, error_type %v; want 502, upstream_error", access["status"], access["error_type"])
			}
		})
	}
}

// TestStatusCode: the statuses that are read as one, and those that are not.
func TestStatusCode(t *testing.T) {
	for v, want := range map[string]int{"100": 100, "200": 200, "204": 204, "429": 429, "599": 599, "099": 0, "600": 0, "abc": 0, "": 0, "2000": 0, "+20": 0, "2 0": 0} {
		n, ok := statusCode(v)
		if ok != (want != 0) || ok && n != want {
			t.Errorf("statusCode(%q) = %d, %v; want %d", v, n, ok, want)
		}
	}
}
