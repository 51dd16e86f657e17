package extproc

import (
	"log/slog"
	"strings"
	"testing"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/metrics/metricstest"
	"github.com/kvroute/kvroute/internal/proxy"
	"github.com/kvroute/kvroute/internal/tenant"
	"github.com/kvroute/kvroute/internal/testlog"
)

// A /v1/completions stream as ollama sends it once asked for usage (checked against ollama 0.17
// in QA): a usage of zeros in every token's chunk, and in the finish chunk; the real usage
// comes in the usage-only chunk before [DONE], if the stream gets that far.
const (
	streamCompletion = `{"model":"m","stream":true,"prompt":"repeat after me"}`
	zeroUsage        = `,"usage":{"prompt_tokens":0,"completion_tokens":0,"total_tokens":0}`
	ollamaText       = `data: {"id":"cmpl-1","object":"text_completion","choices":[{"text":" figur","index":0,"finish_reason":null}],"model":"m"`
	ollamaFinish     = `data: {"id":"cmpl-1","object":"text_completion","choices":[{"text":"","index":0,"finish_reason":"length"}],"model":"m"`
	ollamaUsage      = `data: {"id":"cmpl-1","object":"text_completion","choices":[],"model":"m","usage":{"prompt_tokens":20,"completion_tokens":8,"total_tokens":28}}` + "\n\n"
)

// ollamaChunk is a chunk of text, with the usage of zeros where the engine was asked for usage.
func ollamaChunk(asked bool) string {
	if asked {
		return ollamaText + zeroUsage + "}\n\n"
	}
	return ollamaText + "}\n\n"
}

// withLog sends the handler's logs, its access lines among them, to logs.
func withLog(logs *testlog.Buffer) fixtureOption {
	return func(h *proxy.Handler) { h.Logger = slog.New(slog.NewJSONHandler(logs, nil)) }
}

// tenantFixture is a fixture whose gate knows one tenant, acme (key sk-acme), so that access
// lines say what it was charged; they go to logs. With tenants the router makes each request's
// id: here routerID.
func tenantFixture(t *testing.T, logs *testlog.Buffer, names ...string) *fixture {
	t.Helper()
	cfg, err := config.Parse([]byte(`
endpoints: [{url: "http://10.0.0.1:8000"}]
auth: {mode: api_key, secret_env: KVROUTE_TEST_SECRET}
tenants: [{name: acme, api_keys: ["` + tenant.HashKey("sk-acme") + `"]}]
`))
	if err != nil {
		t.Fatal(err)
	}
	return newFixture(t, names, withLog(logs), func(h *proxy.Handler) {
		gate, err := tenant.New(cfg, tenant.Options{Metrics: h.Metrics.Tenant, Getenv: func(string) string { return strings.Repeat("s", 32) }})
		if err != nil {
			t.Fatal(err)
		}
		h.Gate = gate
		h.NewRequestID = func() string { return routerID }
	})
}

// routerID is the id tenantFixture's router gives every request.
const routerID = "kv-router-id"

// accessLine is the one access line in logs.
func accessLine(t *testing.T, logs *testlog.Buffer) map[string]any {
	t.Helper()
	var lines []map[string]any
	for _, l := range logs.JSONLines(t) {
		if l["msg"] == "request" {
			lines = append(lines, l)
		}
	}
	if len(lines) != 1 {
		t.Fatalf("%d access lines, want 1: %v", len(lines), lines)
	}
	return lines[0]
}

// answer plays the response body in chunks, each holding something that reaches the client,
// end_of_stream on the last when end is set, and returns what the client gets: in
// FULL_DUPLEX_STREAMED mode kvroute's streamed chunks, in STREAMED mode each chunk as kvroute
// answers it (replaced, or passed as it was).
func (e *envoy) answer(mode filterv3.ProcessingMode_BodySendMode, chunks []string, end bool) string {
	e.t.Helper()
	var got string
	for i, c := range chunks {
		e.send(respBody(c, end && i == len(chunks)-1))
		if mode == fullDuplex {
			b, _ := e.chunk(true)
			got += b
			continue
		}
		if bm := e.recv().GetResponseBody().GetResponse().GetBodyMutation(); bm != nil {
			got += string(bm.GetBody())
		} else {
			got += c
		}
	}
	return got
}

