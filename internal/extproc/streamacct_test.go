package extproc

import (
	"strings"
	"testing"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/internal/metrics/metricstest"
	"github.com/kvroute/kvroute/internal/testlog"
)

// The streamed answer is accounted as `kvroute serve` accounts it (internal/proxy's sseBody):
// these tests play the streams that found where ext_proc did otherwise.

const bufferedPartial = filterv3.ProcessingMode_BUFFERED_PARTIAL

// cutEventFor is the error event `kvroute serve` ends a cut stream with (sseBody.cutShort),
// for a request of id rid.
func cutEventFor(rid string) string {
	return "event: error\n" +
		`data: {"error":{"message":"the engine ended the stream before its end (request id ` + rid + `)","type":"upstream_error","param":null,"code":"stream_cut"}}` +
		"\n\n"
}

// cutEventRID1 is cutEventFor the request id the tests' requests carry, the request's own
// without tenants.
var cutEventRID1 = cutEventFor("rid-1")

// errEvent is an engine's error event after its head (vLLM's).
const errEvent = `data: {"error":{"object":"error","message":"the engine ran out of KV cache","type":"InternalServerError","code":500}}` + "\n\n"

// answering plays Envoy up to the answer of a streamed chat request, its head in: the request
// body in FULL_DUPLEX_STREAMED mode when the response body mode is that, else BUFFERED; kv are
// extra request headers.
func (f *fixture) answering(t *testing.T, mode filterv3.ProcessingMode_BodySendMode, kv ...string) *envoy {
	t.Helper()
	if mode == fullDuplex {
		e, _ := f.routed(t, streamChat, kv...)
		e.head("text/event-stream")
		return e
	}
	e := f.open(t, buffered, mode)
	e.send(reqHeaders("/v1/chat/completions", false, kv...))
	e.recv()
	e.send(reqBody(streamChat, true))
	if r := e.recv(); r.GetRequestBody() == nil {
		t.Fatalf("want the answer to the request body, got %v", r)
	}
	e.head("text/event-stream")
	return e
}

// TestPartialEventAtEnd: a stream whose body ends (end_of_stream) inside an event, its last
// event without the blank line that ends it, is settled as `kvroute serve` settles it
// (sseBody.Read, cutInside): the partial event is not read, so neither its usage, its content
// nor its error counts; where the body mode lets kvroute change the body, it is not passed on
// either and the client's stream ends with serve's stream_cut error event (in
// BUFFERED_PARTIAL it passes as it came); the request is a 502 stream_cut (stream_error where
// the engine's error event came before it), a failure of the endpoint (stream_cut), and the
// tenant is charged the prompt's estimate and one completion token per whole content event.
// A terminator without its blank line still ends the stream whole.
func TestPartialEventAtEnd(t *testing.T) {
	usageTail := `data: {"id":"c1","choices":[],"usage":{"prompt_tokens":20,"completion_tokens":900,"total_tokens":920}}` + "\n"
	for _, tc := range []struct {
		name       string
		whole      string // the whole events before the last
		last       string // the last event, without its blank line
		status     float64
		errType    string
		failures   []string
		completion float64 // charged
	}{
		{"content cut", event1 + event1, `data: {"id":"c1","choices":[{"index":0,"delta":{"content":"h`, 502, "stream_cut", []string{ep1 + " stream_cut"}, 2},
		{"usage without its blank line", event1 + event1, usageTail, 502, "stream_cut", []string{ep1 + " stream_cut"}, 2},
		{"error without its blank line", event1 + event1, strings.TrimSuffix(errEvent, "\n"), 502, "stream_cut", []string{ep1 + " stream_cut"}, 2},
		{"comment without its blank line", event1 + event1, ": keep-alive\n", 502, "stream_cut", []string{ep1 + " stream_cut"}, 2},
		{"content cut after an error event", event1 + errEvent, event1[:20], 502, "stream_error", []string{ep1 + " stream_cut"}, 1},
		{"[DONE] without its blank line", event1 + event1, "data: [DONE]\n", 200, "", nil, 2},
	} {
		for _, mode := range []filterv3.ProcessingMode_BodySendMode{fullDuplex, streamed, bufferedPartial} {
			t.Run(tc.name+"/"+mode.String(), func(t *testing.T) {
				var logs testlog.Buffer
				f := tenantFixture(t, &logs, ep1)
				e := f.answering(t, mode, "authorization", "Bearer sk-acme")
				got := e.answer(mode, []string{tc.whole, tc.last}, true)
				want := tc.whole + tc.last
				if tc.status != 200 && canRewrite(mode) {
					// The error event quotes the request's id, the router's with tenants.
					want = tc.whole + cutEventFor(routerID)
				}
				if got != want {
					t.Errorf("client's stream = %q, want %q", got, want)
				}
				e.close()
				f.streamEnded(t)
				if diff := cmp.Diff(tc.failures, f.health.failures()); diff != "" {
					t.Errorf("failures (-want +got):\n%s", diff)
				}
				l := accessLine(t, &logs)
				var errType any
				if tc.errType != "" {
					errType = tc.errType
				}
				if l["status"] != tc.status || l["error_type"] != errType || l["stream_end"] != nil {
					t.Errorf("access line: status %v, error_type %v, stream_end %v; want %v, %v, none",
						l["status"], l["error_type"], l["stream_end"], tc.status, errType)
				}
				if est := l["prompt_tokens"]; est == 20.0 || l["charged_prompt_tokens"] != est || l["charged_completion_tokens"] != tc.completion {
					t.Errorf("charged prompt %v, completion %v (prompt_tokens %v); want the estimate, not the partial event's 20, and %v",
						l["charged_prompt_tokens"], l["charged_completion_tokens"], est, tc.completion)
				}
				v := metricstest.Values(t, f.reg, "kvroute_completion_tokens_total")
				if got := v["kvroute_completion_tokens_total{model=m}"]; got != 0 {
					t.Errorf("completion_tokens_total = %v, want 0 (no usage was read)", got)
				}
			})
		}
	}
}

