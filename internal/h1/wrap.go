package h1

import "net"

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
