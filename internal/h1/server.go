package h1

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Defaults of the Server's settings.
const (
	// DefaultWatchAfter is how long a request runs before its connection is watched for the
	// client going away.
	DefaultWatchAfter = 20 * time.Millisecond
	// maxDiscard is how much of a request body the handler left unread is read and dropped to
	// keep the connection; a longer rest closes it (net/http's figure).
	maxDiscard = 256 << 10
	// holdBeforeChunking is how much of a response body is held before its headers are sent:
	// a handler that writes no more than this and returns gets a Content-Length instead of
	// chunked encoding.
	holdBeforeChunking = 4 << 10
	// sniffLen is how much of a body http.DetectContentType looks at.
	sniffLen = 512
	// quietTicks is how many janitor rounds without a request in flight slow the janitor down
	// (one is enough when requests are fewer than rounds: see janitor).
	quietTicks = 20
)

// Server serves HTTP/1.0 and HTTP/1.1 to an http.Handler. Like net/http's Server it runs one
// goroutine per connection, which reads each request, runs the handler and writes the
// response. What it leaves out is what makes a request wake other threads: net/http reads
// every connection in the background while its handler runs (to notice a client that goes
// away) and stops that read at the end of each request, and it sets read deadlines per
// request, each a runtime timer that may have to wake a thread to be armed. Measured on a
// 2-vCPU VM, those cost a Go reverse proxy about 100 µs per request (docs/router.md).
//
// Here one janitor goroutine per server, awake while there are connections, does the timing
// on a coarse tick: it closes connections past their header or idle timeout, and starts
// watching the connection of a request that has run for WatchAfter; from then on a client
// that goes away cancels the request's context, as with net/http. Requests that end sooner
// never pay for it: a request arms no timer and wakes nothing, the janitor finds it at its
// next round (every half WatchAfter while requests are in flight, up to its slow period of
// at most 1 s after a quiet stretch: see janitor).
//
// Requests are parsed by http.ReadRequest. Handlers may Flush and Hijack. What it does not
// serve: TLS of its own (serve a tls.NewListener for it), HTTP/2 (HTTP2 hands h2c connections
// to another server), CloseNotify, and watching a connection whose client has already sent
// its next request (pipelining).
type Server struct {
	Handler http.Handler
	// ReadHeaderTimeout bounds reading a request's head; IdleTimeout how long a kept-alive
	// connection waits for its next request (0: ReadHeaderTimeout); WriteTimeout a whole
	// response. 0: no bound.
	ReadHeaderTimeout, IdleTimeout, WriteTimeout time.Duration
	// MaxHeaderBytes bounds a request's head; 0: http.DefaultMaxHeaderBytes (1 MB).
	MaxHeaderBytes int
	// BodyReadTimeout bounds reading a request body, from the handler's first read of it, and
	// grows by a second for every BodyMinRate bytes received (so that a large body sent at a
	// fair pace is not cut, while one trickled a byte at a time is). Time counts only while the
	// handler waits for the client: a handler busy elsewhere costs the client nothing. Past it,
	// the handler's read returns ErrBodyReadTimeout at once and the connection is closed after
	// the response. 0: no bound.
	BodyReadTimeout time.Duration
	// BodyMinRate is the body bytes per second that earn one more second of BodyReadTimeout;
	// 0: none (the timeout bounds the whole body).
	BodyMinRate int64
	// BodyStallTimeout bounds the wait for a body's progress, whatever BodyReadTimeout has
	// earned: a body that brings less than BodyMinRate bytes (one second's worth; any byte when
	// BodyMinRate is 0) in this long is cut as a late one is (ErrBodyReadTimeout, the
	// connection closed after the response). A client that sends most of a large body at once
	// and then stops earns no more than this. As with BodyReadTimeout, only the time the
	// handler waits for the client counts. 0: no bound.
	BodyStallTimeout time.Duration
	// MaxPendingBodyBytes bounds the bytes of the request bodies being received at once: from
	// a body's first read to its end (or its request's end). A body counts as the bytes read
	// from it plus what it may take next: its announced length at its first read when that is
	// at most 1 MiB (what a handler may allocate for it at once), else steps of 256 KiB ahead
	// of its bytes. A read that finds no room waits up to a second for it, in turn; then it
	// returns ErrBodyMemory. 0: no bound.
	MaxPendingBodyBytes int64
	// MaxConns bounds the open client connections. A connection accepted at the cap closes
	// connections that wait for a request (a 64th of MaxConns at once, 1 to 16), the
	// longest-idle kept-alive ones first, then the oldest of those that have sent nothing for
	// a second (or a quarter of ReadHeaderTimeout if less: a younger one's request is likely
	// on its way), but none with bytes on their way; when none waits, the new connection is
	// answered 503 (Retry-After: 1) and closed. A connection whose client has sent anything
	// of a request, read or not (over TLS, its handshake too), is not one that waits: its
	// head is on its way, and closing it would lose the request. ReadHeaderTimeout bounds it
	// instead, from the accept for a new connection (a client that trickles a head holds its
	// connection that long, as it could on a kept-alive one; set ReadHeaderTimeout with
	// MaxConns: with none, nothing bounds it). A kept-alive connection is parted from rather
	// than closed at once while a lingering slot is free (MaxLingering): counted out, it stays
	// open for half a second (up to a janitor's round more), so that a request its client
	// sent as it was taken, not knowing, is answered, with Connection: close, rather than met
	// by the close (EOF or a reset, which Go's client does not retry for a POST); one that
	// sends nothing is closed then. 0: no bound.
	MaxConns int
	// MaxLingering bounds the connections refused at MaxConns that wait at once for their
	// request before their 503, each holding an open file and a goroutine for up to two
	// seconds (beyond it a refusal is written at once, which some clients take for a broken
	// connection), together with the kept-alive connections closed to make room that stay
	// open meanwhile (MaxConns; beyond it they are closed at once): a process short of open
	// files gives what its caps leave it. The bound is a 32nd of MaxConns, 64 to 128, and at
	// most MaxLingering when set; negative: none wait.
	MaxLingering int
	// CloseUnauthorized ends the connection of a request answered 401: a client without a
	// valid credential holds no kept-alive connection, and tries one credential per
	// connection.
	CloseUnauthorized bool
	// WriteStallTimeout bounds how long a write to the client waits while the client takes
	// none of the answer: a client that stops reading (its window closed), and so holds a
	// write for longer, has its connection closed (abortively), and the handler's writes fail
	// from then on. On Linux the client's progress is the kernel's (sendIdle): a client that
	// reads, however slowly (enough per bound to reopen its window: Linux reopens a closed
	// window once the client frees about a sixteenth of its receive buffer, at least a
	// segment), is not cut, though a write to it waits far longer; elsewhere a write that
	// waits this long is cut. A stream the client keeps reading is never cut, however long it
	// runs. 0: no bound.
	WriteStallTimeout time.Duration
	// WatchAfter is how long a request runs before its connection is watched for the client
	// going away (give or take half of it while requests are in flight; a request that starts
	// after a quiet stretch waits for the janitor's next round, up to a second, or a quarter of
	// the shortest timeout, away); 0: DefaultWatchAfter.
	WatchAfter time.Duration
	// ErrorBody, when set, makes the bodies of the errors the server answers itself (a
	// malformed request, a head too large): it returns the content type and the body.
	ErrorBody func(status int, msg string) (contentType string, body []byte)
	// ErrorLog receives accept errors and handler panics; nil: the log package's logger.
	ErrorLog *log.Logger
	// Logger receives a DEBUG line for each request refused before its handler (Refusal: a
	// malformed or oversized head, one too slow, HTTP/2's preface), which Stats counts; nil:
	// none.
	Logger *slog.Logger
	// HTTP2, when set, receives the connections that open with HTTP/2's client preface (h2c
	// with prior knowledge): the server hands each over, the preface included, and serves it no
	// more. Without it such a connection gets HTTP/2's refusal, a GOAWAY with HTTP_1_1_REQUIRED
	// (then its close), which HTTP/2 clients report. It is called on the connection's goroutine
	// and must not block: it should pass the connection on (to a listener whose Accept is
	// waiting) and return. Until it returns, the connection is still this server's, reading
	// its first request's head (the preface): ReadHeaderTimeout, from the accept, may close
	// it; MaxConns and Shutdown leave it, as it has sent something.
	HTTP2 func(net.Conn)
	// BaseContext, as net/http's, returns the context the requests that come through ln
	// derive theirs from, so that ending it ends them, those in flight and those to come;
	// called once per Serve. nil: context.Background().
	BaseContext func(ln net.Listener) context.Context

	// noKeepAlive is set by SetKeepAlivesEnabled(false): every answer whose head goes out
	// from then on closes its connection.
	noKeepAlive atomic.Bool

	mu        sync.Mutex
	listeners map[net.Listener]struct{}
	conns     map[*srvConn]struct{}
	done      bool
	shutdown  atomic.Bool
	wg        sync.WaitGroup // connection goroutines and the janitor
	// evicting counts the connections closed to make room (MaxConns) that are still in conns;
	// under mu.
	evicting int
	evicted  atomic.Uint64
	refused  atomic.Uint64
	refusals refuser
	// refusedBy counts the requests refused before their handler, by reason.
	refusedBy refusalCount
	// budget bounds the bodies being received (MaxPendingBodyBytes); nil: no bound.
	budget    *budget
	limitOnce sync.Once

	janitorOn bool         // under mu
	quiet     atomic.Bool  // the janitor sleeps long (its slow period)
	started   atomic.Int64 // requests started since the janitor's last round
	frequent  atomic.Bool  // requests came at least one per fast round over its last quietTicks
	inFlight  atomic.Int64 // requests being served
	clock     atomic.Pointer[janitorClock]
	rounds    atomic.Int64 // the janitor's rounds, for tests
	nudge     chan struct{}
	// idleHook, when set (tests), runs on a connection's goroutine each time the connection
	// turns idle, before it waits for the next request.
	idleHook func()
	// turnHook, when set (tests), runs on a connection's goroutine right after serve has moved
	// the connection to st (stateIdle, or stateHead as the next request arrives).
	turnHook func(st int32)
	// headHook, when set (tests), runs on a connection's goroutine once a request's head has
	// been read, before the connection turns active.
	headHook func()
}

