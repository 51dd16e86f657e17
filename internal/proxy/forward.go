package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/h1"
	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/route"
	"github.com/kvroute/kvroute/internal/scrape"
)

// maxCapture bounds how much of a non-streamed response body is kept to read its usage, and
// of an error body to rewrite it.
const maxCapture = 4 << 20

// maxEvent bounds one server-sent event.
const maxEvent = 4 << 20

// maxRefusal bounds what is kept of a 503's or 429's body (an error message); the rest is not
// read.
const maxRefusal = 64 << 10

// retryTransport sends a call's request to its ranked endpoints in turn, as the lifecycle
// allows: after a failure before anything reached the client that makes it safe (no
// connection, 503, 429, 404, no first token in time), it tries the next; after a 500, 502 or
// 504, or a connection lost once the engine had the request, it tries the next once per
// request (route.Failure.RetryableOnce).
type retryTransport struct{ h *Handler }

func (t *retryTransport) RoundTrip(out *http.Request) (*http.Response, error) {
	c := callFrom(out.Context())
	if c == nil || c.rc == nil {
		return nil, errors.New("proxy: request without routing state")
	}
	h := t.h
	var lastErr error
	for ep := c.rc.Next(); ep != nil; ep = c.rc.Next() {
		resp, f, err := h.attempt(out, c, ep)
		if f == route.FailNone {
			c.answered = true
			return resp, nil
		}
		if err != nil {
			lastErr = err
		}
		if !c.rc.Fail(f) {
			if resp != nil {
				c.answered = true
				return resp, nil // the last 503, 429 or 5xx goes to the client as it is
			}
			if f == route.FailCanceled {
				return nil, err
			}
			if err != nil {
				h.Logger.Warn("attempt failed, not sent to another endpoint", "request_id", c.rid, "endpoint", ep.Name,
					"failure", f.String(), "err", errText(err))
			}
			break
		}
		if resp != nil {
			resp.Body.Close() // read already (attempt)
		}
		h.Metrics.Retries.WithLabelValues(ep.Name, f.String()).Inc()
		if err != nil {
			h.Logger.Warn("attempt failed, trying the next endpoint", "request_id", c.rid, "endpoint", ep.Name,
				"failure", f.String(), "err", errText(err))
		}
	}
	if lastErr == nil {
		lastErr = errors.New("no endpoint left to try")
	}
	return nil, lastErr
}

// Errors that end an attempt on its own clock.
var (
	errAttemptTimeout = errors.New("no answer within the attempt's timeout")
	errIdleTimeout    = errors.New("the stream was silent for longer than the idle timeout")
	errStalled        = errors.New("the engine stalled")
	// errBodyIdle ends a whole answer whose body stopped coming for the idle timeout after its
	// head: a timeout of the attempt, as the client is told (504 upstream_timeout).
	errBodyIdle = fmt.Errorf("%w: the answer's body sent nothing for longer than the idle timeout", errAttemptTimeout)
)

// stallTimer gives up an attempt (its context cancelled with errStalled) once its
// route.StallWatch says it stalled, checking again while the engine answers others.
type stallTimer struct {
	w      route.StallWatch
	whole  bool // a non-streamed attempt: StallWatch.DueScraped
	cancel context.CancelCauseFunc
	mu     sync.Mutex // guards t, done and fired, so that stop wins over a check that re-arms
	t      *time.Timer
	done   bool // stopped, or fired
	fired  bool // the attempt was given up
}

func watchStall(w route.StallWatch, whole bool, cancel context.CancelCauseFunc) *stallTimer {
	st := &stallTimer{w: w, whole: whole, cancel: cancel}
	st.mu.Lock()
	st.t = time.AfterFunc(w.After(), st.check)
	st.mu.Unlock()
	return st
}

func (st *stallTimer) check() {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.done {
		return
	}
	due := st.w.Due
	if st.whole {
		due = st.w.DueScraped
	}
	stalled, wait := due(time.Now().UnixNano())
	if stalled {
		st.done, st.fired = true, true
		st.cancel(errStalled)
		return
	}
	st.t.Reset(wait)
}

