package h1

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// NetHTTP is net/http's Server with the protections of this package's Server added, for
// deployments that serve the API with Go's server:
//
//   - Request smuggling: Go's parser accepts a request with both Content-Length and
//     Transfer-Encoding (it drops the length), a field folded over lines (it joins them), and
//     Transfer-Encoding on HTTP/1.0 (it reads the length instead). NetHTTP reads each plain
//     connection's bytes as Go's server reads them, with the same head check as Server, and
//     answers such a request 400 and closes the connection instead of serving it. (Whitespace
//     before a field name's colon Go's server refuses itself: the name is not a token.)
//   - BodyReadTimeout, BodyMinRate and BodyStallTimeout bound reading a request body, as with
//     Server, through read deadlines set from the handler's first read of it (a stall is cut
//     after seven eighths of BodyStallTimeout to all of it: deadlines move in steps).
//   - MaxPendingBodyBytes bounds the bytes of the bodies being received, as with Server.
//   - WriteStallTimeout bounds each write to the client, through write deadlines renewed as
//     the handler writes; a write past its deadline goes on while the client still takes the
//     answer, slowly (stallBound), on a plain connection and, over TLS, on AbortStalled's
//     connection under crypto/tls's (under another, it fails at the deadline).
//   - MaxConns bounds the open connections, as with Server, following Go's server's
//     connection states (a ConnState hook). A connection is closed to make room only while
//     idle, or new for freshGrace (of ReadHeaderTimeout, else ReadTimeout), and no request
//     is arriving on it: no byte waits, and no head has been read in part or whole and not
//     yet served (Go's server keeps a connection idle, or new, until it has read a whole
//     head); over TLS, where the bytes are Go's to decrypt, an HTTP/1 connection whose
//     client has sent anything since it began to wait (since its handshake ended, or its last
//     request's handler returned: the kernel's count of the bytes received, against what
//     crypto/tls had read then) is left too; the server runs each TLS handshake on a
//     goroutine of its own, ahead of Go's, to know when it ends. A head known to be arriving for ReadHeaderTimeout (else
//     ReadTimeout), or a new TLS connection that old, no longer counts: Go's server applies
//     its header timeout on a kept-alive connection only from a head's fourth byte, and a
//     client that sends fewer would hold its connection for the idle timeout. Go's server
//     may begin to read a request in the instant between the check and the close (as with
//     its own Shutdown). An idle HTTP/1 connection is parted from as with Server: left open
//     for idleGrace within MaxLingering, its next request answered with Connection: close.
//   - Shutdown answers every request that reaches it (see the method).
//   - CloseUnauthorized, as with Server.
//
// What it cannot do: on TLS connections the bytes are Go's to decrypt (net/http needs the
// *tls.Conn itself, for HTTP/2 and Request.TLS), so HTTP/1.1 over TLS is served as Go's server
// serves it; HTTP/2 frames its messages itself and is not exposed to these attacks. Timing counts wall
// time from the first body read, not only the time the handler waits. A TLS connection whose
// write stalled in a handler's write, or in Go's last flush, is closed by Go's server, gracefully
// unless the listener under crypto/tls's is AbortStalled's (guardWriter.failed sees a flush's).
//
// Set the fields before Serve. Serve installs the handler wrapper and a ConnContext (chained
// to one already set) and sets DisableGeneralOptionsHandler, so that every request reaches the
// handler in order.
type NetHTTP struct {
	*http.Server
	// BodyReadTimeout, BodyMinRate, BodyStallTimeout, MaxPendingBodyBytes, WriteStallTimeout,
	// MaxConns, MaxLingering and CloseUnauthorized are as in Server; 0 (false): none, or
	// MaxLingering's default.
	BodyReadTimeout     time.Duration
	BodyMinRate         int64
	BodyStallTimeout    time.Duration
	MaxPendingBodyBytes int64
	WriteStallTimeout   time.Duration
	MaxConns            int
	MaxLingering        int
	CloseUnauthorized   bool
	// ErrorBody makes the bodies of the refusals, as in Server; nil: plain text.
	ErrorBody func(status int, msg string) (contentType string, body []byte)
	// Logger receives a DEBUG line for each request refused before its handler, as Server's;
	// nil: none.
	Logger *slog.Logger

	once     sync.Once
	budget   *budget
	table    connTable
	refusals refuser
	// refusedBy counts the requests refused before their handler, by reason: HTTP/2's
	// preface and the smuggling checks (guard); on plain connections, net/http's own 400,
	// 431, 501 and 505 and the heads it closed for ReadHeaderTimeout (framedConn). Over TLS
	// the bytes are Go's: those of net/http's own are not seen.
	refusedBy refusalCount
	// noKeepAlive is set by SetKeepAlivesEnabled(false), and by Shutdown.
	noKeepAlive atomic.Bool

	mu        sync.Mutex
	listeners map[net.Listener]struct{}
	closing   bool // Shutdown began; under mu
}

