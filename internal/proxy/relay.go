package proxy

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/textproto"
	"slices"
	"strconv"
	"strings"

	"github.com/kvroute/kvroute/internal/openai"
)

// relay sends out (the client's request, its body already read) through the retrying
// transport and passes the answer to w: what httputil.ReverseProxy did here, less what the API
// paths do not use (protocol upgrades, 1xx answers relayed), and without its stream timer. For
// a stream the reverse proxy armed a time.AfterFunc per response that flushed the headers from
// the timer's own goroutine (a thread woken, and a lock taken against the copy loop, per
// request); here the headers go out with the first events, in one write, and every chunk read
// from the engine is written and flushed at once. See doc.go for the measured reason.
func (h *Handler) relay(w *statusWriter, in *http.Request) {
	out := in.Clone(in.Context())
	out.Body = nil
	out.ContentLength = 0
	out.Close = false
	removeHopByHop(out.Header)
	if hasToken(in.Header["Te"], "trailers") {
		// The client takes trailers: so may the engine (as the reverse proxy said).
		out.Header.Set("Te", "trailers")
	}
	// A client's forwarding headers are not passed on (the reverse proxy's Rewrite did the same).
	out.Header.Del("Forwarded")
	out.Header.Del("X-Forwarded-For")
	out.Header.Del("X-Forwarded-Host")
	out.Header.Del("X-Forwarded-Proto")
	// The body sent is the router's (route refuses any coding but identity): no header of the
	// client's may describe it otherwise.
	out.Header.Del("Content-Encoding")
	if _, ok := out.Header["User-Agent"]; !ok {
		out.Header.Set("User-Agent", "") // not Go's default
	}

	rt := retryTransport{h: h}
	resp, err := rt.RoundTrip(out)
	if err != nil {
		h.proxyError(w, out, err)
		return
	}
	removeHopByHop(resp.Header)
	if err := h.modifyResponse(resp); err != nil { // it never fails today; the reverse proxy's rule
		resp.Body.Close()
		h.proxyError(w, out, err)
		return
	}
	// A whole answer (not a stream) is read before any of it goes out, up to maxCapture: one
	// that breaks before its end is then answered with an error, not a 200 with a truncated
	// body (or, through the server's buffer, an empty reply), and one that is not a JSON
	// object with a 502. Engines send such an answer when it is done, so the wait costs no time
	// to its first byte. A 2xx answer to a stream request is a stream whatever its Content-Type
	// says (an engine, or a proxy before it, that labels its events text/plain or
	// application/json): it is passed on as it comes, its first bytes taken for the first token,
	// its events read as they pass for the usage and the bound (otherStream), rather than held
	// until its end.
	c := callFrom(in.Context())
	var whole *[]byte
	ended := false
	if c != nil && c.stream && resp.StatusCode < 300 && !isEventStream(resp.Header.Get("Content-Type")) {
		resp.Body = newOtherStream(resp.Body, c)
	} else if !isEventStream(resp.Header.Get("Content-Type")) {
		cb, _ := resp.Body.(*captureBody) // a 2xx answer's (modifyResponse)
		if cb != nil {
			// An answer far longer than max_tokens can produce is an engine that ignores it:
			// refused before any of it goes out where that can be seen so soon, else cut
			// where it passes the bound (captureBody.Read).
			cb.limit = cb.c.maxAnswerBytes()
			if cb.limit > 0 && resp.ContentLength > cb.limit {
				resp.Body.Close()
				h.overrunAnswer(w, out, "an answer of "+strconv.FormatInt(resp.ContentLength, 10)+" bytes (its Content-Length)")
				return
			}
		}
		var err error
		if cb != nil {
			whole, ended, err = cb.readWhole(resp.ContentLength) // read once, not copied again for its usage
		} else {
			whole, ended, err = readWhole(resp.Body, resp.ContentLength)
		}
		defer putCapture(whole)
		if err != nil {
			resp.Body.Close()
			h.answerBroke(w, out, err)
			return
		}
		if cb != nil && cb.limit > 0 && int64(len(*whole)) > cb.limit {
			resp.Body.Close()
			h.overrunAnswer(w, out, "an answer of more than "+strconv.FormatInt(cb.limit, 10)+" bytes")
			return
		}
		if c != nil && c.badAnswer {
			resp.Body.Close()
			h.badAnswer(w, out)
			return
		}
	}
	dst := w.Header()
	for k, vv := range resp.Header {
		if _, set := dst[k]; set {
			continue // the router's own (X-Request-Id, rate limits) are not doubled by the engine's
		}
		dst[k] = append(dst[k], vv...)
	}
	announced := len(resp.Trailer)
	if announced > 0 {
		keys := make([]string, 0, announced)
		for k := range resp.Trailer {
			keys = append(keys, k)
		}
		dst.Add("Trailer", strings.Join(keys, ", "))
	}
	w.WriteHeader(resp.StatusCode)
	if whole != nil {
		if _, err := w.Write(*whole); err != nil {
			resp.Body.Close()
			return // the client went away (w.err)
		}
	}
	stream := resp.ContentLength == -1 || isEventStream(resp.Header.Get("Content-Type"))
	if !ended {
		if err := h.copyBody(w, resp.Body, stream, announced > 0); err != nil {
			resp.Body.Close()
			if in.Context().Value(http.ServerContextKey) != nil {
				// As the reverse proxy does: a server then cuts the answer off (a chunked body
				// without its end, a short body) rather than let it look complete.
				panic(http.ErrAbortHandler)
			}
			return
		}
	}
	resp.Body.Close() // now, so that resp.Trailer is filled
	if len(resp.Trailer) > 0 {
		w.Flush() // chunked, so that the trailers can follow
	}
	if len(resp.Trailer) == announced {
		for k, vv := range resp.Trailer {
			dst[k] = append(dst[k], vv...)
		}
		return
	}
	for k, vv := range resp.Trailer {
		for _, v := range vv {
			dst.Add(http.TrailerPrefix+k, v)
		}
	}
}

