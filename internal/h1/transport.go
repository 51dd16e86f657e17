// Package h1 is kvroute's HTTP/1.1 on both sides: Transport, the client transport to its
// endpoints, and Server (server.go), what serves the API listener. Both keep a request's work
// on one goroutine. For the Transport: HTTP/1.1 with keep-alive, all of whose I/O happens on
// the goroutine that calls RoundTrip and then reads the response body.
//
// net/http's Transport gives every connection a reader and a writer goroutine, so one call hands
// off between three goroutines; each hand-off can wake a thread (a futex call) and costs the
// latency of a scheduling round. Where system calls and cross-CPU wake-ups are dear (virtual
// machines, small shared hosts) those hand-offs are most of what a proxy hop costs: measured on a
// 2-core VM, a plain httputil.ReverseProxy added 290 to 410 µs per request with net/http's
// Transport and 260 to 290 µs with this one (docs/router.md). Here a call writes the request and
// reads the response itself, and the connection goes back to the pool when the body has been
// read to its end.
//
// What net/http's Transport does with its reader goroutine, noticing that the server closed an
// idle connection, is done here when a connection is taken from the pool (a non-blocking peek,
// one system call). A request can still meet such a close: the server's idle timeout may fire
// as the request arrives (the peek saw the connection open, the server closed it before it read
// the request). Such a request is sent once more, on a new connection, when three things hold:
// its body can be sent again (none, a MemBody, or GetBody), no byte of a response arrived, and
// the connection had sat in the pool for at least ResendAfterIdle (1 s) before it was taken.
// The last is what tells an idle close from a close the request caused: a server closes a
// connection for idleness only after its keep-alive timeout (seconds for every engine: uvicorn
// 5 s, so vLLM and SGLang; llama.cpp 5 s; `kvroute sim` 10 s), so a connection used less
// than a second ago that closes on a request was closed by the request (an engine that crashes on
// a query of death, or drops it). That one is never sent again. A connection that broke while the
// request was being written is always retried (the server cannot have read it whole). net/http's
// Transport resends after a write only idempotent methods; every inference request is a POST.
//
// Only plain http URLs that no proxy carries are served here; https, and requests that
// Fallback's Proxy function routes through a proxy, go to Fallback.
//
// On Linux both sides read and write their TCP connections with raw system calls
// (rawconn_linux.go) instead of net.Conn's Read and Write, for a measured reason
// (docs/results.md, "Long contexts", sixth round): each of net's calls enters the runtime's
// system-call bookkeeping, and the first one after every P went idle wakes the runtime's sysmon
// thread, which then sleeps and wakes every 20 µs for as long as a goroutine runs. A router
// between requests is idle, so every request paid it two or three times: at 8 100k-token
// requests a second, 24 to 38 nanosleeps and 48 to 75 context switches per request before this
// round, 4 to 9 and 18 to 31 after it (its other changes, logbuf's and the janitor's, included),
// and 0.9 cpu-ms less per request. The calls are made inside the connection's
// syscall.RawConn, so the netpoller, deadlines and Close behave as with net.Conn; a socket in
// non-blocking mode never blocks in them. TLS connections and other platforms keep net's calls,
// and so does every connection when the environment has KVROUTE_RAW_SYSCALLS=off.
package h1

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Defaults of the Transport's settings.
const (
	DefaultMaxIdlePerHost = 1024
	DefaultIdleTimeout    = 90 * time.Second
	DefaultDialTimeout    = 30 * time.Second
	// DefaultResendAfterIdle is ResendAfterIdle's default: under the shortest keep-alive
	// timeout of the engines served (5 s), and far over the gap between two requests on a busy
	// connection.
	DefaultResendAfterIdle = time.Second
	// MaxResponseHeaderBytes bounds a response's status line and headers (net/http's Transport
	// allows 10 MB; an engine's are well under a kilobyte).
	MaxResponseHeaderBytes = 1 << 20
)

// Transport is an http.RoundTripper. Its zero value is not usable: set Fallback (New does).
type Transport struct {
	// Fallback serves https URLs and those its Proxy function sends through a proxy.
	Fallback *http.Transport
	// MaxIdlePerHost bounds the idle connections kept per host; 0: DefaultMaxIdlePerHost.
	MaxIdlePerHost int
	// IdleTimeout closes a connection idle for longer; 0: DefaultIdleTimeout.
	IdleTimeout time.Duration
	// Dialer opens connections; nil: a 30 s connect timeout and 30 s TCP keep-alive.
	Dialer *net.Dialer
	// WriteBufferSize and ReadBufferSize size each connection's buffers; 0: 8 KB and 4 KB. The
	// write buffer holds a typical request with its headers, so it leaves in one system call.
	WriteBufferSize, ReadBufferSize int
	// ResendAfterIdle: a request written on a pooled connection that had been idle this long,
	// whose connection the server then closes or resets before any byte of a response, is sent
	// once more on a new connection, if its body can be; the server closed the connection for
	// idleness just as the request arrived. 0: DefaultResendAfterIdle; negative: never.
	ResendAfterIdle time.Duration

	mu      sync.Mutex
	idle    map[string][]*conn // by host:port, most recently used last
	proxied sync.Map           // host -> bool: whether Fallback.Proxy sends it through a proxy
}

