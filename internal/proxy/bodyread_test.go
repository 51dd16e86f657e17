package proxy

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/h1"
	"github.com/kvroute/kvroute/internal/testlog"
)

// TestBodyReadErrors: how a failed body read is answered. A client gone mid-body is 499
// client_gone, not the client's malformed request; a body refused for the server's memory cap
// is 503.
func TestBodyReadErrors(t *testing.T) {
	for _, tc := range []struct {
		name         string
		err          error
		status       int
		typ, code    string
		errorMessage string
	}{
		{"closed mid-body", io.ErrUnexpectedEOF, 499, "client_gone", "client_gone", "went away"},
		{"reset mid-body", &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}, 499, "client_gone", "client_gone", "went away"},
		{"memory cap", h1.ErrBodyMemory, http.StatusServiceUnavailable, "service_unavailable_error", "overloaded", "server.max_pending_body_bytes"},
		{"malformed chunks", errors.New("malformed chunked encoding"), http.StatusBadRequest, "invalid_request_error", "", "malformed chunked encoding"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, _ := http.NewRequest(http.MethodPost, "/v1/chat/completions", io.MultiReader(strings.NewReader(`{"model":`), errReader{tc.err}))
			r.ContentLength = 100
			_, _, oe := readBodyHeld(r, 1<<20, true)
			if oe == nil {
				t.Fatal("no error")
			}
			code := ""
			if oe.Code != nil {
				code = *oe.Code
			}
			if oe.Status != tc.status || oe.Type != tc.typ || code != tc.code || !strings.Contains(oe.Message, tc.errorMessage) {
				t.Errorf("got %d %s %q %q; want %d %s %q, a message with %q", oe.Status, oe.Type, code, oe.Message, tc.status, tc.typ, tc.code, tc.errorMessage)
			}
		})
	}
}

// TestClientGoneMidBodyIs499: a client that closes its connection halfway through its body is
// logged 499 client_gone, on both API servers, and no engine sees the request.
func TestClientGoneMidBodyIs499(t *testing.T) {
	e := newFakeEngine(t)
	f := newFixture(t, spec(e.srv.URL, "m"))
	var logs testlog.Buffer
	f.h.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &h1.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() { f.done <- struct{}{} }()
		f.h.ServeHTTP(w, r)
	})}
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	t.Cleanup(func() {
		_ = hs.Close()
		<-served
	})
	for _, srv := range []struct{ name, addr string }{{"net/http", strings.TrimPrefix(f.srv.URL, "http://")}, {"h1", ln.Addr().String()}} {
		t.Run(srv.name, func(t *testing.T) {
			c, err := net.Dial("tcp", srv.addr)
			if err != nil {
				t.Fatal(err)
			}
			body := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("x", 2000) + `"}]}`
			fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", len(body), body[:len(body)/2])
			<-time.After(50 * time.Millisecond) // the handler reads what came, then waits for the rest
			c.Close()
			f.wait(t)
			var line struct {
				Status    int    `json:"status"`
				ErrorType string `json:"error_type"`
			}
			for l := range strings.SplitSeq(strings.TrimSpace(logs.String()), "\n") {
				var m map[string]any
				if json.Unmarshal([]byte(l), &m) == nil && m["msg"] == "request" {
					_ = json.Unmarshal([]byte(l), &line)
				}
			}
			if line.Status != 499 || line.ErrorType != "client_gone" {
				t.Errorf("logged %d %q; want 499 client_gone (log:\n%s)", line.Status, line.ErrorType, logs.String())
			}
		})
	}
	if n := len(e.received()); n != 0 {
		t.Errorf("engine received %d requests, want none", n)
	}
}