// readWhole reads body, of size bytes (-1: unknown), into a pooled buffer (answerBuf) until its
// end or maxCapture bytes, and reports whether it reached the end; the buffer goes back with
// putCapture.
func readWhole(body io.Reader, size int64) (bp *[]byte, ended bool, err error) {
	bp = answerBuf(size)
	b := (*bp)[:0]
	defer func() { *bp = b }()
	for len(b) < maxCapture {
		if len(b) == cap(b) { // of unknown length, or longer than it said
			b = growAnswer(b)
		}
		n, err := body.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err == io.EOF {
			return bp, true, nil
		}
		if err != nil {
			return bp, false, err
		}
	}
	return bp, false, nil
}

// answerBuf returns an empty buffer to read a whole answer of size bytes into (-1: unknown).
// One of a known size is read into a pooled buffer that holds it and a byte more (to see its
// end without growing it), up to maxCapture: answers (an embeddings batch, a long completion)
// run to megabytes, and a buffer grown as one is read was allocated and copied over again and
// again (a 1 MiB answer took 6 MB of allocations when it grew from 4 KiB and its bytes were
// copied once more for their usage: BenchmarkWholeAnswer).
func answerBuf(size int64) *[]byte {
	if size < maxPooledCapture {
		bp := captureBufs.Get().(*[]byte)
		if size >= int64(cap(*bp)) {
			*bp = slices.Grow((*bp)[:0], int(size)+1)
		}
		return bp
	}
	bp := classBuf(int(min(size+1, maxCapture))) // readWhole stops at maxCapture
	*bp = (*bp)[:0]
	return bp
}

// growAnswer returns b in a buffer twice its size, of a class past maxPooledCapture (pooled),
// and gives b's back to its class if it had one (a small one is left to the collector: the
// pool's handle holds the new buffer).
func growAnswer(b []byte) []byte {
	n := 2 * cap(b)
	if n <= maxPooledCapture {
		return slices.Grow(b, len(b))
	}
	nb := append((*classBuf(min(n, maxCapture)))[:0], b...)
	if isClass(cap(b)) {
		putClass(&b)
	}
	return nb
}

// putCapture gives back a buffer from captureBufs or answerBuf (nil: none), unless it grew too
// large to keep: a small one to captureBufs, one of a class's size to its class.
func putCapture(bp *[]byte) {
	switch {
	case bp == nil:
	case cap(*bp) <= maxPooledCapture:
		*bp = (*bp)[:0]
		captureBufs.Put(bp)
	case isClass(cap(*bp)):
		putClass(bp)
	}
}

// answerBroke answers a request whose whole answer broke before its end, before any of it
// reached the client: 504 when the response timeout ended it, else 502. It is not sent to
// another engine: this one may have computed it (and the request may be what broke it).
func (h *Handler) answerBroke(w *statusWriter, r *http.Request, err error) {
	c := callFrom(r.Context())
	if c == nil || r.Context().Err() != nil {
		return // the client went away: nobody to answer
	}
	status, code, msg := http.StatusBadGateway, "upstream_answer_cut", "the engine's answer broke off before its end"
	switch {
	case errors.Is(err, errBodyIdle):
		status, code, msg = http.StatusGatewayTimeout, "upstream_timeout", "the engine's answer stopped coming for longer than the idle timeout"
	case errors.Is(err, errAttemptTimeout):
		status, code, msg = http.StatusGatewayTimeout, "upstream_timeout", "the engine's answer did not end within the response timeout"
	}
	ep := ""
	if e := c.ep(); e != nil {
		ep = e.Name
	}
	h.Logger.Warn("the engine's answer broke off before its end", "request_id", c.rid, "endpoint", ep, "err", errText(err))
	h.writeError(w, c, openai.NewError(status, openai.TypeUpstream, "", code,
		msg+"; the request was not sent to another engine (it may have been computed) (request id "+c.rid+")"))
}