// New returns a Transport that leaves https and proxied URLs to fallback.
func New(fallback *http.Transport) *Transport { return &Transport{Fallback: fallback} }

// conn is one pooled connection.
type conn struct {
	nc    net.Conn
	cr    countingReader
	br    *bufio.Reader
	bw    *bufio.Writer
	head  []byte // a MemBody request's head, reused
	addr  string
	since time.Time     // when it went idle
	idle  time.Duration // how long it had been idle when taken from the pool
}

// countingReader counts the bytes read from the connection, to tell whether a failed call had
// received any byte of a response, and stops at max (when set) while a response head is read.
type countingReader struct {
	r   io.Reader
	n   int64
	max int64 // 0: no limit
}

var errHeaderTooLarge = errors.New("h1: response headers larger than 1 MB")

func (c *countingReader) Read(p []byte) (int, error) {
	if c.max > 0 && c.n >= c.max {
		return 0, errHeaderTooLarge
	}
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// errStale marks an attempt that met a connection closed by the server while the request was
// being written: the server cannot have read it whole.
var errStale = errors.New("h1: connection closed by the server before the request was sent")

// errUnanswered marks an attempt whose request was written whole and whose connection the
// server then closed or reset before any byte of a response: it may have read the request.
var errUnanswered = errors.New("h1: connection closed by the server after the request was sent, before any response")

// RoundTrip sends req and returns the response, whose body must be read to its end or closed.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme != "http" || t.viaProxy(req) {
		return t.Fallback.RoundTrip(req)
	}
	addr := req.URL.Host
	if req.URL.Port() == "" {
		addr = net.JoinHostPort(req.URL.Hostname(), "80")
	}
	ctx := req.Context()
	// A second attempt needs the body again: from GetBody, or a MemBody read from where it
	// started.
	mem, _ := req.Body.(*MemBody)
	replayable := req.Body == nil || req.Body == http.NoBody || req.GetBody != nil || mem != nil
	if mem != nil {
		defer mem.Sent()
	}
	for attempt := 0; ; attempt++ {
		c, reused, err := t.get(ctx, addr, attempt > 0)
		if err != nil {
			return nil, err
		}
		if attempt > 0 {
			switch {
			case req.GetBody != nil:
				b, err := req.GetBody()
				if err != nil {
					c.nc.Close()
					return nil, err
				}
				if m, ok := b.(*MemBody); ok {
					defer m.Sent()
				}
				r2 := *req
				r2.Body = b
				req = &r2
			case mem != nil:
				mem.rewind()
			}
		}
		resp, err := t.exchange(ctx, c, req)
		if err == nil {
			return resp, nil
		}
		if attempt == 0 && reused && replayable && ctx.Err() == nil &&
			(errors.Is(err, errStale) || errors.Is(err, errUnanswered) && t.idleClose(c.idle)) {
			continue // the server had closed it for idleness: once more on a new connection
		}
		switch {
		case errors.Is(err, errStale):
			err = io.ErrUnexpectedEOF
		case errors.Is(err, errUnanswered):
			err = fmt.Errorf("%w (%v)", io.ErrUnexpectedEOF, err)
		}
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return nil, err
	}
}

// idleClose reports whether a close by the server of a connection that had been idle for d
// before a request was written on it is taken for a close for idleness.
func (t *Transport) idleClose(d time.Duration) bool {
	after := t.ResendAfterIdle
	if after == 0 {
		after = DefaultResendAfterIdle
	}
	return after > 0 && d >= after
}

// exchange writes req on c and reads the response head. On error, c is closed.
func (t *Transport) exchange(ctx context.Context, c *conn, req *http.Request) (*http.Response, error) {
	stop := context.AfterFunc(ctx, func() { c.nc.Close() })
	fail := func(err error) (*http.Response, error) {
		stop()
		c.nc.Close()
		return nil, err
	}
	read0 := c.cr.n
	var err error
	if _, mem := req.Body.(*MemBody); mem {
		err = writeMem(c, req)
	} else if err = req.Write(c.bw); err == nil {
		err = c.bw.Flush()
	}
	if err != nil {
		if c.cr.n == read0 && closedByPeer(err) {
			err = errStale
		}
		return fail(err)
	}
	var resp *http.Response
	c.cr.max = read0 + MaxResponseHeaderBytes
	for {
		resp, err = http.ReadResponse(c.br, req)
		if err != nil {
			if c.cr.n == read0 && closedByPeer(err) {
				err = fmt.Errorf("%w: %w", errUnanswered, err) // RoundTrip decides whether it goes again
			}
			return fail(err)
		}
		// An informational response (100 Continue, 103 Early Hints) precedes the real one.
		if resp.StatusCode >= 100 && resp.StatusCode < 200 && resp.StatusCode != http.StatusSwitchingProtocols {
			continue
		}
		break
	}
	c.cr.max = 0
	b := &body{t: t, c: c, rc: resp.Body, stop: stop, reuse: !resp.Close && !req.Close && resp.StatusCode != http.StatusSwitchingProtocols}
	if resp.Body == http.NoBody {
		b.finish(true)
		return resp, nil
	}
	resp.Body = b
	return resp, nil
}