// SetKeepAlivesEnabled(false) makes every answer whose head goes out from then on close its
// connection (Connection: close; on HTTP/2, a graceful GOAWAY), as Server's method does; true
// undoes it. Unlike the method of net/http's Server, which it stands in for, it leaves the idle
// connections open until Shutdown closes them: net/http closes them at once, and a client that
// sends its next request on one in that instant gets an error (a POST is not sent again),
// while during a shutdown's drain delay clients still send. The answer of a request in flight
// whose handler runs without the guard's writer (no CloseUnauthorized, timeout or body bound
// set) keeps its connection; the next request on it is answered with Connection: close.
func (s *NetHTTP) SetKeepAlivesEnabled(v bool) { s.noKeepAlive.Store(!v) }

// Serve serves ln with the Server, its plain connections checked as described above. It
// returns http.ErrServerClosed after Shutdown or Close.
func (s *NetHTTP) Serve(ln net.Listener) error {
	s.once.Do(s.install)
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		return http.ErrServerClosed
	}
	s.listeners[ln] = struct{}{}
	s.mu.Unlock()
	err := s.Server.Serve(framedListener{ln, s})
	s.mu.Lock()
	delete(s.listeners, ln)
	if s.closing {
		err = http.ErrServerClosed // Shutdown closed ln under Go's server
	}
	s.mu.Unlock()
	return err
}

// Shutdown stops accepting and waits for the connections to finish, as net/http's Shutdown
// does, or for ctx to end (then it returns ctx's error: call Close). Unlike it, it never
// drops a request: Go's server, once its own Shutdown has begun, closes a connection after
// its answer and leaves a request it reads then unanswered (no answer, no error: the client
// sees the connection close under it). So the listeners close first, and Go's Shutdown is
// called only once no HTTP/1 connection is left: until then a request that arrives on an
// open connection is served, with Connection: close. A connection whose last answer's head
// went out before the shutdown (a stream under way at the signal) could not be told to
// close: it stays open for idleGrace after that answer, for a next request sent at once.
// Idle connections are closed idleGrace after their last answer, new ones after 5 s
// without a request, none whose request is arriving (as MaxConns leaves it: Go's header
// timeout ends one that stalls). HTTP/2 connections are left to Go's Shutdown (a graceful
// GOAWAY).
func (s *NetHTTP) Shutdown(ctx context.Context) error {
	s.once.Do(s.install)
	s.noKeepAlive.Store(true) // the answers from now on close their connections
	s.mu.Lock()
	s.closing = true
	for ln := range s.listeners {
		_ = ln.Close()
	}
	s.mu.Unlock()
	wait := time.Millisecond
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for !s.table.drainStep(time.Now().UnixNano()) {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-timer.C:
		}
		wait = min(2*wait, 50*time.Millisecond)
		timer.Reset(wait)
	}
	// It closes the listeners again, those whose Serve has not returned yet: that they are
	// closed already is no error.
	if err := s.Server.Shutdown(ctx); err != nil && !errors.Is(err, net.ErrClosed) {
		return err
	}
	return nil
}

// Stats returns the server's counts of connections and body bytes.
func (s *NetHTTP) Stats() Stats {
	s.once.Do(s.install)
	st := s.table.stats()
	st.BodyBytes = s.budget.held()
	st.Refused = s.refusedBy.load()
	if s.budget != nil {
		st.BodiesRefused = s.budget.refused.Load()
	}
	return st
}

type framedKey struct{}

// trackedKey is the key of a connection's *tracked in its requests' contexts.
type trackedKey struct{}