// base is the parent context of every request that comes through ln: BaseContext's, with
// http.ServerContextKey (this *Server, not an *http.Server) because httputil.ReverseProxy
// reads that key to abort a handler, rather than log, when copying a response fails: the
// client went away.
func (s *Server) base(ln net.Listener) context.Context {
	ctx := context.Background()
	if s.BaseContext != nil {
		if ctx = s.BaseContext(ln); ctx == nil {
			panic("h1: BaseContext returned a nil context")
		}
	}
	return context.WithValue(ctx, http.ServerContextKey, s)
}

// SetKeepAlivesEnabled(false) makes every answer whose head goes out from then on close its
// connection (Connection: close), for a graceful shutdown: clients open new connections, which
// their load balancer sends elsewhere, rather than send their next request here. An answer
// whose head went out before cannot be taken back: its connection stays open for the next
// request, answered with Connection: close, or until Shutdown closes it while it waits (where
// net/http's method of that name closes the idle connections at once, under a client that
// may be sending on one just then). true undoes it.
func (s *Server) SetKeepAlivesEnabled(v bool) { s.noKeepAlive.Store(!v) }

// ErrServerClosed is http.ErrServerClosed: Serve returns it after Shutdown or Close.
var ErrServerClosed = http.ErrServerClosed

// ErrBodyReadTimeout is what reading a request body returns once the client has taken longer
// than the body timeout to send it. It wraps os.ErrDeadlineExceeded, as net/http's timeout
// errors do, so that a handler can answer 408 to either server.
var ErrBodyReadTimeout = fmt.Errorf("h1: request body not received in time: %w", os.ErrDeadlineExceeded)

// Serve accepts connections on ln until Shutdown or Close, and returns ErrServerClosed then.
func (s *Server) Serve(ln net.Listener) error {
	s.limitOnce.Do(s.initLimits)
	if !s.track(ln) {
		return ErrServerClosed
	}
	defer s.untrack(ln)
	base := s.base(ln)
	var delay time.Duration
	for {
		rwc, err := ln.Accept()
		if err != nil {
			if s.shutdown.Load() {
				return ErrServerClosed
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, syscall.EMFILE) {
				delay = min(max(2*delay, 5*time.Millisecond), time.Second)
				s.logf("h1: accept error: %v; retrying in %v", err, delay)
				time.Sleep(delay)
				continue
			}
			return err
		}
		delay = 0
		rwc = wrapConn(rwc) // reads and writes without waking the runtime's sysmon (rawconn_linux.go)
		c, full := s.newConn(rwc, base)
		switch {
		case full:
			s.refusals.refuse(rwc, maxLingering(s.MaxConns, s.MaxLingering), s.ErrorBody)
			continue
		case c == nil:
			rwc.Close()
			return ErrServerClosed
		}
		go c.serve()
	}
}

func (s *Server) track(ln net.Listener) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done {
		return false
	}
	if s.listeners == nil {
		s.listeners = make(map[net.Listener]struct{})
	}
	s.listeners[ln] = struct{}{}
	return true
}

func (s *Server) untrack(ln net.Listener) {
	s.mu.Lock()
	delete(s.listeners, ln)
	s.mu.Unlock()
}

func (s *Server) initLimits() { s.budget = newBudget(s.MaxPendingBodyBytes) }

// Stats returns the server's counts of connections and body bytes.
func (s *Server) Stats() Stats {
	s.limitOnce.Do(s.initLimits)
	s.mu.Lock()
	n := len(s.conns) - s.evicting
	s.mu.Unlock()
	st := Stats{Conns: n, ConnsEvicted: s.evicted.Load(), ConnsRefused: s.refused.Load(), BodyBytes: s.budget.held(),
		Refused: s.refusedBy.load()}
	if s.budget != nil {
		st.BodiesRefused = s.budget.refused.Load()
	}
	return st
}

// newConn registers a connection, whose requests' contexts derive from base; nil when the
// server is closed, or full when MaxConns is reached and no connection waiting for a request
// could be closed to make room.
func (s *Server) newConn(rwc net.Conn, base context.Context) (c *srvConn, full bool) {
	s.mu.Lock()
	var victims []*srvConn
	defer func() {
		s.mu.Unlock()
		if len(victims) > 0 {
			// Outside the lock, and off the accept loop (see closeEvicted).
			go func() {
				for _, v := range victims {
					_ = v.rwc.Close()
				}
			}()
		}
	}()
	if s.done {
		return nil, false
	}
	if s.conns == nil {
		s.conns = make(map[*srvConn]struct{})
	}
	if s.MaxConns > 0 && len(s.conns)-s.evicting >= s.MaxConns {
		var made int
		if victims, made = s.evictWaiting(); made == 0 {
			s.refused.Add(1)
			return nil, true
		}
	}
	c = &srvConn{s: s, base: base, rwc: rwc, remote: rwc.RemoteAddr().String()}
	if _, ok := rwc.(*tls.Conn); ok {
		c.heardFrom.Store(-1) // until serve's handshake ends
	}
	c.setState(stateNew)
	s.conns[c] = struct{}{}
	s.wg.Add(1)
	if !s.janitorOn {
		s.janitorOn = true
		if s.nudge == nil {
			s.nudge = make(chan struct{}, 1)
		}
		s.wg.Add(1)
		go s.janitor()
	}
	return c, false
}

// evictWaiting takes up to evictBatch(MaxConns) of the connections waiting for a request out
// of their service, the longest-idle kept-alive ones first, then the oldest of those that
// have sent nothing for freshGrace, and reports how many it took. It returns those to
// close at once, for the caller to close once it has let go of s.mu; a kept-alive one it
// parts from instead while a lingering slot is free (see stateParting): left open for
// idleGrace, it serves a request its client sent as it was taken, with Connection: close,
// and the janitor closes it otherwise. A connection with bytes on their way (a request
// arriving) is left, as the janitor leaves it (closeIdle); so is a younger new one, whose
// request is likely on its way: the newcomer is refused instead (a 503 it can retry, where
// a POST's client that saw its connection close could not). A new connection whose client
// has sent anything is left too: its first bytes read, it is reading a head (stateHead,
// connReader.Read), which no eviction takes; sent but not read yet, or read by crypto/tls in
// a record not yet whole, heard tells, once: such a connection is no candidate from then on,
// so that a few of them cannot hide the others (only the oldest are looked at). A TLS
// handshake is not a request on its way: a connection that has sent nothing beyond it (one
// opened ahead of need) gives way as a plain one that sent nothing does. The caller holds
// s.mu.
func (s *Server) evictWaiting() (closeNow []*srvConn, made int) {
	o := oldest[*srvConn]{n: evictBatch(s.MaxConns)}
	o.keep = make([]candidate[*srvConn], 0, o.n)
	young := time.Now().UnixNano() - int64(freshGrace(s.ReadHeaderTimeout))
	for c := range s.conns {
		if c.evicted {
			continue
		}
		switch c.state.Load() {
		case stateIdle:
			o.offer(c, false, c.since.Load())
		case stateNew:
			if since := c.since.Load(); since <= young && !c.heard {
				o.offer(c, true, since)
			}
		}
	}
	limit := maxLingering(s.MaxConns, s.MaxLingering)
	for _, x := range o.keep {
		c := x.c
		if x.fresh && c.hasSent() || !x.fresh && pending(c.rwc) {
			continue
		}
		if !x.fresh && s.refusals.take(limit) {
			// since first, as serve stores it: a sweep that sees stateParting times it from
			// now. Should the swap fail (the request arrived), the connection's own since,
			// stored an instant before, is replaced by one an instant later: no harm.
			c.since.Store(time.Now().UnixNano())
			if !c.state.CompareAndSwap(stateIdle, stateParting) {
				s.refusals.lingering.Add(-1)
				continue
			}
			c.parting = true
		} else {
			from := stateIdle
			if x.fresh {
				from = stateNew
			}
			// The connection's goroutine leaves these states the same way (serve, activate):
			// whichever comes first has it.
			if !c.state.CompareAndSwap(from, stateClosed) {
				continue
			}
			closeNow = append(closeNow, c)
		}
		c.evicted = true
		s.evicting++
		made++
	}
	s.evicted.Add(uint64(made))
	return closeNow, made
}

func (s *Server) watchAfter() time.Duration {
	if s.WatchAfter > 0 {
		return s.WatchAfter
	}
	return DefaultWatchAfter
}

