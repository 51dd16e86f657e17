package h1

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// countConns counts the connections a test server accepts.
func countConns(srv *httptest.Server) *atomic.Int64 {
	var n atomic.Int64
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			n.Add(1)
		}
	}
	return &n
}

func newTransport(t *testing.T) *Transport {
	t.Helper()
	tr := New(&http.Transport{})
	t.Cleanup(tr.CloseIdleConnections)
	return tr
}

func post(t *testing.T, tr http.RoundTripper, url, body string) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	return tr.RoundTrip(req)
}

// okServer answers "ok" to everything; it is closed when the test ends.
func okServer(t *testing.T) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	t.Cleanup(srv.Close)
	return srv
}

// mustPost posts {} to url and returns the response body read to its end.
func mustPost(t *testing.T, tr http.RoundTripper, url string) string {
	t.Helper()
	resp, err := post(t, tr, url, "{}")
	if err != nil {
		t.Fatal(err)
	}
	return readAll(t, resp)
}

func readAll(t *testing.T, resp *http.Response) string {
	t.Helper()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading body: %v", err)
	}
	resp.Body.Close()
	return string(b)
}

func TestReusesConnection(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "%s %s %s", r.Method, r.URL.Path, b)
	}))
	conns := countConns(srv)
	srv.Start()
	defer srv.Close()
	tr := newTransport(t)
	for i := range 20 {
		resp, err := post(t, tr, srv.URL+"/v1/x", fmt.Sprint("body", i))
		if err != nil {
			t.Fatal(err)
		}
		if got, want := readAll(t, resp), fmt.Sprintf("POST /v1/x body%d", i); got != want {
			t.Fatalf("got %q, want %q", got, want)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("20 sequential requests used %d connections, want 1", n)
	}
}

func TestStreamReadToEndIsReused(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range 5 {
			fmt.Fprintf(w, "data: %d\n\n", i)
			w.(http.Flusher).Flush()
		}
	}))
	conns := countConns(srv)
	srv.Start()
	defer srv.Close()
	tr := newTransport(t)
	for range 3 {
		resp, err := post(t, tr, srv.URL, "{}")
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.TransferEncoding) == 0 || resp.TransferEncoding[0] != "chunked" {
			t.Fatalf("want a chunked stream, got %v", resp.TransferEncoding)
		}
		if got := readAll(t, resp); !strings.HasSuffix(got, "data: 4\n\n") {
			t.Fatalf("stream %q", got)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("3 streams read to their end used %d connections, want 1", n)
	}
}

func TestEarlyCloseDropsConnection(t *testing.T) {
	closed := make(chan struct{})
	var once sync.Once
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for {
			if _, err := io.WriteString(w, "data: x\n\n"); err != nil {
				once.Do(func() { close(closed) })
				return
			}
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				once.Do(func() { close(closed) })
				return
			case <-time.After(time.Millisecond):
			}
		}
	}))
	conns := countConns(srv)
	srv.Start()
	defer srv.Close()
	tr := newTransport(t)
	resp, err := post(t, tr, srv.URL, "{}")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := resp.Body.Read(make([]byte, 16)); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close() // an endless stream abandoned: the server must see it end
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("the server did not see the abandoned stream end")
	}
	if _, err := resp.Body.Read(make([]byte, 16)); err != io.EOF {
		t.Errorf("read after Close: %v, want EOF", err)
	}
	if tr.idleCount() != 0 {
		t.Errorf("an abandoned stream's connection went back to the pool")
	}
	// The next call dials anew and works.
	resp2, err := http.NewRequest(http.MethodGet, srv.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r2, err := tr.RoundTrip(resp2.WithContext(ctx))
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	r2.Body.Close()
	if n := conns.Load(); n != 2 {
		t.Errorf("connections %d, want 2", n)
	}
}

