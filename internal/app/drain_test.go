package app

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/testlog"
)

// served is a router run by Serve on loopback, stopped by cancel.
type served struct {
	api, admin string // base URLs
	cancel     context.CancelFunc
	done       chan error // what Serve returned
}

// serve runs a router built from cfg, logging JSON to logs (nil: nowhere), until the test
// ends or cancel is called.
func serve(t *testing.T, cfg *config.Config, logs *testlog.Buffer) *served {
	t.Helper()
	logger := slog.New(slog.DiscardHandler)
	if logs != nil {
		logger = slog.New(slog.NewJSONHandler(logs, nil))
	}
	r, err := NewRouter(cfg, logger)
	if err != nil {
		t.Fatal(err)
	}
	apiLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	adminLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		apiLn.Close()
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &served{api: "http://" + apiLn.Addr().String(), admin: "http://" + adminLn.Addr().String(), cancel: cancel, done: make(chan error, 1)}
	go func() { s.done <- r.Serve(ctx, apiLn, adminLn) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-s.done:
		case <-time.After(20 * time.Second):
			t.Error("Serve did not return")
		}
	})
	return s
}

// wait returns what Serve returned, failing t after limit.
func (s *served) wait(t *testing.T, limit time.Duration) error {
	t.Helper()
	select {
	case err := <-s.done:
		s.done <- err // for the cleanup
		return err
	case <-time.After(limit):
		t.Fatalf("Serve did not return within %v", limit)
		return nil
	}
}

