package scrape

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/internal/endpoint"
)

// TestProber_OnModels, step by step: the hook hears what the engine of an endpoint without a
// model list lists, at each reading of the list, and nothing of an endpoint whose config names
// its models.
func TestProber_OnModels(t *testing.T) {
	var list atomic.Value
	list.Store(`{"object":"list","data":[{"id":"b"},{"id":"a"}]}`)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/health":
		case "/v1/models":
			_, _ = io.WriteString(w, list.Load().(string))
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	now := time.Unix(1_700_000_000, 0)
	type heard struct {
		ep     *endpoint.Endpoint
		models []string
	}
	var got []heard
	hook := func(ep *endpoint.Endpoint, models []string) { got = append(got, heard{ep, models}) }
	check := func(step string, pr *Prober, ep *endpoint.Endpoint, want []heard) {
		t.Helper()
		got = nil
		if err := pr.Check(context.Background(), ep); err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		if diff := cmp.Diff(want, got, cmp.AllowUnexported(heard{}), cmp.Comparer(func(a, b *endpoint.Endpoint) bool { return a == b })); diff != "" {
			t.Errorf("%s: the hook heard (-want +got):\n%s", step, diff)
		}
	}

	pool, ep := onePool(t, endpoint.Spec{Name: srv.URL, Engine: "vllm"})
	pr := New(pool, srv.Client(), Options{Now: func() time.Time { return now }}, nil)
	pr.OnModels = hook
	check("first check", pr, ep, []heard{{ep, []string{"b", "a"}}})
	check("again at once: the list is not asked", pr, ep, nil)
	list.Store(`{"object":"list","data":[{"id":"c"}]}`)
	now = now.Add(modelsEvery)
	check("the engine's list changed", pr, ep, []heard{{ep, []string{"c"}}})
	now = now.Add(modelsEvery)
	check("unchanged, asked again", pr, ep, []heard{{ep, []string{"c"}}})
	list.Store(`{"object":"list","data":[]}`)
	now = now.Add(modelsEvery)
	check("an empty list keeps what was known", pr, ep, nil)
	if diff := cmp.Diff([]string{"c"}, ep.ServedModels()); diff != "" {
		t.Errorf("served models (-want +got):\n%s", diff)
	}

	list.Store(`{"object":"list","data":[{"id":"m"}]}`)
	pool2, configured := onePool(t, endpoint.Spec{Name: srv.URL, Engine: "vllm", Models: []string{"m"}})
	pr2 := New(pool2, srv.Client(), Options{}, nil)
	pr2.OnModels = hook
	check("an endpoint with a model list", pr2, configured, nil)
}
