package openai

import (
	"errors"
	"strings"
	"testing"
)

// TestBodyNotAnObject: a body that is valid JSON of another kind than an object is refused with
// a 400 that says the body must be a JSON object and which kind it is. Before, a bare array's
// said "json: cannot unmarshal array into Go value of type openai.wire" (the QA's array-body).
func TestBodyNotAnObject(t *testing.T) {
	for _, tc := range []struct{ body, kind string }{
		{`[]`, "array"},
		{`[{"model":"m","messages":[{"role":"user","content":"x"}]}]`, "array"},
		{` "a prompt" `, "string"},
		{`42`, "number"},
		{`true`, "boolean"},
	} {
		for _, kind := range []Kind{KindChat, KindCompletion, KindEmbedding, KindResponse} {
			_, err := Parse(kind, []byte(tc.body))
			var oe *Error
			if !errors.As(err, &oe) {
				t.Fatalf("%s %s: got %v, want an *Error", kind, tc.body, err)
			}
			want := "the request body must be a JSON object, not a JSON " + tc.kind
			if oe.Status != 400 || oe.Message != want || strings.Contains(oe.Message, "Go ") {
				t.Errorf("%s %s: %d %q; want 400 %q", kind, tc.body, oe.Status, oe.Message, want)
			}
		}
	}
}
