package app

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
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

// /readyz says whether a request could be routed now: an endpoint that passes its health checks
// but that passive health checking has ejected takes none, so a router whose every such
// endpoint is ejected is not ready, unless the first of them is back within readyGrace (a load
// balancer would take the router out about when it could serve again). Once it has said so, it
// stays not ready until an endpoint can take a request: it does not come back ahead of them.
func TestReadyzEjected(t *testing.T) {
	a, b := newFakeEngine(t), newFakeEngine(t)
	r, err := NewRouter(routerConfig(t, "", a.srv.URL, b.srv.URL), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	admin := r.AdminHandler()
	ea, eb := r.pool.ByName(a.srv.URL), r.pool.ByName(b.srv.URL)
	readyz := func(step string, want int, wantBody string) {
		t.Helper()
		code, body := get(t, admin, "/readyz")
		if code != want || !strings.Contains(body, wantBody) {
			t.Errorf("%s: /readyz %d %q, want %d with %q", step, code, body, want, wantBody)
		}
	}
	readyz("both endpoints up", 200, "ready")
	eb.SetHealthy(false) // its health checks fail: a is the one endpoint that can take requests
	readyz("b unhealthy", 200, "ready")
	if r.outlier.PeerEjected(ea, time.Minute) {
		t.Fatal("a, the last endpoint that can take requests, was ejected")
	}
	eb.SetHealthy(true)
	if !r.outlier.PeerEjected(ea, time.Minute) {
		t.Fatal("a was not ejected")
	}
	eb.SetHealthy(false) // then b's checks fail: no endpoint can take a request
	readyz("a ejected for a minute, b unhealthy", 503, "ejected")
	rec := httptest.NewRecorder()
	r.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(chatBody)))
	if rec.Code != 503 {
		t.Errorf("a request while not ready: %d, want 503 (were it not, /readyz would be wrong)", rec.Code)
	}

	// Said once, it holds until an endpoint can take a request, even where the first ejection
	// then ends within the grace.
	r.outlier.Forget(ea)
	eb.SetHealthy(true)
	if !r.outlier.PeerEjected(ea, 3*time.Second) {
		t.Fatal("a was not ejected again")
	}
	eb.SetHealthy(false)
	readyz("a's ejection now ends within the grace", 503, "ejected")
	eb.SetHealthy(true)
	readyz("b healthy again", 200, "ready")

	// A short outage: every endpoint that passes its checks is ejected, for less than the grace.
	r.outlier.Forget(ea)
	if !r.outlier.PeerEjected(ea, 3*time.Second) {
		t.Fatal("a was not ejected for 3 s")
	}
	eb.SetHealthy(false)
	readyz("a ejected for 3 s, b unhealthy", 200, "ready")
	r.outlier.Forget(ea)
	readyz("a back", 200, "ready")

	// No endpoint passes its health checks: not ready, as before.
	ea.SetHealthy(false)
	readyz("both unhealthy", 503, "no available endpoint")
}
