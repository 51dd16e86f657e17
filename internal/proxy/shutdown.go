package proxy

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"

	"github.com/kvroute/kvroute/internal/openai"
)

// ErrShuttingDown is the cause a request's context ends with when the server's drain ran out
// (server.shutdown_timeout) with the request still in flight (Drain.Cut). The handler then
// answers for the router, not for a client that left: a request whose answer has not begun
// gets a 503 (code shutting_down), a stream ends with an SSE error event of that code, and the
// access line, kvroute_requests_total and the tenant's count say 503, with error_type
// service_unavailable_error and error_code shutting_down. Nothing counts against the engine.
var ErrShuttingDown = errors.New("the router is shutting down")

// codeShuttingDown is the error code of requests the router's shutdown cut.
const codeShuttingDown = "shutting_down"

// shuttingDown reports whether ctx ended because the router's shutdown cut its request.
func shuttingDown(ctx context.Context) bool {
	return ctx.Err() != nil && errors.Is(context.Cause(ctx), ErrShuttingDown)
}

// shutdownError is the answer, or the stream's last event, of a request the shutdown cut.
func shutdownError(rid string) *openai.Error {
	return openai.NewError(http.StatusServiceUnavailable, openai.TypeUnavailable, "", codeShuttingDown,
		"the router is shutting down: the request was still in flight when its drain (server.shutdown_timeout) ran out; send it again (request id "+rid+")")
}

// Drain is the API handler's side of a graceful shutdown. Wrap gives each request a context
// that Cut ends with ErrShuttingDown, and counts the requests in flight; after Closing, each
// answer whose head goes out asks the client to close its connection (Connection: close),
// those of requests that were in flight at Closing included, so that a client with kept-alive
// connections opens new ones, which its load balancer sends elsewhere once it has seen /readyz
// fail. The zero value is not usable: NewDrain.
type Drain struct {
	ctx      context.Context
	cut      context.CancelCauseFunc
	closing  atomic.Bool
	inFlight atomic.Int64
}

// NewDrain returns a Drain that has not begun.
func NewDrain() *Drain {
	ctx, cut := context.WithCancelCause(context.Background())
	return &Drain{ctx: ctx, cut: cut}
}

// Wrap returns next with each request followed by d.
func (d *Drain) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d.inFlight.Add(1)
		defer d.inFlight.Add(-1)
		ctx, cancel := context.WithCancelCause(r.Context())
		defer cancel(nil)
		stop := context.AfterFunc(d.ctx, func() { cancel(ErrShuttingDown) })
		defer stop()
		cw := &closingWriter{ResponseWriter: w, d: d}
		next.ServeHTTP(cw, r.WithContext(ctx))
		if !cw.head {
			cw.decide() // nothing written: the server writes the head after the handler returns
		}
	})
}

// closingWriter asks for Connection: close when the answer's head goes out, not when the
// request came: a request in flight at Closing (a long generation, a stream whose first token
// has not come) answers after it, and its client would otherwise send its next request on a
// connection that is about to close. A head that went out before Closing cannot be taken
// back: the next answer on that connection carries it. Flush, FlushError and Unwrap keep the
// relay's paths (http.ResponseController, h1.Server's EndBody found by unwrapping) as they
// were without it.
type closingWriter struct {
	http.ResponseWriter
	d    *Drain
	head bool // decided: a final status, a write or a flush went to the writer
}

// decide adds Connection: close to the head about to go out, if the drain is closing.
func (w *closingWriter) decide() {
	w.head = true
	if w.d.closing.Load() {
		w.ResponseWriter.Header().Set("Connection", "close")
	}
}

func (w *closingWriter) WriteHeader(code int) {
	if !w.head && code >= 200 { // 1xx are interim answers: the final head is still to come
		w.decide()
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *closingWriter) Write(p []byte) (int, error) {
	if !w.head {
		w.decide()
	}
	return w.ResponseWriter.Write(p)
}

// Flush sends what is buffered, the head first when it has not gone out.
func (w *closingWriter) Flush() { _ = w.FlushError() }

// FlushError is Flush that reports the error (http.ResponseController asks for it first).
func (w *closingWriter) FlushError() error {
	if !w.head {
		w.decide()
	}
	if f, ok := w.ResponseWriter.(interface{ FlushError() error }); ok {
		return f.FlushError() // h1.Server's writer, and net/http's behind kvroute serve's guard
	}
	return http.NewResponseController(w.ResponseWriter).Flush()
}

// Unwrap lets http.ResponseController, and the relay looking for h1.Server's EndBody, reach
// the server's writer.
func (w *closingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Closing makes every answer whose head goes out from now on close its connection.
func (d *Drain) Closing() { d.closing.Store(true) }

// InFlight is how many requests are being served now.
func (d *Drain) InFlight() int { return int(d.inFlight.Load()) }

// Cut ends every request in flight, and any that comes later, with ErrShuttingDown, and
// returns how many were in flight.
func (d *Drain) Cut() int {
	n := d.InFlight()
	d.cut(ErrShuttingDown)
	return n
}
