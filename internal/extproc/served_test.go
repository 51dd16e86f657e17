package extproc

import (
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strings"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvroute/kvroute/internal/metrics/metricstest"
	"github.com/kvroute/kvroute/internal/testlog"
)

// withAttributes adds response attributes to a message, as Envoy's ext_proc filter sends those
// its response_attributes lists.
func withAttributes(req *extprocv3.ProcessingRequest, attrs map[string]*structpb.Value) *extprocv3.ProcessingRequest {
	req.Attributes = map[string]*structpb.Struct{"envoy.filters.http.ext_proc": {Fields: attrs}}
	return req
}

// answer plays Envoy from the pick to the end of a whole JSON answer: the response headers
// message head (its answer returned), the body, the stream's end.
func (f *fixture) answer(t *testing.T, e *envoy, head *extprocv3.ProcessingRequest, body string) *extprocv3.ProcessingResponse {
	t.Helper()
	e.send(head)
	r := e.recv()
	e.send(respBody(body, true))
	e.streamedBody(true)
	e.close()
	if err := f.streamEnded(t); err != nil {
		t.Error(err)
	}
	return r
}

// TestAnswerFromElsewhere: an answer from an address that is not on kvroute's list (Envoy's
// override_host fell back to its own policy) is credited to no endpoint: not the first
// choice's success (the policy learnt its TTFT and cached tokens from another engine's answer,
// and passive health counted a success it never had), counted under endpoint "none", no
// endpoint header naming the first choice. The endpoints of the list are charged a
// connect_error only where Envoy's attempt count says it tried each. An answer from an endpoint
// kvroute ranked but did not give Envoy (extproc.max_endpoints cut it off) is that endpoint's.
// Before, every such answer was the first choice's.
func TestAnswerFromElsewhere(t *testing.T) {
	for _, tc := range []struct {
		name     string
		served   string
		kv       []string // response headers
		events   []string
		failures []string
		endpoint string // kvroute_requests_total's endpoint label
	}{
		{
			name: "fallback, no count", served: "10.9.9.9:8000",
			events:   []string{"routed " + ep1, "done " + ep1 + " ok=false cached=false"},
			endpoint: "none",
		},
		{
			name: "fallback, one attempt", served: "10.9.9.9:8000", kv: []string{"x-envoy-attempt-count", "1"},
			events:   []string{"routed " + ep1, "done " + ep1 + " ok=false cached=false"},
			endpoint: "none",
		},
		{
			// Envoy tried both of the list and went on: both failed, why Envoy does not say.
			name: "fallback after the list", served: "10.9.9.9:8000", kv: []string{"x-envoy-attempt-count", "3"},
			events:   []string{"routed " + ep1, "done " + ep1 + " ok=false cached=false", "routed " + ep2, "done " + ep2 + " ok=false cached=false"},
			failures: []string{ep1 + " connect_error", ep2 + " connect_error"},
			endpoint: "none",
		},
		{
			name: "ranked but not listed", served: "10.0.0.3:8000",
			events: []string{"routed " + ep1, "done " + ep1 + " ok=false cached=false", "routed " + ep2, "done " + ep2 + " ok=false cached=false",
				"routed " + ep3, "done " + ep3 + " ok=true cached=true"},
			endpoint: ep3,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, []string{ep1, ep2, ep3})
			f.srv.MaxEndpoints = 2
			f.h.EndpointHeader = "x-kvroute-endpoint"
			var logs testlog.Buffer
			f.h.Logger = slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
			e, r := f.routed(t, plainChat)
			if got := destination(r); got != "10.0.0.1:8000,10.0.0.2:8000" {
				t.Fatalf("destination = %q", got)
			}
			kv := append([]string{"content-type", "application/json"}, tc.kv...)
			head := mutation(f.answer(t, e, respHeaders(200, tc.served, false, kv...), jsonAnswer).GetResponseHeaders().GetResponse().GetHeaderMutation())
			if diff := cmp.Diff(tc.events, f.pk.events()); diff != "" {
				t.Errorf("policy events (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.failures, f.health.failures()); diff != "" {
				t.Errorf("failures told to health checking (-want +got):\n%s", diff)
			}
			v := metricstest.Values(t, f.reg, "kvroute_requests_total")
			maps.DeleteFunc(v, func(_ string, n float64) bool { return n == 0 }) // the series made ahead
			want := map[string]float64{"kvroute_requests_total{endpoint=" + tc.endpoint + ",model=m,status=200}": 1}
			if diff := cmp.Diff(want, v); diff != "" {
				t.Errorf("kvroute_requests_total (-want +got):\n%s", diff)
			}
			named := slices.ContainsFunc(head, func(h string) bool { return strings.HasPrefix(h, "x-kvroute-endpoint: ") })
			if named != (tc.endpoint != "none") || tc.endpoint != "none" && !slices.Contains(head, "x-kvroute-endpoint: "+tc.endpoint) {
				t.Errorf("response header mutation %v: want x-kvroute-endpoint only for an answer kvroute can credit (%s)", head, tc.endpoint)
			}
			if n := logs.Count(`"msg":"the answer is no picked endpoint's`); n != map[bool]int{true: 1}[tc.endpoint == "none"] {
				t.Errorf("%d debug lines saying the answer is no endpoint's, want one for an answer credited to none:\n%s", n, logs.String())
			}
			for _, n := range []string{ep1, ep2, ep3} {
				if in := f.pool.ByName(n).InFlight(); in != 0 {
					t.Errorf("%s in flight = %d", n, in)
				}
			}
		})
	}
}