// stop ends the watch (nil: none) and reports whether it ended before giving the attempt up:
// a stream whose first event was read as the watch fired is failed over, not relayed with its
// context cancelled under it.
func (st *stallTimer) stop() (ok bool) {
	if st == nil {
		return true
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	st.done = true
	st.t.Stop()
	return !st.fired
}

// attempt sends the request to ep under the attempt's timeouts and returns the response to
// relay (f FailNone), or how the attempt failed: with the response for a 503, 429, 404, 500,
// 502 or 504 (relayed if the request goes to no other endpoint), without one otherwise. A
// stream's response comes back only once its first event has arrived, so that an engine that
// accepts a request and never starts it is failed over before anything reaches the client; a
// stream whose first event is the engine's own error is handled as the engine's answer of the
// status that error names (engineStreamError). A
// whole answer's body is bounded by the response timeout and, from its head on, by the idle
// timeout between its bytes (cancelBody).
func (h *Handler) attempt(out *http.Request, c *call, ep *endpoint.Endpoint) (*http.Response, route.Failure, error) {
	to := h.timeouts(ep)
	ctx, cancel := context.WithCancelCause(out.Context())
	limit := to.Response
	if c.stream {
		limit = to.FirstToken
	}
	timer := time.AfterFunc(limit, func() { cancel(errAttemptTimeout) })
	var stall *stallTimer
	if w := c.rc.Stall(); w.After() > 0 && w.After() < limit && (c.stream || countsWork(ep)) {
		stall = watchStall(w, !c.stream, cancel)
	}
	failed := func(err error) (*http.Response, route.Failure, error) {
		timer.Stop()
		stall.stop()
		cause := context.Cause(ctx)
		cancel(nil)
		switch {
		case out.Context().Err() != nil:
			return nil, route.FailCanceled, err
		case errors.Is(cause, errAttemptTimeout):
			return nil, route.FailTimeout, fmt.Errorf("%w (%v)", errAttemptTimeout, limit)
		case errors.Is(cause, errStalled):
			return nil, route.FailTimeout, fmt.Errorf("%w: no first token, and no answer to any request, for %v",
				errStalled, stall.w.After())
		case isDialError(err):
			return nil, route.FailConnect, err
		case errors.Is(err, errBadStream):
			return nil, route.FailStatus, err // the engine failed the request, as with a 502
		}
		return nil, route.FailLost, err
	}
	resp, err := h.send(out.WithContext(ctx), c, ep)
	if err != nil {
		return failed(err)
	}
	if resp.StatusCode >= 200 && resp.StatusCode < 300 && isEventStream(resp.Header.Get("Content-Type")) && c.stream {
		st := sseStates.Get().(*sseState)
		st.r.Reset(resp.Body)
		sb := &sseBody{c: c, up: resp.Body, r: st.r, st: st, buf: st.buf[:0], pending: st.buf[:0], ctx: ctx, cancel: cancel, idle: to.StreamIdle, stall: stall,
			framed: resp.ProtoMajor >= 2 || len(resp.TransferEncoding) > 0 || resp.ContentLength >= 0, maxEvents: c.maxEvents()}
		err := sb.first()
		if err == nil {
			timer.Stop()
			resp.Body = sb
			resp.ContentLength = -1
			resp.Header.Del("Content-Length")
			return resp, route.FailNone, nil
		}
		sb.release()
		resp.Body.Close()
		var ee *engineStreamError
		if !errors.As(err, &ee) {
			return failed(err)
		}
		// The engine's stream began with its error (llama.cpp's, vLLM's or TGI's for a prompt
		// longer than its context): nothing went out yet, so the client gets it as the engine's
		// answer of the status it stands for (newEngineStreamError), handled below as one: a 4xx
		// refuses the request (relayed, not counted against the endpoint), a 5xx is the
		// engine's failure.
		resp = ee.response(resp)
	}
	switch resp.StatusCode {
	case http.StatusServiceUnavailable, http.StatusTooManyRequests, http.StatusNotFound, http.StatusLoopDetected,
		http.StatusInternalServerError, http.StatusBadGateway, http.StatusGatewayTimeout:
		// The refusal's (or the error's) body is read now, under the attempt's timers: an engine that sends the
		// head and then stalls does not hold the request past them (the drain before the next
		// attempt, or the relay of the last refusal, would wait for it unbounded).
		b, rerr := io.ReadAll(io.LimitReader(resp.Body, maxRefusal))
		resp.Body.Close()
		timer.Stop()
		stall.stop()
		cancel(nil)
		if rerr != nil && out.Context().Err() != nil {
			return nil, route.FailCanceled, rerr
		}
		resp.Body = io.NopCloser(bytes.NewReader(b))
		resp.ContentLength = int64(len(b))
		cleanRetryAfter(resp.Header)
		switch resp.StatusCode {
		case http.StatusServiceUnavailable:
			return resp, route.FailUnavailable, nil
		case http.StatusLoopDetected:
			// A router's loop guard (Handler.hops): the request came back round and nothing was
			// computed; the next endpoint may be an engine.
			return resp, route.FailUnavailable, nil
		case http.StatusNotFound:
			c.notFound++
			c.notServed(ep, b)
			return resp, route.FailNotServed, nil
		case http.StatusInternalServerError, http.StatusBadGateway, http.StatusGatewayTimeout:
			// The engine (or a proxy in front of it) failed the request: a broken engine that
			// still passes its health checks fails every request so, and the next endpoint
			// serves them; the lifecycle allows one such retry per request (a request that fails
			// every engine is not sent round the fleet).
			return resp, route.FailStatus, nil
		}
		c.rc.Backoff(retryAfter(resp.Header))
		return resp, route.FailBusy, nil
	}
	if resp.StatusCode < 200 || resp.StatusCode >= 300 && resp.StatusCode < 400 {
		// An API answer is never a redirect or a protocol switch: the endpoint's URL is not the
		// API's address (or not an engine's). Nothing was computed, so the next endpoint is
		// tried, as for a 503; the client never sees where it pointed.
		timer.Stop()
		stall.stop()
		resp.Body.Close()
		cancel(nil)
		h.Logger.Warn("the endpoint answered an API request with a redirect or a protocol switch: check its URL",
			"request_id", c.rid, "endpoint", ep.Name, "status", resp.Status, "location", resp.Header.Get("Location"))
		e := openai.NewError(http.StatusBadGateway, openai.TypeUpstream, "", "upstream_bad_answer",
			"the engine answered "+strconv.Itoa(resp.StatusCode)+" to an API request (a redirect or a protocol switch: the endpoint's URL is not the API's address) (request id "+c.rid+")")
		b := e.Body()
		return &http.Response{StatusCode: http.StatusBadGateway, Status: "502 Bad Gateway", Proto: resp.Proto,
			ProtoMajor: resp.ProtoMajor, ProtoMinor: resp.ProtoMinor, Request: resp.Request,
			Header: http.Header{"Content-Type": {"application/json"}}, ContentLength: int64(len(b)),
			Body: io.NopCloser(bytes.NewReader(b))}, route.FailUnavailable, nil
	}
	if resp.StatusCode < 400 && isEventStream(resp.Header.Get("Content-Type")) && !c.stream {
		// A stream to a request that asked for one JSON object: no client of that request can
		// read it (the OpenAI SDKs parse the body as JSON). The engine failed the request, as
		// with a 502: the next endpoint is tried once (route.Failure.RetryableOnce), else the
		// client gets a 502 upstream_bad_answer (proxyError). Its connection is closed, so
		// that it stops generating.
		resp.Body.Close()
		return failed(fmt.Errorf("%w: it answered a request not streamed with a stream (Content-Type %s)",
			errBadStream, logCut1(resp.Header.Get("Content-Type"), 64)))
	}
	// A non-streamed answer: the response timeout keeps running until its last byte.
	if !stall.stop() { // (or a stream's response that is not one: an error, say)
		resp.Body.Close()
		return failed(errStalled) // given up as its head came: failed over, nothing relayed yet
	}
	// Its body must keep coming: an engine that sends the head and then nothing would hold
	// the request for the response timeout (10 minutes), the stall watch having stopped at
	// the head. Whatever its engine (with work counters scraped or not), a body silent for
	// the idle timeout ends the answer: 504 upstream_timeout, against the endpoint.
	resp.Body = &cancelBody{ReadCloser: resp.Body, ctx: ctx, cancel: cancel, timer: timer, idle: to.StreamIdle}
	return resp, route.FailNone, nil
}

// notServedFor is how long an endpoint whose engine answered 404 naming the request's model is
// left out for that model: the models the engines list are asked again as often (scrape's
// modelsEvery), and a model swapped back is found again at most this late.
const notServedFor = 30 * time.Second

// notServed takes note of ep's engine's 404 (its body, body), whichever front end carried the
// request (the handler's attempt, or Exchange.Whole): one that names the request's model says
// the engine does not serve it, whatever the config says, and the endpoint is left out for
// that model for notServedFor (said once, as a warning); another (an API path the engine
// lacks) changes nothing but the failover.
func (c *call) notServed(ep *endpoint.Endpoint, body []byte) {
	if c.req == nil || c.req.Model == "" || !bytes.Contains(body, []byte(c.req.Model)) {
		return
	}
	if ep.NotServing(c.req.Model, time.Now(), notServedFor) {
		c.h.Logger.Warn("the engine says it does not serve the model: requests for it go to the other endpoints; check endpoints[].models (--model)",
			"endpoint", ep.Name, "model", logCut1(c.req.Model, maxLogPath), "for", notServedFor.String(), "request_id", c.rid)
	}
}

// pathNotFound rewrites e, the engine's 404 (its body, body), where the engine said nothing
// of its own: a body that is no JSON error (Go's "404 page not found\n", FastAPI's
// {"detail":"Not Found"}) and does not name the model is an API path the engine lacks (an
// engine without /v1/responses or /v1/embeddings), and the client is told so, with the
// engine's text trimmed.
func (c *call) pathNotFound(e *openai.Error, body []byte) {
	var fields map[string]json.RawMessage
	if json.Unmarshal(body, &fields) == nil && (fields["error"] != nil || fields["message"] != nil) {
		return // the engine's own error, relayed as it says it
	}
	if c.req == nil || (c.req.Model != "" && bytes.Contains(body, []byte(c.req.Model))) {
		return
	}
	text, _ := logCut(strings.TrimSpace(strings.ToValidUTF8(string(body[:min(len(body), 512)]), "")), 200)
	e.Message = "the engine does not serve POST " + apiPath(c.req.Kind) + ": it answered 404"
	if c.notFound > 1 {
		e.Message = "the engines of the " + strconv.Itoa(c.notFound) + " endpoints tried do not serve POST " + apiPath(c.req.Kind) + ": the last answered 404"
	}
	if text != "" {
		e.Message += " " + strconv.Quote(text)
	}
	code := "unknown_url"
	e.Code = &code
}

// apiPath is the path of an API call of kind k.
func apiPath(k openai.Kind) string {
	switch k {
	case openai.KindChat:
		return "/v1/chat/completions"
	case openai.KindCompletion:
		return "/v1/completions"
	case openai.KindEmbedding:
		return "/v1/embeddings"
	case openai.KindResponse:
		return "/v1/responses"
	}
	return k.String()
}

// countsWork reports whether ep's scraped metrics count what it computes as it computes it
// (endpoint.Snapshot's Stepwise Work: vLLM's token counters, llama.cpp's decode calls): the
// only sign of a non-streamed request's progress before its answer, so the only way to tell a
// stalled engine from one busy with it. SGLang counts a request's tokens when it ends, so that
// a long generation there would look like a stall: a non-streamed attempt is watched for stalls
// only where Work is stepwise (and on kvroute sim, which counts as vLLM does), once it has
// counted something.
func countsWork(ep *endpoint.Endpoint) bool {
	s := ep.Snapshot()
	return s != nil && s.Stepwise && s.Work > 0
}

// timeouts returns the attempt timeouts for ep: its own where it has them, else the handler's.
func (h *Handler) timeouts(ep *endpoint.Endpoint) Timeouts {
	t := h.Timeouts.withDefaults()
	if ep.FirstTokenTimeout > 0 {
		t.FirstToken = ep.FirstTokenTimeout
	}
	if ep.ResponseTimeout > 0 {
		t.Response = ep.ResponseTimeout
	}
	return t
}

// isDialError reports whether err happened while connecting: the engine never saw the request.
func isDialError(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Op == "dial"
}

// retryAfter reads how long an engine that answered 429 asks to be left alone: retry-after-ms,
// else Retry-After in seconds or as a date; 1 s when it does not say, at most a minute.
func retryAfter(h http.Header) time.Duration {
	secs := 1.0
	if ms, err := strconv.ParseFloat(h.Get("Retry-After-Ms"), 64); err == nil && ms > 0 {
		secs = ms / 1000
	} else if v := h.Get("Retry-After"); v != "" {
		if s, err := strconv.ParseFloat(v, 64); err == nil && s > 0 {
			secs = s
		} else if at, err := http.ParseTime(v); err == nil {
			secs = time.Until(at).Seconds()
		}
	}
	// Bounded as seconds, before the conversion: a year's nanoseconds overflow a Duration.
	return time.Duration(min(max(secs, 0.001), 60) * float64(time.Second))
}

// cleanRetryAfter writes an engine's Retry-After (and retry-after-ms) again as retryAfter reads
// them, so that a client told to wait is told a sane number (1 ms to a minute), never the
// engine's garbage ("-5", "NaN", a year).
func cleanRetryAfter(h http.Header) {
	ms := h.Get("Retry-After-Ms") != ""
	if !ms && h.Get("Retry-After") == "" {
		return
	}
	d := retryAfter(h)
	h.Set("Retry-After", strconv.FormatInt(int64(math.Ceil(d.Seconds())), 10))
	if ms {
		h.Set("Retry-After-Ms", strconv.FormatInt(max(d.Milliseconds(), 1), 10))
	}
}

// cancelBody ends the attempt's context (and its timers) when the body is closed.
type cancelBody struct {
	io.ReadCloser
	ctx    context.Context // the attempt's; nil where nothing ends it but the client
	cancel context.CancelCauseFunc
	timer  *time.Timer
	// idle, when positive, bounds each read: one that waits that long for the engine ends the
	// attempt (errBodyIdle, by quiet). The time between reads (a slow client holding up the
	// relay of a long answer) is not the engine's.
	idle  time.Duration
	quiet *time.Timer // made at the first read
}

// Read reads the body; an error after the attempt's timeout or its idle timeout ended it says
// so (errAttemptTimeout, errBodyIdle).
func (b *cancelBody) Read(p []byte) (int, error) {
	if b.idle > 0 {
		if b.quiet == nil {
			b.quiet = time.AfterFunc(b.idle, func() { b.cancel(errBodyIdle) })
		} else {
			b.quiet.Reset(b.idle)
		}
	}
	n, err := b.ReadCloser.Read(p)
	if b.quiet != nil {
		b.quiet.Stop()
	}
	if err != nil && err != io.EOF && b.ctx != nil {
		if cause := context.Cause(b.ctx); errors.Is(cause, errAttemptTimeout) {
			err = fmt.Errorf("%w: %w", cause, err)
		}
	}
	return n, err
}

func (b *cancelBody) Close() error {
	if b.timer != nil {
		b.timer.Stop()
	}
	if b.quiet != nil {
		b.quiet.Stop()
	}
	err := b.ReadCloser.Close()
	b.cancel(nil)
	return err
}

// send makes one attempt: the outgoing request, re-addressed to ep, with its body.
func (h *Handler) send(out *http.Request, c *call, ep *endpoint.Endpoint) (*http.Response, error) {
	u, err := url.Parse(ep.Name)
	if err != nil {
		return nil, err
	}
	parts := c.partsFor(h, ep)
	n := 0
	for _, p := range parts {
		n += len(p)
	}
	req := out.Clone(out.Context())
	req.URL.Scheme, req.URL.Host = u.Scheme, u.Host
	req.URL.Path = strings.TrimSuffix(u.Path, "/") + out.URL.Path
	req.URL.RawPath = ""
	req.Host = u.Host
	req.Body = c.holdFor(h1.NewMemBodyParts(parts...)) // sent with the head in one system call
	req.GetBody = func() (io.ReadCloser, error) { return c.holdFor(h1.NewMemBodyParts(parts...)), nil }
	req.ContentLength = int64(n)
	req.Header.Del("Accept-Encoding")
	req.Header.Set("X-Request-Id", c.rid)
	req.Header.Set("Content-Type", "application/json")
	if c.hops != nil {
		req.Header[ViaHeader] = c.hops
	}
	if c.id != nil {
		// The tenant's key is ours, not the engine's.
		req.Header.Del("Authorization")
		req.Header.Del("Api-Key")
	}
	if req.Context().Err() != nil {
		return h.Transport.RoundTrip(req) // over before it began: nothing is sent
	}
	resp, err := h.Transport.RoundTrip(req)
	if reachedEngine(resp, err) {
		c.reached++
	}
	return resp, err
}

// partsFor returns the body to send to ep as the parts to send one after the other: the
// client's bytes with the splices between them (stream_options, the tenant's cache_salt when
// ep honours it), or one piece where the body had to be copied (Patch, when CacheSaltSplice
// cannot place the salt). Built once per call for each of the two kinds of endpoint.
func (c *call) partsFor(h *Handler, ep *endpoint.Endpoint) [][]byte {
	if !c.salts(h, ep) {
		if c.plain == nil {
			c.plain = [][]byte{c.body}
			if c.splice != nil {
				c.plain = [][]byte{c.body[:c.spliceAt], c.splice, c.body[c.spliceAt:]}
			}
		}
		return c.plain
	}
	if c.salted == nil {
		c.salted = c.saltedParts(h)
	}
	return c.salted
}

// saltedParts returns the parts of the body with the tenant's cache_salt: spliced in where
// openai.CacheSaltSplice can place it (before the closing brace, with stream_options when that
// is spliced too, or in place of the client's own value), else the whole body patched; nil
// when Patch cannot patch it.
func (c *call) saltedParts(h *Handler) [][]byte {
	v := []byte(strconv.Quote(c.id.Salt))
	at, end, field, ok := openai.CacheSaltSplice(c.body, c.req, v)
	switch {
	case ok && c.splice == nil:
		return [][]byte{c.body[:at], field, c.body[end:]}
	case ok && at == end && at == c.spliceAt:
		// Both fields before the closing brace, in the order Patch would add them.
		return [][]byte{c.body[:at], append(slices.Clip(c.splice), field...), c.body[at:]}
	case ok && end <= c.spliceAt:
		return [][]byte{c.body[:at], field, c.body[end:c.spliceAt], c.splice, c.body[c.spliceAt:]}
	}
	body := bytes.Join(c.partsFor(h, nil), nil) // nil: the parts without the salt
	b, err := openai.Patch(body, openai.Set{Key: "cache_salt", Value: v})
	if err != nil {
		return nil // the caller refuses the request: never sent without the salt
	}
	return [][]byte{b}
}

// salts reports whether the body sent to ep gets the tenant's cache_salt.
func (c *call) salts(h *Handler, ep *endpoint.Endpoint) bool {
	return ep != nil && c.id != nil && c.id.Salt != "" && h.Pool.CacheSalt(ep)
}

// bodyFor returns the body to send to ep, whole: with the splices, and with the tenant's
// cache_salt when ep honours it.
func (c *call) bodyFor(h *Handler, ep *endpoint.Endpoint) []byte {
	p := c.partsFor(h, ep)
	if len(p) == 1 {
		return p[0]
	}
	j := &c.joined
	if c.salts(h, ep) {
		j = &c.joinedSalted
	}
	if *j == nil {
		*j = bytes.Join(p, nil)
	}
	return *j
}

// modifyResponse rewrites upstream errors into OpenAI bodies and wraps the body so the router
// sees the first token, the usage and the end as they pass.
func (h *Handler) modifyResponse(resp *http.Response) error {
	c := callFrom(resp.Request.Context())
	if c == nil {
		return nil
	}
	if ep := c.ep(); h.EndpointHeader != "" && ep != nil {
		resp.Header.Set(h.EndpointHeader, ep.Name)
	}
	if resp.StatusCode >= 400 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, maxCapture))
		resp.Body.Close()
		e := openai.NormalizeUpstreamError(resp.StatusCode, b)
		if resp.StatusCode == http.StatusNotFound {
			c.pathNotFound(e, b)
		}
		c.errType = e.Type
		nb := e.Body()
		resp.Body = io.NopCloser(bytes.NewReader(nb))
		resp.ContentLength = int64(len(nb))
		resp.Header.Set("Content-Length", strconv.Itoa(len(nb)))
		resp.Header.Set("Content-Type", "application/json")
		resp.Header.Del("Content-Encoding")
		c.complete = true
		return nil
	}
	if _, ok := resp.Body.(*sseBody); ok {
		return nil // a stream, watched since its first event
	}
	resp.Body = &captureBody{c: c, up: resp.Body}
	return nil
}

