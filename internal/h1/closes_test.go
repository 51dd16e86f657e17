package h1

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"
)

// TestClosesOffTheLock: the connections the janitor closes for a timeout, and those Shutdown
// and Close close, are closed after the server's lock is let go. With such a connection's
// Close held (as a TLS connection's close_notify may be, by a client that does not read),
// what needs the lock goes on: the accept loop serves a new connection, Stats answers.
func TestClosesOffTheLock(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") })
	for _, tc := range []struct {
		name string
		s    *Server
		// kept: the connection to be closed serves a request first, and waits idle then.
		kept bool
		// stop, when set, closes the connection (else the janitor does, for its timeout); it
		// returns what the call returned.
		stop func(s *Server) error
	}{
		{name: "header timeout", s: &Server{ReadHeaderTimeout: time.Second}},
		{name: "idle timeout", s: &Server{IdleTimeout: time.Second}, kept: true},
		{name: "Shutdown", s: &Server{}, kept: true, stop: func(s *Server) error {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			return s.Shutdown(ctx)
		}},
		{name: "Close", s: &Server{}, kept: true, stop: (*Server).Close},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			release, closing := make(chan struct{}), make(chan struct{}, 1)
			s := tc.s
			addr := serveOn(t, s, h, slowCloseListener{Listener: ln, release: release, closing: closing})
			free := sync.OnceFunc(func() { close(release) })
			defer free() // before the server's cleanup closes what is left

			waiting := dialClient(t, addr)
			if tc.kept {
				if status := waiting.get("/"); status != http.StatusOK {
					t.Fatalf("first request: status %d", status)
				}
			}
			eventually(t, "the connection counted", func() bool { return s.Stats().Conns == 1 })
			stopped := make(chan error, 1)
			if tc.stop != nil {
				go func() { stopped <- tc.stop(s) }()
			}
			select {
			case <-closing:
			case <-time.After(5 * time.Second):
				t.Fatal("the connection was not closed")
			}

			stats := make(chan Stats, 1)
			go func() { stats <- s.Stats() }()
			select {
			case <-stats:
			case <-time.After(2 * time.Second):
				t.Error("Stats waited 2 s for the lock while a connection was being closed")
			}
			if tc.stop == nil {
				c := dialClient(t, addr)
				_ = c.nc.SetDeadline(time.Now().Add(2 * time.Second))
				start := time.Now()
				if status := c.get("/"); status != http.StatusOK {
					t.Errorf("a new connection, while the expired one is still closing: status %d after %v; want 200",
						status, time.Since(start).Round(time.Millisecond))
				}
			}

			free()
			if !waiting.closed() {
				t.Error("the connection is still open")
			}
			if tc.stop != nil {
				select {
				case err := <-stopped:
					if err != nil {
						t.Errorf("%s: %v", tc.name, err)
					}
				case <-time.After(5 * time.Second):
					t.Errorf("%s did not return once the close was let go", tc.name)
				}
			}
		})
	}
}

// TestTakenOutNotServed: a connection the server has taken out of service, to close it once
// its lock is let go, serves no request that arrives before the close: not one waiting for
// its head past the header timeout (the janitor's sweep), nor any at Close. A handler that
// hijacks its connection after Close took it is told the server is closed.
func TestTakenOutNotServed(t *testing.T) {
	served := make(chan string, 8)
	entered, proceed := make(chan struct{}, 1), make(chan struct{})
	hijacked := make(chan error, 1)
	s := &Server{ReadHeaderTimeout: time.Hour, IdleTimeout: time.Hour} // the janitor's own sweeps expire nothing
	addr := startServer(t, s, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served <- r.URL.Path
		if r.URL.Path == "/hijack" {
			entered <- struct{}{}
			select {
			case <-proceed:
			case <-time.After(5 * time.Second):
			}
			c, _, err := http.NewResponseController(w).Hijack()
			if c != nil {
				c.Close()
			}
			hijacked <- err
			return
		}
		_, _ = io.WriteString(w, "ok")
	}))
	// take takes the connection from c out of service as the janitor or Close would, and
	// returns what is to be closed.
	take := func(t *testing.T, c *client, how func(sc *srvConn) []net.Conn) []net.Conn {
		t.Helper()
		var sc *srvConn
		eventually(t, "the server knows the connection", func() bool {
			sc = s.connOf(c.remote())
			return sc != nil
		})
		s.mu.Lock()
		defer s.mu.Unlock()
		return how(sc)
	}
	notServed := func(t *testing.T, c *client, closing []net.Conn) {
		t.Helper()
		c.send("GET /late HTTP/1.1\r\nHost: x\r\n\r\n")
		// The connection's goroutine reads the request, finds the connection taken and
		// closes it itself: no answer, whether or not the taker's close comes first.
		if status, _, body := c.answer(); status != 0 {
			t.Errorf("a request that arrived before the close was served: status %d, %q", status, body)
		}
		closeConns(closing)
	}

	t.Run("header timeout", func(t *testing.T) {
		c := dialClient(t, addr)
		closing := take(t, c, func(sc *srvConn) []net.Conn {
			_, expired, _ := s.sweep(time.Now().Add(2 * time.Hour).UnixNano())
			return expired
		})
		if len(closing) != 1 {
			t.Fatalf("the sweep expired %d connections, want 1", len(closing))
		}
		notServed(t, c, closing)
	})
	t.Run("Close", func(t *testing.T) {
		c := dialClient(t, addr)
		closing := take(t, c, func(sc *srvConn) []net.Conn {
			if !sc.takeAll() {
				t.Fatal("a connection waiting for its first request is not Close's to close")
			}
			return []net.Conn{sc.rwc}
		})
		notServed(t, c, closing)
	})
	t.Run("Close, then Hijack", func(t *testing.T) {
		c := dialClient(t, addr)
		c.send("GET /hijack HTTP/1.1\r\nHost: x\r\n\r\n")
		select {
		case <-entered:
		case <-time.After(5 * time.Second):
			t.Fatal("the handler did not start")
		}
		closing := take(t, c, func(sc *srvConn) []net.Conn {
			if !sc.takeAll() {
				t.Fatal("a connection serving a request is not Close's to close")
			}
			return []net.Conn{sc.rwc}
		})
		close(proceed)
		select {
		case err := <-hijacked:
			if !errors.Is(err, ErrServerClosed) {
				t.Errorf("Hijack after Close took the connection: %v, want ErrServerClosed", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("the handler did not hijack")
		}
		closeConns(closing)
	})
	var paths []string
	for len(served) > 0 {
		paths = append(paths, <-served)
	}
	if len(paths) != 1 || paths[0] != "/hijack" {
		t.Errorf("handlers ran for %q, want only /hijack", paths)
	}
}