// janitor runs while the server has connections. Every half WatchAfter while requests are in
// flight, and every slow period otherwise, it closes connections past their header or idle
// timeout, interrupts body reads and closes writes past theirs, and starts the watch of
// requests that have run for WatchAfter.
//
// A request that starts arms nothing: the janitor finds it at its next round, and from then
// on, while requests are in flight, runs its rounds every half WatchAfter. A nudge or a timer
// per request would cost the idle process a wake-up per request even when the request ends
// first: the nudge's, and the timer's, since Go leaves a timer's first deadline in its P's
// heap when the timer is reset to a later one or stopped, and the netpoller's thread wakes at
// it (docs/results.md, "Ninth round"). So a request that starts while the janitor sleeps
// long is watched from the janitor's next round, up to the slow period late. The slow period
// is 1 s at most, and at most a quarter of each timeout, so that none runs out before the
// janitor has found the request it times.
func (s *Server) janitor() {
	fast := max(s.watchAfter()/2, time.Millisecond)
	slow := time.Second
	for _, d := range []time.Duration{s.ReadHeaderTimeout / 4, s.IdleTimeout / 4, s.BodyReadTimeout / 4,
		s.BodyStallTimeout / 4, s.WriteStallTimeout / 4} {
		if d > 0 && d < slow {
			slow = d
		}
	}
	slow = max(slow, fast)
	defer s.wg.Done()
	timer := time.NewTimer(fast)
	defer timer.Stop()
	clock := &janitorClock{timer: timer, slow: slow}
	s.clock.Store(clock)
	defer s.clock.CompareAndSwap(clock, nil)
	quiet := 0 // rounds in succession without a request in flight
	// Requests started in each of the last quietTicks rounds and those rounds' lengths, and
	// their sums. At least one request per fast period over them (frequent), and the janitor
	// keeps its fast rounds until quietTicks rounds in succession found no request in flight:
	// the process is awake for the requests anyway, and the watches start on time. Fewer, and
	// it sleeps long as soon as none is in flight.
	var started, lengths [quietTicks]int64
	var recent, span int64
	last := time.Now().UnixNano()
	for round := 0; ; round++ {
		select {
		case <-timer.C:
		case <-s.nudge:
		}
		now := time.Now().UnixNano()
		n, d := s.started.Swap(0), now-last
		last = now
		i := round % quietTicks
		recent += n - started[i]
		span += d - lengths[i]
		started[i], lengths[i] = n, d
		frequent := recent*int64(fast) >= span
		s.frequent.Store(frequent)
		sleepy := quiet >= quietTicks || !frequent
		if sleepy {
			s.quiet.Store(true)
		}
		s.mu.Lock()
		if len(s.conns) == 0 {
			s.janitorOn = false
			s.quiet.Store(false)
			s.mu.Unlock()
			return
		}
		// A connection still active after its request ended (requestEnded comes first) is
		// not a request in flight: inFlight says.
		busy, expired, stalled := s.sweep(now)
		busy = busy && s.inFlight.Load() > 0
		s.mu.Unlock()
		// The kernel is asked about stalled writes off the lock: two system calls each.
		expired = append(expired, s.judgeStalls(stalled, now)...)
		if len(expired) > 0 {
			// Off the lock, which the accept loop needs, and off this goroutine, whose other
			// timeouts should not wait: one goroutine for the round's batch (closeConns).
			go closeConns(expired)
		}
		wait := fast
		if busy {
			quiet = 0
			s.quiet.Store(false)
		} else if quiet++; sleepy {
			wait = slow
		}
		s.rounds.Add(1)
		timer.Reset(wait)
	}
}

// sweep takes the connections past their timeouts out of service and returns them, for the
// caller to close once it has let go of s.mu; it interrupts body reads past their timeouts,
// starts due watches, and reports whether a request is in flight. The writes under way past
// WriteStallTimeout it returns in stalled, for the caller to judge (judgeStalls) off s.mu:
// asking the kernel costs two system calls a connection, and the accept loop needs the lock.
// The caller holds s.mu.
func (s *Server) sweep(now int64) (busy bool, expired []net.Conn, stalled []stalledWrite) {
	head, idle, watch := int64(s.ReadHeaderTimeout), int64(s.IdleTimeout), int64(s.watchAfter())
	stall, body, bodyStall := int64(s.WriteStallTimeout), int64(s.BodyReadTimeout), int64(s.BodyStallTimeout)
	if idle == 0 {
		idle = head
	}
	for c := range s.conns {
		if c.expired.Load() {
			continue // expired at an earlier round, maybe still closing
		}
		st := c.state.Load()
		if w := c.writeSince.Load(); stall > 0 && w != 0 && now-w > stall && st != stateDetached {
			stalled = append(stalled, stalledWrite{c, w})
		}
		age := now - c.since.Load()
		switch st {
		case stateNew, stateHead:
			if head > 0 && age > head && c.takeWaiting(st) {
				c.headExpired.Store(st == stateHead)
				c.expired.Store(true)
				expired = append(expired, c.rwc)
			}
		case stateIdle:
			if idle > 0 && age > idle && c.takeIdle(stateIdle) {
				c.expired.Store(true)
				expired = append(expired, c.rwc)
			}
		case stateParting:
			if age >= int64(idleGrace) && c.takeIdle(stateParting) {
				c.expired.Store(true)
				expired = append(expired, c.rwc)
			}
		case stateActive:
			busy = true
			if c.bodyReading.Load() && (body > 0 && now > c.bodyDeadline(body, s.BodyMinRate) ||
				bodyStall > 0 && now-c.bodyProgress.Load() > bodyStall) {
				c.expireBody()
			}
			if age >= watch && !c.watchAsked.Load() {
				c.watchAsked.Store(true)
				c.watchDue()
			}
		}
	}
	return busy, expired, stalled
}

// stalledWrite is a connection whose write under way began, or last saw its client take
// bytes, at since, longer ago than WriteStallTimeout (sweep).
type stalledWrite struct {
	c     *srvConn
	since int64
}

// judgeStalls asks the kernel whether the clients of ws took bytes within WriteStallTimeout
// of now, and returns the connections of those that did not, taken out of service, for the
// caller to close (abortively). It runs without s.mu, on the janitor's goroutine only (each
// connection's sendProgress is the janitor's).
func (s *Server) judgeStalls(ws []stalledWrite, now int64) (expired []net.Conn) {
	stall := int64(s.WriteStallTimeout)
	for _, x := range ws {
		c := x.c
		if idle, ok := sendIdle(c.rwc, &c.sent); ok && int64(idle) < stall {
			// The client still takes the answer, only slower than it is written (the write
			// waits for a third of the send buffer to drain), or has taken all the kernel
			// held and the writer's goroutine is late (sendIdle). The write is timed again
			// from the client's last progress (unless it ended meanwhile).
			c.writeSince.CompareAndSwap(x.since, now-int64(idle))
			continue
		}
		if c.writeSince.Load() != x.since || !c.expired.CompareAndSwap(false, true) {
			continue // the write ended meanwhile, or the connection expired otherwise
		}
		// The client stopped reading. The write under way fails once the connection is
		// closed; should it end first, serve sees expired and takes no other request. The
		// close is abortive: what the kernel holds for a client that does not read goes.
		expired = append(expired, abortive{c.rwc})
	}
	return expired
}

// closeConns closes cs in turn. The servers' locks are not held: a TLS connection's Close
// sends close_notify first, with a write deadline of 5 s (crypto/tls), and a client that does
// not read holds it that long.
func closeConns(cs []net.Conn) {
	for _, c := range cs {
		_ = c.Close()
	}
}

// setAbortive makes the close of nc, whoever closes it, abortive: SO_LINGER 0 on the TCP
// connection under nc (through this package's wrappers and TLS), so that the close sends a
// reset and drops what the kernel still holds to send, rather than a FIN queued behind it. It is
// for a connection closed because its client stopped reading (a write stalled past its bound):
// closed gracefully, its unsent bytes stay in the kernel, the socket orphaned in FIN-WAIT-1,
// until the client reads them or goes away (20 never-read streams held 81 MB), and what they
// are is the truncated answer to a request that failed. It returns the connection under nc
// whose linger it set, nil when it found none (then the close stays graceful).
func setAbortive(nc net.Conn) net.Conn {
	for range 5 { // the wrappers: framedConn, TLS, stallConn, rawConn
		switch c := nc.(type) {
		case interface{ SetLinger(sec int) error }:
			if c.SetLinger(0) != nil {
				return nil
			}
			return nc
		case interface{ NetConn() net.Conn }:
			nc = c.NetConn()
		default:
			return nil
		}
	}
	return nil
}

// abortive is a connection that the janitor closes because a write to it stalled: its Close
// is abortive (setAbortive). Over TLS it closes the TCP connection under it without the
// close_notify that crypto/tls would send first: a client that does not read would hold it
// for the 5 s of that write's deadline, for nothing.
type abortive struct{ net.Conn }

func (a abortive) Close() error {
	if tc := setAbortive(a.Conn); tc != nil {
		return tc.Close()
	}
	return a.Conn.Close()
}

// janitorClock is the running janitor's timer, and the long sleep of a quiet janitor.
type janitorClock struct {
	timer *time.Timer
	slow  time.Duration
}

// requestStarted counts the request in; the janitor finds it at its next round.
func (s *Server) requestStarted() {
	s.inFlight.Add(1)
	s.started.Add(1)
}

// requestEnded puts a janitor that runs its fast rounds to sleep long as soon as the last
// request in flight ends, when requests are rare (fewer than one per fast round): the round it
// would otherwise run half a WatchAfter later only to find nothing in flight is, at a few
// requests a second, one more wake-up of an otherwise idle process (docs/results.md, "Sixth
// round"). A janitor asleep already is left as it is: moving its deadline at every request
// would put off its rounds for as long as requests come more often than its slow period.
func (s *Server) requestEnded() {
	if s.inFlight.Add(-1) != 0 || s.frequent.Load() {
		return
	}
	clock := s.clock.Load()
	if clock == nil || !s.quiet.CompareAndSwap(false, true) {
		return
	}
	clock.timer.Reset(clock.slow)
}

func (s *Server) forget(c *srvConn) {
	s.mu.Lock()
	delete(s.conns, c)
	if c.evicted {
		s.evicting--
	}
	if c.parting {
		s.refusals.lingering.Add(-1)
	}
	if s.done && len(s.conns) == 0 {
		s.wakeJanitor() // to leave now
	}
	s.mu.Unlock()
	s.wg.Done()
}

func (s *Server) wakeJanitor() {
	select {
	case s.nudge <- struct{}{}:
	default:
	}
}

// closeListeners stops accepting; the caller holds s.mu.
func (s *Server) closeListeners() {
	s.done = true
	s.shutdown.Store(true)
	for ln := range s.listeners {
		_ = ln.Close()
	}
	s.wakeJanitor()
}

