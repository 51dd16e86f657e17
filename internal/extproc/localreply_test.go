package extproc

import (
	"maps"
	"net/http"
	"slices"
	"testing"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvroute/kvroute/internal/metrics/metricstest"
	"github.com/kvroute/kvroute/internal/route"
	"github.com/kvroute/kvroute/internal/testlog"
)

// TestEnvoyFlags: what each of Envoy's response flags says of an answer that came with it and
// no response.code_details (readReport): whether only Envoy's own answers carry it, and whose
// failure it tells. And what the code details say where they come. The flags' bits follow
// Envoy's CoreResponseFlag order. Before, IH, DPE, UAEX, SI, UMSDR, DT and the rest of Envoy's
// own answers were taken for an engine's without details (a 400 from Envoy told the first
// choice as its refusal, a 504 counted as its server_error), UMSDR was nobody's failure with
// them, and SI and DT were nobody's whatever Envoy said of the attempt.
func TestEnvoyFlags(t *testing.T) {
	type want struct {
		own    bool
		failed route.Failure
	}
	nobody := want{own: true}
	engine := want{}
	for _, tc := range []struct {
		name    string
		flags   float64
		details string
		tried   bool // Envoy says it made an attempt (an address served)
		want    want
	}{
		{name: "LH", flags: 0x1, want: nobody},
		{name: "UH", flags: 0x2, want: nobody},
		{name: "UT", flags: 0x4, want: want{true, route.FailTimeout}},
		{name: "LR", flags: 0x8, tried: true, want: nobody},
		{name: "UR", flags: 0x10, want: want{true, route.FailLost}},
		{name: "UF", flags: 0x20, want: want{true, route.FailConnect}},
		{name: "UC", flags: 0x40, want: want{true, route.FailLost}},
		{name: "UO", flags: 0x80, want: nobody},
		{name: "NR", flags: 0x100, want: nobody},
		{name: "DI", flags: 0x200, want: engine},
		{name: "FI", flags: 0x400, want: nobody},
		{name: "RL", flags: 0x800, want: nobody},
		{name: "UAEX", flags: 0x1000, want: nobody},
		{name: "RLSE", flags: 0x2000, want: nobody},
		{name: "DC", flags: 0x4000, want: engine},
		{name: "URX", flags: 0x8000, want: engine},
		{name: "SI, tried", flags: 0x10000, tried: true, want: want{true, route.FailTimeout}},
		{name: "SI, no attempt told", flags: 0x10000, want: nobody},
		{name: "IH", flags: 0x20000, want: nobody},
		{name: "DPE", flags: 0x40000, want: nobody},
		{name: "UMSDR", flags: 0x80000, want: want{true, route.FailTimeout}},
		{name: "RFCF", flags: 0x100000, want: nobody},
		{name: "NFCF", flags: 0x200000, want: nobody},
		{name: "DT, tried", flags: 0x400000, tried: true, want: want{true, route.FailCanceled}},
		{name: "DT, no attempt told", flags: 0x400000, want: nobody},
		{name: "UPE", flags: 0x800000, want: want{true, route.FailLost}},
		{name: "NC", flags: 0x1000000, want: nobody},
		{name: "OM", flags: 0x2000000, want: nobody},
		{name: "DF", flags: 0x4000000, want: nobody},
		{name: "DO", flags: 0x8000000, want: nobody},
		{name: "DR", flags: 0x10000000, want: engine},
		{name: "UDO", flags: 0x20000000, want: nobody},
		// Several flags: the endpoint's failure that one tells, whatever else came.
		{name: "UF and URX", flags: 0x20 | 0x8000, want: want{true, route.FailConnect}},
		{name: "UO and UF", flags: 0x80 | 0x20, want: want{true, route.FailConnect}},
		{name: "URX, the engine's 503", flags: 0x8000, details: "via_upstream", want: engine},
		// The code details alone.
		{name: "via upstream", details: "via_upstream", want: engine},
		{name: "no healthy upstream", details: "no_healthy_upstream", want: nobody},
		{name: "connection refused", details: "upstream_reset_before_response_started{remote_connection_failure,delayed_connect_error:_Connection_refused}", want: want{true, route.FailConnect}},
		{name: "connection timeout", details: "upstream_reset_before_response_started{connection_timeout}", want: want{true, route.FailConnect}},
		{name: "response timeout", details: "response_timeout", want: want{true, route.FailTimeout}},
		{name: "per-try timeout", details: "upstream_per_try_timeout", want: want{true, route.FailTimeout}},
		{name: "per-try idle timeout", details: "upstream_per_try_idle_timeout", want: want{true, route.FailTimeout}},
		{name: "upstream max stream duration", details: "upstream_max_stream_duration_reached", want: want{true, route.FailTimeout}},
		{name: "remote reset", details: "upstream_reset_before_response_started{remote_reset}", want: want{true, route.FailLost}},
		{name: "refused stream", details: "upstream_reset_before_response_started{remote_refused_stream_reset}", want: nobody},
		{name: "connection termination", details: "upstream_reset_before_response_started{connection_termination}", want: want{true, route.FailLost}},
		{name: "protocol error", details: "upstream_reset_before_response_started{protocol_error}", want: want{true, route.FailLost}},
		{name: "local reset", details: "upstream_reset_before_response_started{local_reset}", tried: true, want: nobody},
		{name: "overflow", details: "upstream_reset_before_response_started{overflow}", want: nobody},
		{name: "stream idle timeout, tried", details: "stream_idle_timeout", tried: true, want: want{true, route.FailTimeout}},
		{name: "stream idle timeout", details: "stream_idle_timeout", want: nobody},
		{name: "max duration, tried", details: "max_duration_timeout", tried: true, want: want{true, route.FailCanceled}},
		{name: "request timeout", details: "request_overall_timeout", tried: true, want: nobody},
		{name: "request header timeout", details: "request_header_timeout", want: nobody},
		{name: "body over the buffer", details: "request_payload_too_large", want: nobody},
		{name: "over the retry buffer", details: "request_payload_exceeded_retry_buffer_limit", tried: true, want: nobody},
		{name: "invalid x-envoy headers", details: "request_headers_failed_strict_check", want: nobody},
		{name: "a filter's own", details: "ext_authz_denied", want: nobody},
	} {
		t.Run(tc.name, func(t *testing.T) {
			attrs := map[string]*structpb.Value{}
			if tc.flags != 0 {
				attrs["response.flags"] = structpb.NewNumberValue(tc.flags)
			}
			if tc.details != "" {
				attrs["response.code_details"] = structpb.NewStringValue(tc.details)
			}
			served := ""
			if tc.tried {
				served = "10.0.0.1:8000"
			}
			r := readReport(withAttributes(respHeaders(503, served, false), attrs), http.Header{})
			if got := (want{r.own, r.failed}); got != tc.want {
				t.Errorf("own %v, failed %s; want own %v, failed %s", got.own, got.failed, tc.want.own, tc.want.failed)
			}
		})
	}
}

