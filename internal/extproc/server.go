package extproc

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/proxy"
)

// The endpoint-picker protocol's names (Gateway API Inference Extension, docs/proposals/004).
const (
	// DestinationKey is the request header, and the key in the LBNamespace dynamic metadata,
	// that tells Envoy where to send the request: "ip:port[,ip:port...]", first choice first.
	DestinationKey = "x-gateway-destination-endpoint"
	// LBNamespace is the metadata namespace of DestinationKey and ServedKey.
	LBNamespace = "envoy.lb"
	// ServedKey, in the LBNamespace filter metadata of the response messages, is the endpoint
	// of the list that answered.
	ServedKey = "x-gateway-destination-endpoint-served"
	// SubsetNamespace and SubsetKey carry the subset hint: the list of "ip:port" the picker
	// must choose from.
	SubsetNamespace = "envoy.lb.subset_hint"
	SubsetKey       = "x-gateway-destination-endpoint-subset"
)

// Health service names: the process is up (Liveness), it can route (Readiness, and the
// ext_proc service's own name, ServiceName).
const (
	Liveness    = "liveness"
	Readiness   = "readiness"
	ServiceName = "envoy.service.ext_proc.v3.ExternalProcessor"
)

// DefaultChunkBytes bounds a body chunk sent back to Envoy in FULL_DUPLEX_STREAMED mode (Envoy
// recommends at most 64 KiB).
const DefaultChunkBytes = 60 << 10

// DefaultIdleTimeout is how long a connection to the picker (or to its health listener) may go
// without a stream before Serve closes it (gRPC's MaxConnectionIdle: a GOAWAY, then the close).
// Without it a client that connects and never opens a stream holds its connection, and a file
// descriptor, for good. Envoy's streams are RPCs, one per HTTP request, so a gateway with
// traffic never sees it; a gateway idle for this long reconnects on its next request (a
// handshake once per idle spell, about a millisecond on a cluster network), and a GOAWAY is
// graceful: a stream sent as it crossed is still served. Two minutes is also how long gRPC
// gives a connection to finish its handshake (its default ConnectionTimeout), so a connection
// that never finishes its handshake and one that never opens a stream are held alike.
const DefaultIdleTimeout = 2 * time.Minute

// keepaliveMinTime is the shortest interval between a client's pings that Serve tolerates:
// closer ones are a flood, answered with GOAWAY (too_many_pings). Pings are allowed without a
// stream, as Envoy's HTTP/2 connection keepalive sends them when it is configured (gRPC's
// default policy closes such a connection); they do not keep a connection from
// DefaultIdleTimeout, which counts streams only.
const keepaliveMinTime = 10 * time.Second

// keepalivePing and keepaliveAckWait find a client that is gone without closing its
// connection (its host crashed, a network path dropped): after keepalivePing without a frame
// from it, Serve pings it, and closes the connection when no answer came keepaliveAckWait
// later, ending its streams (each an HTTP request in flight, settled as the client gone).
// gRPC's default is 2 hours, and a gateway that died mid-request held the requests' endpoint
// counts that long. A live gateway answers pings (HTTP/2 requires it).
const (
	keepalivePing    = 30 * time.Second
	keepaliveAckWait = 10 * time.Second
)

// Server is the ext_proc endpoint picker. Set the fields before serving; only Handler is
// required.
type Server struct {
	// Handler returns the HTTP handler whose settings every stream follows (pool, lifecycle,
	// keys, tenant gate, admission, metrics, log): the application's, the latest after a
	// reload. Called once per stream. Required.
	Handler func() *proxy.Handler
	// Logger gets protocol errors (never a prompt or a key); nil: slog.Default().
	Logger *slog.Logger
	// ChunkBytes bounds each body chunk sent back in FULL_DUPLEX_STREAMED mode; 0:
	// DefaultChunkBytes.
	ChunkBytes int
	// MaxEndpoints bounds the list given to Envoy: the first choice and the fallbacks Envoy
	// tries in turn when its retry policy allows. 0: as many as the lifecycle ranks (1 +
	// limits.max_retries). 1 for a data plane that takes a single address, such as Envoy's
	// ORIGINAL_DST cluster reading the header.
	MaxEndpoints int
	// IdleTimeout closes, in Serve, a connection that has had no stream open for this long; 0:
	// DefaultIdleTimeout.
	IdleTimeout time.Duration
	// DrainDelay is how long Serve goes on taking new streams once ctx has ended, its health
	// answering NOT_SERVING already, so that the gateways and Kubernetes stop sending streams
	// before it stops taking them (server.drain_delay, as `kvroute serve` waits before it
	// closes its API listener); 0: none. As there, it is skipped where nothing follows
	// readiness: nothing asked this server's health for readiness (Readiness, ServiceName, or
	// the server as a whole) since Serve began, and ReadinessAsked, where set, says nobody
	// asked the router's own.
	DrainDelay time.Duration
	// ReadinessAsked reports whether the router's readiness was asked elsewhere (the admin
	// listener's /readyz); nil: only this server's health service counts.
	ReadinessAsked func() bool
	// pingEvery and pingWait replace keepalivePing and keepaliveAckWait (tests); 0: those.
	pingEvery, pingWait time.Duration

	addrs  sync.Map // endpoint name -> its "ip:port" for Envoy, "" when its host is not an IP
	nAddrs int      // entries in addrs, approximately: the map is cleared past maxAddrs
	mu     sync.Mutex

	drain       drainer     // the streams in flight, and their cut at the end of a drain
	healthAsked atomic.Bool // this server's health was asked for readiness (DrainDelay)
}

