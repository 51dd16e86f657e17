package h1

import (
	"bufio"
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/testcert"
)

// The tests of this file: a connection whose client has sent part of a request's head (read by
// the server already: no byte waits in the socket) is not closed as one that waits for a
// request, neither to make room at MaxConns nor by Shutdown; its head is bounded by the header
// timeout instead, so that a client that trickles one holds its connection no longer.

const (
	headStart = "POST /v1 HTTP/1.1\r\nHost: x\r\n"
	headRest  = "Content-Length: 2\r\n\r\n{}"
)

// midHeadServer is one of the two servers under test, with the server's socket of a client's
// connection to look at.
type midHeadServer struct {
	name     string
	addr     string
	stats    func() Stats
	shutdown func(context.Context) error
	// sock returns the socket (under TLS) of the connection from the client address remote;
	// nil: none.
	sock func(remote string) net.Conn
	// begun reports whether the server has taken in that a head began on the connection from
	// remote, waiting for a request, once it has read the head's bytes: the instant between
	// the read and that is left to a race with the client, which the tests must not run.
	begun func(remote string) bool
	// idle reports whether the connection from remote is kept alive, waiting for a request.
	idle func(remote string) bool
	// handshook reports whether the server has noted the end of the TLS handshake of the
	// connection from remote (what its client sends beyond counts as a request on its way).
	handshook func(remote string) bool
}

// midHeadServers serves "ok" with Server and with NetHTTP on loopback (over TLS with cfg, if
// set), both with maxConns and the header timeout header.
func midHeadServers(t *testing.T, maxConns int, header time.Duration, cfg *tls.Config) []midHeadServer {
	t.Helper()
	return midHeadServersUnder(t, maxConns, header, cfg, nil)
}

// midHeadServersUnder is midHeadServers with the TCP listeners wrapped by under (nil: none),
// below TLS.
func midHeadServersUnder(t *testing.T, maxConns int, header time.Duration, cfg *tls.Config,
	under func(net.Listener) net.Listener) []midHeadServer {
	t.Helper()
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = io.WriteString(w, "ok")
	})
	listen := func() net.Listener {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		if under != nil {
			ln = under(ln)
		}
		if cfg != nil {
			ln = tls.NewListener(ln, cfg)
		}
		return ln
	}
	s := &Server{MaxConns: maxConns, ReadHeaderTimeout: header, IdleTimeout: 30 * time.Second, ErrorBody: jsonError}
	n := &NetHTTP{Server: &http.Server{ReadHeaderTimeout: header, IdleTimeout: 30 * time.Second}, MaxConns: maxConns,
		ErrorBody: jsonError}
	return []midHeadServer{
		{name: "h1", addr: serveOn(t, s, h, listen()), stats: s.Stats, shutdown: s.Shutdown,
			sock: func(remote string) net.Conn {
				if c := s.connOf(remote); c != nil {
					return underConn(c.rwc)
				}
				return nil
			},
			begun: func(remote string) bool {
				c := s.connOf(remote)
				return c != nil && c.state.Load() == stateHead
			},
			idle: func(remote string) bool {
				c := s.connOf(remote)
				return c != nil && c.state.Load() == stateIdle
			},
			handshook: func(remote string) bool {
				c := s.connOf(remote)
				return c != nil && c.heardFrom.Load() >= 0
			}},
		{name: "net/http", addr: serveNetHTTPOn(t, n, h, listen()), stats: n.Stats, shutdown: n.Shutdown,
			sock: func(remote string) net.Conn {
				if c := n.connOf(remote); c != nil {
					return underConn(c)
				}
				return nil
			},
			begun: func(remote string) bool {
				if st := n.stateOf(remote); st != http.StateNew && st != http.StateIdle {
					return false
				}
				if c, ok := n.connOf(remote).(*framedConn); ok {
					return c.heads.Load() > c.served.Load()
				}
				return true // TLS: the kernel's count tells (heard)
			},
			idle: func(remote string) bool { return n.stateOf(remote) == http.StateIdle },
			handshook: func(remote string) bool {
				x := n.table.lookup(n.connOf(remote))
				return x != nil && x.from.Load() >= 0
			}},
	}
}