// sseBody passes a stream on event by event (the relay flushes after each Read),
// reading usage and response ids, dropping the usage-only chunk the router asked for on the
// client's behalf, and noticing how the stream ends: at its terminator (complete, whatever the
// client does next), or cut short by the engine or by its silence for longer than the idle
// timeout, in which case the client gets an SSE error event before the stream closes.
type sseBody struct {
	c        *call
	up       io.ReadCloser
	r        *openai.SSEReader
	st       *sseState               // r and buf's pooled home, nil when not from the pool
	ctx      context.Context         // the attempt's
	cancel   context.CancelCauseFunc // ends the attempt
	idle     time.Duration
	stall    *stallTimer // the attempt's stall watch until the first event, nil when none
	timer    *time.Timer // the idle timeout
	pending  []byte      // what the client is still to get: a part of buf, or of a larger array
	buf      []byte
	err      error
	progress bool // an event other than a comment was taken since Read last looked
	// framed: the body's end is marked (chunked, a Content-Length, HTTP/2), so that a clean
	// io.EOF is the engine's own end and not a connection that closed under it.
	framed bool
	// maxEvents is the most content events the stream may carry (call.maxEvents; 0: no
	// bound): past it the engine ignores max_tokens, and the stream is cut (overrun).
	maxEvents int
	// errorChunk: the last event with data was ollama's trace of an error (errorChunk).
	errorChunk bool
}

