package proxy

import (
	"context"
	"log/slog"
	"net"
	"sync"
	"time"
)

// Every request writes an access line, and one refused for a wrong or missing API key is the
// cheapest a client can make: 2,000 wrong keys a second wrote some 49 GB of access log a day
// (284 bytes a line). unauthLog bounds the lines of 401 answers: at most unauthPerKey a
// window for each client address and error code, unauthPerWindow in all; the others are
// counted, and each count is written once, in one line, within a window of the first line
// not written. The requests are counted in the metrics all the same
// (kvroute_tenant_requests_total, kvroute_tenant_rejections_total).
type unauthLog struct {
	now func() time.Time // nil: time.Now
	// after runs f after d (nil: time.AfterFunc), so that a test can run the flush itself.
	after func(d time.Duration, f func())
	log   *slog.Logger

	mu      sync.Mutex
	start   time.Time      // the window's start (zero: none yet)
	lines   map[logKey]int // lines written in the window, by key
	total   int            // lines written in the window
	dropped map[logKey]int // lines not written since the last flush, by key
	armed   bool           // a flush is due (after)
}

// logKey is the client address (without its port: a client's every connection has another)
// and the error code of a 401.
type logKey struct{ addr, code string }

// Bounds of the 401 lines (unauthLog).
const (
	unauthWindow    = time.Second
	unauthPerKey    = 5
	unauthPerWindow = 100
	// unauthMaxKeys bounds the keys whose dropped lines are counted apart until a flush:
	// beyond them (clients at many addresses) they are counted under unauthOther, by code.
	unauthMaxKeys = 64
)

// unauthOther is the address under which the lines of clients past unauthMaxKeys are counted.
const unauthOther = "other"

// allow reports whether the access line of a 401 answered to the client at addr (host:port, or
// "") with code may be written; one that may not is counted for the next flush.
func (l *unauthLog) allow(addr, code string) bool {
	if host, _, err := net.SplitHostPort(addr); err == nil {
		addr = host
	}
	k := logKey{addr: addr, code: code}
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	if l.now != nil {
		now = l.now()
	}
	if l.start.IsZero() || now.Sub(l.start) >= unauthWindow || now.Before(l.start) {
		l.start, l.total = now, 0
		clear(l.lines)
	}
	if l.lines[k] < unauthPerKey && l.total < unauthPerWindow {
		if l.lines == nil {
			l.lines = map[logKey]int{}
		}
		l.lines[k]++
		l.total++
		return true
	}
	if l.dropped == nil {
		l.dropped = map[logKey]int{}
	}
	if _, ok := l.dropped[k]; !ok && len(l.dropped) >= unauthMaxKeys {
		k = logKey{addr: unauthOther, code: code} // the codes are the router's own: a few
	}
	l.dropped[k]++
	if !l.armed {
		l.armed = true
		after := l.after
		if after == nil {
			after = func(d time.Duration, f func()) { time.AfterFunc(d, f) }
		}
		after(unauthWindow, l.flush)
	}
	return false
}

// flush writes a line for each key whose 401 lines were not written since the last flush,
// with their count.
func (l *unauthLog) flush() {
	l.mu.Lock()
	dropped := l.dropped
	l.dropped, l.armed = nil, false
	l.mu.Unlock()
	for k, n := range dropped {
		l.log.LogAttrs(context.Background(), slog.LevelInfo, "access lines of 401 answers not written (past the bound for their client address and error code)",
			slog.Int("status", 401), slog.String("remote_addr", k.addr), slog.String("error_code", k.code), slog.Int("suppressed", n))
	}
}