// Shutdown stops accepting, closes idle connections, and waits for the others to finish their
// request and close, or for ctx to end (then it returns ctx's error and leaves them be: call
// Close). Every answer whose head goes out from then on closes its connection. A connection
// whose last answer's head went out before (a stream under way when the shutdown began) could
// not be told so: it stays open for idleGrace after that answer, and a request that arrives
// on it meanwhile is answered, with Connection: close, rather than met by the close.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.closeListeners()
	s.mu.Unlock()
	wait := time.Millisecond
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		if s.closeIdle() {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-timer.C:
		}
		wait = min(2*wait, 100*time.Millisecond)
		timer.Reset(wait)
	}
}

// closeIdle closes the connections waiting for a request (idle ones idleGrace after their last
// answer, or after they were parted from, new ones that have sent nothing for 5 s) and
// reports whether none is left. A new connection whose client has sent anything is left to
// its header timeout (see evictWaiting), as one reading its next request's head is. It takes
// them out of service under s.mu and closes them once it has let go of it (closeConns).
func (s *Server) closeIdle() bool {
	s.mu.Lock()
	now := time.Now().UnixNano()
	var idle []net.Conn
	for c := range s.conns {
		var take bool
		switch st := c.state.Load(); st {
		case stateIdle, stateParting:
			take = now-c.since.Load() >= int64(idleGrace) && c.takeIdle(st)
		case stateNew:
			take = now-c.since.Load() > int64(5*time.Second) && !c.hasSent() && c.takeWaiting(stateNew)
		}
		if take {
			idle = append(idle, c.rwc)
		}
	}
	none := len(s.conns) == 0
	s.mu.Unlock()
	closeConns(idle)
	return none
}

// Close stops accepting and closes every connection at once, requests in flight included
// (hijacked ones excepted: they are their handlers'). The connections are taken out of
// service under s.mu and closed once it has let go of it (closeConns).
func (s *Server) Close() error {
	s.mu.Lock()
	s.closeListeners()
	all := make([]net.Conn, 0, len(s.conns))
	for c := range s.conns {
		if c.takeAll() {
			all = append(all, c.rwc)
		}
	}
	s.mu.Unlock()
	closeConns(all)
	return nil
}

func (s *Server) logf(format string, args ...any) {
	if s.ErrorLog != nil {
		s.ErrorLog.Printf(format, args...)
	} else {
		log.Printf(format, args...)
	}
}

// Connection states.
const (
	stateNew      int32 = iota // waiting for its first request: nothing of it read yet
	stateHead                  // reading a request's head (since: the accept, for the first)
	stateActive                // serving a request
	stateIdle                  // waiting for the next request
	stateParting               // idle, counted out at MaxConns, open for a request on its way
	stateDetached              // hijacked by its handler: not the server's to time or close
	stateClosed                // taken out of service (closed, or about to be) by the server
)

// srvConn is one client connection.
type srvConn struct {
	s      *Server
	base   context.Context // its requests' parent (Server.base)
	rwc    net.Conn
	remote string
	state  atomic.Int32
	since  atomic.Int64 // when the state last changed, Unix ns
	// expired is set when the janitor closes the connection for a timeout (it may close it a
	// little later, off its lock: see sweep); headExpired with it when that timeout is
	// ReadHeaderTimeout's, a head begun and not ended (serveOne counts it).
	expired     atomic.Bool
	headExpired atomic.Bool
	// writeSince is when the write to the client under way began, or when its client last
	// took bytes of it as the janitor found (sweep), Unix ns; 0: none.
	writeSince atomic.Int64
	// sent is the client's progress on the writes, as the janitor last asked (judgeStalls).
	sent sendProgress
	// The request body's timing: when the handler first read it (Unix ns; 0: not yet), the
	// bytes read, whether a read waits on the client now, and whether the janitor ended it.
	bodyStart   atomic.Int64
	bodyRead    atomic.Int64
	bodyReading atomic.Bool
	bodyExpired atomic.Bool
	// bodyProgress is when the body last made progress (BodyStallTimeout), Unix ns, moved on by
	// the time the handler spent away from the body.
	bodyProgress atomic.Int64
	// evicted: closed to make room for a new connection (MaxConns); parting: left open
	// meanwhile, holding a lingering slot (stateParting); heard: new, its client has sent
	// something (hasSent). Under s.mu.
	evicted, parting, heard bool
	// heardFrom is what crypto/tls had read (takenSoFar) when the TLS handshake ended: what
	// heard counts beyond (hasSent); -1 until then; 0 on a plain connection.
	heardFrom atomic.Int64
	// lastRequest: the request being read is the connection's last (it arrived as the
	// connection was parted from); the connection's goroutine's.
	lastRequest bool
	// scan checks the head being read while scanning is set (see headScan).
	scan     headScan
	scanning bool
	// watchAsked is set when the janitor has asked for the request's watch.
	watchAsked atomic.Bool
	cr         connReader
	br         *bufio.Reader
	bw         *bufio.Writer
	werr       error  // the first error writing to the client
	hold       []byte // the response body held before its headers, reused
	// detached is set when the connection left this server (hijacked, or handed to HTTP2): it is
	// neither closed nor its buffers reused here.
	detached bool

	// The watch: after WatchAfter, once the request body has been read, a goroutine reads the
	// connection; an error there (the client went away) cancels the request.
	mu        sync.Mutex
	active    bool // a request is being served
	bodyDone  bool // its body has been read to the end
	due       bool // WatchAfter passed before the body was read
	watching  bool
	aborting  bool // the watch is being stopped: its read error is ours
	gone      bool // the watch saw the client go away
	cancel    context.CancelFunc
	watchDone chan struct{}
}

// The connections a server closes (for a timeout, at Shutdown or Close) are taken out of
// service first, under s.mu, and closed once the lock is let go: a Close may block (see
// closeConns). Taken out, a connection stays out: its goroutine moves it on from the state
// it was taken in with a compare-and-swap too (serve, activate, Hijack), so whichever comes
// first has it, and a request that arrives before the close is not served.

// takeIdle takes the connection out of service if it is still idle (st: stateIdle, or
// stateParting) and no byte of a request is waiting to be read, and reports whether it did.
// A request that arrived as the connection's time ran out is served: its client, which took
// the connection for open, could not tell a close now from one its request caused, and would
// have to fail it (the request's bytes wait in the socket until the connection's goroutine,
// woken by them, is scheduled: under load, milliseconds). Only the few microseconds between
// the check and the compare-and-swap are left to such a race.
func (c *srvConn) takeIdle(st int32) bool {
	return !pending(c.rwc) && c.state.CompareAndSwap(st, stateClosed)
}

// takeWaiting takes the connection out of service if it is still in st, waiting for a
// request's head (stateNew or stateHead), and reports whether it did: one whose head was
// read meanwhile is served.
func (c *srvConn) takeWaiting(st int32) bool { return c.state.CompareAndSwap(st, stateClosed) }

// hasSent reports whether the client of a new connection has sent it anything (heard), and
// remembers a yes, which stays true. The caller holds s.mu.
func (c *srvConn) hasSent() bool {
	if !c.heard {
		c.heard = heard(c.rwc, c.heardFrom.Load())
	}
	return c.heard
}

// takeAll takes the connection out of service whatever it is doing, for Close, and reports
// whether it is to be closed: not if its handler hijacked it.
func (c *srvConn) takeAll() bool {
	for {
		switch st := c.state.Load(); st {
		case stateDetached:
			return false
		case stateClosed:
			return true // closed already, or being closed: once more does no harm
		default:
			if c.state.CompareAndSwap(st, stateClosed) {
				return true
			}
		}
	}
}

// bodyDeadline is when the request body's read time runs out, Unix ns.
func (c *srvConn) bodyDeadline(timeout, minRate int64) int64 {
	d := c.bodyStart.Load() + timeout
	if minRate > 0 {
		d += int64(float64(c.bodyRead.Load()) / float64(minRate) * float64(time.Second))
	}
	return d
}

// expireBody interrupts the handler's wait for a body that is too slow: its read returns
// ErrBodyReadTimeout, and the connection is closed after the response. The connection stays
// open for now so that the handler can answer (408).
func (c *srvConn) expireBody() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.bodyDone || c.watching {
		return // the body ended meanwhile: the read deadline is the watch's now
	}
	c.bodyExpired.Store(true)
	_ = c.rwc.SetReadDeadline(aLongTimeAgo)
}

// connWriter is what the connection's bufio.Writer writes to: it tells the janitor how long
// the write under way has been waiting for the client.
type connWriter struct{ c *srvConn }

func (w connWriter) Write(p []byte) (int, error) {
	c := w.c
	if c.s.WriteStallTimeout <= 0 {
		return c.rwc.Write(p)
	}
	c.writeSince.Store(time.Now().UnixNano())
	n, err := c.rwc.Write(p)
	c.writeSince.Store(0)
	return n, err
}

// connReader is what the connection's bufio.Reader reads: it bounds a request's head, hands
// back the byte the watch may have read, and moves a new connection on at its first bytes.
type connReader struct {
	c       *srvConn
	remain  int64 // bytes the head may still take; math.MaxInt64 while a body is read
	hasByte bool
	byteBuf [1]byte
	// first: nothing read from the connection yet (begun does the rest).
	first bool
}

func (r *connReader) Read(p []byte) (int, error) {
	if r.remain <= 0 {
		return 0, errHeadTooLarge
	}
	if len(p) == 0 {
		return 0, nil
	}
	if int64(len(p)) > r.remain {
		p = p[:r.remain]
	}
	if r.hasByte {
		p[0] = r.byteBuf[0]
		r.hasByte = false
		r.remain--
		r.c.scanHead(p[:1])
		return 1, nil
	}
	n, err := r.c.rwc.Read(p)
	r.remain -= int64(n)
	if n > 0 {
		if r.first {
			r.first = false
			r.c.begun()
		}
		r.c.scanHead(p[:n])
	}
	return n, err
}

