package proxy

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/metrics"
	"github.com/kvroute/kvroute/internal/route"
	"github.com/kvroute/kvroute/internal/scrape"
	"github.com/kvroute/kvroute/internal/tenant"
)

// durationCount is how many requests kvroute_request_duration_seconds observed for model.
func durationCount(t *testing.T, f *fixture, model string) uint64 {
	t.Helper()
	mfs, err := f.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "kvroute_request_duration_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "model" && l.GetValue() == model {
					return m.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	return 0
}

// GET /v1/models is no inference request: it is answered, logged, and counted in none of the
// request metrics (it was kvroute_requests_total{model="unknown",endpoint="none",status="200"},
// a duration under unknown and, with tenants, the tenant's 200), so that a client polling the
// list neither adds to the request rate nor dilutes the error ratio the alerts divide by. Its
// refusals still count, as every refusal does.
func TestModelListNotCounted(t *testing.T) {
	e := newFakeEngine(t)
	f := newFixture(t, spec(e.srv.URL, "m"))
	f.h.Gate = tenantGate(t, f.h.Metrics.Tenant, `tenants:
  - {name: t1, api_keys: ["`+tenant.HashKey("sk-1")+`"]}
`)
	for range 3 {
		req, err := http.NewRequest(http.MethodGet, f.srv.URL+"/v1/models", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer sk-1")
		resp, err := f.srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var list struct {
			Data []struct{ ID string } `json:"data"`
		}
		err = json.NewDecoder(resp.Body).Decode(&list)
		resp.Body.Close()
		f.wait(t)
		if resp.StatusCode != 200 || err != nil || len(list.Data) != 1 || list.Data[0].ID != "m" {
			t.Fatalf("GET /v1/models: %d %+v %v, want 200 listing m", resp.StatusCode, list, err)
		}
	}
	if n := testutil.ToFloat64(f.h.Metrics.Requests.WithLabelValues(metrics.UnknownModel, metrics.NoEndpoint, "200")); n != 0 {
		t.Errorf("kvroute_requests_total{model=unknown,endpoint=none,status=200} = %v after 3 model lists, want 0", n)
	}
	if n := durationCount(t, f, metrics.UnknownModel); n != 0 {
		t.Errorf("kvroute_request_duration_seconds{model=unknown} observed %d, want 0", n)
	}
	if n := testutil.ToFloat64(f.h.Metrics.Tenant.Requests.WithLabelValues("t1", "200")); n != 0 {
		t.Errorf("kvroute_tenant_requests_total{tenant=t1,status=200} = %v after 3 model lists, want 0", n)
	}
	// Without a key: refused, and counted as a refusal.
	resp, err := f.srv.Client().Get(f.srv.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	f.wait(t)
	if resp.StatusCode != 401 {
		t.Fatalf("GET /v1/models without a key: %d, want 401", resp.StatusCode)
	}
	if n := testutil.ToFloat64(f.h.Metrics.Requests.WithLabelValues(metrics.UnknownModel, metrics.NoEndpoint, "401")); n != 1 {
		t.Errorf("kvroute_requests_total{status=401} = %v, want 1", n)
	}
	// An inference request is counted as before.
	if resp, body := f.post(t, "/v1/chat/completions", chatBody, "Authorization", "Bearer sk-1"); resp.StatusCode != 200 {
		t.Fatalf("chat: %d %s", resp.StatusCode, body)
	}
	if n := testutil.ToFloat64(f.h.Metrics.Requests.WithLabelValues("m", e.srv.URL, "200")); n != 1 {
		t.Errorf("kvroute_requests_total{model=m,status=200} = %v, want 1", n)
	}
}

// A body refused with 400 once its model was read is counted under that model, in the series
// made for its refusals ({model="m",endpoint="none",status="400"}), not under unknown; a
// model no endpoint serves, or one outside the tenant's models, stays unknown, which bounds
// the labels.
func TestBadBodyCountedUnderItsModel(t *testing.T) {
	e := newFakeEngine(t)
	f := newFixture(t, spec(e.srv.URL, "m"))
	f.h.Gate = tenantGate(t, f.h.Metrics.Tenant, `tenants:
  - {name: t1, api_keys: ["`+tenant.HashKey("sk-1")+`"]}
  - {name: t2, api_keys: ["`+tenant.HashKey("sk-2")+`"], models: [other]}
`)
	bodies := []struct {
		body, key, model string
	}{
		{`{"model":"m","messages":"x"}`, "sk-1", "m"},
		{`{"messages":[{"role":"user","content":7}],"model":"m"}`, "sk-1", "m"},
		{`{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":-1}`, "sk-1", "m"},
		{`{"model":"m","messages":[]}`, "sk-1", "m"},
		{`{"model":"nope","messages":"x"}`, "sk-1", metrics.UnknownModel},
		{`{"model":"m","messages":"x"}`, "sk-2", metrics.UnknownModel},
		{`{"model":"m","messages":`, "sk-1", "m"},
		{`{"messages":tru,"model":"m"}`, "sk-1", metrics.UnknownModel},
	}
	want := map[string]float64{}
	for _, b := range bodies {
		resp, got := f.post(t, "/v1/chat/completions", b.body, "Authorization", "Bearer "+b.key)
		if resp.StatusCode != 400 {
			t.Fatalf("%s: %d %s, want 400", b.body, resp.StatusCode, got)
		}
		want[b.model]++
	}
	for _, model := range []string{"m", metrics.UnknownModel} {
		if n := testutil.ToFloat64(f.h.Metrics.Requests.WithLabelValues(model, metrics.NoEndpoint, "400")); n != want[model] {
			t.Errorf("kvroute_requests_total{model=%q,endpoint=none,status=400} = %v, want %v", model, n, want[model])
		}
	}
	if n := len(e.received()); n != 0 {
		t.Errorf("the engine received %d requests, want none", n)
	}
}

// When passive health checking has ejected every endpoint serving the model (their engines
// refused the connections), the 503 says so in counts, as when their health checks fail: it
// was "no endpoint can take the request". No endpoint's address is in it; type and code are
// unchanged. One healthy but ejected and one failing its health check are both said.
func TestAllEjectedSaysWhy(t *testing.T) {
	dead1, dead2 := deadURL(t), deadURL(t)
	// An endpoint of another model up: passive health checking never ejects the last endpoint
	// standing.
	e := newFakeEngine(t)
	f := newFixture(t, spec(dead1, "m"), spec(dead2, "m"), spec(e.srv.URL, "other"))
	lc, err := route.New(route.Config{Picker: f.pk, Attempts: 3,
		Health: route.NewOutlier(route.OutlierConfig{Consecutive: 1, MaxEjectedPercent: 100, BaseEjection: time.Hour,
			Fleet: func() int { return len(f.pool.All()) }}, nil)})
	if err != nil {
		t.Fatal(err)
	}
	f.h.Lifecycle = lc
	// The first request tries both, each refusing its connection: both ejected.
	if resp, body := f.post(t, "/v1/chat/completions", chatBody); resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("first request: %d %s, want 502", resp.StatusCode, body)
	}
	for _, ep := range f.pool.All()[:2] {
		if !lc.Health().Ejected(ep, time.Now()) {
			t.Fatalf("%s not ejected after a refused connection", ep.Name)
		}
	}
	check := func(want string) {
		t.Helper()
		resp, body := f.post(t, "/v1/chat/completions", chatBody)
		if resp.StatusCode != 503 || errorCode(body) != "no_healthy_endpoint" || resp.Header.Get("Retry-After") == "" {
			t.Fatalf("%d %s, want 503 no_healthy_endpoint with Retry-After", resp.StatusCode, body)
		}
		var v struct {
			Error struct{ Message, Type string } `json:"error"`
		}
		if err := json.Unmarshal(body, &v); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(v.Error.Message, want) || v.Error.Type != "service_unavailable_error" {
			t.Errorf("message %q (type %s), want it to say %q", v.Error.Message, v.Error.Type, want)
		}
		for _, u := range []string{dead1, dead2, "127.0.0.1"} {
			if strings.Contains(v.Error.Message, u) {
				t.Errorf("message %q names an endpoint (%s)", v.Error.Message, u)
			}
		}
	}
	check(`no healthy endpoint serves model "m": 2 endpoints serve it, none available now (2 ejected after failed requests); retry shortly`)
	f.pool.ByName(dead2).SetHealthy(false) // its health checks now fail too
	check(`no healthy endpoint serves model "m": 2 endpoints serve it, none available now (1 ejected after failed requests, 1 failing its health check); retry shortly`)
	f.h.CheckFailure = func(*endpoint.Endpoint) (scrape.CheckFailure, bool) { return scrape.CheckFailure{Refused: true}, true }
	check(`no healthy endpoint serves model "m": 2 endpoints serve it, none available now (1 ejected after failed requests, 1 failing its health check: connection refused); retry shortly`)
	if n := testutil.ToFloat64(f.h.Metrics.Requests.WithLabelValues("m", metrics.NoEndpoint, "503")); n != 3 {
		t.Errorf("kvroute_requests_total{model=m,endpoint=none,status=503} = %v, want 3", n)
	}
}

// Where the application says how the endpoints' health checks failed (Handler.CheckFailure),
// the 503 says it in counts, by cause: one cause for all after a colon, else each cause's count;
// an endpoint whose check is not known to have failed is counted without one.
func TestHealthCheckCausesSaid(t *testing.T) {
	urls := []string{deadURL(t), deadURL(t), deadURL(t), deadURL(t)}
	tests := []struct {
		name   string
		causes []scrape.CheckFailure // by endpoint; the zero value: not known to have failed
		want   string
	}{
		{"all refused", []scrape.CheckFailure{{Refused: true}, {Refused: true}, {Refused: true}, {Refused: true}},
			"(4 failing their health checks: connection refused)"},
		{"mixed", []scrape.CheckFailure{{Refused: true}, {Status: 503}, {Refused: true}, {Timeout: true}},
			"(4 failing their health checks (2 connection refused, 1 answered 503, 1 timed out))"},
		{"some unknown", []scrape.CheckFailure{{Timeout: true}, {}, {Timeout: true}, {Status: 404, Timeout: true}},
			"(4 failing their health checks (3 timed out))"},
		{"none known", []scrape.CheckFailure{{}, {}, {}, {}},
			"(4 failing their health checks); retry shortly"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var specs []endpoint.Spec
			for _, u := range urls {
				specs = append(specs, spec(u, "m"))
			}
			f := newFixture(t, specs...)
			for _, e := range f.pool.All() {
				e.SetHealthy(false)
			}
			f.h.CheckFailure = func(e *endpoint.Endpoint) (scrape.CheckFailure, bool) {
				i := slices.Index(urls, e.Name)
				return tt.causes[i], tt.causes[i] != scrape.CheckFailure{}
			}
			resp, body := f.post(t, "/v1/chat/completions", chatBody)
			if resp.StatusCode != 503 || errorCode(body) != "no_healthy_endpoint" {
				t.Fatalf("%d %s, want 503 no_healthy_endpoint", resp.StatusCode, body)
			}
			var v struct {
				Error struct{ Message string } `json:"error"`
			}
			if err := json.Unmarshal(body, &v); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(v.Error.Message, tt.want) {
				t.Errorf("message %q, want it to say %q", v.Error.Message, tt.want)
			}
			if strings.Contains(v.Error.Message, "127.0.0.1") {
				t.Errorf("message %q names an endpoint", v.Error.Message)
			}
		})
	}
}