func TestCancelEndsCallAndUpstream(t *testing.T) {
	upstreamDone := make(chan struct{})
	release := make(chan struct{})
	defer close(release)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer close(upstreamDone)
		_, _ = io.ReadAll(r.Body) // from here on, net/http watches the connection for a close
		// A long prefill: no response byte yet.
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	defer srv.Close()
	tr := newTransport(t)
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader("{}"))
	errc := make(chan error, 1)
	go func() {
		resp, err := tr.RoundTrip(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	time.Sleep(50 * time.Millisecond)
	cancel()
	select {
	case err := <-errc:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("RoundTrip after cancel: %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("RoundTrip did not return after its context was cancelled")
	}
	select {
	case <-upstreamDone:
	case <-time.After(5 * time.Second):
		t.Fatal("the upstream did not see the cancelled call go")
	}
}

// oneShotServer answers each request with a keep-alive response, then closes the connection
// without saying so: what a server does when its keep-alive timeout ends as a request arrives.
func oneShotServer(t *testing.T) (url string, requests *atomic.Int64) {
	t.Helper()
	requests = new(atomic.Int64)
	url = rawServer(t, func(c net.Conn) {
		req, err := http.ReadRequest(bufio.NewReader(c))
		if err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, req.Body)
		requests.Add(1)
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
	})
	return url, requests
}

// rawServer serves each connection with serve (then closes it) until the test ends, and
// returns its URL.
func rawServer(t *testing.T, serve func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				serve(c)
			})
		}
	})
	return "http://" + ln.Addr().String()
}

// TestStaleConnectionNeverMet: each response's connection is closed by the server just after
// (a keep-alive timeout); the next request, however soon, goes on a new connection: the pooled
// one is peeked at and found closed.
func TestStaleConnectionNeverMet(t *testing.T) {
	url, requests := oneShotServer(t)
	tr := newTransport(t)
	for i := range 3 {
		resp, err := post(t, tr, url, "{}")
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if got := readAll(t, resp); got != "ok" {
			t.Fatalf("request %d: %q", i, got)
		}
		time.Sleep(20 * time.Millisecond) // the server closes meanwhile
	}
	if n := requests.Load(); n != 3 {
		t.Errorf("the server handled %d requests, want 3", n)
	}
}

func TestStaleConnectionPeeked(t *testing.T) {
	url, requests := oneShotServer(t)
	tr := newTransport(t)
	mustPost(t, tr, url)
	time.Sleep(20 * time.Millisecond)
	tr.backdate(time.Second) // peeked at and found closed
	reused := takeIdle(t, tr, url)
	if reused {
		t.Error("a connection the server closed was taken from the pool")
	}
	if n := requests.Load(); n != 1 {
		t.Errorf("requests %d, want 1", n)
	}
}

func TestLiveConnectionPeekedAndKept(t *testing.T) {
	srv := okServer(t)
	tr := newTransport(t)
	mustPost(t, tr, srv.URL)
	tr.backdate(time.Second)
	reused := takeIdle(t, tr, srv.URL)
	if !reused {
		t.Error("a live idle connection was dropped after the peek")
	}
}

// TestClosedAfterRequestNotResent: a server that reads a request on a reused connection and
// closes it without an answer (an engine that crashes on a query of death) gets it once: the
// transport does not send it again, though its body could be, and reports an unexpected EOF.
func TestClosedAfterRequestNotResent(t *testing.T) {
	var deaths atomic.Int64
	url := rawServer(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			b, _ := io.ReadAll(req.Body)
			if string(b) == "poison" {
				deaths.Add(1)
				return // read, then gone
			}
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	})
	tr := newTransport(t)
	mustPost(t, tr, url) // a pooled connection to reuse
	resp, err := post(t, tr, url, "poison")
	if err == nil {
		resp.Body.Close()
		t.Fatal("the poisoned request got an answer")
	}
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("err %v, want unexpected EOF", err)
	}
	if n := deaths.Load(); n != 1 {
		t.Errorf("the server read the poisoned request %d times, want 1", n)
	}
}

func TestConnectionCloseNotReused(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "close")
		io.WriteString(w, "bye")
	}))
	conns := countConns(srv)
	srv.Start()
	defer srv.Close()
	tr := newTransport(t)
	for range 3 {
		resp, err := post(t, tr, srv.URL, "{}")
		if err != nil {
			t.Fatal(err)
		}
		readAll(t, resp)
	}
	if n := conns.Load(); n != 3 {
		t.Errorf("connections %d, want 3 (the server closes each)", n)
	}
}

func TestInformationalResponseSkipped(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", "</x>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		io.WriteString(w, "final")
	}))
	defer srv.Close()
	tr := newTransport(t)
	resp, err := post(t, tr, srv.URL, "{}")
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 || readAll(t, resp) != "final" {
		t.Errorf("status %d", resp.StatusCode)
	}
}

func TestNoBodyResponseReused(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	}))
	conns := countConns(srv)
	srv.Start()
	defer srv.Close()
	tr := newTransport(t)
	for range 3 {
		resp, err := post(t, tr, srv.URL, "{}")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close() // never read: a 204 has no body
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("connections %d, want 1", n)
	}
}