// begun moves a new connection to stateHead once its client's first bytes are read: its
// request is arriving, and it is no longer one that MaxConns or Shutdown may close as waiting
// (evictWaiting, closeIdle). since is left as it is, so that the header timeout still counts
// from the accept (sweep): a client that trickles its head gains no time by it. A connection
// taken out of service meanwhile stays out: its client's bytes came in the instant between an
// eviction's check (heard, which counts bytes read as well as waiting where the kernel tells)
// and its swap, a race with the client that takeIdle has too.
func (c *srvConn) begun() { c.state.CompareAndSwap(stateNew, stateHead) }

// scanHead passes the bytes just read to the head's check while the head is being read.
func (c *srvConn) scanHead(p []byte) {
	if c.scanning {
		c.scan.scan(p)
		c.scanning = !c.scan.done()
	}
}

var errHeadTooLarge = errors.New("request head too large")

const unbounded = 1<<63 - 1

var (
	readerPool = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 8<<10) }}
	writerPool = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, 4<<10) }}
)

// aLongTimeAgo is a deadline in the past: it interrupts a blocked Read at once.
var aLongTimeAgo = time.Unix(1, 0)

func (c *srvConn) setState(st int32) {
	c.state.Store(st)
	c.since.Store(time.Now().UnixNano())
}

func (c *srvConn) serve() {
	s := c.s
	c.cr.c = c
	c.cr.remain = unbounded
	c.cr.first = true
	c.br = readerPool.Get().(*bufio.Reader)
	c.br.Reset(&c.cr)
	c.bw = writerPool.Get().(*bufio.Writer)
	c.bw.Reset(connWriter{c})
	defer func() {
		if v := recover(); v != nil && v != http.ErrAbortHandler {
			buf := make([]byte, 64<<10)
			buf = buf[:runtime.Stack(buf, false)]
			s.logf("h1: panic serving %s: %v\n%s", c.remote, v, buf)
		}
		c.mu.Lock()
		c.active = false // after a panic: no watch may start any more
		cancel := c.cancel
		c.mu.Unlock()
		c.stopWatch()
		if cancel != nil {
			cancel()
		}
		if !c.detached {
			if isTimeout(c.werr) {
				// A write ran past WriteTimeout: the client stopped reading, or reads too
				// slowly for the answer to end in time (abortive).
				_ = abortive{c.rwc}.Close()
			}
			_ = c.rwc.Close()
			c.br.Reset(nil)
			readerPool.Put(c.br)
			c.bw.Reset(nil)
			writerPool.Put(c.bw)
		}
		s.forget(c)
	}()
	if tc, ok := c.rwc.(*tls.Conn); ok {
		// The handshake first, on its own, to note what crypto/tls had read at its end: what
		// comes beyond is a request on its way (hasSent), the handshake's bytes are not (a
		// connection opened ahead of need, that sent nothing more, gives way at MaxConns and is
		// closed by Shutdown, as a plain one is). The first read would have run it: one that
		// failed fails that read with the same error (crypto/tls keeps it).
		if tc.Handshake() == nil {
			c.heardFrom.Store(takenSoFar(tc))
		}
	}
	if s.HTTP2 != nil && c.handOffHTTP2() {
		return
	}
	for n := 0; ; n++ {
		if n > 0 {
			// Taken out of service while its request was served (Close, a write stall),
			// the connection takes no other. During a shutdown too: the answer just sent kept
			// the connection (its head went out before the shutdown), and its client may be
			// sending the next request now; Shutdown closes the connection idleGrace later
			// (closeIdle).
			//
			// since is stored before the state that it times is published: closeIdle, sweep
			// and evictWaiting load the state first, then since, so one that sees the new
			// state sees its since, never the request's start (which would close at once a
			// connection whose request lasted longer than idleGrace or the idle timeout). The
			// early store is harmless while the connection is still active: its request is
			// over, and since only times the watch then (sweep).
			c.since.Store(time.Now().UnixNano())
			if c.expired.Load() || !c.state.CompareAndSwap(stateActive, stateIdle) {
				return
			}
			if c.s.turnHook != nil {
				c.s.turnHook(stateIdle)
			}
			if c.s.idleHook != nil {
				c.s.idleHook()
			}
			if c.br.Buffered() == 0 && !c.cr.hasByte {
				if _, err := c.br.Peek(1); err != nil {
					return // closed, timed out or reset while idle
				}
			}
			// Here too, since first: a sweep that saw stateHead with the idle time's since
			// would take a connection idle for longer than ReadHeaderTimeout for one too slow
			// with its head, and close it as its request arrives. While the connection is still
			// idle, the fresh since only spares it the idle timeout: its request has begun.
			c.since.Store(time.Now().UnixNano())
			if !c.state.CompareAndSwap(stateIdle, stateHead) {
				// Parted from to make room as its client sent this request: the request is
				// served, and closes the connection (evictWaiting).
				if !c.state.CompareAndSwap(stateParting, stateHead) {
					return // closed as idle just before the request's first byte was read
				}
				c.lastRequest = true
			}
			if c.s.turnHook != nil {
				c.s.turnHook(stateHead)
			}
		}
		if !c.serveOne() {
			return
		}
	}
}

// h2Preface opens every HTTP/2 connection.
const h2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// handOffHTTP2 gives the connection to s.HTTP2 if it opens with HTTP/2's preface, and reports
// whether it did.
func (c *srvConn) handOffHTTP2() bool {
	if b, err := c.br.Peek(3); err != nil || string(b) != h2Preface[:3] {
		return false // an HTTP/1 request (or nothing: serveOne will see)
	}
	if b, err := c.br.Peek(len(h2Preface)); err != nil || string(b) != h2Preface {
		return false
	}
	pre, _ := c.br.Peek(c.br.Buffered())
	c.detached = true
	c.s.HTTP2(&replayConn{Conn: c.rwc, pre: bytes.Clone(pre)})
	return true
}

// isH2Preface reports whether req is the start of HTTP/2's client preface ("PRI * HTTP/2.0"
// and an empty head, as http.ReadRequest reads it): a client that speaks HTTP/2 with prior
// knowledge (curl --http2-prior-knowledge, a gRPC client sent to this port).
func isH2Preface(req *http.Request) bool {
	return req.ProtoMajor == 2 && req.ProtoMinor == 0 && req.Method == "PRI" && req.RequestURI == "*"
}

// h2Refusal is what a client that opened with HTTP/2's preface gets when no HTTP/2 server takes
// its connection: the server's preface (a SETTINGS frame, empty: the defaults) and a GOAWAY
// that refuses every stream (last stream 0) with HTTP_1_1_REQUIRED and says why. An HTTP/2
// client reports that error, where an HTTP/1.1 answer is bytes it cannot parse (curl: "Empty
// reply from server"). They are two fixed frames, 9-byte headers (RFC 9113 section 4.1) and
// GOAWAY's 8-byte payload before its text, written out here rather than through
// golang.org/x/net/http2's Framer: go.mod has x/net only as another module's dependency, and
// the whole of its http2 package would serve two constant byte strings.
var h2Refusal = h2GoAway(0xd, "HTTP/1.1 required: HTTP/2 with prior knowledge is not served here")

// h2GoAway returns an empty SETTINGS frame followed by a GOAWAY frame with code and debug.
func h2GoAway(code uint32, debug string) []byte {
	const (
		frameSettings = 0x4
		frameGoAway   = 0x7
	)
	b := []byte{0, 0, 0, frameSettings, 0, 0, 0, 0, 0}
	n := 8 + len(debug)
	b = append(b, byte(n>>16), byte(n>>8), byte(n), frameGoAway, 0, 0, 0, 0, 0)
	b = append(b, 0, 0, 0, 0) // the last stream processed: none
	b = append(b, byte(code>>24), byte(code>>16), byte(code>>8), byte(code))
	return append(b, debug...)
}

// refuseHTTP2 answers HTTP/2's preface on nc with h2Refusal once the client's first request
// is in (awaitH2Request), and ends the connection gracefully (closeWriteAndDrain): the client
// reads the GOAWAY rather than a reset. r holds what was read past the preface's first line.
// The caller closes nc then.
func refuseHTTP2(nc net.Conn, r *bufio.Reader) {
	awaitH2Request(nc, r)
	_ = nc.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if _, err := nc.Write(h2Refusal); err == nil {
		closeWriteAndDrain(nc)
	}
}

// h2RequestWait bounds awaitH2Request's wait.
const h2RequestWait = 200 * time.Millisecond

// awaitH2Request reads what follows the preface's first line (its "SM" end, then frames) until
// the client's first HEADERS frame, its first request, for up to h2RequestWait, 16 frames or
// 64 KiB of frame payload. A GOAWAY that comes before the client has opened a stream does not
// fail the request: Go's client, for one, then reports a connection "could not be
// established", or takes the connection for one to retry elsewhere (up to 6 times, over a
// minute of backoff); with the stream open, it fails the request with the GOAWAY's code. A
// client sends its request with its preface or right after it, so the wait is short.
func awaitH2Request(nc net.Conn, r *bufio.Reader) {
	_ = nc.SetReadDeadline(time.Now().Add(h2RequestWait))
	const end = "SM\r\n\r\n" // the preface's after its first line and empty head
	if b, err := r.Peek(len(end)); err != nil || string(b) != end {
		return
	}
	_, _ = r.Discard(len(end))
	budget := 64 << 10
	for range 16 {
		h, err := r.Peek(9)
		if err != nil || h[3] == 0x1 { // HEADERS
			return
		}
		n := int(h[0])<<16 | int(h[1])<<8 | int(h[2])
		if budget -= n; budget < 0 {
			return
		}
		if _, err := r.Discard(9 + n); err != nil {
			return
		}
	}
}

// replayConn is a connection whose first bytes were read already: Read returns them first.
type replayConn struct {
	net.Conn
	pre []byte
}

func (r *replayConn) Read(p []byte) (int, error) {
	if len(r.pre) > 0 {
		n := copy(p, r.pre)
		r.pre = r.pre[n:]
		return n, nil
	}
	return r.Conn.Read(p)
}