// first reads the stream's first event, the first token: the caller's timer bounds the wait.
// Comments before it (keep-alives) are no token: they are read past, and not passed on (the
// client has had nothing yet, not even the head, so they would keep nothing alive).
func (s *sseBody) first() error {
	ev, err := s.r.Next()
	for err == nil && ev.Empty() && !ev.Cut && !ev.Malformed() {
		ev, err = s.r.Next()
	}
	if obj := ev.EngineError(); err == nil && obj != nil && !ev.Malformed() {
		return newEngineStreamError(obj, s.c.rid)
	}
	if err == nil && cutInside(ev) && !foreignCut(ev) {
		err = io.ErrUnexpectedEOF
	}
	if err == nil && ev.Malformed() {
		// Nothing went out yet: the attempt fails, as an answer that is no HTTP does.
		err = fmt.Errorf("%w: its first event is %s", errBadStream, malformedWhat(ev))
	}
	if err != nil {
		return err
	}
	if !s.stall.stop() {
		return errStalled // given up as the event came: failed over before anything is counted or relayed
	}
	s.c.rc.FirstToken()
	s.take(ev)
	s.takeBuffered(copyBufSize)
	s.timer = time.AfterFunc(s.idle, func() { s.cancel(errIdleTimeout) })
	return nil
}

