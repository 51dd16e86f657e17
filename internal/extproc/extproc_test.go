package extproc

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/metrics/metricstest"
	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/proxy"
	"github.com/kvroute/kvroute/internal/tenant"
	"github.com/kvroute/kvroute/internal/testlog"
)

const (
	fullDuplex = filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
	buffered   = filterv3.ProcessingMode_BUFFERED
	streamed   = filterv3.ProcessingMode_STREAMED
	noBody     = filterv3.ProcessingMode_NONE
)

const (
	streamChat = `{"model":"m","stream":true,"messages":[{"role":"user","content":"hello there, how are you?"}]}`
	plainChat  = `{"model":"m","messages":[{"role":"user","content":"hello there"}]}`
	usage      = `{"prompt_tokens":10,"completion_tokens":1,"total_tokens":11,"prompt_tokens_details":{"cached_tokens":5}}`
	event1     = "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n"
	usageEvent = "data: {\"id\":\"c1\",\"choices\":[],\"usage\":" + usage + "}\n\n"
	doneEvent  = "data: [DONE]\n\n"
	jsonAnswer = `{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}],"usage":` + usage + `}`
)

// TestFullDuplexStreamedChat plays Envoy in FULL_DUPLEX_STREAMED mode both ways: the headers,
// the body in chunks (end_of_stream on the last), then the streamed answer cut at odd places.
func TestFullDuplexStreamedChat(t *testing.T) {
	f := newFixture(t, []string{ep1, ep2, ep3})
	e := f.open(t, fullDuplex, fullDuplex)
	e.send(reqHeaders("/v1/chat/completions", false))
	e.send(reqBody(streamChat[:7], false))
	e.send(reqBody(streamChat[7:40], false))
	e.send(reqBody(streamChat[40:], true))

	// The deferred answer to the headers carries the pick, then the body comes back: with
	// include_usage added, since the client did not ask for it and kvroute learns from it.
	forwarded, err := openai.WithIncludeUsage([]byte(streamChat))
	if err != nil {
		t.Fatal(err)
	}
	r := e.recv()
	hr := r.GetRequestHeaders()
	if hr == nil {
		t.Fatalf("want the answer to the request headers, got %v", r)
	}
	wantList := "10.0.0.1:8000,10.0.0.2:8000,10.0.0.3:8000"
	want := []string{DestinationKey + ": " + wantList, "x-request-id: rid-1", "content-length: " + itoa(len(forwarded))}
	if diff := cmp.Diff(want, mutation(hr.GetResponse().GetHeaderMutation())); diff != "" {
		t.Errorf("request header mutation (-want +got):\n%s", diff)
	}
	if got := destination(r); got != wantList {
		t.Errorf("dynamic metadata %s/%s = %q, want %q", LBNamespace, DestinationKey, got, wantList)
	}
	body, _ := e.streamedBody(false)
	if body != string(forwarded) {
		t.Errorf("forwarded body = %s, want %s", body, forwarded)
	}

	e.send(respHeaders(200, "10.0.0.1:8000", false, "content-type", "text/event-stream"))
	if rh := e.recv().GetResponseHeaders(); rh == nil || !slices.Contains(mutation(rh.GetResponse().GetHeaderMutation()), "x-request-id: rid-1") {
		t.Fatalf("want the answer to the response headers with x-request-id, got %v", rh)
	}
	answer := event1 + usageEvent + doneEvent
	for _, cut := range [][2]int{{0, 5}, {5, 60}, {60, len(event1) + 30}, {len(event1) + 30, len(answer)}} {
		e.send(respBody(answer[cut[0]:cut[1]], cut[1] == len(answer)))
	}
	got, _ := e.streamedBody(true)
	if want := event1 + doneEvent; got != want {
		t.Errorf("client's stream = %q, want %q (the usage chunk kvroute asked for dropped)", got, want)
	}
	e.close()
	if err := f.streamEnded(t); err != nil {
		t.Errorf("Process = %v, want nil", err)
	}
	wantEvents := []string{"routed " + ep1, "first " + ep1, "done " + ep1 + " ok=true cached=true"}
	if diff := cmp.Diff(wantEvents, f.pk.events()); diff != "" {
		t.Errorf("policy events (-want +got):\n%s", diff)
	}
	if n := f.pool.ByName(ep1).InFlight(); n != 0 {
		t.Errorf("in flight on %s = %d after the end, want 0", ep1, n)
	}
	v := metricstest.Values(t, f.reg, "kvroute_")
	if got := v["kvroute_requests_total{endpoint="+ep1+",model=m,status=200}"]; got != 1 {
		t.Errorf("requests_total 200 on %s = %v, want 1", ep1, got)
	}
	if got := v["kvroute_engine_cached_tokens_total{model=m}"]; got != 5 {
		t.Errorf("engine_cached_tokens_total = %v, want 5", got)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// TestBufferedChat plays Envoy in BUFFERED mode: the headers are answered at once, the pick
// comes with the answer to the whole body, and the whole answer is read for its usage.
func TestBufferedChat(t *testing.T) {
	f := newFixture(t, []string{ep2, ep1})
	e := f.open(t, buffered, buffered)
	e.send(reqHeaders("/v1/chat/completions", false))
	if r := e.recv(); r.GetRequestHeaders() == nil || r.GetRequestHeaders().GetResponse().GetHeaderMutation() != nil {
		t.Fatalf("want a plain answer to the request headers, got %v", r)
	}
	e.send(reqBody(plainChat, true))
	r := e.recv()
	br := r.GetRequestBody()
	if br == nil {
		t.Fatalf("want the answer to the request body, got %v", r)
	}
	want := []string{DestinationKey + ": 10.0.0.2:8000,10.0.0.1:8000", "x-request-id: rid-1", "content-length: " + itoa(len(plainChat))}
	if diff := cmp.Diff(want, mutation(br.GetResponse().GetHeaderMutation())); diff != "" {
		t.Errorf("header mutation (-want +got):\n%s", diff)
	}
	if bm := br.GetResponse().GetBodyMutation(); bm != nil {
		t.Errorf("body mutation %v for a body kvroute does not change", bm)
	}
	if got := destination(r); got != "10.0.0.2:8000,10.0.0.1:8000" {
		t.Errorf("metadata destination = %q", got)
	}
	e.send(respHeaders(200, "10.0.0.2:8000", false, "content-type", "application/json", "content-length", itoa(len(jsonAnswer))))
	if rh := e.recv().GetResponseHeaders(); rh == nil || slices.Contains(mutation(rh.GetResponse().GetHeaderMutation()), "-content-length") {
		t.Fatalf("want the answer to the response headers keeping content-length, got %v", rh)
	}
	e.send(respBody(jsonAnswer, true))
	if rb := e.recv().GetResponseBody(); rb == nil || rb.GetResponse().GetBodyMutation() != nil {
		t.Fatalf("want the answer to the response body, unchanged, got %v", rb)
	}
	e.close()
	if err := f.streamEnded(t); err != nil {
		t.Errorf("Process = %v", err)
	}
	wantEvents := []string{"routed " + ep2, "done " + ep2 + " ok=true cached=true"}
	if diff := cmp.Diff(wantEvents, f.pk.events()); diff != "" {
		t.Errorf("policy events (-want +got):\n%s", diff)
	}
}

// TestNoProtocolConfig: a gateway that does not name its body modes is taken to stream both
// ways in FULL_DUPLEX_STREAMED mode, as the Inference Extension's gateways are configured.
func TestNoProtocolConfig(t *testing.T) {
	f := newFixture(t, []string{ep1})
	e := f.open(t, fullDuplex, fullDuplex)
	e.cfg = nil
	e.send(reqHeaders("/v1/chat/completions", false))
	e.send(reqBody(plainChat, true))
	if got := destination(e.recv()); got != "10.0.0.1:8000" {
		t.Errorf("destination = %q", got)
	}
	if body, _ := e.streamedBody(false); body != plainChat {
		t.Errorf("body = %q", body)
	}
	e.close()
	f.streamEnded(t)
}

// TestStreamedResponseMode: in STREAMED response mode each chunk gets one answer, replacing
// the chunk when kvroute holds part of an event or drops the usage chunk.
func TestStreamedResponseMode(t *testing.T) {
	f := newFixture(t, []string{ep1})
	e := f.open(t, buffered, streamed)
	e.send(reqHeaders("/v1/chat/completions", false))
	e.recv()
	e.send(reqBody(streamChat, true))
	if e.recv().GetRequestBody().GetResponse().GetBodyMutation().GetBody() == nil {
		t.Fatal("want the body replaced (include_usage added)")
	}
	e.send(respHeaders(200, "", false, "content-type", "text/event-stream"))
	e.recv()
	var got string
	chunks := []string{event1[:10], event1[10:] + usageEvent, doneEvent}
	for i, c := range chunks {
		e.send(respBody(c, i == len(chunks)-1))
		bm := e.recv().GetResponseBody().GetResponse().GetBodyMutation()
		if bm == nil {
			got += c
		} else {
			got += string(bm.GetBody())
		}
	}
	if want := event1 + doneEvent; got != want {
		t.Errorf("client's stream = %q, want %q", got, want)
	}
	e.close()
	if err := f.streamEnded(t); err != nil {
		t.Errorf("Process = %v", err)
	}
	if diff := cmp.Diff([]string{"routed " + ep1, "first " + ep1, "done " + ep1 + " ok=true cached=true"}, f.pk.events()); diff != "" {
		t.Errorf("policy events (-want +got):\n%s", diff)
	}
}

// immediate receives an immediate response and returns its status, body and headers.
func (e *envoy) immediate() (int, openai.Error, []string) {
	e.t.Helper()
	r := e.recv()
	ir := r.GetImmediateResponse()
	if ir == nil {
		e.t.Fatalf("want an immediate response, got %v", r)
	}
	var body struct {
		Error openai.Error `json:"error"`
	}
	if err := json.Unmarshal(ir.GetBody(), &body); err != nil {
		e.t.Fatalf("immediate response body %q is not an OpenAI error: %v", ir.GetBody(), err)
	}
	return int(ir.GetStatus().GetCode()), body.Error, mutation(ir.GetHeaders())
}

// TestImmediateErrors: what a request that cannot be routed gets, as Envoy sends it on.
func TestImmediateErrors(t *testing.T) {
	for _, tc := range []struct {
		name   string
		names  []string
		msgs   []*extprocv3.ProcessingRequest
		status int
		code   string
	}{
		{"malformed body", []string{ep1}, []*extprocv3.ProcessingRequest{reqHeaders("/v1/chat/completions", false), reqBody(`{"model":`, true)}, 400, ""},
		{"no body", []string{ep1}, []*extprocv3.ProcessingRequest{reqHeaders("/v1/chat/completions", true)}, 400, ""},
		{"unknown path", []string{ep1}, []*extprocv3.ProcessingRequest{reqHeaders("/v2/things", false)}, 404, "unknown_url"},
		{"unknown model", []string{ep1}, []*extprocv3.ProcessingRequest{reqHeaders("/v1/chat/completions", false),
			reqBody(`{"model":"other","messages":[{"role":"user","content":"x"}]}`, true)}, 404, "model_not_found"},
		{"only a named host", []string{epName}, []*extprocv3.ProcessingRequest{reqHeaders("/v1/chat/completions", false), reqBody(plainChat, true)}, 503, "no_healthy_endpoint"},
		{"empty subset", []string{ep1, ep2}, []*extprocv3.ProcessingRequest{withSubset(reqHeaders("/v1/chat/completions", false)), reqBody(plainChat, true)}, 503, "no_healthy_endpoint"},
		{"subset of strangers", []string{ep1, ep2}, []*extprocv3.ProcessingRequest{withSubset(reqHeaders("/v1/chat/completions", false), "10.9.9.9:80"), reqBody(plainChat, true)}, 503, "no_healthy_endpoint"},
		{"too large", []string{ep1}, []*extprocv3.ProcessingRequest{reqHeaders("/v1/chat/completions", false), reqBody(strings.Repeat("x", 40<<10), false), reqBody(strings.Repeat("x", 40<<10), true)}, 413, "request_too_large"},
		{"body before headers", []string{ep1}, []*extprocv3.ProcessingRequest{reqBody(plainChat, true)}, 500, "ext_proc_protocol_error"},
		{"empty message", []string{ep1}, []*extprocv3.ProcessingRequest{{}}, 500, "ext_proc_protocol_error"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, tc.names)
			e := f.open(t, fullDuplex, fullDuplex)
			for _, m := range tc.msgs {
				e.send(m)
			}
			st, oe, hdrs := e.immediate()
			if st != tc.status {
				t.Errorf("status = %d (%s), want %d", st, oe.Message, tc.status)
			}
			if tc.code != "" && (oe.Code == nil || *oe.Code != tc.code) {
				t.Errorf("code = %v (%s), want %s", oe.Code, oe.Message, tc.code)
			}
			if !slices.Contains(hdrs, "content-type: application/json") {
				t.Errorf("headers %v lack content-type: application/json", hdrs)
			}
			if tc.status == 503 && !slices.Contains(hdrs, "retry-after: 1") {
				t.Errorf("a 503 without retry-after: %v", hdrs)
			}
			if err := f.streamEnded(t); err != nil {
				t.Errorf("Process = %v, want a clean end", err)
			}
			for _, ep := range f.pool.All() {
				if ep.InFlight() != 0 {
					t.Errorf("%s has %d in flight", ep.Name, ep.InFlight())
				}
			}
			if ev := f.pk.events(); len(ev) != 0 {
				t.Errorf("the policy heard %v of a refused request", ev)
			}
		})
	}
}

