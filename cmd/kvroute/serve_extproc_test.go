package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvroute/kvroute/internal/extproc"
)

// The line is a JSON record's message here (stdout is no terminal): an address ends at a quote.
var extLine = regexp.MustCompile(`ext_proc grpc://([^\s"]+) health grpc://([^\s"]+)`)

// TestServeExtProc: with --extproc-listen, serve is also an Envoy endpoint picker over the same
// endpoints, with gRPC health on its own address; both stop with the router.
func TestServeExtProc(t *testing.T) {
	engine := fakeVLLM(t)
	_, _, out, stderr, stop := startServeOut(t, "--endpoint", engine.URL, "--model", "m",
		"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
		"--extproc-listen", "127.0.0.1:0", "--extproc-health-listen", "127.0.0.1:0")
	m := extLine.FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("no ext_proc line in %q", out)
	}
	dial := func(addr string) *grpc.ClientConn {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return conn
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	hc := healthpb.NewHealthClient(dial(m[2]))
	for {
		r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: extproc.Readiness})
		if err != nil {
			t.Fatalf("readiness: %v", err)
		}
		if r.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("never ready")
		case <-time.After(20 * time.Millisecond):
		}
	}

	st, err := extprocv3.NewExternalProcessorClient(dial(m[1])).Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	hdrs := &corev3.HeaderMap{}
	for _, kv := range [][2]string{{":method", "POST"}, {":path", "/v1/chat/completions"}, {"content-type", "application/json"}} {
		hdrs.Headers = append(hdrs.Headers, &corev3.HeaderValue{Key: kv[0], RawValue: []byte(kv[1])})
	}
	for _, req := range []*extprocv3.ProcessingRequest{
		{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: hdrs}},
			ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_BUFFERED, ResponseBodyMode: filterv3.ProcessingMode_BUFFERED}},
		{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{
			Body: []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`), EndOfStream: true}}},
	} {
		if err := st.Send(req); err != nil {
			t.Fatal(err)
		}
		r, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if b := r.GetRequestBody(); b != nil {
			want := strings.TrimPrefix(engine.URL, "http://")
			if got := r.GetDynamicMetadata().GetFields()[extproc.LBNamespace].GetStructValue().GetFields()[extproc.DestinationKey].GetStringValue(); got != want {
				t.Errorf("destination = %q, want %q", got, want)
			}
		}
	}
	_ = st.CloseSend()
	if rc := stop(); rc != 0 {
		t.Errorf("serve exited with %d: %s", rc, stderr)
	}
}

// TestServeExtProcDrainKeepsEndpointsFollowed: when the ext_proc picker's drain outlasts the
// API's (its gRPC readiness was asked, /readyz never: the API skips server.drain_delay, the
// picker waits it out), the endpoints are still health-checked while the picker drains, and
// discovery, health checks and the rest stop only after it; "stopped" is the last line. Before,
// the router stopped them at the end of its own drain, and the picker went on placing requests
// on what it last knew of the engines.
func TestServeExtProcDrainKeepsEndpointsFollowed(t *testing.T) {
	var checks, stopAt atomic.Int64 // health checks; how many there were when serve was stopped
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			checks.Add(1)
		}
		_, _ = io.Copy(io.Discard, r.Body)
	}))
	defer engine.Close()
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "kvroute.yaml")
	cfg := fmt.Sprintf("listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\nauth: {mode: none}\nscrape: {disabled: true}\n"+
		"health: {interval: 100ms, timeout: 50ms}\nserver: {drain_delay: 1s}\n"+
		"extproc: {listen: '127.0.0.1:0', health_listen: '127.0.0.1:0'}\n"+
		"endpoints: [{url: %q, models: [m], engine: vllm}]\n", engine.URL)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	_, _, out, stderr, stop := startServeOut(t, "--config", cfgPath)
	m := extLine.FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("no ext_proc line in %q", out)
	}
	conn, err := grpc.NewClient(m[2], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: extproc.Readiness}); err != nil {
		t.Fatalf("readiness: %v", err)
	}
	if !waitFor(10*time.Second, func() bool { return checks.Load() > 0 }) {
		t.Fatal("no health check reached the engine")
	}
	stopAt.Store(checks.Load())
	if rc := stop(); rc != 0 {
		t.Fatalf("serve exited with %d: %s", rc, stderr)
	}
	// The picker's drain delay is 1 s, the health checks' interval 100 ms.
	if during := checks.Load() - stopAt.Load(); during < 3 {
		t.Errorf("%d health checks during the picker's 1 s drain, want several", during)
	}
	var msgs []string
	for _, l := range strings.Split(strings.TrimSpace(stderr.String()), "\n") {
		var rec struct{ Msg string }
		if err := json.Unmarshal([]byte(l), &rec); err != nil {
			t.Fatalf("not JSON: %q", l)
		}
		msgs = append(msgs, rec.Msg)
	}
	picker := slices.Index(msgs, "ext_proc shutting down: draining streams in flight")
	stopping := slices.Index(msgs, "shutting down: stopping discovery, health checks, scrapes and peers")
	if picker < 0 || stopping < picker || msgs[len(msgs)-1] != "stopped" {
		t.Errorf("shutdown lines %q: want the picker's drain before the endpoints stop following, and \"stopped\" last", msgs)
	}
}
