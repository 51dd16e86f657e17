package app

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/extproc"
)

// extProcRouter builds a router over one endpoint with the extra config.
func extProcRouter(t *testing.T, extra string) *Router {
	t.Helper()
	r, err := NewRouter(routerConfig(t, extra, "http://10.1.2.3:8000"), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return r
}

// loopback listens on a free loopback port.
func loopback(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// TestRouterServesExtProc: the router's endpoint picker over TLS (a certificate of its own, or
// files), gRPC health in plain text beside it, a pick among the router's endpoints, and a clean
// stop.
func TestRouterServesExtProc(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	roots := x509.NewCertPool()
	roots.AddCert(writeCert(t, certFile, keyFile, "kvroute-picker"))
	for _, tc := range []struct {
		name, tls string
		client    *tls.Config
	}{
		{"self-signed", "{self_signed: true}", &tls.Config{InsecureSkipVerify: true}},
		{"files", "{cert_file: " + certFile + ", key_file: " + keyFile + "}", &tls.Config{RootCAs: roots}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := routerConfig(t, "extproc: {listen: 127.0.0.1:0, health_listen: 127.0.0.1:0, tls: "+tc.tls+"}\n", "http://10.1.2.3:8000")
			var none config.Duration // no drain delay: the test asks readiness, then stops
			cfg.Server.DrainDelay = &none
			r, err := NewRouter(cfg, slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			ln, hln := loopback(t), loopback(t)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			served := make(chan error, 1)
			go func() { served <- r.ServeExtProc(ctx, ln, hln) }()

			hconn, err := grpc.NewClient(hln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer hconn.Close()
			waitUntil(t, "readiness", func() bool {
				res, err := healthpb.NewHealthClient(hconn).Check(ctx, &healthpb.HealthCheckRequest{Service: extproc.Readiness})
				return err == nil && res.GetStatus() == healthpb.HealthCheckResponse_SERVING
			})

			conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(tc.client)))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			st, err := extprocv3.NewExternalProcessorClient(conn).Process(ctx)
			if err != nil {
				t.Fatal(err)
			}
			hdrs := &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
				{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte("/v1/chat/completions")},
			}}
			if err := st.Send(&extprocv3.ProcessingRequest{
				ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED},
				Request:        &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: hdrs}},
			}); err != nil {
				t.Fatal(err)
			}
			if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
				RequestBody: &extprocv3.HttpBody{Body: []byte(chatBody), EndOfStream: true}}}); err != nil {
				t.Fatal(err)
			}
			res, err := st.Recv()
			if err != nil {
				t.Fatal(err)
			}
			got := res.GetDynamicMetadata().GetFields()[extproc.LBNamespace].GetStructValue().GetFields()[extproc.DestinationKey].GetStringValue()
			if got != "10.1.2.3:8000" {
				t.Errorf("destination = %q, want the router's endpoint", got)
			}
			_ = st.CloseSend()
			cancel()
			select {
			case err := <-served:
				if err != nil {
					t.Errorf("ServeExtProc = %v", err)
				}
			case <-time.After(15 * time.Second):
				t.Fatal("ServeExtProc did not return")
			}
		})
	}
}

// TestExtProcTLSFilesMissing: a certificate file that does not exist is an error naming the
// section.
func TestExtProcTLSFilesMissing(t *testing.T) {
	r := extProcRouter(t, "extproc: {listen: 127.0.0.1:0, tls: {cert_file: /nonexistent/c.pem, key_file: /nonexistent/k.pem}}\n")
	ln := loopback(t)
	defer ln.Close()
	err := r.ServeExtProc(context.Background(), ln, nil)
	if err == nil || !strings.HasPrefix(err.Error(), "extproc.tls: ") {
		t.Errorf("ServeExtProc = %v, want an extproc.tls error", err)
	}
}

// sendBuffered sends one BUFFERED request of body to a router's endpoint picker built with the
// extra config, and returns the answer to the body.
func sendBuffered(t *testing.T, extra, body string) *extprocv3.ProcessingResponse {
	t.Helper()
	r := extProcRouter(t, extra)
	ln := loopback(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	served := make(chan error, 1)
	go func() { served <- r.ServeExtProc(ctx, ln, nil) }()
	defer func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("ServeExtProc = %v", err)
		}
	}()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	st, err := extprocv3.NewExternalProcessorClient(conn).Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = st.CloseSend() }()
	hdrs := &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
		{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte("/v1/chat/completions")},
	}}
	var res *extprocv3.ProcessingResponse
	for _, m := range []*extprocv3.ProcessingRequest{
		{ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_BUFFERED, ResponseBodyMode: filterv3.ProcessingMode_BUFFERED},
			Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: hdrs}}},
		{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(body), EndOfStream: true}}},
	} {
		if err := st.Send(m); err != nil {
			t.Fatal(err)
		}
		if res, err = st.Recv(); err != nil {
			t.Fatalf("a %d-byte body: %v", len(body), err)
		}
	}
	return res
}

// TestExtProcLargeBufferedBody: in BUFFERED mode a body comes in one message; one larger than
// gRPC's default limit (4 MiB) but within limits.max_body_bytes is picked for, not refused by
// gRPC; one over limits.max_body_bytes gets kvroute's 413, not a gRPC error (which Envoy turns
// into a 500), however low that limit is.
func TestExtProcLargeBufferedBody(t *testing.T) {
	body := func(n int) string {
		return `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("long prompt ", n) + `"}]}`
	}
	if res := sendBuffered(t, "extproc: {listen: 127.0.0.1:0}\n", body(500_000)); res.GetRequestBody() == nil || res.GetDynamicMetadata() == nil {
		t.Errorf("no pick for a 6 MB body: %v", res)
	}
	res := sendBuffered(t, "extproc: {listen: 127.0.0.1:0}\nlimits: {max_body_bytes: 1048576}\n", body(250_000))
	if code := res.GetImmediateResponse().GetStatus().GetCode(); int(code) != http.StatusRequestEntityTooLarge {
		t.Errorf("a 3 MB body over a 1 MiB limit: %v, want an immediate 413", res)
	}
}
