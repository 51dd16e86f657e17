package extproc

import (
	"fmt"
	"strings"
	"testing"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/internal/metrics/metricstest"
	"github.com/kvroute/kvroute/internal/testlog"
)

// An engine (or a proxy before it) may label a stream's events text/plain or application/json.
// `kvroute serve` reads such an answer to a stream request as events as they pass
// (internal/proxy's otherStream); these tests play the same streams through ext_proc.

// answeringAs plays Envoy up to the answer of a streamed chat request of tenant acme, its head
// of content type ct in: the request body in FULL_DUPLEX_STREAMED mode when the response body
// mode is that, else BUFFERED.
func (f *fixture) answeringAs(t *testing.T, mode filterv3.ProcessingMode_BodySendMode, ct string) *envoy {
	t.Helper()
	if mode == fullDuplex {
		e, _ := f.routed(t, streamChat, "authorization", "Bearer sk-acme")
		e.head(ct)
		return e
	}
	e := f.open(t, buffered, mode)
	e.send(reqHeaders("/v1/chat/completions", false, "authorization", "Bearer sk-acme"))
	e.recv()
	e.send(reqBody(streamChat, true))
	if r := e.recv(); r.GetRequestBody() == nil {
		t.Fatalf("want the answer to the request body, got %v", r)
	}
	e.head(ct)
	return e
}

// play sends the response body in chunks, end_of_stream on the last, and returns what the
// client gets. In FULL_DUPLEX_STREAMED mode kvroute answers a chunk in pieces of at most
// ChunkBytes, or holds it (a part of an event, or bytes that do not yet say what the answer
// is): its pieces are read until they hold as many bytes as were sent, so a chunk that may be
// held is sent last only.
func (e *envoy) play(mode filterv3.ProcessingMode_BodySendMode, chunks []string) string {
	e.t.Helper()
	var got strings.Builder
	sent := 0
	for i, c := range chunks {
		last := i == len(chunks)-1
		e.send(respBody(c, last))
		sent += len(c)
		switch {
		case mode == fullDuplex && last:
			b, _ := e.streamedBody(true)
			got.WriteString(b)
		case mode == fullDuplex:
			for got.Len() < sent {
				b, _ := e.chunk(true)
				got.WriteString(b)
			}
		default:
			if bm := e.recv().GetResponseBody().GetResponse().GetBodyMutation(); bm != nil {
				got.Write(bm.GetBody())
			} else {
				got.WriteString(c)
			}
		}
	}
	return got.String()
}

// TestOtherTypeStreamPastCapture: a text/plain stream of more than 4 MiB of events (the bound
// of what ext_proc keeps of a whole answer) is read as events as it passes, as `kvroute serve`
// reads it (proxy's TestOtherTypeStreamChargedPastCapture): its content events are counted and
// charged, and it passes whole. It was read as a whole answer, and past 4 MiB not read at all:
// charged 0 completion tokens.
func TestOtherTypeStreamPastCapture(t *testing.T) {
	const events, perChunk = 4500, 60
	pad := strings.Repeat("a", 1000)
	var chunks []string
	var b strings.Builder
	for i := range events {
		fmt.Fprintf(&b, "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"%s%d\"}}]}\n\n", pad, i)
		if (i+1)%perChunk == 0 {
			chunks = append(chunks, b.String())
			b.Reset()
		}
	}
	chunks = append(chunks, b.String()+doneEvent)
	want := strings.Join(chunks, "")
	if len(want) <= maxCapture {
		t.Fatalf("the stream is %d bytes, not past %d", len(want), maxCapture)
	}
	for _, mode := range []filterv3.ProcessingMode_BodySendMode{fullDuplex, streamed} {
		t.Run(mode.String(), func(t *testing.T) {
			var logs testlog.Buffer
			f := tenantFixture(t, &logs, ep1)
			e := f.answeringAs(t, mode, "text/plain; charset=utf-8")
			if got := e.play(mode, chunks); got != want {
				t.Errorf("the client got %d bytes, want the %d of the stream as it came", len(got), len(want))
			}
			e.close()
			f.streamEnded(t)
			l := accessLine(t, &logs)
			if l["status"] != 200.0 || l["error_type"] != nil || l["completion_tokens"] != float64(events) || l["charged_completion_tokens"] != float64(events) {
				t.Errorf("access line: status %v, error_type %v, completion_tokens %v, charged_completion_tokens %v; want 200, none, %d, %d",
					l["status"], l["error_type"], l["completion_tokens"], l["charged_completion_tokens"], events, events)
			}
			if fs := f.health.failures(); len(fs) != 0 {
				t.Errorf("failures counted against the endpoint: %v", fs)
			}
		})
	}
}