// readyz is the admin listener's /readyz status and body, on a connection of its own.
func readyz(t *testing.T, admin string) (int, string) {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get(admin + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// refused polls addr (host:port) until a connection to it is refused, for up to limit, and
// returns when that was (zero if never).
func refused(addr string, limit time.Duration) time.Time {
	for deadline := time.Now().Add(limit); time.Now().Before(deadline); {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return time.Now()
		}
		c.Close()
		time.Sleep(10 * time.Millisecond)
	}
	return time.Time{}
}

// TestServeDrainDelay: at the end of ctx, /readyz answers 503 (draining) at once, while the API
// listener keeps taking new requests for server.drain_delay, each answered with Connection:
// close (the client's next request opens a connection its load balancer places); then the
// listener closes, and the stream in flight still ends whole.
func TestServeDrainDelay(t *testing.T) {
	for _, srv := range []string{config.HTTPServerBuiltin, config.HTTPServerNetHTTP} {
		t.Run(srv, func(t *testing.T) {
			t.Parallel()
			const delay = 3 * time.Second
			e := newFakeEngine(t)
			e.hold, e.held = make(chan struct{}), make(chan struct{})
			cfg := routerConfig(t, "", e.srv.URL)
			cfg.Server.HTTPServer = srv
			d := config.Duration(delay)
			cfg.Server.DrainDelay = &d
			s := serve(t, cfg, nil)
			if code, _ := readyz(t, s.admin); code != http.StatusOK { // a balancer follows /readyz
				t.Fatalf("/readyz before the shutdown: %d, want 200", code)
			}
			client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{}}
			defer client.CloseIdleConnections()
			stream, err := client.Post(s.api+"/v1/chat/completions", "application/json",
				strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}]}`))
			if err != nil {
				t.Fatal(err)
			}
			defer stream.Body.Close()
			waitChan(t, e.held, "the engine did not start the stream")

			start := time.Now()
			s.cancel()
			for deadline := time.Now().Add(5 * time.Second); ; {
				code, body := readyz(t, s.admin)
				if code == http.StatusServiceUnavailable && strings.Contains(body, "draining") {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("/readyz after the shutdown began: %d %q, want 503 draining", code, body)
				}
				time.Sleep(5 * time.Millisecond)
			}
			fresh := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{}}
			defer fresh.CloseIdleConnections()
			resp, err := fresh.Post(s.api+"/v1/chat/completions", "application/json", strings.NewReader(chatBody))
			if err != nil {
				t.Fatalf("a new request %v after the signal, within server.drain_delay (%v): %v", time.Since(start), delay, err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || !resp.Close {
				t.Errorf("a new request during the delay: %d, Connection: close %v; want 200, closed after", resp.StatusCode, resp.Close)
			}
			at := refused(strings.TrimPrefix(s.api, "http://"), 10*time.Second)
			switch {
			case at.IsZero():
				t.Fatal("the API listener still takes connections 10 s after the signal")
			case at.Sub(start) < delay:
				t.Errorf("the API listener closed %v after the signal, before server.drain_delay (%v)", at.Sub(start), delay)
			}
			close(e.hold)
			body, err := io.ReadAll(stream.Body)
			if err != nil || !bytes.HasSuffix(body, []byte("data: [DONE]\n\n")) {
				t.Errorf("the stream in flight: %v, %q; want it whole", err, body)
			}
			if err := s.wait(t, 15*time.Second); err != nil {
				t.Errorf("Serve: %v", err)
			}
		})
	}
}

// TestServeNoDrainDelayUnasked: a router whose /readyz nobody asked (run by hand, behind DNS
// alone) has no balancer to wait for: it stops at once, server.drain_delay or not, and says so.
func TestServeNoDrainDelayUnasked(t *testing.T) {
	e := newFakeEngine(t)
	cfg := routerConfig(t, "", e.srv.URL)
	d := config.Duration(time.Minute)
	cfg.Server.DrainDelay = &d
	var logs testlog.Buffer
	s := serve(t, cfg, &logs)
	start := time.Now()
	s.cancel()
	if err := s.wait(t, 15*time.Second); err != nil {
		t.Errorf("Serve: %v", err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("Serve took %v to stop with nothing in flight", took)
	}
	if !strings.Contains(logs.String(), "no drain delay, as /readyz was never asked") {
		t.Errorf("the log does not say why there was no drain delay:\n%s", logs.String())
	}
}

// TestServeCutsAtDeadline: a stream still open when server.shutdown_timeout runs out ends with
// an SSE error event (code shutting_down) and a proper end of its body, rather than a
// connection closed under it; it is logged as a 503 with its error type and code, and the
// warning says how many were cut and which setting to raise.
func TestServeCutsAtDeadline(t *testing.T) {
	for _, srv := range []string{config.HTTPServerBuiltin, config.HTTPServerNetHTTP} {
		t.Run(srv, func(t *testing.T) {
			t.Parallel()
			e := newFakeEngine(t)
			e.hold, e.held = make(chan struct{}), make(chan struct{}) // never released: held until cut
			cfg := routerConfig(t, "", e.srv.URL)
			cfg.Server.HTTPServer = srv
			cfg.Server.ShutdownTimeout = config.Duration(time.Second)
			var logs testlog.Buffer
			s := serve(t, cfg, &logs)
			client := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{}}
			defer client.CloseIdleConnections()
			stream, err := client.Post(s.api+"/v1/chat/completions", "application/json",
				strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}]}`))
			if err != nil {
				t.Fatal(err)
			}
			defer stream.Body.Close()
			waitChan(t, e.held, "the engine did not start the stream")
			s.cancel()
			body, err := io.ReadAll(stream.Body)
			if err != nil {
				t.Errorf("the cut stream's body broke: %v (got %q)", err, body)
			}
			if !strings.Contains(string(body), `"content":"t0"`) || !strings.Contains(string(body), "event: error\ndata: ") ||
				!strings.Contains(string(body), `"code":"shutting_down"`) {
				t.Errorf("the cut stream: %q, want its event, then an SSE error event of code shutting_down", body)
			}
			if err := s.wait(t, 15*time.Second); err != nil {
				t.Errorf("Serve: %v", err)
			}
			var access, warn map[string]any
			for _, l := range logs.JSONLines(t) {
				switch {
				case l["msg"] == "request":
					access = l
				case strings.HasPrefix(l["msg"].(string), "drain timed out: requests still in flight were cut"):
					warn = l
				}
			}
			if access == nil || access["status"] != 503.0 || access["error_type"] != "service_unavailable_error" || access["error_code"] != "shutting_down" {
				t.Errorf("access line %v, want status 503, error_type service_unavailable_error, error_code shutting_down", access)
			}
			if warn == nil || warn["cut"] != 1.0 || !strings.Contains(warn["msg"].(string), "raise server.shutdown_timeout") {
				t.Errorf("warning %v, want one that says 1 request was cut and to raise server.shutdown_timeout", warn)
			}
		})
	}
}

func waitChan(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatal(what)
	}
}
