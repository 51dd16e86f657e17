package proxy

import (
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// Engines whose streams are no API streams: bytes that are no event stream, NULs, invalid
// UTF-8, data that is no JSON object, or a stream to a request that asked for JSON.

const goodEvent = "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n"

// badEvents are what an engine may send in place of an event, each followed by [DONE].
var badEvents = []struct{ name, ev string }{
	{"html", "<html><body>502 Bad Gateway</body></html>\n\n"},
	{"nuls", "\x00\x00\x00\x00\x00\x00\n\n"},
	{"nul in data", "data: {\"choices\":[{\"delta\":{\"content\":\"a\x00\"}}]}\n\n"},
	{"invalid utf-8", "data: {\"choices\":[{\"delta\":{\"content\":\"\xff\xfe\"}}]}\n\n"},
	{"not json", "data: {not json\n\n"},
	{"plain text", "data: hello\n\n"},
}

// sseEngine answers every request with a text/event-stream body of events, flushed after each.
func sseEngine(t *testing.T, events ...string) string {
	return engine(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for _, ev := range events {
			_, _ = io.WriteString(w, ev)
			w.(http.Flusher).Flush()
		}
	}).URL
}

// TestBadStreamBeforeFirstByte: a stream whose first event is no event of the API is a
// failure of the engine before anything reached the client: the next endpoint answers, and
// alone the engine gets the client a 502 upstream_bad_answer, counted against it.
func TestBadStreamBeforeFirstByte(t *testing.T) {
	for _, tc := range badEvents {
		t.Run(tc.name, func(t *testing.T) {
			bad := sseEngine(t, tc.ev, "data: [DONE]\n\n")
			f := newFixture(t, spec(bad, "m"))
			logs := jsonLogger(f)
			resp, body := f.post(t, "/v1/chat/completions", streamBody)
			if resp.StatusCode != http.StatusBadGateway || errorCode(body) != codeBadAnswer || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
				t.Errorf("got %d %s %q; want a 502 %s JSON error", resp.StatusCode, resp.Header.Get("Content-Type"), body, codeBadAnswer)
			}
			if n := testutil.ToFloat64(f.h.Metrics.Requests.WithLabelValues("m", bad, "502")); n != 1 {
				t.Errorf("requests_total{endpoint=%s,status=502} = %v, want 1", bad, n)
			}
			if line := lastAccess(t, logs); line["status"] != float64(502) || line["error_code"] != codeBadAnswer {
				t.Errorf("access line status %v, error_code %v; want 502, %s", line["status"], line["error_code"], codeBadAnswer)
			}

			good := sseEngine(t, goodEvent, "data: [DONE]\n\n")
			f = newFixture(t, spec(bad, "m"), spec(good, "m"))
			resp, body = f.post(t, "/v1/chat/completions", streamBody)
			if resp.StatusCode != 200 || string(body) != goodEvent+"data: [DONE]\n\n" {
				t.Errorf("with a good engine next: got %d %q; want its stream", resp.StatusCode, body)
			}
			if got := f.pk.events(); len(got) == 0 || got[len(got)-1] != "done "+good+" ok=true" {
				t.Errorf("policy events %v, want the good engine's success last", got)
			}
		})
	}
}