// connOf finds the connection from remote (tests only).
func (s *NetHTTP) connOf(remote string) net.Conn {
	s.once.Do(s.install) // as Serve does: its table is made there
	s.table.mu.Lock()
	defer s.table.mu.Unlock()
	for c := range s.table.conns {
		if c.RemoteAddr().String() == remote {
			return c
		}
	}
	return nil
}

// stateOf is the state of the connection from remote as the table has it (tests only);
// StateClosed when none.
func (s *NetHTTP) stateOf(remote string) http.ConnState {
	c := s.connOf(remote)
	s.table.mu.Lock()
	defer s.table.mu.Unlock()
	if x := s.table.conns[c]; x != nil {
		return x.state
	}
	return http.StateClosed
}

// countingConn counts the bytes written through it: a TLS client's, records included.
type countingConn struct {
	net.Conn
	written atomic.Int64
}

func (c *countingConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.written.Add(int64(n))
	return n, err
}

// midHeadClient is a client's connection, plain or TLS, with the bytes it wrote on the wire.
type midHeadClient struct {
	*client
	raw *countingConn
}

func dialMidHead(t *testing.T, addr string, tlsOn bool) *midHeadClient {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
	raw := &countingConn{Conn: nc}
	var c net.Conn = raw
	if tlsOn {
		tc := tls.Client(raw, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"http/1.1"}})
		if err := tc.Handshake(); err != nil {
			t.Fatalf("handshake: %v", err)
		}
		c = tc
	}
	return &midHeadClient{client: &client{t: t, nc: c, br: bufio.NewReader(c)}, raw: raw}
}

// handshookBy waits until srv has noted the end of c's TLS handshake. A client's first bytes
// read along with its handshake's last are taken for the handshake's (heard): the tests that
// need a head known to be arriving send it after this.
func (c *midHeadClient) handshookBy(srv midHeadServer) {
	c.t.Helper()
	eventually(c.t, "the handshake's end noted by the server", func() bool { return srv.handshook(c.remote()) })
}

// readBy waits until srv has read every byte c has sent (the kernel counts them received, and
// none waits in the socket), the start of a head, and has taken it in.
func (c *midHeadClient) readBy(srv midHeadServer) {
	c.t.Helper()
	remote := c.raw.LocalAddr().String()
	eventually(c.t, "the client's bytes read by the server", func() bool {
		sc := srv.sock(remote)
		if sc == nil {
			return false
		}
		n, ok := received(sc)
		if !ok {
			c.t.Skip("the kernel does not count a socket's bytes received (TCP_INFO): Linux only")
		}
		return n == uint64(c.raw.written.Load()) && !pending(sc) && srv.begun(remote)
	})
}

