//go:build linux && (amd64 || arm64)

package logbuf

import (
	"io"
	"os"
	"syscall"
	"unsafe"
)

// pipeBuf is the most a raw write carries: a pipe that polls writable has room for that much
// in one write (POSIX's PIPE_BUF, Linux's page).
const pipeBuf = 4096

// rawFile writes to a file without the runtime's system-call bookkeeping, when the write cannot
// block (see the package doc): a regular file, or a pipe or socket that polls writable, and at
// most pipeBuf bytes.
type rawFile struct {
	rc   syscall.RawConn
	poll bool // a pipe or a socket: polled first
}

// newRaw returns a rawFile for w, or nil when w is not a file of those kinds (a terminal, a
// device, an io.Writer of another kind), whose writes then all go through w.
func newRaw(w io.Writer) *rawFile {
	f, ok := w.(*os.File)
	if !ok || f == nil {
		return nil
	}
	st, err := f.Stat()
	if err != nil {
		return nil
	}
	r := &rawFile{}
	switch m := st.Mode(); {
	case m.IsRegular():
	case m&(os.ModeNamedPipe|os.ModeSocket) != 0:
		r.poll = true
	default:
		return nil
	}
	if r.rc, err = f.SyscallConn(); err != nil {
		return nil
	}
	return r
}

// pollFd is struct pollfd.
type pollFd struct {
	fd      int32
	events  int16
	revents int16
}

const (
	pollOut = 0x4
	pollErr = 0x8
	pollHup = 0x10
)

// write writes a prefix of p, and returns its length: 0 when the file was not writable at once
// (or p is longer than pipeBuf, or the call failed), and the caller writes the rest through the
// file as usual.
func (r *rawFile) write(p []byte) int {
	if len(p) == 0 || len(p) > pipeBuf {
		return 0
	}
	n := 0
	_ = r.rc.Control(func(fd uintptr) {
		if r.poll {
			pfd := pollFd{fd: int32(fd), events: pollOut}
			var now syscall.Timespec // a zero timeout: ppoll answers at once
			k, _, e := syscall.RawSyscall6(syscall.SYS_PPOLL, uintptr(unsafe.Pointer(&pfd)), 1,
				uintptr(unsafe.Pointer(&now)), 0, 0, 0)
			if e != 0 || k != 1 || pfd.revents&(pollErr|pollHup) != 0 || pfd.revents&pollOut == 0 {
				return
			}
		}
		m, _, e := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(unsafe.SliceData(p))), uintptr(len(p)))
		if e == 0 {
			n = int(m)
		}
	})
	return n
}