// TestStreamEndedWithoutTerminator: an engine that ends its stream on purpose after a whole
// event, its body ended properly but no terminator sent (ollama at its token-repeat limit: no
// finish_reason, no [DONE]), is settled as `kvroute serve` settles it: 200, not a failure of
// the endpoint (Envoy's end_of_stream, or the response trailers, come only when the upstream's
// response ended; a reset ends the ext_proc stream instead), stream_end no_terminator on the
// access line, the policy told of a success, the tenant charged the prompt's estimate and one
// completion token per content event, as for a stream whose usage did not come.
func TestStreamEndedWithoutTerminator(t *testing.T) {
	const n = 5
	answer := strings.Repeat(event1, n)
	for _, end := range []string{"end_of_stream", "trailers"} {
		t.Run(end, func(t *testing.T) {
			var logs testlog.Buffer
			f := tenantFixture(t, &logs, ep1)
			e, _ := f.routed(t, streamChat, "authorization", "Bearer sk-acme")
			e.head("text/event-stream")
			e.send(respBody(answer[:7], false)) // a partial event: held
			e.send(respBody(answer[7:], false))
			got, _ := e.chunk(true)
			switch end {
			case "end_of_stream":
				e.send(respBody("", true))
				rest, _ := e.streamedBody(true)
				got += rest
			case "trailers":
				e.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseTrailers{
					ResponseTrailers: &extprocv3.HttpTrailers{}}})
				if r := e.recv(); r.GetResponseTrailers() == nil {
					t.Fatalf("want the answer to the trailers, got %v", r)
				}
			}
			if got != answer {
				t.Errorf("client's stream = %q, want the engine's events as they came, nothing added", got)
			}
			e.close()
			f.streamEnded(t)
			if fs := f.health.failures(); len(fs) != 0 {
				t.Errorf("failures counted against the endpoint: %v", fs)
			}
			if diff := cmp.Diff([]string{"routed " + ep1, "first " + ep1, "done " + ep1 + " ok=true cached=false"}, f.pk.events()); diff != "" {
				t.Errorf("policy events (-want +got):\n%s", diff)
			}
			v := metricstest.Values(t, f.reg, "kvroute_requests_total")
			if got := v["kvroute_requests_total{endpoint="+ep1+",model=m,status=200}"]; got != 1 {
				t.Errorf("requests_total 200 = %v, want 1 (%v)", got, v)
			}
			l := accessLine(t, &logs)
			if l["status"] != 200.0 || l["stream_end"] != "no_terminator" || l["error_type"] != nil {
				t.Errorf("access line: status %v, stream_end %v, error_type %v; want 200, no_terminator, none", l["status"], l["stream_end"], l["error_type"])
			}
			if est := l["prompt_tokens"]; est == 0.0 || l["charged_prompt_tokens"] != est || l["charged_completion_tokens"] != float64(n) {
				t.Errorf("charged prompt %v, completion %v; want the estimate (%v) and %d (one per content event)",
					l["charged_prompt_tokens"], l["charged_completion_tokens"], est, n)
			}
		})
	}
}

