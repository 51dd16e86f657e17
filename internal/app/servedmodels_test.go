package app

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/internal/simserver"
)

// TestServedModelsAutoscale: the README quick start (`kvroute serve --endpoint URL ...`, no
// models: engine auto) in front of two simulated vLLM engines serving llama3-70b. The load KEDA
// scales on is exported under that model, the label of the requests, not under "other";
// /debug/endpoints shows what each engine serves and the kind detected.
func TestServedModelsAutoscale(t *testing.T) {
	var urls []string
	for i := range 2 {
		in, err := simserver.New(simserver.Options{Profile: "llama3-8b-h100-tp1", Model: "llama3-70b", Seed: uint64(i + 1), Name: fmt.Sprint("e", i)})
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(in.Handler())
		t.Cleanup(func() { srv.Close(); _ = in.Close() })
		urls = append(urls, srv.URL)
	}
	r := routerFromYAML(t, fmt.Sprintf(`auth: {mode: none}
scrape: {interval: 50ms}
health: {interval: 1h, warm_up: 0s}
autoscale: {window: 1s}
endpoints:
  - {url: %q, engine: auto}
  - {url: %q, engine: auto}
`, urls[0], urls[1]))
	runRouter(t, r)
	type info struct {
		Name       string   `json:"name"`
		Engine     string   `json:"engine"`
		EngineKind string   `json:"engine_kind"`
		Models     []string `json:"models"`
		Served     []string `json:"served_models"`
	}
	want := []info{
		{Name: urls[0], Engine: "auto", EngineKind: "vllm", Models: []string{}, Served: []string{"llama3-70b"}},
		{Name: urls[1], Engine: "auto", EngineKind: "vllm", Models: []string{}, Served: []string{"llama3-70b"}},
	}
	var got []info
	for deadline := time.Now().Add(10 * time.Second); !cmp.Equal(want, got); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("/debug/endpoints after 10s (-want +got):\n%s", cmp.Diff(want, got))
		}
		code, body := get(t, r.AdminHandler(), "/debug/endpoints")
		var dbg struct {
			Endpoints []info `json:"endpoints"`
		}
		if err := json.Unmarshal([]byte(body), &dbg); err != nil || code != 200 {
			t.Fatalf("/debug/endpoints %d %s: %v", code, body, err)
		}
		got = dbg.Endpoints
	}
	api := r.Handler()
	for i := range 4 {
		rec := httptest.NewRecorder()
		body := fmt.Sprintf(`{"model":"llama3-70b","max_tokens":4,"messages":[{"role":"user","content":"question %d: %s"}]}`, i, strings.Repeat("context ", 200))
		api.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body)))
		if rec.Code != 200 {
			t.Fatalf("request %d: %d %s", i, rec.Code, rec.Body)
		}
	}
	// Each scrape of /metrics samples the engines' counters; two with new snapshots between
	// them make the load.
	var text string
	waitUntil(t, "kvroute_model_load{model=\"llama3-70b\"} exported", func() bool {
		_, text = get(t, r.AdminHandler(), "/metrics")
		return strings.Contains(text, `kvroute_model_load{model="llama3-70b"}`)
	})
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, "kvroute_model_") && strings.Contains(line, `model="other"`) {
			t.Errorf("/metrics: %s, want the engines' load under llama3-70b alone", line)
		}
	}
	for _, want := range []string{`kvroute_model_saturation{model="llama3-70b"}`, `kvroute_model_prefill_demand_tokens_per_second{model="llama3-70b"}`, `kvroute_requests_total{endpoint="` + urls[0] + `",model="llama3-70b",status="200"}`} {
		if !strings.Contains(text, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}
