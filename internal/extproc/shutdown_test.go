package extproc

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/google/go-cmp/cmp"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/metrics/metricstest"
	"github.com/kvroute/kvroute/internal/proxy"
	"github.com/kvroute/kvroute/internal/tenant"
	"github.com/kvroute/kvroute/internal/testlog"
)

// picker is a Server run by Serve on loopback for a fixture's pool, its logs in logs; f's
// client is pointed at it.
type picker struct {
	s      *Server
	addr   string // the ext_proc listener's
	logs   *testlog.Buffer
	health healthpb.HealthClient // on the health listener
	cancel context.CancelFunc    // ends Serve's ctx: the shutdown begins
	served chan error
}

func startPicker(t *testing.T, f *fixture, s *Server, shutdownTimeout time.Duration) *picker {
	t.Helper()
	p := &picker{s: s, logs: &testlog.Buffer{}, served: make(chan error, 1)}
	s.Handler = func() *proxy.Handler { return f.h }
	s.Logger = slog.New(slog.NewJSONHandler(p.logs, nil))
	ln, hln := loopback(t), loopback(t)
	p.addr = ln.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	p.cancel = cancel
	go func() { p.served <- s.Serve(ctx, ln, hln, func() *endpoint.Pool { return f.pool }, shutdownTimeout) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-p.served:
		case <-time.After(10 * time.Second):
			t.Error("Serve did not return")
		}
	})
	p.health = healthpb.NewHealthClient(dial(t, hln.Addr().String()))
	f.client = extprocv3.NewExternalProcessorClient(dial(t, p.addr))
	return p
}

// stopped waits for Serve to return, within limit, and returns its error.
func (p *picker) stopped(t *testing.T, limit time.Duration) error {
	t.Helper()
	select {
	case err := <-p.served:
		p.served <- err // for the cleanup
		return err
	case <-time.After(limit):
		t.Fatalf("Serve did not return within %v", limit)
		return nil
	}
}

// whole plays one non-streamed request through the picker, from its headers to its answer's end.
func (f *fixture) whole(t *testing.T) {
	t.Helper()
	e, r := f.routed(t, plainChat)
	if got := destination(r); got != "10.0.0.1:8000" {
		t.Fatalf("destination = %q", got)
	}
	e.send(respHeaders(200, "", false, "content-type", "application/json"))
	e.recv()
	e.send(respBody(jsonAnswer, true))
	e.streamedBody(true)
	e.close()
}

// TestShutdownDrainDelay: when ctx ends, health turns NOT_SERVING at once, and the picker goes on
// taking new streams, on the connections it has and on new ones, for DrainDelay (where
// readiness has been asked), so that a gateway that follows it has taken the picker out before
// its streams are refused, as `kvroute serve` keeps its API listener open for
// server.drain_delay. Before, the listener closed and new streams were refused (gRPC
// Unavailable, which the gateway answers 500) at the signal.
func TestShutdownDrainDelay(t *testing.T) {
	f := newFixture(t, []string{ep1})
	const delay = 2 * time.Second
	p := startPicker(t, f, &Server{DrainDelay: delay}, 10*time.Second)
	waitStatus(t, p.health, Readiness, healthpb.HealthCheckResponse_SERVING) // a readiness probe
	f.whole(t)                                                               // the gateway's connection is open
	start := time.Now()
	p.cancel()
	waitStatus(t, p.health, Readiness, healthpb.HealthCheckResponse_NOT_SERVING)
	waitStatus(t, p.health, ServiceName, healthpb.HealthCheckResponse_NOT_SERVING)
	f.whole(t) // on the connection it had
	f.client = extprocv3.NewExternalProcessorClient(dial(t, p.addr))
	f.whole(t) // on a new connection
	if err := p.stopped(t, delay+10*time.Second); err != nil {
		t.Errorf("Serve = %v, want nil", err)
	}
	if d := time.Since(start); d < delay {
		t.Errorf("Serve returned %v after ctx ended, before the drain delay (%v)", d, delay)
	}
	if n := p.logs.Count("new streams are still taken for server.drain_delay"); n != 1 {
		t.Errorf("%d drain delay lines in the log, want 1:\n%s", n, p.logs)
	}
	v := metricstest.Values(t, f.reg, "kvroute_requests_total")
	if got := v["kvroute_requests_total{endpoint="+ep1+",model=m,status=200}"]; got != 3 {
		t.Errorf("requests_total 200 = %v, want 3", got)
	}
}

