package app

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/internal/testlog"
)

// do sends method path with body to h and returns the status and body.
func do(t *testing.T, h http.Handler, method, path, body string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, path, strings.NewReader(body)))
	return rec.Code, rec.Body.String()
}

// countLines counts the log lines whose msg is msg.
func countLines(t *testing.T, buf *testlog.Buffer, msg string) int {
	t.Helper()
	n := 0
	for _, l := range buf.JSONLines(t) {
		if l["msg"] == msg {
			n++
		}
	}
	return n
}

// TestLogLevelAtRuntime: the log level changes while the router runs: PUT /debug/loglevel on
// the admin listener sets it (GET says it) until the next reload that applies, which puts
// log.level back (a rejected one does not); a reload that changes log.level puts it in force.
// The logger from NewLogger, as kvroute serve's, follows the router's level: its lines too.
// Before, the level was the one at start for good: no endpoint, and log.level changed nothing
// on reload.
func TestLogLevelAtRuntime(t *testing.T) {
	e := newFakeEngine(t)
	var buf testlog.Buffer
	cfg := routerConfig(t, "", e.srv.URL)
	caller := NewLogger(cfg.Log, &buf)
	r, err := NewRouter(cfg, caller)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	admin := r.AdminHandler()
	level := func(step, want string) {
		t.Helper()
		if code, body := do(t, admin, http.MethodGet, "/debug/loglevel", ""); code != 200 || body != want+"\n" {
			t.Errorf("%s: GET /debug/loglevel %d %q, want 200 %q", step, code, body, want)
		}
	}
	// probe logs a line at each level through the router's logger, and returns the levels
	// that came out.
	probe := func(step string) []string {
		t.Helper()
		for _, l := range []slog.Level{slog.LevelDebug, slog.LevelInfo, slog.LevelWarn, slog.LevelError} {
			r.Logger().Log(context.Background(), l, "probe "+step)
		}
		var out []string
		for _, l := range buf.JSONLines(t) {
			if l["msg"] == "probe "+step {
				out = append(out, l["level"].(string))
			}
		}
		return out
	}

	level("start", "info")
	if diff := cmp.Diff([]string{"INFO", "WARN", "ERROR"}, probe("start")); diff != "" {
		t.Errorf("at log.level info (-want +got):\n%s", diff)
	}
	if code, body := do(t, admin, http.MethodPut, "/debug/loglevel", "debug\n"); code != 200 || body != "debug\n" {
		t.Fatalf("PUT debug: %d %q", code, body)
	}
	level("after PUT debug", "debug")
	if diff := cmp.Diff([]string{"DEBUG", "INFO", "WARN", "ERROR"}, probe("debug")); diff != "" {
		t.Errorf("after PUT debug (-want +got):\n%s", diff)
	}
	caller.Debug("the caller's own line")
	if n := countLines(t, &buf, "the caller's own line"); n != 1 {
		t.Errorf("after PUT debug, the caller's debug line (NewLogger's logger): %d lines, want 1", n)
	}
	if got := messages(t, &buf, "log level set at /debug/loglevel"); len(got) != 1 || got[0]["log_level"] != "debug" || got[0]["was"] != "info" || got[0]["config_log_level"] != "info" {
		t.Errorf("the change's log line: %v", got)
	}
	for _, bad := range []string{"", "verbose", "DEBUG2", strings.Repeat("x", 100)} {
		if code, _ := do(t, admin, http.MethodPut, "/debug/loglevel", bad); code != http.StatusBadRequest {
			t.Errorf("PUT %q: %d, want 400", bad, code)
		}
	}
	level("after bad PUTs", "debug")

	// A rejected reload keeps the level set; one that applies puts log.level back.
	bad := routerConfig(t, "", e.srv.URL)
	bad.Policy.Name = "no-such-policy"
	if err := r.Reload(bad); err == nil {
		t.Fatal("reload with an unknown policy: no error")
	}
	level("after a rejected reload", "debug")
	if err := r.Reload(routerConfig(t, "", e.srv.URL)); err != nil {
		t.Fatal(err)
	}
	level("after a reload", "info")
	if n := len(messages(t, &buf, "the config's log.level is in force again")); n != 1 {
		t.Errorf("%d lines say the reload put log.level back, want 1", n)
	}

	// log.level on reload.
	if err := r.Reload(routerConfig(t, "log: {level: warn}\n", e.srv.URL)); err != nil {
		t.Fatal(err)
	}
	level("after log.level warn", "warn")
	if diff := cmp.Diff([]string{"WARN", "ERROR"}, probe("warn")); diff != "" {
		t.Errorf("at log.level warn (-want +got):\n%s", diff)
	}
	applied := countLines(t, &buf, "config applied")
	if err := r.Reload(routerConfig(t, "log: {level: warn}\n", e.srv.URL)); err != nil {
		t.Fatal(err)
	}
	if n := countLines(t, &buf, "config applied"); n != applied {
		t.Errorf("an info line (config applied) logged at log.level warn")
	}
}