// TestMidHeadNotEvicted: at MaxConns, a connection whose client has sent part of a request's
// head, which the server has read, is not closed for a newcomer (refused with a 503 instead):
// a new connection older than freshGrace (over TLS too: the server decrypts the head, or with
// Go's server its handshake counts) and a kept-alive one. Its request, completed then, is
// served. Both servers closed such a connection, as they do one that sent nothing (they
// looked for bytes waiting in the socket only): its request met EOF.
func TestMidHeadNotEvicted(t *testing.T) {
	const header = 4 * time.Second // freshGrace: 1 s
	certFile, keyFile := testcert.NewCA(t, "midhead").Issue("server")
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		tls   bool
		first bool // the head is the connection's first request's
	}{{"new", false, true}, {"idle", false, false}, {"new-tls", true, true}, {"idle-tls", true, false}} {
		var cfg *tls.Config
		if tc.tls {
			cfg = &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"http/1.1"}}
		}
		for _, srv := range midHeadServers(t, 1, header, cfg) {
			t.Run(tc.name+"/"+srv.name, func(t *testing.T) {
				t.Parallel()
				c := dialMidHead(t, srv.addr, tc.tls)
				dialled := time.Now()
				if !tc.first {
					if st := c.get("/"); st != http.StatusOK {
						t.Fatalf("the first request: status %d", st)
					}
				} else if tc.tls {
					c.handshookBy(srv)
				}
				c.send(headStart)
				c.readBy(srv)
				if tc.first {
					// The age is the point: the connection is old enough to give way if it waited.
					for time.Since(dialled) <= freshGrace(header)+50*time.Millisecond {
						time.Sleep(10 * time.Millisecond)
					}
				}
				newcomer := dialMidHead(t, srv.addr, tc.tls)
				if st := newcomer.get("/"); st != http.StatusServiceUnavailable {
					t.Errorf("the newcomer at the cap: status %d, want 503 (the connection whose head is arriving kept)", st)
				}
				c.send(headRest)
				if st, _, body := c.answer(); st != http.StatusOK || body != "ok" {
					t.Errorf("the request whose head was arriving: %d %q, want 200 ok", st, body)
				}
				if st := srv.stats(); st.ConnsEvicted != 0 || st.ConnsRefused != 1 {
					t.Errorf("%d evicted, %d refused; want 0 and 1", st.ConnsEvicted, st.ConnsRefused)
				}
			})
		}
	}
}

// TestShutdownLeavesMidHead: Shutdown closes the connections that wait for a request (a new one
// silent for 5 s, a kept-alive one idleGrace after its answer) but not one whose request's head
// is arriving, read in part: its request, completed after the others' close, is answered
// (Connection: close). Both servers closed a new one with the silent ones, and NetHTTP a
// kept-alive one (Go's server stays idle until it has read a whole head): EOF; over TLS NetHTTP
// still did (the head's bytes decrypted, none waited in the socket).
func TestShutdownLeavesMidHead(t *testing.T) {
	const header = 10 * time.Second
	certFile, keyFile := testcert.NewCA(t, "midhead").Issue("server")
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		tls   bool
		first bool
	}{{"new", false, true}, {"idle", false, false}, {"new-tls", true, true}, {"idle-tls", true, false}} {
		var cfg *tls.Config
		if tc.tls {
			cfg = &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"http/1.1"}}
		}
		for _, srv := range midHeadServers(t, 0, header, cfg) {
			t.Run(tc.name+"/"+srv.name, func(t *testing.T) {
				t.Parallel()
				arriving, silent := dialMidHead(t, srv.addr, tc.tls), dialMidHead(t, srv.addr, tc.tls)
				dialled := time.Now()
				if !tc.first {
					for _, c := range []*midHeadClient{arriving, silent} {
						if st := c.get("/"); st != http.StatusOK {
							t.Fatalf("the first request: status %d", st)
						}
					}
				} else if tc.tls {
					arriving.handshookBy(srv)
				}
				arriving.send(headStart)
				arriving.readBy(srv)
				if tc.first {
					// The age is the point: a new connection is closed at shutdown once 5 s old.
					for time.Since(dialled) <= 5*time.Second+50*time.Millisecond {
						time.Sleep(10 * time.Millisecond)
					}
				}
				done := make(chan error, 1)
				go func() {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					defer cancel()
					done <- srv.shutdown(ctx)
				}()
				// The silent connection closed: the round that would take the other has run.
				if !silent.closed() {
					t.Fatal("the silent connection is still open")
				}
				arriving.send(headRest)
				st, closing, body, err := readResponse(arriving.br)
				if err != nil || st != http.StatusOK || body != "ok" || !closing {
					t.Errorf("the request whose head was arriving at the shutdown: %d %q closing %v, %v; want 200 ok, Connection: close",
						st, body, closing, err)
				}
				if err := <-done; err != nil {
					t.Errorf("Shutdown: %v", err)
				}
			})
		}
	}
}