// TestBadStreamAfterFirstByte: an event that is no event of the API after the client had the
// head ends the stream there with an SSE error event (the bad bytes and the [DONE] after them
// not passed on), and the request is logged and counted as a 502 stream_bad_event, a failure
// of the endpoint, not as a clean 200.
func TestBadStreamAfterFirstByte(t *testing.T) {
	for _, tc := range badEvents {
		t.Run(tc.name, func(t *testing.T) {
			url := sseEngine(t, goodEvent, tc.ev, "data: [DONE]\n\n")
			f := newFixture(t, spec(url, "m"))
			logs := jsonLogger(f)
			resp, body := f.post(t, "/v1/chat/completions", streamBody)
			if resp.StatusCode != 200 || !strings.HasPrefix(string(body), goodEvent+"event: error\ndata: ") {
				t.Fatalf("got %d %q; want the good event, then an error event", resp.StatusCode, body)
			}
			rest := body[len(goodEvent):]
			if errorCode(bytes.TrimPrefix(bytes.TrimSpace(rest), []byte("event: error\ndata: "))) != codeBadAnswer ||
				bytes.Contains(rest, []byte("[DONE]")) || bytes.Contains(rest, []byte(strings.TrimSpace(tc.ev))) {
				t.Errorf("after the good event %q; want only an error event of code %s", rest, codeBadAnswer)
			}
			line := lastAccess(t, logs)
			if line["status"] != float64(502) || line["error_type"] != "stream_bad_event" || line["error_code"] != codeBadAnswer {
				t.Errorf("access line status %v, error_type %v, error_code %v; want 502, stream_bad_event, %s",
					line["status"], line["error_type"], line["error_code"], codeBadAnswer)
			}
			if n := testutil.ToFloat64(f.h.Metrics.Requests.WithLabelValues("m", url, "502")); n != 1 {
				t.Errorf("requests_total{status=502} = %v, want 1", n)
			}
			if len(f.pk.done) != 1 || f.pk.done[0].OK {
				t.Errorf("policy told %+v, want one failed result", f.pk.done)
			}
		})
	}
}

// TestStreamToUnstreamedRequest: an engine that answers a request not streamed with an event
// stream fails it before anything reached the client (who asked for one JSON object): the
// next endpoint answers, and alone the engine gets the client a 502 upstream_bad_answer.
func TestStreamToUnstreamedRequest(t *testing.T) {
	bad := sseEngine(t, goodEvent, "data: [DONE]\n\n")
	f := newFixture(t, spec(bad, "m"))
	logs := jsonLogger(f)
	resp, body := f.post(t, "/v1/chat/completions", chatBody)
	if resp.StatusCode != http.StatusBadGateway || errorCode(body) != codeBadAnswer || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		t.Errorf("got %d %s %q; want a 502 %s JSON error", resp.StatusCode, resp.Header.Get("Content-Type"), body, codeBadAnswer)
	}
	if line := lastAccess(t, logs); line["status"] != float64(502) || line["error_code"] != codeBadAnswer || line["endpoint"] != bad {
		t.Errorf("access line status %v, error_code %v, endpoint %v; want 502, %s, %s", line["status"], line["error_code"], line["endpoint"], codeBadAnswer, bad)
	}

	e := newFakeEngine(t)
	f = newFixture(t, spec(bad, "m"), spec(e.srv.URL, "m"))
	resp, body = f.post(t, "/v1/chat/completions", chatBody)
	if resp.StatusCode != 200 || !bytes.HasPrefix(bytes.TrimSpace(body), []byte("{")) {
		t.Errorf("with a good engine next: got %d %q; want its JSON answer", resp.StatusCode, body)
	}
}

// TestBadStreamUnderOtherContentType: a stream labelled text/plain is relayed as it comes
// (TestStreamUnderOtherContentType); one whose events are no API events is then logged and
// counted as a 502 stream_bad_event, not a clean 200.
func TestBadStreamUnderOtherContentType(t *testing.T) {
	url := engine(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = io.WriteString(w, goodEvent+"data: {not json\n\ndata: [DONE]\n\n")
	}).URL
	f := newFixture(t, spec(url, "m"))
	logs := jsonLogger(f)
	resp, _ := f.post(t, "/v1/chat/completions", streamBody)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d, want the 200 relayed", resp.StatusCode)
	}
	if line := lastAccess(t, logs); line["status"] != float64(502) || line["error_type"] != "stream_bad_event" {
		t.Errorf("access line status %v, error_type %v; want 502, stream_bad_event", line["status"], line["error_type"])
	}
	if len(f.pk.done) != 1 || f.pk.done[0].OK {
		t.Errorf("policy told %+v, want one failed result", f.pk.done)
	}
}