// TestShutdownDrainDelaySkipped: the drain delay is waited only where something follows
// readiness (this server's health asked for readiness, for the ext_proc service or for the
// server as a whole, or ReadinessAsked says the router's /readyz was), as `kvroute serve`
// waits only where /readyz was asked: nobody else would see the change.
func TestShutdownDrainDelaySkipped(t *testing.T) {
	const none = "-"
	for _, tc := range []struct {
		name  string
		ask   string // the health service a probe asks (none: no probe)
		asked func() bool
		wait  bool
	}{
		{name: "nothing asked", ask: none},
		{name: "liveness only", ask: Liveness},
		{name: "readiness", ask: Readiness, wait: true},
		{name: "the ext_proc service", ask: ServiceName, wait: true},
		{name: "the server as a whole", ask: "", wait: true},
		{name: "the router's readiness asked", ask: none, asked: func() bool { return true }, wait: true},
		{name: "the router's readiness not asked", ask: none, asked: func() bool { return false }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, []string{ep1})
			const delay = time.Second
			p := startPicker(t, f, &Server{DrainDelay: delay, ReadinessAsked: tc.asked}, 10*time.Second)
			f.whole(t) // Serve is up
			if tc.ask != none {
				if _, err := p.health.Check(context.Background(), &healthpb.HealthCheckRequest{Service: tc.ask}); err != nil {
					t.Fatalf("health %q: %v", tc.ask, err)
				}
			}
			start := time.Now()
			p.cancel()
			if err := p.stopped(t, 10*time.Second); err != nil {
				t.Errorf("Serve = %v, want nil", err)
			}
			d := time.Since(start)
			if waited := d >= delay; waited != tc.wait {
				t.Errorf("Serve returned %v after ctx ended: waited the %v drain delay = %v, want %v", d, delay, waited, tc.wait)
			}
			if !tc.wait && p.logs.Count("no drain delay, as readiness was never asked") != 1 {
				t.Errorf("the skip is not logged:\n%s", p.logs)
			}
		})
	}
}

