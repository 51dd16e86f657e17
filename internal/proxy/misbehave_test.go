package proxy

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/internal/metrics"
)

// Engines that misbehave: each test puts one in front of the router and checks what the client
// gets, within the attempt's timeouts.

const streamBody = `{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}]}`

// engine starts an httptest server running handle after reading the request's body.
func engine(t *testing.T, handle func(w http.ResponseWriter, r *http.Request)) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		handle(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// rawPost sends body to the router as a chat completion on a connection of its own, which it
// returns (closed at the end of the test; reads and writes time out after 10 s).
func (f *fixture) rawPost(t *testing.T, body string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", f.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	return conn
}

// errorCode returns an OpenAI error body's error.code ("" when it has none or is not one).
func errorCode(body []byte) string {
	var v struct {
		Error struct {
			Code *string `json:"code"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &v) != nil || v.Error.Code == nil {
		return ""
	}
	return *v.Error.Code
}

// TestRefusalBodyStalls: an engine that answers 503 (or 429) and then sends only part of the
// body holds the request no longer than the attempt's timeout: the next endpoint answers.
func TestRefusalBodyStalls(t *testing.T) {
	for _, status := range []int{503, 429} {
		t.Run(fmt.Sprint(status), func(t *testing.T) {
			stalled := engine(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Length", "1000")
				w.WriteHeader(status)
				_, _ = io.WriteString(w, `{"error":`)
				w.(http.Flusher).Flush()
				<-r.Context().Done()
			})
			good := newFakeEngine(t)
			f := newFixture(t, spec(stalled.URL, "m"), spec(good.srv.URL, "m"))
			f.h.Timeouts = Timeouts{FirstToken: 300 * time.Millisecond, Response: 300 * time.Millisecond}
			start := time.Now()
			resp, body := f.post(t, "/v1/chat/completions", chatBody)
			if took := time.Since(start); resp.StatusCode != 200 || took > 3*time.Second {
				t.Errorf("got %d %s after %v; want 200 from the second engine within the 300 ms timeout", resp.StatusCode, body, took)
			}
		})
	}
}

// TestStreamKeepAlives: SSE comments are no token. A stream of keep-alives alone ends at the
// first-token timeout (504, nothing sent to the client before); one whose token follows them
// is timed to that token, and its comments after the first token do not hold it past the idle
// timeout.
func TestStreamKeepAlives(t *testing.T) {
	pings := func(w http.ResponseWriter, r *http.Request, d time.Duration) bool {
		tk := time.NewTicker(20 * time.Millisecond)
		defer tk.Stop()
		end := time.After(d)
		for {
			_, _ = io.WriteString(w, ": ping\n\n")
			w.(http.Flusher).Flush()
			select {
			case <-tk.C:
			case <-end:
				return true
			case <-r.Context().Done():
				return false
			}
		}
	}
	var mode string
	eng := engine(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		switch mode {
		case "pings":
			pings(w, r, 10*time.Second)
		case "late token":
			if pings(w, r, 200*time.Millisecond) {
				_, _ = io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: [DONE]\n\n")
			}
		case "pings after a token":
			_, _ = io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n")
			pings(w, r, 10*time.Second)
		}
	})
	f := newFixture(t, spec(eng.URL, "m"))
	f.h.Timeouts = Timeouts{FirstToken: 400 * time.Millisecond, StreamIdle: 400 * time.Millisecond}

	mode = "pings"
	start := time.Now()
	resp, body := f.post(t, "/v1/chat/completions", streamBody)
	if took := time.Since(start); resp.StatusCode != http.StatusGatewayTimeout || took > 3*time.Second {
		t.Errorf("keep-alives only: %d %q after %v; want 504 at the 400 ms first-token timeout", resp.StatusCode, body, took)
	}

	mode = "late token"
	resp, body = f.post(t, "/v1/chat/completions", streamBody)
	if resp.StatusCode != 200 || !strings.HasSuffix(string(body), "data: [DONE]\n\n") || strings.Contains(string(body), "ping") {
		t.Errorf("keep-alives, then a token: %d %q; want the token and [DONE], without the keep-alives", resp.StatusCode, body)
	}
	if tt := f.pk.ttfts; len(tt) != 1 || tt[0] < 150*time.Millisecond {
		t.Errorf("TTFTs %v: want one of at least 150 ms (the token came 200 ms after the keep-alives began)", tt)
	}

	mode = "pings after a token"
	start = time.Now()
	resp, body = f.post(t, "/v1/chat/completions", streamBody)
	if took := time.Since(start); !strings.Contains(string(body), "(the stream idle timeout)") || took > 3*time.Second {
		t.Errorf("a token, then keep-alives: %d %q after %v; want the idle timeout's error event at 400 ms", resp.StatusCode, body, took)
	}
}

// TestStreamCutInsideEvent: a stream that ends inside an event does not pass the partial event
// on: the client gets the events before it, then the error event on its own.
func TestStreamCutInsideEvent(t *testing.T) {
	eng := engine(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n")
		w.(http.Flusher).Flush()
		_, _ = io.WriteString(w, `data: {"id": "c1", "objec`)
	})
	f := newFixture(t, spec(eng.URL, "m"))
	resp, body := f.post(t, "/v1/chat/completions", streamBody)
	want := "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\nevent: error\n"
	if resp.StatusCode != 200 || !strings.HasPrefix(string(body), want) || strings.Contains(string(body), "objec") {
		t.Errorf("got %d %q; want the first event, then the error event on its own", resp.StatusCode, body)
	}
	if n := len(f.pk.done); n != 1 || f.pk.done[0].OK {
		t.Errorf("policy told %+v, want one failed result", f.pk.done)
	}
}

// TestWholeAnswerBroken: a non-streamed answer that ends before its Content-Length, or does not
// end within the response timeout, is answered 502 or 504 with an OpenAI error body (nothing
// of it had gone out), not a 200 with a truncated body or an empty reply.
func TestWholeAnswerBroken(t *testing.T) {
	cases := []struct {
		name   string
		handle func(w http.ResponseWriter, r *http.Request)
		status int
		code   string
	}{
		{"short body", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Content-Length", "500")
			_, _ = io.WriteString(w, `{"id":"c1","object":"chat.completion","choi`)
		}, http.StatusBadGateway, "upstream_answer_cut"},
		{"head, then silence", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Content-Length", "500")
			w.WriteHeader(200)
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		}, http.StatusGatewayTimeout, "upstream_timeout"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			eng := engine(t, tc.handle)
			f := newFixture(t, spec(eng.URL, "m"))
			f.h.Timeouts = Timeouts{Response: 300 * time.Millisecond}
			resp, body := f.post(t, "/v1/chat/completions", chatBody)
			if resp.StatusCode != tc.status || errorCode(body) != tc.code {
				t.Errorf("got %d %q; want %d with code %s", resp.StatusCode, body, tc.status, tc.code)
			}
			if n := len(f.pk.done); n != 1 || f.pk.done[0].OK {
				t.Errorf("policy told %+v, want one failed result", f.pk.done)
			}
		})
	}
}

