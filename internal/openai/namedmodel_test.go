package openai

import (
	"strings"
	"testing"
)

// NamedModel finds the model of a body that Parse refuses, so that the refusal is counted under
// it: the top-level "model" member, wherever it is, up to the first thing that is not JSON.
func TestNamedModel(t *testing.T) {
	tests := []struct{ body, want string }{
		{`{"model":"llama3-70b","messages":"x"}`, "llama3-70b"},
		{`{"messages":[{"role":"user","content":{"a":[1,2,"]"]}}],"model":"m"}`, "m"},
		{` {"max_tokens":-1, "model" : "m\u0031"}`, "m1"},
		{`{"model":"m","messages":`, "m"},    // cut after the model
		{`{"messages":tru,"model":"m"}`, ""}, // not JSON before it
		{`{"model":7}`, ""},
		{`{"model":null}`, ""},
		{`{"meta":{"model":"inner"}}`, ""}, // not the top level
		{`{"model":"a","model":"b"}`, "a"},
		{`["model","m"]`, ""},
		{`"model"`, ""},
		{``, ""},
		{`{"Model":"m"}`, ""}, // Parse refuses the case-folded key; not read as the model
		{`{"prompt":"` + strings.Repeat("x", 1<<20) + `","model":"big"}`, "big"},
	}
	for _, tt := range tests {
		name := tt.body
		if len(name) > 60 {
			name = name[:60]
		}
		if got := NamedModel([]byte(tt.body)); got != tt.want {
			t.Errorf("NamedModel(%s) = %q, want %q", name, got, tt.want)
		}
	}
}

// The refusal of an empty messages array (OpenAI's "[] is too short - 'messages'") is a chat's
// alone: a Responses request's input may be an empty array of items, and a completion's and an
// embedding's empty prompts keep their own refusals, naming their own fields.
func TestEmptyArraysOfOtherKinds(t *testing.T) {
	for _, body := range []string{`{"model":"m","input":[]}`, `{"model":"m","input":[],"previous_response_id":"resp_1"}`} {
		if _, err := Parse(KindResponse, []byte(body)); err != nil {
			t.Errorf("responses %s: %v, want it taken", body, err)
		}
	}
	for _, tc := range []struct {
		kind  Kind
		body  string
		param string
	}{
		{KindChat, `{"model":"m","messages":[]}`, "messages"},
		{KindCompletion, `{"model":"m","prompt":[]}`, "prompt"},
		{KindEmbedding, `{"model":"m","input":[]}`, "input"},
	} {
		_, err := Parse(tc.kind, []byte(tc.body))
		e, ok := err.(*Error)
		if !ok || e.Status != 400 || e.Type != TypeInvalidRequest || e.Param == nil || *e.Param != tc.param {
			t.Errorf("%v %s: %v, want a 400 invalid_request_error naming %s", tc.kind, tc.body, err, tc.param)
		}
	}
}