// TestShutdownCut: the streams still open when the drain runs out (shutdown_timeout) are cut as
// `kvroute serve` cuts its requests: each gets an immediate response 503 of code shutting_down,
// which the gateway sends the client (a stream whose events pass through kvroute gets the
// shutting_down error event first), and is settled as 503 shutting_down: access line, metrics,
// nothing against the endpoint; a warning says how many. Before, Serve closed their connections:
// the gateway answered each with its own 500 (or reset it), and kvroute settled them as 499, a
// client gone, unlogged as cut.
func TestShutdownCut(t *testing.T) {
	var hold atomic.Bool
	entered := make(chan struct{}, 1)
	logs := &testlog.Buffer{}
	f := newFixture(t, []string{ep1}, withLog(logs), func(h *proxy.Handler) {
		h.Admit = func(ctx context.Context, _ *tenant.Identity, _ []*endpoint.Endpoint) (func(), error) {
			if !hold.Load() {
				return func() {}, nil
			}
			entered <- struct{}{}
			<-ctx.Done() // a queue that does not move
			return nil, context.Cause(ctx)
		}
	})
	const timeout = 300 * time.Millisecond
	p := startPicker(t, f, &Server{}, timeout)

	// The request's body still coming.
	body := f.open(t, fullDuplex, fullDuplex)
	body.send(withRequestID(reqHeaders("/v1/chat/completions", false), "rid-body"))
	body.send(reqBody(plainChat[:10], false))
	// Waiting in the admission queue.
	hold.Store(true)
	queued := f.open(t, fullDuplex, fullDuplex)
	queued.send(withRequestID(reqHeaders("/v1/chat/completions", false), "rid-queued"))
	queued.send(reqBody(plainChat, true))
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the request did not reach admission")
	}
	hold.Store(false)
	// Routed, the engine's head not yet come.
	routed := f.routedID(t, plainChat, "rid-routed")
	// A stream under way, one event passed.
	sse := f.routedID(t, streamChat, "rid-sse")
	sse.head("text/event-stream")
	sse.send(respBody(event1, false))
	if c, _ := sse.chunk(true); c != event1 {
		t.Fatalf("first event = %q", c)
	}
	// A whole answer under way, its head passed.
	whole := f.routedID(t, plainChat, "rid-whole")
	whole.send(respHeaders(200, "", false, "content-type", "application/json"))
	whole.recv()
	if n := f.pool.ByName(ep1).InFlight(); n != 3 {
		t.Fatalf("in flight at the endpoint = %d, want 3", n)
	}

	p.cancel()
	ev, eos := sse.chunk(true)
	if !strings.HasPrefix(ev, "event: error\n") || !strings.Contains(ev, `"code":"shutting_down"`) || eos {
		t.Errorf("the stream's last chunk = %q (end_of_stream %v), want the shutting_down error event", ev, eos)
	}
	for _, e := range []*envoy{body, queued, routed, sse, whole} {
		st, oe, _ := e.immediate()
		if st != http.StatusServiceUnavailable || oe.Code == nil || *oe.Code != "shutting_down" || oe.Type != "service_unavailable_error" {
			t.Errorf("cut stream answered %d %+v, want 503 shutting_down", st, oe)
		}
		e.close() // as Envoy ends the stream once answered
	}
	if err := p.stopped(t, 10*time.Second); err != nil {
		t.Errorf("Serve = %v, want nil", err)
	}

	var got []string
	for _, l := range logs.JSONLines(t) {
		if l["msg"] == "request" {
			got = append(got, l["request_id"].(string)+" "+jsonString(l["status"])+" "+jsonString(l["error_type"])+" "+jsonString(l["error_code"]))
		}
	}
	want := []string{}
	for _, id := range []string{"rid-body", "rid-queued", "rid-routed", "rid-sse", "rid-whole"} {
		want = append(want, id+" 503 service_unavailable_error shutting_down")
	}
	slices.Sort(got)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("access lines (-want +got):\n%s", diff)
	}
	v := metricstest.Values(t, f.reg, "kvroute_requests_total")
	for k, want := range map[string]float64{
		"kvroute_requests_total{endpoint=none,model=unknown,status=503}":  1, // its body not read whole
		"kvroute_requests_total{endpoint=none,model=m,status=503}":        1, // queued
		"kvroute_requests_total{endpoint=" + ep1 + ",model=m,status=503}": 3,
	} {
		if v[k] != want {
			t.Errorf("%s = %v, want %v", k, v[k], want)
		}
	}
	if fs := f.health.failures(); len(fs) != 0 {
		t.Errorf("failures counted against the endpoint: %v", fs)
	}
	if n := f.pool.ByName(ep1).InFlight(); n != 0 {
		t.Errorf("in flight at the endpoint after the cut = %d", n)
	}
	var warned []map[string]any
	for _, l := range p.logs.JSONLines(t) {
		if strings.HasPrefix(l["msg"].(string), "ext_proc drain timed out: requests still in flight were cut") {
			warned = append(warned, l)
		}
	}
	if len(warned) != 1 || warned[0]["cut"] != float64(5) || warned[0]["shutdown_timeout"] != timeout.String() {
		t.Errorf("drain warnings = %v, want one with cut 5", warned)
	}
}

func jsonString(v any) string {
	b, _ := json.Marshal(v)
	return strings.Trim(string(b), `"`)
}

// withRequestID gives a request headers message the x-request-id id.
func withRequestID(req *extprocv3.ProcessingRequest, id string) *extprocv3.ProcessingRequest {
	for _, h := range req.GetRequestHeaders().GetHeaders().GetHeaders() {
		if h.GetKey() == "x-request-id" {
			h.RawValue = []byte(id)
		}
	}
	return req
}

// routedID is routed for a request whose x-request-id is id.
func (f *fixture) routedID(t *testing.T, body, id string) *envoy {
	t.Helper()
	e := f.open(t, fullDuplex, fullDuplex)
	e.send(withRequestID(reqHeaders("/v1/chat/completions", false), id))
	e.send(reqBody(body, true))
	if r := e.recv(); r.GetRequestHeaders() == nil {
		t.Fatalf("want the answer to the request headers, got %v", r)
	}
	e.streamedBody(false)
	return e
}