// maxAddrs bounds the cache of endpoint addresses (endpoints come and go).
const maxAddrs = 4096

var _ extprocv3.ExternalProcessorServer = (*Server)(nil)

// Process serves one ext_proc stream: one HTTP request. It returns when the request has ended
// (nil), or with a gRPC status when the stream broke the protocol after the answer started.
func (s *Server) Process(srv extprocv3.ExternalProcessor_ProcessServer) error {
	cut := s.drain.begin()
	defer s.drain.end()
	// The request's context ends with proxy.ErrShuttingDown when the drain runs out (a pick
	// waiting for admission is let go at once), and the stream is then answered as cut.
	ctx, cancel := context.WithCancelCause(srv.Context())
	defer cancel(nil)
	// Envoy names its body modes in its first message (protocol_config, since 1.34); without
	// it, the modes the Inference Extension's gateways configure are assumed.
	st := &stream{s: s, srv: srv, ctx: ctx, log: s.logger(),
		reqMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, respMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED}
	cutDone := make(chan struct{})
	stop := context.AfterFunc(cut, func() {
		defer close(cutDone)
		cancel(proxy.ErrShuttingDown)
		st.shutdown()
	})
	defer func() {
		if !stop() {
			<-cutDone // its answer is sent before the stream ends, or not at all
		}
	}()
	return st.run()
}

func (s *Server) logger() *slog.Logger {
	if s.Logger == nil {
		return slog.Default()
	}
	return s.Logger
}

func (s *Server) chunkBytes() int {
	if s.ChunkBytes <= 0 {
		return DefaultChunkBytes
	}
	return s.ChunkBytes
}

// Addr is the "ip:port" Envoy is given for ep, "" when its URL's host is not an IP address
// (Envoy's original-destination and host-override load balancing take addresses only).
func (s *Server) Addr(ep *endpoint.Endpoint) string {
	if v, ok := s.addrs.Load(ep.Name); ok {
		return v.(string)
	}
	a := hostPort(ep.Name)
	s.mu.Lock()
	if s.nAddrs >= maxAddrs {
		s.addrs.Clear()
		s.nAddrs = 0
	}
	s.nAddrs++
	s.mu.Unlock()
	s.addrs.Store(ep.Name, a)
	return a
}

// hostPort returns the "ip:port" of a base URL whose host is an IP address (with the scheme's
// default port when it names none), else "".
func hostPort(base string) string {
	u, err := url.Parse(base)
	if err != nil || u.Host == "" {
		return ""
	}
	host, port := u.Hostname(), u.Port()
	if port == "" {
		port = "80"
		if u.Scheme == "https" {
			port = "443"
		}
	}
	ip, err := netip.ParseAddr(host)
	if err != nil || ip.Zone() != "" {
		return ""
	}
	ap, err := netip.ParseAddrPort(net.JoinHostPort(ip.String(), port))
	if err != nil {
		return ""
	}
	return ap.String()
}

// Register adds the ext_proc service and the health service hs (nil: none) to g.
func (s *Server) Register(g *grpc.Server, hs *health.Server) {
	extprocv3.RegisterExternalProcessorServer(g, s)
	if hs != nil {
		healthpb.RegisterHealthServer(g, askedHealth{Server: hs, asked: &s.healthAsked})
	}
}

// askedHealth is a health service that notes whether it was asked for readiness (Readiness,
// ServiceName, or the server as a whole: ""): something follows it, and a drain waits for it
// (DrainDelay). Liveness asks do not count.
type askedHealth struct {
	*health.Server
	asked *atomic.Bool
}

func (h askedHealth) note(service string) {
	switch service {
	case Readiness, ServiceName, "":
		if !h.asked.Load() {
			h.asked.Store(true)
		}
	}
}

func (h askedHealth) Check(ctx context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	h.note(req.GetService())
	return h.Server.Check(ctx, req)
}