// TestResponseBodyModeNone: without the answer's body kvroute learns its status only, and the
// stream's end settles the request as the head said; a head that ends the answer settles it at
// once.
func TestResponseBodyModeNone(t *testing.T) {
	f := newFixture(t, []string{ep1})
	e := f.open(t, buffered, noBody)
	e.send(reqHeaders("/v1/chat/completions", false))
	e.recv()
	e.send(reqBody(streamChat, true))
	if bm := e.recv().GetRequestBody().GetResponse().GetBodyMutation(); bm != nil {
		t.Errorf("body changed (%v) though kvroute cannot drop the usage chunk it would ask for", bm)
	}
	e.head("text/event-stream")
	if n := f.pool.ByName(ep1).InFlight(); n != 1 {
		t.Errorf("in flight while the answer streams = %d, want 1", n)
	}
	e.close()
	f.streamEnded(t)

	e = f.open(t, fullDuplex, fullDuplex)
	e.send(reqHeaders("/v1/chat/completions", false))
	e.send(reqBody(plainChat, true))
	e.recv()
	e.streamedBody(false)
	e.send(respHeaders(500, "", true))
	e.recv()
	f.streamEnded(t)
	want := []string{"routed " + ep1, "done " + ep1 + " ok=true cached=false", "routed " + ep1, "done " + ep1 + " ok=false cached=false"}
	if diff := cmp.Diff(want, f.pk.events()); diff != "" {
		t.Errorf("policy events (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{ep1 + " server_error"}, f.health.failures()); diff != "" {
		t.Errorf("failures (-want +got):\n%s", diff)
	}
}

// TestShedding: a fleet too busy to take the request sheds it with 429, as the protocol asks.
func TestShedding(t *testing.T) {
	f := newFixture(t, []string{ep1}, func(h *proxy.Handler) {
		h.Saturated = func([]*endpoint.Endpoint) bool { return true }
	})
	e := f.open(t, fullDuplex, fullDuplex)
	e.send(reqHeaders("/v1/chat/completions", false))
	e.send(reqBody(plainChat, true))
	st, oe, hdrs := e.immediate()
	if st != http.StatusTooManyRequests || *oe.Code != "overloaded" || !slices.Contains(hdrs, "retry-after: 1") {
		t.Errorf("saturated fleet: %d %v %v, want 429 overloaded with retry-after", st, oe, hdrs)
	}
	f.streamEnded(t)
	v := metricstest.Values(t, f.reg, "kvroute_requests_total")
	if got := v["kvroute_requests_total{endpoint=none,model=m,status=429}"]; got != 1 {
		t.Errorf("requests_total 429 = %v, want 1", got)
	}
}

// TestModels: GET /v1/models is answered by kvroute, as `kvroute serve` does.
func TestModels(t *testing.T) {
	f := newFixture(t, []string{ep1})
	e := f.open(t, fullDuplex, fullDuplex)
	e.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
		Headers: headerMap(":method", "GET", ":path", "/v1/models?x=1"), EndOfStream: true}}})
	r := e.recv().GetImmediateResponse()
	if r.GetStatus().GetCode() != 200 || !strings.Contains(string(r.GetBody()), `"id":"m"`) {
		t.Errorf("models answer = %d %s", r.GetStatus().GetCode(), r.GetBody())
	}
	if err := f.streamEnded(t); err != nil {
		t.Error(err)
	}
}

