package proxy

import (
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
)

// An engine's own error, sent in its stream: llama.cpp's `error: {...}` line (its servers of
// 2025; newer ones answer the first error with its status, and send a later one as data),
// vLLM's `data: {"error": {...}}`.

const ctxMsg = "the request exceeds the available context size, try increasing it"

// llamaErrLine is llama.cpp's error event for a prompt longer than its context: the client's
// fault, code 400.
const llamaErrLine = "error: {\"code\":400,\"message\":\"" + ctxMsg + "\",\"type\":\"exceed_context_size_error\"}\n\n"

// countingEngine is sseEngine that counts the requests it had.
func countingEngine(t *testing.T, n *atomic.Int32, events ...string) string {
	return engine(t, func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		w.Header().Set("Content-Type", "text/event-stream")
		for _, ev := range events {
			_, _ = io.WriteString(w, ev)
			w.(http.Flusher).Flush()
		}
	}).URL
}

// errorMessage is the message of an OpenAI error body.
func errorMessage(body []byte) string {
	var v struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	_ = json.Unmarshal(body, &v)
	return v.Error.Message
}

// TestEngineErrorBeforeHead: an engine whose stream begins with its own error (before the
// router sent the client anything) answers the client with the error's status and message, as
// if it had answered so: a 4xx is the request refused (relayed, not sent to another engine,
// told to the policy as an engine's plain 400 answer is), a 5xx the engine's failure (the next
// endpoint tried once), an error that names no status a 502. Before, llama.cpp's "error:" line
// was a malformed event: retried on a second engine, counted against both, and the client got
// a 502 without the engine's message.
func TestEngineErrorBeforeHead(t *testing.T) {
	// What the policy hears of an engine's plain 400 answer: the error line must tell it the same.
	plain := engine(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(w, `{"error":{"code":400,"message":"`+ctxMsg+`","type":"exceed_context_size_error"}}`)
	}).URL
	f := newFixture(t, spec(plain, "m"))
	if resp, _ := f.post(t, "/v1/chat/completions", streamBody); resp.StatusCode != http.StatusBadRequest || len(f.pk.done) != 1 {
		t.Fatalf("a plain 400: %d, policy told %+v", resp.StatusCode, f.pk.done)
	}
	refused := f.pk.done[0]

	for _, tc := range []struct {
		name, ev string
		status   int
		msg      string
		retried  bool // the next endpoint was tried
	}{
		{"llama.cpp error line 400", llamaErrLine, 400, ctxMsg, false},
		{"data error 400", "data: {\"error\":{\"code\":400,\"message\":\"" + ctxMsg + "\",\"type\":\"invalid_request_error\"}}\n\n", 400, ctxMsg, false},
		{"error line 500", "error: {\"code\":500,\"message\":\"boom\",\"type\":\"server_error\"}\n\n", 500, "boom", true},
		{"data error 500", "data: {\"object\":\"error\",\"message\":\"boom\",\"code\":500}\n\n", 500, "boom", true},
		{"error line without code", "error: {\"message\":\"boom\"}\n\n", 502, "boom", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var nA, nB atomic.Int32
			a := countingEngine(t, &nA, ": ping\n\n", tc.ev, "data: [DONE]\n\n")
			b := countingEngine(t, &nB, tc.ev, "data: [DONE]\n\n")
			f := newFixture(t, spec(a, "m"), spec(b, "m"))
			logs := jsonLogger(f)
			resp, body := f.post(t, "/v1/chat/completions", streamBody)
			if resp.StatusCode != tc.status || errorMessage(body) != tc.msg || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
				t.Errorf("got %d %s %q; want %d, a JSON error saying %q", resp.StatusCode, resp.Header.Get("Content-Type"), body, tc.status, tc.msg)
			}
			if tried := nB.Load() == 1; tried != tc.retried || nA.Load() != 1 {
				t.Errorf("engines tried: a %d, b %d; want a once, b %v", nA.Load(), nB.Load(), tc.retried)
			}
			if line := lastAccess(t, logs); line["status"] != float64(tc.status) {
				t.Errorf("access line status %v, want %d", line["status"], tc.status)
			}
			if tc.status < 500 {
				if len(f.pk.done) != 1 || f.pk.done[0].OK != refused.OK || f.pk.done[0].Failed != refused.Failed {
					t.Errorf("policy told %+v, want %+v as for a plain 400 answer", f.pk.done, refused)
				}
			}
		})
	}
}