func TestIdleLimits(t *testing.T) {
	srv := okServer(t)
	tr := newTransport(t)
	tr.MaxIdlePerHost = 2
	var resps []*http.Response
	for range 4 { // four at once: four connections, only two kept
		resp, err := post(t, tr, srv.URL, "{}")
		if err != nil {
			t.Fatal(err)
		}
		resps = append(resps, resp)
	}
	for _, r := range resps {
		readAll(t, r)
	}
	if n := tr.idleCount(); n != 2 {
		t.Errorf("idle %d, want 2 (MaxIdlePerHost)", n)
	}
	// Connections idle past IdleTimeout are closed, not used.
	tr.IdleTimeout = time.Minute
	tr.backdate(2 * time.Minute)
	reused := takeIdle(t, tr, srv.URL)
	if reused || tr.idleCount() != 0 {
		t.Errorf("expired idle connections were kept: reused %v, idle %d", reused, tr.idleCount())
	}
}

func TestHTTPSGoesToFallback(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "tls") }))
	defer srv.Close()
	tr := New(srv.Client().Transport.(*http.Transport))
	defer tr.CloseIdleConnections()
	resp, err := post(t, tr, srv.URL, "{}")
	if err != nil {
		t.Fatal(err)
	}
	if resp.TLS == nil || readAll(t, resp) != "tls" {
		t.Error("https was not served by the fallback transport")
	}
	// alive peeks at plain sockets only: no TLS connection may wait in this pool.
	if n := tr.idleCount(); n != 0 {
		t.Errorf("%d connections pooled by the h1 transport after an https request, want 0", n)
	}
}

func TestDialError(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	tr := newTransport(t)
	resp, err := post(t, tr, "http://"+addr, "{}")
	if err == nil {
		resp.Body.Close()
		t.Fatal("a call to a closed port succeeded")
	}
	var oe *net.OpError
	if !errors.As(err, &oe) || oe.Op != "dial" {
		t.Errorf("err %v, want a dial error", err)
	}
}

// takeIdle takes a connection to url's host the way a call would, closes it, and reports
// whether it came from the pool.
func takeIdle(t *testing.T, tr *Transport, url string) bool {
	t.Helper()
	c, reused, err := tr.get(context.Background(), strings.TrimPrefix(url, "http://"), false)
	if err != nil {
		t.Fatal(err)
	}
	c.nc.Close()
	return reused
}

// idleCount is the number of pooled connections.
func (t *Transport) idleCount() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, cs := range t.idle {
		n += len(cs)
	}
	return n
}

// backdate makes every pooled connection look idle for d longer.
func (t *Transport) backdate(d time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, cs := range t.idle {
		for _, c := range cs {
			c.since = c.since.Add(-d)
		}
	}
}

// TestMatchesNetHTTP sends the same requests through this transport and net/http's, to a server
// that echoes what it received, and compares what the server saw and what came back.
func TestMatchesNetHTTP(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		var keys []string
		for k := range r.Header {
			if k != "User-Agent" && k != "Accept-Encoding" { // net/http adds its own
				keys = append(keys, k+"="+r.Header.Get(k))
			}
		}
		fmt.Fprintf(w, "%s %s host=%s len=%d te=%v body=%s headers=%d", r.Method, r.URL.RequestURI(), r.Host, r.ContentLength, r.TransferEncoding, b, len(keys))
	}))
	defer srv.Close()
	ours := newTransport(t)
	std := &http.Transport{}
	defer std.CloseIdleConnections()
	mk := func() *http.Request {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/chat/completions?a=1", bytes.NewReader([]byte(`{"x":1}`)))
		req.Header.Set("X-Request-Id", "r1")
		req.Header.Set("Content-Type", "application/json")
		return req
	}
	get := func(tr http.RoundTripper) string {
		resp, err := tr.RoundTrip(mk())
		if err != nil {
			t.Fatal(err)
		}
		return fmt.Sprint(resp.StatusCode, " ", resp.Header.Get("Content-Type"), " ", readAll(t, resp))
	}
	if a, b := get(ours), get(std); a != b {
		t.Errorf("this transport: %s\nnet/http:       %s", a, b)
	}
}