func (s *NetHTTP) install() {
	s.budget = newBudget(s.MaxPendingBodyBytes)
	s.table.conns = make(map[net.Conn]*tracked)
	s.table.linger, s.table.lingerLimit = &s.refusals, maxLingering(s.MaxConns, s.MaxLingering)
	s.table.headBound = s.Server.ReadHeaderTimeout
	if s.table.headBound <= 0 {
		s.table.headBound = s.Server.ReadTimeout
	}
	s.listeners = make(map[net.Listener]struct{})
	s.Server.Handler = s.guard(s.Server.Handler)
	s.Server.DisableGeneralOptionsHandler = true
	prev := s.Server.ConnContext
	s.Server.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
		if prev != nil {
			ctx = prev(ctx, c)
		}
		if fc, ok := c.(*framedConn); ok {
			ctx = context.WithValue(ctx, framedKey{}, fc)
		}
		if x := s.table.lookup(c); x != nil {
			ctx = context.WithValue(ctx, trackedKey{}, x)
			if x.tc != nil {
				go s.table.handshake(ctx, x.tc, x)
			}
		}
		return ctx
	}
	prevState := s.Server.ConnState
	s.Server.ConnState = func(c net.Conn, st http.ConnState) {
		s.table.changed(c, st)
		if fc, ok := c.(*framedConn); ok && st == http.StateClosed && fc.headTimedOut.Load() {
			s.refusedBy.add(s.Logger, RefusedHeadTimeout, fc.Conn.RemoteAddr().String(),
				"the request head did not arrive within the read header timeout: connection closed")
		}
		if prevState != nil {
			prevState(c, st)
		}
	}
}

// guard checks each request before next serves it, and times its body and its writes.
func (s *NetHTTP) guard(next http.Handler) http.Handler {
	if next == nil {
		next = http.DefaultServeMux
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if isH2Preface(r) {
			s.refusedBy.add(s.Logger, RefusedHTTP2, r.RemoteAddr, "HTTP/2 with prior knowledge: answered with GOAWAY HTTP_1_1_REQUIRED")
			hijackRefuseHTTP2(w)
			return
		}
		x, _ := r.Context().Value(trackedKey{}).(*tracked)
		if x != nil && x.parting.Load() {
			// The connection was parted from to make room as this request came: its last.
			w.Header().Set("Connection", "close")
		}
		fc, _ := r.Context().Value(framedKey{}).(*framedConn)
		if fc != nil {
			i := fc.served.Add(1) - 1 // requests on one connection are served one after the other
			if b := fc.f.bad.Load(); b != nil && i >= b.index {
				s.refusedBy.add(s.Logger, RefusedMalformed, r.RemoteAddr, "400 malformed request: "+b.why)
				s.refuse(w, "malformed request: "+b.why)
				return
			}
		}
		hasBody := r.Body != nil && r.Body != http.NoBody
		guarded := hasBody && (s.BodyReadTimeout > 0 || s.BodyStallTimeout > 0 || s.budget != nil)
		if s.WriteStallTimeout <= 0 && !guarded && !s.CloseUnauthorized && !s.noKeepAlive.Load() {
			next.ServeHTTP(w, r)
			noteServed(x, r, !hasBody)
			return
		}
		gw := &guardWriter{ResponseWriter: w, ctl: http.NewResponseController(w), stall: s.WriteStallTimeout,
			close401: s.CloseUnauthorized, noKeepAlive: &s.noKeepAlive}
		if x != nil {
			gw.tc = x.tc
		}
		if wt := s.Server.WriteTimeout; wt > 0 {
			gw.cap = time.Now().Add(wt)
		}
		if s.WriteStallTimeout > 0 && r.ProtoMajor == 1 {
			// The connection beneath lets a write past the stall bound's deadline go on while
			// the client takes the answer: a framedConn, or over TLS AbortStalled's.
			if fc != nil {
				fc.bound.set(s.WriteStallTimeout, gw.cap)
			} else if sc, ok := underTLS(gw.tc); ok {
				sc.bound.set(s.WriteStallTimeout, gw.cap)
			}
		}
		gw.arm()
		if guarded {
			gw.body = &timedBody{rc: r.Body, ctl: gw.ctl, w: w, timeout: s.BodyReadTimeout, rate: s.BodyMinRate,
				stall: s.BodyStallTimeout, hold: bodyHold{b: s.budget, length: r.ContentLength}}
			// A copy: Go's server must keep its own body, to decide what to do with the rest
			// of it after the answer.
			r2 := *r
			r2.Body = gw.body
			r = &r2
			defer gw.body.done()
		}
		next.ServeHTTP(gw, r)
		gw.decide() // nothing written: Go's server writes the head after the handler returns
		noteServed(x, r, !hasBody || gw.body != nil && gw.body.eof)
	})
}

