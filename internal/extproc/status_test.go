package extproc

import (
	"log/slog"
	"strings"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvroute/kvroute/internal/metrics/metricstest"
	"github.com/kvroute/kvroute/internal/proxy"
	"github.com/kvroute/kvroute/internal/testlog"
)

// TestBadStatus: an answer whose :status is not a status (not a number, or outside 100..599),
// or one no API request gets (a protocol switch), is the engine's bad answer, not a 200: settled as a 502 from that endpoint (requests_total,
// the policy told it failed, passive health), an upstream error on the access line, and one
// warning that shows the value, cut short.
func TestBadStatus(t *testing.T) {
	long := strings.Repeat("9", 200)
	for _, bad := range []string{"abc", "", "99", "600", "2000", "+20", " 200", "20x", "0", "-200", long, "101"} {
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

// TestRedirect: an engine's redirect, which Envoy passes on to the client, is settled with its
// own status (the access line and requests_total say 307, not a 502 the client never got, and
// no upstream_bad_answer), and judged as `kvroute serve` judges one: the endpoint's URL is not
// the API's address, nothing was computed, so the attempt fails as unavailable (passive health
// counts it; the policy hears no answer) and one warning names the endpoint and the Location.
// The body passes on unread. Envoy's own redirect (a route's redirect action) is no endpoint's:
// settled with its status, nothing told to health, no warning.
func TestRedirect(t *testing.T) {
	for _, tc := range []struct {
		name     string
		head     *extprocv3.ProcessingRequest
		endpoint string
		failures []string
		events   []string
		warnings int
	}{
		{"engine", respHeaders(307, "", false, "content-type", "application/json", "location", "http://10.0.0.1:8000/api/v1/chat/completions"),
			ep1, []string{ep1 + " unavailable"}, []string{"routed " + ep1, "done " + ep1 + " ok=false cached=false"}, 1},
		{"envoy", withAttributes(respHeaders(307, "", false, "content-type", "application/json", "location", "https://gw.example/v1/chat/completions"),
			map[string]*structpb.Value{"response.code_details": structpb.NewStringValue("direct_response")}),
			"none", nil, []string{"routed " + ep1, "done " + ep1 + " ok=false cached=false"}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs testlog.Buffer
			f := newFixture(t, []string{ep1}, withLog(&logs))
			e, _ := f.routed(t, plainChat)
			e.send(tc.head)
			e.recv()
			e.send(respBody(jsonAnswer, true))
			if got, _ := e.streamedBody(true); got != jsonAnswer {
				t.Errorf("answer passed on as %q", got)
			}
			e.close()
			f.streamEnded(t)

			v := metricstest.Values(t, f.reg, "kvroute_requests_total")
			if got := v["kvroute_requests_total{endpoint="+tc.endpoint+",model=m,status=307}"]; got != 1 {
				t.Errorf("requests_total 307 on %s = %v, want 1 (%v)", tc.endpoint, got, v)
			}
			if got := v["kvroute_requests_total{endpoint="+ep1+",model=m,status=502}"]; got != 0 {
				t.Errorf("requests_total 502 = %v, want 0", got)
			}
			if diff := cmp.Diff(tc.events, f.pk.events()); diff != "" {
				t.Errorf("policy events (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.failures, f.health.failures()); diff != "" {
				t.Errorf("failures (-want +got):\n%s", diff)
			}
			var warns []map[string]any
			for _, l := range logs.JSONLines(t) {
				if l["level"] == "WARN" {
					warns = append(warns, l)
				}
			}
			if len(warns) != tc.warnings {
				t.Fatalf("%d warnings, want %d: %v", len(warns), tc.warnings, warns)
			}
			if tc.warnings > 0 {
				if loc, _ := warns[0]["location"].(string); warns[0]["endpoint"] != ep1 || !strings.HasSuffix(loc, "/api/v1/chat/completions") {
					t.Errorf("warning %v: want the endpoint and the Location", warns[0])
				}
			}
			access := accessLine(t, &logs)
			if access["status"] != 307.0 || access["error_code"] != nil || access["error_type"] != nil {
				t.Errorf("access line: status %v, error_type %v, error_code %v; want 307 and no error", access["status"], access["error_type"], access["error_code"])
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