// TestEnvoyPassedOver: Envoy went down kvroute's list to ep3. Envoy does not say why an attempt
// failed (a connection refused and a 429 or 503 its retry policy retried look alike), but its
// attempt count (x-envoy-attempt-count, or the upstream.request_attempt_count attribute) says
// whether it tried the endpoints it passed or skipped them untried (override_host skips an
// address its cluster does not have). Only endpoints it tried are charged a connect_error; without
// a count, every one passed is, as before. Before, every endpoint passed was charged, the ones
// Envoy skipped too.
func TestEnvoyPassedOver(t *testing.T) {
	count := func(n float64) map[string]*structpb.Value {
		return map[string]*structpb.Value{"upstream.request_attempt_count": structpb.NewNumberValue(n)}
	}
	for _, tc := range []struct {
		name     string
		kv       []string
		attrs    map[string]*structpb.Value
		failures []string
	}{
		{name: "no count", failures: []string{ep1 + " connect_error", ep2 + " connect_error"}},
		{name: "header, each tried", kv: []string{"x-envoy-attempt-count", "3"}, failures: []string{ep1 + " connect_error", ep2 + " connect_error"}},
		{name: "header, none tried", kv: []string{"x-envoy-attempt-count", "1"}},
		{name: "attribute, none tried", attrs: count(1)},
		{name: "attribute, each tried", attrs: count(3), failures: []string{ep1 + " connect_error", ep2 + " connect_error"}},
		// Two passed, one tried: which one, nothing says.
		{name: "attribute, one of two tried", attrs: count(2)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, []string{ep1, ep2, ep3})
			e, _ := f.routed(t, plainChat)
			head := respHeaders(200, "10.0.0.3:8000", false, append([]string{"content-type", "application/json"}, tc.kv...)...)
			if tc.attrs != nil {
				withAttributes(head, tc.attrs)
			}
			f.answer(t, e, head, jsonAnswer)
			if diff := cmp.Diff(tc.failures, f.health.failures()); diff != "" {
				t.Errorf("failures told to health checking (-want +got):\n%s", diff)
			}
			events := f.pk.events()
			if len(events) == 0 || events[len(events)-1] != "done "+ep3+" ok=true cached=true" {
				t.Errorf("policy events %v: want the answer credited to %s", events, ep3)
			}
			v := metricstest.Values(t, f.reg, "kvroute_requests_total")
			if got := v["kvroute_requests_total{endpoint="+ep3+",model=m,status=200}"]; got != 1 {
				t.Errorf("requests_total for %s = %v, want 1 (%v)", ep3, got, v)
			}
		})
	}
}