// TestSubsetHint: the pick and its fallbacks stay inside the subset Envoy names.
func TestSubsetHint(t *testing.T) {
	f := newFixture(t, []string{ep1, ep2, ep3})
	e := f.open(t, fullDuplex, fullDuplex)
	e.send(withSubset(reqHeaders("/v1/chat/completions", false), "10.0.0.3:8000", "10.0.0.2:8000", "10.7.7.7:80"))
	e.send(reqBody(plainChat, true))
	if got := destination(e.recv()); got != "10.0.0.2:8000,10.0.0.3:8000" {
		t.Errorf("destination = %q, want the subset's endpoints in the policy's order", got)
	}
	e.streamedBody(false)
	e.cancel()
	f.streamEnded(t)
}

// TestServedFallback: Envoy went down the list (the first endpoint failed its attempt, why Envoy
// does not say); the attempt follows it, and the first endpoint's failure is told to the policy
// alone.
func TestServedFallback(t *testing.T) {
	f := newFixture(t, []string{ep1, ep2, ep3})
	e, _ := f.routed(t, plainChat)
	e.send(respHeaders(200, "10.0.0.2:8000", false, "content-type", "application/json"))
	e.recv()
	e.send(respBody(jsonAnswer, true))
	e.streamedBody(true)
	e.close()
	if err := f.streamEnded(t); err != nil {
		t.Error(err)
	}
	want := []string{"routed " + ep1, "done " + ep1 + " ok=false cached=false", "routed " + ep2, "done " + ep2 + " ok=true cached=true"}
	if diff := cmp.Diff(want, f.pk.events()); diff != "" {
		t.Errorf("policy events (-want +got):\n%s", diff)
	}
	// Why Envoy's attempt at ep1 failed it does not say: not counted towards ejecting ep1
	// (route.FailUnknown), the policy told it failed.
	if got := f.health.failures(); len(got) != 0 {
		t.Errorf("failures told to health checking: %v, want none", got)
	}
	if diff := cmp.Diff([]string{ep1}, f.pk.failures()); diff != "" {
		t.Errorf("attempts the policy heard failed (-want +got):\n%s", diff)
	}
}

