//go:build linux && (amd64 || arm64)

package h1

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

// rawConn is a TCP connection whose reads and writes are system calls made with
// syscall.RawSyscall, inside the connection's syscall.RawConn: the netpoller still waits for
// the socket to be ready, and deadlines and Close interrupt the wait as they do a plain
// net.Conn's. Only the Go runtime's bookkeeping around the call (entersyscall and
// exitsyscall) is left out, which a socket in non-blocking mode does not need: its calls never
// block. That bookkeeping is what costs: when every P was idle, entering a system call wakes
// the runtime's sysmon thread, which then polls every 20 µs for as long as any goroutine runs
// (docs/results.md, "Sixth round": at 8 requests a second, each request woke it two or three
// times and it slept some 30 times per request). Everything but Read and Write (and writev, for
// MemBody) is the TCP connection's own.
type rawConn struct {
	tc *net.TCPConn
	rc syscall.RawConn

	// One read and one write at a time: each holds its direction's lock, so that the state
	// shared with the function given to the RawConn (bound once, not a closure per call) is
	// its own.
	rmu, wmu sync.Mutex
	rd       rawOp
	wr       rawOp
	iovs     [8]syscall.Iovec // writeBuffers' vector, under wmu
	lowat    int32            // setRcvLowat's value, under rmu
	lowatErr syscall.Errno
	lowatFn  func(fd uintptr)
	readFn   func(fd uintptr) bool
	writeFn  func(fd uintptr) bool
	writevFn func(fd uintptr) bool
}

// rawOp is one read or write under way: its buffer (or buffers, for writev), how much of it
// is done, and the error the system call returned.
type rawOp struct {
	p     []byte
	iov   []syscall.Iovec
	n     int
	errno syscall.Errno
}

// rawOff is set by KVROUTE_RAW_SYSCALLS=off in the environment: every connection keeps net's
// own reads and writes (the way back should a kernel or a sandbox such as gVisor treat the raw
// calls differently; it costs the CPU the package doc gives).
// (Atomic: a test turns it while other tests' servers may accept.)
var rawOff atomic.Bool

func init() { rawOff.Store(os.Getenv("KVROUTE_RAW_SYSCALLS") == "off") }

// wrapConn returns nc with raw reads and writes when it is a TCP connection, else nc (and nc
// whatever it is when rawOff).
func wrapConn(nc net.Conn) net.Conn {
	tc, ok := nc.(*net.TCPConn)
	if !ok || rawOff.Load() {
		return nc
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return nc
	}
	c := &rawConn{tc: tc, rc: rc}
	c.readFn = c.read
	c.writeFn = c.write
	c.writevFn = c.writev
	c.lowatFn = c.setLowat
	return c
}

func (c *rawConn) setLowat(fd uintptr) {
	_, _, c.lowatErr = syscall.RawSyscall6(syscall.SYS_SETSOCKOPT, fd, syscall.SOL_SOCKET, syscall.SO_RCVLOWAT,
		uintptr(unsafe.Pointer(&c.lowat)), unsafe.Sizeof(c.lowat), 0)
}

// setRcvLowat sets SO_RCVLOWAT on nc's socket to n bytes: the poller reports it readable once
// that many bytes wait (or the peer closed), so that a read that waits is woken once for them,
// not once per segment. It reports false when it could not (not a raw connection, an error).
func setRcvLowat(nc net.Conn, n int) bool {
	c, ok := nc.(*rawConn)
	if !ok {
		return false
	}
	c.rmu.Lock()
	defer c.rmu.Unlock()
	c.lowat, c.lowatErr = int32(min(n, 1<<30)), 0
	err := c.rc.Control(c.lowatFn)
	return err == nil && c.lowatErr == 0
}

// read is the RawConn function of Read: one read(2), again at EINTR; false asks the poller
// to wait for the socket to be readable.
func (c *rawConn) read(fd uintptr) bool {
	op := &c.rd
	for {
		n, e := sysRead(fd, op.p)
		switch e {
		case 0:
			op.n = int(n)
			return true
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return false
		}
		op.errno = e
		return true
	}
}

// write is the RawConn function of Write: write(2) until all of op.p is written or an error.
func (c *rawConn) write(fd uintptr) bool {
	op := &c.wr
	for op.n < len(op.p) {
		rest := op.p[op.n:]
		n, e := sysWrite(fd, rest)
		switch e {
		case 0:
			op.n += int(n)
		case syscall.EINTR:
		case syscall.EAGAIN:
			return false
		default:
			op.errno = e
			return true
		}
	}
	return true
}

