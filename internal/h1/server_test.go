package h1

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// startServer serves h on a loopback port with s's settings; the server is closed at the end of
// the test.
func startServer(t *testing.T, s *Server, h http.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return serveOn(t, s, h, ln)
}

// serveOn serves h on ln with s's settings; the server is closed at the end of the test.
func serveOn(t *testing.T, s *Server, h http.Handler, ln net.Listener) string {
	t.Helper()
	s.Handler = h
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	t.Cleanup(func() {
		s.Close()
		if err := <-done; !errors.Is(err, ErrServerClosed) {
			t.Errorf("Serve returned %v, want ErrServerClosed", err)
		}
		s.wg.Wait()
	})
	return ln.Addr().String()
}

// dialBuffered connects to addr, with a 5 s deadline, and returns the connection (closed at
// the end of the test) and a reader of it.
func dialBuffered(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	return c, bufio.NewReader(c)
}

// rawExchange writes req on a new connection and returns everything the server sends until it
// closes the connection (or 5 s pass).
func rawExchange(t *testing.T, addr, req string) string {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("reading the answer: %v (got %q)", err, b)
	}
	return string(b)
}

func newClient(t *testing.T) *http.Client {
	tr := &http.Transport{MaxIdleConnsPerHost: 4}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 5 * time.Second}
}

