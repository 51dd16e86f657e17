package proxy

import (
	"encoding/json"
	"math"
	"net/http"
	"testing"
)

// A completion bound, n or best_of out of range is refused with 400 naming the field, for
// every client (tenants or not), and reaches no engine nor the policy. Before, max_tokens -1
// went to the engine (llama.cpp and ollama: "until the context is full") and, in the routed
// event, to the peers, which dropped it as malformed. A huge max_tokens over several prompts
// reaches the policy as math.MaxInt32, not wrapped.
func TestCountsOutOfRange(t *testing.T) {
	e := newBodyEngine(t)
	f := newFixture(t, spec(e.srv.URL, "m"))
	const msgs = `"messages":[{"role":"user","content":"x"}]`
	for _, tc := range []struct{ path, body, param string }{
		{"/v1/chat/completions", `{"model":"m",` + msgs + `,"max_tokens":-1}`, "max_tokens"},
		{"/v1/chat/completions", `{"model":"m",` + msgs + `,"max_completion_tokens":0}`, "max_completion_tokens"},
		{"/v1/chat/completions", `{"model":"m",` + msgs + `,"n":0}`, "n"},
		{"/v1/chat/completions", `{"model":"m",` + msgs + `,"n":129}`, "n"},
		{"/v1/completions", `{"model":"m","prompt":"x","max_tokens":-1}`, "max_tokens"},
		{"/v1/completions", `{"model":"m","prompt":"x","best_of":0}`, "best_of"},
		{"/v1/completions", `{"model":"m","prompt":"x","best_of":-1}`, "best_of"},
		{"/v1/responses", `{"model":"m","input":"x","max_output_tokens":-1}`, "max_output_tokens"},
	} {
		resp, b := f.post(t, tc.path, tc.body)
		var eb struct {
			Error struct{ Type, Param string } `json:"error"`
		}
		_ = json.Unmarshal(b, &eb)
		if resp.StatusCode != http.StatusBadRequest || eb.Error.Type != "invalid_request_error" || eb.Error.Param != tc.param {
			t.Errorf("%s: %d %s; want 400 invalid_request_error naming %s", tc.body, resp.StatusCode, b, tc.param)
		}
	}
	if sent := e.take(); len(sent) != 0 {
		t.Errorf("the engine was sent %d request(s): %s", len(sent), sent)
	}
	if len(f.pk.reqs) != 0 {
		t.Errorf("the policy was asked to pick for %d request(s)", len(f.pk.reqs))
	}

	resp, b := f.post(t, "/v1/completions", `{"model":"m","prompt":["a","b","c"],"max_tokens":4611686018427387903}`)
	if resp.StatusCode != http.StatusOK || len(f.pk.reqs) != 1 || f.pk.reqs[0].MaxTokens != math.MaxInt32 {
		t.Errorf("max_tokens 2^62 over 3 prompts: %d %s, policy requests %+v; want 200 and MaxTokens %d", resp.StatusCode, b, f.pk.reqs, math.MaxInt32)
	}
}
