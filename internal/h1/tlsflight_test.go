package h1

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/testcert"
)

// coalescingConn passes its first write (the ClientHello) on, then holds what is written until
// flush: the client's Finished and the start of its request's head leave in one segment, as a
// TLS 1.3 client's often do when it writes its request right after its handshake.
type coalescingConn struct {
	net.Conn
	mu      sync.Mutex
	writes  int
	held    bytes.Buffer
	flushed bool
}

func (c *coalescingConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.writes++
	if c.writes == 1 || c.flushed {
		return c.Conn.Write(p)
	}
	return c.held.Write(p)
}

func (c *coalescingConn) flush() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.flushed = true
	_, err := c.Conn.Write(c.held.Bytes())
	return err
}

// TestTLSHeadWithFinishedKept: NetHTTP over TLS on AbortStalled (as the router serves its API),
// MaxConns 1. A client's head begins with its handshake's last flight (in one segment, or
// written right after the handshake) and ends 1.5 s later; a newcomer comes at 1 s, past
// freshGrace. The head begun is a request on its way: its connection stays and the request is
// served, the newcomer refused. Counting what crypto/tls had read when the handshake returned
// (it reads ahead) took the head's start for the handshake's: the connection was closed for
// the newcomer and the request lost (5 of 5 in one segment, 3 of 5 right after, TLS 1.3).
func TestTLSHeadWithFinishedKept(t *testing.T) {
	if !receivedCounts(t) {
		t.Skip("the kernel does not count a socket's bytes received (TCP_INFO): Linux only")
	}
	const header = 4 * time.Second
	certFile, keyFile := testcert.NewCA(t, "tlsflight").Issue("server")
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		coalesce bool
		max      uint16
	}{
		{"one segment", true, 0},
		{"right after, TLS 1.3", false, 0},
		{"right after, TLS 1.2", false, tls.VersionTLS12},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			ln = tls.NewListener(AbortStalled(ln), &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"http/1.1"}})
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				_, _ = io.WriteString(w, "ok")
			})
			n := &NetHTTP{Server: &http.Server{ReadHeaderTimeout: header, IdleTimeout: 30 * time.Second}, MaxConns: 1, ErrorBody: jsonError}
			addr := serveNetHTTPOn(t, n, h, ln)

			nc, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			dialled := time.Now()
			_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
			cc := &coalescingConn{Conn: nc}
			var raw net.Conn = nc
			if tc.coalesce {
				raw = cc
			}
			client := tls.Client(raw, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"http/1.1"}, MaxVersion: tc.max})
			if err := client.Handshake(); err != nil {
				t.Fatal(err)
			}
			if _, err := io.WriteString(client, headStart); err != nil {
				t.Fatal(err)
			}
			if tc.coalesce {
				if err := cc.flush(); err != nil {
					t.Fatal(err)
				}
			}
			time.Sleep(time.Second - time.Since(dialled))
			nn, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			_ = nn.SetDeadline(time.Now().Add(10 * time.Second))
			ntc := tls.Client(nn, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"http/1.1"}})
			if _, err := io.WriteString(ntc, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err == nil {
				if resp, err := http.ReadResponse(bufio.NewReader(ntc), nil); err == nil {
					if resp.StatusCode == http.StatusOK {
						t.Errorf("the newcomer was served: the connection with a head on its way was closed for it")
					}
					resp.Body.Close()
				}
			}
			nn.Close()
			time.Sleep(1500*time.Millisecond - time.Since(dialled))
			status := 0
			if _, err := io.WriteString(client, headRest); err == nil {
				if resp, err := http.ReadResponse(bufio.NewReader(client), nil); err == nil {
					status = resp.StatusCode
					resp.Body.Close()
				}
			}
			if status != http.StatusOK {
				t.Errorf("the request whose head began with the handshake: status %d (0: lost), want 200; %d evicted", status, n.Stats().ConnsEvicted)
			}
		})
	}
}

// receivedCounts reports whether the kernel counts a loopback socket's bytes received.
func receivedCounts(t *testing.T) bool {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, ok := received(c)
	return ok
}

// TestTLSFlight: the record scanner finds the handshake's end whatever the reads' sizes.
func TestTLSFlight(t *testing.T) {
	rec := func(typ byte, n int) []byte {
		return append([]byte{typ, 3, 3, byte(n >> 8), byte(n)}, make([]byte, n)...)
	}
	var stream []byte
	stream = append(stream, rec(recordHandshake, 300)...)      // ClientHello: 305
	stream = append(stream, rec(recordChangeCipherSpec, 1)...) // 311
	stream = append(stream, rec(recordApplicationData, 53)...) // Finished (TLS 1.3): 369
	stream = append(stream, rec(recordApplicationData, 90)...) // the request
	for _, step := range []int{1, 2, 5, 7, 64, len(stream)} {
		var f tlsFlight
		for p := stream; len(p) > 0; {
			k := min(step, len(p))
			f.feed(p[:k])
			p = p[k:]
		}
		if hs, app := f.hsEnd.Load(), f.firstApp.Load(); hs != 311 || app != 369 {
			t.Errorf("reads of %d: handshake records end at %d, first application record at %d; want 311 and 369", step, hs, app)
		}
		if f.off != int64(len(stream)) {
			t.Errorf("reads of %d: %d bytes counted, want %d", step, f.off, len(stream))
		}
	}
}
