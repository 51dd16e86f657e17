package extproc

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/metrics"
	"github.com/kvroute/kvroute/internal/policy"
	"github.com/kvroute/kvroute/internal/proxy"
	"github.com/kvroute/kvroute/internal/route"
	"github.com/kvroute/kvroute/internal/tenant"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// orderPicker ranks candidates in the order of names and records what the lifecycle tells it.
type orderPicker struct {
	order  []string
	mu     sync.Mutex
	log    []string
	done   []policy.Result
	failed []string // the endpoints of the attempts told failed (policy.Result.Failed), in order
}

func (p *orderPicker) Pick(_ *policy.Request, c []*endpoint.Endpoint) ([]*endpoint.Endpoint, error) {
	var out []*endpoint.Endpoint
	for _, n := range p.order {
		for _, e := range c {
			if e.Name == n {
				out = append(out, e)
			}
		}
	}
	if len(out) == 0 {
		return nil, policy.ErrNoCandidate
	}
	return out, nil
}

func (p *orderPicker) record(s string) { p.mu.Lock(); p.log = append(p.log, s); p.mu.Unlock() }

func (p *orderPicker) Routed(_ *policy.Request, ep *endpoint.Endpoint) { p.record("routed " + ep.Name) }

func (p *orderPicker) FirstToken(_ *policy.Request, ep *endpoint.Endpoint, _ time.Duration) {
	p.record("first " + ep.Name)
}

func (p *orderPicker) Done(_ *policy.Request, ep *endpoint.Endpoint, res policy.Result) {
	p.mu.Lock()
	p.done = append(p.done, res)
	if res.Failed {
		p.failed = append(p.failed, ep.Name)
	}
	p.mu.Unlock()
	// The policy hears cached tokens in the router's units (scaled by what the engine counts):
	// whether it heard any is what the protocol decides.
	p.record(fmt.Sprintf("done %s ok=%v cached=%v", ep.Name, res.OK, res.CachedTokens > 0))
}

func (p *orderPicker) Removed(*endpoint.Endpoint) {}

func (p *orderPicker) events() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.log...)
}

// failures are the endpoints of the attempts the policy was told failed (policy.Result.Failed):
// the failures health checking does not judge.
func (p *orderPicker) failures() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.failed...)
}

// recHealth is passive health checking that never ejects and records the failures and the
// refusals (route.RefusalHealth) it hears.
type recHealth struct {
	mu      sync.Mutex
	failed  []string
	refused []string
}

func (h *recHealth) Refused(ep *endpoint.Endpoint) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.refused = append(h.refused, ep.Name)
	return false
}

func (h *recHealth) refusals() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.refused...)
}

func (h *recHealth) Failed(ep *endpoint.Endpoint, f route.Failure) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.failed = append(h.failed, ep.Name+" "+f.String())
	return false
}
func (h *recHealth) Succeeded(*endpoint.Endpoint)                         {}
func (h *recHealth) Ejected(*endpoint.Endpoint, time.Time) bool           { return false }
func (h *recHealth) Backoff(*endpoint.Endpoint, time.Time, time.Duration) {}
func (h *recHealth) BackedOff(*endpoint.Endpoint, time.Time) bool         { return false }
func (h *recHealth) Forget(*endpoint.Endpoint)                            {}
func (h *recHealth) failures() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.failed...)
}

// Three endpoints whose hosts are IP addresses (what Envoy can be told) and one whose host is a
// name (which it cannot).
const (
	ep1    = "http://10.0.0.1:8000"
	ep2    = "http://10.0.0.2:8000"
	ep3    = "http://10.0.0.3:8000"
	epName = "http://engine.local:8000"
)

// fixture is a picker served over loopback gRPC with a client playing Envoy.
type fixture struct {
	pool   *endpoint.Pool
	pk     *orderPicker
	health *recHealth
	h      *proxy.Handler
	reg    *prometheus.Registry
	srv    *Server
	client extprocv3.ExternalProcessorClient
	ended  chan error // what each stream's Process returned, in order
}

type fixtureOption func(*proxy.Handler)

func withGate(g *tenant.Gate) fixtureOption { return func(h *proxy.Handler) { h.Gate = g } }

