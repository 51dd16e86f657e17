package app

import (
	"log/slog"
	"strings"
	"testing"
)

// The admin listener's / and /debug/ list what it serves, instead of a bare 404.
func TestAdminIndex(t *testing.T) {
	e := newFakeEngine(t)
	r, err := NewRouter(routerConfig(t, "listen: 127.0.0.1:18080\n", e.srv.URL), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	admin := r.AdminHandler()
	for _, path := range []string{"/", "/debug/"} {
		code, body := get(t, admin, path)
		if code != 200 {
			t.Fatalf("%s: %d %s", path, code, body)
		}
		for _, want := range []string{"GET  /metrics", "GET  /healthz", "GET  /readyz", "GET  /debug/endpoints", "POST /debug/explain", "127.0.0.1:18080"} {
			if !strings.Contains(body, want) {
				t.Errorf("%s does not list %q:\n%s", path, want, body)
			}
		}
		if strings.Contains(body, "/debug/pprof/") || strings.Contains(body, "/debug/peers") {
			t.Errorf("%s lists what is not served:\n%s", path, body)
		}
	}
	if code, _ := get(t, admin, "/nothing"); code != 404 {
		t.Errorf("/nothing: %d, want 404", code)
	}
}
