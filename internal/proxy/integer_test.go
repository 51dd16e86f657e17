package proxy

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/openai"
)

// Every count the router reads (the parser's max_tokens and n, its own best_of) answers a bad
// value with the code OpenAI's API gives it and the words "must be an integer" where the value
// is no integer: before, best_of 2.0 and n 129 had code null, max_tokens 4e1 said "must be a
// number, not a JSON number 4e1".
func TestCountErrorsCoded(t *testing.T) {
	e := newFakeEngine(t)
	f := newFixture(t, spec(e.srv.URL, "m"))
	const msgs = `"messages":[{"role":"user","content":"x"}]`
	for _, tc := range []struct {
		path, body         string
		param, code, words string
	}{
		{"/v1/completions", `{"model":"m","prompt":"x","max_tokens":4e1}`, "max_tokens", "invalid_type", "max_tokens must be an integer, got 4e1"},
		{"/v1/completions", `{"model":"m","prompt":"x","max_tokens":40.5}`, "max_tokens", "invalid_type", "max_tokens must be an integer, got 40.5"},
		{"/v1/completions", `{"model":"m","prompt":"x","max_tokens":1e400}`, "max_tokens", "invalid_type", "max_tokens must be an integer, got 1e400"},
		{"/v1/completions", `{"model":"m","prompt":"x","max_tokens":99999999999999999999}`, "max_tokens", "integer_above_max_value", "max_tokens must be at most 9223372036854775807"},
		{"/v1/chat/completions", `{"model":"m",` + msgs + `,"n":2.5}`, "n", "invalid_type", "n must be an integer, got 2.5"},
		{"/v1/chat/completions", `{"model":"m",` + msgs + `,"n":129}`, "n", "integer_above_max_value", "n must be at most 128, got 129"},
		{"/v1/chat/completions", `{"model":"m",` + msgs + `,"max_completion_tokens":"9"}`, "max_completion_tokens", "invalid_type", "max_completion_tokens must be an integer, not a JSON string"},
		{"/v1/responses", `{"model":"m","input":"x","max_output_tokens":1.5}`, "max_output_tokens", "invalid_type", "max_output_tokens must be an integer, got 1.5"},
		{"/v1/completions", `{"model":"m","prompt":"x","best_of":2.0}`, "best_of", "invalid_type", "best_of must be an integer, got 2.0"},
		{"/v1/completions", `{"model":"m","prompt":"x","best_of":"3"}`, "best_of", "invalid_type", "best_of must be an integer, not a JSON string"},
		{"/v1/completions", `{"model":"m","prompt":"x","best_of":129}`, "best_of", "integer_above_max_value", "best_of must be at most 128, got 129"},
		{"/v1/completions", `{"model":"m","prompt":"x","best_of":100000000000000000000000}`, "best_of", "integer_above_max_value", "best_of must be at most 128"},
		{"/v1/completions", `{"model":"m","prompt":"x","best_of":0}`, "best_of", "integer_below_min_value", "best_of must be at least 1, got 0"},
		{"/v1/completions", `{"model":"m","prompt":"x","best_of":-3}`, "best_of", "integer_below_min_value", "best_of must be at least 1, got -3"},
	} {
		before := len(e.received())
		resp, b := f.post(t, tc.path, tc.body)
		var eb struct {
			Error struct{ Type, Param, Code, Message string } `json:"error"`
		}
		_ = json.Unmarshal(b, &eb)
		if resp.StatusCode != http.StatusBadRequest || eb.Error.Type != "invalid_request_error" || eb.Error.Param != tc.param ||
			eb.Error.Code != tc.code || !strings.Contains(eb.Error.Message, tc.words) {
			t.Errorf("%s: %d %s; want 400 invalid_request_error, param %s, code %s, saying %q", tc.body, resp.StatusCode, b, tc.param, tc.code, tc.words)
		}
		if sent := len(e.received()) - before; sent != 0 {
			t.Errorf("%s: the engine was sent %d request(s)", tc.body, sent)
		}
	}
}

// readOutputBound, the cap's second reading of the bounds, answers a value that is no integer
// as the parser does.
func TestReadOutputBoundNotInteger(t *testing.T) {
	for _, tc := range []struct{ body, code, words string }{
		{`{"max_tokens":4e1}`, "invalid_type", "max_tokens must be an integer, got 4e1"},
		{`{"max_completion_tokens":"5"}`, "invalid_type", "max_completion_tokens must be an integer, not a JSON string"},
		{`{"max_tokens":99999999999999999999}`, "integer_above_max_value", "max_tokens must be at most"},
	} {
		_, oe := readOutputBound(openai.KindChat, []byte(tc.body))
		if oe == nil || oe.Code == nil || *oe.Code != tc.code || !strings.Contains(oe.Message, tc.words) {
			t.Errorf("readOutputBound(%s): %+v; want code %s, saying %q", tc.body, oe, tc.code, tc.words)
		}
	}
}