// noteServed notes, on an HTTP/1 TLS connection (x its entry), what crypto/tls has read once
// r's handler has returned with r's body read whole (bodyRead): all of r, none of the next
// request, which its client sends only once it has the whole answer, and Go's server sends
// the answer's end (the last of its buffer, a chunked body's last chunk) after this. Taken
// when the connection goes idle instead (changed), as Go's server would have it, the start of
// a next request sent at once could be read already (Go's server reads the connection while a
// handler runs) and counted with this one: a head sent in parts, then, whose first arrived
// that soon, would not be known to be arriving. No byte beyond this request can have come yet
// (but for a client that pipelines), so that what crypto/tls has read is what the kernel
// counts received: one system call a request, not the two of taken. A body left unread (Go's
// server reads the rest after this) is not noted: changed takes it then. What remains: an
// answer that the handler flushed whole itself may have reached its client before this, and
// the start of the next request been read already, as at the idle change.
func noteServed(x *tracked, r *http.Request, bodyRead bool) {
	if x != nil && x.rc != nil && bodyRead && r.ProtoMajor == 1 {
		n, _ := receivedOf(x.rc) // 0 where the kernel does not tell (heard asks pending then)
		x.served.Store(int64(n))
	}
}

// hijackRefuseHTTP2 answers HTTP/2's preface as Server does (h2Refusal). Go's server hands the
// preface to the handler as a request (for a handler's own h2c upgrade) unless its Protocols
// serve unencrypted HTTP/2, and would otherwise close the connection after whatever the
// handler answers in HTTP/1.1, which an HTTP/2 client cannot read.
func hijackRefuseHTTP2(w http.ResponseWriter) {
	nc, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return // Go's server closes the connection after this request (Request.Close)
	}
	defer nc.Close()
	refuseHTTP2(nc, brw.Reader)
}

// refuse answers a request that must not be served, and closes its connection.
func (s *NetHTTP) refuse(w http.ResponseWriter, msg string) {
	ctype, body := "text/plain; charset=utf-8", []byte(msg)
	if s.ErrorBody != nil {
		ctype, body = s.ErrorBody(http.StatusBadRequest, msg)
	}
	h := w.Header()
	h.Set("Content-Type", ctype)
	h.Set("Connection", "close")
	// Go's server reads what is left of an unread body (up to 256 KB) before it closes, with no
	// deadline of its own: a body that never ends would hold the connection for good. Half a
	// second lets a client finish sending what it had on its way.
	_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(refuseDrain))
	w.WriteHeader(http.StatusBadRequest)
	_, _ = w.Write(body)
}

// refuseDrain bounds the read of a refused request's body before its connection closes.
const refuseDrain = 500 * time.Millisecond

// timedBody bounds the time a handler waits for the request body with read deadlines (the
// body timeout from the first read, one more second for every rate bytes received; the stall
// bound from the body's last progress), and holds the body's share of the budget.
type timedBody struct {
	rc      io.ReadCloser
	ctl     *http.ResponseController
	w       http.ResponseWriter // to mark a refusal (ErrBodyMemory)
	timeout time.Duration
	rate    int64
	stall   time.Duration
	hold    bodyHold
	// start is the first read; progress the body's last progress (moved on by the time the
	// handler spent away from the body), when it had progressRead bytes; lastEnd the end of
	// the last read.
	start, progress, lastEnd time.Time
	progressRead             int64
	deadline                 time.Time // the read deadline set; zero: none
	read                     int64
	eof                      bool
	expired                  bool
}

func (b *timedBody) timed() bool { return b.timeout > 0 || b.stall > 0 }