// TestOtherTypeStreamSettled: a stream under another Content-Type than text/event-stream is
// settled as `kvroute serve` settles one it relays as it came (proxy's otherStream, call.status):
// an event that is no event of the API makes it a 502 stream_bad_event (error_code
// upstream_bad_answer), a failure of the endpoint (server_error, as serve counts it: the stream was
// not cut), whether a blank line follows it or not (a last line that is no field); the
// engine's error event (llama.cpp's "error:" line) a 502 stream_error; a last event without
// its blank line, or no terminator, a clean 200. The stream passes as it came, and its whole
// content events are charged (the ones after a bad event too, as serve reads them). A JSON
// object (an engine that ignored "stream") is read whole. Before, every one was read as a
// whole answer and settled with the 200 the client got.
func TestOtherTypeStreamSettled(t *testing.T) {
	partial := `data: {"id":"c1","choices":[{"index":0,"delta":{"content":"h`
	for _, tc := range []struct {
		name       string
		ct         string
		chunks     []string
		status     float64
		errType    any
		errCode    any
		failures   []string
		completion float64 // charged
	}{
		{"bad event", "text/plain", []string{event1 + "data: {not json\n\n", event1 + doneEvent},
			502, "stream_bad_event", "upstream_bad_answer", []string{ep1 + " server_error"}, 2},
		{"foreign last line", "text/plain", []string{event1, `{"error":"an error was encountered while running the model"}` + "\n"},
			502, "stream_bad_event", "upstream_bad_answer", []string{ep1 + " server_error"}, 1},
		{"error line", "text/plain", []string{event1, `error: {"code":500,"message":"the model crashed","type":"server_error"}` + "\n\n" + doneEvent},
			502, "stream_error", nil, []string{ep1 + " server_error"}, 1},
		{"last event without its blank line", "application/json", []string{event1 + event1, partial}, 200, nil, nil, nil, 2},
		{"no terminator", "text/plain", []string{event1, event1, event1}, 200, nil, nil, nil, 3},
		{"byte order mark and blank lines first", "text/plain", []string{"\xef\xbb\xbf\r\n", "\nda", "ta: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n" + doneEvent},
			200, nil, nil, nil, 1},
		{"a JSON answer", "application/json", []string{jsonAnswer[:1], jsonAnswer[1:]}, 200, nil, nil, nil, 1},
	} {
		for _, mode := range []filterv3.ProcessingMode_BodySendMode{fullDuplex, streamed, bufferedPartial} {
			t.Run(tc.name+"/"+mode.String(), func(t *testing.T) {
				var logs testlog.Buffer
				f := tenantFixture(t, &logs, ep1)
				e := f.answeringAs(t, mode, tc.ct)
				chunks := tc.chunks
				if mode == fullDuplex {
					// A chunk that may be held is sent only last (play).
					chunks = []string{strings.Join(tc.chunks, "")}
				}
				if got, want := e.play(mode, chunks), strings.Join(tc.chunks, ""); got != want {
					t.Errorf("client's stream = %q, want it as it came, %q", got, want)
				}
				e.close()
				f.streamEnded(t)
				if diff := cmp.Diff(tc.failures, f.health.failures()); diff != "" {
					t.Errorf("failures (-want +got):\n%s", diff)
				}
				v := metricstest.Values(t, f.reg, "kvroute_requests_total")
				if got := v[fmt.Sprintf("kvroute_requests_total{endpoint=%s,model=m,status=%d}", ep1, int(tc.status))]; got != 1 {
					t.Errorf("requests_total %v on %s = %v, want 1 (%v)", tc.status, ep1, got, v)
				}
				l := accessLine(t, &logs)
				if l["status"] != tc.status || l["error_type"] != tc.errType || l["error_code"] != tc.errCode {
					t.Errorf("access line: status %v, error_type %v, error_code %v; want %v, %v, %v",
						l["status"], l["error_type"], l["error_code"], tc.status, tc.errType, tc.errCode)
				}
				if l["charged_completion_tokens"] != tc.completion {
					t.Errorf("charged %v completion tokens, want %v", l["charged_completion_tokens"], tc.completion)
				}
			})
		}
	}
}

