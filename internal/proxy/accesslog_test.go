package proxy

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"unicode/utf8"

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
