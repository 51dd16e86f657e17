//go:build linux && !386

package h1

import (
	"encoding/binary"
	"net"
	"sync"
	"syscall"
	"time"
	"unsafe"
)

// tcpInfoBytesAcked and tcpInfoBytesReceived are where tcpi_bytes_acked and
// tcpi_bytes_received lie in Linux's struct tcp_info (since Linux 4.1; the struct's layout is
// the same on every architecture), and tcpInfoLen how much of the struct is read: up to and
// including the latter.
const (
	tcpInfoBytesAcked    = 120
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
// unacknowledged, whatever the writer's goroutine is still about). Else it is the longer of
// two measures (TCP_INFO). One is the time since the kernel last sent data on the connection,
// or since it last received an acknowledgement, whichever is longer: the kernel sends only
// what the client's receive window takes, and the window of a client that stopped reading
// stays closed (the probes that ask whether it opened carry no data), while one that reads,
// however slowly, opens it again as it reads and is sent more; a client gone acknowledges
// nothing, sent or sent again. The other is the time since the client's acknowledged bytes
// (tcpi_bytes_acked) were last seen to grow, as pr keeps them from one call to the next: a
// kernel that leaves the time fields 0 (gVisor's netstack) would otherwise make every client
// look busy, and one that reports neither is judged idle from its second call on, as where
// the kernel cannot tell. (A write blocked on a full send buffer is woken only once about a
// third of the buffer has drained: its own progress says little of a slow client's.) ok is
// false where the kernel cannot tell (not a TCP connection). A TLS connection is asked
// through the connection under it. It costs two system calls, and an allocation for a
// connection whose SyscallConn makes one (net's).
func sendIdle(nc net.Conn, pr *sendProgress) (d time.Duration, ok bool) {
	st, ok := readSendState(nc)
	if !ok {
		return 0, false
	}
	return pr.judge(st, time.Now().UnixNano()), true
}

// readSendState is kernelSendState; tests put a kernel that fills fewer fields in its place.
var readSendState = kernelSendState

// kernelSendState asks the kernel what it holds for the client of nc (sendIdle).
func kernelSendState(nc net.Conn) (st sendState, ok bool) {
	if u, isTLS := nc.(interface{ NetConn() net.Conn }); isTLS {
		nc = u.NetConn()
	}
	sc, isSys := nc.(syscall.Conn)
	if !isSys {
		return st, false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return st, false
	}
	p := probes.Get().(*tcpProbe)
	defer probes.Put(p)
	p.size, p.inq, p.askWaiting, p.errno, p.inqErrno = uint32(len(p.info)), 0, false, 0, 0
	p.outq, p.askQueued, p.outqErrno = 0, true, 0
	err = rc.Control(p.fn)
	p.askQueued = false
	if err != nil || p.errno != 0 || p.outqErrno != 0 || p.size < tcpInfoLastAckRecv+4 || p.outq < 0 {
		return st, false
	}
	st.queued = uint32(p.outq)
	st.sentMs = binary.NativeEndian.Uint32(p.info[tcpInfoLastDataSent:])
	st.ackMs = binary.NativeEndian.Uint32(p.info[tcpInfoLastAckRecv:])
	if p.size >= tcpInfoBytesAcked+8 {
		st.acked = binary.NativeEndian.Uint64(p.info[tcpInfoBytesAcked:])
	}
	return st, true
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
	// getsockopt(2) and ioctl(2) do not block: raw calls, as the raw connection's reads. (On
	// s390x a kernel before 4.3 has no getsockopt of its own: ENOSYS, and the callers take it
	// as a kernel that cannot tell.)
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