// TestSlowHeadBounded: a client that trickles a head, so that MaxConns leaves its connection
// (a newcomer is refused), holds it for the header timeout, no longer: a new connection's
// (closed by either server then, counted from the accept), and a kept-alive connection's that
// sent two bytes of its next head and stopped (Server times the head from its first byte;
// Go's server from a head's fourth byte only, its idle timeout applying before, so NetHTTP
// lets a newcomer take the connection once the head has been known to be arriving for the
// header timeout). The newcomers are then served.
func TestSlowHeadBounded(t *testing.T) {
	const header = time.Second // freshGrace: 250 ms
	for _, tc := range []struct {
		name  string
		first bool
	}{{"new", true}, {"idle", false}} {
		for _, srv := range midHeadServers(t, 1, header, nil) {
			t.Run(tc.name+"/"+srv.name, func(t *testing.T) {
				t.Parallel()
				slow := dialMidHead(t, srv.addr, false)
				start := time.Now()
				stop := make(chan struct{})
				var trickling sync.WaitGroup
				if tc.first {
					slow.send("P")
					trickling.Add(1)
					go func() { // a byte every 50 ms, the request line never ending
						defer trickling.Done()
						tick := time.NewTicker(50 * time.Millisecond)
						defer tick.Stop()
						for {
							select {
							case <-stop:
								return
							case <-tick.C:
							}
							if _, err := io.WriteString(slow.nc, "x"); err != nil {
								return
							}
						}
					}()
				} else {
					if st := slow.get("/"); st != http.StatusOK {
						t.Fatalf("the first request: status %d", st)
					}
					start = time.Now()
					slow.send("GE")
					slow.readBy(srv)
				}
				defer func() { close(stop); trickling.Wait() }()
				for time.Since(start) <= freshGrace(header)+50*time.Millisecond {
					time.Sleep(10 * time.Millisecond)
				}
				if st := dialClient(t, srv.addr).get("/"); st != http.StatusServiceUnavailable {
					t.Errorf("a newcomer %v after the slow head began: status %d, want 503", time.Since(start), st)
				}
				// Newcomers every 100 ms until one is served, for 3 s at most.
				var served time.Duration
				for range 30 {
					if st := dialClient(t, srv.addr).get("/"); st == http.StatusOK {
						served = time.Since(start)
						break
					}
					time.Sleep(100 * time.Millisecond)
				}
				t.Logf("a newcomer served %v after the slow head began", served)
				if served == 0 {
					t.Fatalf("no newcomer served within 3 s of a slow head, with a %v header timeout", header)
				}
				if served < header {
					t.Errorf("a newcomer served %v after the slow head began, before the header timeout (%v)", served, header)
				}
				// Go's server answers 400 as it closes a new one.
				if _, err := io.Copy(io.Discard, slow.br); err != nil && !isReset(err) {
					t.Errorf("the slow connection: %v, want it closed", err)
				}
			})
		}
	}
}