// TestEngineErrorAfterHead: llama.cpp's "error:" line after the client had the head is passed
// on as an SSE error event its client reads (the OpenAI SDKs read none from an "error:"
// field), and the request is settled as a failure of the engine, 502 stream_error, whatever
// status the error names (older vLLM releases name 400 for any failure in a stream).
func TestEngineErrorAfterHead(t *testing.T) {
	for _, tc := range []struct {
		code, status int
	}{{400, 502}, {500, 502}} {
		line := strings.Replace(llamaErrLine, "400", strconv.Itoa(tc.code), 1)
		url := sseEngine(t, goodEvent, line, "data: [DONE]\n\n")
		f := newFixture(t, spec(url, "m"))
		logs := jsonLogger(f)
		resp, body := f.post(t, "/v1/chat/completions", streamBody)
		rest, ok := strings.CutPrefix(string(body), goodEvent+"event: error\ndata: ")
		if resp.StatusCode != 200 || !ok {
			t.Fatalf("code %d: got %d %q; want the good event, then an error event", tc.code, resp.StatusCode, body)
		}
		data, after, _ := strings.Cut(rest, "\n\n")
		if errorMessage([]byte(data)) != ctxMsg || after != "data: [DONE]\n\n" {
			t.Errorf("code %d: after the good event %q; want the engine's error as an error event, then [DONE]", tc.code, rest)
		}
		if l := lastAccess(t, logs); l["status"] != float64(tc.status) || l["error_type"] != "stream_error" {
			t.Errorf("code %d: access line status %v, error_type %v; want %d, stream_error", tc.code, l["status"], l["error_type"], tc.status)
		}
		if len(f.pk.done) != 1 || f.pk.done[0].OK {
			t.Errorf("code %d: policy told %+v, want a failed result", tc.code, f.pk.done)
		}
	}
}

// TestForeignLastLine: a stream whose last line is no event-stream field, with no blank line
// after it (ollama's error line, `{"error":"..."}`), is a bad stream (502 stream_bad_event),
// under text/event-stream as under text/plain, where it was logged a clean 200; under
// text/plain, relayed as it came, the warning says what it is, not "the engine's answer is not
// a JSON object".
func TestForeignLastLine(t *testing.T) {
	for _, ct := range []string{"text/event-stream", "text/plain"} {
		for _, end := range []string{"\n", "\n\n"} {
			url := engine(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", ct)
				_, _ = io.WriteString(w, goodEvent)
				w.(http.Flusher).Flush()
				_, _ = io.WriteString(w, `{"error":"an error was encountered while running the model"}`+end)
			}).URL
			f := newFixture(t, spec(url, "m"))
			logs := jsonLogger(f)
			resp, _ := f.post(t, "/v1/chat/completions", streamBody)
			if resp.StatusCode != 200 {
				t.Fatalf("%s, end %q: status %d, want the 200 relayed", ct, end, resp.StatusCode)
			}
			if l := lastAccess(t, logs); l["status"] != float64(502) || l["error_type"] != "stream_bad_event" {
				t.Errorf("%s, end %q: access line status %v, error_type %v; want 502, stream_bad_event", ct, end, l["status"], l["error_type"])
			}
			if len(f.pk.done) != 1 || f.pk.done[0].OK {
				t.Errorf("%s, end %q: policy told %+v, want one failed result", ct, end, f.pk.done)
			}
			if s := logs.String(); strings.Contains(s, "not a JSON object") || !strings.Contains(s, "a line that is no event-stream field") {
				t.Errorf("%s, end %q: the warning does not say what the engine sent: %s", ct, end, s)
			}
		}
	}
}

// TestStreamFraming: streams framed as the event-stream format allows are no bad streams: a
// byte order mark before the first event (taken off, as the format says), white space after
// [DONE]; under either Content-Type.
func TestStreamFraming(t *testing.T) {
	for _, tc := range []struct {
		name   string
		events []string
	}{
		{"byte order mark", []string{"\xef\xbb\xbf" + goodEvent, "data: [DONE]\n\n"}},
		{"byte order mark alone first", []string{"\xef\xbb\xbf", goodEvent, "data: [DONE]\n\n"}},
		{"done with a space", []string{goodEvent, "data: [DONE] \n\n"}},
		{"done with a tab", []string{goodEvent, "data:[DONE]\t\r\n\r\n"}},
	} {
		for _, ct := range []string{"text/event-stream", "text/plain"} {
			url := engine(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", ct)
				for _, ev := range tc.events {
					_, _ = io.WriteString(w, ev)
					w.(http.Flusher).Flush()
				}
			}).URL
			f := newFixture(t, spec(url, "m"))
			logs := jsonLogger(f)
			resp, body := f.post(t, "/v1/chat/completions", streamBody)
			if resp.StatusCode != 200 || !strings.Contains(string(body), goodEvent) || strings.Contains(string(body), "event: error") {
				t.Errorf("%s, %s: got %d %q; want the stream", tc.name, ct, resp.StatusCode, body)
			}
			if l := lastAccess(t, logs); l["status"] != float64(200) {
				t.Errorf("%s, %s: access line status %v, error_type %v; want 200", tc.name, ct, l["status"], l["error_type"])
			}
			if len(f.pk.done) != 1 || !f.pk.done[0].OK {
				t.Errorf("%s, %s: policy told %+v, want one success", tc.name, ct, f.pk.done)
			}
		}
	}
}