func (s *sseBody) Read(p []byte) (int, error) {
	for len(s.pending) == 0 {
		if s.err != nil {
			return 0, s.err
		}
		if s.c.complete {
			// The terminator went out: what follows (the chunked body's end) is read so the
			// connection can be reused, and its errors no longer matter.
			s.timer.Stop()
			_, _ = io.Copy(io.Discard, io.LimitReader(s.up, 64<<10))
			s.err = io.EOF
			continue
		}
		ev, err := s.r.Next()
		if err == nil && cutInside(ev) && !foreignCut(ev) {
			err = io.ErrUnexpectedEOF // the part of the event that came is not passed on
		}
		if err != nil {
			s.timer.Stop()
			if err == io.EOF && s.framed && s.ctx.Err() == nil {
				s.endedUnterminated()
			} else {
				s.cutShort(err)
			}
			continue
		}
		s.progress = false
		s.take(ev)
		s.takeBuffered(len(p))
		if s.progress { // keep-alive comments alone are no sign of a working engine
			s.timer.Reset(s.idle)
			if ep := s.c.ep(); ep != nil {
				ep.Progressed(time.Now().UnixNano()) // a working engine: no stall for the others it holds
			}
		}
	}
	n := copy(p, s.pending)
	s.pending = s.pending[n:]
	if len(s.pending) == 0 {
		s.pending = s.buf[:0] // all sent: the next events reuse the buffer
	}
	return n, nil
}

// relayed reports whether the stream's last event has been handed to the client: its
// terminator was read and nothing is pending. Reads from then on only drain the engine's body.
func (s *sseBody) relayed() bool { return s.c.complete && len(s.pending) == 0 }

// cutInside reports whether ev is the part of an event that came before its stream ended (no
// blank line after it), other than a stream's last event: whole or not, it is not passed on,
// and the stream ends with an error event (a client would otherwise get a partial event with
// the error event glued to it).
func cutInside(ev openai.Event) bool {
	return ev.Cut && !ev.Ends()
}

// foreignCut reports whether ev, cut by its stream's end, says already that the stream is no
// API stream: a whole line in it is no event-stream field (openai.Event.Foreign: ollama's error
// line, `{"error":"..."}`, with no blank line after it), or it holds a NUL. Such an event is a
// bad one (a 502 stream_bad_event, as it would be with a blank line after it), not a stream cut
// short.
func foreignCut(ev openai.Event) bool {
	return ev.Cut && (ev.Foreign || bytes.IndexByte(ev.Raw, 0) >= 0)
}

// engineStreamError is the error an engine sent as its stream's first event, before any of
// the stream went out (openai.Event.EngineError): llama.cpp's `error: {"code":400,...}` for a
// prompt longer than its context, vLLM's `data: {"error": {...}}`. Handler.attempt answers it
// as the engine's answer of the status it names (response).
type engineStreamError struct{ e *openai.Error }

// newEngineStreamError reads obj, the engine's error object, with the status it stands for
// (openai.StreamError: its code, TGI's http_status_code, a type of a request's error, a dead
// engine's 400 a 500); 502 where it names none: the engine failed the request and did not say
// how, so the next endpoint is tried once, as after its 502, and a request that every engine
// refuses so is counted against the first alone (the lifecycle's rule for a request that fails
// two). A 200 with the error event relayed would give the client no status to act on.
func newEngineStreamError(obj []byte, rid string) *engineStreamError {
	e := openai.StreamError(obj, http.StatusBadGateway)
	if e.Message == "" || strings.HasPrefix(e.Message, "upstream returned ") {
		e.Message = "the engine's stream began with an error event that says nothing more (request id " + rid + ")"
	}
	return &engineStreamError{e: e}
}

func (e *engineStreamError) Error() string {
	return "the engine's stream began with its error " + strconv.Itoa(e.e.Status) + ": " + logCut1(e.e.Message, 200)
}

// response is the engine's answer that the error stands for: its status, and the error as
// the body of an error answer (JSON), for the attempt to handle as such.
func (e *engineStreamError) response(from *http.Response) *http.Response {
	b := e.e.Body()
	return &http.Response{StatusCode: e.e.Status, Status: strconv.Itoa(e.e.Status) + " " + http.StatusText(e.e.Status),
		Proto: from.Proto, ProtoMajor: from.ProtoMajor, ProtoMinor: from.ProtoMinor, Request: from.Request,
		Header: http.Header{"Content-Type": {"application/json"}}, ContentLength: int64(len(b)),
		Body: io.NopCloser(bytes.NewReader(b))}
}

// engineErrorEvent is the SSE error event that passes on an engine's "error:" line (llama.cpp's
// error after the head, obj its JSON object): no client reads that field, and the OpenAI SDKs
// read this one, as they read the router's own.
func engineErrorEvent(obj []byte, status int) []byte {
	if status == 0 {
		status = http.StatusBadGateway
	}
	var b bytes.Buffer
	_ = openai.WriteEvent(&b, "error", openai.NormalizeUpstreamError(status, obj).Body())
	return b.Bytes()
}

// take queues one event for the client, unless the call drops it (the usage chunk the client
// did not ask for) or the usage member the router asked for on its behalf (takeEvent), and
// notes whether it is progress (anything but a comment).
func (s *sseBody) take(ev openai.Event) {
	if ev.Malformed() {
		s.badEvent(ev) // not passed on
		return
	}
	if !ev.Empty() {
		s.progress = true
	}
	content := s.c.contentEvents
	pass, from, to := s.c.takeEvent(ev)
	if len(ev.Data) > 0 {
		// Only an event without text pays for the search (a stream's first and last few).
		s.errorChunk = s.c.contentEvents == content && errorChunk(ev.Data)
	}
	if s.maxEvents > 0 && s.c.contentEvents > s.maxEvents {
		s.overrun() // the event past the bound is not passed on
		return
	}
	switch {
	case !pass:
	case len(ev.ErrorLine) > 0:
		// llama.cpp's "error:" line after the head: relayed as an error event the client
		// reads; the call is settled with its status (takeEvent, call.status).
		s.queue(engineErrorEvent(ev.ErrorLine, s.c.streamStatus))
	case from < to && bytes.IndexByte(ev.Data, '\n') < 0:
		// The usage member goes: the event's data is one line, a part of Raw (only such chunks,
		// those that carry a "usage", pay for the search).
		if at := bytes.Index(ev.Raw, ev.Data); at >= 0 {
			s.queue(ev.Raw[:at+from])
			s.queue(ev.Raw[at+to:])
			return
		}
		s.queue(ev.Raw)
	default:
		s.queue(ev.Raw)
	}
}

// queue appends b to what is pending for the client. Events are queued only once the client
// has had all that was pending (Read), so pending always starts at buf; when an append outgrows
// buf, the larger array becomes buf, so that a stream allocates nothing once buf holds its
// largest write. (Until December 2026 only a first event that outgrew buf replaced it: every
// read that took several events grew a new array from buf's size, ~0.5 kB per token.)
func (s *sseBody) queue(b []byte) {
	s.pending = append(s.pending, b...)
	if cap(s.pending) > cap(s.buf) {
		s.buf = s.pending[:0] // a new, larger buffer: keep it for the next events
	}
}

// takeBuffered queues the events that arrived with the last one, up to limit bytes pending, so
// that they go out in the same write (each write to the client is a system call, and wakes
// it): one write per chunk the engine sent, whether it carried one token or several.
func (s *sseBody) takeBuffered(limit int) {
	for !s.c.complete && s.err == nil && len(s.pending) < limit && s.r.HasEvent() {
		ev, err := s.r.Next()
		if err != nil {
			s.cutShort(err) // not expected: the event was buffered whole
			return
		}
		s.take(ev)
	}
}