func TestResponseHeadersBounded(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	defer func() { ln.Close(); wg.Wait() }()
	wg.Go(func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil {
			return
		}
		// A status line, then headers without end.
		if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\n"); err != nil {
			return
		}
		line := "X-Junk: " + strings.Repeat("j", 1000) + "\r\n"
		for range 4 << 10 { // 4 MB of headers, or until the client hangs up
			if _, err := io.WriteString(c, line); err != nil {
				return
			}
		}
	})
	tr := newTransport(t)
	resp, err := post(t, tr, "http://"+ln.Addr().String(), "{}")
	if err == nil {
		resp.Body.Close()
		t.Fatal("a response with endless headers was accepted")
	}
	if !errors.Is(err, errHeaderTooLarge) {
		t.Errorf("err %v, want %v", err, errHeaderTooLarge)
	}
}

// scriptedServer answers each request as act says, given the connection's number (from 1), the
// request's number on it (from 1) and its body: "ok" answers; "close" closes the connection
// (a FIN: the client reads an end of stream); "reset" closes it with an RST (SO_LINGER 0: the
// client reads ECONNRESET); "partial" sends a status line, then closes. It returns
// its URL and the bodies it read, in order, as "conn/request:body".
func scriptedServer(t *testing.T, act func(conn, req int, body string) string) (url string, seen func() []string) {
	t.Helper()
	var mu sync.Mutex
	var log []string
	conns := 0
	url = rawServer(t, func(c net.Conn) {
		mu.Lock()
		conns++
		cn := conns
		mu.Unlock()
		br := bufio.NewReader(c)
		for rn := 1; ; rn++ {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			b, _ := io.ReadAll(req.Body)
			mu.Lock()
			log = append(log, fmt.Sprintf("%d/%d:%s", cn, rn, b))
			mu.Unlock()
			switch act(cn, rn, string(b)) {
			case "ok":
				_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
			case "reset":
				_ = c.(*net.TCPConn).SetLinger(0)
				return
			case "partial":
				_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\n")
				return
			default: // "close"
				return
			}
		}
	})
	return url, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(log)
	}
}

// TestIdleCloseRace: the server closes a kept-alive connection for idleness just as a request
// arrives on it (the pooled connection was peeked at and found open, then the server closed it
// without an answer). A request on a connection idle for at least ResendAfterIdle goes once
// more on a new connection, if its body can be sent again and no byte of an answer came; on one
// used a moment ago, it does not (a query of death).
func TestIdleCloseRace(t *testing.T) {
	// Every connection answers its first request and drops the second.
	dropSecond := func(how string) func(int, int, string) string {
		return func(_, req int, _ string) string {
			if req == 1 {
				return "ok"
			}
			return how
		}
	}
	for _, tc := range []struct {
		name    string
		act     func(conn, req int, body string) string
		idle    time.Duration // how long the pooled connection looks idle
		body    func(string) io.ReadCloser
		getBody bool
		wantErr bool
		want    []string // what the server read
	}{
		{name: "closed after idle: sent again", act: dropSecond("close"), idle: 2 * time.Second, getBody: true,
			want: []string{"1/1:first", "1/2:second", "2/1:second"}},
		{name: "reset after idle: sent again", act: dropSecond("reset"), idle: 2 * time.Second, getBody: true,
			want: []string{"1/1:first", "1/2:second", "2/1:second"}},
		{name: "a MemBody after idle: sent again whole", act: dropSecond("reset"), idle: 2 * time.Second,
			body: func(s string) io.ReadCloser { return NewMemBody([]byte(s)) },
			want: []string{"1/1:first", "1/2:second", "2/1:second"}},
		{name: "a MemBody in parts after idle: sent again whole", act: dropSecond("reset"), idle: 2 * time.Second,
			body: func(s string) io.ReadCloser { return NewMemBodyParts([]byte(s[:2]), []byte(s[2:])) },
			want: []string{"1/1:first", "1/2:second", "2/1:second"}},
		{name: "no body after idle: sent again", act: dropSecond("close"), idle: 2 * time.Second,
			body: func(string) io.ReadCloser { return nil },
			want: []string{"1/1:", "1/2:", "2/1:"}},
		{name: "once only", idle: 2 * time.Second, getBody: true, wantErr: true,
			act: func(conn, req int, _ string) string {
				if conn == 1 && req == 1 {
					return "ok"
				}
				return "close"
			},
			want: []string{"1/1:first", "1/2:second", "2/1:second"}},
		{name: "used a moment ago: not sent again", act: dropSecond("close"), getBody: true, wantErr: true,
			want: []string{"1/1:first", "1/2:second"}},
		{name: "reset on a connection used a moment ago: not sent again", act: dropSecond("reset"), getBody: true, wantErr: true,
			want: []string{"1/1:first", "1/2:second"}},
		{name: "a body that cannot be sent again", act: dropSecond("close"), idle: 2 * time.Second, wantErr: true,
			want: []string{"1/1:first", "1/2:second"}},
		{name: "a byte of an answer came: not sent again", act: dropSecond("partial"), idle: 2 * time.Second, getBody: true, wantErr: true,
			want: []string{"1/1:first", "1/2:second"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url, seen := scriptedServer(t, tc.act)
			tr := newTransport(t)
			send := func(body string) (*http.Response, error) {
				var rc io.ReadCloser = io.NopCloser(strings.NewReader(body))
				if tc.body != nil {
					rc = tc.body(body)
				}
				req, err := http.NewRequest(http.MethodPost, url, nil)
				if err != nil {
					t.Fatal(err)
				}
				if rc != nil {
					req.Body, req.ContentLength = rc, int64(len(body))
				}
				if tc.getBody {
					req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader(body)), nil }
				}
				return tr.RoundTrip(req)
			}
			resp, err := send("first")
			if err != nil {
				t.Fatal(err)
			}
			readAll(t, resp)
			tr.backdate(tc.idle)
			resp, err = send("second")
			switch {
			case err == nil && tc.wantErr:
				resp.Body.Close()
				t.Error("the dropped request got an answer")
			case err == nil:
				if got := readAll(t, resp); got != "ok" {
					t.Errorf("answer %q, want ok", got)
				}
			case !tc.wantErr:
				t.Errorf("err %v, want an answer", err)
			case !errors.Is(err, io.ErrUnexpectedEOF):
				t.Errorf("err %v, want unexpected EOF", err)
			}
			if diff := cmp.Diff(tc.want, seen()); diff != "" {
				t.Errorf("requests the server read (-want +got):\n%s", diff)
			}
		})
	}
}