func (b *timedBody) Read(p []byte) (int, error) {
	if b.eof {
		return 0, io.EOF
	}
	if b.hold.b != nil && !b.hold.cover(b.read, len(p)) {
		h := b.w.Header()
		refuseBudget(h)
		h.Set("Connection", "close") // the rest of the body is not read
		return 0, ErrBodyMemory
	}
	timed := b.timed()
	if timed {
		now := time.Now()
		if b.start.IsZero() {
			b.start, b.progress = now, now
		} else {
			b.progress = b.progress.Add(now.Sub(b.lastEnd))
		}
		b.arm()
	}
	n, err := b.rc.Read(p)
	b.read += int64(n)
	if timed {
		b.lastEnd = time.Now()
		if b.read-b.progressRead >= max(b.rate, 1) {
			b.progress, b.progressRead = b.lastEnd, b.read
		}
	}
	switch {
	case err == io.EOF:
		b.eof = true
		b.hold.drop()
		// Go's server reads the connection in the background from now on: no deadline there.
		if !b.deadline.IsZero() {
			_ = b.ctl.SetReadDeadline(time.Time{})
		}
	case err != nil:
		if errors.Is(err, os.ErrDeadlineExceeded) {
			b.expired = true
			err = ErrBodyReadTimeout
		}
	}
	return n, err
}

// due is when the body's time runs out: the timeout from the first read plus a second for
// every rate bytes, or the stall bound from its last progress, whichever comes first; zero:
// none.
func (b *timedBody) due() time.Time {
	var d time.Time
	if b.timeout > 0 {
		d = b.start.Add(b.timeout)
		if b.rate > 0 {
			d = d.Add(time.Duration(float64(b.read) / float64(b.rate) * float64(time.Second)))
		}
	}
	if b.stall > 0 {
		if s := b.progress.Add(b.stall); d.IsZero() || s.Before(d) {
			d = s
		}
	}
	return d
}

// arm sets the read deadline to due, the first time and then once due has moved on by an eighth
// of the shorter bound, not at every read: each is a timer's reset. (due never moves back.)
func (b *timedBody) arm() {
	d := b.due()
	step := b.timeout
	if b.stall > 0 && (step <= 0 || b.stall < step) {
		step = b.stall
	}
	if d.IsZero() || !b.deadline.IsZero() && d.Sub(b.deadline) < step/8 {
		return
	}
	b.deadline = d
	_ = b.ctl.SetReadDeadline(d)
}

func (b *timedBody) Close() error { return b.rc.Close() }

// bound bounds what Go's server reads of a body the handler left unread: when the answer's
// headers go out it drops up to 256 KB of it to keep the connection.
func (b *timedBody) bound() {
	if b.start.IsZero() && !b.eof && b.timed() {
		b.start = time.Now()
		b.progress = b.start
		b.arm()
	}
}

// done ends the body's part in the request: its unread rest bounded, its hold given back.
func (b *timedBody) done() {
	b.bound()
	b.hold.drop()
}

// guardWriter renews the connection's write deadline as the handler writes, so that each write
// has the stall timeout to reach the client (never beyond the server's WriteTimeout), and
// bounds the read of the body's rest that Go's server does when the answer starts.
type guardWriter struct {
	http.ResponseWriter
	ctl      *http.ResponseController
	body     *timedBody    // nil: not timed
	stall    time.Duration // 0: none
	cap      time.Time     // the server's whole-response deadline; zero: none
	armed    time.Time
	close401 bool // CloseUnauthorized
	head     bool // see noKeepAlive (next to close401: the struct stays within 112 bytes)
	// noKeepAlive is the server's SetKeepAlivesEnabled(false), read when the head goes out
	// (head: it has), not when the request came: a request in flight when the shutdown began
	// answers after it.
	noKeepAlive *atomic.Bool
	// tc is the request's TLS connection (nil: a plain one, whose framedConn sees its write
	// timeouts itself), made abortive by a write past its deadline.
	tc *tls.Conn
}

// WriteHeader ends the connection after a 401 (CloseUnauthorized), or after any answer once
// keep-alives are off.
func (w *guardWriter) WriteHeader(code int) {
	if code == http.StatusUnauthorized && w.close401 {
		w.Header().Set("Connection", "close")
	}
	if code >= 200 { // 1xx are interim answers: the final head is still to come
		w.decide()
	}
	w.ResponseWriter.WriteHeader(code)
}