// TestForeignLastLineEventStream: under text/event-stream too, a last line that is no field of
// the format (ollama's error line, `{"error":"..."}`), with no blank line after it, makes the
// stream a bad one, as `kvroute serve` reads it (proxy's TestForeignLastLine, foreignCut): a
// 502 stream_bad_event, not a stream the engine cut (stream_cut), which it was. Where kvroute
// writes the body, the line is not passed on and the client's stream ends with serve's error
// event.
func TestForeignLastLineEventStream(t *testing.T) {
	const foreign = `{"error":"an error was encountered while running the model"}` + "\n"
	for _, mode := range []filterv3.ProcessingMode_BodySendMode{fullDuplex, streamed} {
		t.Run(mode.String(), func(t *testing.T) {
			var logs testlog.Buffer
			f := tenantFixture(t, &logs, ep1)
			e := f.answeringAs(t, mode, "text/event-stream")
			chunks := []string{event1, foreign}
			if mode == fullDuplex {
				chunks = []string{event1 + foreign}
			}
			got := e.play(mode, chunks)
			if !strings.HasPrefix(got, event1+"event: error\n") || !strings.Contains(got, `"code":"upstream_bad_answer"`) {
				t.Errorf("client's stream = %q, want the event before the line, then serve's error event", got)
			}
			e.close()
			f.streamEnded(t)
			l := accessLine(t, &logs)
			if l["status"] != 502.0 || l["error_type"] != "stream_bad_event" || l["error_code"] != "upstream_bad_answer" {
				t.Errorf("access line: status %v, error_type %v, error_code %v; want 502, stream_bad_event, upstream_bad_answer",
					l["status"], l["error_type"], l["error_code"])
			}
		})
	}
}

// TestBeginsAsEvents: an answer's first bytes say whether it is events as `kvroute serve` reads
// them (proxy's eventsBegin): past a byte order mark and white space, a "data:" or "event:"
// field or a comment; until enough has come, they say nothing. Fed a byte at a time, with the
// white space known from the call before, the answer is the same.
func TestBeginsAsEvents(t *testing.T) {
	for _, tc := range []struct {
		b            string
		events, sure bool
	}{
		{"", false, false},
		{"\xef", false, false},
		{"\xef\xbb\xbf", false, false},
		{"\xef\xbb\xbf\r\n \t", false, false},
		{"\xef\xbb\xbf\ndata:", true, true},
		{"da", false, false},
		{"data: {}", true, true},
		{"event: x", true, true},
		{": ping", true, true},
		{"\n\n:", true, true},
		{"dat!", false, true},
		{"{\"id\":1}", false, true},
		{"  {", false, true},
		{"\xef\xbc", false, true},
		{"x\xef\xbb\xbfdata:", false, true},
	} {
		if ev, sure, _ := beginsAsEvents([]byte(tc.b), 0); ev != tc.events || sure != tc.sure {
			t.Errorf("beginsAsEvents(%q) = %v, %v; want %v, %v", tc.b, ev, sure, tc.events, tc.sure)
		}
		var ev, sure bool
		spaced := 0
		for i := 1; i <= len(tc.b) && !sure; i++ {
			ev, sure, spaced = beginsAsEvents([]byte(tc.b[:i]), spaced)
		}
		if ev != tc.events || sure != tc.sure {
			t.Errorf("beginsAsEvents(%q) a byte at a time = %v, %v; want %v, %v", tc.b, ev, sure, tc.events, tc.sure)
		}
	}
}