// serveOne reads one request, runs the handler and writes its response; it reports whether the
// connection may carry another request.
func (c *srvConn) serveOne() bool {
	s := c.s
	limit := s.MaxHeaderBytes
	if limit <= 0 {
		limit = http.DefaultMaxHeaderBytes
	}
	c.cr.remain = int64(limit) + 4096 // what bufio may read past the head, as net/http allows
	empty, err := skipEmptyLines(c.br)
	var req *http.Request
	if err == nil {
		if empty > maxEmptyLines {
			c.protocolError(http.StatusBadRequest, "malformed request: "+tooManyEmptyLines)
			return false
		}
		// The head's check sees what is buffered already (the start of this request), then
		// what is read until the head ends.
		c.scan.reset(false)
		c.scanning = true
		if n := c.br.Buffered(); n > 0 {
			b, _ := c.br.Peek(n)
			c.scanHead(b)
		}
		req, err = http.ReadRequest(c.br)
	}
	atLimit := c.cr.remain <= 0
	c.cr.remain = unbounded
	c.scanning = false
	if err != nil {
		switch {
		case c.expired.Load() || c.state.Load() == stateClosed:
			// The janitor closed it (too slow a head), or MaxConns did.
			if c.headExpired.Load() {
				s.refusedBy.add(s.Logger, RefusedHeadTimeout, c.remote, "the request head did not arrive within the read header timeout: connection closed")
			}
			return false
		case errors.Is(err, io.EOF):
			return false
		case atLimit || errors.Is(err, errHeadTooLarge):
			// The parser may fail on the line the limit cut before it reads the limit's error.
			c.protocolError(http.StatusRequestHeaderFieldsTooLarge, "request head too large")
		case isTimeout(err):
			return false
		case c.plainToTLS(err):
			s.refusedBy.add(s.Logger, RefusedPlainHTTP, c.remote, "plain HTTP sent to the TLS listener")
		default:
			c.protocolError(http.StatusBadRequest, "malformed request: "+parseErrorReason(err))
		}
		return false
	}
	// The head is read: since times the request from here on (its watch, sweep), and is
	// stored before activate publishes the state it times, as serve stores the idle and head
	// states'. A sweep, an eviction or a shutdown's round that sees the connection still
	// waiting for its head then sees it fresh and leaves it, where the head's older since
	// (the accept, for a new connection) could have closed it for its header timeout, or as
	// silent for freshGrace at MaxConns, with its request read and about to be served.
	c.since.Store(time.Now().UnixNano())
	if s.headHook != nil {
		s.headHook()
	}
	if req.ProtoMajor != 1 {
		if isH2Preface(req) {
			s.refusedBy.add(s.Logger, RefusedHTTP2, c.remote, "HTTP/2 with prior knowledge: answered with GOAWAY HTTP_1_1_REQUIRED")
			refuseHTTP2(c.rwc, c.br) // nothing is buffered to write: the last answer was flushed
			return false
		}
		c.protocolError(http.StatusHTTPVersionNotSupported, "HTTP/1.0 and HTTP/1.1 only")
		return false
	}
	if why := c.scan.smuggling(); why != "" {
		c.protocolError(http.StatusBadRequest, "malformed request: "+why)
		return false
	}
	if req.Host == "" && req.ProtoAtLeast(1, 1) && req.Method != http.MethodConnect {
		c.protocolError(http.StatusBadRequest, "missing required Host header")
		return false
	}
	if !validHost(req.Host) {
		c.protocolError(http.StatusBadRequest, "malformed Host header")
		return false
	}
	expectContinue := false
	if e := req.Header.Get("Expect"); e != "" {
		if !strings.EqualFold(e, "100-continue") || !req.ProtoAtLeast(1, 1) {
			c.protocolError(http.StatusExpectationFailed, "unsupported Expect header")
			return false
		}
		expectContinue = true
		req.Header.Del("Expect")
	}
	if s.WriteTimeout > 0 {
		_ = c.rwc.SetWriteDeadline(time.Now().Add(s.WriteTimeout))
	}
	req.RemoteAddr = c.remote
	ctx, cancel := context.WithCancel(c.base)
	req = req.WithContext(ctx)

	if !c.activate() {
		cancel()
		return false // taken out of service (MaxConns, a timeout, Close) as its request arrived
	}
	w := &response{c: c, req: req, header: make(http.Header), contentLength: -1}
	w.closeAfter = req.Close || c.lastRequest
	body := &reqBody{c: c, w: w, rc: req.Body, length: req.ContentLength, cont: expectContinue}
	body.hold = bodyHold{b: s.budget, length: req.ContentLength}
	defer body.hold.drop() // after a panic too (dropped below otherwise)
	noBody := req.Body == http.NoBody
	if !noBody {
		req.Body = body
	}
	c.mu.Lock()
	c.active, c.bodyDone, c.due, c.gone, c.cancel = true, noBody, false, false, cancel
	c.mu.Unlock()
	c.bodyStart.Store(0)
	c.bodyRead.Store(0)
	c.bodyExpired.Store(false)
	c.watchAsked.Store(false)
	s.requestStarted()
	defer s.requestEnded()

	s.Handler.ServeHTTP(w, req)
	// Given back now: the rest of the body, dropped below to keep the connection, is not held.
	body.hold.drop()
	if c.detached { // hijacked: the handler has the connection
		cancel()
		return false
	}
	w.finish()

	c.mu.Lock()
	c.active = false
	c.mu.Unlock()
	c.stopWatch()
	cancel()
	c.mu.Lock()
	gone := c.gone
	c.mu.Unlock()
	if gone || c.werr != nil {
		return false
	}
	if w.closeAfter { // (an answer whose head went out during a shutdown has it too)
		if !noBody && !body.eof {
			// The client may still be sending the body the handler left (a 401 before it was
			// read): closed with it unread, the connection is reset, and a client that writes
			// its whole request before it reads gets the reset, not the answer.
			c.closeGracefully()
		}
		return false
	}
	if !noBody && !body.eof {
		// The handler left some of the body: drop a little of it to keep the connection (timed
		// as the body is), unless the client announced more than that, waits for a 100
		// Continue that never came, or was too slow already.
		if body.cont || body.refused || c.bodyExpired.Load() || req.ContentLength-c.bodyRead.Load() > maxDiscard {
			c.closeGracefully()
			return false
		}
		n, err := io.CopyN(io.Discard, body, maxDiscard+1)
		if n > maxDiscard || err != io.EOF {
			c.closeGracefully()
			return false
		}
	}
	return true
}

// skipEmptyLines drops the empty lines (CRLF, or a bare LF) before a request line, as many as
// maxEmptyLines, and returns how many it found: maxEmptyLines+1 when there are more (it drops
// no more of them then). A CR that no LF follows is left to the parser, which refuses it.
func skipEmptyLines(br *bufio.Reader) (int, error) {
	for n := 0; ; n++ {
		b, err := br.Peek(1)
		if err != nil || b[0] != '\r' && b[0] != '\n' {
			return n, err
		}
		k := 1
		if b[0] == '\r' {
			if b, err = br.Peek(2); err != nil || b[1] != '\n' {
				return n, err
			}
			k = 2
		}
		if n == maxEmptyLines {
			return n + 1, nil
		}
		_, _ = br.Discard(k)
	}
}

// activate moves the connection to stateActive once a request's head is read (its since was
// stored then: serveOne), unless it was taken out of service meanwhile (to make room for
// another, evictWaiting; for its header timeout, sweep; by Close), and reports whether it
// did.
func (c *srvConn) activate() bool {
	return c.state.CompareAndSwap(stateNew, stateActive) || c.state.CompareAndSwap(stateHead, stateActive)
}

// parseErrorReason is what a 400 says of a head that http.ReadRequest refused: the error's
// words up to the first quote or colon, never what it quotes of the request (a header line,
// which may be a credential, and up to the head's limit long).
func parseErrorReason(err error) string {
	msg := strings.TrimPrefix(err.Error(), "http: ")
	if i := strings.IndexAny(msg, ":\"`"); i >= 0 {
		msg = msg[:i]
	}
	if msg = strings.TrimSpace(msg); msg == "" || len(msg) > 64 {
		return "unreadable head"
	}
	return msg
}

// protocolError answers a request the server could not read, and the connection is closed. The
// refusal is counted by its reason, which status says (Stats.Refused), and logged at DEBUG.
func (c *srvConn) protocolError(status int, msg string) {
	why := RefusedMalformed
	switch status {
	case http.StatusRequestHeaderFieldsTooLarge:
		why = RefusedHeadTooLarge
	case http.StatusHTTPVersionNotSupported:
		why = RefusedVersion
	case http.StatusExpectationFailed:
		why = RefusedExpectation
	}
	c.s.refusedBy.add(c.s.Logger, why, c.remote, strconv.Itoa(status)+" "+msg)
	ctype, body := "text/plain; charset=utf-8", []byte(msg)
	if c.s.ErrorBody != nil {
		ctype, body = c.s.ErrorBody(status, msg)
	}
	_ = c.rwc.SetWriteDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(c.bw, "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n",
		status, http.StatusText(status), ctype, len(body))
	_, _ = c.bw.Write(body)
	_ = c.bw.Flush()
	c.closeGracefully()
}

