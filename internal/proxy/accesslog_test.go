package proxy

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/tenant"
	"github.com/kvroute/kvroute/internal/testlog"
)

// An unauthenticated request with a long path writes an access line of bounded length: the
// path cut to maxLogPath bytes at a character's start, the cut marked, its length logged.
func TestAccessLogPathBounded(t *testing.T) {
	f := newFixture(t, spec("http://127.0.0.1:1", "m"))
	var logs testlog.Buffer
	f.h.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
	f.h.Gate = tenantGate(t, f.h.Metrics.Tenant, `tenants: [{name: t1, api_keys: ["`+tenant.HashKey("sk-1")+`"]}]`)
	path := "/" + strings.Repeat("é", 50000) // two bytes each: a cut at 256 bytes splits one
	resp, _ := f.post(t, "/"+strings.Repeat("%C3%A9", 50000), "{}")
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("status %d, want 401", resp.StatusCode)
	}
	var line struct {
		Path      string `json:"path"`
		PathBytes int    `json:"path_bytes"`
		Status    int    `json:"status"`
	}
	out := logs.String()
	if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &line); err != nil {
		t.Fatalf("access line %.200q: %v", out, err)
	}
	if len(out) > 1024 {
		t.Errorf("access line of %d bytes for a %d-byte path", len(out), len(path))
	}
	want := path[:255] + "..." // '/' and 127 whole characters
	if line.Path != want || line.PathBytes != len(path) || line.Status != http.StatusUnauthorized {
		t.Errorf("logged path %q (%d bytes), path_bytes %d, status %d; want %q, %d, 401",
			line.Path, len(line.Path), line.PathBytes, line.Status, want, len(path))
	}
}

func TestLogCut(t *testing.T) {
	for _, tc := range []struct {
		in   string
		n    int
		want string
		cut  bool
	}{
		{"/v1/chat/completions", 256, "/v1/chat/completions", false},
		{"abcdef", 6, "abcdef", false},
		{"abcdefg", 6, "abcdef...", true},
		{"aé" + "xyz", 2, "a...", true},             // é is 2 bytes: not split
		{"a€b", 3, "a...", true},                    // € is 3 bytes
		{"ab€", 3, "ab...", true},                   // the cut falls at its start
		{"a\xff\xfe\xfdzzz", 4, "a\uFFFD...", true}, // bytes that are no UTF-8 at all
	} {
		got, cut := logCut(tc.in, tc.n)
		if got != tc.want || cut != tc.cut || !utf8.ValidString(got) {
			t.Errorf("logCut(%q, %d) = %q, %v; want %q, %v", tc.in, tc.n, got, cut, tc.want, tc.cut)
		}
	}
}

// With the access log off (log.access: false, under which the router's logger refuses info
// records), none of the access line is built: settling a request whose line would carry 10 KB
// of removed fields' names allocates next to nothing. With it on, the line is built (the names
// joined) and written.
func TestAccessLogOffBuildsNothing(t *testing.T) {
	removed := make([]string, 100)
	for i := range removed {
		removed[i] = fmt.Sprintf("%0100d", i)
	}
	perSettle := func(logger *slog.Logger) uint64 {
		f := newFixture(t, spec("http://127.0.0.1:1", "m"))
		f.h.Logger = logger
		f.h.once.Do(f.h.init)
		req, oe := parse(openai.KindChat, []byte(chatBody), nil)
		if oe != nil {
			t.Fatal(oe)
		}
		c := &call{h: f.h, rid: "r1", start: time.Now(), req: req, model: "m", cached: -1, timingsCached: -1,
			remote: "127.0.0.1:50000", removed: removed}
		c.settle(http.StatusOK, http.MethodPost, "/v1/chat/completions") // the metrics' series made
		const n = 50
		var m0, m1 runtime.MemStats
		runtime.ReadMemStats(&m0)
		for range n {
			c.settle(http.StatusOK, http.MethodPost, "/v1/chat/completions")
		}
		runtime.ReadMemStats(&m1)
		return (m1.TotalAlloc - m0.TotalAlloc) / n
	}
	off := perSettle(slog.New(slog.NewJSONHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelWarn})))
	var logs testlog.Buffer
	on := perSettle(slog.New(slog.NewJSONHandler(&logs, nil)))
	t.Logf("bytes allocated a request settled: %d with the access log off, %d on", off, on)
	if off >= 2<<10 {
		t.Errorf("access log off: %d bytes allocated a request settled, want under 2 KiB (the removed fields' names joined are 10 KB)", off)
	}
	if on < 10_000 {
		t.Errorf("access log on: %d bytes allocated a request settled, want the removed fields' names joined (10 KB) at least", on)
	}
	if n := logs.Count(`"removed_fields":"` + strings.Join(removed, ",") + `"`); n != 51 {
		t.Errorf("access log on: %d lines name the removed fields, want 51", n)
	}
}