// TestMatchesNetHTTPServer serves the same handlers with this server and net/http's and
// compares what a client sees: status, the headers that matter and the body.
func TestMatchesNetHTTPServer(t *testing.T) {
	big := strings.Repeat("x", 10_000)
	handlers := map[string]http.HandlerFunc{
		"small": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"ok":true}`)
		},
		"big, no length": func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.WriteString(w, big)
		},
		"declared length": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", "5")
			_, _ = io.WriteString(w, "hello")
		},
		"sniffed type": func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.WriteString(w, "<html><body>hi</body></html>")
		},
		"status and echo": func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			w.Header().Set("X-Method", r.Method)
			w.Header().Set("X-Host", r.Host)
			w.WriteHeader(http.StatusTeapot)
			_, _ = fmt.Fprintf(w, "%s %s %q", r.Method, r.URL.RequestURI(), b)
		},
		"empty": func(w http.ResponseWriter, r *http.Request) {},
		"no content": func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusNoContent)
		},
		"flushed": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			for i := range 3 {
				_, _ = fmt.Fprintf(w, "data: %d\n\n", i)
				w.(http.Flusher).Flush()
			}
		},
		"trailer": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Trailer", "X-Sum")
			_, _ = io.WriteString(w, big)
			w.Header().Set("X-Sum", "42")
		},
	}
	type seen struct {
		Status       int
		Type, Length string
		Body         string
		Trailer      string
		Chunked      bool
		HostSeen     bool
	}
	for name, h := range handlers {
		t.Run(name, func(t *testing.T) {
			ref := httptest.NewServer(h)
			defer ref.Close()
			addr := startServer(t, &Server{}, h)
			for _, method := range []string{http.MethodGet, http.MethodPost, http.MethodHead} {
				get := func(base string) seen {
					req, _ := http.NewRequest(method, base+"/p?q=1", strings.NewReader("body"))
					resp, err := newClient(t).Do(req)
					if err != nil {
						t.Fatal(err)
					}
					defer resp.Body.Close()
					b, err := io.ReadAll(resp.Body)
					if err != nil {
						t.Fatal(err)
					}
					s := seen{Status: resp.StatusCode, Type: resp.Header.Get("Content-Type"), Length: resp.Header.Get("Content-Length"),
						Body: strings.ReplaceAll(string(b), base[len("http://"):], "HOST"), Trailer: resp.Trailer.Get("X-Sum"),
						Chunked: len(resp.TransferEncoding) > 0}
					s.HostSeen = resp.Header.Get("X-Host") != ""
					return s
				}
				want, got := get(ref.URL), get("http://"+addr)
				if diff := cmp.Diff(want, got); diff != "" {
					t.Errorf("%s: net/http vs h1 (-want +got):\n%s", method, diff)
				}
			}
		})
	}
}

func TestKeepAliveAndPipelining(t *testing.T) {
	var remotes sync.Map
	addr := startServer(t, &Server{}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		remotes.Store(r.RemoteAddr, true)
		b, _ := io.ReadAll(r.Body)
		_, _ = fmt.Fprintf(w, "%s:%s", r.URL.Path, b)
	}))
	c := newClient(t)
	for i := range 5 {
		resp, err := c.Post("http://"+addr+"/"+fmt.Sprint(i), "text/plain", strings.NewReader("b"))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	n := 0
	remotes.Range(func(any, any) bool { n++; return true })
	if n != 1 {
		t.Errorf("5 sequential requests came over %d connections, want 1", n)
	}
	// Four requests in one write (one with a chunked body): four answers, in order.
	got := rawExchange(t, addr, "POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\n1"+
		"GET /b HTTP/1.1\r\nHost: x\r\n\r\n"+
		"POST /chunked HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"+
		"POST /c HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\n22")
	var bodies []string
	br := bufio.NewReader(strings.NewReader(got))
	for {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			break
		}
		b, _ := io.ReadAll(resp.Body)
		bodies = append(bodies, string(b))
	}
	if diff := cmp.Diff([]string{"/a:1", "/b:", "/chunked:abcde", "/c:22"}, bodies); diff != "" {
		t.Errorf("pipelined answers (-want +got):\n%s", diff)
	}
}

func TestProtocolErrors(t *testing.T) {
	s := &Server{MaxHeaderBytes: 1 << 10, ErrorBody: func(status int, msg string) (string, []byte) {
		return "application/json", fmt.Appendf(nil, `{"error":{"message":%q}}`, msg)
	}}
	var calls atomic.Int32
	addr := startServer(t, s, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { calls.Add(1) }))
	for _, tc := range []struct {
		name, req string
		status    int
		msg       string
	}{
		{"garbage", "HELLO\r\n\r\n", 400, "malformed request"},
		{"no host", "GET / HTTP/1.1\r\n\r\n", 400, "missing required Host header"},
		{"bad host", "GET / HTTP/1.1\r\nHost: a b\r\n\r\n", 400, "malformed Host header"},
		{"head too large", "GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("a", 8<<10) + "\r\n\r\n", 431, "request head too large"},
		{"HTTP/2 request line", "GET / HTTP/2.0\r\nHost: x\r\n\r\n", 505, "HTTP/1.0 and HTTP/1.1 only"}, // HTTP/2's preface: h2c_test.go
		{"two lengths", "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n12", 400, "malformed request"},
		{"odd expectation", "POST / HTTP/1.1\r\nHost: x\r\nExpect: coffee\r\nContent-Length: 1\r\n\r\n1", 417, "unsupported Expect header"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := rawExchange(t, addr, tc.req)
			resp, err := http.ReadResponse(bufio.NewReader(strings.NewReader(got)), nil)
			if err != nil {
				t.Fatalf("answer %q: %v", got, err)
			}
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tc.status || !strings.Contains(string(b), tc.msg) || resp.Header.Get("Content-Type") != "application/json" || !resp.Close {
				t.Errorf("got %d %q (type %q, close %v); want %d with %q, JSON, Connection: close",
					resp.StatusCode, b, resp.Header.Get("Content-Type"), resp.Close, tc.status, tc.msg)
			}
		})
	}
	if n := calls.Load(); n != 0 {
		t.Errorf("the handler ran %d times for requests that were not valid", n)
	}
}

func TestHTTP10(t *testing.T) {
	addr := startServer(t, &Server{}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/stream" {
			_, _ = io.WriteString(w, "part one ")
			w.(http.Flusher).Flush()
		}
		_, _ = io.WriteString(w, "done")
	}))
	for path, want := range map[string]string{"/": "done", "/stream": "part one done"} {
		got := rawExchange(t, addr, "GET "+path+" HTTP/1.0\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(strings.NewReader(got)), nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		if string(b) != want || len(resp.TransferEncoding) > 0 {
			t.Errorf("HTTP/1.0 %s: body %q, transfer encoding %v; want %q, no chunking (the close ends the body)", path, b, resp.TransferEncoding, want)
		}
	}
}

func TestExpectContinue(t *testing.T) {
	addr := startServer(t, &Server{}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		_, _ = fmt.Fprintf(w, "%d", len(b))
	}))
	c, br := dialBuffered(t, addr)
	_, _ = io.WriteString(c, "POST / HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n")
	line, err := br.ReadString('\n')
	if err != nil || line != "HTTP/1.1 100 Continue\r\n" {
		t.Fatalf("before the body: %q, %v; want a 100 Continue", line, err)
	}
	_, _ = br.ReadString('\n')
	_, _ = io.WriteString(c, "abc")
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	if string(b) != "3" {
		t.Errorf("body length seen by the handler: %q, want 3", b)
	}
}

// TestClientGoneCancelsRequest: a client that goes away while its request runs cancels the
// request's context, once the request has run for WatchAfter.
func TestClientGoneCancelsRequest(t *testing.T) {
	canceled := make(chan time.Duration, 1)
	started := make(chan struct{})
	s := &Server{WatchAfter: 20 * time.Millisecond}
	addr := startServer(t, s, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		t0 := time.Now()
		close(started)
		select {
		case <-r.Context().Done():
			canceled <- time.Since(t0)
		case <-time.After(5 * time.Second):
			canceled <- -1
		}
	}))
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.WriteString(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi")
	<-started
	c.Close()
	if d := <-canceled; d < 0 || d > time.Second {
		t.Errorf("the request's context ended %v after the client left; want within a second (-1: never)", d)
	}
}

// TestFastRequestsAreNotWatched: requests shorter than WatchAfter start no watch, and a
// watched request's connection still serves the next request.
func TestFastRequestsAreNotWatched(t *testing.T) {
	s := &Server{WatchAfter: time.Hour}
	var watched atomic.Int32
	addr := startServer(t, s, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			// Ask for the watch directly (an hour is too long to wait), then answer.
			c := s.connOf(r.RemoteAddr)
			c.watchDue()
			c.mu.Lock()
			if c.watching {
				watched.Add(1)
			}
			c.mu.Unlock()
		}
		_, _ = io.WriteString(w, r.URL.Path)
	}))
	c := newClient(t)
	for _, p := range []string{"/fast", "/slow", "/fast"} {
		resp, err := c.Get("http://" + addr + p)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(b) != p {
			t.Errorf("GET %s answered %q", p, b)
		}
	}
	if n := watched.Load(); n != 1 {
		t.Errorf("%d requests were watched, want 1 (the slow one)", n)
	}
}

// connOf finds the connection from remote (tests only).
func (s *Server) connOf(remote string) *srvConn {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		if c.remote == remote {
			return c
		}
	}
	return nil
}

func TestTimeouts(t *testing.T) {
	s := &Server{ReadHeaderTimeout: 200 * time.Millisecond, IdleTimeout: 300 * time.Millisecond}
	addr := startServer(t, s, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") }))
	closedAfter := func(send string) time.Duration {
		// The clock starts before the dial: the server's timer starts at its accept, which
		// may come before a client delayed by a loaded machine reads the time (192.6 ms for
		// the 200 ms timeout once, taking t0 after the dial).
		t0 := time.Now()
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(t0.Add(5 * time.Second))
		_, _ = io.WriteString(c, send)
		_, _ = io.Copy(io.Discard, c) // until the server closes
		return time.Since(t0)
	}
	if d := closedAfter("GET / HTTP/1.1\r\nHost: x\r\n"); d < 200*time.Millisecond || d > 2*time.Second {
		t.Errorf("a head never finished was closed after %v; want 200 ms to 2 s", d)
	}
	if d := closedAfter(""); d < 200*time.Millisecond || d > 2*time.Second {
		t.Errorf("a connection that sent nothing was closed after %v; want 200 ms to 2 s", d)
	}
	if d := closedAfter("GET / HTTP/1.1\r\nHost: x\r\n\r\n"); d < 300*time.Millisecond || d > 2*time.Second {
		t.Errorf("an idle kept-alive connection was closed after %v; want 300 ms to 2 s", d)
	}
}

func TestPanicsAndUnreadBodies(t *testing.T) {
	var logged strings.Builder
	var mu sync.Mutex
	s := &Server{ErrorLog: newTestLogger(&logged, &mu)}
	addr := startServer(t, s, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/panic":
			panic("boom")
		case "/abort":
			panic(http.ErrAbortHandler)
		}
		_, _ = io.WriteString(w, "ok") // the body is left unread
	}))
	for _, p := range []string{"/panic", "/abort"} {
		if got := rawExchange(t, addr, "GET "+p+" HTTP/1.1\r\nHost: x\r\n\r\n"); got != "" {
			t.Errorf("%s: got %q, want the connection closed without an answer", p, got)
		}
	}
	mu.Lock()
	if l := logged.String(); !strings.Contains(l, "boom") || strings.Contains(l, "abort") {
		t.Errorf("log %q: want the panic (with its value) and nothing about ErrAbortHandler", l)
	}
	mu.Unlock()
	// A small unread body is dropped and the connection kept; a large one closes it.
	for _, tc := range []struct {
		size int
		keep bool
	}{{100, true}, {maxDiscard + 10, false}} {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		br := bufio.NewReader(c)
		go func() {
			_, _ = fmt.Fprintf(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", tc.size, strings.Repeat("z", tc.size))
		}()
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_, _ = io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		_, err = http.ReadResponse(br, nil)
		if kept := err == nil; kept != tc.keep {
			t.Errorf("unread body of %d bytes: connection kept %v (%v), want %v", tc.size, kept, err, tc.keep)
		}
		c.Close()
	}
}

func TestShutdownDrains(t *testing.T) {
	release := make(chan struct{})
	started := make(chan struct{})
	s := &Server{}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			close(started)
			<-release
		}
		_, _ = io.WriteString(w, "done")
	})
	served := make(chan error, 1)
	go func() { served <- s.Serve(ln) }()
	addr := ln.Addr().String()
	c := newClient(t)
	resp, err := c.Get("http://" + addr + "/quick") // leaves an idle connection
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	slow := make(chan string, 1)
	go func() {
		resp, err := newClient(t).Get("http://" + addr + "/slow")
		if err != nil {
			slow <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		slow <- string(b)
	}()
	<-started
	shut := make(chan error, 1)
	go func() { shut <- s.Shutdown(context.Background()) }()
	if err := <-served; !errors.Is(err, ErrServerClosed) {
		t.Errorf("Serve returned %v, want ErrServerClosed", err)
	}
	select {
	case err := <-shut:
		t.Fatalf("Shutdown returned (%v) while a request was in flight", err)
	case <-time.After(100 * time.Millisecond):
	}
	if _, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		t.Error("the server still accepts connections during Shutdown")
	}
	close(release)
	if got := <-slow; got != "done" {
		t.Errorf("the request in flight got %q, want its answer", got)
	}
	if err := <-shut; err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	// A Shutdown whose context ends first reports it.
	s2 := &Server{}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s2.Shutdown(ctx); err != nil {
		t.Errorf("Shutdown of a server with nothing to drain: %v", err)
	}
}

func newTestLogger(b *strings.Builder, mu *sync.Mutex) *log.Logger {
	return log.New(lockedWriter{b, mu}, "", 0)
}

type lockedWriter struct {
	b  *strings.Builder
	mu *sync.Mutex
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func TestHijack(t *testing.T) {
	s := &Server{}
	addr := startServer(t, s, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Before", "1")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Errorf("Hijack: %v", err)
			return
		}
		defer conn.Close()
		// The rest is the handler's own protocol: chunked by hand, then the connection closes.
		_, _ = brw.WriteString("4\r\nmine\r\n0\r\n\r\n")
		_ = brw.Flush()
		if _, _, err := http.NewResponseController(w).Hijack(); !errors.Is(err, http.ErrHijacked) {
			t.Errorf("second Hijack: %v, want ErrHijacked", err)
		}
	}))
	got := rawExchange(t, addr, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(strings.NewReader(got)), nil)
	if err != nil {
		t.Fatalf("%q: %v", got, err)
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.Header.Get("X-Before") != "1" || string(b) != "mine" {
		t.Errorf("after a hijack: header %q, body %q; want the flushed head then the handler's bytes", resp.Header.Get("X-Before"), b)
	}
}

// TestHTTP2HandOff: a connection that opens with HTTP/2's preface goes to HTTP2 whole; one
// that does not is served here; without HTTP2 the preface gets 505 (TestProtocolErrors).
func TestHTTP2HandOff(t *testing.T) {
	handed := make(chan []byte, 1)
	s := &Server{HTTP2: func(c net.Conn) {
		go func() {
			defer c.Close()
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			b := make([]byte, len(h2Preface)+5)
			_, err := io.ReadFull(c, b)
			if err != nil {
				t.Errorf("reading the handed-over connection: %v", err)
			}
			handed <- b
		}()
	}}
	addr := startServer(t, s, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "h1") }))
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, _ = io.WriteString(c, h2Preface+"hello")
	select {
	case b := <-handed:
		if string(b) != h2Preface+"hello" {
			t.Errorf("handed over %q, want the preface and what followed", b)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the HTTP/2 connection was not handed over")
	}
	if got := rawExchange(t, addr, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"); !strings.HasSuffix(got, "h1") {
		t.Errorf("an HTTP/1 request beside HTTP2: %q", got)
	}
}

// EndBody sends a chunked body's end (trailers included) before the handler returns, so that
// a client reading the body to its end has it while the handler still works; later writes
// fail, and the connection carries the next request.
func TestEndBody(t *testing.T) {
	release := make(chan struct{})
	writeErr := make(chan error, 1)
	addr := startServer(t, &Server{}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/next" {
			_, _ = io.WriteString(w, "next")
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: a\n\n")
		w.(http.Flusher).Flush()
		w.Header().Set(http.TrailerPrefix+"X-T", "v")
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
		if err := w.(interface{ EndBody() error }).EndBody(); err != nil {
			t.Errorf("EndBody: %v", err)
		}
		_, err := io.WriteString(w, "late")
		writeErr <- err
		<-release // the bookkeeping after the answer
	}))
	c, br := dialBuffered(t, addr)
	fmt.Fprint(c, "GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body) // to the chunked body's end, while the handler waits
	if err != nil || string(b) != "data: a\n\ndata: [DONE]\n\n" || resp.Trailer.Get("X-T") != "v" {
		t.Errorf("body %q, trailer %v, %v; want both events and the trailer before the handler returns", b, resp.Trailer, err)
	}
	if err := <-writeErr; !errors.Is(err, http.ErrBodyNotAllowed) {
		t.Errorf("a write after EndBody: %v, want ErrBodyNotAllowed", err)
	}
	close(release)
	fmt.Fprint(c, "GET /next HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, err = http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := io.ReadAll(resp.Body); string(b) != "next" {
		t.Errorf("next request on the connection: %q", b)
	}
}

// At a low request rate the janitor goes quiet (sleeps long) as soon as no request is in
// flight, not after quietTicks rounds: otherwise it wakes a thread every half WatchAfter
// between requests. The next request, if it runs long, still gets its watch (at the janitor's
// next round).
func TestJanitorQuietBetweenRareRequests(t *testing.T) {
	s := &Server{WatchAfter: 2 * time.Millisecond}
	var slowWatched atomic.Bool
	addr := startServer(t, s, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			c := s.connOf(r.RemoteAddr)
			deadline := time.Now().Add(5 * time.Second)
			for time.Now().Before(deadline) && !slowWatched.Load() {
				c.mu.Lock()
				slowWatched.Store(c.watching)
				c.mu.Unlock()
				time.Sleep(time.Millisecond) // polling the connection's state, with a deadline
			}
		}
		_, _ = io.WriteString(w, r.URL.Path)
	}))
	get := getter(t, newClient(t), addr)
	get("/fast")
	r0 := s.rounds.Load()
	deadline := time.Now().Add(5 * time.Second)
	for !s.quiet.Load() && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if !s.quiet.Load() {
		t.Fatal("the janitor never went quiet")
	}
	if n := s.rounds.Load() - r0; n >= quietTicks {
		t.Errorf("the janitor went quiet after %d rounds without a request, want fewer than %d", n, quietTicks)
	}
	get("/slow") // found at the quiet janitor's next round: the watch starts
	if !slowWatched.Load() {
		t.Error("a request that started while the janitor was quiet was never watched")
	}
}

// quietServer starts s with a handler that echoes the path, makes one request, and waits (at
// most 5 s) until the janitor has gone quiet after it; it returns the client's getter.
func quietServer(t *testing.T, s *Server) func(path string) {
	t.Helper()
	addr := startServer(t, s, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, r.URL.Path)
	}))
	get := getter(t, newClient(t), addr)
	get("/first")
	deadline := time.Now().Add(5 * time.Second)
	for !s.quiet.Load() && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	return get
}

// When requests are rare, a short request costs the quiet janitor nothing: no nudge when it
// starts (a wake-up of the janitor's goroutine, and of a thread to run it), no round half a
// WatchAfter later, and the janitor's long sleep is not put off by it.
func TestJanitorQuietAfterLastRequest(t *testing.T) {
	// Rounds every 20 ms while busy: the requests are far shorter, even under -race on a loaded
	// machine.
	s := &Server{WatchAfter: 40 * time.Millisecond}
	get := quietServer(t, s)
	r0, t0 := s.rounds.Load(), time.Now()
	for range 5 {
		get("/again")
		// What is tested is that nothing happens: the time of three busy rounds passes (the
		// janitor before was nudged by each request, and before that went quiet only at the
		// second round after it).
		time.Sleep(60 * time.Millisecond)
		if !s.quiet.Load() {
			t.Error("the janitor is not quiet after the request")
		}
	}
	// Only its slow rounds (a second apart here) may have come meanwhile.
	if n, want := s.rounds.Load()-r0, 1+int64(time.Since(t0)/time.Second); n > want {
		t.Errorf("%d janitor rounds over 5 short requests in %v, want at most %d (its slow rounds)",
			n, time.Since(t0).Round(time.Millisecond), want)
	}
}

// Short requests that come more often than the janitor's slow period do not put its rounds
// off (each request's end leaves a sleeping janitor's deadline where it is), and do not each
// get a round of their own.
func TestJanitorSweepsBetweenShortRequests(t *testing.T) {
	// The slow period is a quarter of the idle timeout: 200 ms.
	s := &Server{WatchAfter: 40 * time.Millisecond, IdleTimeout: 800 * time.Millisecond}
	get := quietServer(t, s)
	r0, t0 := s.rounds.Load(), time.Now()
	requests := 0
	for time.Since(t0) < time.Second {
		get("/again")
		requests++
		time.Sleep(40 * time.Millisecond)
	}
	n := s.rounds.Load() - r0
	if n < 2 {
		t.Errorf("%d janitor rounds in %v of requests every 40 ms, want its slow rounds (200 ms apart)",
			n, time.Since(t0).Round(time.Millisecond))
	}
	if n > int64(requests)/2 {
		t.Errorf("%d janitor rounds for %d short requests, want only its slow rounds", n, requests)
	}
}

// TestIdleExpiryLeavesArrivingRequest: a kept-alive connection whose idle time runs out just as
// a request arrives on it (its bytes wait in the socket, the connection's goroutine not yet
// scheduled to read them) is not closed: the request is served. One with nothing waiting is
// closed as before. The goroutine is held, by the test's hook, where it would wait for the
// request; the janitor's sweep is run by the test at a time past the idle timeout, or
// Shutdown's round of the idle connections.
func TestIdleExpiryLeavesArrivingRequest(t *testing.T) {
	for _, tc := range []struct {
		name     string
		arrive   bool // the next request's bytes arrive before the sweep
		shutdown bool // Shutdown's round of idle connections instead of the janitor's sweep
	}{
		{"a request arriving", true, false},
		{"nothing arriving", false, false},
		{"a request arriving at Shutdown", true, true},
		{"nothing arriving at Shutdown", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			idled, release := make(chan struct{}), make(chan struct{})
			var holds atomic.Int32
			s := &Server{ReadHeaderTimeout: time.Hour, IdleTimeout: time.Hour} // the janitor's own sweeps expire nothing
			s.idleHook = func() {
				if holds.Add(1) == 1 { // the first time the connection turns idle
					idled <- struct{}{}
					<-release
				}
			}
			addr := startServer(t, s, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") }))
			c, br := dialBuffered(t, addr)
			exchange := func(i int) error {
				if _, err := fmt.Fprintf(c, "GET /%d HTTP/1.1\r\nHost: x\r\n\r\n", i); err != nil {
					return err
				}
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					return err
				}
				b, err := io.ReadAll(resp.Body)
				if err == nil && string(b) != "ok" {
					err = fmt.Errorf("body %q", b)
				}
				return err
			}
			if err := exchange(1); err != nil {
				t.Fatal(err)
			}
			<-idled
			sc := s.connOf(c.LocalAddr().String())
			if sc == nil {
				t.Fatal("the server does not know the connection")
			}
			if tc.arrive {
				if _, err := io.WriteString(c, "GET /2 HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
					t.Fatal(err)
				}
				for end := time.Now().Add(5 * time.Second); !pending(sc.rwc); time.Sleep(time.Millisecond) {
					if time.Now().After(end) {
						t.Fatal("the request's bytes did not reach the server's socket in 5 s")
					}
				}
			}
			if tc.shutdown {
				s.closeIdle()
			} else {
				s.mu.Lock()
				_, expired, _ := s.sweep(time.Now().Add(2 * time.Hour).UnixNano())
				s.mu.Unlock()
				closeConns(expired)
			}
			close(release)
			if !tc.arrive {
				if b, err := br.ReadByte(); err == nil {
					t.Errorf("the expired connection sent %q, want it closed", b)
				}
				return
			}
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("the request that arrived as the connection expired: %v", err)
			}
			if b, _ := io.ReadAll(resp.Body); string(b) != "ok" {
				t.Errorf("answer %q, want ok", b)
			}
			if err := exchange(3); err != nil {
				t.Errorf("the connection after: %v", err)
			}
		})
	}
}

// TestTurnPublishesItsSince: a reader that sees a connection in the state serve has just moved
// it to sees that state's since too, never the one before. The test's hook holds the
// connection's goroutine right after the move and runs, there, the round that would close the
// connection with the stale since: Shutdown's (closeIdle) after a stream longer than
// idleGrace, the janitor's (sweep) at the idle timeout counted from the request's end, and the
// janitor's at the header timeout counted from the arrival of the next request (which, counted
// from when the connection turned idle, is past). In each the connection serves its next
// request.
func TestTurnPublishesItsSince(t *testing.T) {
	const timeout = time.Hour // the janitor's own sweeps expire nothing
	for _, tc := range []struct {
		name   string
		at     int32         // the state the hook holds the connection in
		stream time.Duration // how long the first answer lasts
		round  func(s *Server, ended, sent time.Time)
	}{
		{"idle at Shutdown", stateIdle, idleGrace + 100*time.Millisecond, func(s *Server, _, _ time.Time) {
			s.closeIdle()
		}},
		{"idle at the idle timeout", stateIdle, 5 * time.Millisecond, func(s *Server, ended, _ time.Time) {
			s.mu.Lock()
			_, expired, _ := s.sweep(ended.Add(timeout).UnixNano())
			s.mu.Unlock()
			closeConns(expired)
		}},
		{"head at the header timeout", stateHead, 0, func(s *Server, _, sent time.Time) {
			s.mu.Lock()
			_, expired, _ := s.sweep(sent.Add(timeout).UnixNano())
			s.mu.Unlock()
			closeConns(expired)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			held, release := make(chan struct{}), make(chan struct{})
			idle := make(chan struct{}, 1)
			var holds atomic.Int32
			s := &Server{ReadHeaderTimeout: timeout, IdleTimeout: timeout}
			s.turnHook = func(st int32) {
				if st == stateIdle {
					select {
					case idle <- struct{}{}:
					default:
					}
				}
				if st == tc.at && holds.Add(1) == 1 { // the first time only
					held <- struct{}{}
					<-release
				}
			}
			var ended atomic.Int64 // when the first answer's last byte was written, Unix ns
			addr := startServer(t, s, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.WriteString(w, "o")
				if r.URL.Path == "/1" {
					_ = http.NewResponseController(w).Flush()
					time.Sleep(tc.stream) // a stream that lasts
				}
				_, _ = io.WriteString(w, "k")
				ended.Store(time.Now().UnixNano())
			}))
			c, br := dialBuffered(t, addr)
			exchange := func(i int) error {
				if _, err := fmt.Fprintf(c, "GET /%d HTTP/1.1\r\nHost: x\r\n\r\n", i); err != nil {
					return err
				}
				return answerOK(br)
			}
			wait := func(ch chan struct{}, what string) {
				t.Helper()
				select {
				case <-ch:
				case <-time.After(5 * time.Second):
					t.Fatalf("the connection did not turn %s in 5 s", what)
				}
			}
			var sent time.Time
			switch tc.at {
			case stateIdle:
				if _, err := io.WriteString(c, "GET /1 HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
					t.Fatal(err)
				}
				wait(held, "idle")
				tc.round(s, time.Unix(0, ended.Load()), sent)
				close(release)
				if err := answerOK(br); err != nil {
					t.Fatal(err)
				}
			case stateHead:
				if err := exchange(1); err != nil {
					t.Fatal(err)
				}
				wait(idle, "idle")
				sc := s.connOf(c.LocalAddr().String())
				if sc == nil {
					t.Fatal("the server does not know the connection")
				}
				// The request is sent strictly after the connection turned idle.
				for end := time.Now().Add(time.Second); time.Now().UnixNano() <= sc.since.Load(); {
					if time.Now().After(end) {
						t.Fatal("the clock did not move past the idle connection's since in 1 s")
					}
				}
				sent = time.Now()
				if _, err := io.WriteString(c, "GET /2 HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
					t.Fatal(err)
				}
				wait(held, "to read a head")
				tc.round(s, time.Time{}, sent)
				close(release)
				if err := answerOK(br); err != nil {
					t.Fatalf("the request that arrived: %v", err)
				}
			}
			if err := exchange(3); err != nil {
				t.Errorf("the connection after: %v", err)
			}
		})
	}
}

// answerOK reads an answer from br and checks that it says "ok".
func answerOK(br *bufio.Reader) error {
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return err
	}
	b, err := io.ReadAll(resp.Body)
	if err == nil && string(b) != "ok" {
		err = fmt.Errorf("body %q, want ok", b)
	}
	return err
}

// getter returns a function that GETs a path from addr with c and reads the answer to its end.
func getter(t *testing.T, c *http.Client, addr string) func(path string) {
	return func(p string) {
		t.Helper()
		resp, err := c.Get("http://" + addr + p)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}

// TestHeadReadNotTaken: a new connection whose request's head has been read is not taken out
// of service as if it still waited for it, by the janitor at its header timeout counted from
// the accept, nor to make room at MaxConns as a connection silent for freshGrace: its since
// is the head's end by the time a round could see it waiting. The test's hook holds the
// connection's goroutine right after the head was read, before the connection turns active,
// and runs the round there. Before, since moved only once the connection was active: both
// rounds closed the connection, and the request's client saw EOF.
func TestHeadReadNotTaken(t *testing.T) {
	for _, tc := range []struct {
		name   string
		s      *Server
		settle time.Duration // how long the new connection waits before its request
		round  func(s *Server, sent time.Time)
	}{
		{"header timeout", &Server{ReadHeaderTimeout: time.Hour, IdleTimeout: time.Hour}, 0, func(s *Server, sent time.Time) {
			s.mu.Lock()
			_, expired, _ := s.sweep(sent.Add(time.Hour).UnixNano())
			s.mu.Unlock()
			closeConns(expired)
		}},
		// freshGrace: 100 ms; the janitor's header timeout, 400 ms, is far from the hold.
		{"MaxConns", &Server{MaxConns: 1, ReadHeaderTimeout: 400 * time.Millisecond}, 110 * time.Millisecond, func(s *Server, _ time.Time) {
			s.mu.Lock()
			victims, _ := s.evictWaiting()
			s.mu.Unlock()
			for _, v := range victims {
				v.rwc.Close()
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			held, release := make(chan struct{}), make(chan struct{})
			var holds atomic.Int32
			s := tc.s
			s.headHook = func() {
				if holds.Add(1) == 1 {
					held <- struct{}{}
					<-release
				}
			}
			addr := startServer(t, s, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") }))
			c, br := dialBuffered(t, addr)
			var sc *srvConn
			eventually(t, "the connection accepted", func() bool { sc = s.connOf(c.LocalAddr().String()); return sc != nil })
			// The request is sent strictly after the accept's since, and after settle.
			accepted := time.Unix(0, sc.since.Load())
			eventually(t, "the connection settled", func() bool { return time.Since(accepted) > tc.settle })
			sent := time.Now()
			if _, err := io.WriteString(c, get("/1")); err != nil {
				t.Fatal(err)
			}
			select {
			case <-held:
			case <-time.After(5 * time.Second):
				t.Fatal("the head was not read in 5 s")
			}
			tc.round(s, sent)
			close(release)
			if err := answerOK(br); err != nil {
				t.Fatalf("the request whose head was read: %v", err)
			}
		})
	}
}
