package scrape

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/testlog"
)

// routerLike answers as kvroute's API listener does, naming its instance in every answer: a
// model list at /v1/models (owned_by kvroute), 404 unknown_url elsewhere.
func routerLike(t *testing.T, instance string) *httptest.Server {
	t.Helper()
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(InstanceHeader, instance)
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path == "/v1/models" {
			_, _ = w.Write([]byte(`{"object":"list","data":[{"id":"m","object":"model","created":0,"owned_by":"kvroute"}]}`))
			return
		}
		w.WriteHeader(http.StatusNotFound)
		_, _ = w.Write([]byte(`{"error":{"message":"unknown path","type":"invalid_request_error","param":null,"code":"unknown_url"}}`))
	}))
	t.Cleanup(s.Close)
	return s
}

// An endpoint that is the prober's own router (the discovery lists the router's address) fails
// its first check and leaves rotation at once, whatever the thresholds, before any request is
// sent there; named, or auto (which took the router for a generic OpenAI server), the same.
// Said once as a warning while it lasts. Another router (a second tier) is an endpoint like
// any other.
func TestProber_Itself(t *testing.T) {
	for _, engine := range []string{"openai", "auto", "vllm"} {
		t.Run(engine, func(t *testing.T) {
			self := routerLike(t, "r-self")
			pool, ep := onePool(t, endpoint.Spec{Name: self.URL, Engine: engine, Models: []string{"m"}})
			var log testlog.Buffer
			pr := New(pool, self.Client(), Options{UnhealthyThreshold: 3}, slog.New(slog.NewJSONHandler(&log, nil)))
			pr.Instance = "r-self"
			ep.SetHealthy(true)
			pr.st(ep).checked = true // past the first check, which decides alone: the thresholds would hold it
			for i := range 3 {
				err := pr.Check(context.Background(), ep)
				if !errors.Is(err, errItself) || ep.Healthy() {
					t.Fatalf("check %d: err %v, healthy %v; want the routing loop's error, unhealthy at once", i, err, ep.Healthy())
				}
			}
			if got := pr.Status(ep).LastCheckError; got != "this endpoint is this router itself (a routing loop: the discovery lists the router's own address)" {
				t.Errorf("last check error %q", got)
			}
			if o := pr.options(); pr.healthInterval(ep, o) != o.HealthInterval {
				t.Errorf("checked again after %v, want health.interval (%v): the router itself is not coming up", pr.healthInterval(ep, o), o.HealthInterval)
			}
			if ep.Kind() == "openai" && engine == "auto" {
				t.Errorf("auto detected the router itself as %q", ep.Kind())
			}
			var said []string
			for _, w := range warnings(t, &log) {
				if strings.Contains(w, "this router itself") {
					said = append(said, w)
				}
			}
			if len(said) != 1 || len(warnings(t, &log)) != 1 {
				t.Errorf("warnings %q, want the routing loop said once and nothing else", warnings(t, &log))
			}
		})
	}
	t.Run("another router", func(t *testing.T) {
		other := routerLike(t, "r-other")
		pool, ep := onePool(t, endpoint.Spec{Name: other.URL, Engine: "openai", Models: []string{"m"}})
		pr := New(pool, other.Client(), Options{}, nil)
		pr.Instance = "r-self"
		if err := pr.Check(context.Background(), ep); err != nil || !ep.Healthy() {
			t.Fatalf("check of a router in front of engines: %v, healthy %v; want healthy", err, ep.Healthy())
		}
		if diff := cmp.Diff("", pr.Status(ep).LastCheckError); diff != "" {
			t.Errorf("last check error (-want +got):\n%s", diff)
		}
	})
}