// TestIdleCloseRaceEngineGone: when the engine closed the idle connection because it is going
// away (its listener closed too), the second attempt's dial fails, and that is the error: the
// caller (the proxy) takes it as a connection refused and goes on to another endpoint.
func TestIdleCloseRaceEngineGone(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var reads atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		br := bufio.NewReader(c)
		for i := 1; ; i++ {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			_, _ = io.Copy(io.Discard, req.Body)
			reads.Add(1)
			if i == 2 {
				ln.Close() // going away: nothing more is accepted
				return
			}
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	url := "http://" + ln.Addr().String()
	tr := newTransport(t)
	mustPost(t, tr, url)
	tr.backdate(2 * time.Second)
	resp, err := post(t, tr, url, "{}")
	if err == nil {
		resp.Body.Close()
		t.Fatal("a request to an engine that went away got an answer")
	}
	var oe *net.OpError
	if !errors.As(err, &oe) || oe.Op != "dial" {
		t.Errorf("err %v, want the second attempt's dial error", err)
	}
	if n := reads.Load(); n != 2 {
		t.Errorf("the engine read %d requests, want 2", n)
	}
}

// TestAgainstIdleTimeout: this Transport against this Server whose idle timeout is 20 ms, with
// requests sent 15 to 25 ms apart on one connection, so that many arrive as the server's
// janitor finds the connection past its time. None may fail: the server leaves a connection
// on which a request waits, and what still meets the close (the few microseconds between the
// server's check and its close, or a request written just after) is sent again by the
// Transport, whose ResendAfterIdle is set under the server's timeout.
func TestAgainstIdleTimeout(t *testing.T) {
	s := &Server{ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 20 * time.Millisecond}
	addr := startServer(t, s, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = io.WriteString(w, "ok")
	}))
	tr := newTransport(t)
	tr.ResendAfterIdle = 10 * time.Millisecond
	rng := rand.New(rand.NewPCG(1, 2))
	const n = 200
	failed := 0
	for i := range n {
		time.Sleep(15*time.Millisecond + time.Duration(rng.Int64N(int64(10*time.Millisecond)))) // the client's pace
		resp, err := post(t, tr, "http://"+addr, "{}")
		if err != nil {
			failed++
			t.Logf("request %d: %v", i, err)
			continue
		}
		if got := readAll(t, resp); got != "ok" {
			t.Errorf("request %d: %q", i, got)
		}
	}
	if failed > 0 {
		t.Errorf("%d of %d requests failed", failed, n)
	}
}
