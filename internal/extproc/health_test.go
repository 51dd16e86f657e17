package extproc

import (
	"context"
	"log/slog"
	"testing"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/proxy"
)

func dial(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// waitStatus watches service until it reports want.
func waitStatus(t *testing.T, hc healthpb.HealthClient, service string, want healthpb.HealthCheckResponse_ServingStatus) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	w, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		t.Fatal(err)
	}
	for {
		r, err := w.Recv()
		if err != nil {
			t.Fatalf("%s: waiting for %v: %v", service, want, err)
		}
		if r.GetStatus() == want {
			return
		}
	}
}

// TestServeHealthAndDrain: Serve answers ext_proc and health on its listener and health on the
// health listener; readiness follows the endpoints' availability; at the end of ctx a stream
// in flight is given its drain time and Serve returns nil. During the drain readiness, the
// ext_proc service and the server as a whole are not serving, and liveness still is, as
// /healthz stays up while `kvroute serve` drains: a liveness probe that failed then would have
// Kubernetes kill the picker and its streams in flight. Before, the drain set every service
// NOT_SERVING, liveness too.
func TestServeHealthAndDrain(t *testing.T) {
	f := newFixture(t, []string{ep1})
	ln, hln := loopback(t), loopback(t)
	s := &Server{Handler: func() *proxy.Handler { return f.h }, Logger: slog.New(slog.DiscardHandler)}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx, ln, hln, func() *endpoint.Pool { return f.pool }, 10*time.Second) }()

	hc := healthpb.NewHealthClient(dial(t, hln.Addr().String()))
	waitStatus(t, hc, Liveness, healthpb.HealthCheckResponse_SERVING)
	waitStatus(t, hc, Readiness, healthpb.HealthCheckResponse_SERVING)
	waitStatus(t, healthpb.NewHealthClient(dial(t, ln.Addr().String())), ServiceName, healthpb.HealthCheckResponse_SERVING)
	f.pool.ByName(ep1).SetHealthy(false)
	waitStatus(t, hc, Readiness, healthpb.HealthCheckResponse_NOT_SERVING)
	waitStatus(t, hc, ServiceName, healthpb.HealthCheckResponse_NOT_SERVING)
	if r, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: Liveness}); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("liveness with no endpoint available = %v, %v: want SERVING", r, err)
	}
	f.pool.ByName(ep1).SetHealthy(true)
	waitStatus(t, hc, Readiness, healthpb.HealthCheckResponse_SERVING)

	// A request in flight when the server is told to stop finishes.
	e := &envoy{t: t, cfg: &extprocv3.ProtocolConfiguration{RequestBodyMode: fullDuplex, ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED}}
	sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer scancel()
	var err error
	e.c, err = extprocv3.NewExternalProcessorClient(dial(t, ln.Addr().String())).Process(sctx)
	if err != nil {
		t.Fatal(err)
	}
	e.send(reqHeaders("/v1/chat/completions", false))
	e.send(reqBody(plainChat, true))
	if got := destination(e.recv()); got != "10.0.0.1:8000" {
		t.Fatalf("destination = %q", got)
	}
	e.streamedBody(false)
	cancel()
	waitStatus(t, hc, Readiness, healthpb.HealthCheckResponse_NOT_SERVING)
	for service, want := range map[string]healthpb.HealthCheckResponse_ServingStatus{
		Liveness: healthpb.HealthCheckResponse_SERVING, Readiness: healthpb.HealthCheckResponse_NOT_SERVING,
		ServiceName: healthpb.HealthCheckResponse_NOT_SERVING, "": healthpb.HealthCheckResponse_NOT_SERVING,
	} {
		if r, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: service}); err != nil || r.GetStatus() != want {
			t.Errorf("health of %q during the drain = %v, %v: want %v", service, r.GetStatus(), err, want)
		}
	}
	e.send(respHeaders(200, "", false, "content-type", "application/json"))
	e.recv()
	e.send(respBody(jsonAnswer, true))
	e.streamedBody(true)
	e.close()
	select {
	case err := <-served:
		if err != nil {
			t.Errorf("Serve = %v, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after its stream ended")
	}
	if n := f.pool.ByName(ep1).InFlight(); n != 0 {
		t.Errorf("in flight = %d", n)
	}
}
