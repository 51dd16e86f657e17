//go:build linux && (amd64 || arm64) && race

package h1

import (
	"syscall"
	"unsafe"
)

// Under the race detector the raw connection reads and writes through package syscall:
// syscall.Write and syscall.Read tell the detector that what a goroutine wrote to any socket
// happens before what another reads from one (a write releases, a read acquires), which raw
// calls would hide, and every exchange over loopback between a test's client and server would
// be reported as a race. A writev is preceded by a zero-length syscall.Write for the release.
// The runtime's bookkeeping that the raw calls leave out costs nothing that matters in a
// race build. `make unit` runs the raw connection's tests once more without -race, and the
// end-to-end tests' router, the benchmarks and the fuzz targets are built without it.

func sysRead(fd uintptr, p []byte) (int, syscall.Errno) {
	n, err := syscall.Read(int(fd), p)
	return max(n, 0), errnoOf(err)
}

func sysWrite(fd uintptr, p []byte) (int, syscall.Errno) {
	n, err := syscall.Write(int(fd), p)
	return max(n, 0), errnoOf(err)
}

func sysWritev(fd uintptr, iov []syscall.Iovec) (int, syscall.Errno) {
	_, _ = syscall.Write(int(fd), nil) // the detector's release; writes nothing
	n, _, e := syscall.RawSyscall(syscall.SYS_WRITEV, fd, uintptr(unsafe.Pointer(&iov[0])), uintptr(len(iov)))
	return int(n), e
}

// errnoOf is err's errno: package syscall returns a syscall.Errno or nil.
func errnoOf(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	if e, ok := err.(syscall.Errno); ok {
		return e
	}
	return syscall.EIO
}
