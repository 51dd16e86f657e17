package h1

import (
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/internal/testlog"
)

// TestRefusalsCounted: the requests both servers refuse before any handler sees them are
// counted by reason in Stats.Refused and logged at DEBUG, one line each: HTTP/2's preface
// (GOAWAY), a request line that does not parse (400), a head past MaxHeaderBytes (431), a head
// begun and not ended within ReadHeaderTimeout (closed). A connection that sends nothing until
// the timeout, and a request served, are not refusals. Before, none of them was counted or
// logged: Stats had the connection cap's refusals alone.
func TestRefusalsCounted(t *testing.T) {
	var calls atomic.Int32
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { calls.Add(1) })
	const headTimeout = 300 * time.Millisecond
	type srv struct {
		name  string
		addr  string
		stats func() Stats
		logs  *testlog.Buffer
	}
	var servers []srv
	{
		logs := new(testlog.Buffer)
		s := &Server{ReadHeaderTimeout: headTimeout, MaxHeaderBytes: 4096, ErrorBody: jsonError,
			Logger: slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))}
		servers = append(servers, srv{"h1", startServer(t, s, h), s.Stats, logs})
	}
	{
		logs := new(testlog.Buffer)
		n := &NetHTTP{Server: &http.Server{ReadHeaderTimeout: headTimeout, MaxHeaderBytes: 4096}, ErrorBody: jsonError,
			Logger: slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))}
		servers = append(servers, srv{"net/http", startNetHTTP(t, n, h), n.Stats, logs})
	}
	for _, s := range servers {
		t.Run(s.name, func(t *testing.T) {
			calls.Store(0)
			// Each refusal on a connection of its own; the server closes each.
			sent := map[string]string{
				"http2_preface":  h2Preface + "\x00\x00\x00\x04\x00\x00\x00\x00\x00" + "\x00\x00\x10\x01\x05\x00\x00\x00\x01" + strings.Repeat("\x00", 16),
				"malformed":      "NOT A REQUEST LINE\r\n\r\n",
				"head_too_large": "GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("b", 16<<10) + "\r\n\r\n",
				"head_timeout":   "GET / HTTP/1.1\r\nHost: x\r\nX-Slow: ", // and nothing more
				"none":           "",                                      // a connection that sends nothing
			}
			done := make(chan string, len(sent))
			for reason, req := range sent {
				go func() {
					defer func() { done <- reason }()
					c, err := net.Dial("tcp", s.addr)
					if err != nil {
						t.Error(err)
						return
					}
					defer c.Close()
					_ = c.SetDeadline(time.Now().Add(5 * time.Second))
					go func() { _, _ = io.WriteString(c, req) }() // a large head may not be read whole
					if _, err := io.Copy(io.Discard, c); err != nil && !strings.Contains(err.Error(), "reset") {
						t.Errorf("%s: the server did not close the connection: %v", reason, err)
					}
				}()
			}
			for range sent {
				<-done
			}
			// A request served is no refusal.
			if resp, err := newClient(t).Get("http://" + s.addr + "/"); err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("a good request: %v, %v", resp, err)
			} else {
				resp.Body.Close()
			}
			want := map[string]uint64{"http2_preface": 1, "malformed": 1, "head_too_large": 1, "head_timeout": 1}
			got := func() map[string]uint64 {
				out := map[string]uint64{}
				st := s.stats()
				for _, r := range Refusals {
					if n := st.Refused[r]; n > 0 {
						out[r.String()] = n
					}
				}
				return out
			}
			lines := func() map[string]int {
				out := map[string]int{}
				for _, l := range s.logs.JSONLines(t) {
					if l["level"] == "DEBUG" && l["remote_addr"] != "" {
						r, _ := l["reason"].(string)
						out[r]++
					}
				}
				return out
			}
			wantLines := map[string]int{"http2_preface": 1, "malformed": 1, "head_too_large": 1, "head_timeout": 1}
			// The count and the line are taken on the server's goroutine, which may end the
			// connection before either, and counts before it logs.
			for deadline := time.Now().Add(5 * time.Second); (!cmp.Equal(want, got()) || !cmp.Equal(wantLines, lines())) && time.Now().Before(deadline); {
				time.Sleep(5 * time.Millisecond)
			}
			if diff := cmp.Diff(want, got()); diff != "" {
				t.Errorf("Stats.Refused (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(wantLines, lines()); diff != "" {
				t.Errorf("DEBUG lines by reason (-want +got):\n%s\n%s", diff, s.logs.String())
			}
			if n := calls.Load(); n != 1 {
				t.Errorf("the handler ran %d times, want 1 (the good request)", n)
			}
		})
	}
}

// TestNetHTTPRefusal: net/http's own answers to a request it cannot read are told from the
// answers it writes for a handler, whatever their status.
func TestNetHTTPRefusal(t *testing.T) {
	for _, tc := range []struct {
		write string
		want  Refusal
		ok    bool
	}{
		{"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n400 Bad Request", RefusedMalformed, true},
		{"HTTP/1.1 400 Bad Request: missing required Host header\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n400 Bad Request: missing required Host header", RefusedMalformed, true},
		{"HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n431 Request Header Fields Too Large", RefusedHeadTooLarge, true},
		{"HTTP/1.1 505 HTTP Version Not Supported: unsupported protocol version\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n505", RefusedVersion, true},
		{"HTTP/1.1 501 Not Implemented\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\nUnsupported transfer encoding", RefusedMalformed, true},
		// A handler's answers: a Date, fields sorted (Connection before Content-Type).
		{"HTTP/1.1 400 Bad Request\r\nConnection: close\r\nContent-Type: text/plain; charset=utf-8\r\nDate: Tue, 08 Dec 2026 01:00:00 GMT\r\n\r\n", 0, false},
		{"HTTP/1.1 200 OK\r\nContent-Type: text/plain; charset=utf-8\r\nDate: Tue, 08 Dec 2026 01:00:00 GMT\r\n\r\n", 0, false},
		// The connection cap's 503 (writeRefusal) is counted apart.
		{"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n", 0, false},
		{"HTTP/1.1 ", 0, false},
		{"1a\r\ndata: {}\r\n", 0, false},
	} {
		why, _, ok := netHTTPRefusal([]byte(tc.write))
		if ok != tc.ok || why != tc.want {
			t.Errorf("%q: %v %v, want %v %v", tc.write, why, ok, tc.want, tc.ok)
		}
	}
}

// TestRefusalNames: every reason has its own name, a metric label.
func TestRefusalNames(t *testing.T) {
	seen := map[string]bool{}
	if len(Refusals) != NumRefusals {
		t.Fatalf("Refusals lists %d reasons, NumRefusals is %d", len(Refusals), NumRefusals)
	}
	for i, r := range Refusals {
		if int(r) != i || r.String() == "" || r.String() == "unknown" || seen[r.String()] {
			t.Errorf("reason %d: %q", r, r.String())
		}
		seen[r.String()] = true
	}
}