// TestOllamaErrorChunk: ollama's OpenAI layer, when its runner fails in a stream it began (killed,
// out of memory), sends an empty chunk that names no model and ends the stream, no
// finish_reason, no [DONE] (seen in QA with a runner killed mid-stream). That is a stream the
// engine cut (502 stream_cut, the client told with an error event, counted against the
// endpoint), where it was logged a clean 200 (stream_end no_terminator); one that ends after a
// chunk with its model and text is ollama at its token-repeat limit, still a success
// (TestStreamEndedWithoutTerminator).
func TestOllamaErrorChunk(t *testing.T) {
	for path, tc := range map[string]struct{ content, last string }{
		"/v1/chat/completions": {
			`data: {"id":"chatcmpl-682","object":"chat.completion.chunk","created":1796684743,"model":"uni","system_fingerprint":"fp_ollama","choices":[{"index":0,"delta":{"role":"assistant","content":" 幸"},"finish_reason":null}]}` + "\n\n",
			`data: {"id":"chatcmpl-682","object":"chat.completion.chunk","created":1796684743,"model":"","system_fingerprint":"fp_ollama","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}` + "\n\n",
		},
		"/v1/completions": {
			`data: {"id":"cmpl-1","object":"text_completion","created":1796684743,"choices":[{"text":" figur","index":0,"finish_reason":null}],"model":"m","system_fingerprint":"fp_ollama"}` + "\n\n",
			`data: {"id":"cmpl-1","object":"text_completion","created":1796684743,"choices":[{"text":"","index":0,"finish_reason":null}],"model":"","system_fingerprint":"fp_ollama"}` + "\n\n",
		},
	} {
		for _, killed := range []bool{true, false} {
			events := []string{tc.content, tc.content}
			if killed {
				events = append(events, tc.last)
			}
			url := sseEngine(t, events...)
			f := newFixture(t, spec(url, "m"))
			logs := jsonLogger(f)
			resp, body := f.post(t, path, streamBodies[path])
			l := lastAccess(t, logs)
			if !killed {
				if l["status"] != float64(200) || l["stream_end"] != "no_terminator" {
					t.Errorf("%s, the repeat limit: access line status %v, stream_end %v; want 200, no_terminator", path, l["status"], l["stream_end"])
				}
				continue
			}
			if resp.StatusCode != 200 || !strings.HasPrefix(string(body), strings.Join(events, "")+"event: error\n") || !strings.Contains(string(body), `"stream_cut"`) {
				t.Errorf("%s: got %d %q; want the events, then a stream_cut error event", path, resp.StatusCode, body)
			}
			if l["status"] != float64(502) || l["error_type"] != "stream_cut" {
				t.Errorf("%s: access line status %v, error_type %v; want 502, stream_cut", path, l["status"], l["error_type"])
			}
			if len(f.pk.done) != 1 || f.pk.done[0].OK {
				t.Errorf("%s: policy told %+v, want one failed result", path, f.pk.done)
			}
		}
	}
}

func TestErrorChunk(t *testing.T) {
	for data, want := range map[string]bool{
		`{"id":"c","model":"","choices":[{"index":0,"delta":{"content":""},"finish_reason":null}]}`: true,
		`{"id":"c","model" : "","choices":[]}`:                                                      true,
		`{"id":"c","model":"m","choices":[{"index":0,"delta":{},"finish_reason":null}]}`:            false,
		`{"id":"c","choices":[{"index":0,"delta":{"content":"\"model\":\"\""}}]}`:                   false,
		`{"id":"c","choices":[]}`: false,
	} {
		if got := errorChunk([]byte(data)); got != want {
			t.Errorf("errorChunk(%s) = %v, want %v", data, got, want)
		}
	}
}
