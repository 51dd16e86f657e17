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

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/metrics/metricstest"
	"github.com/kvroute/kvroute/internal/tenant"
	"github.com/kvroute/kvroute/internal/testlog"
)

// errorAnswer is an engine's error body, as OpenAI's API shapes it.
const errorAnswer = `{"error":{"message":"no","type":"x","param":null,"code":null}}`

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
// endpoint header naming the first choice. The endpoints of the list are charged a failed
// attempt (why, Envoy does not say: route.FailUnknown, told to the policy, not counted towards
// ejection) only where Envoy's attempt count says it tried each. An answer from an endpoint
// kvroute ranked but did not give Envoy (extproc.max_endpoints cut it off) is that endpoint's,
// and the endpoints passed that nothing says Envoy tried have no attempt opened on them.
// Before, every such answer was the first choice's. An error from elsewhere (a 500, a 502, or a
// refusal: 503, 429, 404) is no endpoint's either: counted under none, on the access line
// without an endpoint, whether or not an attempt count came, nothing told to health (no refusal
// either); a refusal costs the tenant nothing. Before, the Exchange counted it on the call's
// last endpoint (the first choice), which had never seen the request.
func TestAnswerFromElsewhere(t *testing.T) {
	for _, tc := range []struct {
		name     string
		served   string
		status   int      // 0: 200
		kv       []string // response headers
		events   []string
		unknown  []string // the endpoints charged a failure Envoy does not tell (route.FailUnknown)
		endpoint string   // kvroute_requests_total's endpoint label
		attempts float64
	}{
		{
			name: "fallback, no count", served: "10.9.9.9:8000",
			events:   []string{"routed " + ep1, "done " + ep1 + " ok=false cached=false"},
			endpoint: "none", attempts: 1,
		},
		{
			name: "fallback, one attempt", served: "10.9.9.9:8000", kv: []string{"x-envoy-attempt-count", "1"},
			events:   []string{"routed " + ep1, "done " + ep1 + " ok=false cached=false"},
			endpoint: "none", attempts: 1,
		},
		{
			// Envoy tried both of the list and went on: both failed, why Envoy does not say.
			name: "fallback after the list", served: "10.9.9.9:8000", kv: []string{"x-envoy-attempt-count", "3"},
			events:   []string{"routed " + ep1, "done " + ep1 + " ok=false cached=false", "routed " + ep2, "done " + ep2 + " ok=false cached=false"},
			unknown:  []string{ep1, ep2},
			endpoint: "none", attempts: 3,
		},
		{
			// Whether Envoy tried ep2 nothing says: no attempt is opened on it.
			name: "ranked but not listed", served: "10.0.0.3:8000",
			events:   []string{"routed " + ep1, "done " + ep1 + " ok=false cached=false", "routed " + ep3, "done " + ep3 + " ok=true cached=true"},
			endpoint: ep3, attempts: 2,
		},
		{
			name: "fallback's 500, no count", served: "10.9.9.9:8000", status: http.StatusInternalServerError,
			events:   []string{"routed " + ep1, "done " + ep1 + " ok=false cached=false"},
			endpoint: "none", attempts: 1,
		},
		{
			name: "fallback's 500 after the list", served: "10.9.9.9:8000", status: http.StatusInternalServerError, kv: []string{"x-envoy-attempt-count", "3"},
			events:   []string{"routed " + ep1, "done " + ep1 + " ok=false cached=false", "routed " + ep2, "done " + ep2 + " ok=false cached=false"},
			unknown:  []string{ep1, ep2},
			endpoint: "none", attempts: 3,
		},
		{
			name: "fallback's 502", served: "10.9.9.9:8000", status: http.StatusBadGateway, kv: []string{"x-envoy-attempt-count", "1"},
			events:   []string{"routed " + ep1, "done " + ep1 + " ok=false cached=false"},
			endpoint: "none", attempts: 1,
		},
		{
			name: "fallback's 503", served: "10.9.9.9:8000", status: http.StatusServiceUnavailable,
			events:   []string{"routed " + ep1, "done " + ep1 + " ok=false cached=false"},
			endpoint: "none", attempts: 1,
		},
		{
			name: "fallback's 429 after the list", served: "10.9.9.9:8000", status: http.StatusTooManyRequests, kv: []string{"x-envoy-attempt-count", "3"},
			events:   []string{"routed " + ep1, "done " + ep1 + " ok=false cached=false", "routed " + ep2, "done " + ep2 + " ok=false cached=false"},
			unknown:  []string{ep1, ep2},
			endpoint: "none", attempts: 3,
		},
		{
			name: "fallback's 404", served: "10.9.9.9:8000", status: http.StatusNotFound,
			events:   []string{"routed " + ep1, "done " + ep1 + " ok=false cached=false"},
			endpoint: "none", attempts: 1,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs testlog.Buffer
			f := tenantFixture(t, &logs, ep1, ep2, ep3) // its access lines say what the tenant was charged
			f.srv.MaxEndpoints = 2
			f.h.EndpointHeader = "x-kvroute-endpoint"
			f.h.Logger = slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
			e, r := f.routed(t, plainChat, "authorization", "Bearer sk-acme")
			if got := destination(r); got != "10.0.0.1:8000,10.0.0.2:8000" {
				t.Fatalf("destination = %q", got)
			}
			status, body := http.StatusOK, jsonAnswer
			if tc.status != 0 {
				status, body = tc.status, errorAnswer
			}
			kv := append([]string{"content-type", "application/json"}, tc.kv...)
			head := mutation(f.answer(t, e, respHeaders(status, tc.served, false, kv...), body).GetResponseHeaders().GetResponse().GetHeaderMutation())
			if diff := cmp.Diff(tc.events, f.pk.events()); diff != "" {
				t.Errorf("policy events (-want +got):\n%s", diff)
			}
			if got := f.health.failures(); len(got) != 0 {
				t.Errorf("failures told to health checking: %v, want none", got)
			}
			if diff := cmp.Diff(tc.unknown, f.pk.failures()); diff != "" {
				t.Errorf("attempts the policy heard failed (-want +got):\n%s", diff)
			}
			if got := f.health.refusals(); len(got) != 0 {
				t.Errorf("refusals told to health checking: %v, want none", got)
			}
			v := metricstest.Values(t, f.reg, "kvroute_requests_total")
			maps.DeleteFunc(v, func(_ string, n float64) bool { return n == 0 }) // the series made ahead
			want := map[string]float64{"kvroute_requests_total{endpoint=" + tc.endpoint + ",model=m,status=" + itoa(status) + "}": 1}
			if diff := cmp.Diff(want, v); diff != "" {
				t.Errorf("kvroute_requests_total (-want +got):\n%s", diff)
			}
			line := accessLine(t, &logs)
			if ep, ok := line["endpoint"]; ok != (tc.endpoint != "none") || ok && ep != tc.endpoint {
				t.Errorf("access line's endpoint %v, want %s (none: no endpoint field)", ep, tc.endpoint)
			}
			if line["attempts"] != tc.attempts {
				t.Errorf("access line's attempts %v, want %v", line["attempts"], tc.attempts)
			}
			refusal := status == http.StatusServiceUnavailable || status == http.StatusTooManyRequests || status == http.StatusNotFound
			if got := line["charged_prompt_tokens"]; (got == 0.0) != refusal {
				t.Errorf("tenant charged %v prompt tokens for a %d: want nothing only for a refusal", got, status)
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
// address its cluster does not have). Only endpoints it tried are charged a failed attempt;
// without a count, every one passed is, as before. Before, every endpoint passed was charged,
// the ones Envoy skipped too. The failure charged is one whose reason is unknown
// (route.FailUnknown): the policy hears it, health checking does not count it towards ejection
// (before, a connect_error, which it counted: three 429s Envoy retried past a busy engine
// ejected it).
func TestEnvoyPassedOver(t *testing.T) {
	count := func(n float64) map[string]*structpb.Value {
		return map[string]*structpb.Value{"upstream.request_attempt_count": structpb.NewNumberValue(n)}
	}
	for _, tc := range []struct {
		name    string
		kv      []string
		attrs   map[string]*structpb.Value
		unknown []string // the endpoints whose attempt the policy heard failed
	}{
		{name: "no count", unknown: []string{ep1, ep2}},
		{name: "header, each tried", kv: []string{"x-envoy-attempt-count", "3"}, unknown: []string{ep1, ep2}},
		{name: "header, none tried", kv: []string{"x-envoy-attempt-count", "1"}},
		{name: "attribute, none tried", attrs: count(1)},
		{name: "attribute, each tried", attrs: count(3), unknown: []string{ep1, ep2}},
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
			if got := f.health.failures(); len(got) != 0 {
				t.Errorf("failures told to health checking: %v, want none", got)
			}
			if diff := cmp.Diff(tc.unknown, f.pk.failures()); diff != "" {
				t.Errorf("attempts the policy heard failed (-want +got):\n%s", diff)
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

	// ep2 is ranked between the two but left off Envoy's list: it does not honour the tenant's
	// cache_salt, so its body differs. Envoy never had it: no attempt is opened on it, with a
	// count or without. Before, the walk opened one on it and closed it at once (the policy
	// told it was routed and done).
	for _, tc := range []struct {
		name string
		kv   []string
	}{
		{name: "no count"},
		{name: "each tried", kv: []string{"x-envoy-attempt-count", "2"}},
	} {
		t.Run("ranked, not listed, "+tc.name, func(t *testing.T) {
			var logs testlog.Buffer
			f := tenantFixture(t, &logs, ep1, ep2, ep3)
			specs := make([]endpoint.Spec, 0, 3)
			for _, n := range []string{ep1, ep2, ep3} {
				specs = append(specs, endpoint.Spec{Name: n, Models: []string{"m"}, Engine: "vllm", CacheSalt: n != ep2})
			}
			if _, err := f.pool.Update(specs); err != nil {
				t.Fatal(err)
			}
			e, r := f.routed(t, plainChat, "authorization", "Bearer sk-acme")
			if got := destination(r); got != "10.0.0.1:8000,10.0.0.3:8000" {
				t.Fatalf("destination = %q, want ep2 left off", got)
			}
			head := respHeaders(200, "10.0.0.3:8000", false, append([]string{"content-type", "application/json"}, tc.kv...)...)
			f.answer(t, e, head, jsonAnswer)
			want := []string{"routed " + ep1, "done " + ep1 + " ok=false cached=false", "routed " + ep3, "done " + ep3 + " ok=true cached=true"}
			if diff := cmp.Diff(want, f.pk.events()); diff != "" {
				t.Errorf("policy events (-want +got):\n%s", diff)
			}
			if got := f.health.failures(); len(got) != 0 {
				t.Errorf("failures told to health checking: %v, want none", got)
			}
			if diff := cmp.Diff([]string{ep1}, f.pk.failures()); diff != "" {
				t.Errorf("attempts the policy heard failed (-want +got):\n%s", diff)
			}
			if got := accessLine(t, &logs)["attempts"]; got != 2.0 {
				t.Errorf("access line's attempts %v, want 2", got)
			}
			for _, n := range []string{ep1, ep2, ep3} {
				if in := f.pool.ByName(n).InFlight(); in != 0 {
					t.Errorf("%s in flight = %d", n, in)
				}
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

// TestEnvoyOwnAnswer: Envoy's own answers other than one after a failed connection. One given
// for reasons of Envoy's own (no healthy upstream, a circuit breaker's overflow, no route, its
// own rate limit), told by response.code_details or, without them, response.flags, is no
// endpoint's: nothing told to health (no failure, no refusal), the attempt closed as nobody's,
// counted under none. Before, each was charged to the first choice as the engine's own answer:
// a 503 counted unavailable (three in a row eject the endpoint), a 404 a refusal. One given
// because the endpoint Envoy tried failed the attempt (a timeout, a reset) charges that endpoint
// as `kvroute serve` charges the attempt: a timeout (it was a server_error, the 504 taken for
// the engine's), a lost connection; the request is counted on it, the access line says
// upstream_timeout or upstream_connection_lost, as serve's would.
func TestEnvoyOwnAnswer(t *testing.T) {
	num := structpb.NewNumberValue
	str := structpb.NewStringValue
	none := []string{"routed " + ep1, "done " + ep1 + " ok=false cached=false"}
	for _, tc := range []struct {
		name     string
		status   int
		served   string
		kv       []string
		attrs    map[string]*structpb.Value
		events   []string
		failures []string
		unknown  []string // the endpoints whose failure the policy heard (route.FailUnknown)
		endpoint string   // kvroute_requests_total's label
		code     string   // the access line's error_code
	}{
		{name: "no healthy upstream, flags", status: 503, attrs: map[string]*structpb.Value{"response.flags": num(0x2)},
			events: none, endpoint: "none"},
		{name: "no healthy upstream, details", status: 503, attrs: map[string]*structpb.Value{"response.code_details": str("no_healthy_upstream")},
			events: none, endpoint: "none"},
		{name: "circuit breaker", status: 503, served: "10.0.0.1:8000", attrs: map[string]*structpb.Value{
			"response.flags": num(0x80), "response.code_details": str("upstream_reset_before_response_started{overflow}")},
			events: none, endpoint: "none"},
		{name: "no route", status: 404, attrs: map[string]*structpb.Value{"response.flags": num(0x100), "response.code_details": str("route_not_found")},
			events: none, endpoint: "none"},
		{name: "Envoy's rate limit", status: 429, attrs: map[string]*structpb.Value{"response.flags": num(0x800), "response.code_details": str("local_rate_limited")},
			events: none, endpoint: "none"},
		{name: "timeout, flags", status: 504, served: "10.0.0.1:8000", attrs: map[string]*structpb.Value{"response.flags": num(0x4)},
			events: none, failures: []string{ep1 + " timeout"}, endpoint: ep1, code: "upstream_timeout"},
		{name: "per-try timeout", status: 504, attrs: map[string]*structpb.Value{"response.code_details": str("upstream_per_try_timeout")},
			events: none, failures: []string{ep1 + " timeout"}, endpoint: ep1, code: "upstream_timeout"},
		{name: "response timeout", status: 504, attrs: map[string]*structpb.Value{"response.code_details": str("response_timeout")},
			events: none, failures: []string{ep1 + " timeout"}, endpoint: ep1, code: "upstream_timeout"},
		{name: "reset", status: 503, served: "10.0.0.1:8000", attrs: map[string]*structpb.Value{
			"response.flags": num(0x10), "response.code_details": str("upstream_reset_before_response_started{remote_reset}")},
			events: none, failures: []string{ep1 + " lost"}, endpoint: ep1, code: "upstream_connection_lost"},
		{name: "timeout at the second", status: 504, served: "10.0.0.2:8000", kv: []string{"x-envoy-attempt-count", "2"},
			attrs:    map[string]*structpb.Value{"response.flags": num(0x4), "response.code_details": str("upstream_per_try_timeout")},
			events:   []string{"routed " + ep1, "done " + ep1 + " ok=false cached=false", "routed " + ep2, "done " + ep2 + " ok=false cached=false"},
			failures: []string{ep2 + " timeout"}, unknown: []string{ep1}, endpoint: ep2, code: "upstream_timeout"},
		// The cluster's max_stream_duration ran out at the endpoint: a timeout, as UT. Before,
		// without details the flag was not read as Envoy's own (the 504 counted as the
		// engine's server_error), and with them the answer was nobody's.
		{name: "upstream max stream duration, flags", status: 504, served: "10.0.0.1:8000", attrs: map[string]*structpb.Value{"response.flags": num(0x80000)},
			events: none, failures: []string{ep1 + " timeout"}, endpoint: ep1, code: "upstream_timeout"},
		{name: "upstream max stream duration, details", status: 504, attrs: map[string]*structpb.Value{
			"response.flags": num(0x80000), "response.code_details": str("upstream_max_stream_duration_reached")},
			events: none, failures: []string{ep1 + " timeout"}, endpoint: ep1, code: "upstream_timeout"},
		// The stream idle timeout while the endpoint had the request (Envoy says it made an
		// attempt): the engine's silence, a timeout. Without a sign of an attempt it may have
		// run out before any (while kvroute held the pick): nobody's.
		{name: "stream idle timeout at the endpoint", status: 504, served: "10.0.0.1:8000", attrs: map[string]*structpb.Value{
			"response.flags": num(0x10000), "response.code_details": str("stream_idle_timeout")},
			events: none, failures: []string{ep1 + " timeout"}, endpoint: ep1, code: "upstream_timeout"},
		{name: "stream idle timeout, counted attempt", status: 504, attrs: map[string]*structpb.Value{
			"response.flags": num(0x10000), "upstream.request_attempt_count": num(1)},
			events: none, failures: []string{ep1 + " timeout"}, endpoint: ep1, code: "upstream_timeout"},
		{name: "stream idle timeout, no attempt", status: 408, attrs: map[string]*structpb.Value{
			"response.flags": num(0x10000), "upstream.request_attempt_count": num(0)},
			events: none, endpoint: "none"},
		// The stream's max duration: its own deadline, as a client's leaving (counted only
		// against an engine found stalled); the request is counted on the endpoint that had it.
		// Before, nobody's: the access line said nothing of it.
		{name: "max stream duration", status: 504, served: "10.0.0.1:8000", attrs: map[string]*structpb.Value{
			"response.flags": num(0x400000), "response.code_details": str("max_duration_timeout")},
			events: none, endpoint: ep1, code: "max_stream_duration"},
		{name: "max stream duration, no attempt", status: 504, attrs: map[string]*structpb.Value{"response.flags": num(0x400000)},
			events: none, endpoint: "none"},
		// Envoy reset the upstream stream itself: nobody's.
		{name: "local reset", status: 503, served: "10.0.0.1:8000", attrs: map[string]*structpb.Value{
			"response.flags": num(0x8), "response.code_details": str("upstream_reset_before_response_started{local_reset}")},
			events: none, endpoint: "none"},
		// Envoy refused the request for the client's doing, or an authorization filter did:
		// nobody's. Before, without details, the first choice was told a refusal it never made.
		{name: "invalid x-envoy headers, flags", status: 400, attrs: map[string]*structpb.Value{"response.flags": num(0x20000)},
			events: none, endpoint: "none"},
		{name: "downstream protocol error, flags", status: 400, attrs: map[string]*structpb.Value{"response.flags": num(0x40000)},
			events: none, endpoint: "none"},
		{name: "external authorization, flags", status: 403, attrs: map[string]*structpb.Value{"response.flags": num(0x1000)},
			events: none, endpoint: "none"},
		{name: "body over Envoy's buffer", status: 413, attrs: map[string]*structpb.Value{"response.code_details": str("request_payload_too_large")},
			events: none, endpoint: "none"},
		{name: "request timeout", status: 408, attrs: map[string]*structpb.Value{"response.code_details": str("request_overall_timeout")},
			events: none, endpoint: "none"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs testlog.Buffer
			f := newFixture(t, []string{ep1, ep2}, withLog(&logs))
			e, _ := f.routed(t, plainChat)
			kv := append([]string{"content-type", "text/plain"}, tc.kv...)
			f.answer(t, e, withAttributes(respHeaders(tc.status, tc.served, false, kv...), tc.attrs), "upstream request timeout")
			if diff := cmp.Diff(tc.failures, f.health.failures()); diff != "" {
				t.Errorf("failures told to health checking (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.unknown, f.pk.failures()); diff != "" {
				t.Errorf("attempts the policy heard failed (-want +got):\n%s", diff)
			}
			if got := f.health.refusals(); len(got) != 0 {
				t.Errorf("refusals told to health checking: %v, want none", got)
			}
			if diff := cmp.Diff(tc.events, f.pk.events()); diff != "" {
				t.Errorf("policy events (-want +got):\n%s", diff)
			}
			v := metricstest.Values(t, f.reg, "kvroute_requests_total")
			maps.DeleteFunc(v, func(_ string, n float64) bool { return n == 0 })
			want := map[string]float64{"kvroute_requests_total{endpoint=" + tc.endpoint + ",model=m,status=" + itoa(tc.status) + "}": 1}
			if diff := cmp.Diff(want, v); diff != "" {
				t.Errorf("kvroute_requests_total (-want +got):\n%s", diff)
			}
			if got, _ := accessLine(t, &logs)["error_code"].(string); got != tc.code {
				t.Errorf("access line's error_code %q, want %q", got, tc.code)
			}
			for _, n := range []string{ep1, ep2} {
				if in := f.pool.ByName(n).InFlight(); in != 0 {
					t.Errorf("%s in flight = %d", n, in)
				}
			}
		})
	}
}

// TestServedNoLongerUsable: Envoy answered from an endpoint of the list that is no longer
// usable (unavailable since the pick): the answer is that endpoint's all the same (Envoy went
// there), credited to it, and the endpoint Envoy tried before it charged. Likewise where the
// answer came from elsewhere after Envoy tried the whole list, one of which is no longer usable:
// it is charged its failed attempt (route.FailUnknown) as the others are. Before, route.Call.Next would have passed
// over the endpoint, so extproc guessed where Next would go and stopped short: an answer from
// the served endpoint was no endpoint's, and the unusable one's failure was told to nobody.
func TestServedNoLongerUsable(t *testing.T) {
	for _, tc := range []struct {
		name     string
		served   string
		max      int // extproc.max_endpoints
		events   []string
		unknown  []string // the endpoints whose failure the policy heard (route.FailUnknown)
		endpoint string   // kvroute_requests_total's endpoint label
	}{
		{name: "served", served: "10.0.0.2:8000",
			events:  []string{"routed " + ep1, "done " + ep1 + " ok=false cached=false", "routed " + ep2, "done " + ep2 + " ok=true cached=true"},
			unknown: []string{ep1}, endpoint: ep2},
		{name: "elsewhere after the list", served: "10.9.9.9:8000", max: 2,
			events:  []string{"routed " + ep1, "done " + ep1 + " ok=false cached=false", "routed " + ep2, "done " + ep2 + " ok=false cached=false"},
			unknown: []string{ep1, ep2}, endpoint: "none"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, []string{ep1, ep2, ep3})
			f.srv.MaxEndpoints = tc.max
			e, _ := f.routed(t, plainChat)
			f.pool.ByName(ep2).SetHealthy(false)
			f.answer(t, e, respHeaders(200, tc.served, false, "content-type", "application/json", "x-envoy-attempt-count", "3"), jsonAnswer)
			if diff := cmp.Diff(tc.events, f.pk.events()); diff != "" {
				t.Errorf("policy events (-want +got):\n%s", diff)
			}
			if got := f.health.failures(); len(got) != 0 {
				t.Errorf("failures told to health checking: %v, want none", got)
			}
			if diff := cmp.Diff(tc.unknown, f.pk.failures()); diff != "" {
				t.Errorf("attempts the policy heard failed (-want +got):\n%s", diff)
			}
			v := metricstest.Values(t, f.reg, "kvroute_requests_total")
			if got := v["kvroute_requests_total{endpoint="+tc.endpoint+",model=m,status=200}"]; got != 1 {
				t.Errorf("requests_total under %s = %v, want 1 (%v)", tc.endpoint, got, v)
			}
			for _, n := range []string{ep1, ep2, ep3} {
				if in := f.pool.ByName(n).InFlight(); in != 0 {
					t.Errorf("%s in flight = %d", n, in)
				}
			}
		})
	}
}

// TestEnvoyAttemptCount: the access line's attempts are the attempts Envoy made where its count
// says (x-envoy-attempt-count, upstream.request_attempt_count), not the endpoints kvroute moved
// the call past; without a count, the call's. An answer from one attempt teaches the tenant
// gate the endpoint's decode rate, which needs one attempt (its time is the engine's alone).
// Before, an answer from the third of the list that Envoy reached in one attempt (the first two
// skipped untried) was logged with 3 attempts, and taught nothing.
func TestEnvoyAttemptCount(t *testing.T) {
	for _, tc := range []struct {
		name string
		kv   []string
		want float64
	}{
		{name: "one attempt", kv: []string{"x-envoy-attempt-count", "1"}, want: 1},
		{name: "each tried", kv: []string{"x-envoy-attempt-count", "3"}, want: 3},
		{name: "no count", want: 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs testlog.Buffer
			f := newFixture(t, []string{ep1, ep2, ep3}, withLog(&logs))
			e, _ := f.routed(t, plainChat)
			f.answer(t, e, respHeaders(200, "10.0.0.3:8000", false, append([]string{"content-type", "application/json"}, tc.kv...)...), jsonAnswer)
			if got := accessLine(t, &logs)["attempts"]; got != tc.want {
				t.Errorf("access line's attempts %v, want %v", got, tc.want)
			}
		})
	}

	var logs testlog.Buffer
	f := tenantFixture(t, &logs, ep1, ep2)
	long := `{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}],` +
		`"usage":{"prompt_tokens":10,"completion_tokens":64,"total_tokens":74}}`
	for range tenant.MinDecodeSamples {
		e, _ := f.routed(t, plainChat, "authorization", "Bearer sk-acme")
		f.answer(t, e, respHeaders(200, "10.0.0.2:8000", false, "content-type", "application/json", "x-envoy-attempt-count", "1"), long)
	}
	if _, from := f.h.Gate.DecodeRates().Rate(ep2); from != "endpoint" {
		t.Errorf("%s's decode rate is the %s's after %d answers from one attempt each, want its own", ep2, from, tenant.MinDecodeSamples)
	}
}
