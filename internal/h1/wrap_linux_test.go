//go:build linux && (amd64 || arm64)

package h1

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"syscall"
	"testing"
)

// keepAlive reads SO_KEEPALIVE from c's socket.
func keepAlive(t *testing.T, c net.Conn) int {
	t.Helper()
	sc, ok := c.(syscall.Conn)
	if !ok {
		t.Fatalf("%T has no SyscallConn", c)
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	v, gerr := -1, error(nil)
	if err := rc.Control(func(fd uintptr) {
		v, gerr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_KEEPALIVE)
	}); err != nil || gerr != nil {
		t.Fatal(err, gerr)
	}
	return v
}

// A listener's accepted connections and a dialed one are wrapped, keep the keep-alive that
// Listen and Dial set before, carry bytes both ways, and half-close; a connection that is not
// TCP is returned as it is; the listener's Close ends Accept.
func TestWrapListenerAndConn(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := WrapListener(inner)
	if ln.Addr() != inner.Addr() {
		t.Errorf("Addr %v, want %v", ln.Addr(), inner.Addr())
	}
	nc, srv := dialAccept(t, ln)
	dialed := WrapConn(nc)
	defer dialed.Close()
	defer srv.Close()
	for name, c := range map[string]net.Conn{"accepted": srv, "dialed": dialed} {
		if _, ok := c.(*rawConn); !ok {
			t.Errorf("%s connection is a %T, want *rawConn", name, c)
		}
		if v := keepAlive(t, c); v != 1 {
			t.Errorf("%s connection: SO_KEEPALIVE %d, want 1 (set by Listen/Dial before wrapping)", name, v)
		}
	}
	if _, err := dialed.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	if err := dialed.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(srv)
	if err != nil || string(got) != "ping" {
		t.Errorf("server read %q, %v; want \"ping\" then EOF", got, err)
	}
	if _, err := srv.Write([]byte("pong")); err != nil {
		t.Fatal(err)
	}
	srv.Close()
	got, err = io.ReadAll(dialed)
	if err != nil || string(got) != "pong" {
		t.Errorf("client read %q, %v; want \"pong\" then EOF", got, err)
	}

	a, b := net.Pipe()
	defer b.Close()
	if w := WrapConn(a); w != a {
		t.Errorf("WrapConn(net.Pipe end) = %T, want it unchanged", w)
	}
	a.Close()

	ln.Close()
	if _, err := ln.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Accept after Close: %v, want net.ErrClosed", err)
	}
}

// net/http over wrapped connections, cleartext and TLS (tls.NewListener over WrapListener, a
// transport whose DialContext wraps): a chunked response flushed line by line streams to the
// client, which reads each line before the server writes the next, and the connection is kept
// alive and reused; on both sides the TCP connection under it is a raw one.
func TestWrapNetHTTP(t *testing.T) {
	for _, useTLS := range []bool{false, true} {
		t.Run(fmt.Sprintf("tls=%v", useTLS), func(t *testing.T) {
			const lines = 5
			ack := make(chan struct{})
			rawServer := make(chan bool, 4)
			s := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				for i := range lines {
					fmt.Fprintf(w, "line %d\n", i)
					w.(http.Flusher).Flush()
					select {
					case <-ack:
					case <-r.Context().Done():
						return
					}
				}
			}))
			s.Listener = WrapListener(s.Listener)
			s.Config.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
				if tc, ok := c.(*tls.Conn); ok {
					c = tc.NetConn()
				}
				_, ok := c.(*rawConn)
				rawServer <- ok
				return ctx
			}
			if useTLS {
				s.StartTLS()
			} else {
				s.Start()
			}
			defer s.Close()
			tr := s.Client().Transport.(*http.Transport).Clone()
			defer tr.CloseIdleConnections()
			var d net.Dialer
			tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
				c, err := d.DialContext(ctx, network, addr)
				if err != nil {
					return nil, err
				}
				return WrapConn(c), nil
			}
			client := &http.Client{Transport: tr}
			for round := range 2 {
				var info httptrace.GotConnInfo
				ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
					GotConn: func(i httptrace.GotConnInfo) { info = i },
				})
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.URL, nil)
				resp, err := client.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				if len(resp.TransferEncoding) == 0 || resp.TransferEncoding[0] != "chunked" {
					t.Errorf("round %d: transfer encoding %v, want chunked", round, resp.TransferEncoding)
				}
				br := bufio.NewReader(resp.Body)
				for i := range lines {
					line, err := br.ReadString('\n')
					if want := fmt.Sprintf("line %d\n", i); line != want || err != nil {
						t.Fatalf("round %d: read %q, %v; want %q", round, line, err, want)
					}
					ack <- struct{}{}
				}
				if rest, err := io.ReadAll(br); len(rest) != 0 || err != nil {
					t.Errorf("round %d: after the lines %q, %v", round, rest, err)
				}
				resp.Body.Close()
				c := info.Conn
				if tc, ok := c.(*tls.Conn); ok {
					c = tc.NetConn()
				}
				if _, ok := c.(*rawConn); !ok {
					t.Errorf("round %d: client connection is a %T, want *rawConn", round, c)
				}
				if info.Reused != (round == 1) {
					t.Errorf("round %d: connection reused %v", round, info.Reused)
				}
			}
			close(rawServer)
			n := 0
			for ok := range rawServer {
				n++
				if !ok {
					t.Error("server connection not raw")
				}
			}
			if n != 1 {
				t.Errorf("%d server connections, want 1 (kept alive)", n)
			}
		})
	}
}
