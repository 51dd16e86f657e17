package openai

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// A completion bound or n below 1 is a 400 naming the field, code integer_below_min_value, on
// both parsing paths: before, max_tokens -1 went on to the engine (llama.cpp and ollama read
// it as "until the context is full") and into the routed event, which the peers dropped as
// malformed. MaxTokens is the bound as the kind's engines read it: the larger of a chat
// request's max_tokens and max_completion_tokens, a completion's max_tokens, a Responses
// request's max_output_tokens; a member the kind's engines ignore bounds nothing.
func TestParseOutputBound(t *testing.T) {
	const msgs = `"messages":[{"role":"user","content":"x"}]`
	type res struct {
		MaxTokens   int
		Param, Code string
	}
	for _, tc := range []struct {
		kind Kind
		body string
		want res
	}{
		{KindChat, `{"model":"m",` + msgs + `,"max_tokens":-1}`, res{0, "max_tokens", "integer_below_min_value"}},
		{KindChat, `{"model":"m",` + msgs + `,"max_tokens":0}`, res{0, "max_tokens", "integer_below_min_value"}},
		{KindChat, `{"model":"m",` + msgs + `,"max_tokens":5,"max_completion_tokens":-3}`, res{0, "max_completion_tokens", "integer_below_min_value"}},
		{KindChat, `{"model":"m",` + msgs + `,"max_output_tokens":-1}`, res{0, "max_output_tokens", "integer_below_min_value"}},
		{KindChat, `{"model":"m",` + msgs + `,"n":0}`, res{0, "n", "integer_below_min_value"}},
		{KindChat, `{"model":"m",` + msgs + `,"n":-2}`, res{0, "n", "integer_below_min_value"}},
		{KindCompletion, `{"model":"m","prompt":"x","max_tokens":-1}`, res{0, "max_tokens", "integer_below_min_value"}},
		{KindResponse, `{"model":"m","input":"x","max_output_tokens":0}`, res{0, "max_output_tokens", "integer_below_min_value"}},
		{KindChat, `{"model":"m",` + msgs + `,"max_tokens":null}`, res{}},
		{KindChat, `{"model":"m",` + msgs + `,"max_tokens":5,"max_completion_tokens":7}`, res{MaxTokens: 7}},
		{KindChat, `{"model":"m",` + msgs + `,"max_tokens":9,"max_completion_tokens":7}`, res{MaxTokens: 9}},
		{KindChat, `{"model":"m",` + msgs + `,"max_output_tokens":1}`, res{}},
		{KindCompletion, `{"model":"m","prompt":"x","max_tokens":3,"max_completion_tokens":1}`, res{MaxTokens: 3}},
		{KindCompletion, `{"model":"m","prompt":"x","max_completion_tokens":1}`, res{}},
		{KindResponse, `{"model":"m","input":"x","max_output_tokens":16,"max_tokens":1}`, res{MaxTokens: 16}},
		{KindEmbedding, `{"model":"m","input":"x","max_tokens":4}`, res{}},
	} {
		for path, parse := range map[string]func(Kind, []byte) (*Request, error){"Parse": Parse, "parseDecoded": parseDecoded} {
			r, err := parse(tc.kind, []byte(tc.body))
			var got res
			var e *Error
			switch {
			case errors.As(err, &e):
				if e.Status != 400 || e.Param == nil || e.Code == nil {
					t.Errorf("%s(%s): %+v, want a 400 with a param and a code", path, tc.body, e)
					continue
				}
				got.Param, got.Code = *e.Param, *e.Code
			case err != nil:
				t.Errorf("%s(%s): %v", path, tc.body, err)
				continue
			default:
				got.MaxTokens = r.MaxTokens
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("%s(%v, %s) (-want +got):\n%s", path, tc.kind, tc.body, diff)
			}
		}
	}
}
