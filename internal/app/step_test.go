package app

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// /debug/endpoints says each endpoint's step budget in force and where it comes from, as the
// policy follows it: configured, the engine's default, or the policy's step_tokens; nothing
// for a policy that follows no steps.
func TestDebugEndpoints_StepTokens(t *testing.T) {
	a, b, c := newFakeEngine(t), newFakeEngine(t), newFakeEngine(t)
	type step struct {
		Tokens *int   `json:"step_tokens"`
		Source string `json:"step_tokens_source"`
	}
	n := func(v int) *int { return &v }
	for _, tc := range []struct {
		policy string
		want   []step
	}{
		{"{name: prefix-aware, params: {step_tokens: 4096}}", []step{{n(16384), "configured"}, {n(512), "engine default"}, {n(4096), "policy"}}},
		{"{name: prefix-aware, params: {step_tokens: 0}}", []step{{n(0), "policy"}, {n(0), "policy"}, {n(0), "policy"}}},
		{"{name: round-robin}", []step{{}, {}, {}}},
	} {
		t.Run(tc.policy, func(t *testing.T) {
			r := routerFromYAML(t, fmt.Sprintf(`scrape: {disabled: true}
health: {interval: 1h}
policy: %s
endpoints:
  - {url: %q, models: [m], engine: sglang, step_tokens: 16384}
  - {url: %q, models: [m], engine: ollama}
  - {url: %q, models: [m], engine: vllm}
`, tc.policy, a.srv.URL, b.srv.URL, c.srv.URL))
			code, body := get(t, r.AdminHandler(), "/debug/endpoints")
			var dbg struct {
				Endpoints []step `json:"endpoints"`
			}
			if err := json.Unmarshal([]byte(body), &dbg); err != nil || code != 200 {
				t.Fatalf("/debug/endpoints %d %s: %v", code, body, err)
			}
			if diff := cmp.Diff(tc.want, dbg.Endpoints); diff != "" {
				t.Errorf("step budgets (-want +got):\n%s", diff)
			}
		})
	}
}

// An endpoint whose engine reports its step budget (SGLang's chunked_prefill_size) shows it in
// /debug/endpoints as reported, with the answer it came from, and a configured one still wins.
func TestDebugEndpoints_StepTokensReported(t *testing.T) {
	sglang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/health":
		case "/server_info":
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"model_path": "m", "max_prefill_tokens": 16384, "chunked_prefill_size": 6144, "internal_states": [{"load": 0}], "version": "0.4.9"}`))
		default:
			http.NotFound(w, r)
		}
	}))
	defer sglang.Close()
	other := httptest.NewServer(sglang.Config.Handler)
	defer other.Close()
	r := routerFromYAML(t, fmt.Sprintf(`scrape: {disabled: true}
health: {interval: 1h}
policy: {name: prefix-aware, params: {step_tokens: 4096}}
endpoints:
  - {url: %q, models: [m], engine: sglang}
  - {url: %q, models: [m], engine: sglang, step_tokens: 2048}
`, sglang.URL, other.URL))
	runRouter(t, r)
	type step struct {
		Tokens *int   `json:"step_tokens"`
		Source string `json:"step_tokens_source"`
		Probe  struct {
			StepReport string `json:"step_report"`
		} `json:"probe"`
	}
	n := func(v int) *int { return &v }
	want := []step{{Tokens: n(6144), Source: "reported"}, {Tokens: n(2048), Source: "configured"}}
	want[0].Probe.StepReport = "GET /server_info: chunked_prefill_size 6144"
	want[1].Probe.StepReport = "GET /server_info: chunked_prefill_size 6144"
	var got []step
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		code, body := get(t, r.AdminHandler(), "/debug/endpoints")
		var dbg struct {
			Endpoints []step `json:"endpoints"`
		}
		if err := json.Unmarshal([]byte(body), &dbg); err != nil || code != 200 {
			t.Fatalf("/debug/endpoints %d %s: %v", code, body, err)
		}
		if got = dbg.Endpoints; cmp.Equal(want, got) {
			return
		}
	}
	t.Errorf("step budgets (-want +got):\n%s", cmp.Diff(want, got))
}
