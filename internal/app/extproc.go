package app

import (
	"context"
	"net"

	"github.com/kvroute/kvroute/internal/extproc"
)

// ExtProc returns the Envoy ext_proc endpoint picker of the router: every stream follows the
// API handler in force (the same pool, lifecycle, policy, tenant gate, limits, metrics and
// access log, reloads included), so a request picked through Envoy and one proxied by the
// router are one fleet's traffic to the policy.
func (r *Router) ExtProc() *extproc.Server {
	return &extproc.Server{Handler: r.h.Load, Logger: r.logger}
}

// ServeExtProc serves the endpoint picker (and gRPC health) on ln, and gRPC health alone on
// healthLn (nil: none), until ctx ends; then it stops taking streams and gives those in flight
// server.shutdown_timeout to end. Run it beside Serve, which runs discovery, health checks and
// scraping.
func (r *Router) ServeExtProc(ctx context.Context, ln, healthLn net.Listener) error {
	return r.ExtProc().Serve(ctx, ln, healthLn, r.Pool, r.Config().Server.ShutdownTimeout.D())
}