// plainToTLS answers, in plain HTTP, a request sent in plain HTTP to a TLS listener (its
// handshake failed on a first record that reads like an HTTP request), as net/http's server
// does, and reports whether it did: the client is told to use https rather than see its
// connection closed without a word.
func (c *srvConn) plainToTLS(err error) bool {
	var re tls.RecordHeaderError
	if !errors.As(err, &re) || re.Conn == nil || !looksLikeHTTP(re.RecordHeader[:]) {
		return false
	}
	const msg = "the client sent plain HTTP to an HTTPS listener: use https://"
	ctype, body := "text/plain; charset=utf-8", []byte(msg)
	if c.s.ErrorBody != nil {
		ctype, body = c.s.ErrorBody(http.StatusBadRequest, msg)
	}
	_ = re.Conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
	_, _ = fmt.Fprintf(re.Conn, "HTTP/1.0 400 Bad Request\r\nContent-Type: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		ctype, len(body), body)
	return true
}

// looksLikeHTTP reports whether a TLS record's first five bytes are the start of an HTTP
// request.
func looksLikeHTTP(h []byte) bool {
	switch string(h) {
	case "GET /", "HEAD ", "POST ", "PUT /", "OPTIO", "DELET", "PATCH", "CONNE":
		return true
	}
	return false
}

// closeGracefully ends a connection whose client may still be sending (closeWriteAndDrain);
// its goroutine closes it then.
func (c *srvConn) closeGracefully() { closeWriteAndDrain(c.rwc) }

// validHost reports whether h has only the bytes a Host header may hold (RFC 3986's host and
// port characters, IPv6 brackets and zone separators included).
func validHost(h string) bool {
	for i := 0; i < len(h); i++ {
		b := h[i]
		if b < 0x21 || b > 0x7e || strings.IndexByte(`"<>\\^`+"`"+`{|}`, b) >= 0 {
			return false
		}
	}
	return true
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// watchDue runs WatchAfter into a request, on the janitor's goroutine.
func (c *srvConn) watchDue() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.active || c.watching {
		return
	}
	if !c.bodyDone {
		c.due = true // the body's end starts the watch
		return
	}
	c.startWatchLocked()
}

// onBodyEOF runs when the handler has read the request body to its end.
func (c *srvConn) onBodyEOF() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.bodyDone = true
	if c.bodyExpired.Load() {
		// The body ended as the janitor gave up on it: it was in time after all.
		c.bodyExpired.Store(false)
		_ = c.rwc.SetReadDeadline(time.Time{})
	}
	if c.due && c.active && !c.watching {
		c.startWatchLocked()
	}
}

func (c *srvConn) startWatchLocked() {
	if c.br.Buffered() > 0 || c.cr.hasByte {
		return // the client sent more already: nothing to watch with
	}
	c.watching = true
	c.watchDone = make(chan struct{})
	go c.watch(c.watchDone, c.cancel)
}

// watch reads the connection while a request runs: a read error means that the client went
// away (unless stopWatch caused it); a byte read is the start of its next request, kept.
func (c *srvConn) watch(done chan struct{}, cancel context.CancelFunc) {
	defer close(done)
	n, err := c.rwc.Read(c.cr.byteBuf[:])
	c.mu.Lock()
	defer c.mu.Unlock()
	if n == 1 {
		c.cr.hasByte = true
		return
	}
	if err != nil && !c.aborting {
		c.gone = true
		cancel()
	}
}

// stopWatch ends the watch, if one runs, and waits for it.
func (c *srvConn) stopWatch() {
	c.mu.Lock()
	w := c.watching
	if w {
		c.aborting = true
	}
	done := c.watchDone
	c.mu.Unlock()
	if !w {
		return
	}
	_ = c.rwc.SetReadDeadline(aLongTimeAgo)
	<-done
	_ = c.rwc.SetReadDeadline(time.Time{})
	c.mu.Lock()
	c.watching, c.aborting = false, false
	c.mu.Unlock()
}

// reqBody is a request body as the handler sees it: it answers Expect: 100-continue at the
// first read and tells the connection when the body has been read to its end.
type reqBody struct {
	c      *srvConn
	w      *response
	rc     io.ReadCloser
	length int64 // announced; -1: unknown (chunked)
	cont   bool  // 100 Continue still to send
	eof    bool
	// hold is the body's share of MaxPendingBodyBytes; refused: a read found no room in it.
	hold    bodyHold
	refused bool
	// The body's progress (BodyStallTimeout), on the handler's goroutine: the bytes read when
	// it last progressed, and when the handler's last read ended (Unix ns).
	progressRead int64
	lastEnd      int64
	// lowat is the SO_RCVLOWAT the body's reads have set on the connection (0: none, the
	// kernel's 1; -1: it cannot be set here).
	lowat int64
}

// minLowat is the least of a body's bytes still to come worth waiting for as one: below it,
// waking for each segment costs less than the system calls that set and reset the threshold.
const minLowat = 64 << 10

// maxLowat bounds the threshold: up to 1 MiB, and no more than half of what BodyReadTimeout,
// or BodyStallTimeout, lets arrive at BodyMinRate. The bytes that wait under the threshold are
// not counted as received until they are read, so a body sent at the minimum rate could
// otherwise run out of time with those bytes in the socket: with at most half the timeout's
// worth hidden, it cannot. With a stall bound and no rate (any byte is progress), none is set.
func (s *Server) maxLowat() int64 {
	m := int64(1 << 20)
	for _, d := range []time.Duration{s.BodyReadTimeout, s.BodyStallTimeout} {
		if d > 0 && s.BodyMinRate > 0 {
			m = min(m, int64(d.Seconds()*float64(s.BodyMinRate)/2))
		}
	}
	if s.BodyStallTimeout > 0 && s.BodyMinRate <= 0 {
		m = 0
	}
	return m
}

// adjustLowat keeps the connection's SO_RCVLOWAT, while a large body with a known length is
// read, at what the next read of next bytes can wait for: the rest of the body still in the
// socket or on its way, at most next. A 400 KB body that arrives over a millisecond in 64 KB
// segments then takes three reads (the head's buffer, what had come by the first read from
// the socket, the rest) and one wake-up, not a read and a wake-up per segment (docs/results.md,
// "Sixth round"). It is set once a read from the socket (partial: socket says it read there)
// left at least minLowat to come, and lowered (to the kernel's 1 at the body's end) whenever
// what is left falls below it, so that a read never waits for bytes that will not come. A body
// that is in the socket whole by the first read never sets it.
func (b *reqBody) adjustLowat(next int, end, socket bool) {
	if b.lowat < 0 || b.length < 0 {
		return
	}
	c := b.c
	rest := b.length - c.bodyRead.Load() - int64(c.br.Buffered())
	want := min(rest, int64(next), c.s.maxLowat())
	switch {
	case end || rest <= 0:
		want = 0
	case b.lowat == 0 && (!socket || want < minLowat):
		return // not worth it (yet)
	case b.lowat != 0 && want >= b.lowat:
		return // never raised again: at most one change per read
	}
	if want == b.lowat || want == 0 && b.lowat == 0 {
		return
	}
	if !setRcvLowat(c.rwc, int(max(want, 1))) {
		b.lowat = -1
		return
	}
	b.lowat = want
}

func (b *reqBody) Read(p []byte) (int, error) {
	if b.eof {
		return 0, io.EOF
	}
	c := b.c
	if c.bodyExpired.Load() {
		return 0, ErrBodyReadTimeout
	}
	if b.hold.b != nil && !b.hold.cover(c.bodyRead.Load(), len(p)) {
		b.refused = true
		refuseBudget(b.w.header)
		return 0, ErrBodyMemory
	}
	if b.cont {
		b.cont = false
		_, _ = c.bw.WriteString("HTTP/1.1 100 Continue\r\n\r\n")
		if err := c.bw.Flush(); err != nil {
			c.werr = err
		}
	}
	stall := c.s.BodyStallTimeout > 0
	timed := c.s.BodyReadTimeout > 0 || stall
	if timed {
		if c.bodyStart.Load() == 0 {
			now := time.Now().UnixNano()
			c.bodyStart.Store(now)
			c.bodyProgress.Store(now)
		} else if stall {
			// The time the handler spent away from the body is not the client's.
			c.bodyProgress.Add(time.Now().UnixNano() - b.lastEnd)
		}
		c.bodyReading.Store(true)
	}
	socket := c.br.Buffered() == 0 && !c.cr.hasByte // this read goes to the socket
	n, err := b.rc.Read(p)
	if timed {
		c.bodyReading.Store(false)
	}
	read := c.bodyRead.Add(int64(n))
	if stall {
		b.lastEnd = time.Now().UnixNano()
		if read-b.progressRead >= max(c.s.BodyMinRate, 1) {
			b.progressRead = read
			c.bodyProgress.Store(b.lastEnd)
		}
	}
	b.adjustLowat(len(p)-n, err != nil, socket)
	if err == io.EOF {
		b.eof = true
		b.hold.drop()
		c.onBodyEOF()
	} else if err != nil && c.bodyExpired.Load() {
		err = ErrBodyReadTimeout
	}
	return n, err
}

func (b *reqBody) Close() error { return nil }

// response is the http.ResponseWriter (and http.Flusher) of one request.
type response struct {
	c             *srvConn
	req           *http.Request
	header        http.Header
	status        int
	wroteHeader   bool
	committed     bool   // the status line and headers are in the write buffer
	held          []byte // body written before the headers were sent
	contentLength int64  // declared by the handler; -1: none
	written       int64
	chunked       bool
	ended         bool // the body is complete (EndBody, or the handler returned)
	closeAfter    bool
	noBody        bool // HEAD, 204 or 304
}

func (w *response) Header() http.Header { return w.header }

func (w *response) WriteHeader(code int) {
	if w.wroteHeader {
		return
	}
	if code < 100 || code > 999 {
		panic(fmt.Sprintf("invalid WriteHeader code %v", code))
	}
	if code >= 100 && code < 200 && code != http.StatusSwitchingProtocols {
		w.writeInformational(code)
		return
	}
	w.wroteHeader = true
	w.status = code
	w.noBody = w.req.Method == http.MethodHead || code == http.StatusNoContent || code == http.StatusNotModified
	if cl := w.header.Get("Content-Length"); cl != "" {
		if n, err := strconv.ParseInt(cl, 10, 64); err == nil && n >= 0 {
			w.contentLength = n
		} else {
			w.header.Del("Content-Length")
		}
	}
}

