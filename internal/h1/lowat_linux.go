package h1

import (
	"net"
	"syscall"
)

// setLowWater sets nc's SO_RCVLOWAT to n bytes: the kernel then reports the socket readable
// (and wakes its poller) only when n bytes are there, the sender has closed, or its receive
// buffer is under pressure; a read still takes what is there. It reports whether it was set.
func setLowWater(nc net.Conn, n int) bool {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	var serr error
	err = rc.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVLOWAT, n)
	})
	return err == nil && serr == nil
}

// lowWater reads nc's SO_RCVLOWAT (tests), -1 where it cannot.
func lowWater(nc net.Conn) int {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return -1
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return -1
	}
	v := -1
	_ = rc.Control(func(fd uintptr) {
		if n, err := syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVLOWAT); err == nil {
			v = n
		}
	})
	return v
}