func (h askedHealth) Watch(req *healthpb.HealthCheckRequest, srv healthpb.Health_WatchServer) error {
	h.note(req.GetService())
	return h.Server.Watch(req, srv)
}

// NewHealth returns a gRPC health server with Liveness serving and Readiness and ServiceName
// not serving until WatchHealth says otherwise.
func NewHealth() *health.Server {
	hs := health.NewServer()
	hs.SetServingStatus(Liveness, healthpb.HealthCheckResponse_SERVING)
	hs.SetServingStatus(Readiness, healthpb.HealthCheckResponse_NOT_SERVING)
	hs.SetServingStatus(ServiceName, healthpb.HealthCheckResponse_NOT_SERVING)
	return hs
}

// WatchHealth keeps hs's Readiness and ServiceName serving while some endpoint of the pool
// is available (healthy, not draining), checking at every change of the pool and every
// interval (health checks change availability without changing the pool), until ctx ends;
// then Readiness, ServiceName and the server as a whole ("") are set not serving, so that
// Envoy and Kubernetes stop sending new streams while the ones in flight drain. Liveness stays
// serving while the process runs, as the admin listener's /healthz does: a liveness probe
// that failed during the drain would have Kubernetes kill the picker, and the streams it is
// draining with it (it was NOT_SERVING there too until December 2026).
func WatchHealth(ctx context.Context, hs *health.Server, pool func() *endpoint.Pool, interval time.Duration) {
	if interval <= 0 {
		interval = time.Second
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	last := healthpb.HealthCheckResponse_UNKNOWN
	for {
		p := pool()
		st := healthpb.HealthCheckResponse_NOT_SERVING
		for _, e := range p.All() {
			if e.Available() {
				st = healthpb.HealthCheckResponse_SERVING
				break
			}
		}
		if st != last {
			hs.SetServingStatus(Readiness, st)
			hs.SetServingStatus(ServiceName, st)
			last = st
		}
		select {
		case <-ctx.Done():
			for _, name := range []string{ServiceName, "", Readiness} { // readiness last: the rest is set when it is
				hs.SetServingStatus(name, healthpb.HealthCheckResponse_NOT_SERVING)
			}
			return
		case <-p.Changed():
		case <-t.C:
		}
	}
}

// keepalive is Serve's connection policy: connections without a stream are closed after
// IdleTimeout, a client silent for keepalivePing is pinged and dropped when it does not answer,
// and pings are tolerated down to keepaliveMinTime apart.
func (s *Server) keepalive() []grpc.ServerOption {
	idle := s.IdleTimeout
	if idle <= 0 {
		idle = DefaultIdleTimeout
	}
	return []grpc.ServerOption{
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: idle,
			Time: cmp.Or(s.pingEvery, keepalivePing), Timeout: cmp.Or(s.pingWait, keepaliveAckWait)}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: keepaliveMinTime, PermitWithoutStream: true}),
	}
}

// Serve serves the picker (and health) on ln and health alone on healthLn (nil: none) until
// ctx ends, then shuts down as `kvroute serve` does, in the order a gateway can follow:
//
//  1. health answers NOT_SERVING at once (every service but Liveness: WatchHealth);
//  2. new streams are still taken for DrainDelay, while gateways and Kubernetes that follow
//     readiness take the picker out (skipped where nothing asked for it);
//  3. no new stream is taken (gRPC GOAWAY), and the streams in flight (each an HTTP request,
//     streams included) get drain to end;
//  4. those still open then are cut: each is answered with an immediate response 503 of code
//     shutting_down (a stream whose events pass through kvroute first gets that error event),
//     settled, logged and counted as 503 shutting_down, nothing against its engine, and a
//     warning says how many. The connections still open cutGrace later are closed.
//
// pool is watched for readiness. On both listeners a connection without a stream is closed
// after IdleTimeout; opts, applied to the picker's server after that policy, may replace it
// (grpc.KeepaliveParams). It returns nil after a clean drain (cut streams included).
func (s *Server) Serve(ctx context.Context, ln, healthLn net.Listener, pool func() *endpoint.Pool, drain time.Duration, opts ...grpc.ServerOption) error {
	hs := NewHealth()
	ka := s.keepalive()
	main := grpc.NewServer(append(ka, opts...)...)
	s.Register(main, hs)
	servers := []*grpc.Server{main}
	listeners := []net.Listener{ln}
	if healthLn != nil {
		hg := grpc.NewServer(ka...)
		healthpb.RegisterHealthServer(hg, askedHealth{Server: hs, asked: &s.healthAsked})
		servers = append(servers, hg)
		listeners = append(listeners, healthLn)
	}
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	watched := make(chan struct{})
	go func() { defer close(watched); WatchHealth(wctx, hs, pool, time.Second) }()
	errc := make(chan error, len(servers))
	var wg sync.WaitGroup
	for i, g := range servers {
		wg.Go(func() { errc <- g.Serve(listeners[i]) })
	}
	var first error
	select {
	case <-ctx.Done():
	case first = <-errc:
	}
	stopWatch()
	<-watched // not serving: gateways stop sending new streams while the others drain
	if first == nil {
		first = s.drainDelay(errc)
	}
	s.drainStreams(main, drain)
	for _, g := range servers[1:] {
		g.Stop() // health answers are instant; a Watch lasts until its connection closes
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		if first == nil && err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			first = err
		}
	}
	return first
}

