//go:build linux && (amd64 || arm64)

package h1

import (
	"encoding/binary"
	"net"
	"sync"
	"syscall"
	"unsafe"
)

// tcpInfoBytesReceived is where tcpi_bytes_received lies in Linux's struct tcp_info (since
// Linux 4.1; the struct's layout is the same on every architecture), and tcpInfoLen how much
// of the struct is read: up to and including it.
const (
	tcpInfoBytesReceived = 128
	tcpInfoLen           = tcpInfoBytesReceived + 8
)

// received returns how many bytes the client of nc has sent it, as the kernel counts them
// (TCP_INFO): those read and those still waiting in the socket, a TLS handshake's included.
// ok is false where it cannot tell (not a TCP connection, a kernel before 4.1). A TLS
// connection is asked through the connection under it (NetConn). It asks through Control, as
// pending does, and costs one system call.
func received(nc net.Conn) (n uint64, ok bool) {
	n, _, ok = counts(nc, false)
	return n, ok
}

// taken returns how many bytes of its client's the reader of nc has taken from the kernel so
// far: received, less those still waiting in the socket (SIOCINQ). Over TLS, what crypto/tls
// has read. ok as received's. It costs two system calls.
func taken(nc net.Conn) (n uint64, ok bool) {
	n, waiting, ok := counts(nc, true)
	if !ok || waiting > n {
		return 0, false
	}
	return n - waiting, true
}

// counts returns the bytes received on nc and, if asked, those waiting in its socket.
func counts(nc net.Conn, askWaiting bool) (n, waiting uint64, ok bool) {
	if u, isTLS := nc.(interface{ NetConn() net.Conn }); isTLS {
		nc = u.NetConn()
	}
	sc, isSys := nc.(syscall.Conn)
	if !isSys {
		return 0, 0, false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return 0, 0, false
	}
	return countsOf(rc, askWaiting)
}

// receivedOf is received for the socket of rc (a connection's SyscallConn, asked once: each
// call of that allocates).
func receivedOf(rc syscall.RawConn) (n uint64, ok bool) {
	n, _, ok = countsOf(rc, false)
	return n, ok
}

func countsOf(rc syscall.RawConn, askWaiting bool) (n, waiting uint64, ok bool) {
	p := probes.Get().(*tcpProbe)
	defer probes.Put(p)
	p.size, p.inq, p.askWaiting, p.errno, p.inqErrno = uint32(len(p.info)), 0, askWaiting, 0, 0
	if err := rc.Control(p.fn); err != nil || p.errno != 0 || p.inqErrno != 0 || p.size < tcpInfoLen || p.inq < 0 {
		return 0, 0, false
	}
	return binary.NativeEndian.Uint64(p.info[tcpInfoBytesReceived:]), uint64(p.inq), true
}

// tcpProbe is counts' buffers, pooled with the function Control calls bound to them once: a
// kept-alive TLS connection is asked at each answer's end (NetHTTP), and a probe then
// allocates nothing of its own.
type tcpProbe struct {
	info            [tcpInfoLen]byte
	size            uint32
	inq             int32
	askWaiting      bool
	errno, inqErrno syscall.Errno
	fn              func(fd uintptr) // run
}

var probes = sync.Pool{New: func() any {
	p := new(tcpProbe)
	p.fn = p.run
	return p
}}

func (p *tcpProbe) run(fd uintptr) {
	// getsockopt(2) and ioctl(2) do not block: raw calls, as the raw connection's reads.
	_, _, p.errno = syscall.RawSyscall6(syscall.SYS_GETSOCKOPT, fd, syscall.IPPROTO_TCP, syscall.TCP_INFO,
		uintptr(unsafe.Pointer(&p.info[0])), uintptr(unsafe.Pointer(&p.size)), 0)
	if p.askWaiting && p.errno == 0 {
		// SIOCINQ (TIOCINQ's value): the bytes received and not yet read.
		_, _, p.inqErrno = syscall.RawSyscall(syscall.SYS_IOCTL, fd, syscall.TIOCINQ, uintptr(unsafe.Pointer(&p.inq)))
	}
}