// TestMaxEndpointsAndUpstreamAddress: a data plane that takes one address gets one; a plain
// Envoy says which endpoint answered with the upstream.address attribute.
func TestMaxEndpointsAndUpstreamAddress(t *testing.T) {
	f := newFixture(t, []string{ep1, ep2, ep3})
	f.srv.MaxEndpoints = 2
	e, r := f.routed(t, plainChat)
	if got := destination(r); got != "10.0.0.1:8000,10.0.0.2:8000" {
		t.Errorf("destination = %q, want two endpoints", got)
	}
	if hm := mutation(r.GetRequestHeaders().GetResponse().GetHeaderMutation()); hm[0] != DestinationKey+": 10.0.0.1:8000,10.0.0.2:8000" {
		t.Errorf("header %q, want the same list as the metadata", hm[0])
	}
	rh := respHeaders(200, "", false, "content-type", "application/json")
	rh.Attributes = map[string]*structpb.Struct{"envoy.filters.http.ext_proc": {Fields: map[string]*structpb.Value{
		"upstream.address": structpb.NewStringValue("10.0.0.2:8000")}}}
	e.send(rh)
	e.recv()
	e.send(respBody(jsonAnswer, true))
	e.streamedBody(true)
	e.close()
	f.streamEnded(t)
	want := []string{"routed " + ep1, "done " + ep1 + " ok=false cached=false", "routed " + ep2, "done " + ep2 + " ok=true cached=true"}
	if diff := cmp.Diff(want, f.pk.events()); diff != "" {
		t.Errorf("policy events (-want +got):\n%s", diff)
	}
}

