// Package logbuf batches log output. Lines are kept in memory and written out together at most
// Interval after the first of them, or at once when Size bytes are waiting, so that a busy
// router makes one write system call per batch of access lines instead of one per request.
// A line that comes at least Interval after the last write is written at once instead: a
// router that serves fewer requests than one per Interval would otherwise make the same one
// write per line, from a timer that wakes the otherwise idle process once more per request
// (docs/results.md, "Sixth round"). Close writes what is left; what was written before a crash
// may be lost, at most Interval's worth.
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
)

// Writer is an io.Writer that batches writes to another. Each Write should be whole lines (a
// slog handler writes one record per call), so that a batch never splits a line.
type Writer struct {
	w        io.Writer
	interval time.Duration
	size     int

	mu     sync.Mutex
	buf    []byte
	timer  *time.Timer
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
	return &Writer{w: w, interval: interval, size: size}
}

// Write keeps p for the next batch, or writes it at once when nothing is waiting and the last
// write was at least Interval ago; once closed, it writes straight through.
func (b *Writer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return b.w.Write(p)
	}
	first := len(b.buf) == 0
	if now := time.Now(); first && now.Sub(b.last) >= b.interval {
		b.last = now
		_, _ = b.w.Write(p) // as flushLocked: a log that cannot be written has nowhere to say so
		return len(p), nil
	}
	b.buf = append(b.buf, p...)
	if len(b.buf) >= b.size {
		b.flushLocked()
		return len(p), nil
	}
	if first {
		if b.timer == nil {
			b.timer = time.AfterFunc(b.interval, b.Flush)
		} else {
			b.timer.Reset(b.interval)
		}
	}
	return len(p), nil
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
	_, _ = b.w.Write(b.buf) // a log that cannot be written has nowhere to say so
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