// drainDelay is Serve's wait, with health NOT_SERVING, before it stops taking streams
// (DrainDelay): skipped where nothing asked for readiness. It ends early with the error of a
// server that stops meanwhile (returned).
func (s *Server) drainDelay(errc <-chan error) error {
	d := s.DrainDelay
	switch {
	case d <= 0:
		return nil
	case !s.healthAsked.Load() && (s.ReadinessAsked == nil || !s.ReadinessAsked()):
		s.logger().Info("ext_proc shutting down: no drain delay, as readiness was never asked (nothing follows it)", "drain_delay", d.String())
		return nil
	}
	s.logger().Info("ext_proc shutting down: health answers NOT_SERVING; new streams are still taken for server.drain_delay, while gateways take the picker out",
		"drain_delay", d.String(), "in_flight", s.drain.inFlight())
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case err := <-errc:
		return err
	}
}

// cutGrace is how long the streams cut at the end of a drain get to send their answers and
// end before their connections are closed.
const cutGrace = time.Second

// drainStreams stops g taking streams and gives those in flight timeout to end; then it cuts
// those still open (each answered and settled as shutting_down: stream.shutdown), and closes
// the connections still open cutGrace later, and says how many were cut.
func (s *Server) drainStreams(g *grpc.Server, timeout time.Duration) {
	s.logger().Info("ext_proc shutting down: draining streams in flight", "timeout", timeout.String(), "in_flight", s.drain.inFlight())
	stopped := make(chan struct{})
	go func() { g.GracefulStop(); close(stopped) }()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-stopped:
	case <-s.drain.idle():
	case <-t.C:
		s.drain.cutAll()
	}
	// The connections close as their last streams end (their last answers sent). What holds
	// one longer: a health Watch on this listener, a gateway that keeps open a stream it was
	// answered on, an answer that cannot be sent.
	grace := time.NewTimer(cutGrace)
	defer grace.Stop()
	select {
	case <-stopped:
	case <-grace.C:
		g.Stop()
		<-stopped
	}
	// Their handlers end at once now (every receive and send fails); settled before Serve
	// returns, so that their access lines are written.
	left := time.NewTimer(cutGrace)
	defer left.Stop()
	select {
	case <-s.drain.idle():
	case <-left.C:
		s.logger().Warn("ext_proc streams still running after their connections were closed", "in_flight", s.drain.inFlight())
	}
	if n := s.drain.cuts.Load(); n > 0 {
		s.logger().Warn("ext_proc drain timed out: requests still in flight were cut, each answered 503 shutting_down through the gateway (a stream with an SSE error event where its events pass through kvroute); raise server.shutdown_timeout (and the pod's terminationGracePeriodSeconds) to let them finish",
			"cut", n, "shutdown_timeout", timeout.String())
	}
}

// drainer counts a server's streams in flight and cuts them at the end of a drain. Its zero
// value is ready.
type drainer struct {
	mu     sync.Mutex
	open   int                     // streams in flight
	idleCh chan struct{}           // closed when open falls to zero (made by idle)
	ctx    context.Context         // ends with proxy.ErrShuttingDown at the cut
	cut    context.CancelCauseFunc // ends ctx
	cuts   atomic.Int64            // requests answered as cut (stream.shutdown)
}

// begin counts a stream in and returns the context whose end cuts it.
func (d *drainer) begin() context.Context {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.init()
	d.open++
	return d.ctx
}

// end counts a stream out.
func (d *drainer) end() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.open--
	if d.open == 0 && d.idleCh != nil {
		close(d.idleCh)
		d.idleCh = nil
	}
}

func (d *drainer) init() {
	if d.ctx == nil {
		d.ctx, d.cut = context.WithCancelCause(context.Background())
	}
}

// idle returns a channel closed once no stream is in flight.
func (d *drainer) idle() <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.open == 0 {
		ch := make(chan struct{})
		close(ch)
		return ch
	}
	if d.idleCh == nil {
		d.idleCh = make(chan struct{})
	}
	return d.idleCh
}

func (d *drainer) inFlight() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.open
}

// cutAll cuts every stream in flight, and any that begins later.
func (d *drainer) cutAll() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.init()
	d.cut(proxy.ErrShuttingDown)
}