// codeBadAnswer is the error code of an engine's answer that is no API answer.
const codeBadAnswer = "upstream_bad_answer"

// badAnswer answers a request whose engine's whole 2xx answer, read before any of it went out,
// is not the JSON object every API answer is (call.takeBody): a 502 the client's SDK can retry,
// rather than a 200 no client can read; the endpoint is counted as failing (settle). It is not
// sent to another engine: this one may have computed it.
func (h *Handler) badAnswer(w *statusWriter, r *http.Request) {
	c := callFrom(r.Context())
	if c == nil || r.Context().Err() != nil {
		return // the client went away: nobody to answer
	}
	h.writeError(w, c, openai.NewError(http.StatusBadGateway, openai.TypeUpstream, "", codeBadAnswer,
		"the engine's answer is not a JSON object (cut short, empty, or another kind of body); the request was not sent to another engine (it may have been computed) (request id "+c.rid+")"))
}

// overrunAnswer answers a request whose engine's whole answer, before any of it went out, is
// far longer than the request's max_tokens can produce (what says how long): a 502
// upstream_bad_answer, the endpoint counted as failing (call.overrun). It is not sent to
// another engine: this one computed it.
func (h *Handler) overrunAnswer(w *statusWriter, r *http.Request, what string) {
	c := callFrom(r.Context())
	if c == nil || r.Context().Err() != nil {
		return // the client went away: nobody to answer
	}
	h.writeError(w, c, c.overrun(what))
}

// copyBody copies the answer to the client: a stream write by write, each flushed at once (one
// write per chunk the engine sent: sseBody.Read hands over all the events that came with one),
// any other body through the server's buffer. Once a stream's last event is written, the
// client's body is ended with it, in the same write, before the engine's chunked end is read
// (a write and a wait fewer per request); trailers the engine announced keep the body open. It
// returns the first error reading the body (other than EOF) or writing to the client.
func (h *Handler) copyBody(w *statusWriter, body io.Reader, stream, trailers bool) error {
	bp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bp)
	buf := *bp
	ended := false
	for {
		n, rerr := body.Read(buf)
		if n > 0 && !ended {
			if _, err := w.Write(buf[:n]); err != nil {
				return err
			}
			if sb, ok := body.(*sseBody); ok && !trailers && sb.relayed() {
				w.endWithLast()
				ended = true
			} else if stream {
				w.Flush()
			}
			if w.err != nil {
				return w.err
			}
		}
		if rerr == io.EOF {
			return nil
		}
		if rerr != nil {
			if rerr != context.Canceled {
				h.Logger.Debug("reading the engine's answer", "err", errText(rerr))
			}
			return rerr
		}
	}
}

// isEventStream reports whether a Content-Type is text/event-stream (parameters aside).
func isEventStream(ct string) bool {
	if i := strings.IndexByte(ct, ';'); i >= 0 {
		ct = ct[:i]
	}
	return strings.EqualFold(strings.TrimSpace(ct), "text/event-stream")
}

// hopByHop are the headers that belong to one connection (RFC 9110, 7.6.1), not passed on.
var hopByHop = []string{
	"Connection",
	"Proxy-Connection", // not standard, but sent by some clients
	"Keep-Alive",
	"Proxy-Authenticate",
	"Proxy-Authorization",
	"Te",      // canonicalised from "TE"
	"Trailer", // not Trailers, as in RFC 7230's errata
	"Transfer-Encoding",
	"Upgrade",
}

// removeHopByHop deletes the hop-by-hop headers from h, and those the Connection header names.
func removeHopByHop(h http.Header) {
	for _, f := range h["Connection"] {
		for sf := range strings.SplitSeq(f, ",") {
			if sf = textproto.TrimString(sf); sf != "" {
				h.Del(sf)
			}
		}
	}
	for _, k := range hopByHop {
		h.Del(k)
	}
}

// hasToken reports whether any of the comma-separated values holds token (case-insensitive).
func hasToken(values []string, token string) bool {
	for _, v := range values {
		for t := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(textproto.TrimString(t), token) {
				return true
			}
		}
	}
	return false
}