// TestFirstTokenAfterKeepAlive: the first token is the first event other than a comment, as
// `kvroute serve` takes it (sseBody.first): the keep-alive comments an engine sends while it
// computes the prefill (": keep-alive") are passed on, as the client has the head already, but
// the prefill estimate stays on the endpoint, the policy hears no first token, and no TTFT is
// measured, until the first event; a stream of comments alone has no TTFT, and is cut.
func TestFirstTokenAfterKeepAlive(t *testing.T) {
	const keepAlive = ": keep-alive\n\n"
	t.Run("then events", func(t *testing.T) {
		var logs testlog.Buffer
		f := newFixture(t, []string{ep1}, withLog(&logs))
		e := f.answering(t, fullDuplex)
		ep := f.pool.ByName(ep1)
		prefill := ep.PendingPrefill()
		if prefill <= 0 {
			t.Fatalf("pending prefill on %s = %d before the answer, want the prompt's estimate", ep1, prefill)
		}
		for range 2 {
			e.send(respBody(keepAlive, false))
			if got, _ := e.chunk(true); got != keepAlive {
				t.Fatalf("client got %q, want the comment passed on", got)
			}
		}
		if diff := cmp.Diff([]string{"routed " + ep1}, f.pk.events()); diff != "" {
			t.Errorf("policy events after the keep-alives (-want +got):\n%s", diff)
		}
		if got := ep.PendingPrefill(); got != prefill {
			t.Errorf("pending prefill after the keep-alives = %d, want %d (no token came)", got, prefill)
		}
		e.send(respBody(event1, false))
		if got, _ := e.chunk(true); got != event1 {
			t.Fatalf("client got %q, want the event", got)
		}
		if diff := cmp.Diff([]string{"routed " + ep1, "first " + ep1}, f.pk.events()); diff != "" {
			t.Errorf("policy events after the first event (-want +got):\n%s", diff)
		}
		if got := ep.PendingPrefill(); got != 0 {
			t.Errorf("pending prefill after the first event = %d, want 0", got)
		}
		e.send(respBody(doneEvent, true))
		e.streamedBody(true)
		e.close()
		f.streamEnded(t)
		if l := accessLine(t, &logs); l["status"] != 200.0 || l["ttft_ms"] == nil {
			t.Errorf("access line: status %v, ttft_ms %v; want 200 and a TTFT", l["status"], l["ttft_ms"])
		}
	})
	t.Run("comments alone", func(t *testing.T) {
		var logs testlog.Buffer
		f := newFixture(t, []string{ep1}, withLog(&logs))
		e := f.answering(t, fullDuplex)
		e.send(respBody(keepAlive, false))
		e.chunk(true)
		e.send(respBody(keepAlive, true))
		if got, _ := e.streamedBody(true); got != keepAlive+cutEventRID1 {
			t.Errorf("client's stream ends with %q, want the comment and serve's stream_cut error event", got)
		}
		e.close()
		f.streamEnded(t)
		if diff := cmp.Diff([]string{"routed " + ep1, "done " + ep1 + " ok=false cached=false"}, f.pk.events()); diff != "" {
			t.Errorf("policy events (-want +got):\n%s", diff)
		}
		if l := accessLine(t, &logs); l["status"] != 502.0 || l["ttft_ms"] != nil {
			t.Errorf("access line: status %v, ttft_ms %v; want 502 and no TTFT", l["status"], l["ttft_ms"])
		}
		v := metricstest.Values(t, f.reg, "kvroute_ttft_seconds")
		if got := v["kvroute_ttft_seconds_count{model=m}"]; got != 0 {
			t.Errorf("ttft_seconds_count = %v, want 0", got)
		}
	})
}