// closedByPeer reports whether err says the server closed or reset the connection
// (http.ReadResponse reports an end of the stream before the status line as an unexpected EOF).
func closedByPeer(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// body returns its connection to the pool when read to its end, and closes it when closed
// earlier (what is left unread may be an endless stream).
type body struct {
	t     *Transport
	c     *conn
	rc    io.ReadCloser
	stop  func() bool
	reuse bool
	done  atomic.Bool // Close may come from another goroutine than Read
}

func (b *body) Read(p []byte) (int, error) {
	if b.done.Load() {
		return 0, io.EOF
	}
	n, err := b.rc.Read(p)
	if err == io.EOF {
		b.finish(true)
	} else if err != nil {
		b.finish(false)
	}
	return n, err
}

func (b *body) Close() error {
	b.finish(false)
	return nil
}

// finish ends the call: the connection goes back to the pool when the response ended cleanly,
// nothing else arrived, and the request's context did not close it meanwhile.
func (b *body) finish(complete bool) {
	if !b.done.CompareAndSwap(false, true) {
		return
	}
	if b.stop() && complete && b.reuse && b.c.br.Buffered() == 0 {
		b.t.put(b.c)
		return
	}
	b.c.nc.Close()
}

// get returns an idle connection to addr, or a new one (always new when fresh is set).
func (t *Transport) get(ctx context.Context, addr string, fresh bool) (c *conn, reused bool, err error) {
	if !fresh {
		now := time.Now()
		for {
			c = t.pop(addr)
			if c == nil {
				break
			}
			// Every reused connection is peeked at: a request that meets a close by the server
			// after it was written is sent again only if the connection had been idle for
			// ResendAfterIdle (see errUnanswered).
			c.idle = now.Sub(c.since)
			if c.idle > t.idleTimeout() || !alive(c.nc) {
				c.nc.Close()
				continue
			}
			return c, true, nil
		}
	}
	d := t.Dialer
	if d == nil {
		d = &net.Dialer{Timeout: DefaultDialTimeout, KeepAlive: 30 * time.Second}
	}
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, false, err
	}
	nc = wrapConn(nc) // reads and writes without waking the runtime's sysmon (rawconn_linux.go)
	c = &conn{nc: nc, addr: addr}
	c.cr.r = nc
	c.br = bufio.NewReaderSize(&c.cr, cmpOr(t.ReadBufferSize, 4<<10))
	c.bw = bufio.NewWriterSize(nc, cmpOr(t.WriteBufferSize, 8<<10))
	return c, false, nil
}

func cmpOr(v, def int) int {
	if v > 0 {
		return v
	}
	return def
}

func (t *Transport) idleTimeout() time.Duration {
	if t.IdleTimeout > 0 {
		return t.IdleTimeout
	}
	return DefaultIdleTimeout
}

func (t *Transport) pop(addr string) *conn {
	t.mu.Lock()
	defer t.mu.Unlock()
	cs := t.idle[addr]
	if len(cs) == 0 {
		return nil
	}
	c := cs[len(cs)-1]
	cs[len(cs)-1] = nil
	t.idle[addr] = cs[:len(cs)-1]
	return c
}

// put returns c to the pool, and closes the connections that have been idle too long (the
// oldest are first in the list).
func (t *Transport) put(c *conn) {
	now := time.Now()
	c.since = now
	maxIdle := cmpOr(t.MaxIdlePerHost, DefaultMaxIdlePerHost)
	t.mu.Lock()
	if t.idle == nil {
		t.idle = make(map[string][]*conn)
	}
	cs := t.idle[c.addr]
	var old []*conn
	for len(cs) > 0 && now.Sub(cs[0].since) > t.idleTimeout() {
		old = append(old, cs[0])
		cs = cs[1:]
	}
	keep := len(cs) < maxIdle
	if keep {
		cs = append(cs, c)
	}
	t.idle[c.addr] = cs
	t.mu.Unlock()
	for _, o := range old {
		o.nc.Close()
	}
	if !keep {
		c.nc.Close()
	}
}

// CloseIdleConnections closes the pooled connections, here and in Fallback.
func (t *Transport) CloseIdleConnections() {
	t.mu.Lock()
	idle := t.idle
	t.idle = nil
	t.mu.Unlock()
	for _, cs := range idle {
		for _, c := range cs {
			c.nc.Close()
		}
	}
	t.Fallback.CloseIdleConnections()
}

// viaProxy reports whether Fallback's Proxy function sends requests for req's host through a
// proxy (asked once per host: the environment it reads does not change).
func (t *Transport) viaProxy(req *http.Request) bool {
	if t.Fallback.Proxy == nil {
		return false
	}
	if v, ok := t.proxied.Load(req.URL.Host); ok {
		return v.(bool)
	}
	u, err := t.Fallback.Proxy(req)
	v := err != nil || u != nil // an error: let net/http report it
	t.proxied.Store(req.URL.Host, v)
	return v
}