// decide asks for Connection: close on the head about to go out if keep-alives are off.
func (w *guardWriter) decide() {
	if !w.head {
		w.head = true
		if w.noKeepAlive.Load() {
			w.Header().Set("Connection", "close")
		}
	}
}

// arm sets the write deadline again once a quarter of it has passed (not at every write: each
// is a timer's reset).
func (w *guardWriter) arm() {
	if w.body != nil {
		w.body.bound()
	}
	if w.stall <= 0 {
		return
	}
	now := time.Now()
	if !w.armed.IsZero() && w.armed.Sub(now) > w.stall*3/4 {
		return
	}
	w.armed = now.Add(w.stall)
	if !w.cap.IsZero() && w.cap.Before(w.armed) {
		w.armed = w.cap
	}
	_ = w.ctl.SetWriteDeadline(w.armed)
}

func (w *guardWriter) Write(p []byte) (int, error) {
	w.decide()
	w.arm()
	n, err := w.ResponseWriter.Write(p)
	if err != nil {
		w.failed(err)
	}
	return n, err
}

// failed makes a TLS connection's close abortive (setAbortive) when a write ran past its
// deadline, as framedConn.Write does a plain one's. It sees the stalls in the handler's flushes
// (a stream's events), not those in its writes, where Go's server closes the connection before
// it returns the error, nor one in the last flush after the handler returned: those TLS
// connections close gracefully, unless AbortStalled's connection is under TLS (it sees them).
func (w *guardWriter) failed(err error) {
	if w.tc != nil && isTimeout(err) {
		setAbortive(w.tc)
	}
}

// underTLS returns AbortStalled's connection under tc, if that is what is there.
func underTLS(tc *tls.Conn) (*stallConn, bool) {
	if tc == nil {
		return nil, false
	}
	sc, ok := tc.NetConn().(*stallConn)
	return sc, ok
}

// Flush sends what is buffered (SSE events go out at once).
func (w *guardWriter) Flush() { _ = w.FlushError() }

// FlushError is Flush that reports a write error (http.ResponseController uses it).
func (w *guardWriter) FlushError() error {
	w.decide()
	w.arm()
	err := w.ctl.Flush()
	if err != nil {
		w.failed(err)
	}
	return err
}

// Unwrap lets http.ResponseController reach the server's writer.
func (w *guardWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// freshGrace is freshGrace for Go's server's timeouts: the header's, or the whole request's.
func (s *NetHTTP) freshGrace() time.Duration {
	d := s.Server.ReadHeaderTimeout
	if d <= 0 {
		d = s.Server.ReadTimeout
	}
	return freshGrace(d)
}

// framedListener hands net/http its plain connections wrapped in a framedConn, and refuses
// those beyond MaxConns.
type framedListener struct {
	net.Listener
	s *NetHTTP
}

func (l framedListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if _, ok := c.(*tls.Conn); !ok { // Go's server needs a *tls.Conn itself
			fc := &framedConn{Conn: c, s: l.s}
			fc.f.head.reset(false)
			c = fc
		}
		if l.s.table.add(c, l.s.MaxConns, l.s.freshGrace()) {
			return c, nil
		}
		l.s.refusals.refuse(c, maxLingering(l.s.MaxConns, l.s.MaxLingering), l.s.ErrorBody)
	}
}

// framedConn follows the requests in the bytes Go's server reads from the connection.
type framedConn struct {
	net.Conn
	s *NetHTTP // whose refusals it counts
	f framer
	// headTimedOut: a read of Go's server's timed out in a head begun (Read); counted as a
	// refusal when Go's server closes the connection then (install's ConnState hook).
	headTimedOut atomic.Bool
	// served counts the requests handed to the handler (the guard), heads the request heads
	// whose first byte Go's server has read: more heads than served, a request is arriving,
	// or read and about to be served (connTable.reading). The reading goroutine keeps shown,
	// the heads published.
	served, heads atomic.Int64
	shown         int64
	bound         stallBound // set by the guard
}