// newFixture serves a picker over the endpoints (ranked in order), each serving model "m".
func newFixture(t testing.TB, names []string, opts ...fixtureOption) *fixture {
	t.Helper()
	pool := endpoint.NewPool()
	specs := make([]endpoint.Spec, len(names))
	for i, n := range names {
		specs[i] = endpoint.Spec{Name: n, Models: []string{"m"}, Engine: "vllm", CacheSalt: true}
	}
	if _, err := pool.Update(specs); err != nil {
		t.Fatal(err)
	}
	pk := &orderPicker{order: names}
	hc := &recHealth{}
	lc, err := route.New(route.Config{Picker: pk, Attempts: 3, Health: hc})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	h := &proxy.Handler{Pool: pool, Lifecycle: lc, Metrics: metrics.New(reg), Logger: slog.New(slog.DiscardHandler), MaxBodyBytes: 64 << 10}
	for _, o := range opts {
		o(h)
	}
	f := &fixture{pool: pool, pk: pk, health: hc, h: h, reg: reg, ended: make(chan error, 64)}
	f.srv = &Server{Handler: func() *proxy.Handler { return h }, Logger: slog.New(slog.DiscardHandler), ChunkBytes: 1024}
	f.client = serve(t, f.srv, f.ended)
	return f
}

// tracked reports what each stream's Process returned, so that a test knows the picker is done
// with it.
type tracked struct {
	s     *Server
	ended chan error
}

func (t tracked) Process(srv extprocv3.ExternalProcessor_ProcessServer) error {
	err := t.s.Process(srv)
	t.ended <- err
	return err
}

// loopback listens on a free loopback port.
func loopback(t testing.TB) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// serve serves s on a loopback port and returns a client connected to it; both stop with t.
func serve(t testing.TB, s *Server, ended chan error) extprocv3.ExternalProcessorClient {
	t.Helper()
	ln := loopback(t)
	g := grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(g, tracked{s: s, ended: ended})
	served := make(chan struct{})
	go func() { defer close(served); _ = g.Serve(ln) }()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		g.Stop()
		<-served
	})
	return extprocv3.NewExternalProcessorClient(conn)
}

// streamEnded waits for the picker to be done with one more stream and returns what its
// Process returned.
func (f *fixture) streamEnded(t testing.TB) error {
	t.Helper()
	select {
	case err := <-f.ended:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("the picker did not end the stream")
		return nil
	}
}

// envoy plays Envoy's ext_proc filter on one stream.
type envoy struct {
	t      testing.TB
	c      grpc.BidiStreamingClient[extprocv3.ProcessingRequest, extprocv3.ProcessingResponse]
	cancel context.CancelFunc
	cfg    *extprocv3.ProtocolConfiguration
}

// open starts a stream whose first message will carry the filter's body modes (as Envoy's
// protocol_config does).
func (f *fixture) open(t testing.TB, reqMode, respMode filterv3.ProcessingMode_BodySendMode) *envoy {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	c, err := f.client.Process(ctx)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(cancel)
	return &envoy{t: t, c: c, cancel: cancel, cfg: &extprocv3.ProtocolConfiguration{RequestBodyMode: reqMode, ResponseBodyMode: respMode}}
}

func (e *envoy) send(req *extprocv3.ProcessingRequest) {
	e.t.Helper()
	if e.cfg != nil {
		req.ProtocolConfig, e.cfg = e.cfg, nil
	}
	if err := e.c.Send(req); err != nil {
		e.t.Fatalf("send: %v", err)
	}
}

func (e *envoy) recv() *extprocv3.ProcessingResponse {
	e.t.Helper()
	resp, err := e.c.Recv()
	if err != nil {
		e.t.Fatalf("recv: %v", err)
	}
	return resp
}

// close half-closes the stream as Envoy does when the request is over.
func (e *envoy) close() {
	e.t.Helper()
	if err := e.c.CloseSend(); err != nil {
		e.t.Fatal(err)
	}
}

func headerMap(kv ...string) *corev3.HeaderMap {
	m := &corev3.HeaderMap{}
	for i := 0; i+1 < len(kv); i += 2 {
		m.Headers = append(m.Headers, &corev3.HeaderValue{Key: kv[i], RawValue: []byte(kv[i+1])})
	}
	return m
}

