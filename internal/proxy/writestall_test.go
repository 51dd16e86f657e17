package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/h1"
)

// TestWriteStallLogged: a client that stops reading its stream is cut by the API server's
// write stall bound (h1.Server's and h1.NetHTTP's WriteStallTimeout), and its request is
// logged as a 499 whose error_type says so (client_write_stall), not as a plain 499.
func TestWriteStallLogged(t *testing.T) {
	const stall = 200 * time.Millisecond
	event := "data: {\"choices\":[{\"delta\":{\"content\":\"" + strings.Repeat("x", 64<<10) + "\"}}]}\n\n"
	url := engine(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for range 4096 { // 256 MiB: far more than the sockets' buffers hold
			if _, err := io.WriteString(w, event); err != nil {
				return // the router let go
			}
		}
	}).URL
	for _, server := range []string{"h1", "net/http"} {
		t.Run(server, func(t *testing.T) {
			f := newFixture(t, spec(url, "m"))
			logs := jsonLogger(f)
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				defer func() { f.done <- struct{}{} }()
				f.h.ServeHTTP(w, r)
			})
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			served := make(chan error, 1)
			if server == "h1" {
				srv := &h1.Server{Handler: h, WriteStallTimeout: stall}
				go func() { served <- srv.Serve(ln) }()
				t.Cleanup(func() { srv.Close(); <-served })
			} else {
				srv := &h1.NetHTTP{Server: &http.Server{Handler: h}, WriteStallTimeout: stall}
				go func() { served <- srv.Serve(ln) }()
				t.Cleanup(func() {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					defer cancel()
					_ = srv.Shutdown(ctx)
					<-served
				})
			}
			conn, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(streamBody), streamBody)
			f.wait(t) // the client reads nothing: the server's stall bound ends the request
			line := lastAccess(t, logs)
			if line["status"] != float64(499) || line["error_type"] != errWriteStall {
				t.Errorf("access line status %v, error_type %v; want 499, %s", line["status"], line["error_type"], errWriteStall)
			}
		})
	}
}

// TestWriteStalled tells the API servers' write stall cuts from a client's hanging up.
func TestWriteStalled(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{&net.OpError{Op: "write", Net: "tcp", Err: os.ErrDeadlineExceeded}, true},
		{fmt.Errorf("writing: %w", net.ErrClosed), true},
		{&net.OpError{Op: "write", Net: "tcp", Err: os.NewSyscallError("write", syscall.EPIPE)}, false},
		{&net.OpError{Op: "write", Net: "tcp", Err: os.NewSyscallError("write", syscall.ECONNRESET)}, false},
		{errors.New("http: Handler timeout"), false},
	} {
		if got := writeStalled(tc.err); got != tc.want {
			t.Errorf("writeStalled(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
