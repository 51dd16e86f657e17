//go:build linux

package h1

import (
	"bufio"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/testcert"
)

// BenchmarkRefusal is the server's side of one refusal at MaxConns (lingerRefusal), on a
// plain connection and on a TLS one, whose answer needs the handshake first: with an ECDSA
// P-256 certificate (as internal/testcert issues) and with an RSA 2048 one (httptest's).
// server-cpu-µs/op is the CPU time of the goroutine that answers, locked to its thread and
// read from getrusage(RUSAGE_THREAD): what a refusal costs the server. ns/op is the whole
// exchange, the client's side (dial, handshake, request, the 503, close) included.
func BenchmarkRefusal(b *testing.B) {
	ts := httptest.NewUnstartedServer(http.NotFoundHandler())
	ts.StartTLS()
	rsa := ts.TLS.Certificates[0]
	ts.Close()
	certFile, keyFile := testcert.NewCA(b, "bench").Issue("server")
	ecdsa, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		b.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		cert *tls.Certificate
	}{{"plain", nil}, {"tls-ecdsa-p256", &ecdsa}, {"tls-rsa-2048", &rsa}} {
		b.Run("conn="+tc.name, func(b *testing.B) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			sl := ln
			if tc.cert != nil {
				sl = tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{*tc.cert}, NextProtos: []string{"http/1.1"}})
			}
			cpu := make(chan time.Duration, 1)
			go func() {
				runtime.LockOSThread()
				defer runtime.UnlockOSThread()
				var total time.Duration
				for {
					nc, err := sl.Accept()
					if err != nil {
						cpu <- total
						return
					}
					t0 := threadCPU()
					lingerRefusal(nc, nil)
					total += threadCPU() - t0
				}
			}()
			n := 0
			for b.Loop() {
				n++
				nc, err := net.Dial("tcp", ln.Addr().String())
				if err != nil {
					b.Fatal(err)
				}
				if tc.cert != nil {
					nc = tls.Client(nc, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"http/1.1"}})
				}
				_ = nc.SetDeadline(time.Now().Add(5 * time.Second))
				if _, err := io.WriteString(nc, "POST /v1 HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"); err != nil {
					b.Fatal(err)
				}
				resp, err := http.ReadResponse(bufio.NewReader(nc), nil)
				if err != nil {
					b.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				nc.Close()
				if resp.StatusCode != http.StatusServiceUnavailable {
					b.Fatalf("status %d, want 503", resp.StatusCode)
				}
			}
			ln.Close()
			b.ReportMetric(float64((<-cpu).Microseconds())/float64(max(n, 1)), "server-cpu-µs/op")
		})
	}
}

// threadCPU is the CPU time the calling thread has used.
func threadCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(1, &ru) // RUSAGE_THREAD
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