func (c *framedConn) Read(p []byte) (int, error) {
	for {
		n, err := c.Conn.Read(p)
		if n > 0 {
			n = c.f.feed(p[:n])
			if c.f.begun != c.shown {
				c.shown = c.f.begun
				c.heads.Store(c.shown)
			}
		}
		if err != nil && c.f.inHead && isTimeout(err) {
			// Go's server closes the connection of a head past ReadHeaderTimeout (or
			// ReadTimeout) without an answer. A timeout in no head begun is the idle
			// timeout, or the end of Go's background read while a handler runs; one that
			// ends a read on a connection hijacked (HTTP/2's preface, refused) is not Go's
			// server's: such a connection is never closed by it (StateClosed).
			c.headTimedOut.Store(true)
		}
		// A read whose bytes were all dropped (empty lines before a request) reads on: one
		// that returns nothing would end a background read of Go's server's, unwatched.
		if n > 0 || err != nil || len(p) == 0 {
			return n, err
		}
	}
}

// Write is the connection's, gone on past the stall bound's deadline while the client takes
// the answer (stallBound): one that ran past its deadline (the stall bound, WriteTimeout)
// makes the connection's close abortive (setAbortive), whichever of Go's server's writes it was
// (the handler's, or the final flush after it returned). Go's server takes no other request on
// a connection whose write failed.
// An answer net/http's server writes itself, to a request it could not read, is counted as a
// refusal (netHTTPRefusal): the check costs a comparison of the first bytes of each write.
func (c *framedConn) Write(p []byte) (int, error) {
	if len(p) > 0 && p[0] == 'H' {
		if why, line, ok := netHTTPRefusal(p); ok {
			c.s.refusedBy.add(c.s.Logger, why, c.Conn.RemoteAddr().String(), line)
		}
	}
	return c.bound.write(c.Conn, p)
}

// NetConn returns the connection under the framing (setAbortive).
func (c *framedConn) NetConn() net.Conn { return c.Conn }

