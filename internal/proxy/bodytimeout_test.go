package proxy

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/h1"
)

type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }

// TestBodyTimeoutIs408: a body the API server gave up on (its body timeout) is answered 408
// with an OpenAI error body, and reaches no engine.
func TestBodyTimeoutIs408(t *testing.T) {
	e := newFakeEngine(t)
	f := newFixture(t, spec(e.srv.URL, "m"))
	f.inner = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Body = io.NopCloser(errReader{h1.ErrBodyReadTimeout})
		f.h.ServeHTTP(w, r)
	})
	resp, body := f.post(t, "/v1/chat/completions", chatBody)
	var v struct {
		Error struct {
			Code *string `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &v); err != nil || resp.StatusCode != http.StatusRequestTimeout || v.Error.Code == nil || *v.Error.Code != "request_timeout" {
		t.Errorf("got %d %s (%v); want 408 with code request_timeout", resp.StatusCode, body, err)
	}
	if n := len(e.received()); n != 0 {
		t.Errorf("engine received %d requests, want none", n)
	}
}

// h1Fixture serves f's handler with srv (an h1.Server whose limits the caller set) on a
// loopback port, and returns its address; the server is closed at the end of the test.
func h1Fixture(t *testing.T, f *fixture, srv *h1.Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() { f.done <- struct{}{} }()
		f.h.ServeHTTP(w, r)
	})
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	t.Cleanup(func() {
		_ = srv.Close()
		<-served
	})
	return ln.Addr().String()
}

// TestBodyTimeoutNamesSetting: the 408 of a body the API server cut names the setting that cut
// it. A body that stops coming is cut by server.body_stall_timeout, and one trickled in past
// server.body_read_timeout by that; before, both were said to be body_read_timeout's (the
// QA's stalled body, cut at body_stall_timeout's 5 s, was told "server.body_read_timeout").
func TestBodyTimeoutNamesSetting(t *testing.T) {
	for _, tc := range []struct {
		name    string
		srv     *h1.Server
		trickle bool // a byte every 20 ms (else half the body, then nothing)
		want    string
	}{
		{"stalled", &h1.Server{BodyReadTimeout: 10 * time.Second, BodyStallTimeout: 200 * time.Millisecond}, false, "(server.body_stall_timeout)"},
		{"trickled", &h1.Server{BodyReadTimeout: 300 * time.Millisecond, BodyStallTimeout: 10 * time.Second}, true, "(server.body_read_timeout)"},
		{"stalled, no read timeout", &h1.Server{BodyStallTimeout: 200 * time.Millisecond}, false, "(server.body_stall_timeout)"},
		// Bytes keep coming, slower than body_min_rate: no progress, cut by the stall bound
		// before the read timeout (the QA's slow bodies, a byte a second against 64 KiB/s:
		// "server.body_read_timeout" where their last byte came late enough).
		{"trickled below the rate", &h1.Server{BodyReadTimeout: 400 * time.Millisecond, BodyMinRate: 1000, BodyStallTimeout: 300 * time.Millisecond}, true, "(server.body_stall_timeout)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newFakeEngine(t)
			f := newFixture(t, spec(e.srv.URL, "m"))
			addr := h1Fixture(t, f, tc.srv)
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			body := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("x", 400) + `"}]}`
			fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", len(body), body[:len(body)/2])
			stop := make(chan struct{})
			trickled := make(chan struct{})
			go func() {
				defer close(trickled)
				if !tc.trickle {
					return
				}
				tk := time.NewTicker(20 * time.Millisecond)
				defer tk.Stop()
				for i := len(body) / 2; i < len(body)-1; i++ { // never the last byte
					select {
					case <-stop:
						return
					case <-tk.C:
					}
					if _, err := c.Write([]byte{body[i]}); err != nil {
						return
					}
				}
			}()
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			close(stop)
			<-trickled
			if err != nil {
				t.Fatal(err)
			}
			got, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			f.wait(t)
			if resp.StatusCode != http.StatusRequestTimeout || !strings.Contains(string(got), tc.want) {
				t.Errorf("got %d %s; want 408 naming %s", resp.StatusCode, got, tc.want)
			}
		})
	}
}
