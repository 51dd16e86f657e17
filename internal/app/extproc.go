package app

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"math/big"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/kvroute/kvroute/internal/extproc"
)

// ExtProc returns the Envoy ext_proc endpoint picker of the router: every stream follows the
// API handler in force (the same pool, lifecycle, policy, tenant gate, limits, metrics and
// access log, reloads included), so a request picked through Envoy and one proxied by the
// router are one fleet's traffic to the policy.
func (r *Router) ExtProc() *extproc.Server {
	cfg := r.Config()
	return &extproc.Server{Handler: r.h.Load, Logger: r.logger, MaxEndpoints: cfg.ExtProc.MaxEndpoints,
		DrainDelay: cfg.Server.Drain(), ReadinessAsked: r.readyAsked.Load}
}

// extProcMessage is the least gRPC lets a message be (the default limits.max_body_bytes is 16
// MiB): a body up to it is always read, and judged against the limit in force.
const extProcMessage = 64 << 20

// ServeExtProc serves the endpoint picker (and gRPC health) on ln, over TLS when extproc.tls
// says so, and gRPC health alone on healthLn (nil: none), until ctx ends; then it stops taking
// streams and gives those in flight server.shutdown_timeout to end. Run it beside Serve, which
// runs discovery, health checks and scraping.
func (r *Router) ServeExtProc(ctx context.Context, ln, healthLn net.Listener) error {
	cfg := r.Config()
	// A BUFFERED body comes in one message: gRPC lets one in up to extProcMessage, or
	// limits.max_body_bytes when that is larger (with room for its headers), so that kvroute,
	// not gRPC, answers a body over limits.max_body_bytes with its 413, even after a reload
	// that lowers or raises the limit (up to that size; a raise beyond it needs a restart).
	opts := []grpc.ServerOption{grpc.MaxRecvMsgSize(int(max(min(cfg.Limits.MaxBodyBytes, 1<<30), extProcMessage)) + 1<<20)}
	if t := cfg.ExtProc.TLS; t.Enabled() {
		tc, err := r.extProcTLS(t.SelfSigned, cfg.Path(t.CertFile), cfg.Path(t.KeyFile))
		if err != nil {
			return err
		}
		opts = append(opts, grpc.Creds(credentials.NewTLS(tc)))
	}
	return r.ExtProc().Serve(ctx, ln, healthLn, r.Pool, cfg.Server.ShutdownTimeout.D(), opts...)
}

// extProcTLS is the picker's TLS setup: its certificate files, read again when renewed, or a
// certificate made now.
func (r *Router) extProcTLS(selfSigned bool, certPath, keyPath string) (*tls.Config, error) {
	if selfSigned {
		cert, err := selfSignedCert(time.Now())
		if err != nil {
			return nil, fmt.Errorf("extproc.tls: %w", err)
		}
		return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
	}
	certs, err := (&certFiles{field: "extproc.tls", certPath: certPath, keyPath: keyPath, every: certCheckEvery, log: r.logger}).start()
	if err != nil {
		return nil, err
	}
	return &tls.Config{GetCertificate: certs.get, MinVersion: tls.VersionTLS12}, nil
}

// selfSignedCert makes a certificate for the picker, valid for a year from now: gateways do not
// verify it (they reach the picker by a Service name and trust the cluster's network), so what
// matters is that the stream is encrypted.
func selfSignedCert(now time.Time) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{Organization: []string{"kvroute"}, CommonName: "kvroute endpoint picker"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}
