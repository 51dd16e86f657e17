package proxy

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/metrics"
	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/policy"
)

// maxCapture bounds how much of a non-streamed response body is kept to read its usage, and
// of an error body to rewrite it.
const maxCapture = 4 << 20

// maxEvent bounds one server-sent event.
const maxEvent = 4 << 20

// retryTransport sends a call's request to its ranked endpoints in turn: on a connection error
// or a 503 (which comes before any response byte) it tries the next, up to the call's list.
type retryTransport struct{ h *Handler }

func (t *retryTransport) RoundTrip(out *http.Request) (*http.Response, error) {
	c := callFrom(out.Context())
	if c == nil {
		return nil, errors.New("proxy: request without routing state")
	}
	h := t.h
	obs, _ := h.Picker.(policy.Observer)
	pred, _ := h.Picker.(policy.Predictor)
	var lastErr error
	for i, ep := range c.ranked {
		if out.Context().Err() != nil {
			return nil, out.Context().Err()
		}
		u, err := url.Parse(ep.Name)
		if err != nil {
			lastErr = err
			continue
		}
		body := c.bodyFor(h, ep)
		req := out.Clone(out.Context())
		req.URL.Scheme, req.URL.Host = u.Scheme, u.Host
		req.URL.Path = strings.TrimSuffix(u.Path, "/") + out.URL.Path
		req.URL.RawPath = ""
		req.Host = u.Host
		req.Body = io.NopCloser(bytes.NewReader(body))
		req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
		req.ContentLength = int64(len(body))
		req.Header.Del("Accept-Encoding")
		req.Header.Set("X-Request-Id", c.rid)
		req.Header.Set("Content-Type", "application/json")
		if c.id != nil {
			req.Header.Del("Authorization") // the tenant's key is ours, not the engine's
		}
		c.predict = -1
		if pred != nil {
			c.predict = pred.PredictCached(&c.preq, ep)
		}
		c.attempts++
		ep.Start(c.preq.PromptTokens)
		if obs != nil {
			obs.Routed(&c.preq, ep)
		}
		resp, err := h.Transport.RoundTrip(req)
		last := i == len(c.ranked)-1
		if err != nil {
			t.failed(c, ep, obs)
			if out.Context().Err() != nil {
				return nil, err // the client went away; not the endpoint's fault
			}
			h.connFailure(ep)
			lastErr = err
			if !last {
				h.Metrics.Retries.WithLabelValues(ep.Name, "connect_error").Inc()
				h.Logger.Warn("endpoint unreachable, trying the next", "request_id", c.rid, "endpoint", ep.Name, "err", errText(err))
			}
			continue
		}
		if h.OnSuccess != nil {
			h.OnSuccess(ep)
		} else {
			h.State.failureCounter(ep.Name).Store(0)
		}
		if resp.StatusCode == http.StatusServiceUnavailable && !last {
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
			resp.Body.Close()
			t.failed(c, ep, obs)
			h.Metrics.Retries.WithLabelValues(ep.Name, "unavailable").Inc()
			continue
		}
		c.ep = ep
		return resp, nil
	}
	if lastErr == nil {
		lastErr = errors.New("no endpoint left to try")
	}
	return nil, lastErr
}

// failed settles an attempt that produced no response to relay.
func (t *retryTransport) failed(c *call, ep *endpoint.Endpoint, obs policy.Observer) {
	ep.Finish(c.preq.PromptTokens, false)
	if obs != nil {
		obs.Done(&c.preq, ep, policy.Result{OK: false, CachedTokens: -1, PromptTokens: c.preq.PromptTokens,
			Duration: t.h.Now().Sub(c.start)})
	}
}

// connFailure counts a connection error and ejects the endpoint after PassiveFailures in a row.
func (h *Handler) connFailure(ep *endpoint.Endpoint) {
	if h.OnConnError != nil {
		was := ep.Healthy()
		h.OnConnError(ep)
		if was && !ep.Healthy() {
			h.Metrics.EndpointEjected(ep.Name)
			h.Logger.Warn("endpoint ejected after consecutive connection errors", "endpoint", ep.Name)
		}
		return
	}
	if h.PassiveFailures < 0 {
		return
	}
	n := h.State.failureCounter(ep.Name).Add(1)
	if int(n) >= h.PassiveFailures && ep.Healthy() {
		ep.SetHealthy(false)
		h.Metrics.EndpointEjected(ep.Name)
		h.Logger.Warn("endpoint ejected after consecutive connection errors", "endpoint", ep.Name, "errors", n)
	}
}