// writev is the RawConn function of writeBuffers: writev(2) of op.iov until all of it is
// written or an error, advancing op.iov past what was written.
func (c *rawConn) writev(fd uintptr) bool {
	op := &c.wr
	for len(op.iov) > 0 {
		n, e := sysWritev(fd, op.iov)
		switch e {
		case 0:
			op.n += int(n)
			consumeIovecs(&op.iov, int(n))
		case syscall.EINTR:
		case syscall.EAGAIN:
			return false
		default:
			op.errno = e
			return true
		}
	}
	return true
}

// consumeIovecs drops the first n bytes from iov.
func consumeIovecs(iov *[]syscall.Iovec, n int) {
	v := *iov
	for len(v) > 0 && n >= int(v[0].Len) {
		n -= int(v[0].Len)
		v = v[1:]
	}
	if len(v) > 0 && n > 0 {
		v[0].Base = (*byte)(unsafe.Add(unsafe.Pointer(v[0].Base), n))
		v[0].Len -= uint64(n)
	}
	*iov = v
}

// maxIovecs is how many buffers one writev(2) takes (IOV_MAX).
const maxIovecs = 1024

func (c *rawConn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	c.rmu.Lock()
	defer c.rmu.Unlock()
	c.rd = rawOp{p: p}
	err := c.rc.Read(c.readFn)
	n, errno := c.rd.n, c.rd.errno
	c.rd.p = nil
	switch {
	case err != nil: // a deadline, or the connection closed
		return 0, c.opError("read", err)
	case errno != 0:
		return 0, c.opError("read", os.NewSyscallError("read", errno))
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

func (c *rawConn) Write(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.wr = rawOp{p: p}
	err := c.rc.Write(c.writeFn)
	n, errno := c.wr.n, c.wr.errno
	c.wr.p = nil
	switch {
	case err != nil:
		return n, c.opError("write", err)
	case errno != 0:
		return n, c.opError("write", os.NewSyscallError("write", errno))
	}
	return n, nil
}

// writeBuffers writes bufs in order, as few writev(2) calls as the socket takes them in.
func (c *rawConn) writeBuffers(bufs [][]byte) (int64, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	iov := c.iovs[:0]
	for _, b := range bufs {
		if len(b) > 0 {
			iov = append(iov, syscall.Iovec{Base: unsafe.SliceData(b), Len: uint64(len(b))})
		}
	}
	defer clear(c.iovs[:]) // no pointers into the buffers kept
	total := int64(0)
	for len(iov) > 0 {
		chunk := iov[:min(len(iov), maxIovecs)]
		c.wr = rawOp{iov: chunk}
		err := c.rc.Write(c.writevFn)
		n, errno := c.wr.n, c.wr.errno
		c.wr.iov = nil
		total += int64(n)
		switch {
		case err != nil:
			return total, c.opError("writev", err)
		case errno != 0:
			return total, c.opError("writev", os.NewSyscallError("writev", errno))
		}
		iov = iov[len(chunk):]
	}
	return total, nil
}

// opError wraps err as net's own reads and writes do: a *net.OpError with the addresses, whose
// Timeout, errors.Is(os.ErrDeadlineExceeded) and errors.Is(net.ErrClosed) answer the same.
func (c *rawConn) opError(op string, err error) error {
	var oe *net.OpError
	if errors.As(err, &oe) {
		err = oe.Err // the RawConn's, named "raw-read" or "raw-write"
	}
	return &net.OpError{Op: op, Net: "tcp", Source: c.tc.LocalAddr(), Addr: c.tc.RemoteAddr(), Err: err}
}

func (c *rawConn) Close() error                       { return c.tc.Close() }
func (c *rawConn) CloseWrite() error                  { return c.tc.CloseWrite() }
func (c *rawConn) LocalAddr() net.Addr                { return c.tc.LocalAddr() }
func (c *rawConn) RemoteAddr() net.Addr               { return c.tc.RemoteAddr() }
func (c *rawConn) SetDeadline(t time.Time) error      { return c.tc.SetDeadline(t) }
func (c *rawConn) SetReadDeadline(t time.Time) error  { return c.tc.SetReadDeadline(t) }
func (c *rawConn) SetWriteDeadline(t time.Time) error { return c.tc.SetWriteDeadline(t) }
func (c *rawConn) SetLinger(sec int) error            { return c.tc.SetLinger(sec) }
func (c *rawConn) SyscallConn() (syscall.RawConn, error) {
	return c.rc, nil
}

// peek reads up to len(b) bytes from fd with recvfrom(2) and flags (MSG_PEEK, MSG_DONTWAIT),
// as a raw system call (see rawConn).
func peek(fd uintptr, b []byte, flags int) (int, syscall.Errno) {
	n, _, e := syscall.RawSyscall6(syscall.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(len(b)), uintptr(flags), 0, 0)
	if e != 0 {
		return -1, e
	}
	return int(n), 0
}
