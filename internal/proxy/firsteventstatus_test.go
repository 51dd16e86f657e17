package proxy

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
)

// The status an engine's error names when it sends it as its stream's first event, where
// each engine writes it: TGI as http_status_code (422 for every error in a stream), vLLM,
// SGLang and llama.cpp as code, OpenAI's API and ollama only as type.

// tgiTooLong is TGI's chat stream error for a prompt past its context (router/src/infer,
// into_openai_event): the client's fault, named 422.
const tgiTooLong = "Input validation error: `inputs` tokens + `max_new_tokens` must be <= 4096. Given: 5000 `inputs` tokens and 16 `max_new_tokens`"

// dataError is an SSE event whose data is obj.
func dataError(obj string) string { return "data: " + obj + "\n\n" }

// plainRefusal is what the policy hears of an engine's plain answer of status with an error
// body: the result a first event naming that status must tell it too.
func plainRefusal(t *testing.T, status int) (ok, failed bool) {
	t.Helper()
	url := engine(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, `{"error":{"message":"refused","type":"invalid_request_error"}}`)
	}).URL
	f := newFixture(t, spec(url, "m"))
	if resp, _ := f.post(t, "/v1/chat/completions", streamBody); resp.StatusCode != status || len(f.pk.done) != 1 {
		t.Fatalf("a plain %d: got %d, policy told %+v", status, resp.StatusCode, f.pk.done)
	}
	return f.pk.done[0].OK, f.pk.done[0].Failed
}

// TestFirstEventStatusRefusal: a stream whose first event is the engine's error naming a 4xx,
// wherever the engine writes it, is answered with that status and the engine's message in an
// OpenAI error body, before any head; only the engine that refused it is tried, and nothing is
// counted against it (the policy hears what it hears of a plain 4xx answer). Before, TGI's
// 422 (http_status_code, not code) was a 502: sent to a second engine, counted against the
// first, and the client got neither the status nor, after the second, its own engine's answer.
func TestFirstEventStatusRefusal(t *testing.T) {
	vllmTooLong := "This model's maximum context length is 4096 tokens. However, your request has 5000 input tokens. Please reduce the length of the input messages."
	for _, tc := range []struct {
		name, ev string
		status   int
		msg      string
	}{
		{"TGI 422", dataError(`{"error":{"message":"` + strings.ReplaceAll(tgiTooLong, "`", "\\u0060") + `","http_status_code":422}}`), 422, tgiTooLong},
		{"TGI 422, digits", dataError(`{"error":{"message":"m","http_status_code":"422"}}`), 422, "m"},
		{"TGI generation failure", dataError(`{"error":{"message":"Request failed during generation: Server error: CUDA out of memory","http_status_code":422}}`), 424, "Request failed during generation: Server error: CUDA out of memory"},
		{"vLLM 400", dataError(`{"error":{"message":"` + vllmTooLong + `","type":"BadRequestError","param":"input_tokens","code":400}}`), 400, vllmTooLong},
		{"older vLLM 400", dataError(`{"object":"error","message":"` + vllmTooLong + `","type":"BadRequestError","param":null,"code":400}`), 400, vllmTooLong},
		{"SGLang 400", dataError(`{"error":{"object":"error","message":"The input (5000 tokens) is longer than the model's context length (4096 tokens).","type":"BadRequestError","param":null,"code":400}}`), 400, "The input (5000 tokens) is longer than the model's context length (4096 tokens)."},
		{"OpenAI type, code no status", dataError(`{"error":{"message":"too long","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}`), 400, "too long"},
		{"ollama type, code null", dataError(`{"error":{"message":"bad","type":"invalid_request_error","param":null,"code":null}}`), 400, "bad"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantOK, wantFailed := plainRefusal(t, tc.status)
			var nA, nB atomic.Int32
			a := countingEngine(t, &nA, tc.ev, "data: [DONE]\n\n")
			b := countingEngine(t, &nB, tc.ev, "data: [DONE]\n\n")
			f := newFixture(t, spec(a, "m"), spec(b, "m"))
			logs := jsonLogger(f)
			resp, body := f.post(t, "/v1/chat/completions", streamBody)
			if resp.StatusCode != tc.status || errorMessage(body) != tc.msg || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
				t.Errorf("got %d %s %q; want %d, a JSON error saying %q", resp.StatusCode, resp.Header.Get("Content-Type"), body, tc.status, tc.msg)
			}
			if nA.Load() != 1 || nB.Load() != 0 {
				t.Errorf("engines tried: a %d, b %d; want a once, b never", nA.Load(), nB.Load())
			}
			if n := f.failures(t, a); n != 0 {
				t.Errorf("failures counted against the engine: %d, want 0", n)
			}
			if len(f.pk.done) != 1 || f.pk.done[0].OK != wantOK || f.pk.done[0].Failed != wantFailed {
				t.Errorf("policy told %+v; want OK %v, Failed %v, as for a plain %d answer", f.pk.done, wantOK, wantFailed, tc.status)
			}
			if line := lastAccess(t, logs); line["status"] != float64(tc.status) {
				t.Errorf("access line status %v, want %d", line["status"], tc.status)
			}
		})
	}
}