// TestAfterTerminator: what an engine sends after its terminator is neither read nor, where the
// body mode lets kvroute change the body, passed on, as `kvroute serve` drops it (sseBody.Read
// reads no event once the call is complete): an error event there does not fail a whole answer,
// and content there is not charged.
func TestAfterTerminator(t *testing.T) {
	after := errEvent + event1 + event1[:10]
	for _, split := range []bool{false, true} {
		for _, mode := range []filterv3.ProcessingMode_BodySendMode{fullDuplex, streamed, bufferedPartial} {
			name := mode.String()
			if split {
				name += "/separate chunks"
			}
			t.Run(name, func(t *testing.T) {
				var logs testlog.Buffer
				f := tenantFixture(t, &logs, ep1)
				e := f.answering(t, mode, "authorization", "Bearer sk-acme")
				var got string
				switch {
				case !split:
					got = e.answer(mode, []string{event1 + doneEvent + after}, true)
				case mode == fullDuplex:
					// Chunks that carry nothing to pass on get no answer in this mode.
					got = e.answer(mode, []string{event1 + doneEvent}, false)
					e.send(respBody(after, false))
					e.send(respBody("", true))
					rest, _ := e.streamedBody(true)
					got += rest
				default:
					got = e.answer(mode, []string{event1 + doneEvent, after, ""}, true)
				}
				want := event1 + doneEvent
				if !canRewrite(mode) {
					want += after
				}
				if got != want {
					t.Errorf("client's stream = %q, want %q", got, want)
				}
				e.close()
				f.streamEnded(t)
				if fs := f.health.failures(); len(fs) != 0 {
					t.Errorf("failures counted against the endpoint: %v", fs)
				}
				l := accessLine(t, &logs)
				if l["status"] != 200.0 || l["error_type"] != nil || l["charged_completion_tokens"] != 1.0 {
					t.Errorf("access line: status %v, error_type %v, charged completion %v; want 200, none, 1",
						l["status"], l["error_type"], l["charged_completion_tokens"])
				}
			})
		}
	}
}

// TestProgressMidStream: each chunk of events tells the endpoint that its engine is working
// (endpoint.Progressed, what the stall watch of every request on it reads), as `kvroute serve`
// does for each read that brought an event; keep-alive comments alone do not.
func TestProgressMidStream(t *testing.T) {
	f := newFixture(t, []string{ep1})
	e := f.answering(t, fullDuplex)
	ep := f.pool.ByName(ep1)
	e.send(respBody(event1, false))
	e.chunk(true)
	first := ep.LastProgress()
	if first == 0 {
		t.Fatal("no progress recorded at the first token")
	}
	// Comments for longer than the grain progress is recorded in (10 ms) do not move it.
	start := time.Now()
	for i := 0; i < 1000 && time.Since(start) < 30*time.Millisecond; i++ {
		e.send(respBody(": ping\n\n", false))
		e.chunk(true)
		time.Sleep(time.Millisecond)
	}
	if time.Since(start) < 30*time.Millisecond {
		t.Fatal("1000 comments in under 30 ms: too fast to tell")
	}
	if got := ep.LastProgress(); got != first {
		t.Errorf("progress moved from %d to %d on comments alone", first, got)
	}
	e.send(respBody(event1, false))
	e.chunk(true)
	if got := ep.LastProgress(); got <= first {
		t.Errorf("progress %d after an event more than 30 ms after the first (%d), want later", got, first)
	}
	e.send(respBody(doneEvent, true))
	e.streamedBody(true)
	e.close()
	f.streamEnded(t)
}
