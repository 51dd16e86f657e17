// Package logbuf batches log output, so that a busy router makes one write system call per
// batch of access lines instead of one per request.
//
// A line that comes Interval or more after the last write is written at once, by the goroutine
// that logs it (a request's, awake anyway), together with any lines still waiting. A line that
// comes sooner waits for such a line, or for Size bytes to be waiting. Only when neither comes
// does a timer write the waiting lines, at most ten Intervals (1 s by default) after the first
// of them; the timer is armed at most once per ten Intervals, however many batches go out
// meanwhile.
//
// Why not a timer per batch (the earlier way, which wrote each batch Interval after its first
// line): at 8 requests/s, Poisson arrivals, 55 % of the lines came within 100 ms of the last
// write, and each such batch's timer woke the otherwise idle router once more (a thread from
// the netpoller, a second thread, sysmon) just to write one line. A stopped or postponed Go
// timer does not help: the runtime still wakes at its old time. Now at that rate nearly every
// waiting line goes out with the next request's line (docs/results.md, "Eighth round").
//
// On Linux, a write to a regular file, or to a pipe or socket that polls writable (ppoll with
// a zero timeout), of at most 4 KB (PIPE_BUF: such a pipe has room for it), is a raw system
// call (syscall.RawSyscall, raw_linux.go) instead of os.File's: os.File's write enters the
// runtime's system-call bookkeeping, whose entry wakes sysmon whenever every other P is idle
// (at 8 requests/s, at every access line), and sysmon then polls every 20 µs until the
// request's goroutine parks: 4 to 9 nanosleeps and a futex wake per request. A raw call cannot
// be taken over by sysmon while it blocks, so a write that could block is never made raw: a
// full pipe or socket (a reader that lags), a terminal, a device, any other io.Writer, a longer
// batch; those go through os.File as before, so a slow stderr blocks the goroutine that logs,
// never its P. What is left is a write to a regular file that the kernel holds back for dirty
// page writeback, and a pipe filled by another process between the poll and the write.
// Measured with both changes above (docs/results.md, "Eighth round", with the second index
// insert's skip): at 8 requests/s of 100k-token prompts, context switches per request 12.5
// against 17.1 (medians of 30 runs), system calls 32.8 against 39.0, and the router's CPU per
// request 1.80 ms against 1.99.
//
// Close writes what is left (kvroute serve closes it on its way out, SIGTERM included); what
// was waiting at a crash is lost: at most ten Intervals' worth, or Size bytes.
package logbuf

import (
	"io"
	"sync"
	"time"
)

// Defaults for New's zero arguments.
const (
	DefaultInterval = 100 * time.Millisecond
	DefaultSize     = 64 << 10
	// waitIntervals is MaxWait in Intervals.
	waitIntervals = 10
)

// Writer is an io.Writer that batches writes to another. Each Write should be whole lines (a
// slog handler writes one record per call), so that a batch never splits a line.
type Writer struct {
	w        io.Writer
	raw      *rawFile // w's raw writer (Linux files), or nil
	interval time.Duration
	size     int
	maxWait  time.Duration // how long the timer lets a waiting line wait, at most

	mu     sync.Mutex
	buf    []byte
	timer  *time.Timer
	armed  bool      // the timer is set to fire
	last   time.Time // when the last write to w began (zero: none yet)
	closed bool
}

// New returns a Writer to w; interval and size 0 take the defaults.
func New(w io.Writer, interval time.Duration, size int) *Writer {
	if interval <= 0 {
		interval = DefaultInterval
	}
	if size <= 0 {
		size = DefaultSize
	}
	return &Writer{w: w, raw: newRaw(w), interval: interval, size: size, maxWait: waitIntervals * interval}
}

// Write writes p at once, with the lines waiting before it, when the last write was Interval or
// more ago; otherwise p waits (see the package doc). Once closed, it writes straight through.
func (b *Writer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return b.w.Write(p)
	}
	if now := time.Now(); now.Sub(b.last) >= b.interval {
		if len(b.buf) == 0 {
			b.last = now
			b.out(p)
			return len(p), nil
		}
		b.buf = append(b.buf, p...)
		b.flushLocked()
		return len(p), nil
	}
	b.buf = append(b.buf, p...)
	if len(b.buf) >= b.size {
		b.flushLocked()
		return len(p), nil
	}
	if !b.armed {
		b.armed = true
		if b.timer == nil {
			b.timer = time.AfterFunc(b.maxWait, b.fire)
		} else {
			b.timer.Reset(b.maxWait)
		}
	}
	return len(p), nil
}

// fire writes what is still waiting when the timer goes off: no line came to take it along.
func (b *Writer) fire() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.armed = false
	b.flushLocked()
}

// out writes p to w: raw when it can (raw_linux.go), else, or the rest, through w. A log that
// cannot be written has nowhere to say so.
func (b *Writer) out(p []byte) {
	if b.raw != nil {
		p = p[b.raw.write(p):]
		if len(p) == 0 {
			return
		}
	}
	_, _ = b.w.Write(p)
}

// Flush writes what is waiting.
func (b *Writer) Flush() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.flushLocked()
}

func (b *Writer) flushLocked() {
	if len(b.buf) == 0 {
		return
	}
	b.last = time.Now()
	b.out(b.buf)
	if cap(b.buf) > 4*b.size {
		b.buf = nil // one huge burst: do not keep its buffer
	} else {
		b.buf = b.buf[:0]
	}
}

// Close writes what is waiting; later writes go straight through.
func (b *Writer) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.timer != nil {
		b.timer.Stop()
	}
	b.flushLocked()
	b.closed = true
	return nil
}