// CloseWrite lets Go's server half-close the connection, as it does before closing one whose
// client may still be sending.
func (c *framedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// framer follows the framing of the requests on a connection (heads, bodies by length or in
// chunks) as Go's server reads them, checks each head, and records the first request to
// refuse. Where it cannot follow (framing that Go refuses too, which ends the connection) it
// refuses the rest of the connection's requests: a stream it cannot follow is not one to serve
// blind.
type framer struct {
	st     uint8
	head   headScan
	left   uint64 // body or chunk bytes still to come
	digits int    // hex digits of the chunk size read so far
	crlf   int    // bytes of the CRLF after a chunk's data read so far
	heads  int64  // heads read to their end
	// begun counts the heads whose first byte was read; inHead: the scan is in such a head.
	begun  int64
	inHead bool
	// empty counts the empty lines dropped before the next head (skipEmpty); emptyCR: the
	// last byte dropped was a CR, whose LF is to come.
	empty   uint8
	emptyCR bool
	bad     atomic.Pointer[badHead]
}

// badHead is a request to refuse: the index-th on its connection, from 0.
type badHead struct {
	index int64
	why   string
}

// States of framer.
const (
	frHead      = iota // in a request head
	frBody             // in a body of known length
	frChunkSize        // in a chunk's size
	frChunkLine        // in the rest of a chunk's size line
	frChunkData        // in a chunk's data
	frChunkEnd         // in the CRLF after a chunk's data
	frTrailer          // in the trailer section after the last chunk
	frLost             // no longer following
)

// feed reads p, the next bytes Go's server reads from the connection, and returns how many of
// them it keeps, moved to p's start: all but the empty lines before a request line, which it
// drops (skipEmpty), so that Go's server, which tolerates a few bytes of them only after a
// POST, never sees them.
func (f *framer) feed(p []byte) int {
	w, i := 0, 0 // p[:w] is kept, p[i:] still to read
	for i < len(p) {
		q := p[i:]
		k := len(q) // the bytes this step reads, kept: all of them unless it says less
		switch f.st {
		case frHead:
			if !f.inHead {
				if f.skipEmpty(q[0]) {
					i++
					continue
				}
				if f.st != frHead {
					continue // lost: the rest is kept as it comes
				}
				f.inHead = true
				f.begun++
			}
			k = f.head.scan(q)
			if f.head.done() {
				f.endHead()
			}
		case frBody, frChunkData:
			n := min(uint64(len(q)), f.left)
			k, f.left = int(n), f.left-n
			switch {
			case f.left > 0:
			case f.st == frBody:
				f.nextHead()
			default:
				f.st, f.crlf = frChunkEnd, 0
			}
		case frChunkSize:
			v := unhex(q[0])
			if v < 0 {
				if f.digits == 0 {
					f.lose(f.heads) // Go refuses an empty chunk size
					break
				}
				f.st, k = frChunkLine, 0
				break
			}
			if f.digits++; f.digits > 16 {
				f.lose(f.heads) // too large: Go refuses it
				break
			}
			f.left = f.left<<4 | uint64(v)
			k = 1
		case frChunkLine:
			j := bytes.IndexByte(q, '\n')
			if j < 0 {
				break
			}
			k = j + 1
			if f.left == 0 {
				f.head.reset(true)
				f.st = frTrailer
			} else {
				f.st = frChunkData
			}
		case frChunkEnd:
			if q[0] != "\r\n"[f.crlf] {
				f.lose(f.heads) // Go refuses the chunk
				break
			}
			k = 1
			if f.crlf++; f.crlf == 2 {
				f.st, f.left, f.digits = frChunkSize, 0, 0
			}
		case frTrailer:
			k = f.head.scan(q)
			if f.head.done() {
				f.nextHead()
			}
		}
		if w != i {
			copy(p[w:], q[:k])
		}
		w, i = w+k, i+k
	}
	return w
}

// maxEmptyLines is how many empty lines before a request line are ignored. RFC 9112 section
// 2.2: a server SHOULD ignore at least one (some clients send a CRLF after a POST's body); a
// few more cost nothing, and more than a few are no client's.
const maxEmptyLines = 4

// skipEmpty reads b, a byte before a request line's first, and reports whether it is to be
// dropped: part of one of the first maxEmptyLines empty lines (CRLF, or a bare LF), as Server
// drops them (skipEmptyLines). Past them, or after a CR that no LF follows (the CR dropped
// already), it stops following: the request that comes is refused, as Server refuses it.
func (f *framer) skipEmpty(b byte) bool {
	if f.emptyCR {
		f.emptyCR = false
		if b == '\n' {
			f.empty++
			return true
		}
		f.lose(f.heads)
		return false
	}
	if b != '\r' && b != '\n' {
		return false
	}
	if f.empty >= maxEmptyLines {
		f.st = frLost
		f.bad.CompareAndSwap(nil, &badHead{index: f.heads, why: tooManyEmptyLines})
		return false
	}
	if b == '\r' {
		f.emptyCR = true
	} else {
		f.empty++
	}
	return true
}

// tooManyEmptyLines says why a request after more than maxEmptyLines empty lines is refused.
const tooManyEmptyLines = "more than 4 empty lines before the request line"

// endHead checks the head just read and moves on to its body.
func (f *framer) endHead() {
	i := f.heads
	f.heads++
	f.inHead = false
	h := &f.head
	if why := h.smuggling(); why != "" {
		f.bad.Store(&badHead{index: i, why: why})
		f.st = frLost // the connection ends with that request
		return
	}
	switch {
	case h.seen&sawOddFraming != 0:
		f.lose(i) // Go refuses the request itself
	case h.seen&sawTE != 0:
		if h.seen&sawChunked == 0 {
			f.lose(i) // a coding Go does not serve
			return
		}
		f.st, f.left, f.digits = frChunkSize, 0, 0
	case h.seen&sawCL != 0 && h.cl > 0:
		f.st, f.left = frBody, uint64(h.cl)
	default:
		f.nextHead()
	}
}

// lose stops following: the index-th request and those after it are refused.
func (f *framer) lose(index int64) {
	f.st = frLost
	f.bad.CompareAndSwap(nil, &badHead{index: index, why: "framing that cannot be followed"})
}

func (f *framer) nextHead() {
	f.head.reset(false)
	f.st = frHead
	f.inHead = false
	f.empty, f.emptyCR = 0, false
}

func unhex(b byte) int {
	switch {
	case '0' <= b && b <= '9':
		return int(b - '0')
	case 'a' <= b && b <= 'f':
		return int(b-'a') + 10
	case 'A' <= b && b <= 'F':
		return int(b-'A') + 10
	}
	return -1
}