// reqHeaders is the request headers message for a POST to path (extra headers in kv).
func reqHeaders(path string, eos bool, kv ...string) *extprocv3.ProcessingRequest {
	kv = append([]string{":method", "POST", ":path", path, ":authority", "gw.example", ":scheme", "http",
		"content-type", "application/json", "x-request-id", "rid-1"}, kv...)
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
		RequestHeaders: &extprocv3.HttpHeaders{Headers: headerMap(kv...), EndOfStream: eos}}}
}

func reqBody(b string, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: []byte(b), EndOfStream: eos}}}
}

// respHeaders is the response headers message, with the endpoint Envoy says served it.
func respHeaders(status int, served string, eos bool, kv ...string) *extprocv3.ProcessingRequest {
	kv = append([]string{":status", strconv.Itoa(status)}, kv...)
	req := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{
		ResponseHeaders: &extprocv3.HttpHeaders{Headers: headerMap(kv...), EndOfStream: eos}}}
	if served != "" {
		req.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
			LBNamespace: {Fields: map[string]*structpb.Value{ServedKey: structpb.NewStringValue(served)}},
		}}
	}
	return req
}

func respBody(b string, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
		ResponseBody: &extprocv3.HttpBody{Body: []byte(b), EndOfStream: eos}}}
}

// withSubset adds a subset hint to a request message.
func withSubset(req *extprocv3.ProcessingRequest, addrs ...string) *extprocv3.ProcessingRequest {
	vals := make([]any, len(addrs))
	for i, a := range addrs {
		vals[i] = a
	}
	lv, err := structpb.NewList(vals)
	if err != nil {
		panic(err)
	}
	req.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
		SubsetNamespace: {Fields: map[string]*structpb.Value{SubsetKey: structpb.NewListValue(lv)}},
	}}
	return req
}

// mutation is what a header mutation sets and removes, as "key: value" and "-key".
func mutation(m *extprocv3.HeaderMutation) []string {
	var out []string
	for _, h := range m.GetSetHeaders() {
		out = append(out, h.GetHeader().GetKey()+": "+string(h.GetHeader().GetRawValue()))
	}
	for _, k := range m.GetRemoveHeaders() {
		out = append(out, "-"+k)
	}
	return out
}

// destination is the endpoint list of a response's dynamic metadata.
func destination(resp *extprocv3.ProcessingResponse) string {
	return resp.GetDynamicMetadata().GetFields()[LBNamespace].GetStructValue().GetFields()[DestinationKey].GetStringValue()
}

// routed plays Envoy in FULL_DUPLEX_STREAMED mode up to the pick: the headers (extra ones in
// kv) and the whole body sent, the answer to the headers (returned) and the body back.
func (f *fixture) routed(t testing.TB, body string, kv ...string) (*envoy, *extprocv3.ProcessingResponse) {
	t.Helper()
	return f.routedTo(t, "/v1/chat/completions", body, kv...)
}

// routedTo is routed for a request to path.
func (f *fixture) routedTo(t testing.TB, path, body string, kv ...string) (*envoy, *extprocv3.ProcessingResponse) {
	t.Helper()
	e := f.open(t, fullDuplex, fullDuplex)
	e.send(reqHeaders(path, false, kv...))
	e.send(reqBody(body, true))
	r := e.recv()
	if r.GetRequestHeaders() == nil {
		t.Fatalf("want the answer to the request headers, got %v", r)
	}
	e.streamedBody(false)
	return e, r
}

// head sends the response headers (status 200 of content type ct) and receives their answer.
func (e *envoy) head(ct string) *extprocv3.ProcessingResponse {
	e.t.Helper()
	e.send(respHeaders(200, "", false, "content-type", ct))
	return e.recv()
}

// chunk receives one streamed body chunk (request or response) and whether it ends the body.
func (e *envoy) chunk(response bool) (string, bool) {
	e.t.Helper()
	resp := e.recv()
	br := resp.GetRequestBody()
	if response {
		br = resp.GetResponseBody()
	}
	sr := br.GetResponse().GetBodyMutation().GetStreamedResponse()
	if sr == nil {
		e.t.Fatalf("want a streamed body chunk, got %v", resp)
	}
	return string(sr.GetBody()), sr.GetEndOfStream()
}

// streamedBody receives body chunks (request or response) until one ends the stream, and
// returns them joined, with how many there were.
func (e *envoy) streamedBody(response bool) (string, int) {
	e.t.Helper()
	var b string
	for n := 1; ; n++ {
		c, eos := e.chunk(response)
		b += c
		if eos {
			return b, n
		}
	}
}
