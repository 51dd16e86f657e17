package h1

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Stats are a server's counts of connections and of request body bytes, for metrics.
type Stats struct {
	// Conns is the number of open client connections (hijacked ones and those closed, or
	// parted from, to make room excepted).
	Conns int
	// ConnsEvicted counts the connections closed (or parted from), while they waited for a
	// request, to make room for a new one at MaxConns; ConnsRefused the new connections
	// refused at MaxConns because none waited.
	ConnsEvicted, ConnsRefused uint64
	// BodyBytes is the request body bytes counted against MaxPendingBodyBytes now;
	// BodiesRefused counts the body reads refused because the cap stayed reached.
	BodyBytes     int64
	BodiesRefused uint64
	// Refused counts the requests refused before any handler saw them, by reason (Refusal):
	// what the router's metrics and access log never hear of.
	Refused [NumRefusals]uint64
}

// ErrBodyMemory is what reading a request body returns when the server holds as many bytes of
// bodies still being received as MaxPendingBodyBytes allows, and no room came within a second.
// The response then carries Retry-After (1 s, unless the handler set one) and its connection
// is closed after it: the rest of the body is never read. A handler answers 503.
var ErrBodyMemory = errors.New("h1: too many request body bytes being received: retry shortly")

// Amounts of a body's hold on the budget (bodyHold).
const (
	// firstHold is the longest announced length held whole at a body's first read: what a
	// handler may allocate at once for a body it knows the length of (the router's proxy
	// reads a body up to 1 MiB into one buffer of its length, a longer one in pieces as it
	// comes). A longer body is held in steps ahead of its bytes, so that announcing a large
	// body and sending little of it takes little of the budget.
	firstHold = 1 << 20
	// holdStep is the least a hold grows by, so that a large body takes the budget's lock
	// once per 256 KiB rather than per read.
	holdStep = 256 << 10
	// budgetWait is how long a body read waits for room in the budget before it is refused.
	budgetWait = time.Second
)

// budget bounds the bytes of request bodies being received: the bodies that have started to be
// read and have not ended (nor their requests). Reads wait for room in the order they asked.
type budget struct {
	limit   int64
	mu      sync.Mutex
	used    int64
	waiters []*budgetWaiter // in order of arrival
	refused atomic.Uint64
}

type budgetWaiter struct {
	n     int64
	ready chan struct{} // closed once n is granted
}

func newBudget(limit int64) *budget {
	if limit <= 0 {
		return nil
	}
	return &budget{limit: limit}
}