// TestCutStream: a stream whose body ends inside an event (no blank line after it), or before
// any event, is cut: 502 stream_cut, a failure of the endpoint.
func TestCutStream(t *testing.T) {
	partial := `data: {"id":"c1","choices":[{"index":0,"delta":{"content":"h`
	for _, tc := range []struct {
		name   string
		chunks []string // the body; the last one ends it, or trailers follow when the name says so
	}{
		{"inside an event", []string{event1, partial}},
		{"inside an event, then trailers", []string{event1, partial}},
		{"before any event", []string{""}},
		{"only a comment", []string{": ping\n\n"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs testlog.Buffer
			f := newFixture(t, []string{ep1}, withLog(&logs))
			e, _ := f.routed(t, streamChat)
			e.head("text/event-stream")
			trailers := strings.HasSuffix(tc.name, "trailers")
			for i, c := range tc.chunks {
				e.send(respBody(c, !trailers && i == len(tc.chunks)-1))
			}
			if trailers {
				e.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseTrailers{
					ResponseTrailers: &extprocv3.HttpTrailers{}}})
			}
			e.close()
			f.streamEnded(t)
			if diff := cmp.Diff([]string{ep1 + " stream_cut"}, f.health.failures()); diff != "" {
				t.Errorf("failures (-want +got):\n%s", diff)
			}
			l := accessLine(t, &logs)
			if l["status"] != 502.0 || l["error_type"] != "stream_cut" || l["stream_end"] != nil {
				t.Errorf("access line: status %v, error_type %v, stream_end %v; want 502, stream_cut, none", l["status"], l["error_type"], l["stream_end"])
			}
		})
	}
}

// TestUsageMemberOmitted: a client that did not ask for usage gets none, where the response
// body mode lets kvroute change the body: neither the usage-only chunk nor the usage member
// ollama puts, zeros, in every chunk once kvroute asked for usage on the client's behalf, as
// `kvroute serve` relays it. The zeros are not taken for the usage: the tenant is charged the
// engine's real usage.
func TestUsageMemberOmitted(t *testing.T) {
	const n = 4
	var engine, want []string
	for range n {
		engine = append(engine, ollamaChunk(true))
		want = append(want, ollamaChunk(false))
	}
	engine = append(engine, ollamaFinish+zeroUsage+"}\n\n", ollamaUsage+doneEvent)
	want = append(want, ollamaFinish+"}\n\n", doneEvent)
	for _, mode := range []filterv3.ProcessingMode_BodySendMode{fullDuplex, streamed} {
		t.Run(mode.String(), func(t *testing.T) {
			var logs testlog.Buffer
			f := tenantFixture(t, &logs, ep1)
			var e *envoy
			if mode == fullDuplex {
				e, _ = f.routedTo(t, "/v1/completions", streamCompletion, "authorization", "Bearer sk-acme")
			} else {
				e = f.open(t, buffered, streamed)
				e.send(reqHeaders("/v1/completions", false, "authorization", "Bearer sk-acme"))
				e.recv()
				e.send(reqBody(streamCompletion, true))
				if b := e.recv().GetRequestBody().GetResponse().GetBodyMutation().GetBody(); !strings.Contains(string(b), `"include_usage":true`) {
					t.Fatalf("forwarded body %s, want include_usage added", b)
				}
			}
			e.head("text/event-stream")
			got := e.answer(mode, engine, true)
			if want := strings.Join(want, ""); got != want {
				t.Errorf("client's stream = %q, want %q (no usage: the client did not ask)", got, want)
			}
			e.close()
			f.streamEnded(t)
			l := accessLine(t, &logs)
			if l["status"] != 200.0 || l["charged_prompt_tokens"] != 20.0 || l["charged_completion_tokens"] != 8.0 {
				t.Errorf("access line: status %v, charged %v and %v; want 200, the engine's usage (20, 8)",
					l["status"], l["charged_prompt_tokens"], l["charged_completion_tokens"])
			}
		})
	}
}

