package h1

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
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
//   - BodyReadTimeout and BodyMinRate bound reading a request body, as with Server, through
//     read deadlines set from the handler's first read of it.
//   - WriteStallTimeout bounds each write to the client, through write deadlines renewed as
//     the handler writes.
//
// What it cannot do: on TLS connections the bytes are Go's to decrypt (net/http needs the
// *tls.Conn itself, for HTTP/2 and Request.TLS), so HTTP/1.1 over TLS is served as Go's server
// serves it; HTTP/2 frames its messages itself and is not exposed to these attacks. Timing counts wall
// time from the first body read, not only the time the handler waits.
//
// Set the fields before Serve. Serve installs the handler wrapper and a ConnContext (chained
// to one already set) and sets DisableGeneralOptionsHandler, so that every request reaches the
// handler in order.
type NetHTTP struct {
	*http.Server
	// BodyReadTimeout, BodyMinRate and WriteStallTimeout are as in Server; 0: none.
	BodyReadTimeout   time.Duration
	BodyMinRate       int64
	WriteStallTimeout time.Duration
	// ErrorBody makes the bodies of the refusals, as in Server; nil: plain text.
	ErrorBody func(status int, msg string) (contentType string, body []byte)

	once sync.Once
}

// Serve serves ln with the Server, its plain connections checked as described above.
func (s *NetHTTP) Serve(ln net.Listener) error {
	s.once.Do(s.install)
	return s.Server.Serve(framedListener{ln})
}

type framedKey struct{}

func (s *NetHTTP) install() {
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
		return ctx
	}
}

// guard checks each request before next serves it, and times its body and its writes.
func (s *NetHTTP) guard(next http.Handler) http.Handler {
	if next == nil {
		next = http.DefaultServeMux
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if fc, ok := r.Context().Value(framedKey{}).(*framedConn); ok {
			i := fc.served
			fc.served++ // requests on one connection are served one after the other
			if b := fc.f.bad.Load(); b != nil && i >= b.index {
				s.refuse(w, "malformed request: "+b.why)
				return
			}
		}
		hasBody := r.Body != nil && r.Body != http.NoBody
		if s.WriteStallTimeout <= 0 && (s.BodyReadTimeout <= 0 || !hasBody) {
			next.ServeHTTP(w, r)
			return
		}
		gw := &guardWriter{ResponseWriter: w, ctl: http.NewResponseController(w), stall: s.WriteStallTimeout}
		if wt := s.Server.WriteTimeout; wt > 0 {
			gw.cap = time.Now().Add(wt)
		}
		gw.arm()
		if s.BodyReadTimeout > 0 && hasBody {
			gw.body = &timedBody{rc: r.Body, ctl: gw.ctl, timeout: s.BodyReadTimeout, rate: s.BodyMinRate}
			// A copy: Go's server must keep its own body, to decide what to do with the rest
			// of it after the answer.
			r2 := *r
			r2.Body = gw.body
			r = &r2
			defer gw.body.bound()
		}
		next.ServeHTTP(gw, r)
	})
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

// timedBody bounds the time a handler waits for the request body with read deadlines: the
// body timeout from the first read, one more second for every rate bytes received.
type timedBody struct {
	rc       io.ReadCloser
	ctl      *http.ResponseController
	timeout  time.Duration
	rate     int64
	start    time.Time
	deadline time.Time // the read deadline set
	read     int64
	eof      bool
	expired  bool
}

func (b *timedBody) Read(p []byte) (int, error) {
	if b.start.IsZero() {
		b.start = time.Now()
		b.deadline = b.start.Add(b.timeout)
		_ = b.ctl.SetReadDeadline(b.deadline)
	}
	n, err := b.rc.Read(p)
	b.read += int64(n)
	switch {
	case err == io.EOF:
		b.eof = true
		// Go's server reads the connection in the background from now on: no deadline there.
		_ = b.ctl.SetReadDeadline(time.Time{})
	case err != nil:
		if errors.Is(err, os.ErrDeadlineExceeded) {
			b.expired = true
			err = ErrBodyReadTimeout
		}
	case b.rate > 0:
		// Renewed once an eighth of the timeout has been earned, not at every read: each is a
		// timer's reset.
		d := b.start.Add(b.timeout + time.Duration(float64(b.read)/float64(b.rate)*float64(time.Second)))
		if d.Sub(b.deadline) >= b.timeout/8 {
			b.deadline = d
			_ = b.ctl.SetReadDeadline(d)
		}
	}
	return n, err
}

