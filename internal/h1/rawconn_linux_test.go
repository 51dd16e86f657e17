//go:build linux && (amd64 || arm64)

package h1

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"syscall"
	"testing"
	"time"
)

// rawPair returns the two ends of a loopback TCP connection, each with raw reads and writes.
func rawPair(t *testing.T) (a, b *rawConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	dialed, other := dialAccept(t, ln)
	a, ok1 := wrapConn(dialed).(*rawConn)
	b, ok2 := wrapConn(other).(*rawConn)
	if !ok1 || !ok2 {
		t.Fatal("wrapConn did not wrap a TCP connection")
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// dialAccept dials ln over TCP and returns the dialed connection and the one ln accepted.
func dialAccept(t *testing.T, ln net.Listener) (dialed, accepted net.Conn) {
	t.Helper()
	ch := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			t.Error(err)
		}
		ch <- c
	}()
	dialed, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if accepted = <-ch; accepted == nil {
		dialed.Close()
		t.FailNow()
	}
	return dialed, accepted
}

// Bytes written through writes and writev of many sizes, larger than the socket takes at once
// (so that writes wait for the reader), arrive whole and in order, and a half-close is read as
// io.EOF.
func TestRawConnCarriesBytes(t *testing.T) {
	a, b := rawPair(t)
	rng := rand.New(rand.NewPCG(1, 2))
	var want bytes.Buffer
	done := make(chan error, 1)
	var parts [][]byte
	for _, n := range []int{1, 7, 4096, 65536, 1 << 20, 3 << 20} {
		p := make([]byte, n)
		for i := range p {
			p[i] = byte(rng.Uint32())
		}
		parts = append(parts, p)
		want.Write(p)
	}
	vecLen := int64(0)
	for _, p := range parts[2:] {
		want.Write(p)
		vecLen += int64(len(p))
	}
	go func() {
		for _, p := range parts {
			if n, err := a.Write(p); n != len(p) || err != nil {
				done <- err
				return
			}
		}
		n, err := a.writeBuffers(parts[2:])
		if err == nil && n != vecLen {
			err = io.ErrShortWrite
		}
		if err == nil {
			err = a.CloseWrite()
		}
		done <- err
	}()
	var got bytes.Buffer
	buf := make([]byte, 100_000) // not a divisor of anything written
	for range 1 << 16 {
		n, err := b.Read(buf)
		got.Write(buf[:n])
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("read: %v", err)
		}
	}
	if err := <-done; err != nil {
		t.Fatalf("write: %v", err)
	}
	if !bytes.Equal(got.Bytes(), want.Bytes()) {
		t.Fatalf("read %d bytes, want the %d written, in order", got.Len(), want.Len())
	}
}

// Deadlines and Close interrupt a read that waits, with the errors net's own reads return:
// a timeout that is os.ErrDeadlineExceeded, and net.ErrClosed.
func TestRawConnDeadlineAndClose(t *testing.T) {
	a, b := rawPair(t)
	_ = b.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	var buf [8]byte
	_, err := b.Read(buf[:])
	var ne net.Error
	if !errors.Is(err, os.ErrDeadlineExceeded) || !errors.As(err, &ne) || !ne.Timeout() {
		t.Errorf("read past its deadline: %v, want a timeout", err)
	}
	var oe *net.OpError
	if !errors.As(err, &oe) || oe.Op != "read" {
		t.Errorf("read past its deadline: %#v, want a *net.OpError of op read", err)
	}
	_ = b.SetReadDeadline(time.Time{})
	// Data that arrives is read after a deadline was cleared.
	if _, err := a.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if n, err := b.Read(buf[:]); n != 1 || err != nil || buf[0] != 'x' {
		t.Errorf("read after the deadline was cleared: %d %q %v", n, buf[:n], err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := b.Read(buf[:])
		errc <- err
	}()
	time.Sleep(10 * time.Millisecond) // let the read wait (it fails the same if it starts later)
	b.Close()
	select {
	case err := <-errc:
		if !errors.Is(err, net.ErrClosed) {
			t.Errorf("read on a connection closed meanwhile: %v, want net.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not interrupt the read")
	}
}

// A reset by the peer is ECONNRESET, as callers test it (errors.Is), and writes to a closed
// peer fail with EPIPE or ECONNRESET, not a signal.
func TestRawConnReset(t *testing.T) {
	a, b := rawPair(t)
	_ = a.tc.SetLinger(0)
	a.Close() // a reset, not a FIN
	var buf [8]byte
	_, err := b.Read(buf[:])
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("read after a reset: %v, want ECONNRESET", err)
	}
	for i := range 10 { // the first write may still be taken by the kernel
		if _, err = b.Write(make([]byte, 1024)); err != nil {
			break
		}
		if i == 9 {
			t.Fatal("writes to a reset connection kept succeeding")
		}
	}
	if !errors.Is(err, syscall.EPIPE) && !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("write after a reset: %v, want EPIPE or ECONNRESET", err)
	}
}

