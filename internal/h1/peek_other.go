//go:build darwin || freebsd || netbsd || openbsd || dragonfly || (linux && !amd64 && !arm64)

package h1

import "syscall"

// peek reads up to len(b) bytes from fd with recvfrom(2) and flags (MSG_PEEK, MSG_DONTWAIT).
func peek(fd uintptr, b []byte, flags int) (int, syscall.Errno) {
	n, _, err := syscall.Recvfrom(int(fd), b, flags)
	if errno, ok := err.(syscall.Errno); ok && errno != 0 {
		return -1, errno
	}
	return n, 0
}