// TestFirstEventStatusFailure: a first event that names a 5xx, or a 4xx whose message says the
// engine itself is dead (vLLM's releases before its error classes wrote 400 for any failure in
// a stream), or TGI's 422 for its own failure, is the engine's failure: counted against it, and
// the next endpoint tried (which serves the request here); TGI's "Model is overloaded" is its
// 429, the next endpoint tried and nothing counted.
func TestFirstEventStatusFailure(t *testing.T) {
	for _, tc := range []struct {
		name, ev string
		failures int // counted against the first engine
	}{
		{"code 500", dataError(`{"error":{"message":"boom","type":"InternalServerError","code":500}}`), 1},
		{"older vLLM 500", dataError(`{"object":"error","message":"boom","code":500}`), 1},
		{"llama.cpp error line 500", "error: {\"code\":500,\"message\":\"boom\",\"type\":\"server_error\"}\n\n", 1},
		{"older vLLM V0 dead, 400", dataError(`{"object":"error","message":"Background loop has errored already.","type":"BadRequestError","param":null,"code":400}`), 1},
		{"older vLLM V0 stopped, 400", dataError(`{"error":{"object":"error","message":"Background loop is not running. If it was running, inspect the output to find the stacktrace of the error that caused the background loop to stop (AsyncEngineDeadError).","type":"BadRequestError","param":null,"code":400}}`), 1},
		{"older vLLM MQ dead, 400", dataError(`{"object":"error","message":"Engine loop is not running. Inspect the stacktrace to find the original error: IndexError('pop from empty list').","type":"BadRequestError","param":null,"code":400}`), 1},
		{"vLLM V1 dead, 400", dataError(`{"error":{"message":"EngineCore encountered an issue. See stack trace (above) for the root cause.","type":"BadRequestError","param":null,"code":400}}`), 1},
		{"TGI incomplete generation", dataError(`{"error":{"message":"Incomplete generation","http_status_code":422}}`), 1},
		{"TGI overloaded", dataError(`{"error":{"message":"Model is overloaded","http_status_code":422}}`), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var nA atomic.Int32
			a := countingEngine(t, &nA, tc.ev, "data: [DONE]\n\n")
			good := newFakeEngine(t)
			f := newFixture(t, spec(a, "m"), spec(good.srv.URL, "m"))
			resp, body := f.post(t, "/v1/chat/completions", streamBody)
			if resp.StatusCode != 200 || !strings.Contains(string(body), "[DONE]") {
				t.Errorf("got %d %q; want the second engine's stream", resp.StatusCode, body)
			}
			if nA.Load() != 1 {
				t.Errorf("the failing engine got %d requests, want 1", nA.Load())
			}
			if n := f.failures(t, a); n != tc.failures {
				t.Errorf("failures counted against the failing engine: %d, want %d", n, tc.failures)
			}
		})
	}
}

// TestFirstEventDeadEngineAnswer: a dead engine's 400 (older vLLM) that reaches the client
// (no other endpoint) is a 500 of type upstream_error with the engine's message, not a 400
// that tells the client its request was at fault.
func TestFirstEventDeadEngineAnswer(t *testing.T) {
	const msg = "Background loop has errored already."
	url := sseEngine(t, dataError(`{"object":"error","message":"`+msg+`","type":"BadRequestError","param":null,"code":400}`), "data: [DONE]\n\n")
	f := newFixture(t, spec(url, "m"))
	resp, body := f.post(t, "/v1/chat/completions", streamBody)
	if resp.StatusCode != http.StatusInternalServerError || errorMessage(body) != msg {
		t.Errorf("got %d %q; want 500 saying %q", resp.StatusCode, body, msg)
	}
	if typ, code := errorTypeCode(body); typ != "upstream_error" || code != nil {
		t.Errorf("error type %q, code %v; want upstream_error and no code (not the engine's BadRequestError, 400)", typ, code)
	}
	if n := f.failures(t, url); n != 1 {
		t.Errorf("failures counted against the engine: %d, want 1", n)
	}
}

// TestFirstEventNoStatus: a first event whose error names no status (no code, no
// http_status_code, no type of a request's error) is answered 502 with the engine's message,
// the next endpoint tried once as after an engine's 502: a request refused so by every engine
// is counted against the first alone (the lifecycle's rule for a request that fails two).
func TestFirstEventNoStatus(t *testing.T) {
	ev := dataError(`{"error":{"message":"boom"}}`)
	var nA, nB, nC atomic.Int32
	a := countingEngine(t, &nA, ev, "data: [DONE]\n\n")
	b := countingEngine(t, &nB, ev, "data: [DONE]\n\n")
	c := countingEngine(t, &nC, ev, "data: [DONE]\n\n")
	f := newFixture(t, spec(a, "m"), spec(b, "m"), spec(c, "m"))
	resp, body := f.post(t, "/v1/chat/completions", streamBody)
	if resp.StatusCode != http.StatusBadGateway || errorMessage(body) != "boom" {
		t.Errorf("got %d %q; want 502 saying boom", resp.StatusCode, body)
	}
	if nA.Load() != 1 || nB.Load() != 1 || nC.Load() != 0 {
		t.Errorf("engines tried: %d, %d, %d; want 1, 1, 0", nA.Load(), nB.Load(), nC.Load())
	}
	if fa, fb := f.failures(t, a), f.failures(t, b); fa != 1 || fb != 0 {
		t.Errorf("failures counted: %d and %d; want 1 against the first, none against the second", fa, fb)
	}
}

// errorTypeCode is the type and code of an OpenAI error body (code nil when null or absent).
func errorTypeCode(body []byte) (string, any) {
	var v struct {
		Error struct {
			Type string `json:"type"`
			Code any    `json:"code"`
		} `json:"error"`
	}
	_ = json.Unmarshal(body, &v)
	return v.Error.Type, v.Error.Code
}
