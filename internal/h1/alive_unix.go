//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package h1

import (
	"net"
	"syscall"
)

// alive peeks, without waiting, at an idle connection: false when the server closed it or sent
// something unasked. Only the plain TCP connections the Transport dials come here: https goes
// to Fallback, net/http's Transport, whose reader goroutine notices a close itself, so no TLS
// connection is pooled here (TestHTTPSGoesToFallback). A *tls.Conn, not a syscall.Conn,
// would be taken for alive, and the bytes under it would need reading as records: a
// close_notify alert is a close, a TLS 1.3 session ticket is not.
func alive(nc net.Conn) bool {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return true
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	open := false
	var b [1]byte
	err = rc.Read(func(fd uintptr) bool {
		// Open and quiet: nothing to read yet. 0 bytes without an error: closed. Any byte: the
		// server said something unasked, so the connection's state is unknown.
		n, errno := peek(fd, b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		open = n <= 0 && (errno == syscall.EAGAIN || errno == syscall.EWOULDBLOCK)
		return true // never wait
	})
	return err == nil && open
}

// pending reports whether bytes wait to be read on a connection, without reading them and
// without waiting. It asks through Control, not Read: the connection's own goroutine may be
// blocked in a read, which holds the read lock. A TLS connection (not a syscall.Conn) is
// asked through the connection under it (NetConn), whose socket holds a request's records
// until they are read. (Only the rest of a record that crypto/tls has read in part is
// missed: a request split across reads as it arrives.)
func pending(nc net.Conn) bool {
	if u, ok := nc.(interface{ NetConn() net.Conn }); ok {
		nc = u.NetConn()
	}
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	n := 0
	var b [1]byte
	_ = rc.Control(func(fd uintptr) {
		n, _ = peek(fd, b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	})
	return n > 0
}