// TestFramerCountsHeadsBegun: the framer counts a head from its first byte (what arriving
// compares with the requests served), not a body's bytes nor a chunked body's trailer, however
// the stream is cut into reads.
func TestFramerCountsHeadsBegun(t *testing.T) {
	for _, tc := range []struct {
		name   string
		stream string
		begun  int64
		inHead bool
	}{
		{"nothing", "", 0, false},
		{"a head begun", "PO", 1, true},
		{"a head ended, no body", "GET / HTTP/1.1\r\nHost: x\r\n\r\n", 1, false},
		{"a body in progress", "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nab", 1, false},
		{"a body, then the next head", "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}G", 2, true},
		{"chunks and a trailer", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\nX-T: 1\r\n", 1, false},
		{"chunks, then the next head", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\nGET", 2, true},
		{"pipelined", "GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\nGET /c HTTP/1.1\r\n", 3, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, step := range []int{1, 3, len(tc.stream) + 1} {
				var f framer
				f.head.reset(false)
				for p := tc.stream; len(p) > 0; {
					n := min(step, len(p))
					f.feed([]byte(p[:n]))
					p = p[n:]
				}
				if f.begun != tc.begun || f.inHead != tc.inHead {
					t.Errorf("read %d bytes at a time: %d begun, in a head %v; want %d, %v", step, f.begun, f.inHead, tc.begun, tc.inHead)
				}
			}
		})
	}
}

// TestReceived: the kernel's count of a connection's bytes received takes in those waiting in
// the socket and those read, and nothing else (heard's answer for a connection whose client
// has sent nothing is no).
func TestReceived(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	sc, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	n, ok := received(sc)
	if !ok {
		t.Skip("the kernel does not count a socket's bytes received (TCP_INFO): Linux only")
	}
	if n != 0 || heard(sc, 0) {
		t.Fatalf("before the client sent anything: %d received, heard %v; want 0, false", n, heard(sc, 0))
	}
	if _, err := io.WriteString(cc, "hello"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the bytes received", func() bool { n, _ = received(sc); return n == 5 })
	if !pending(sc) {
		t.Error("the bytes received do not wait in the socket")
	}
	if _, err := io.ReadFull(sc, make([]byte, 5)); err != nil {
		t.Fatal(err)
	}
	if n, _ = received(sc); n != 5 || pending(sc) || !heard(sc, 0) {
		t.Errorf("once read: %d received, pending %v, heard %v; want 5, false, true", n, pending(sc), heard(sc, 0))
	}
}

// TestArrivingHidesNoOther: at MaxConns, a connection whose request is arriving does not keep
// a newcomer from the room another one can give, though it is the oldest and only the oldest
// are looked at (evictBatch: one at a cap of 2). A kept-alive one whose head is arriving is
// no candidate; a new TLS one whose head is arriving, read by the server (with NetHTTP, a
// system call tells: the bytes are Go's to decrypt), is found so once, then left out: a
// newcomer may be refused that once.
func TestArrivingHidesNoOther(t *testing.T) {
	const header = 4 * time.Second // freshGrace: 1 s
	certFile, keyFile := testcert.NewCA(t, "midhead").Issue("server")
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, tlsOn := range []bool{false, true} {
		var cfg *tls.Config
		name := "idle"
		if tlsOn {
			cfg = &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"http/1.1"}}
			name = "new-tls"
		}
		for _, srv := range midHeadServers(t, 2, header, cfg) {
			t.Run(name+"/"+srv.name, func(t *testing.T) {
				t.Parallel()
				arriving := dialMidHead(t, srv.addr, tlsOn)
				dialled := time.Now()
				if !tlsOn {
					if st := arriving.get("/"); st != http.StatusOK {
						t.Fatalf("the first request: status %d", st)
					}
				} else {
					arriving.handshookBy(srv)
				}
				arriving.send(headStart)
				arriving.readBy(srv)
				eventually(t, "the first connection counted", func() bool { return srv.stats().Conns == 1 })
				var other *client
				if tlsOn {
					other = dialClient(t, srv.addr) // no handshake: it has sent nothing
					dialled = time.Now()
				} else {
					other = dialMidHead(t, srv.addr, false).client
					if st := other.get("/"); st != http.StatusOK {
						t.Fatalf("the other's first request: status %d", st)
					}
					eventually(t, "the other connection idle", func() bool { return srv.idle(other.remote()) })
				}
				eventually(t, "both connections counted", func() bool { return srv.stats().Conns == 2 })
				// The age is the point: new connections give way once older than freshGrace.
				for tlsOn && time.Since(dialled) <= freshGrace(header)+50*time.Millisecond {
					time.Sleep(10 * time.Millisecond)
				}
				var statuses []int
				for range 2 {
					st := dialMidHead(t, srv.addr, tlsOn).get("/")
					if statuses = append(statuses, st); st == http.StatusOK {
						break
					}
				}
				if statuses[len(statuses)-1] != http.StatusOK || !tlsOn && len(statuses) > 1 {
					t.Errorf("the newcomers: statuses %v, want one served (at once if nothing needs a system call)", statuses)
				}
				if !other.closed() {
					t.Error("the connection that waited is still open")
				}
				arriving.send(headRest)
				if st, _, body := arriving.answer(); st != http.StatusOK || body != "ok" {
					t.Errorf("the request arriving: %d %q, want 200 ok", st, body)
				}
			})
		}
	}
}
