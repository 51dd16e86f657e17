package proxy

import (
	"context"
	"errors"
	"net"
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

// Drain is the API handler's side of a graceful shutdown: Wrap counts the requests in flight,
// and Cut ends each, and any that comes later, with ErrShuttingDown. A server that derives its
// requests' contexts from BaseContext (the field of that name in h1.Server and net/http's
// Server) ends them with it, and Wrap adds nothing to a request but its count; under another
// server, Wrap gives each request a context of its own for Cut to end.
//
// Asking the clients to close their connections once the shutdown begins, so that those with
// kept-alive connections open new ones, which their load balancer sends elsewhere once it has
// seen /readyz fail, is the server's side: SetKeepAlivesEnabled(false) (h1.Server's,
// h1.NetHTTP's) makes every answer whose head goes out from then on carry Connection: close,
// those of requests already in flight included. The zero value is not usable: NewDrain.
type Drain struct {
	ctx      context.Context // BaseContext's: Cut ends it; it carries drainKey, for Wrap
	cut      context.CancelCauseFunc
	inFlight atomic.Int64
}

// drainKey is the key of BaseContext's value: the Drain whose Cut ends the request.
type drainKey struct{}

// NewDrain returns a Drain that has not begun.
func NewDrain() *Drain {
	ctx, cut := context.WithCancelCause(context.Background())
	d := &Drain{cut: cut}
	d.ctx = context.WithValue(ctx, drainKey{}, d)
	return d
}

// BaseContext returns the context for a server's BaseContext: the requests whose contexts
// derive from it end when Cut ends it, with ErrShuttingDown as their cause.
func (d *Drain) BaseContext(net.Listener) context.Context { return d.ctx }

// Wrap returns next with each request followed by d.
func (d *Drain) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d.inFlight.Add(1)
		defer d.inFlight.Add(-1)
		if r.Context().Value(drainKey{}) != d {
			// The server does not build on BaseContext: a context for Cut to end, of this
			// request's own (9 allocations: BenchmarkHandlerDrain4K/own-context).
			ctx, cancel := context.WithCancelCause(r.Context())
			defer cancel(nil)
			stop := context.AfterFunc(d.ctx, func() { cancel(ErrShuttingDown) })
			defer stop()
			r = r.WithContext(ctx)
		}
		next.ServeHTTP(w, r)
	})
}

// InFlight is how many requests are being served now.
func (d *Drain) InFlight() int { return int(d.inFlight.Load()) }

// Cut ends every request in flight, and any that comes later, with ErrShuttingDown, and
// returns how many were in flight.
func (d *Drain) Cut() int {
	n := d.InFlight()
	d.cut(ErrShuttingDown)
	return n
}