// TestClientCancel: the client goes away in the middle of the answer; the stream's end ends
// the call, which does not count against the endpoint.
func TestClientCancel(t *testing.T) {
	f := newFixture(t, []string{ep1})
	e, _ := f.routed(t, streamChat)
	e.head("text/event-stream")
	e.send(respBody(event1, false))
	if c, eos := e.chunk(true); c != event1 || eos {
		t.Fatalf("first event = %q eos=%v", c, eos)
	}
	if n := f.pool.ByName(ep1).InFlight(); n != 1 {
		t.Fatalf("in flight during the answer = %d, want 1", n)
	}
	e.cancel()
	if err := f.streamEnded(t); err != nil {
		t.Errorf("Process = %v, want nil", err)
	}
	if n := f.pool.ByName(ep1).InFlight(); n != 0 {
		t.Errorf("in flight after the cancel = %d, want 0", n)
	}
	want := []string{"routed " + ep1, "first " + ep1, "done " + ep1 + " ok=false cached=false"}
	if diff := cmp.Diff(want, f.pk.events()); diff != "" {
		t.Errorf("policy events (-want +got):\n%s", diff)
	}
	if fs := f.health.failures(); len(fs) != 0 {
		t.Errorf("failures counted against the endpoint: %v", fs)
	}
	v := metricstest.Values(t, f.reg, "kvroute_requests_total")
	if got := v["kvroute_requests_total{endpoint="+ep1+",model=m,status=499}"]; got != 1 {
		t.Errorf("requests_total 499 = %v, want 1", got)
	}
}