// bodyFor returns the body to send to ep: with the tenant's cache_salt when ep honours it.
func (c *call) bodyFor(h *Handler, ep *endpoint.Endpoint) []byte {
	if c.id == nil || c.id.Salt == "" || !h.Pool.CacheSalt(ep) {
		return c.body
	}
	if c.salted == nil {
		v := strconv.Quote(c.id.Salt)
		b, err := openai.Patch(c.body, openai.Set{Key: "cache_salt", Value: []byte(v)})
		if err != nil {
			return c.body
		}
		c.salted = b
	}
	return c.salted
}

// modifyResponse rewrites upstream errors into OpenAI bodies and wraps the body so the router
// sees the first token and the usage as they pass.
func (h *Handler) modifyResponse(resp *http.Response) error {
	c := callFrom(resp.Request.Context())
	if c == nil {
		return nil
	}
	if h.EndpointHeader != "" && c.ep != nil {
		resp.Header.Set(h.EndpointHeader, c.ep.Name)
	}
	if resp.StatusCode >= 400 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, maxCapture))
		resp.Body.Close()
		e := openai.NormalizeUpstreamError(resp.StatusCode, b)
		c.errType = e.Type
		nb := e.Body()
		resp.Body = io.NopCloser(bytes.NewReader(nb))
		resp.ContentLength = int64(len(nb))
		resp.Header.Set("Content-Length", strconv.Itoa(len(nb)))
		resp.Header.Set("Content-Type", "application/json")
		resp.Header.Del("Content-Encoding")
		return nil
	}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		resp.Body = &sseBody{c: c, up: resp.Body, r: openai.NewSSEReader(resp.Body, maxEvent)}
		resp.ContentLength = -1
		resp.Header.Del("Content-Length")
		return nil
	}
	resp.Body = &captureBody{c: c, up: resp.Body}
	return nil
}

// sseBody passes a stream on event by event (the reverse proxy flushes after each Read),
// timing the first event, reading usage and response ids, and dropping the usage-only chunk
// the router asked for on the client's behalf.
type sseBody struct {
	c       *call
	up      io.ReadCloser
	r       *openai.SSEReader
	pending []byte
	err     error
}

func (s *sseBody) Read(p []byte) (int, error) {
	for len(s.pending) == 0 {
		if s.err != nil {
			return 0, s.err
		}
		ev, err := s.r.Next()
		if err != nil {
			s.err = err
			continue
		}
		s.c.onFirstByte()
		if len(ev.Data) > 0 && bytes.Contains(ev.Data, []byte(`"usage"`)) {
			if u, ok := openai.ScanUsage(ev.Data); ok {
				s.c.setUsage(u)
				if s.c.dropUsage && openai.IsUsageOnlyChunk(ev.Data) {
					continue
				}
			}
		}
		if s.c.req != nil && s.c.req.Kind == openai.KindResponse && s.c.respID == "" && len(ev.Data) > 0 {
			s.c.respID = openai.ResponseID(ev.Data)
		}
		s.pending = append(s.pending[:0], ev.Raw...)
	}
	n := copy(p, s.pending)
	s.pending = s.pending[n:]
	return n, nil
}

func (s *sseBody) Close() error { return s.up.Close() }

// captureBody passes a body on while keeping its first maxCapture bytes to read usage at EOF.
// The copy lives in a pooled buffer, given back at EOF or Close (usage and ids are copied out).
type captureBody struct {
	c    *call
	up   io.ReadCloser
	buf  *[]byte // nil until the first byte, and again once given back
	full bool
	read bool // EOF was seen and the usage read
}

// captureBufs recycles captureBody buffers; ones grown past maxPooledCapture are dropped.
var captureBufs = sync.Pool{New: func() any { b := make([]byte, 0, 4<<10); return &b }}

const maxPooledCapture = 64 << 10

func (b *captureBody) Read(p []byte) (int, error) {
	n, err := b.up.Read(p)
	if n > 0 {
		b.c.onFirstByte()
		if !b.full && !b.read {
			if b.buf == nil {
				b.buf = captureBufs.Get().(*[]byte)
			}
			if len(*b.buf)+n <= maxCapture {
				*b.buf = append(*b.buf, p[:n]...)
			} else {
				b.full = true
			}
		}
	}
	if err == io.EOF && !b.full && !b.read {
		b.read = true
		var body []byte
		if b.buf != nil {
			body = *b.buf
		}
		if u, ok := openai.ScanUsage(body); ok {
			b.c.setUsage(u)
		}
		if b.c.req != nil && b.c.req.Kind == openai.KindResponse {
			b.c.respID = openai.ResponseID(body)
		}
		b.release()
	}
	return n, err
}

// release gives the buffer back to the pool.
func (b *captureBody) release() {
	if b.buf == nil {
		return
	}
	if cap(*b.buf) <= maxPooledCapture {
		*b.buf = (*b.buf)[:0]
		captureBufs.Put(b.buf)
	}
	b.buf = nil
}

func (b *captureBody) Close() error {
	b.release()
	return b.up.Close()
}