// Reads and writes allocate nothing: the functions the RawConn calls are bound once.
func TestRawConnAllocs(t *testing.T) {
	a, b := rawPair(t)
	msg := []byte("ping")
	buf := make([]byte, 16)
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := a.Write(msg); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(b, buf[:len(msg)]); err != nil {
			t.Fatal(err)
		}
		if _, err := a.writeBuffers([][]byte{msg, msg}); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(b, buf[:2*len(msg)]); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("%.1f allocations per write, read and writev, want 0", allocs)
	}
}

// The server and the transport talk through raw connections (on Linux, where they exist).
func TestConnectionsAreRaw(t *testing.T) {
	s := &Server{}
	kind := make(chan string, 1)
	addr := startServer(t, s, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		kind <- fmt.Sprintf("%T", s.connOf(r.RemoteAddr).rwc)
		_, _ = io.WriteString(w, "ok")
	}))
	tr := New(http.DefaultTransport.(*http.Transport).Clone())
	defer tr.CloseIdleConnections()
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, "http://"+addr+"/", nil)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if k := <-kind; k != "*h1.rawConn" {
		t.Errorf("the server's connection is a %s, want *h1.rawConn", k)
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	for _, cs := range tr.idle {
		for _, c := range cs {
			if _, ok := c.nc.(*rawConn); !ok {
				t.Errorf("the transport's connection is a %T, want *rawConn", c.nc)
			}
		}
	}
	if len(tr.idle) == 0 {
		t.Error("the transport kept no connection")
	}
}

// rcvLowat reads the SO_RCVLOWAT of c's socket.
func rcvLowat(t *testing.T, c net.Conn) int {
	rc, err := c.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	v := -1
	_ = rc.Control(func(fd uintptr) {
		v, err = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVLOWAT)
	})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// A large body that arrives in pieces is read in a few reads, not one per piece: once a read
// has left more than minLowat to come, the socket is not reported readable until the rest is
// there. The threshold never exceeds what is left to come (a read would wait for bytes that
// never come), and is back at the kernel's 1 when the body has been read.
func TestBodyReadWaitsForTheRest(t *testing.T) {
	const size = 400_000
	s := &Server{}
	type result struct {
		reads, maxLowat, after int
		body                   []byte
		err                    error
	}
	results := make(chan result, 1)
	addr := startServer(t, s, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rwc := s.connOf(r.RemoteAddr).rwc
		var res result
		buf := make([]byte, 0, r.ContentLength+1)
		for range 1000 {
			n, err := r.Body.Read(buf[len(buf):cap(buf)])
			buf = buf[:len(buf)+n]
			res.reads++
			if l := rcvLowat(t, rwc); l > res.maxLowat {
				res.maxLowat = l
			}
			if err != nil {
				if err != io.EOF {
					res.err = err
				}
				break
			}
			if rest := int(r.ContentLength) - len(buf); rcvLowat(t, rwc) > max(rest, 1) {
				res.err = fmt.Errorf("SO_RCVLOWAT %d with %d bytes to come", rcvLowat(t, rwc), rest)
				break
			}
		}
		res.after, res.body = rcvLowat(t, rwc), buf
		results <- res
		_, _ = io.WriteString(w, "ok")
	}))
	body := make([]byte, size)
	for i := range body {
		body[i] = byte('a' + i%26)
	}
	c, br := dialBuffered(t, addr)
	fmt.Fprintf(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n", size)
	// The first 100 KB, then the rest in 20 KB pieces a millisecond apart: a read per piece
	// without the threshold.
	_, _ = c.Write(body[:100_000])
	time.Sleep(20 * time.Millisecond) // the handler's first reads take what came
	for at := 100_000; at < size; at += 20_000 {
		_, _ = c.Write(body[at:min(at+20_000, size)])
		time.Sleep(time.Millisecond)
	}
	res := <-results
	if res.err != nil {
		t.Fatal(res.err)
	}
	if !bytes.Equal(res.body, body) {
		t.Fatalf("the handler read %d bytes, not the %d sent", len(res.body), size)
	}
	if res.maxLowat < minLowat || res.reads > 4 {
		t.Errorf("%d reads with SO_RCVLOWAT up to %d, want at most 4 reads with a threshold of at least %d", res.reads, res.maxLowat, minLowat)
	}
	if res.after != 1 {
		t.Errorf("SO_RCVLOWAT %d after the body, want 1", res.after)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := io.ReadAll(resp.Body); string(b) != "ok" {
		t.Errorf("response %q", b)
	}
}

// KVROUTE_RAW_SYSCALLS=off (rawOff) leaves every connection as net made it.
func TestRawSyscallsOff(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	dialed, accepted := dialAccept(t, ln)
	defer dialed.Close()
	defer accepted.Close()
	defer rawOff.Store(rawOff.Load())
	rawOff.Store(true)
	if c := wrapConn(dialed); c != dialed {
		t.Errorf("with rawOff wrapConn gave a %T, want the *net.TCPConn as it was", c)
	}
	if setRcvLowat(dialed, 1<<16) {
		t.Error("setRcvLowat reported success on a connection left as net made it")
	}
	rawOff.Store(false)
	if _, ok := wrapConn(dialed).(*rawConn); !ok {
		t.Error("without rawOff wrapConn did not wrap a TCP connection")
	}
}