// writeInformational sends a 1xx response (103 Early Hints) with the headers set so far.
func (w *response) writeInformational(code int) {
	if w.committed || code == http.StatusContinue {
		return
	}
	bw := w.c.bw
	writeStatusLine(bw, code)
	writeHeaders(bw, w.header, nil)
	_, _ = bw.WriteString("\r\n")
	if err := bw.Flush(); err != nil && w.c.werr == nil {
		w.c.werr = err
	}
}

func (w *response) Write(p []byte) (int, error) {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if len(p) == 0 {
		return 0, nil
	}
	if w.ended {
		return 0, http.ErrBodyNotAllowed
	}
	if w.noBody {
		if w.req.Method == http.MethodHead {
			w.written += int64(len(p))
			if !w.committed && len(w.held) < sniffLen {
				w.held = append(w.held, p[:min(len(p), sniffLen-len(w.held))]...) // for the type
			}
			return len(p), nil
		}
		return 0, http.ErrBodyNotAllowed
	}
	if w.contentLength >= 0 && w.written+int64(len(p)) > w.contentLength {
		return 0, http.ErrContentLength
	}
	if w.c.werr != nil {
		return 0, w.c.werr
	}
	w.written += int64(len(p))
	if !w.committed {
		if len(w.held)+len(p) <= holdBeforeChunking {
			if w.held == nil {
				if w.c.hold == nil {
					w.c.hold = make([]byte, 0, holdBeforeChunking)
				}
				w.held = w.c.hold[:0]
			}
			w.held = append(w.held, p...)
			return len(p), nil
		}
		w.commit(false, p)
	}
	w.writeBody(p)
	if w.c.werr != nil {
		return 0, w.c.werr
	}
	return len(p), nil
}

func (w *response) writeBody(p []byte) {
	if len(p) == 0 || w.c.werr != nil {
		return
	}
	bw := w.c.bw
	var err error
	if w.chunked {
		// The size line is formatted in the writer's free space (a local array escapes
		// through Write: a 16-byte allocation per chunk, per token of a streamed answer).
		_, _ = bw.Write(append(strconv.AppendInt(bw.AvailableBuffer(), int64(len(p)), 16), '\r', '\n'))
		_, _ = bw.Write(p)
		_, err = bw.WriteString("\r\n")
	} else {
		_, err = bw.Write(p)
	}
	if err != nil {
		w.c.werr = err
	}
}

// commit writes the status line and the headers, then the body held so far. final says that
// the handler has returned, so that the body's length is known; sniff is the body's start, to
// guess a missing Content-Type from.
func (w *response) commit(final bool, sniff []byte) {
	w.committed = true
	h := w.header
	h.Del("Transfer-Encoding")
	if len(w.held) > 0 {
		sniff = w.held
	}
	head := w.req.Method == http.MethodHead
	if !w.noBody || head && w.status != http.StatusNoContent && w.status != http.StatusNotModified {
		if _, ok := h["Content-Type"]; !ok && len(sniff) > 0 && h.Get("Content-Encoding") == "" {
			h.Set("Content-Type", http.DetectContentType(sniff))
		}
	}
	if head {
		w.held = nil // kept only to guess the type
	}
	switch {
	case w.contentLength >= 0:
	case head:
		// The length a GET would have declared: only when the body fits the first write.
		if final && w.written > 0 && w.written <= holdBeforeChunking {
			h.Set("Content-Length", strconv.FormatInt(w.written, 10))
		}
	case w.noBody:
	case final:
		w.contentLength = int64(len(w.held))
		h.Set("Content-Length", strconv.Itoa(len(w.held)))
	case w.req.ProtoAtLeast(1, 1):
		w.chunked = true
	default:
		w.closeAfter = true // HTTP/1.0: the body ends when the connection does
	}
	if hasToken(h.Get("Connection"), "close") || w.status == http.StatusUnauthorized && w.c.s.CloseUnauthorized {
		w.closeAfter = true
	}
	if w.c.s.shutdown.Load() || w.c.s.noKeepAlive.Load() {
		w.closeAfter = true
	}
	h.Del("Connection")
	bw := w.c.bw
	writeStatusLine(bw, w.status)
	var extra [3]string
	ex := extra[:0]
	if w.chunked {
		ex = append(ex, "Transfer-Encoding: chunked\r\n")
	}
	if w.closeAfter {
		ex = append(ex, "Connection: close\r\n")
	} else if !w.req.ProtoAtLeast(1, 1) {
		ex = append(ex, "Connection: keep-alive\r\n")
	}
	writeHeaders(bw, h, ex)
	if _, ok := h["Date"]; !ok {
		var b [64]byte
		_, _ = bw.WriteString("Date: ")
		_, _ = bw.Write(time.Now().UTC().AppendFormat(b[:0], http.TimeFormat))
		_, _ = bw.WriteString("\r\n")
	}
	if _, err := bw.WriteString("\r\n"); err != nil {
		w.c.werr = err
	}
	held := w.held
	w.held = nil
	w.writeBody(held)
}

func writeStatusLine(bw *bufio.Writer, code int) {
	var b [64]byte
	line := append(b[:0], "HTTP/1.1 "...)
	line = strconv.AppendInt(line, int64(code), 10)
	line = append(line, ' ')
	if text := http.StatusText(code); text != "" {
		line = append(line, text...)
	} else {
		line = append(line, "status code "...)
		line = strconv.AppendInt(line, int64(code), 10)
	}
	_, _ = bw.Write(append(line, "\r\n"...))
}

// headerValueReplacer keeps a header value on one line, as net/http does.
var headerValueReplacer = strings.NewReplacer("\n", " ", "\r", " ")

// writeHeaders writes h in key order (trailer values, under http.TrailerPrefix, excluded),
// then the extra lines.
func writeHeaders(bw *bufio.Writer, h http.Header, extra []string) {
	var kb [24]string
	keys := kb[:0]
	for k := range h {
		if !strings.HasPrefix(k, http.TrailerPrefix) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		for _, v := range h[k] {
			_, _ = bw.WriteString(k)
			_, _ = bw.WriteString(": ")
			if strings.ContainsAny(v, "\r\n") {
				v = headerValueReplacer.Replace(v)
			}
			_, _ = bw.WriteString(strings.TrimSpace(v))
			_, _ = bw.WriteString("\r\n")
		}
	}
	for _, l := range extra {
		_, _ = bw.WriteString(l)
	}
}

func hasToken(v, token string) bool {
	for f := range strings.SplitSeq(v, ",") {
		if strings.EqualFold(strings.TrimSpace(f), token) {
			return true
		}
	}
	return false
}

// Flush sends the headers, if not yet sent, and what is buffered.
func (w *response) Flush() { _ = w.FlushError() }

// FlushError is Flush that reports a write error (http.ResponseController uses it).
func (w *response) FlushError() error {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if !w.committed {
		w.commit(false, nil)
	}
	if w.c.werr == nil {
		if err := w.c.bw.Flush(); err != nil {
			w.c.werr = err
		}
	}
	return w.c.werr
}

// Hijack hands the connection to the handler (http.Hijacker): the server neither writes to it
// nor closes it any more. What the response had buffered is sent first.
func (w *response) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c := w.c
	if c.detached {
		return nil, nil, http.ErrHijacked
	}
	if w.committed {
		if err := c.bw.Flush(); err != nil {
			return nil, nil, err
		}
	}
	c.mu.Lock()
	c.active = false // no watch may start: the connection is the handler's
	c.mu.Unlock()
	c.stopWatch()
	// Server.Close may have taken the connection out of service; closing it is its to do then.
	if !c.state.CompareAndSwap(stateActive, stateDetached) {
		return nil, nil, ErrServerClosed
	}
	c.since.Store(time.Now().UnixNano())
	c.detached = true
	return c.rwc, bufio.NewReadWriter(c.br, c.bw), nil
}

// SetWriteDeadline lets http.ResponseController extend a response's write deadline.
func (w *response) SetWriteDeadline(t time.Time) error { return w.c.rwc.SetWriteDeadline(t) }

// EndBody ends the response now, before the handler returns: the headers if not yet sent,
// what is buffered, and a chunked body's end (with the trailers set so far) go out in one
// write. A client that reads the body to its end (to keep the connection) then need not wait
// for what the handler does afterwards (a proxy's bookkeeping). Writes after it fail with
// http.ErrBodyNotAllowed.
func (w *response) EndBody() error {
	w.end()
	if w.c.werr == nil {
		if err := w.c.bw.Flush(); err != nil {
			w.c.werr = err
		}
	}
	return w.c.werr
}

// end writes what the response still owes: the headers if not yet sent, and a chunked body's
// end. It does it once.
func (w *response) end() {
	if w.ended {
		return
	}
	w.ended = true
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if !w.committed {
		w.commit(true, nil)
	}
	if w.chunked && w.c.werr == nil {
		_, _ = w.c.bw.WriteString("0\r\n")
		w.writeTrailers()
		_, _ = w.c.bw.WriteString("\r\n")
	}
}

// finish completes the response after the handler has returned.
func (w *response) finish() {
	w.end()
	if w.contentLength >= 0 && w.written < w.contentLength && w.req.Method != http.MethodHead {
		w.closeAfter = true // the client would wait for the rest
	}
	if w.c.werr == nil {
		if err := w.c.bw.Flush(); err != nil {
			w.c.werr = err
		}
	}
}

// writeTrailers writes the trailers a handler set under http.TrailerPrefix or announced in the
// Trailer header.
func (w *response) writeTrailers() {
	announced := w.header.Values("Trailer")
	for k, vs := range w.header {
		name, ok := strings.CutPrefix(k, http.TrailerPrefix)
		if !ok {
			found := false
			for _, a := range announced {
				if hasToken(a, k) {
					found = true
				}
			}
			if !found {
				continue
			}
			name = k
		}
		for _, v := range vs {
			_, _ = w.c.bw.WriteString(http.CanonicalHeaderKey(name) + ": " + headerValueReplacer.Replace(v) + "\r\n")
		}
	}
}