// TestEnvoyAnswersBeforePick: Envoy answers a request itself before kvroute's pick (its
// request_timeout while the client's body is still coming: 408; a body over its buffer in
// BUFFERED mode: 413), and sends kvroute that answer's head as it sends any answer's. It is
// passed on as it came, with the client's request id, and the request settled with its status
// as a refusal of the router's before its pick is: no endpoint, nothing charged to the
// tenant's tokens, counted in the tenant's requests. An answer to a request whose headers never reached
// kvroute (another filter answered first) is passed on and counted nowhere. Before, each was a
// message out of order: kvroute answered it with its own 500 ext_proc_protocol_error (which,
// in the middle of Envoy's answer, broke it for the client) and counted a 500.
func TestEnvoyAnswersBeforePick(t *testing.T) {
	details := func(d string) map[string]*structpb.Value {
		return map[string]*structpb.Value{"response.code_details": structpb.NewStringValue(d)}
	}
	for _, tc := range []struct {
		name   string
		mode   filterv3.ProcessingMode_BodySendMode
		before []*extprocv3.ProcessingRequest // the request's messages before Envoy's answer
		status int
		attrs  map[string]*structpb.Value
		bodies int // response body messages (0: the head ends the answer)
	}{
		{name: "request timeout, full duplex", mode: fullDuplex, status: http.StatusRequestTimeout,
			before: []*extprocv3.ProcessingRequest{reqHeaders("/v1/chat/completions", false, "authorization", "Bearer sk-acme"),
				reqBody(plainChat[:10], false)},
			attrs: details("request_overall_timeout"), bodies: 1},
		{name: "body over Envoy's buffer, buffered", mode: buffered, status: http.StatusRequestEntityTooLarge,
			before: []*extprocv3.ProcessingRequest{reqHeaders("/v1/chat/completions", false, "authorization", "Bearer sk-acme")},
			attrs:  details("request_payload_too_large"), bodies: 1},
		{name: "Envoy's head alone", mode: fullDuplex, status: http.StatusRequestTimeout,
			before: []*extprocv3.ProcessingRequest{reqHeaders("/v1/chat/completions", false, "authorization", "Bearer sk-acme")},
			attrs:  details("request_header_timeout")},
		{name: "no request", mode: fullDuplex, status: http.StatusForbidden, attrs: details("rbac_access_denied"), bodies: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs testlog.Buffer
			f := tenantFixture(t, &logs, ep1)
			e := f.open(t, tc.mode, tc.mode)
			for _, m := range tc.before {
				e.send(m)
				if m.GetRequestHeaders() != nil && tc.mode == buffered {
					if r := e.recv(); r.GetRequestHeaders() == nil {
						t.Fatalf("want the answer to the request headers, got %v", r)
					}
				}
			}
			e.send(withAttributes(respHeaders(tc.status, "", tc.bodies == 0, "content-type", "text/plain"), tc.attrs))
			r := e.recv()
			if r.GetResponseHeaders() == nil {
				t.Fatalf("want the answer to the response headers, got %v", r)
			}
			head := mutation(r.GetResponseHeaders().GetResponse().GetHeaderMutation())
			if want := "x-request-id: rid-1"; len(tc.before) > 0 && !slices.Contains(head, want) {
				t.Errorf("response header mutation %v lacks %q", head, want)
			}
			for i := range tc.bodies {
				eos := i == tc.bodies-1
				e.send(respBody("Envoy's own answer", eos))
				if tc.mode == fullDuplex {
					if got, _ := e.streamedBody(true); got != "Envoy's own answer" {
						t.Errorf("the client gets %q, want Envoy's answer as it came", got)
					}
				} else if bm := e.recv().GetResponseBody().GetResponse().GetBodyMutation(); bm != nil {
					t.Errorf("Envoy's answer changed: %v", bm)
				}
			}
			e.close()
			if err := f.streamEnded(t); err != nil {
				t.Errorf("Process = %v, want a clean end", err)
			}
			v := metricstest.Values(t, f.reg, "kvroute_requests_total")
			maps.DeleteFunc(v, func(_ string, n float64) bool { return n == 0 })
			tv := metricstest.Values(t, f.reg, "kvroute_tenant_requests_total")
			maps.DeleteFunc(tv, func(_ string, n float64) bool { return n == 0 })
			if len(tc.before) == 0 {
				if len(v) != 0 || len(tv) != 0 {
					t.Errorf("an answer to a request kvroute never saw counted: %v %v", v, tv)
				}
				if n := logs.Count(`"msg":"request"`); n != 0 {
					t.Errorf("%d access lines for a request kvroute never saw", n)
				}
				return
			}
			want := map[string]float64{"kvroute_requests_total{endpoint=none,model=unknown,status=" + itoa(tc.status) + "}": 1}
			if diff := cmp.Diff(want, v); diff != "" {
				t.Errorf("kvroute_requests_total (-want +got):\n%s", diff)
			}
			wantT := map[string]float64{"kvroute_tenant_requests_total{status=" + itoa(tc.status) + ",tenant=acme}": 1}
			if diff := cmp.Diff(wantT, tv); diff != "" {
				t.Errorf("kvroute_tenant_requests_total (-want +got):\n%s", diff)
			}
			line := accessLine(t, &logs)
			if line["status"] != float64(tc.status) || line["endpoint"] != nil || line["error_code"] != nil {
				t.Errorf("access line: status %v, endpoint %v, error_code %v; want %d, none, none", line["status"], line["endpoint"], line["error_code"], tc.status)
			}
			if line["charged_prompt_tokens"] != 0.0 || line["charged_completion_tokens"] != 0.0 {
				t.Errorf("tenant charged %v prompt and %v completion tokens for Envoy's answer, want none",
					line["charged_prompt_tokens"], line["charged_completion_tokens"])
			}
			if ev := f.pk.events(); len(ev) != 0 {
				t.Errorf("the policy heard %v of a request never routed", ev)
			}
			if n := f.pool.ByName(ep1).InFlight(); n != 0 {
				t.Errorf("in flight = %d", n)
			}
		})
	}
}