// TestZeroUsageCharge: a usage of zeros in every chunk (ollama's completions, once asked for
// usage) is not taken for the engine's usage: a tenant whose stream came to its end without a
// real usage, or who left in the middle, is charged the prompt's estimate and one completion
// token per content event it was sent (charged as the usage, the zeros would have charged it no
// completion at all), and the chunks it got carry no usage, as it asked for none.
func TestZeroUsageCharge(t *testing.T) {
	const n = 6
	engine := make([]string, n)
	for i := range engine {
		engine[i] = ollamaChunk(true)
	}
	for _, tc := range []struct {
		name   string
		end    []string // what the engine sends after the text; nil: the client leaves
		status float64
	}{
		{"done", []string{ollamaFinish + zeroUsage + "}\n\n" + doneEvent}, 200},
		{"client left", nil, 499},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs testlog.Buffer
			f := tenantFixture(t, &logs, ep1)
			e, _ := f.routedTo(t, "/v1/completions", streamCompletion, "authorization", "Bearer sk-acme")
			e.head("text/event-stream")
			if got := e.answer(fullDuplex, append(engine, tc.end...), tc.end != nil); strings.Contains(got, `"usage"`) {
				t.Errorf("the client, who asked no usage, got %q", got)
			}
			if tc.end == nil {
				e.cancel()
			} else {
				e.close()
			}
			f.streamEnded(t)
			l := accessLine(t, &logs)
			if est := l["prompt_tokens"]; l["status"] != tc.status || est == 0.0 || l["charged_prompt_tokens"] != est || l["charged_completion_tokens"] != float64(n) {
				t.Errorf("access line: status %v, charged %v and %v; want %v, the estimate (%v) and %d (one per content event)",
					l["status"], l["charged_prompt_tokens"], l["charged_completion_tokens"], tc.status, est, n)
			}
		})
	}
}

// TestStreamError: a stream that carries the engine's error event after its head is settled as
// `kvroute serve` settles it, whether [DONE] follows or the body just ends: 502 stream_error, a
// failure of the endpoint (not a stream ended without its terminator, a success).
func TestStreamError(t *testing.T) {
	errEvent := `data: {"error":{"object":"error","message":"the engine ran out of KV cache","type":"InternalServerError","code":500}}` + "\n\n"
	for _, tc := range []struct {
		name, body string
	}{
		{"then [DONE]", event1 + errEvent + doneEvent},
		{"no [DONE]", event1 + errEvent},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs testlog.Buffer
			f := newFixture(t, []string{ep1}, withLog(&logs))
			e, _ := f.routed(t, streamChat)
			e.head("text/event-stream")
			e.send(respBody(tc.body, true))
			if got, _ := e.streamedBody(true); got != tc.body {
				t.Errorf("client's stream = %q, want the engine's as it came", got)
			}
			e.close()
			f.streamEnded(t)
			if diff := cmp.Diff([]string{ep1 + " server_error"}, f.health.failures()); diff != "" {
				t.Errorf("failures (-want +got):\n%s", diff)
			}
			l := accessLine(t, &logs)
			if l["status"] != 502.0 || l["error_type"] != "stream_error" || l["stream_end"] != nil {
				t.Errorf("access line: status %v, error_type %v, stream_end %v; want 502, stream_error, none", l["status"], l["error_type"], l["stream_end"])
			}
		})
	}
}

// TestOverrunCharge: through ext_proc an engine that ignores max_tokens is not cut (Envoy's
// protocol has no clean end for a body the upstream is still sending: docs/kubernetes.md,
// "Endpoint-picker mode"), but the tenant's charge is bounded all the same: at most max_tokens
// for each sequence, whatever the stream carried (here 40 content events, each taken for a
// token, for a max_tokens of 2).
func TestOverrunCharge(t *testing.T) {
	const n = 40
	answer := strings.Repeat(event1, n) + "data: [DONE]\n\n"
	var logs testlog.Buffer
	f := tenantFixture(t, &logs, ep1)
	e, _ := f.routed(t, `{"model":"m","stream":true,"max_tokens":2,"messages":[{"role":"user","content":"hello there"}]}`,
		"authorization", "Bearer sk-acme")
	e.head("text/event-stream")
	e.send(respBody(answer, true))
	if got, _ := e.streamedBody(true); got != answer {
		t.Errorf("client's stream = %q, want the engine's events as they came", got)
	}
	e.close()
	f.streamEnded(t)
	l := accessLine(t, &logs)
	if l["status"] != 200.0 || l["completion_tokens"] != float64(n) || l["charged_completion_tokens"] != 2.0 {
		t.Errorf("access line: status %v, completion_tokens %v, charged_completion_tokens %v; want 200, %d, 2 (max_tokens)",
			l["status"], l["completion_tokens"], l["charged_completion_tokens"], n)
	}
}
