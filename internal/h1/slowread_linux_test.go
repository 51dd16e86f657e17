//go:build linux && !386

package h1

import (
	"bufio"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
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
	for _, tc := range stallServers {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ln := tc.listen(t, cert)
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
	if _, ok := sendIdle(a, new(sendProgress)); ok {
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
		if d, ok := sendIdle(c.nc, new(sendProgress)); !ok || d != 0 {
			t.Fatalf("%s: all written taken: idle %v, %v; want 0, true", c.name, d, ok)
		}
	}
	var pr sendProgress // the connection's from here on
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
		d, ok := sendIdle(sc, &pr)
		return ok && d >= 200*time.Millisecond
	})
	// The client reads: its window opens, and the kernel sends it more of what it holds.
	if _, err := io.ReadFull(client, make([]byte, 512<<10)); err != nil {
		t.Fatal(err)
	}
	if d, ok := sendIdle(sc, &pr); !ok || d >= 200*time.Millisecond {
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

// TestWriteStallKernelWithoutTimes: where the kernel leaves TCP_INFO's time fields 0 (gVisor's
// netstack fills few of them), a client that stops reading is still cut, by either server,
// over plain TCP and TLS: its acknowledged bytes stop growing. It was never cut: the idle time
// came from the time fields alone, and 0 read as a client taking bytes this instant.
func TestWriteStallKernelWithoutTimes(t *testing.T) {
	const stall = 300 * time.Millisecond
	prev := readSendState
	readSendState = func(nc net.Conn) (sendState, bool) {
		st, ok := kernelSendState(nc)
		st.sentMs, st.ackMs = 0, 0
		return st, ok
	}
	t.Cleanup(func() { readSendState = prev })
	certFile, keyFile := testcert.NewCA(t, "notimes").Issue("server")
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range stallServers {
		t.Run(tc.name, func(t *testing.T) {
			ln := tc.listen(t, cert)
			written := make(chan error, 1)
			stop := make(chan struct{})
			defer close(stop)
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				chunk := make([]byte, 1<<20)
				for i := 0; ; i++ {
					select {
					case <-stop:
						written <- nil
						return
					default:
					}
					if i == 256 {
						written <- nil // 256 MiB taken by a client that reads nothing
						return
					}
					if _, err := w.Write(chunk); err != nil {
						written <- err
						return
					}
				}
			})
			addr := tc.serve(t, h, ln, stall, 0)
			c := dialSmallWindow(t, addr, 64<<10)
			_ = c.SetDeadline(time.Now().Add(20 * time.Second))
			if tc.tls {
				c = tls.Client(c, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"http/1.1"}})
			}
			if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
				t.Fatal(err)
			}
			// The client reads nothing from here on. The bound, twice (the first look has
			// no acknowledged bytes to compare with), and the janitor's rounds.
			select {
			case err := <-written:
				if err == nil {
					t.Fatal("the handler wrote 256 MiB to a client that reads nothing")
				}
			case <-time.After(5 * time.Second):
				t.Fatal("a client that stopped reading was not cut within 5 s of a 300 ms stall bound")
			}
		})
	}
}

// TestStallJudgedOffLock: the janitor asks the kernel about a stalled write (two system calls)
// without the server's lock, which the accept loop needs. It asked under it.
func TestStallJudgedOffLock(t *testing.T) {
	s := &Server{WriteStallTimeout: 200 * time.Millisecond}
	var asked, underLock atomic.Int32
	prev := readSendState
	readSendState = func(nc net.Conn) (sendState, bool) {
		asked.Add(1)
		// A caller holding the lock holds it throughout this call; another goroutine (the
		// accept loop, a request ending) lets go of it within moments.
		free := false
		for range 100 {
			if free = s.mu.TryLock(); free {
				s.mu.Unlock()
				break
			}
			time.Sleep(100 * time.Microsecond)
		}
		if !free {
			underLock.Add(1)
		}
		return kernelSendState(nc)
	}
	t.Cleanup(func() { readSendState = prev })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	written := make(chan error, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		chunk := make([]byte, 1<<20)
		for range 256 {
			if _, err := w.Write(chunk); err != nil {
				written <- err
				return
			}
		}
		written <- nil
	})
	addr := serveOn(t, s, h, ln)
	c := dialSmallWindow(t, addr, 64<<10)
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-written:
		if err == nil {
			t.Fatal("the handler wrote 256 MiB to a client that reads nothing")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a client that stopped reading was not cut within 5 s of a 200 ms stall bound")
	}
	if asked.Load() == 0 || underLock.Load() != 0 {
		t.Errorf("the kernel was asked %d times, %d of them under the server's lock; want some, none under it",
			asked.Load(), underLock.Load())
	}
}

// stallServer is a server the write-stall tests run against: either of this package's, over
// plain TCP or TLS.
type stallServer struct {
	name  string
	tls   bool
	serve func(t *testing.T, h http.Handler, ln net.Listener, stall, whole time.Duration) string
}

var stallServers = []stallServer{
	{name: "h1", serve: serveH1},
	{name: "h1/TLS", tls: true, serve: serveH1},
	{name: "net/http", serve: serveNet},
	// Under TLS, net/http's stalls are seen below crypto/tls's connection: AbortStalled's.
	{name: "net/http/TLS", tls: true, serve: serveNet},
}

// listen returns a loopback listener for the server, under TLS on AbortStalled with cert
// where it is a TLS one.
func (s stallServer) listen(t *testing.T, cert tls.Certificate) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if s.tls {
		ln = tls.NewListener(AbortStalled(ln), &tls.Config{Certificates: []tls.Certificate{cert},
			NextProtos: []string{"http/1.1"}})
	}
	return ln
}