// endedUnterminated ends a stream whose body the engine ended properly (its chunked end, or
// its length read whole) after its last event, without a terminator ([DONE], or a Responses
// API terminal event): on purpose, as ollama ends a stream when the model repeats itself past
// its limit, with no finish_reason and no [DONE]. The client's stream ends as the engine's did,
// with nothing added: a client of that engine reads the body's end as the stream's end (the
// OpenAI SDKs do), and no terminator is invented (none exists for the Responses API, and a
// [DONE] would say the answer was whole). The request is answered 200, not a failure of the
// endpoint; its tenant is charged as for a stream whose usage did not come (call.charge), and
// the access line says stream_end "no_terminator". A body that breaks (a chunked body without
// its end, a reset, a timeout, or a connection closed under a body whose end is not marked)
// is a cut (cutShort).
func (s *sseBody) endedUnterminated() {
	if s.errorChunk {
		s.cutShort(errErrorChunk)
		return
	}
	s.err = io.EOF
	s.c.unterminated = true
	if s.c.h.Logger.Enabled(context.Background(), slog.LevelDebug) {
		s.c.h.Logger.Debug("the engine ended the stream without its terminator: passed on as it ended", "request_id", s.c.rid)
	}
}

// cutShort ends a stream that stopped before its terminator, its body broken (or closed where
// its end is not marked): unless the client is gone, it is told with an SSE error event, and
// the call is a failure.
func (s *sseBody) cutShort(err error) {
	s.err = io.EOF
	if s.ctx.Err() != nil && context.Cause(s.ctx) == context.Canceled {
		return // the client went away (its request cancelled the engine's): nobody to tell
	}
	if shuttingDown(s.ctx) {
		// The router's shutdown cut it, not the engine: the client is told so, and may send
		// it again (to another replica).
		s.c.shutdown = true
		var b bytes.Buffer
		_ = openai.WriteEvent(&b, "error", shutdownError(s.c.rid).Body())
		s.queue(b.Bytes())
		return
	}
	s.c.cut = true
	msg := "the engine ended the stream before its end"
	switch {
	case errors.Is(context.Cause(s.ctx), errIdleTimeout):
		msg = "the engine sent no event (keep-alive comments aside) for " + s.idle.String() + " (the stream idle timeout)"
		s.c.errType = "stream_idle_timeout"
	case errors.Is(err, errErrorChunk):
		msg = "the engine failed the stream: it ended it with an empty chunk that names no model, without its terminator, as ollama does in place of an error (its runner failed)"
	case errors.Is(err, openai.ErrSSELineTooLong):
		// The router cut it: an event it will not hold (a runaway line, an engine's bug).
		msg = "the engine sent an event larger than the router's " + strconv.Itoa(maxEvent>>20) + " MiB limit: the stream was cut there"
		s.c.errType = "stream_event_too_large"
		s.c.h.Logger.Warn("stream cut: the engine sent an event over the limit", "request_id", s.c.rid, "endpoint", s.c.rc.Endpoint().Name, "limit_bytes", maxEvent)
	}
	if s.c.h.Logger.Enabled(context.Background(), slog.LevelDebug) {
		s.c.h.Logger.Debug("upstream stream ended before its end", "request_id", s.c.rid, "err", errText(err), "why", msg)
	}
	e := openai.NewError(http.StatusBadGateway, openai.TypeUpstream, "", "stream_cut", msg+" (request id "+s.c.rid+")")
	var b bytes.Buffer
	_ = openai.WriteEvent(&b, "error", e.Body())
	s.queue(b.Bytes()) // after the events that came before the cut
}

// errErrorChunk ends a stream whose engine ended it, without its terminator, after an
// errorChunk.
var errErrorChunk = errors.New("the stream ended after an empty chunk of no model")

// errorChunk reports whether data, an event's without text, is a chunk whose "model" is "": what
// ollama's OpenAI layer makes of an error in a stream it began (a runner killed, out of memory),
// decoding the error ({"error":"..."}) as a chunk, whose members are then empty, and ending the
// stream after it with no finish_reason and no [DONE]. A stream that ends so is cut by the
// engine's failure, where one that ends after a chunk with its model and text, no terminator
// either, is ollama at its token-repeat limit, on purpose (endedUnterminated). No engine names
// no model in a chunk of its own.
func errorChunk(data []byte) bool {
	for rest := data; ; {
		i := bytes.Index(rest, []byte(`"model"`))
		if i < 0 {
			return false
		}
		rest = rest[i+len(`"model"`):]
		j := skipSpace(rest, 0)
		if j < len(rest) && rest[j] == ':' {
			j = skipSpace(rest, j+1)
			return j+1 < len(rest) && rest[j] == '"' && rest[j+1] == '"'
		}
	}
}

// errBadStream ends an attempt whose engine's answer is no API stream: an event that is not
// one (openai.Event.Malformed), or a stream sent to a request that asked for none.
var errBadStream = errors.New("the engine's answer is not one of the API")

// malformedWhat says what is wrong with a malformed event, for the logs and the client.
func malformedWhat(ev openai.Event) string {
	switch {
	case ev.Foreign:
		return "a line that is no event-stream field"
	case bytes.IndexByte(ev.Raw, 0) >= 0:
		return "bytes with a NUL"
	case !utf8.Valid(ev.Raw):
		return "bytes that are not UTF-8"
	}
	return "data that is not a JSON object"
}

// badEvent ends a stream whose engine sent an event that is no event of the API (Malformed:
// "data: {not json", bytes that are no event stream, NULs, invalid UTF-8) after the client had
// the head: the event is not passed on, the client gets an SSE error event after the events
// before it (the stream can only be ended), the attempt is cancelled (the engine's connection
// closed), and the call is settled as a stream the engine cut (502, error_type
// stream_bad_event, error_code upstream_bad_answer; a failure of the endpoint). What comes
// after it, a [DONE] included, is not read: the answer is not whole.
func (s *sseBody) badEvent(ev openai.Event) {
	s.endWith(s.c.badEvent(ev), errBadStream)
}

// endWith ends the client's stream with e as an SSE error event, after the events before it,
// and cancels the attempt for cause (the engine's connection closed): what the engine sends
// after it is not read.
func (s *sseBody) endWith(e *openai.Error, cause error) {
	var b bytes.Buffer
	_ = openai.WriteEvent(&b, "error", e.Body())
	s.queue(b.Bytes())
	s.err = io.EOF
	if s.timer != nil {
		s.timer.Stop()
	}
	s.cancel(cause)
}

// badEvent records that the engine's stream carried an event that is no event of the API, after
// the client had the head, whichever front end relays it (sseBody.badEvent, Exchange.Event): the
// call is settled as a stream the engine cut (502, error_type stream_bad_event, error_code
// upstream_bad_answer; a failure of the endpoint), and logged once at WARN. It returns the error
// that ends the client's stream (its SSE error event).
func (c *call) badEvent(ev openai.Event) *openai.Error {
	what := malformedWhat(ev)
	c.cut = true
	c.errType, c.errCode = "stream_bad_event", codeBadAnswer
	name := ""
	if c.rc != nil {
		if ep := c.rc.Endpoint(); ep != nil {
			name = ep.Name
		}
	}
	c.h.Logger.Warn("stream cut: the engine sent an event that is no event of the API, counted as a failure of the endpoint",
		"request_id", c.rid, "endpoint", name, "event", what)
	c.badStream = openai.NewError(http.StatusBadGateway, openai.TypeUpstream, "", codeBadAnswer,
		"the engine sent "+what+" in its stream, which is no event of the API: the stream was cut there (request id "+c.rid+")")
	return c.badStream
}