// TestAccessLogSwitch: log.access false turns the access lines off and nothing else (the API
// handler's warnings still come), and a reload turns them on and off again. Before, the key did
// not exist: a config with it was rejected.
func TestAccessLogSwitch(t *testing.T) {
	e := newFakeEngine(t)
	var buf testlog.Buffer
	r, err := NewRouter(routerConfig(t, "log: {access: false}\n", e.srv.URL), slog.New(slog.NewJSONHandler(&buf, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	api := r.Handler()
	chat := func(step string) int {
		t.Helper()
		code, body := do(t, api, http.MethodPost, "/v1/chat/completions", chatBody)
		if step != "" && code != 200 {
			t.Fatalf("%s: chat %d %s", step, code, body)
		}
		return code
	}
	chat("access off")
	if n := countLines(t, &buf, "request"); n != 0 {
		t.Errorf("log.access false: %d access lines, want 0", n)
	}
	if err := r.Reload(routerConfig(t, "log: {access: true}\n", e.srv.URL)); err != nil {
		t.Fatal(err)
	}
	chat("access on")
	if n := countLines(t, &buf, "request"); n != 1 {
		t.Errorf("log.access true: %d access lines, want 1", n)
	}
	if n := len(messages(t, &buf, "access log on")); n != 1 {
		t.Errorf("%d lines say the access log is on, want 1", n)
	}

	// Off again, with an endpoint that refuses connections: the attempt's warning still comes.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String()
	ln.Close()
	if err := r.Reload(routerConfig(t, "log: {access: false}\n", dead)); err != nil {
		t.Fatal(err)
	}
	if code := chat(""); code < 500 {
		t.Fatalf("chat to a dead endpoint: %d, want a 5xx", code)
	}
	if n := countLines(t, &buf, "request"); n != 1 {
		t.Errorf("log.access false again: %d access lines, want still 1", n)
	}
	warned := 0
	for _, l := range buf.JSONLines(t) {
		if l["level"] == "WARN" && l["request_id"] != nil && l["endpoint"] == dead {
			warned++
		}
	}
	if warned == 0 {
		t.Errorf("with log.access false, no warning from the API handler about the dead endpoint:\n%s", buf.String())
	}
}

// countingHandler counts the records it is given, and formats none.
type countingHandler struct{ n atomic.Int64 }

func (h *countingHandler) Enabled(context.Context, slog.Level) bool  { return true }
func (h *countingHandler) Handle(context.Context, slog.Record) error { h.n.Add(1); return nil }
func (h *countingHandler) WithAttrs([]slog.Attr) slog.Handler        { return h }
func (h *countingHandler) WithGroup(string) slog.Handler             { return h }

// accessLine logs an access line as the API handler does: its attributes in an array on the
// stack, through LogAttrs.
func accessLine(l *slog.Logger) {
	var buf [8]slog.Attr
	attrs := append(buf[:0], slog.String("request_id", "0123456789abcdef"), slog.String("method", "POST"),
		slog.String("path", "/v1/chat/completions"), slog.Int("status", 200), slog.Float64("duration_ms", 12.5),
		slog.String("model", "m"), slog.Bool("stream", true), slog.Int("prompt_tokens", 1000))
	l.LogAttrs(context.Background(), slog.LevelInfo, "request", attrs...)
}

// TestAccessLogOffCostsNothing: with log.access off, an access line reaches no handler and
// allocates nothing (the handler's Enabled says no before a record is made); warnings pass.
func TestAccessLogOffCostsNothing(t *testing.T) {
	var inner countingHandler
	lc := &logControl{}
	lc.level.Set(slog.LevelDebug)
	l := slog.New(&levelHandler{h: &inner, lc: lc, access: true})
	if allocs := testing.AllocsPerRun(100, func() { accessLine(l) }); allocs != 0 {
		t.Errorf("access line with log.access off: %v allocations, want 0", allocs)
	}
	if n := inner.n.Load(); n != 0 {
		t.Errorf("access off: the handler got %d records, want 0", n)
	}
	l.Warn("w")
	l.Debug("d")
	lc.access.Store(true)
	accessLine(l)
	if n := inner.n.Load(); n != 3 {
		t.Errorf("the handler got %d records (a warning, a debug line, an access line once on), want 3", n)
	}
}

// BenchmarkAccessLine: an access line through the router's handler chain into a JSON handler
// writing to io.Discard, with log.access on and off.
func BenchmarkAccessLine(b *testing.B) {
	for _, on := range []bool{true, false} {
		name := "access=off"
		if on {
			name = "access=on"
		}
		b.Run(name, func(b *testing.B) {
			lc := &logControl{}
			lc.access.Store(on)
			l := slog.New(&levelHandler{h: slog.NewJSONHandler(io.Discard, nil), lc: lc, access: true})
			b.ReportAllocs()
			for b.Loop() {
				accessLine(l)
			}
		})
	}
}

// TestLogLevelFloor: a logger whose handler was built with a level of its own (kvroute demo's
// warnings-only one) keeps it as a floor: log.level info shows nothing below warn, and PUT
// /debug/loglevel below it is refused (409) rather than said to be in force. A level above it
// still quiets the router.
func TestLogLevelFloor(t *testing.T) {
	e := newFakeEngine(t)
	var buf testlog.Buffer
	r, err := NewRouter(routerConfig(t, "", e.srv.URL), slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	r.Logger().Info("an info line")
	if code, body := do(t, r.Handler(), http.MethodPost, "/v1/chat/completions", chatBody); code != 200 {
		t.Fatalf("chat: %d %s", code, body)
	}
	if n := countLines(t, &buf, "an info line") + countLines(t, &buf, "request"); n != 0 {
		t.Errorf("%d info lines through a warnings-only handler, want 0", n)
	}
	admin := r.AdminHandler()
	if code, body := do(t, admin, http.MethodPut, "/debug/loglevel", "debug"); code != http.StatusConflict {
		t.Errorf("PUT debug below the handler's level: %d %q, want 409", code, body)
	}
	if code, body := do(t, admin, http.MethodPut, "/debug/loglevel", "error"); code != 200 || body != "error\n" {
		t.Errorf("PUT error: %d %q", code, body)
	}
	r.Logger().Warn("a warning")
	if n := countLines(t, &buf, "a warning"); n != 0 {
		t.Errorf("at error, %d warnings logged, want 0", n)
	}
}
