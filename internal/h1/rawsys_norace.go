//go:build linux && (amd64 || arm64) && !race

package h1

import (
	"syscall"
	"unsafe"
)

// The raw connection's system calls (rawconn_linux.go), made without the runtime's
// bookkeeping; rawsys_race.go has the race detector's versions.

func sysRead(fd uintptr, p []byte) (int, syscall.Errno) {
	n, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(unsafe.SliceData(p))), uintptr(len(p)))
	return int(n), e
}

func sysWrite(fd uintptr, p []byte) (int, syscall.Errno) {
	n, _, e := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(unsafe.SliceData(p))), uintptr(len(p)))
	return int(n), e
}

func sysWritev(fd uintptr, iov []syscall.Iovec) (int, syscall.Errno) {
	n, _, e := syscall.RawSyscall(syscall.SYS_WRITEV, fd, uintptr(unsafe.Pointer(&iov[0])), uintptr(len(iov)))
	return int(n), e
}