// TestCancelBeforePick: Envoy gives up while the body is still coming.
func TestCancelBeforePick(t *testing.T) {
	f := newFixture(t, []string{ep1})
	e := f.open(t, fullDuplex, fullDuplex)
	e.send(reqHeaders("/v1/chat/completions", false))
	e.send(reqBody(streamChat[:10], false))
	e.close()
	if err := f.streamEnded(t); err != nil {
		t.Errorf("Process = %v", err)
	}
	if ev := f.pk.events(); len(ev) != 0 {
		t.Errorf("policy heard %v", ev)
	}
}

// TestOutOfOrderAfterPick: a message that breaks the order once the answer is under way ends
// the stream with InvalidArgument, and the call is settled without blaming the endpoint.
func TestOutOfOrderAfterPick(t *testing.T) {
	for _, tc := range []struct {
		name string
		msg  *extprocv3.ProcessingRequest
	}{
		{"second request headers", reqHeaders("/v1/chat/completions", false)},
		{"response body before its headers", respBody("x", true)},
		{"request body after the pick", reqBody("x", true)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, []string{ep1})
			e, _ := f.routed(t, plainChat)
			e.send(tc.msg)
			if _, err := e.c.Recv(); status.Code(err) != codes.InvalidArgument {
				t.Errorf("Recv = %v, want InvalidArgument", err)
			}
			if err := f.streamEnded(t); status.Code(err) != codes.InvalidArgument {
				t.Errorf("Process = %v", err)
			}
			if n := f.pool.ByName(ep1).InFlight(); n != 0 {
				t.Errorf("in flight = %d", n)
			}
			if fs := f.health.failures(); len(fs) != 0 {
				t.Errorf("failures counted: %v", fs)
			}
		})
	}
}

// TestMisconfiguredModes: without the body kvroute cannot pick; in observability mode it
// must not answer.
func TestMisconfiguredModes(t *testing.T) {
	f := newFixture(t, []string{ep1})
	e := f.open(t, noBody, noBody)
	e.send(reqHeaders("/v1/chat/completions", false))
	if st, oe, _ := e.immediate(); st != 500 || *oe.Code != "ext_proc_misconfigured" {
		t.Errorf("NONE request body mode: %d %v", st, oe)
	}
	f.streamEnded(t)

	e = f.open(t, fullDuplex, fullDuplex)
	m := reqHeaders("/v1/chat/completions", false)
	m.ObservabilityMode = true
	e.send(m)
	if _, err := e.c.Recv(); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("observability mode: Recv = %v, want FailedPrecondition", err)
	}
	f.streamEnded(t)
}