// TestEventStreamTypeCase: a stream whose Content-Type differs in case is still a stream: timed
// to its first event and relayed to its [DONE].
func TestEventStreamTypeCase(t *testing.T) {
	eng := engine(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "Text/Event-Stream; charset=utf-8")
		_, _ = io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: [DONE]\n\n")
	})
	f := newFixture(t, spec(eng.URL, "m"))
	resp, body := f.post(t, "/v1/chat/completions", streamBody)
	if resp.StatusCode != 200 || !strings.HasSuffix(string(body), "data: [DONE]\n\n") || len(f.pk.ttfts) != 1 {
		t.Errorf("got %d %q, TTFTs %v; want the stream relayed and its first token timed", resp.StatusCode, body, f.pk.ttfts)
	}
}

// TestRedirectOrSwitch: an engine that answers an API request with a redirect or an unasked
// protocol switch is passed over for the next endpoint; alone, it gives the client a 502 that
// does not say where it pointed.
func TestRedirectOrSwitch(t *testing.T) {
	redirect := engine(t, func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "http://10.1.2.3:8000/internal/v1/chat/completions", http.StatusFound)
	})
	switches := engine(t, func(w http.ResponseWriter, r *http.Request) {
		conn, buf, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		_, _ = buf.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: foo\r\nConnection: Upgrade\r\n\r\n")
		_ = buf.Flush()
		_, _ = bufio.NewReader(conn).ReadByte() // until the router closes it
	})
	good := newFakeEngine(t)
	for _, bad := range []string{redirect.URL, switches.URL} {
		f := newFixture(t, spec(bad, "m"), spec(good.srv.URL, "m"))
		f.h.Timeouts = Timeouts{Response: 2 * time.Second}
		if resp, body := f.post(t, "/v1/chat/completions", chatBody); resp.StatusCode != 200 {
			t.Errorf("%s, then a good engine: %d %q; want 200 from the good one", bad, resp.StatusCode, body)
		}
		f = newFixture(t, spec(bad, "m"))
		f.h.Timeouts = Timeouts{Response: 2 * time.Second}
		resp, body := f.post(t, "/v1/chat/completions", chatBody)
		if resp.StatusCode != http.StatusBadGateway || errorCode(body) != "upstream_bad_answer" || resp.Header.Get("Location") != "" || strings.Contains(string(body), "10.1.2.3") {
			t.Errorf("%s alone: %d %q, Location %q; want 502 upstream_bad_answer, no Location", bad, resp.StatusCode, body, resp.Header.Get("Location"))
		}
	}
}