// overrun ends a stream whose engine sent more content events than the request's max_tokens
// allows (maxEvents): the engine ignores max_tokens (an endless stream was relayed 558 MB for
// a max_tokens of 5). The client gets an SSE error event after the events that came within
// the bound, the attempt is cancelled (the engine's connection closed, so that it stops
// generating), and the call is settled as the engine's bad answer (call.overrun).
func (s *sseBody) overrun() {
	s.c.contentEvents-- // the event past the bound, not passed on
	s.endWith(s.c.overrun("more than "+strconv.Itoa(s.maxEvents)+" stream events with text"), errOverrun)
}

// sseState is what a stream needs that is worth recycling: its event reader (a 4 KB buffer) and
// the buffer of what is pending for the client (a write's worth, ~5 KB). Allocated per request,
// the two were most of what a streamed request allocated once its per-token allocations were
// gone (BenchmarkStream).
type sseState struct {
	r   *openai.SSEReader
	buf []byte
}

// pendingSize is a pending buffer's first size: the most the relay reads at once, and a few
// events past it (takeBuffered stops after the event that reaches its limit).
const pendingSize = copyBufSize + 1<<10

// maxPooledPending bounds the pending buffers kept for other streams: one grown by a large
// event (up to maxEvent) goes to the garbage collector instead.
const maxPooledPending = 64 << 10

var sseStates = sync.Pool{New: func() any {
	return &sseState{r: openai.NewSSEReader(nil, maxEvent), buf: make([]byte, 0, pendingSize)}
}}

// release gives the event reader and the pending buffer back to the pool; reads from then on
// fail.
func (s *sseBody) release() {
	if s.r == nil {
		return
	}
	s.r.Reset(nil)
	if st := s.st; st != nil {
		if cap(s.buf) <= maxPooledPending {
			st.buf = s.buf[:0]
		}
		sseStates.Put(st)
	}
	s.r, s.st, s.buf, s.pending = nil, nil, nil, nil // the pool's now: never read again here
	if s.err == nil {
		s.err = errBodyClosed
	}
}

var errBodyClosed = errors.New("proxy: read on a closed stream")

func (s *sseBody) Close() error {
	s.release()
	if s.timer != nil {
		s.timer.Stop()
	}
	err := s.up.Close()
	s.cancel(nil)
	return err
}

// captureBody passes a body on while keeping its first maxCapture bytes to read usage at EOF.
// The copy lives in a pooled buffer, given back at EOF or Close (usage and ids are copied out).
// Past maxCapture only the last maxTail bytes are kept, where engines write the usage: a tenant
// whose answer is longer is still charged what it used.
type captureBody struct {
	c    *call
	up   io.ReadCloser
	buf  *[]byte // nil until the first byte, and again once given back
	full bool
	tail []byte // once full: the body's last bytes, at most maxTail
	read bool   // EOF was seen and the usage read
	// limit, when positive, bounds the answer's bytes (call.maxAnswerBytes): a read past it
	// fails (errOverrun), and the relay cuts the answer there; n counts the bytes read.
	limit, n int64
	// passing: the answer is a stream whose events are read as they pass (otherStream): none
	// of it is kept, nor read at its end.
	passing bool
}

// passOn makes b keep nothing of what it passes on from now, and read nothing at the end: the
// answer is a stream whose events otherStream reads as they pass.
func (b *captureBody) passOn() {
	b.passing = true
	b.release()
	b.tail = nil
}

// maxTail is how much of the end of an answer longer than maxCapture is kept to read its usage.
const maxTail = 64 << 10

// captureBufs recycles captureBody buffers; ones grown past maxPooledCapture are dropped.
var captureBufs = sync.Pool{New: func() any { b := make([]byte, 0, 4<<10); return &b }}

const maxPooledCapture = 64 << 10

func (b *captureBody) Read(p []byte) (int, error) {
	n, err := b.up.Read(p)
	if b.limit > 0 {
		if b.n += int64(n); b.n > b.limit {
			// The bytes past the bound are not passed on; the relay cuts the answer.
			b.c.overrun("an answer of more than " + strconv.FormatInt(b.limit, 10) + " bytes")
			return 0, errOverrun
		}
	}
	if n > 0 && !b.full && !b.read && !b.passing {
		if b.buf == nil {
			b.buf = captureBufs.Get().(*[]byte)
		}
		if len(*b.buf)+n <= maxCapture {
			*b.buf = append(*b.buf, p[:n]...)
		} else {
			b.full = true
			b.tail = append(b.tail, (*b.buf)[max(len(*b.buf)-maxTail, 0):]...) // the usage may begin there
			b.release()
		}
	}
	if n > 0 && b.full && !b.read && !b.passing {
		b.tail = append(b.tail, p[:n]...)
		if len(b.tail) > 2*maxTail { // trimmed now and then, not at every read
			b.tail = append(b.tail[:0], b.tail[len(b.tail)-maxTail:]...)
		}
	}
	if err == io.EOF {
		b.c.complete = true
		switch {
		case b.read:
		case b.passing:
			b.read = true
		case !b.full:
			b.read = true
			var body []byte
			if b.buf != nil {
				body = *b.buf
			}
			b.c.takeBody(body)
			b.release()
		default:
			b.read = true
			if u, ok := openai.TailUsage(b.tail[max(len(b.tail)-maxTail, 0):]); ok {
				b.c.setUsage(u)
			}
			b.tail = nil
		}
	} else if err != nil {
		b.c.cut = true
	}
	return n, err
}

// readWhole reads the answer, of size bytes (-1: unknown), into one pooled buffer, up to
// maxCapture, for the relay to send whole: what Read does as the relay reads, without keeping a
// copy of what it reads. The answer's usage is read from that buffer when it holds the whole
// answer; otherwise the reads that pass the rest on keep the tail, as Read does. The buffer
// goes back with putCapture.
func (b *captureBody) readWhole(size int64) (bp *[]byte, ended bool, err error) {
	bp, ended, err = readWhole(b.up, size)
	b.n = int64(len(*bp))
	switch {
	case err != nil:
		b.c.cut = true
	case ended:
		b.c.complete = true
		b.read = true
		b.c.takeBody(*bp)
	default:
		b.full = true
		whole := *bp
		b.tail = append(b.tail, whole[max(len(whole)-maxTail, 0):]...) // the usage may begin there
	}
	return bp, ended, err
}

// release gives the buffer back to the pool.
func (b *captureBody) release() {
	putCapture(b.buf)
	b.buf = nil
}

func (b *captureBody) Close() error {
	b.release()
	return b.up.Close()
}

