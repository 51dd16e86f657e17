//go:build linux && (amd64 || arm64)

package h1

import (
	"encoding/binary"
	"net"
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
	var info [tcpInfoLen]byte
	size := uint32(len(info))
	var errno syscall.Errno
	err = rc.Control(func(fd uintptr) {
		// getsockopt(2) does not block: a raw call, as the raw connection's reads.
		_, _, errno = syscall.RawSyscall6(syscall.SYS_GETSOCKOPT, fd, syscall.IPPROTO_TCP, syscall.TCP_INFO,
			uintptr(unsafe.Pointer(&info[0])), uintptr(unsafe.Pointer(&size)), 0)
	})
	if err != nil || errno != 0 || size < tcpInfoLen {
		return 0, false
	}
	return binary.NativeEndian.Uint64(info[tcpInfoBytesReceived:]), true
}