// TestEnvoyCouldNotConnect: Envoy's own 503 after its last attempt could not connect
// (response.flags UF, response.code_details upstream_reset_before_response_started{...
// connection_failure...}) is not the engine's answer: the endpoint Envoy tried is charged a
// connect_error, as `kvroute serve` charges one it cannot reach, not an unavailable (the engine's
// own 503), and the attempt is not credited with an answer. Before, it was the engine's 503.
func TestEnvoyCouldNotConnect(t *testing.T) {
	for _, tc := range []struct {
		name   string
		served string
		attrs  map[string]*structpb.Value
	}{
		{name: "flags", served: "10.0.0.1:8000", attrs: map[string]*structpb.Value{
			"response.flags": structpb.NewNumberValue(0x20 | 0x8000)}},
		{name: "code details", served: "10.0.0.1:8000", attrs: map[string]*structpb.Value{
			"response.code_details": structpb.NewStringValue("upstream_reset_before_response_started{remote_connection_failure,delayed_connect_error:_Connection_refused}")}},
		{name: "not told which", attrs: map[string]*structpb.Value{
			"response.code_details":             structpb.NewStringValue("upstream_reset_before_response_started{connection_failure}"),
			"upstream.transport_failure_reason": structpb.NewStringValue("delayed connect error: Connection refused")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, []string{ep1})
			e, _ := f.routed(t, plainChat)
			head := withAttributes(respHeaders(503, tc.served, false, "content-type", "text/plain"), tc.attrs)
			f.answer(t, e, head, "upstream connect error or disconnect/reset before headers. reset reason: remote connection failure")
			if diff := cmp.Diff([]string{ep1 + " connect_error"}, f.health.failures()); diff != "" {
				t.Errorf("failures told to health checking (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff([]string{"routed " + ep1, "done " + ep1 + " ok=false cached=false"}, f.pk.events()); diff != "" {
				t.Errorf("policy events (-want +got):\n%s", diff)
			}
			if n := f.pool.ByName(ep1).InFlight(); n != 0 {
				t.Errorf("in flight = %d", n)
			}
		})
	}

	// An engine's own 503 (via_upstream) is still the engine's.
	f := newFixture(t, []string{ep1})
	e, _ := f.routed(t, plainChat)
	head := withAttributes(respHeaders(503, "10.0.0.1:8000", false, "content-type", "application/json"),
		map[string]*structpb.Value{"response.code_details": structpb.NewStringValue("via_upstream"), "response.flags": structpb.NewNumberValue(0)})
	f.answer(t, e, head, `{"error":{"message":"busy","type":"x","param":null,"code":null}}`)
	if diff := cmp.Diff([]string{ep1 + " unavailable"}, f.health.failures()); diff != "" {
		t.Errorf("the engine's own 503: failures (-want +got):\n%s", diff)
	}
}

// TestRetryAfterThroughEnvoy: an engine's Retry-After (and retry-after-ms) on a refusal reaches
// the client through Envoy as `kvroute serve` writes it (TestRetryAfterCleaned in
// internal/proxy): as the router read it, 1 ms to a minute, seconds rounded up. Before, the
// engine's garbage went through unchanged ("-5", "NaN", a year). An answer that is not a refusal
// keeps its headers as they came, as in serve.
func TestRetryAfterThroughEnvoy(t *testing.T) {
	for _, tc := range []struct {
		status                 int
		sent, ms, want, wantMS string
	}{
		{http.StatusTooManyRequests, "99999999999", "", "60", ""},
		{http.StatusTooManyRequests, "-5", "", "1", ""},
		{http.StatusTooManyRequests, "2", "", "2", ""},
		{http.StatusTooManyRequests, "", "NaN", "1", "1000"},
		{http.StatusTooManyRequests, "", "1500", "2", "1500"},
		{http.StatusServiceUnavailable, "Wed, 21 Oct 2099 07:28:00 GMT", "", "60", ""},
		{http.StatusOK, "-5", "", "", ""},
		{http.StatusTooManyRequests, "", "", "", ""},
	} {
		f := newFixture(t, []string{ep1})
		e, _ := f.routed(t, plainChat)
		kv := []string{"content-type", "application/json"}
		if tc.sent != "" {
			kv = append(kv, "retry-after", tc.sent)
		}
		if tc.ms != "" {
			kv = append(kv, "retry-after-ms", tc.ms)
		}
		r := f.answer(t, e, respHeaders(tc.status, "10.0.0.1:8000", false, kv...), `{"error":{"message":"no","type":"x","param":null,"code":null}}`)
		var got, gotMS string
		for _, h := range r.GetResponseHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
			switch h.GetHeader().GetKey() {
			case "retry-after":
				got = string(h.GetHeader().GetRawValue())
			case "retry-after-ms":
				gotMS = string(h.GetHeader().GetRawValue())
			}
		}
		if got != tc.want || gotMS != tc.wantMS {
			t.Errorf("%d with Retry-After %q, retry-after-ms %q: set %q and %q, want %q and %q (\"\": left as it came)",
				tc.status, tc.sent, tc.ms, got, gotMS, tc.want, tc.wantMS)
		}
	}
}