func (c *call) setUsage(u openai.Usage) {
	c.usage, c.haveUsage = c.boundUsage(u), true
	c.cached = c.usage.Cached()
}

// cachedTokens is what the engine said it took from its prefix cache: usage's
// prompt_tokens_details, else llama.cpp's timings.cache_n; -1 when it did not say, or when its
// kind is known not to count them (ollama reports 0 whatever it reused).
func (c *call) cachedTokens() int {
	if ep := c.ep(); ep != nil && !scrape.ReportsCachedTokens(ep.Kind()) {
		return -1 // whatever it says, it does not know: unknown, not zero
	}
	if c.cached < 0 && c.timingsCached >= 0 {
		return c.timingsCached
	}
	return c.cached
}

// status is the request's final status for metrics, the access log and the tenant: what was
// written, unless the answer did not go out whole. A response read to its end and written
// without error is complete whatever the client does next; a stream the engine cut is a 502
// (the client saw 200 and then an error event), and so is an answer cut because the engine
// ignored max_tokens (call.overrun); an answer the router's shutdown cut
// (ErrShuttingDown) is a 503; an answer the client left before its end is a 499 (nginx's code).
func (c *call) status(w *statusWriter, r *http.Request) int {
	status := w.status
	if status == 0 {
		status = http.StatusOK
	}
	switch {
	case c.overran && w.err == nil && r.Context().Err() == nil:
		// The engine ignored max_tokens and its answer was cut (call.overrun): its fault, as a
		// bad answer is.
		return http.StatusBadGateway
	case c.badAnswer && c.stream && w.err == nil && r.Context().Err() == nil:
		// A stream under another Content-Type, relayed as it came, whose bytes were no API
		// stream (takeBody): the engine's fault, as a bad event in a stream is (badEvent).
		if c.errType == "" {
			c.errType, c.errCode = openai.TypeUpstream, codeBadAnswer
		}
		return http.StatusBadGateway
	case c.streamErr && w.err == nil && r.Context().Err() == nil:
		// The client has the engine's error event (after a 200 head): a failure of the engine,
		// as a cut stream is, whatever status the error names: an engine refuses a request
		// (llama.cpp's 400 for a prompt past its context) with its first event, answered before
		// the head with that status, and older vLLM releases name 400 for any failure in a
		// stream, a crash included.
		if c.errType == "" {
			c.errType = "stream_error"
		}
		return http.StatusBadGateway
	case (c.complete || c.unterminated) && w.err == nil:
		return status
	case w.err == nil && (c.shutdown || shuttingDown(r.Context())):
		// The router's shutdown cut the answer (ErrShuttingDown): the client got a 503, or
		// its stream the error event that says so.
		c.shutdown = true
		c.errType, c.errCode = openai.TypeUnavailable, codeShuttingDown
		return http.StatusServiceUnavailable
	case w.err != nil || r.Context().Err() != nil:
		if writeStalled(w.err) && !shuttingDown(r.Context()) {
			// Not the client's hanging up: it stopped reading, and the server cut it after
			// server.write_stall_timeout (or server.write_timeout ran out in a write). Said,
			// so that a client that stalls its streams is told from one that leaves.
			c.errType = errWriteStall
		}
		return 499
	case c.cut:
		if c.errType == "" {
			c.errType = "stream_cut"
		}
		if status >= 500 {
			return status // the router's own answer (answerBroke): 502 or 504
		}
		return http.StatusBadGateway
	}
	return status
}

// errWriteStall is the access line's error_type of a request whose client stopped reading its
// answer, cut by the API server's write stall bound, or whose write_timeout ran out in a write
// (a 499).
const errWriteStall = "client_write_stall"

// writeStalled reports whether err, the first error writing the answer to the client, is the
// API server's cut of a client that stopped reading: a write deadline that fired (net/http's
// WriteTimeout, h1.NetHTTP's WriteStallTimeout: os.ErrDeadlineExceeded), or the connection
// closed under the write by h1.Server, whose WriteStallTimeout closes it (net.ErrClosed: the
// only close of a connection with a request in flight but the server's own Close, at
// shutdown). A client that hangs up resets the connection (ECONNRESET, EPIPE) instead.
func writeStalled(err error) bool {
	return err != nil && (errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, net.ErrClosed))
}

// failure is what the answer's status says of the endpoint that gave it (nothing when the
// router's shutdown cut it).
func (c *call) failure(status int) route.Failure {
	switch {
	case status < 400 || status == 499 || c.shutdown:
		return route.FailNone // fine, or the client's doing
	case c.cut:
		return route.FailCut
	case status == http.StatusNotFound && c.answered:
		return route.FailNotServed // the engine's 404: it does not serve the model, or the path
	case status >= 500:
		return route.FailStatus
	}
	return route.FailRejected
}

// finish settles a request once the response is written.
func (h *Handler) finish(c *call, w *statusWriter, r *http.Request) {
	c.settle(c.status(w, r), r.Method, r.URL.Path)
	c.releaseMemory()
}

// statusWriter records the status, and the first write error (the client went away).
type statusWriter struct {
	http.ResponseWriter
	status int
	bytes  int64
	err    error
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 && code >= 200 { // 1xx are interim answers
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	n, err := w.ResponseWriter.Write(b)
	w.bytes += int64(n)
	if err != nil && w.err == nil {
		w.err = err
	}
	return n, err
}

// Flush flushes the underlying writer (SSE events go out at once).
func (w *statusWriter) Flush() {
	if err := http.NewResponseController(w.ResponseWriter).Flush(); err != nil && w.err == nil && !errors.Is(err, http.ErrNotSupported) {
		w.err = err
	}
}

// endBody sends the answer now: what is buffered (a write error there means the client did
// not get the whole answer), then, with h1.Server's EndBody, a chunked body's end. An error
// writing that end is not the client's loss: the answer had gone out whole (a client may close
// as soon as it has read a stream's [DONE]), as when the server writes the end after the
// handler. Another server's writer ends the body when the handler returns.
func (w *statusWriter) endBody() {
	w.Flush()
	if e := w.ender(); e != nil {
		_ = e.EndBody()
	}
}

// endWithLast ends the body with what is buffered, its last bytes, in one write where the
// server can (h1.Server's EndBody): an error then is the client's loss, as the last bytes went
// with the end. Elsewhere it is endBody.
func (w *statusWriter) endWithLast() {
	e := w.ender()
	if e == nil {
		w.endBody()
		return
	}
	if err := e.EndBody(); err != nil && w.err == nil {
		w.err = err
	}
}

// ender finds h1.Server's EndBody under w, or nil.
func (w *statusWriter) ender() interface{ EndBody() error } {
	var rw http.ResponseWriter = w.ResponseWriter
	for range 16 { // through middleware that wraps the writer (and unwraps it, as for ResponseController)
		if e, ok := rw.(interface{ EndBody() error }); ok {
			return e
		}
		u, ok := rw.(interface{ Unwrap() http.ResponseWriter })
		if !ok {
			break
		}
		rw = u.Unwrap()
	}
	return nil
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// errText is an error's text without URLs of the endpoints' query strings or bodies.
func errText(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Op + " " + ue.URL + ": " + ue.Err.Error()
	}
	return err.Error()
}