// TestRequestIDOnce: an engine that echoes X-Request-Id does not double the router's.
func TestRequestIDOnce(t *testing.T) {
	eng := engine(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Request-Id", r.Header.Get("X-Request-Id"))
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"c1","object":"chat.completion","choices":[]}`)
	})
	f := newFixture(t, spec(eng.URL, "m"))
	resp, _ := f.post(t, "/v1/chat/completions", chatBody, "X-Request-Id", "abc")
	if got := resp.Header.Values("X-Request-Id"); len(got) != 1 || got[0] != "abc" {
		t.Errorf("X-Request-Id %q, want [abc]", got)
	}
}

// TestHalfCloseGetsNoAnswer: a client that half-closes its connection after its request (which
// Go's servers take for a client gone: the engine's request is cancelled) gets the connection
// closed without an answer, not an empty 200 that looks like a success.
func TestHalfCloseGetsNoAnswer(t *testing.T) {
	eng := engine(t, func(w http.ResponseWriter, r *http.Request) {
		select { // an answer that takes a while; the router cancels it
		case <-r.Context().Done():
		case <-time.After(5 * time.Second):
			_, _ = io.WriteString(w, `{"id":"c1","object":"chat.completion","choices":[]}`)
		}
	})
	f := newFixture(t, spec(eng.URL, "m"))
	conn := f.rawPost(t, chatBody)
	if err := conn.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(conn)
	if err != nil || len(got) != 0 {
		t.Errorf("got %q (%v); want the connection closed without an answer", got, err)
	}
	f.wait(t)
	if n := testutil.ToFloat64(f.h.Metrics.Requests.WithLabelValues("m", metrics.NoEndpoint, "499")) +
		testutil.ToFloat64(f.h.Metrics.Requests.WithLabelValues("m", eng.URL, "499")); n != 1 {
		t.Errorf("requests_total{status=499} = %v, want 1", n)
	}
}

// TestMethodNotAllowedSaysAllow: a 405 names the method the path takes (RFC 9110, 15.5.6).
func TestMethodNotAllowedSaysAllow(t *testing.T) {
	f := newFixture(t, spec(newFakeEngine(t).srv.URL, "m"))
	for path, want := range map[string]string{"/v1/chat/completions": "POST", "/v1/models": "GET"} {
		method := http.MethodGet
		if want == "GET" {
			method = http.MethodPost
		}
		req, err := http.NewRequest(method, f.srv.URL+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := f.srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		f.wait(t)
		if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != want {
			t.Errorf("%s %s: %d, Allow %q; want 405 with Allow %s", method, path, resp.StatusCode, resp.Header.Get("Allow"), want)
		}
	}
}

// TestRetryAfterCleaned: the last refusal's Retry-After reaches the client as a sane number of
// seconds (1 ms to a minute, rounded up), whatever the engine wrote.
func TestRetryAfterCleaned(t *testing.T) {
	for _, tc := range []struct{ sent, ms, want, wantMS string }{
		{"99999999999", "", "60", ""},
		{"-5", "", "1", ""},
		{"2", "", "2", ""},
		{"", "NaN", "1", "1000"},
		{"", "1500", "2", "1500"},
	} {
		eng := engine(t, func(w http.ResponseWriter, r *http.Request) {
			if tc.sent != "" {
				w.Header().Set("Retry-After", tc.sent)
			}
			if tc.ms != "" {
				w.Header().Set("Retry-After-Ms", tc.ms)
			}
			w.WriteHeader(http.StatusTooManyRequests)
		})
		f := newFixture(t, spec(eng.URL, "m"))
		resp, _ := f.post(t, "/v1/chat/completions", chatBody)
		if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != tc.want || resp.Header.Get("Retry-After-Ms") != tc.wantMS {
			t.Errorf("engine's Retry-After %q, retry-after-ms %q: client got %d, %q and %q; want 429, %q and %q", tc.sent, tc.ms,
				resp.StatusCode, resp.Header.Get("Retry-After"), resp.Header.Get("Retry-After-Ms"), tc.want, tc.wantMS)
		}
	}
}

// TestLostCountedOnEndpoint: a request whose engine closed the connection after receiving it
// (not sent again) is counted on that endpoint's series, not under none: an engine that breaks
// on requests shows on its own 502s.
func TestLostCountedOnEndpoint(t *testing.T) {
	eng := engine(t, func(w http.ResponseWriter, r *http.Request) {
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close()
		}
	})
	f := newFixture(t, spec(eng.URL, "m"))
	resp, body := f.post(t, "/v1/chat/completions", chatBody)
	if resp.StatusCode != http.StatusBadGateway || errorCode(body) != "upstream_connection_lost" {
		t.Errorf("got %d %s, want 502 upstream_connection_lost", resp.StatusCode, body)
	}
	if n := testutil.ToFloat64(f.h.Metrics.Requests.WithLabelValues("m", eng.URL, "502")); n != 1 {
		t.Errorf("requests_total{endpoint=%s,status=502} = %v, want 1", eng.URL, n)
	}
}

// TestStreamErrorEvent: a stream that carries the engine's error event (vLLM's, after its head;
// then [DONE]) is relayed as it is, but counted as the engine's failure (502, the policy told),
// not as a success: an engine that fails every stream so is not a healthy one.
func TestStreamErrorEvent(t *testing.T) {
	for _, ev := range []string{
		`data: {"error": {"message": "boom", "type": "InternalServerError", "code": 500}}`,
		`data: {"object":"error","message":"boom","type":"InternalServerError","code":500}`,
	} {
		eng := engine(t, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n"+ev+"\n\ndata: [DONE]\n\n")
		})
		f := newFixture(t, spec(eng.URL, "m"))
		resp, body := f.post(t, "/v1/chat/completions", streamBody)
		if resp.StatusCode != 200 || !strings.Contains(string(body), "boom") || !strings.HasSuffix(string(body), "data: [DONE]\n\n") {
			t.Errorf("%s: got %d %q; want it relayed", ev, resp.StatusCode, body)
		}
		if n := testutil.ToFloat64(f.h.Metrics.Requests.WithLabelValues("m", eng.URL, "502")); n != 1 {
			t.Errorf("%s: requests_total{status=502} = %v, want 1", ev, n)
		}
		if len(f.pk.done) != 1 || f.pk.done[0].OK {
			t.Errorf("%s: policy told %+v, want one failed result", ev, f.pk.done)
		}
	}
}

// TestLongAnswerUsage: a whole answer longer than the router keeps (maxCapture) still has its
// usage read, from its last bytes, so that the tenant is charged what it used (9876 tokens:
// within what an engine can generate in the second the bound allows at least, boundUsage).
func TestLongAnswerUsage(t *testing.T) {
	text := strings.Repeat("x", maxCapture+1000)
	eng := engine(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"%s \"usage\": {\"completion_tokens\": 1}"}}],`+
			`"usage":{"prompt_tokens":10,"completion_tokens":9876,"total_tokens":9886},"kv_transfer_params":null}`, text)
	})
	f := newFixture(t, spec(eng.URL, "m"))
	resp, body := f.post(t, "/v1/chat/completions", chatBody)
	if resp.StatusCode != 200 || len(body) < maxCapture {
		t.Fatalf("got %d, %d bytes", resp.StatusCode, len(body))
	}
	if n := testutil.ToFloat64(f.h.Metrics.CompletionTokens.WithLabelValues("m")); n != 9876 {
		t.Errorf("completion tokens counted %v, want the answer's 9876", n)
	}
}
