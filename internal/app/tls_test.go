package app

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/config"
)

// writeCert writes a self-signed certificate for 127.0.0.1 named cn, and its key, as PEM files.
func writeCert(t *testing.T, certPath, keyPath, cn string) *x509.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, IsCA: true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

// TestRouterServesTLS: with server.tls the API listener speaks HTTPS, on both API servers
// (HTTP/2 offered by net/http's), and a plain HTTP request does not get through.
func TestRouterServesTLS(t *testing.T) {
	for _, srv := range []string{config.HTTPServerBuiltin, config.HTTPServerNetHTTP} {
		t.Run(srv, func(t *testing.T) {
			e := newFakeEngine(t)
			dir := t.TempDir()
			cert := writeCert(t, filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem"), "kvroute-test")
			cfg := routerConfig(t, "", e.srv.URL)
			cfg.Server.HTTPServer = srv
			cfg.Server.TLS = config.TLS{CertFile: filepath.Join(dir, "cert.pem"), KeyFile: filepath.Join(dir, "key.pem")}
			r, err := NewRouter(cfg, slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			api, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			served := make(chan error, 1)
			go func() { served <- r.Serve(ctx, api, nil) }()
			defer func() {
				cancel()
				if err := <-served; err != nil {
					t.Errorf("Serve: %v", err)
				}
			}()
			pool := x509.NewCertPool()
			pool.AddCert(cert)
			tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: true}
			defer tr.CloseIdleConnections()
			client := &http.Client{Transport: tr, Timeout: 5 * time.Second}
			resp, err := client.Post("https://"+api.Addr().String()+"/v1/chat/completions", "application/json",
				strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"x"}]}`))
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			wantProto := map[string]int{config.HTTPServerBuiltin: 1, config.HTTPServerNetHTTP: 2}[srv]
			if resp.StatusCode != http.StatusOK || resp.ProtoMajor != wantProto {
				t.Errorf("HTTPS request: %d over HTTP/%d (%s); want 200 over HTTP/%d", resp.StatusCode, resp.ProtoMajor, b, wantProto)
			}
			// A plain HTTP request is not served, and is told why (as net/http's server does).
			plain := &http.Client{Timeout: 5 * time.Second}
			resp, err = plain.Get("http://" + api.Addr().String() + "/v1/models")
			if err != nil {
				t.Fatalf("a plain HTTP request to the TLS listener: %v, want a 400 saying to use HTTPS", err)
			}
			b, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusBadRequest || !strings.Contains(strings.ToLower(string(b)), "https") {
				t.Errorf("a plain HTTP request to the TLS listener: %d %q, want 400 saying to use HTTPS", resp.StatusCode, b)
			}
		})
	}
}

// TestCertFilesReload: a renewed certificate is served from the next handshake after the check
// interval; files that do not load keep the one in force.
func TestCertFilesReload(t *testing.T) {
	dir := t.TempDir()
	cp, kp := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	writeCert(t, cp, kp, "first")
	c, err := newCertFiles(cp, kp, 0, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	name := func() string {
		t.Helper()
		crt, err := c.get(nil)
		if err != nil {
			t.Fatal(err)
		}
		x, err := x509.ParseCertificate(crt.Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		return x.Subject.CommonName
	}
	if n := name(); n != "first" {
		t.Fatalf("served %q, want first", n)
	}
	writeCert(t, cp, kp, "second")
	later := time.Now().Add(2 * time.Second)
	_ = os.Chtimes(cp, later, later)
	if n := name(); n != "second" {
		t.Errorf("after a renewal: served %q, want second", n)
	}
	if err := os.WriteFile(kp, []byte("not a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	_ = os.Chtimes(kp, later.Add(time.Second), later.Add(time.Second))
	if n := name(); n != "second" {
		t.Errorf("after a broken key file: served %q, want second (kept)", n)
	}
	if _, err := newCertFiles(cp, kp, 0, slog.New(slog.DiscardHandler)); err == nil {
		t.Error("newCertFiles accepted a broken key file")
	}
}
