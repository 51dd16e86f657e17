package h1

import (
	"errors"
	"net"
	"syscall"
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
// 0: setAbortive) once a write to them has run past its deadline, whoever closes them then: a
// client that stopped reading leaves nothing held in the kernel for it, as the servers of this
// package do for the connections they see the stall of. It is for the listener under
// crypto/tls's, tls.NewListener(AbortStalled(ln), config), served by NetHTTP: there Go's server
// closes the TLS connection itself after a write to it failed (a handler's write, its last
// flush), which NetHTTP cannot see in time, and crypto/tls, which writes to the connection this
// returns, reports the stall to it first. Close, CloseWrite and deadlines are the connection's;
// the system calls that the servers make on a TLS connection's socket (pending, received) go
// through it (SyscallConn).
func AbortStalled(ln net.Listener) net.Listener { return stallListener{ln} }

type stallListener struct{ net.Listener }

func (l stallListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &stallConn{c}, nil
}

// stallConn is a connection of AbortStalled's.
type stallConn struct{ net.Conn }

func (c *stallConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if err != nil && isTimeout(err) {
		setAbortive(c.Conn)
	}
	return n, err
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