// TestTrailers: a request body that ends with trailers (FULL_DUPLEX_STREAMED), and an answer
// that ends with them.
func TestTrailers(t *testing.T) {
	f := newFixture(t, []string{ep1})
	e := f.open(t, fullDuplex, fullDuplex)
	e.send(reqHeaders("/v1/chat/completions", false))
	e.send(reqBody(plainChat, false))
	e.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestTrailers{RequestTrailers: &extprocv3.HttpTrailers{}}})
	e.recv()
	r := e.recv().GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse()
	if string(r.GetBody()) != plainChat || r.GetEndOfStream() {
		t.Errorf("body before trailers = %q eos=%v, want the body without end_of_stream", r.GetBody(), r.GetEndOfStream())
	}
	if e.recv().GetRequestTrailers() == nil {
		t.Fatal("want the answer to the request trailers")
	}
	e.send(respHeaders(200, "", false, "content-type", "application/json"))
	e.recv()
	e.send(respBody(jsonAnswer, false))
	if got := e.recv().GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse(); string(got.GetBody()) != jsonAnswer {
		t.Errorf("answer = %q", got.GetBody())
	}
	e.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseTrailers{ResponseTrailers: &extprocv3.HttpTrailers{}}})
	if e.recv().GetResponseTrailers() == nil {
		t.Fatal("want the answer to the response trailers")
	}
	if err := f.streamEnded(t); err != nil {
		t.Error(err)
	}
	if diff := cmp.Diff([]string{"routed " + ep1, "done " + ep1 + " ok=true cached=true"}, f.pk.events()); diff != "" {
		t.Errorf("policy events (-want +got):\n%s", diff)
	}
}

// TestTenants: the tenant gate applies as in `kvroute serve`: a missing key is a 401, the key
// does not reach the engine, the tenant's salt does, its limits answer 429 with Retry-After.
func TestTenants(t *testing.T) {
	cfg, err := config.Parse([]byte(`
endpoints: [{url: "http://10.0.0.1:8000"}]
auth: {mode: api_key, secret_env: KVROUTE_TEST_SECRET}
tenants:
  - name: acme
    api_keys: ["` + tenant.HashKey("sk-acme") + `"]
    limits: {requests_per_minute: 1}
`))
	if err != nil {
		t.Fatal(err)
	}
	gate, err := tenant.New(cfg, tenant.Options{Getenv: func(string) string { return strings.Repeat("s", 32) }})
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, []string{ep1}, withGate(gate))

	e := f.open(t, fullDuplex, fullDuplex)
	e.send(reqHeaders("/v1/chat/completions", false))
	if st, _, hdrs := e.immediate(); st != http.StatusUnauthorized || !slices.Contains(hdrs, `www-authenticate: Bearer realm="kvroute"`) {
		t.Errorf("no key: %d %v", st, hdrs)
	}
	f.streamEnded(t)

	e = f.open(t, fullDuplex, fullDuplex)
	e.send(reqHeaders("/v1/chat/completions", false, "authorization", "Bearer sk-acme"))
	e.send(reqBody(plainChat, true))
	hm := mutation(e.recv().GetRequestHeaders().GetResponse().GetHeaderMutation())
	if !slices.Contains(hm, "-authorization") {
		t.Errorf("header mutation %v does not remove the tenant's key", hm)
	}
	body, _ := e.streamedBody(false)
	if !strings.Contains(body, `"cache_salt":`) {
		t.Errorf("forwarded body %s lacks the tenant's cache_salt", body)
	}
	rh := mutation(e.head("application/json").GetResponseHeaders().GetResponse().GetHeaderMutation())
	if !slices.Contains(rh, "x-ratelimit-limit-requests: 1") {
		t.Errorf("response header mutation %v lacks the rate-limit headers", rh)
	}
	e.send(respBody(jsonAnswer, true))
	e.streamedBody(true)
	e.close()
	f.streamEnded(t)

	e = f.open(t, fullDuplex, fullDuplex)
	e.send(reqHeaders("/v1/chat/completions", false, "authorization", "Bearer sk-acme"))
	e.send(reqBody(plainChat, true))
	st, oe, hdrs := e.immediate()
	if st != http.StatusTooManyRequests || *oe.Code != "rate_limit_exceeded" || !slices.ContainsFunc(hdrs, func(h string) bool { return strings.HasPrefix(h, "retry-after: ") }) {
		t.Errorf("over the limit: %d %v %v", st, oe, hdrs)
	}
	f.streamEnded(t)
}

