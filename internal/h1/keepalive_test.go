package h1

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// startKeepAlive serves h with the server named ("h1": Server, "net/http": NetHTTP), with
// CloseUnauthorized as kvroute serve sets it, and returns its address and its
// SetKeepAlivesEnabled.
func startKeepAlive(t *testing.T, name string, h http.Handler) (string, func(bool)) {
	t.Helper()
	if name == "h1" {
		s := &Server{CloseUnauthorized: true, ErrorBody: jsonError}
		return startServer(t, s, h), s.SetKeepAlivesEnabled
	}
	n := &NetHTTP{CloseUnauthorized: true, ErrorBody: jsonError}
	return startNetHTTP(t, n, h), n.SetKeepAlivesEnabled
}

// readAnswer reads one response from c: its status, whether it asks to close the connection,
// and its body.
func readAnswer(c *client) (status int, closing bool, body string) {
	c.t.Helper()
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		c.t.Fatalf("reading an answer: %v", err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		c.t.Fatalf("reading an answer's body: %v", err)
	}
	return resp.StatusCode, resp.Close, string(b)
}

// TestKeepAlivesOff: after SetKeepAlivesEnabled(false) (a shutdown's start), every answer whose
// head goes out closes its connection: that of a request in flight then, one whose handler
// writes nothing, one on a connection kept alive before. A head that went out before cannot be
// taken back: that answer ends whole and its connection stays open for the next request,
// answered with Connection: close. SetKeepAlivesEnabled(true) undoes it.
func TestKeepAlivesOff(t *testing.T) {
	for _, name := range []string{"h1", "net/http"} {
		t.Run(name, func(t *testing.T) {
			holding, release := make(chan struct{}, 2), make(chan struct{})
			addr, keepAlives := startKeepAlive(t, name, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				switch r.URL.Path {
				case "/hold": // answers once released
					holding <- struct{}{}
					<-release
					_, _ = io.WriteString(w, "held")
				case "/stream": // the head goes out at once, the rest once released
					w.Header().Set("Content-Type", "text/event-stream")
					_, _ = io.WriteString(w, "data: 1\n\n")
					http.NewResponseController(w).Flush()
					holding <- struct{}{}
					<-release
					_, _ = io.WriteString(w, "data: 2\n\n")
				case "/empty": // writes nothing: the server writes the head after it returns
				default:
					_, _ = io.WriteString(w, "ok")
				}
			}))
			kept := dialClient(t, addr)
			kept.send(get("/"))
			if status, closing, _ := readAnswer(kept); status != 200 || closing {
				t.Fatalf("before: %d, close %v; want 200 kept alive", status, closing)
			}
			held, streamed := dialClient(t, addr), dialClient(t, addr)
			held.send(get("/hold"))
			streamed.send(get("/stream"))
			for range 2 {
				select {
				case <-holding:
				case <-time.After(5 * time.Second):
					t.Fatal("the handlers did not start")
				}
			}
			keepAlives(false)
			close(release)
			if status, closing, body := readAnswer(held); status != 200 || !closing || body != "held" || !held.closed() {
				t.Errorf("in flight at the start: %d %q, close %v; want 200 held with Connection: close, then closed", status, body, closing)
			}
			if status, closing, body := readAnswer(streamed); status != 200 || closing || body != "data: 1\n\ndata: 2\n\n" {
				t.Errorf("its head out before the start: %d %q, close %v; want 200, the whole stream, kept alive", status, body, closing)
			}
			for i, c := range []*client{streamed, kept} {
				c.send(get("/empty"))
				if status, closing, _ := readAnswer(c); status != 200 || !closing || !c.closed() {
					t.Errorf("connection %d kept alive, its next request: %d, close %v; want 200 with Connection: close, then closed", i, status, closing)
				}
			}
			keepAlives(true)
			again := dialClient(t, addr)
			again.send(get("/"))
			if status, closing, _ := readAnswer(again); status != 200 || closing {
				t.Errorf("keep-alives on again: %d, close %v; want 200 kept alive", status, closing)
			}
		})
	}
}

// TestBaseContext: the requests' contexts derive from BaseContext's, so that ending it ends
// those in flight and those to come, with its cause; they still carry http.ServerContextKey.
func TestBaseContext(t *testing.T) {
	base, cut := context.WithCancelCause(context.Background())
	errCut := errors.New("cut")
	started := make(chan struct{}, 1)
	s := &Server{BaseContext: func(net.Listener) context.Context { return base }}
	addr := startServer(t, s, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		if ctx.Value(http.ServerContextKey) != s {
			http.Error(w, "no server in the context", http.StatusInternalServerError)
			return
		}
		if r.URL.Path == "/wait" {
			started <- struct{}{}
			select {
			case <-ctx.Done():
			case <-time.After(5 * time.Second):
			}
		}
		if err := context.Cause(ctx); err != nil {
			_, _ = io.WriteString(w, err.Error())
		}
	}))
	c := dialClient(t, addr)
	c.send(get("/"))
	if status, _, body := readAnswer(c); status != 200 || body != "" {
		t.Fatalf("before the cut: %d %q; want 200 and a live context", status, body)
	}
	c.send(get("/wait"))
	select {
	case <-started:
	case <-time.After(5 * time.Second):
		t.Fatal("the handler did not start")
	}
	cut(errCut)
	if status, _, body := readAnswer(c); status != 200 || body != "cut" {
		t.Errorf("in flight at the cut: %d %q; want its context ended by the cut", status, body)
	}
	c.send(get("/"))
	if status, _, body := readAnswer(c); status != 200 || body != "cut" {
		t.Errorf("after the cut: %d %q; want its context ended by the cut", status, body)
	}
}

func get(path string) string { return "GET " + path + " HTTP/1.1\r\nHost: x\r\n\r\n" }
