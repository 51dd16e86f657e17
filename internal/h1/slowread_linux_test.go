//go:build linux && (amd64 || arm64)

package h1

import (
	"bufio"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/testcert"
)

// TestSlowReaderServed: a client that reads its answer slowly but steadily (64 KiB every
// 100 ms, far less than a third of the server's send buffer per stall bound) is served whole,
// by either server, over plain TCP and TLS, with a stall bound of 300 ms. Both servers cut it:
// the bound timed one write, and Linux wakes a write blocked on a full send buffer only once
// about a third of the buffer has drained, so a client taking less than that per bound looked
// stalled. (TestWriteStall and TestStalledCloseAbortive have the client that stops reading,
// still cut within the bound.)
func TestSlowReaderServed(t *testing.T) {
	const (
		stall = 300 * time.Millisecond
		size  = 8 << 20 // more than the server's send buffer (4 MiB at most) and the client's hold
		step  = 64 << 10
		every = 100 * time.Millisecond
		slow  = 15 // slow reads (1.5 s, some 1 MiB) before the client reads the rest at once
	)
	certFile, keyFile := testcert.NewCA(t, "slowread").Issue("server")
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	h := func(written chan<- error) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", strconv.Itoa(size))
			chunk := make([]byte, 1<<20)
			for range size / len(chunk) {
				if _, err := w.Write(chunk); err != nil {
					written <- err
					return
				}
			}
			written <- nil
		})
	}
	for _, tc := range []struct {
		name  string
		tls   bool
		serve func(t *testing.T, h http.Handler, ln net.Listener, stall, whole time.Duration) string
	}{
		{name: "h1", serve: serveH1},
		{name: "h1/TLS", tls: true, serve: serveH1},
		{name: "net/http", serve: serveNet},
		// Under TLS, net/http's stalls are seen below crypto/tls's connection: AbortStalled's.
		{name: "net/http/TLS", tls: true, serve: serveNet},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			if tc.tls {
				ln = tls.NewListener(AbortStalled(ln), &tls.Config{Certificates: []tls.Certificate{cert},
					NextProtos: []string{"http/1.1"}})
			}
			written := make(chan error, 1)
			addr := tc.serve(t, h(written), ln, stall, 0)
			c := dialSmallWindow(t, addr, step)
			_ = c.SetDeadline(time.Now().Add(20 * time.Second))
			if tc.tls {
				c = tls.Client(c, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"http/1.1"}})
			}
			if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
				t.Fatal(err)
			}
			br := bufio.NewReaderSize(c, step)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			buf := make([]byte, step)
			got := 0
			tick := time.NewTicker(every)
			defer tick.Stop()
			for i := 0; i < slow && err == nil; i++ {
				<-tick.C
				var n int
				n, err = io.ReadFull(resp.Body, buf)
				got += n
			}
			if err == nil {
				var n int64
				n, err = io.Copy(io.Discard, resp.Body)
				got += int(n)
			}
			if err != nil || got != size {
				t.Errorf("the slow client read %d bytes of %d, then %v; want the whole answer", got, size, err)
			}
			select {
			case err := <-written:
				if err != nil {
					t.Errorf("the handler's write to a client still reading failed: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Errorf("the handler has not returned 10 s after the client read %d bytes", got)
			}
		})
	}
}

// TestSendIdle: the kernel's word on a client's progress. A connection whose kernel holds
// nothing unacknowledged is never idle, however long ago it last sent; one whose client
// stopped reading grows idle while the send buffer stays full; once the client reads, the
// kernel sends it more and it is no longer idle. A connection that is no TCP one cannot tell.
func TestSendIdle(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if _, ok := sendIdle(a); ok {
		t.Error("sendIdle of a pipe: ok; want false")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client := dialSmallWindow(t, ln.Addr().String(), 64<<10)
	sc, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	// More than the client's kernel holds, so that the client's read below takes some of it.
	if err := sc.(*net.TCPConn).SetWriteBuffer(1 << 20); err != nil {
		t.Fatal(err)
	}
	// An answer the client took whole, a while ago: the kernel sent nothing since, but holds
	// nothing either.
	if _, err := sc.Write([]byte("ok")); err != nil {
		t.Fatal(err)
	}
	_ = client.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(client, make([]byte, 2)); err != nil {
		t.Fatal(err)
	}
	<-time.After(250 * time.Millisecond) // the time is the point: nothing sent in it
	for _, c := range []struct {
		name string
		nc   net.Conn
	}{{"net", sc}, {"raw", wrapConn(sc)}} {
		if d, ok := sendIdle(c.nc); !ok || d != 0 {
			t.Fatalf("%s: all written taken: idle %v, %v; want 0, true", c.name, d, ok)
		}
	}
	// Fill the buffers: the client reads nothing.
	chunk := make([]byte, 256<<10)
	for i := 0; ; i++ {
		if i == 1000 {
			t.Fatal("256 MiB written to a client that reads nothing")
		}
		_ = sc.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
		if _, err := sc.Write(chunk); err != nil {
			if !isTimeout(err) {
				t.Fatal(err)
			}
			break
		}
	}
	eventually(t, "idle for 200 ms", func() bool {
		d, ok := sendIdle(sc)
		return ok && d >= 200*time.Millisecond
	})
	// The client reads: its window opens, and the kernel sends it more of what it holds.
	if _, err := io.ReadFull(client, make([]byte, 512<<10)); err != nil {
		t.Fatal(err)
	}
	if d, ok := sendIdle(sc); !ok || d >= 200*time.Millisecond {
		t.Errorf("after the client read 512 KiB: idle %v, %v; want less than 200 ms", d, ok)
	}
}

// dialSmallWindow connects to addr with a receive buffer of rcvbuf bytes, set before the
// connection opens (the window's scale is agreed then): the client's kernel holds little of
// what it does not read. The connection is closed at the end of the test.
func dialSmallWindow(t *testing.T, addr string, rcvbuf int) net.Conn {
	t.Helper()
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		if err := rc.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, rcvbuf)
		}); err != nil {
			return err
		}
		return serr
	}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