// onFirstByte records the first token time of a stream (its first event). A non-streamed
// response's first byte comes with its last token, so it tells nothing about prefill: only
// streams report a TTFT.
func (c *call) onFirstByte() {
	if !c.firstAt.IsZero() || !c.stream || c.ep == nil {
		return
	}
	c.firstAt = c.h.Now()
	ttft := c.firstAt.Sub(c.start)
	c.ep.FirstToken(c.preq.PromptTokens)
	if obs, ok := c.h.Picker.(policy.Observer); ok {
		obs.FirstToken(&c.preq, c.ep, ttft)
	}
	c.h.Metrics.TTFT.WithLabelValues(c.model).Observe(ttft.Seconds())
}

func (c *call) setUsage(u openai.Usage) {
	c.usage, c.haveUsage = u, true
	c.cached = u.Cached()
}

// finish settles a request once the response is written: endpoint counters, the policy's
// Done, the tenant's Settle, metrics and the access line.
func (h *Handler) finish(c *call, w *statusWriter, r *http.Request) {
	end := h.Now()
	status := w.status
	if status == 0 {
		status = http.StatusOK
	}
	if r.Context().Err() != nil {
		status = 499 // the client went away before the end of the answer (nginx's code)
	}
	dur := end.Sub(c.start)
	prompt, completion := 0, 0
	if c.req != nil {
		prompt = c.preq.PromptTokens
		if c.haveUsage && c.usage.Prompt() > 0 {
			prompt = c.usage.Prompt()
		}
		completion = c.usage.Completion()
	}
	epName := metrics.NoEndpoint
	if c.ep != nil {
		epName = c.ep.Name
		first := !c.firstAt.IsZero()
		c.ep.Finish(c.preq.PromptTokens, first)
		if obs, ok := h.Picker.(policy.Observer); ok {
			var ttft time.Duration
			if first {
				ttft = c.firstAt.Sub(c.start)
			}
			obs.Done(&c.preq, c.ep, policy.Result{
				OK: status < 400, CachedTokens: c.cached, PromptTokens: prompt, OutputTokens: completion,
				TTFT: ttft, Duration: dur,
			})
		}
		if c.respID != "" && status < 400 {
			h.State.pins.put(c.respID, c.ep.Name)
		}
		h.Metrics.PromptTokens.WithLabelValues(c.model).Add(float64(prompt))
		h.Metrics.CompletionTokens.WithLabelValues(c.model).Add(float64(completion))
		h.Metrics.PredictedCachedTokens(c.model, epName, c.predict)
		if c.cached >= 0 {
			h.Metrics.EngineCached.WithLabelValues(c.model).Add(float64(c.cached))
			h.Metrics.CachedReported.WithLabelValues(c.model).Add(float64(prompt))
		}
	}
	if c.id != nil && c.id.Settle != nil {
		// What the engines used: nothing when no endpoint answered (the tenant's estimate is
		// refunded).
		if c.ep == nil {
			c.id.Settle(0, 0)
		} else {
			c.id.Settle(prompt, completion)
		}
	}
	model := c.model
	if model == "" {
		model = metrics.UnknownModel
	}
	h.Metrics.Requests.WithLabelValues(model, epName, metrics.Status(status)).Inc()
	h.Metrics.Duration.WithLabelValues(model).Observe(dur.Seconds())
	var attrBuf [13]slog.Attr // every attribute below, on the stack
	attrs := append(attrBuf[:0],
		slog.String("request_id", c.rid),
		slog.String("method", r.Method),
		slog.String("path", r.URL.Path),
		slog.Int("status", status),
		slog.Float64("duration_ms", float64(dur.Microseconds())/1000),
	)
	if c.req != nil {
		attrs = append(attrs, slog.String("model", c.req.Model), slog.Bool("stream", c.stream),
			slog.Int("prompt_tokens", prompt), slog.Int("completion_tokens", completion), slog.Int("cached_tokens", c.cached))
	}
	if c.ep != nil {
		attrs = append(attrs, slog.String("endpoint", c.ep.Name), slog.Int("attempts", c.attempts))
	}
	if !c.firstAt.IsZero() {
		attrs = append(attrs, slog.Float64("ttft_ms", float64(c.firstAt.Sub(c.start).Microseconds())/1000))
	}
	if c.id != nil {
		attrs = append(attrs, slog.String("tenant", c.id.Name))
	}
	if c.errType != "" {
		attrs = append(attrs, slog.String("error_type", c.errType))
	}
	h.Logger.LogAttrs(context.Background(), slog.LevelInfo, "request", attrs...)
}

// statusWriter records the status and whether the body was written to the end.
type statusWriter struct {
	http.ResponseWriter
	status int
	bytes  int64
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
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
	return n, err
}

// Flush flushes the underlying writer (SSE events go out at once).
func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
