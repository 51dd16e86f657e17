package openai

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestUsageMember(t *testing.T) {
	z := `"usage":{"prompt_tokens":0,"completion_tokens":0,"total_tokens":0}`
	for _, tc := range []struct {
		in, want string // want "": not ok
	}{
		{`{"id":"c","choices":[{"text":"a"}],` + z + `}`, `{"id":"c","choices":[{"text":"a"}]}`},
		{`{` + z + `,"id":"c","choices":[]}`, `{"id":"c","choices":[]}`},
		{`{` + z + `}`, `{}`},
		{`{"a":1 , "usage" : null , "b":2}`, `{"a":1 , "b":2}`},
		{` {"a":"\"usage\":1","usage":[1,2]} `, ` {"a":"\"usage\":1"} `},
		{`{"a":{"usage":1}}`, ""},        // not at the top
		{`{"usage":1,"usage":2}`, ""},    // a duplicate: encoding/json's rules not copied
		{`{"Usage":1}`, ""},              // folded into usage by encoding/json
		{`{"a":1,"usage":{"x":1}`, ""},   // not JSON
		{`{"a":1,"usage":{"x":1}}x`, ""}, // trailing bytes
		{`{}`, ""},
		{`[DONE]`, ""},
	} {
		from, to, ok := UsageMember([]byte(tc.in))
		got := ""
		if ok {
			got = tc.in[:from] + tc.in[to:]
		}
		if got != tc.want {
			t.Errorf("UsageMember(%s) leaves %q, want %q", tc.in, got, tc.want)
		}
	}
}

// FuzzUsageMember: what UsageMember leaves is valid JSON, the same object less its "usage".
func FuzzUsageMember(f *testing.F) {
	for _, s := range []string{`{"a":1,"usage":{"prompt_tokens":0}}`, `{"usage":null,"b":[1]}`, `{"usage":2}`, `{ "x" : { "usage" : 1 } , "usage" : "u" }`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		from, to, ok := UsageMember(data)
		if !ok {
			return
		}
		var before map[string]json.RawMessage
		if err := json.Unmarshal(data, &before); err != nil {
			t.Fatalf("ok on %q, which encoding/json refuses: %v", data, err)
		}
		left := append(append([]byte{}, data[:from]...), data[to:]...)
		var after map[string]json.RawMessage
		if err := json.Unmarshal(left, &after); err != nil {
			t.Fatalf("%q left %q, not JSON: %v", data, left, err)
		}
		if _, in := before["usage"]; !in {
			t.Fatalf("%q has no usage, and UsageMember said it had", data)
		}
		delete(before, "usage")
		compact := func(m map[string]json.RawMessage) map[string]string {
			out := map[string]string{}
			for k, v := range m {
				var b bytes.Buffer
				_ = json.Compact(&b, v)
				out[k] = b.String()
			}
			return out
		}
		if diff := cmp.Diff(compact(before), compact(after)); diff != "" {
			t.Fatalf("%q less its usage (-want +got):\n%s", data, diff)
		}
	})
}
