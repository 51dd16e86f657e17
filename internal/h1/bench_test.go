package h1

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/testcert"
)

// BenchmarkServerPost4K is one kept-alive POST of a 4 KB body, read whole by the handler and
// answered "ok", on each server: with no bound on its clients (none), with the body timeouts
// kvroute had before the caps (timeouts: body_read_timeout, body_min_rate,
// write_stall_timeout), and with those and the caps kvroute serve sets now (caps:
// body_stall_timeout, max_pending_body_bytes, max_connections, the 401 close). The difference
// between timeouts and caps is what the caps cost a request.
func BenchmarkServerPost4K(b *testing.B) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = io.WriteString(w, "ok")
	})
	body := strings.Repeat("x", 4096)
	req := "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
		strconv.Itoa(len(body)) + "\r\n\r\n" + body
	type settings struct {
		bodyTimeout, bodyStall, writeStall time.Duration
		rate, pending                      int64
		maxConns                           int
		close401                           bool
	}
	timeouts := settings{bodyTimeout: 30 * time.Second, rate: 64 << 10, writeStall: time.Minute}
	caps := timeouts
	caps.bodyStall, caps.pending, caps.maxConns, caps.close401 = 10*time.Second, 256<<20, 16384, true
	certFile, keyFile := testcert.NewCA(b, "bench").Issue("server")
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		b.Fatal(err)
	}
	for _, kind := range []string{"h1", "net/http"} {
		for _, set := range []struct {
			name string
			s    settings
			tls  bool
		}{{"none", settings{}, false}, {"timeouts", timeouts, false}, {"caps", caps, false}, {"caps/tls", caps, true}} {
			b.Run("server="+strings.ReplaceAll(kind, "/", "")+"/limits="+set.name, func(b *testing.B) {
				ln, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					b.Fatal(err)
				}
				if set.tls {
					ln = tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"http/1.1"}})
				}
				s := set.s
				var srv interface {
					Serve(net.Listener) error
					Close() error
				}
				if kind == "h1" {
					srv = &Server{Handler: h, BodyReadTimeout: s.bodyTimeout, BodyMinRate: s.rate, BodyStallTimeout: s.bodyStall,
						WriteStallTimeout: s.writeStall, MaxPendingBodyBytes: s.pending, MaxConns: s.maxConns, CloseUnauthorized: s.close401}
				} else {
					srv = &NetHTTP{Server: &http.Server{Handler: h}, BodyReadTimeout: s.bodyTimeout, BodyMinRate: s.rate,
						BodyStallTimeout: s.bodyStall, WriteStallTimeout: s.writeStall, MaxPendingBodyBytes: s.pending,
						MaxConns: s.maxConns, CloseUnauthorized: s.close401}
				}
				done := make(chan struct{})
				go func() { defer close(done); _ = srv.Serve(ln) }()
				defer func() { _ = srv.Close(); <-done }()
				c, err := net.Dial("tcp", ln.Addr().String())
				if err != nil {
					b.Fatal(err)
				}
				defer c.Close()
				if set.tls {
					c = tls.Client(c, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"http/1.1"}})
				}
				br := bufio.NewReader(c)
				b.ReportAllocs()
				b.SetBytes(int64(len(body)))
				for b.Loop() {
					if _, err := io.WriteString(c, req); err != nil {
						b.Fatal(err)
					}
					if err := readOK(br); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkServerTLSConn is a new TLS connection (an ECDSA P-256 certificate, TLS 1.3), one GET
// on it answered "ok", and its close, on each server with the caps kvroute serve sets
// (max_connections): a connection's cost, its handshake first.
func BenchmarkServerTLSConn(b *testing.B) {
	certFile, keyFile := testcert.NewCA(b, "bench").Issue("server")
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		b.Fatal(err)
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") })
	for _, kind := range []string{"h1", "net/http"} {
		b.Run("server="+strings.ReplaceAll(kind, "/", ""), func(b *testing.B) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			ln = tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"http/1.1"}})
			var srv interface {
				Serve(net.Listener) error
				Close() error
			}
			if kind == "h1" {
				srv = &Server{Handler: h, MaxConns: 16384, CloseUnauthorized: true}
			} else {
				srv = &NetHTTP{Server: &http.Server{Handler: h}, MaxConns: 16384, CloseUnauthorized: true}
			}
			done := make(chan struct{})
			go func() { defer close(done); _ = srv.Serve(ln) }()
			defer func() { _ = srv.Close(); <-done }()
			cfg := &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"http/1.1"}}
			const get = "GET / HTTP/1.1\r\nHost: x\r\n\r\n"
			b.ReportAllocs()
			for b.Loop() {
				nc, err := net.Dial("tcp", ln.Addr().String())
				if err != nil {
					b.Fatal(err)
				}
				c := tls.Client(nc, cfg)
				if _, err := io.WriteString(c, get); err != nil {
					b.Fatal(err)
				}
				if err := readOK(bufio.NewReader(c)); err != nil {
					b.Fatal(err)
				}
				_ = c.Close()
			}
		})
	}
}

// readOK reads one response whose body is "ok" (Content-Length: 2), without allocating.
func readOK(br *bufio.Reader) error {
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			return err
		}
		if len(line) <= 2 {
			break
		}
	}
	body, err := br.Peek(2)
	if err != nil {
		return err
	}
	if !bytes.Equal(body, []byte("ok")) {
		return io.ErrUnexpectedEOF
	}
	_, err = br.Discard(2)
	return err
}