func (b *timedBody) Close() error { return b.rc.Close() }

// bound bounds what Go's server reads of a body the handler left unread: when the answer's
// headers go out it drops up to 256 KB of it to keep the connection.
func (b *timedBody) bound() {
	if b.start.IsZero() && !b.eof {
		b.start = time.Now()
		b.deadline = b.start.Add(b.timeout)
		_ = b.ctl.SetReadDeadline(b.deadline)
	}
}

// guardWriter renews the connection's write deadline as the handler writes, so that each write
// has the stall timeout to reach the client (never beyond the server's WriteTimeout), and
// bounds the read of the body's rest that Go's server does when the answer starts.
type guardWriter struct {
	http.ResponseWriter
	ctl   *http.ResponseController
	body  *timedBody    // nil: not timed
	stall time.Duration // 0: none
	cap   time.Time     // the server's whole-response deadline; zero: none
	armed time.Time
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
	w.arm()
	return w.ResponseWriter.Write(p)
}

// Flush sends what is buffered (SSE events go out at once).
func (w *guardWriter) Flush() { _ = w.FlushError() }

// FlushError is Flush that reports a write error (http.ResponseController uses it).
func (w *guardWriter) FlushError() error {
	w.arm()
	return w.ctl.Flush()
}

// Unwrap lets http.ResponseController reach the server's writer.
func (w *guardWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// framedListener hands net/http its plain connections wrapped in a framedConn.
type framedListener struct{ net.Listener }

func (l framedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	if _, ok := c.(*tls.Conn); ok {
		return c, nil // Go's server needs the *tls.Conn itself
	}
	fc := &framedConn{Conn: c}
	fc.f.head.reset(false)
	return fc, nil
}

// framedConn follows the requests in the bytes Go's server reads from the connection.
type framedConn struct {
	net.Conn
	f      framer
	served int64 // requests handed to the handler; only the handler's goroutine touches it
}

func (c *framedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.f.feed(p[:n])
	}
	return n, err
}

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
	bad    atomic.Pointer[badHead]
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

func (f *framer) feed(p []byte) {
	for len(p) > 0 {
		switch f.st {
		case frHead:
			p = p[f.head.scan(p):]
			if f.head.done() {
				f.endHead()
			}
		case frBody, frChunkData:
			k := min(uint64(len(p)), f.left)
			p, f.left = p[k:], f.left-k
			switch {
			case f.left > 0:
			case f.st == frBody:
				f.nextHead()
			default:
				f.st, f.crlf = frChunkEnd, 0
			}
		case frChunkSize:
			v := unhex(p[0])
			if v < 0 {
				if f.digits == 0 {
					f.lose(f.heads) // Go refuses an empty chunk size
					return
				}
				f.st = frChunkLine
				continue
			}
			if f.digits++; f.digits > 16 {
				f.lose(f.heads) // too large: Go refuses it
				return
			}
			f.left = f.left<<4 | uint64(v)
			p = p[1:]
		case frChunkLine:
			j := bytes.IndexByte(p, '\n')
			if j < 0 {
				return
			}
			p = p[j+1:]
			if f.left == 0 {
				f.head.reset(true)
				f.st = frTrailer
			} else {
				f.st = frChunkData
			}
		case frChunkEnd:
			if p[0] != "\r\n"[f.crlf] {
				f.lose(f.heads) // Go refuses the chunk
				return
			}
			p = p[1:]
			if f.crlf++; f.crlf == 2 {
				f.st, f.left, f.digits = frChunkSize, 0, 0
			}
		case frTrailer:
			p = p[f.head.scan(p):]
			if f.head.done() {
				f.nextHead()
			}
		default:
			return
		}
	}
}

// endHead checks the head just read and moves on to its body.
func (f *framer) endHead() {
	i := f.heads
	f.heads++
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
