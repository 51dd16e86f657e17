package h1

import (
	"errors"
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"time"
)

// WrapConn returns nc with reads and writes made as raw system calls inside its
// syscall.RawConn when nc is a *net.TCPConn on Linux (amd64 and arm64: see rawconn_linux.go),
// else nc unchanged (and nc unchanged whatever it is when the environment has
// KVROUTE_RAW_SYSCALLS=off). The poller still waits for the socket, and deadlines, Close and
// CloseWrite act as on nc; only the runtime's entersyscall and exitsyscall around each read
// and write are left out, which on an otherwise idle process wake the runtime's sysmon thread
// for a millisecond of 20 µs polls. Options set before wrapping (keep-alive, no-delay) stay
// set. The result is not a *net.TCPConn: code that asserts that type (sendfile or splice
// through io.ReaderFrom) takes its generic path. Use it for a connection that carries small
// reads and writes between idle stretches, as h1's server and transport and the peers'
// streams do.
func WrapConn(nc net.Conn) net.Conn { return wrapConn(nc) }

// WrapListener returns a listener whose accepted connections are wrapped by WrapConn. Close
// and Addr are ln's.
func WrapListener(ln net.Listener) net.Listener { return rawListener{ln} }

type rawListener struct{ net.Listener }

func (l rawListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return wrapConn(c), nil
}

// AbortStalled returns a listener whose accepted connections close abortively (a reset, SO_LINGER
// 0: setAbortive) once a write to them has run past its deadline, whoever closes them then, and
// fail the writes after it at once: a client that stopped reading leaves nothing held in the
// kernel for it, as the servers of this package do for the connections they see the stall of.
// It is for the listener under crypto/tls's, tls.NewListener(AbortStalled(ln), config), served
// by NetHTTP: there Go's server closes the TLS connection itself after a write to it failed (a
// handler's write, its last flush), which NetHTTP cannot see in time, and crypto/tls, which
// writes to the connection this returns, reports the stall to it first. It also lets NetHTTP's
// writes go on past the stall bound's deadline while the client still takes the answer
// (stallBound), which crypto/tls, failing for good at a write's first error, cannot. Close,
// CloseWrite and deadlines are the connection's; the system calls that the servers make on a
// TLS connection's socket (pending, received, sendIdle) go through it (SyscallConn).
func AbortStalled(ln net.Listener) net.Listener { return stallListener{ln} }

type stallListener struct{ net.Listener }

func (l stallListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &stallConn{Conn: c}, nil
}

// stallConn is a connection of AbortStalled's.
type stallConn struct {
	net.Conn
	bound  stallBound // NetHTTP's, set by its guard
	flight tlsFlight  // where a TLS handshake over it ends (heard)
}

func (c *stallConn) Write(p []byte) (int, error) { return c.bound.write(c.Conn, p) }

// stallBound lets a write that ran past its deadline go on while the client still takes the
// answer: NetHTTP bounds a write stall with a write deadline, and a client that reads slower
// than the answer is written holds a write past it (the kernel wakes a write blocked on a full
// send buffer only once about a third of the buffer has drained). It is on the connection
// beneath Go's server's writes (framedConn), or beneath crypto/tls's (stallConn), which fails
// for good at a write's first error. NetHTTP's guard sets it for each HTTP/1 request; zero: a
// write past its deadline fails.
type stallBound struct {
	stall atomic.Int64 // WriteStallTimeout, ns; 0: none
	// end is the answer's deadline (WriteTimeout), Unix ns, never moved past; 0: none.
	end atomic.Int64
	// cut: a write ran past its deadline, and the connection's close is abortive.
	cut atomic.Bool
	// sent is the client's progress on the writes, as resume last asked.
	sent sendProgress
}

// set bounds the writes from now on: by stall, and by end (zero: none).
func (b *stallBound) set(stall time.Duration, end time.Time) {
	var e int64
	if !end.IsZero() {
		e = end.UnixNano()
	}
	b.stall.Store(int64(stall))
	b.end.Store(e)
}

// write writes p to nc, on past a deadline while the client takes bytes (resume). A write
// that ran past its deadline all the same makes nc's close abortive (setAbortive), whoever
// closes it, and the writes after it fail at once: their bytes would be dropped at the close,
// and the one that crypto/tls's Close makes (close_notify, with a deadline of 5 s) would wait
// that long for a client that does not read, in Go's server's goroutine, before the handler
// hears of the stall.
func (b *stallBound) write(nc net.Conn, p []byte) (int, error) {
	if b.cut.Load() {
		return 0, &net.OpError{Op: "write", Net: "tcp", Source: nc.LocalAddr(), Addr: nc.RemoteAddr(),
			Err: os.ErrDeadlineExceeded}
	}
	n, err := nc.Write(p)
	for err != nil && n < len(p) && isTimeout(err) && b.resume(nc) {
		var m int
		m, err = nc.Write(p[n:])
		n += m
	}
	if err != nil && isTimeout(err) && setAbortive(nc) != nil {
		b.cut.Store(true)
	}
	return n, err
}

// resume reports whether a write to nc that ran past its deadline goes on: whether the client
// took bytes within the stall bound (sendIdle), the answer's deadline not passed. If so it
// sets nc's write deadline to the stall bound after the client's last progress, never past
// the answer's deadline. Where the kernel cannot tell the client's progress, the write fails
// at its deadline, as before. Another deadline that runs out (a Close's) is taken alike: the
// write goes on while the client takes bytes.
func (b *stallBound) resume(nc net.Conn) bool {
	stall := time.Duration(b.stall.Load())
	if stall <= 0 {
		return false
	}
	idle, ok := sendIdle(nc, &b.sent)
	if !ok || idle >= stall {
		return false
	}
	now := time.Now()
	next := now.Add(stall - idle).UnixNano()
	if end := b.end.Load(); end != 0 {
		if now.UnixNano() >= end {
			return false
		}
		next = min(next, end)
	}
	return nc.SetWriteDeadline(time.Unix(0, next)) == nil
}

// NetConn returns the connection under it (setAbortive, underConn).
func (c *stallConn) NetConn() net.Conn { return c.Conn }

// SyscallConn is the connection's, where it has one.
func (c *stallConn) SyscallConn() (syscall.RawConn, error) {
	sc, ok := c.Conn.(syscall.Conn)
	if !ok {
		return nil, errors.ErrUnsupported
	}
	return sc.SyscallConn()
}

// CloseWrite is the connection's, where it has one.
func (c *stallConn) CloseWrite() error {
	cw, ok := c.Conn.(interface{ CloseWrite() error })
	if !ok {
		return errors.ErrUnsupported
	}
	return cw.CloseWrite()
}
