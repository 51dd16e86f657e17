//go:build linux && (amd64 || arm64)

package h1

import (
	"encoding/binary"
	"net"
	"sync"
	"syscall"
	"time"
	"unsafe"
)

// tcpInfoBytesReceived is where tcpi_bytes_received lies in Linux's struct tcp_info (since
// Linux 4.1; the struct's layout is the same on every architecture), and tcpInfoLen how much
// of the struct is read: up to and including it.
const (
	tcpInfoBytesReceived = 128
	tcpInfoLen           = tcpInfoBytesReceived + 8
)

// tcpInfoLastDataSent and tcpInfoLastAckRecv are where tcpi_last_data_sent and
// tcpi_last_ack_recv lie in struct tcp_info (milliseconds, 32 bits, in every Linux).
const (
	tcpInfoLastDataSent = 44
	tcpInfoLastAckRecv  = 56
)

// sendIdle returns how long the client of nc has taken none of the bytes written to it, as
// the kernel tells: 0 when the kernel holds none of them (SIOCOUTQ: none unsent or
// unacknowledged, whatever the writer's goroutine is still about), else the time since the
// kernel last sent data on the connection, or since it last received an acknowledgement,
// whichever is longer (TCP_INFO). The kernel sends only what the client's receive window
// takes, and the window of a client that stopped reading stays closed (the probes that ask
// whether it opened carry no data), while one that reads, however slowly, opens it again as
// it reads and is sent more; a client gone acknowledges nothing, sent or sent again. (A write
// blocked on a full send buffer is woken only once about a third of the buffer has drained:
// its own progress says little of a slow client's.) ok is false where the kernel cannot tell
// (not a TCP connection). A TLS connection is asked through the connection under it. It costs
// two system calls, and an allocation for a connection whose SyscallConn makes one (net's).
func sendIdle(nc net.Conn) (d time.Duration, ok bool) {
	if u, isTLS := nc.(interface{ NetConn() net.Conn }); isTLS {
		nc = u.NetConn()
	}
	sc, isSys := nc.(syscall.Conn)
	if !isSys {
		return 0, false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return 0, false
	}
	p := probes.Get().(*tcpProbe)
	defer probes.Put(p)
	p.size, p.inq, p.askWaiting, p.errno, p.inqErrno = uint32(len(p.info)), 0, false, 0, 0
	p.outq, p.askQueued, p.outqErrno = 0, true, 0
	err = rc.Control(p.fn)
	p.askQueued = false
	if err != nil || p.errno != 0 || p.outqErrno != 0 || p.size < tcpInfoLastAckRecv+4 {
		return 0, false
	}
	if p.outq == 0 {
		return 0, true
	}
	sent := binary.NativeEndian.Uint32(p.info[tcpInfoLastDataSent:])
	acked := binary.NativeEndian.Uint32(p.info[tcpInfoLastAckRecv:])
	return time.Duration(max(sent, acked)) * time.Millisecond, true
}

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
	info                       [tcpInfoLen]byte
	size                       uint32
	inq, outq                  int32
	askWaiting, askQueued      bool
	errno, inqErrno, outqErrno syscall.Errno
	fn                         func(fd uintptr) // run
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
	if p.askQueued && p.errno == 0 {
		// SIOCOUTQ (TIOCOUTQ's value): the bytes written and not yet acknowledged.
		_, _, p.outqErrno = syscall.RawSyscall(syscall.SYS_IOCTL, fd, syscall.TIOCOUTQ, uintptr(unsafe.Pointer(&p.outq)))
	}
}