// TestHostPort: what Envoy is told for each kind of endpoint URL.
func TestHostPort(t *testing.T) {
	for in, want := range map[string]string{
		"http://10.0.0.1:8000":      "10.0.0.1:8000",
		"https://10.0.0.1":          "10.0.0.1:443",
		"http://10.0.0.1":           "10.0.0.1:80",
		"http://[fd00::1]:8000":     "[fd00::1]:8000",
		"http://[fe80::1%25eth0]:1": "",
		"http://engine.local:8000":  "",
		"::":                        "",
	} {
		if got := hostPort(in); got != want {
			t.Errorf("hostPort(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestNotServed: an engine's 404 that names the request's model (vLLM's answer for a model it
// was not started with) leaves its endpoint out for that model, as `kvroute serve` does: the
// list of the next request skips it, and a warning says so once. A 404 that names no model (a
// path the engine lacks) leaves the list as it was. Either is a not_served failure: not
// charged to the tenant, not counted against the endpoint.
func TestNotServed(t *testing.T) {
	cfg, err := config.Parse([]byte(`
endpoints: [{url: "http://10.0.0.1:8000"}]
auth: {mode: api_key, secret_env: KVROUTE_TEST_SECRET}
tenants: [{name: acme, api_keys: ["` + tenant.HashKey("sk-acme") + `"]}]
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, body string
		next       string // the next request's list
		warnings   int
	}{
		{"model", `{"object":"error","message":"The model ` + "`m`" + ` does not exist.","type":"NotFoundError","param":null,"code":404}`, "10.0.0.2:8000", 1},
		{"path", `{"detail":"Not Found"}`, "10.0.0.1:8000,10.0.0.2:8000", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs testlog.Buffer
			f := newFixture(t, []string{ep1, ep2}, func(h *proxy.Handler) {
				h.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
				gate, err := tenant.New(cfg, tenant.Options{Metrics: h.Metrics.Tenant, Getenv: func(string) string { return strings.Repeat("s", 32) }})
				if err != nil {
					t.Fatal(err)
				}
				h.Gate = gate
			})
			e, r := f.routed(t, plainChat, "authorization", "Bearer sk-acme")
			if got := destination(r); got != "10.0.0.1:8000,10.0.0.2:8000" {
				t.Fatalf("first list %q", got)
			}
			e.send(respHeaders(http.StatusNotFound, "10.0.0.1:8000", false, "content-type", "application/json"))
			e.recv()
			e.send(respBody(tc.body, true))
			if got, _ := e.streamedBody(true); got != tc.body {
				t.Errorf("404 passed on as %q", got)
			}
			e.close()
			f.streamEnded(t)

			e, r = f.routed(t, plainChat, "authorization", "Bearer sk-acme")
			if got := destination(r); got != tc.next {
				t.Errorf("the next request's list %q, want %q", got, tc.next)
			}
			e.cancel()
			f.streamEnded(t)

			if fs := f.health.failures(); len(fs) != 0 {
				t.Errorf("failures counted against the endpoints: %v", fs)
			}
			var warns int
			var access map[string]any
			for _, l := range logs.JSONLines(t) {
				switch {
				case l["level"] == "WARN" && strings.Contains(l["msg"].(string), "does not serve the model"):
					warns++
				case l["msg"] == "request" && access == nil:
					access = l
				}
			}
			if warns != tc.warnings {
				t.Errorf("%d warnings that the engine does not serve the model, want %d", warns, tc.warnings)
			}
			if access["status"] != 404.0 || access["charged_prompt_tokens"] != 0.0 || access["charged_completion_tokens"] != 0.0 {
				t.Errorf("the 404's access line: status %v, charged %v and %v; want 404, nothing charged",
					access["status"], access["charged_prompt_tokens"], access["charged_completion_tokens"])
			}
		})
	}
}
