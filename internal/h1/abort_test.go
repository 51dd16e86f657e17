package h1

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/testcert"
)

// TestStalledCloseAbortive: a connection closed because its client stopped reading is closed
// abortively (a reset), its unsent bytes dropped rather than held in the kernel for a client
// that does not read, whichever bound ran out (WriteStallTimeout, WriteTimeout), with either
// server, over plain TCP and TLS (with NetHTTP, a stall in a write rather than a flush only
// through AbortStalled under TLS). (TestWriteStall has WriteStallTimeout on plain TCP, and a
// close after a whole answer, which stays graceful.) The handler hears of the stall soon after
// the bound (counted from the client's last progress: its kernel takes a few bytes more that
// the client will not read), not after the 5 s that crypto/tls's close_notify may wait.
func TestStalledCloseAbortive(t *testing.T) {
	const bound = 300 * time.Millisecond
	certFile, keyFile := testcert.NewCA(t, "abortive").Issue("server")
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	handlerErr := make(chan error, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		chunk, flush := make([]byte, 64<<10), r.URL.Path == "/events"
		if flush {
			chunk = chunk[:1<<10] // a stream's events, each flushed
		}
		for range (256 << 20) / len(chunk) { // far more than the socket buffers hold
			_, err := w.Write(chunk)
			if err == nil && flush {
				err = http.NewResponseController(w).Flush()
			}
			if err != nil {
				handlerErr <- err
				return
			}
		}
		handlerErr <- errors.New("every write succeeded")
	})
	for _, tc := range []struct {
		name  string
		path  string
		tls   bool
		below bool // AbortStalled under TLS
		stall bool // WriteStallTimeout, else WriteTimeout
		serve func(t *testing.T, h http.Handler, ln net.Listener, stall, whole time.Duration) string
	}{
		{name: "h1/write timeout", path: "/big", serve: serveH1},
		{name: "h1/TLS/write stall", path: "/big", tls: true, stall: true, serve: serveH1},
		{name: "net/http/write timeout", path: "/big", serve: serveNet},
		{name: "net/http/write stall/events", path: "/events", stall: true, serve: serveNet},
		// Over TLS, net/http closes the connection in a write that fails before the handler
		// sees the error: only a flush's stall is seen in time (guardWriter.failed).
		{name: "net/http/TLS/write stall/events", path: "/events", tls: true, stall: true, serve: serveNet},
		// Those writes, with AbortStalled's connection under TLS, which sees the stall first.
		{name: "net/http/TLS/AbortStalled/write stall", path: "/big", tls: true, below: true, stall: true, serve: serveNet},
		{name: "net/http/TLS/AbortStalled/write timeout", path: "/big", tls: true, below: true, serve: serveNet},
		{name: "h1/TLS/AbortStalled/write timeout", path: "/big", tls: true, below: true, serve: serveH1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			if tc.below {
				ln = AbortStalled(ln)
			}
			if tc.tls {
				ln = tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"http/1.1"}})
			}
			stall, whole := time.Duration(0), bound
			if tc.stall {
				stall, whole = bound, 0
			}
			addr := tc.serve(t, h, ln, stall, whole)
			var c net.Conn
			c, err = net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			if tc.tls {
				c = tls.Client(c, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"http/1.1"}})
			}
			t0 := time.Now()
			if _, err := io.WriteString(c, "GET "+tc.path+" HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
				t.Fatal(err)
			}
			select { // the client reads nothing
			case err := <-handlerErr:
				if err == nil || err.Error() == "every write succeeded" {
					t.Fatalf("handler: %v; want a write error", err)
				}
				// Not after a close_notify that waits its 5 s for the client (stallBound.write).
				if d := time.Since(t0); d > bound+3*time.Second {
					t.Errorf("the handler's write failed after %v; want within %v of the bound", d, bound)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the handler still writes to a client that stopped reading 10 s ago")
			}
			_, err = io.Copy(io.Discard, c)
			switch {
			case errors.Is(err, os.ErrDeadlineExceeded):
				t.Error("the connection was not closed")
			case !isReset(err):
				t.Errorf("reading after the stall: %v; want a reset (an abortive close)", err)
			}
		})
	}
}

func serveH1(t *testing.T, h http.Handler, ln net.Listener, stall, whole time.Duration) string {
	return serveOn(t, &Server{WriteStallTimeout: stall, WriteTimeout: whole}, h, ln)
}

func serveNet(t *testing.T, h http.Handler, ln net.Listener, stall, whole time.Duration) string {
	return serveNetHTTPOn(t, &NetHTTP{Server: &http.Server{WriteTimeout: whole}, WriteStallTimeout: stall}, h, ln)
}