// held is the bytes granted now.
func (b *budget) held() int64 {
	if b == nil {
		return 0
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

// acquire grants n bytes, waiting up to wait for them; it reports whether it did. A request
// larger than the whole budget waits for the budget to be empty, so that one body larger than
// the budget can still be read on its own (the caller bounds bodies, not this).
func (b *budget) acquire(n int64, wait time.Duration) bool {
	b.mu.Lock()
	if len(b.waiters) == 0 && b.fits(n) {
		b.used += n
		b.mu.Unlock()
		return true
	}
	w := &budgetWaiter{n: n, ready: make(chan struct{})}
	b.waiters = append(b.waiters, w)
	b.mu.Unlock()
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-w.ready:
		return true
	case <-t.C:
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	select {
	case <-w.ready: // granted as the wait ran out
		return true
	default:
	}
	for i, x := range b.waiters {
		if x == w {
			b.waiters = append(b.waiters[:i], b.waiters[i+1:]...)
			break
		}
	}
	b.grantLocked() // the next ones may fit now that this one leaves
	b.refused.Add(1)
	return false
}

func (b *budget) fits(n int64) bool { return b.used+n <= b.limit || b.used == 0 }

// release gives n bytes back and grants the waiters that fit, in order.
func (b *budget) release(n int64) {
	b.mu.Lock()
	b.used -= n
	b.grantLocked()
	b.mu.Unlock()
}

func (b *budget) grantLocked() {
	for len(b.waiters) > 0 && b.fits(b.waiters[0].n) {
		w := b.waiters[0]
		b.waiters = b.waiters[1:]
		b.used += w.n
		close(w.ready)
	}
}

// bodyHold is one request body's share of a budget: what was granted to it, never less than
// the bytes read from it. It grows ahead of the reads (a body announced at most firstHold long
// is held whole at once, others by holdStep) and is given back when the body ends or its
// request does.
type bodyHold struct {
	b      *budget // nil: no budget
	length int64   // announced; -1: unknown
	n      int64
}

// cover makes the hold cover read+next bytes of the body (at most its announced length),
// waiting briefly for room; false: refused.
func (h *bodyHold) cover(read int64, next int) bool {
	want := read + int64(next)
	if h.length >= 0 {
		want = min(want, h.length)
	}
	if want <= h.n {
		return true
	}
	grow := max(want-h.n, holdStep)
	if h.n == 0 && h.length > 0 && h.length <= firstHold {
		grow = max(grow, h.length)
	}
	if h.length >= 0 {
		grow = min(grow, h.length-h.n)
	}
	if !h.b.acquire(grow, budgetWait) {
		return false
	}
	h.n += grow
	return true
}

// drop gives the hold back; the body counts no more (what the server reads of it after its
// request, to keep the connection, is dropped as it comes).
func (h *bodyHold) drop() {
	if h.n > 0 {
		h.b.release(h.n)
		h.n = 0
	}
	h.b = nil
}

// Retry-After sent with a body refused for the budget.
const budgetRetryAfter = "1"

// refuseBudget marks a response whose body read was refused for the budget.
func refuseBudget(h http.Header) {
	if h.Get("Retry-After") == "" {
		h.Set("Retry-After", budgetRetryAfter)
	}
}

// evictBatch is how many waiting connections are closed at once when a new one finds limit
// reached: one scan of the connections makes room for the next few as well (nginx closes up
// to 32 of its reusable connections at once): a 64th of limit, 1 to 16.
func evictBatch(limit int) int { return min(max(limit/64, 1), 16) }

// oldest keeps the n oldest of the candidates offered to it, the waiting ones that are idle
// kept-alive connections before those that have sent no request yet.
type oldest[T any] struct {
	n    int
	keep []candidate[T]
}

type candidate[T any] struct {
	c     T
	fresh bool  // no request yet: after the idle ones
	since int64 // Unix ns
}

func (o *oldest[T]) before(a, b candidate[T]) bool {
	if a.fresh != b.fresh {
		return !a.fresh
	}
	return a.since < b.since
}

// offer considers c; the kept ones stay sorted, oldest first (n is small).
func (o *oldest[T]) offer(c T, fresh bool, since int64) {
	x := candidate[T]{c, fresh, since}
	if len(o.keep) == o.n {
		if !o.before(x, o.keep[o.n-1]) {
			return
		}
		o.keep = o.keep[:o.n-1]
	}
	i := len(o.keep)
	for i > 0 && o.before(x, o.keep[i-1]) {
		i--
	}
	o.keep = append(o.keep, x)
	copy(o.keep[i+1:], o.keep[i:])
	o.keep[i] = x
}

// Refusals at MaxConns (refuser).
const (
	// refuseWait bounds the wait for a refused connection's request to begin before the 503
	// goes: an answer that comes before the client has sent anything, some clients (Go's)
	// take for a broken connection.
	refuseWait = 500 * time.Millisecond
	// lingerTime and lingerBytes bound what is read and dropped of a connection the server
	// is done with, once it has sent its FIN (closeWriteAndDrain).
	lingerTime  = 500 * time.Millisecond
	lingerBytes = 1 << 20
)

// maxLingering is how many refused connections may linger at once (refuser), together with the
// kept-alive connections parted from to make room (Server.evictWaiting, connTable.evictLocked),
// for a server of maxConns whose MaxLingering is budget: a 32nd of maxConns, 64 to 128, and at
// most budget when set (negative: none). Beyond it a refusal is written before the client's
// request, which Go's client fails ("Unsolicited response received on idle HTTP channel")
// rather than read: under a flood, each client over the cap has about one refusal lingering
// at a time (it sends again once it has read the last), so the least is what a flood of 64
// clients over a small cap needs (50 clients without backoff at a cap of 8, 3 s: 28 such
// failures with the old least of 4, none with 64). Each holds a goroutine and an open file,
// on top of MaxConns, for up to two seconds (refuseWait, the answer's write, lingerTime), less
// when the client sends at once and closes after the answer; a parted connection holds its
// file for idleGrace, or until the answer to the request that arrived on it. The 64 to 128
// fit a process with files to spare; one short of them bounds them by what it keeps aside
// (app gives each server a share of the open files its caps leave), lest the files they hold
// fail its accepts and its engine dials (EMFILE).
func maxLingering(maxConns, budget int) int32 {
	n := min(max(maxConns/32, 64), 128)
	if budget != 0 {
		n = min(n, max(budget, 0))
	}
	return int32(n)
}

// MaxLingering is the most connections refused at a cap of maxConns that a server whose
// MaxLingering is budget lets linger at once (0: the default bound alone), for logs and tests.
func MaxLingering(maxConns, budget int) int { return int(maxLingering(maxConns, budget)) }

// freshGrace is how long a new connection that has sent nothing yet is left alone at the
// connection cap (evictWaiting, connTable.evictLocked), for a server whose request heads may
// take readHeader (0: no bound): a second, or a quarter of readHeader if less. A client that
// dialled sends its request within a round trip, or three with a TLS handshake: far less
// than a second on the paths a router serves. Closed before it could, the connection fails
// a request that Go's client, among others, does not send again (a POST). A connection
// silent for longer is one opened ahead of need, or a slow client: one that can give way.
// The quarter keeps a server with a short header timeout from holding its waiting
// connections for most of their time, as the janitor times that timeout in quarters.
func freshGrace(readHeader time.Duration) time.Duration {
	if readHeader > 0 {
		return min(time.Second, readHeader/4)
	}
	return time.Second
}

// heard reports whether the client of nc, a connection waiting for a request, has sent it
// more than from bytes: from is 0 on a plain connection; over TLS, what crypto/tls had read
// when the handshake ended, or when the last request was served (a kept-alive connection),
// so that neither the handshake's bytes nor an earlier request's count (crypto/tls reads them,
// below what either server sees); negative: the handshake has not ended, and nothing beyond it
// can have been read. Where the kernel does not count the bytes received, it is whether bytes
// wait (pending).
func heard(nc net.Conn, from int64) bool {
	if from < 0 {
		return false
	}
	if n, ok := received(nc); ok {
		return n > uint64(from)
	}
	return pending(nc)
}

// takenSoFar is what the reader of nc has taken of its client's bytes so far (taken): a TLS
// connection's from for heard, as it begins to wait for a request, so that what is still
// waiting in the socket then counts as heard. 0 where the kernel does not tell (heard asks
// pending then).
func takenSoFar(nc net.Conn) int64 {
	n, _ := taken(nc)
	return int64(n)
}

// idleGrace is how long, once a shutdown has begun, a kept-alive connection stays open after
// an answer whose head went out before it (and so could not carry Connection: close): a
// client that sends its next request at once (a round trip after the answer's end, 300 ms
// at most between continents) has it answered, with Connection: close, rather than met by
// the close (a reset or an EOF, which a POST does not survive). It delays a shutdown's end
// by at most this after the last such answer, within the second a cut request has
// (app's cutGrace); a connection idle for longer when the shutdown began is closed then.
// For the same reason a kept-alive connection closed to make room at MaxConns stays open
// this long after it was taken (parted from): its client may be sending on it as it is
// taken, and cannot know before the close reaches it, a round trip later.
const idleGrace = 500 * time.Millisecond

// refuser answers the connections a server refuses at MaxConns with 503, each on a goroutine
// of its own, so that the accept loop goes on at once: it waits for the request to begin
// (refuseWait), answers, and closes the connection as closeWriteAndDrain does. Closed at
// once with the request unread, the connection would be reset by the kernel: the client's
// write of its request fails (connection reset, broken pipe) and it may never read the 503.
// Beyond maxLingering at once, a connection is answered at once and closed (a fresh socket
// takes the answer without waiting), as all were before.
//
// A TLS connection's answer needs its handshake first, which costs the server a signature
// and a key exchange: BenchmarkRefusal, on a 2-vCPU VM, gives 0.3 ms of CPU per refusal with
// an ECDSA P-256 certificate and 1.2 ms with RSA 2048, against 0.05 ms for a plain one (up to
// half as much again on a loaded machine). Those within maxLingering get it, within
// refuseWait of the accept for the handshake and the request's start together, and their
// 503 then (or, on HTTP/2, a GOAWAY that refuses the client's streams); beyond it a TLS
// connection is closed without a word (its client sees the handshake fail, EOF or a reset,
// and should retry after a pause as after a 503): the bound that keeps the open files in
// check also bounds the handshakes spent on refusals to maxLingering at once. At the cap the
// server is short of connections, not necessarily of CPU (a cap full of long streams leaves
// the CPU idle), and a client that reads a 503 with Retry-After comes back later, where one
// whose handshake failed may come back at once.
type refuser struct {
	lingering atomic.Int32
}

func (r *refuser) refuse(nc net.Conn, limit int32, errorBody func(int, string) (string, []byte)) {
	if !r.take(limit) {
		if _, ok := nc.(*tls.Conn); !ok {
			writeRefusal(nc, errorBody)
		}
		_ = nc.Close()
		return
	}
	go func() {
		defer r.lingering.Add(-1)
		lingerRefusal(nc, errorBody)
	}()
}

// lingerRefusal answers a refused connection once its request begins (or refuseWait after
// the call, its TLS handshake included) and closes it as closeWriteAndDrain does.
func lingerRefusal(nc net.Conn, errorBody func(int, string) (string, []byte)) {
	defer nc.Close()
	_ = nc.SetReadDeadline(time.Now().Add(refuseWait))
	if tc, ok := nc.(*tls.Conn); ok {
		_ = nc.SetWriteDeadline(time.Now().Add(refuseWait))
		if tc.Handshake() != nil {
			return
		}
		if tc.ConnectionState().NegotiatedProtocol == "h2" {
			writeGoAway(nc)
			closeWriteAndDrain(nc)
			return
		}
	}
	var b [512]byte
	_, _ = nc.Read(b[:])
	writeRefusal(nc, errorBody)
	closeWriteAndDrain(nc)
}

// writeGoAway refuses an HTTP/2 connection (RFC 9113): it sends the server's preface (an
// empty SETTINGS frame), then a GOAWAY frame whose last stream is 0, so that the client knows
// that none of its streams was processed and may send them again, with the error
// REFUSED_STREAM and, as debug data, what a 503 would have said.
func writeGoAway(nc net.Conn) {
	const debug = "the server has as many connections open as it takes: retry shortly"
	b := make([]byte, 0, 9+9+8+len(debug))
	b = append(b, 0, 0, 0, 0x4, 0, 0, 0, 0, 0) // SETTINGS, empty, on stream 0
	n := 8 + len(debug)
	b = append(b, byte(n>>16), byte(n>>8), byte(n), 0x7, 0, 0, 0, 0, 0) // GOAWAY, on stream 0
	b = append(b, 0, 0, 0, 0, 0, 0, 0, 0x7)                             // last stream 0; REFUSED_STREAM
	b = append(b, debug...)
	_ = nc.SetWriteDeadline(time.Now().Add(time.Second))
	_, _ = nc.Write(b)
}

// take takes a lingering slot, if fewer than limit are taken, and reports whether it did.
func (r *refuser) take(limit int32) bool {
	if r.lingering.Add(1) <= limit {
		return true
	}
	r.lingering.Add(-1)
	return false
}

// writeRefusal writes the 503 of a connection refused at MaxConns.
func writeRefusal(nc net.Conn, errorBody func(int, string) (string, []byte)) {
	const msg = "the server has as many connections open as it takes: retry shortly"
	ctype, body := "text/plain; charset=utf-8", []byte(msg)
	if errorBody != nil {
		ctype, body = errorBody(http.StatusServiceUnavailable, msg)
	}
	_ = nc.SetWriteDeadline(time.Now().Add(time.Second))
	head := "HTTP/1.1 503 Service Unavailable\r\nContent-Type: " + ctype + "\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: "
	_, _ = nc.Write(append(append(strconv.AppendInt([]byte(head), int64(len(body)), 10), "\r\n\r\n"...), body...))
}

// closeWriteAndDrain ends the sending side of a connection whose client may still be sending
// (the rest of a head or body the server will not read): closing it with unread input would
// reset it, and a reset can make the client drop the answer it has not read yet. So it sends
// the server's FIN, then reads and drops what still comes for up to lingerTime (and
// lingerBytes), or until the client closes its side; the caller then closes the connection.
func closeWriteAndDrain(nc net.Conn) {
	cw, ok := nc.(interface{ CloseWrite() error })
	if !ok || cw.CloseWrite() != nil {
		return
	}
	_ = nc.SetReadDeadline(time.Now().Add(lingerTime))
	_, _ = io.CopyN(io.Discard, nc, lingerBytes)
}

// connTable follows the connections Go's server serves (NetHTTP), for MaxConns and Stats:
// Accept adds each, Go's server's ConnState hook moves it from state to state and removes it.
type connTable struct {
	mu      sync.Mutex
	conns   map[net.Conn]*tracked
	open    int // in conns, less those closed to make room
	evicted atomic.Uint64
	refused atomic.Uint64
	// linger holds the lingering slots (the server's refuser) that the connections parted
	// from take, lingerLimit of them at most (maxLingering).
	linger      *refuser
	lingerLimit int32
	// headBound is how long a request's head may take (Go's server's ReadHeaderTimeout, else
	// its ReadTimeout; 0: no bound): a head arriving for longer no longer keeps its connection
	// from being closed while it waits (reading).
	headBound time.Duration
}

type tracked struct {
	state   http.ConnState
	since   int64 // Unix ns
	evicted bool
	// h2: the connection speaks HTTP/2 (over TLS), known from its first StateActive (seen);
	// closed: the shutdown, or the end of its parting, closed it while it waited; heard: over
	// TLS, waiting for a request (new or idle), its client has sent something since it began
	// to wait (arriving; reset at each change of state).
	seen, h2, closed, heard bool
	// headN is the framer's count of heads begun (framedConn.heads) when the table first
	// found a head arriving on the connection, headSince when (Unix ns): reading. Over TLS,
	// headSince is when the table found the connection heard (a new one's accept).
	headN, headSince int64
	// from is, over TLS, what crypto/tls had read (takenSoFar) when the connection began to
	// wait for a request: when its handshake ended (-1 until then: handshake), when its last
	// request was served (changed). heard counts what came beyond.
	from atomic.Int64
	// served is, over TLS, what crypto/tls had read when the handler of the request being
	// served returned, that request's body read whole (noteServed); -1: not noted.
	// changed takes it as from when the connection goes idle.
	served atomic.Int64
	// parting: closed to make room while idle, but left open for idleGrace for a request its
	// client sent as it was taken, which is answered with Connection: close (evictLocked). It
	// holds a lingering slot until it closes. Read by NetHTTP's guard, off the lock.
	parting atomic.Bool
	// tc is the connection when it is a TLS one (NetHTTP's guard makes its close abortive after
	// a write stall: guardWriter.failed), rc its socket's SyscallConn (noteServed), nil where
	// it has none.
	tc *tls.Conn
	rc syscall.RawConn
}

// add counts in a new connection, closing waiting ones to make room at limit (0: no bound),
// new ones only once they have waited grace; false: the connection is refused.
func (t *connTable) add(c net.Conn, limit int, grace time.Duration) bool {
	t.mu.Lock()
	var victims []net.Conn
	if limit > 0 && t.open >= limit {
		var made int
		if victims, made = t.evictLocked(limit, grace); made == 0 {
			t.mu.Unlock()
			t.refused.Add(1)
			return false
		}
	}
	x := &tracked{state: http.StateNew, since: time.Now().UnixNano()}
	if x.tc, _ = c.(*tls.Conn); x.tc != nil {
		x.from.Store(-1) // until handshake notes the handshake's end
		x.served.Store(-1)
		if sc, ok := x.tc.NetConn().(syscall.Conn); ok {
			x.rc, _ = sc.SyscallConn()
		}
	}
	t.conns[c] = x
	t.open++
	t.mu.Unlock()
	closeEvicted(victims)
	return true
}

// closeEvicted closes the connections taken out of service to make room, on a goroutine of
// their own (one for the batch: evictBatch of them at most), so that the accept loop goes on
// at once. A TLS connection's Close sends close_notify first, with a write deadline of 5 s
// (crypto/tls): a client that does not read could hold the loop that long per victim.
func closeEvicted(victims []net.Conn) {
	if len(victims) == 0 {
		return
	}
	go func() {
		for _, v := range victims {
			_ = v.Close()
		}
	}()
}

// evictLocked picks up to evictBatch(limit) waiting connections to take out, as
// Server.evictWaiting does (new ones once they have waited grace; none whose request is
// arriving), counts them out, and reports how many it took. Those known to be arriving
// without a system call (reading) are no candidates, so that a few of them, the oldest,
// cannot hide the others from it. It returns those to close at once, for the caller to close
// once it has let go of t.mu; an idle HTTP/1 connection it parts from instead while a
// lingering slot is free: left open for idleGrace, a request that its client sent as it was
// taken is answered (with Connection: close), and it is closed then if none came (partEnd).
func (t *connTable) evictLocked(limit int, grace time.Duration) (closeNow []net.Conn, made int) {
	o := oldest[net.Conn]{n: evictBatch(limit)}
	o.keep = make([]candidate[net.Conn], 0, o.n)
	now := time.Now().UnixNano()
	young := now - int64(grace)
	for c, x := range t.conns {
		if x.evicted || x.closed {
			continue
		}
		switch {
		case x.state == http.StateIdle && !t.reading(c, x, now):
			o.offer(c, false, x.since)
		case x.state == http.StateNew && x.since <= young && !t.reading(c, x, now):
			o.offer(c, true, x.since)
		}
	}
	for _, k := range o.keep {
		x := t.conns[k.c]
		if t.arriving(k.c, x, now) {
			continue
		}
		x.evicted = true
		t.open--
		made++
		if !k.fresh && !x.h2 && t.linger != nil && t.linger.take(t.lingerLimit) {
			x.parting.Store(true)
			c := k.c
			time.AfterFunc(idleGrace, func() { t.partEnd(c, x) })
			continue
		}
		closeNow = append(closeNow, k.c)
	}
	t.evicted.Add(uint64(made))
	return closeNow, made
}

// partEnd closes c, parted from idleGrace ago, unless a request came on it meanwhile (its
// answer closes it) or it closed already. One whose request is still arriving it looks at
// again idleGrace later: its head may yet end (and its answer close it), or stall, and a head
// known to be arriving for headBound no longer counts (reading). Only the instant between the
// check and the close is left to a race with the client.
func (t *connTable) partEnd(c net.Conn, x *tracked) {
	t.mu.Lock()
	if t.conns[c] != x || x.state != http.StateIdle || x.closed {
		t.mu.Unlock()
		return
	}
	if t.arriving(c, x, time.Now().UnixNano()) {
		t.mu.Unlock()
		time.AfterFunc(idleGrace, func() { t.partEnd(c, x) })
		return
	}
	x.closed = true
	t.mu.Unlock()
	_ = c.Close() // on the timer's goroutine: a TLS close may wait for the client (closeEvicted)
}

// handshake runs the TLS handshake of tc (x its entry) ahead of Go's server, on a goroutine of
// its own started as the connection is handed to Go's server (ConnContext), and notes what
// crypto/tls had read at its end (from): Go's server tells nothing between an HTTP/1 connection's
// handshake and its first request's head, and counting from the accept, the handshake's
// bytes would count as a request on its way (a connection opened ahead of need would hold its
// place at MaxConns, and at a shutdown, for the header timeout). Go's server calls
// HandshakeContext as it would: crypto/tls runs a connection's handshake once, the second
// caller waiting for the first and getting its result (its error too), and the deadlines
// Go's server sets for the handshake apply to the reads under way. ctx is the connection's
// (ConnContext's), as Go's server's is: its end closes the connection either way.
func (t *connTable) handshake(ctx context.Context, tc *tls.Conn, x *tracked) {
	if tc.HandshakeContext(ctx) == nil {
		// Should Go's server have served a request and kept the connection meanwhile (this
		// goroutine late), the idle connection's from stays. Where the records tell where
		// the handshake ended (AbortStalled's connection under tc: tlsFlight), that. Else
		// what crypto/tls had read when it returned, which may hold the start of a request
		// sent with the handshake's last flight (crypto/tls reads ahead): a listener served
		// over TLS should be built on AbortStalled, as the router's is.
		from, ok := handshakeEnd(tc)
		if !ok {
			from = takenSoFar(tc)
		}
		x.from.CompareAndSwap(-1, from)
	}
}

// changed follows Go's server's ConnState.
func (t *connTable) changed(c net.Conn, st http.ConnState) {
	t.mu.Lock()
	defer t.mu.Unlock()
	x := t.conns[c]
	if x == nil {
		return
	}
	switch st {
	case http.StateClosed, http.StateHijacked:
		delete(t.conns, c)
		if !x.evicted {
			t.open--
		}
		if x.parting.Load() {
			t.linger.lingering.Add(-1)
		}
	default:
		x.state, x.since = st, time.Now().UnixNano()
		x.heard = false
		if st == http.StateIdle && x.tc != nil && !x.h2 {
			// What the client sends beyond is its next request. Noted as its handler returned
			// (noteServed), before Go's server sent the answer's end, from which the client
			// may send its next request at once, and Go's server read its start before this
			// (a read of its own under way); else now (two system calls, under t.mu: rare),
			// with the bytes still waiting in the socket left out.
			from := x.served.Swap(-1)
			if from < 0 {
				from = takenSoFar(x.tc)
			}
			x.from.Store(from)
		}
		if st == http.StateIdle && x.parting.Load() {
			// Parted from, it answered without closing (Go's server answered a request that
			// never reached the guard): it waits another idleGrace, then closes.
			time.AfterFunc(idleGrace, func() { t.partEnd(c, x) })
		}
		if st == http.StateActive && !x.seen {
			// Go's server calls this once the handshake is done: ConnectionState does not wait.
			x.seen = true
			if tc, ok := c.(*tls.Conn); ok {
				x.h2 = tc.ConnectionState().NegotiatedProtocol == "h2"
			}
		}
	}
}

// drainStep is a round of NetHTTP's Shutdown: it closes the HTTP/1 connections that wait for
// a request, the idle ones idleGrace after their last answer, the new ones after 5 s (as Go's
// server does), none whose request is arriving (arriving: Go's server closes those whose head
// stalls), and reports whether none other is left. HTTP/2 connections are left to Go's
// server.
func (t *connTable) drainStep(now int64) bool {
	t.mu.Lock()
	var idle []net.Conn
	left := false
	for c, x := range t.conns {
		if x.h2 || x.closed || x.evicted {
			continue
		}
		switch {
		case x.state == http.StateIdle && now-x.since >= int64(idleGrace) && !t.arriving(c, x, now):
		case x.state == http.StateNew && now-x.since > int64(5*time.Second) && !t.arriving(c, x, now):
		default:
			left = true
			continue
		}
		x.closed = true
		idle = append(idle, c)
	}
	t.mu.Unlock()
	closeConns(idle)
	return !left
}

// arriving reports whether a request is arriving on c, a connection that waits for one (new
// or idle, x its entry), at now: closing it would lose the request. Go's server keeps a
// connection in StateNew or StateIdle until it has read a whole head, and reads what comes
// as it comes, so bytes waiting in the socket (pending) are only the start of it: reading
// tells the rest. Over TLS, where the bytes are Go's to decrypt, an HTTP/1 connection whose
// client has sent anything since it began to wait (from: its handshake's end, its last
// request's) counts (heard, remembered: the answer stays yes while it waits), a new one only for
// headBound from its accept (Go's server times its handshake and head from then). The caller
// holds t.mu.
func (t *connTable) arriving(c net.Conn, x *tracked, now int64) bool {
	if t.reading(c, x, now) {
		return true
	}
	if x.tc != nil && !x.h2 && !x.heard && (x.state == http.StateIdle || t.within(x.since, now)) {
		if x.heard = heard(x.tc, x.from.Load()); x.heard {
			x.headSince = now
			if x.state == http.StateNew {
				x.headSince = x.since
			}
			return true
		}
	}
	return pending(underConn(c))
}

// reading reports, without a system call, whether a request is known to be arriving on c
// (x its entry) at now. On a plain connection the framer sees what Go's server read: a head
// begun and not yet handed to the handler (framedConn.heads against served; the handler's
// turn comes after the head's end, and after StateActive, which a request read along with
// the one before does not get). A head counts for headBound from when the table first found
// it arriving (at an eviction's scan of the connections, a shutdown's round, a parting's
// end), not from its first byte, which would cost a clock reading per request: so a client
// that trickles a head, even one short of the four bytes from which Go's server times a head
// on a kept-alive connection (the idle timeout applies before), holds its connection against
// newcomers and a shutdown for headBound at most. Over TLS, a connection already heard
// (arriving), as long from then (a new one's, from its accept). The caller holds t.mu.
func (t *connTable) reading(c net.Conn, x *tracked, now int64) bool {
	switch fc := c.(type) {
	case *framedConn:
		n := fc.heads.Load()
		if n <= fc.served.Load() {
			return false
		}
		if x.headN != n {
			x.headN, x.headSince = n, now
		}
		return t.within(x.headSince, now)
	case *tls.Conn:
		return x.heard && t.within(x.headSince, now)
	}
	return false
}

// within reports whether from, Unix ns, is less than headBound before now (always, with no
// bound).
func (t *connTable) within(from, now int64) bool {
	return t.headBound <= 0 || now-from < int64(t.headBound)
}

// lookup returns c's entry; nil: not followed.
func (t *connTable) lookup(c net.Conn) *tracked {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.conns[c]
}

func (t *connTable) stats() Stats {
	t.mu.Lock()
	n := t.open
	t.mu.Unlock()
	return Stats{Conns: n, ConnsEvicted: t.evicted.Load(), ConnsRefused: t.refused.Load()}
}

// underConn is the connection under NetHTTP's wrapping (framedConn, TLS), to peek at.
func underConn(c net.Conn) net.Conn {
	switch x := c.(type) {
	case *framedConn:
		return x.Conn
	case interface{ NetConn() net.Conn }:
		return x.NetConn()
	}
	return c
}
