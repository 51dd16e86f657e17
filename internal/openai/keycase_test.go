package openai

import (
	"errors"
	"strings"
	"testing"
)

// TestFoldedKeysRefused: a body that names a field the router reads in another case (which
// encoding/json would read as that field and an engine in Python would ignore) is refused with
// 400 naming the key, on the scanner's path and on encoding/json's; the same names elsewhere
// (a tool's JSON schema, a vendor field) are not.
func TestFoldedKeysRefused(t *testing.T) {
	const msgs = `"messages":[{"role":"user","content":"hi"}]`
	for _, tt := range []struct {
		kind Kind
		body string
		key  string // "" when the body is accepted
	}{
		{KindChat, `{"model":"b","Model":"a",` + msgs + `}`, "Model"},
		{KindChat, `{"MODEL":"a",` + msgs + `}`, "MODEL"},
		{KindChat, `{"model":"m","stream":true,"Stream":false,` + msgs + `}`, "Stream"},
		{KindChat, `{"model":"m","stream":true,"Stream_Options":{"include_usage":false},` + msgs + `}`, "Stream_Options"},
		{KindChat, `{"model":"m","stream":true,"stream_options":{"Include_Usage":true},` + msgs + `}`, "Include_Usage"},
		{KindChat, `{"model":"m","Cache_Salt":"client",` + msgs + `}`, "Cache_Salt"},
		{KindChat, `{"model":"m","cache_salt":"a","CACHE_SALT":"b",` + msgs + `}`, "CACHE_SALT"},
		{KindChat, `{"model":"m",` + msgs + `,"Messages":[{"role":"user","content":"x"}]}`, "Messages"},
		{KindChat, `{"model":"m","messages":[{"role":"user","content":"a long prompt","Content":"x"}]}`, "Content"},
		{KindChat, `{"model":"m","messages":[{"Role":"user","content":"hi"}]}`, "Role"},
		{KindChat, `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a","TEXT":"b"}]}]}`, "TEXT"},
		{KindChat, `{"model":"m","messages":[{"role":"assistant","tool_calls":[{"Function":{"name":"f"}}]}]}`, "Function"},
		{KindChat, `{"model":"m","messages":[{"role":"assistant","tool_calls":[{"function":{"NAME":"f","arguments":"{}"}}]}]}`, "NAME"},
		{KindChat, `{"model":"m","messag\u0045s":[],` + msgs + `}`, "messagEs"},
		// encoding/json folds U+017F (long s) to s and U+212A (Kelvin sign) to k, in bodies
		// with no ASCII upper-case letter at all.
		{KindChat, `{"model":"m",` + msgs + `,"max_tokenſ":5}`, "max_tokenſ"},
		{KindChat, `{"model":"m",` + msgs + `,"max_tokenſ":5,"X":1}`, "max_tokenſ"},
		{KindChat, `{"model":"m","meſſages":[{"role":"user","content":"hi"}]}`, "meſſages"},
		{KindChat, `{"model":"m",` + msgs + `,"ſtream":true}`, "ſtream"},
		{KindChat, `{"model":"m",` + msgs + `,"max_toKens":5}`, "max_toKens"},
		{KindChat, `{"model":"m","stream":true,"stream_options":{"include_uſage":true},` + msgs + `}`, "include_uſage"},
		{KindChat, `{"model":"m","messages":[{"role":"assistant","tool_callſ":[{"function":{"name":"f"}}]}]}`, "tool_callſ"},
		{KindChat, `{"model":"m","messages":[{"role":"assistant","tool_calls":[{"function":{"name":"f","argumentſ":"{}"}}]}]}`, "argumentſ"},
		{KindCompletion, `{"model":"m","prompt":"hi","max_tokenſ":5}`, "max_tokenſ"},
		{KindCompletion, `{"model":"m","prompt":"hi","Prompt":"x"}`, "Prompt"},
		{KindResponse, `{"model":"m","input":"hi","Input":"x"}`, "Input"},
		{KindEmbedding, `{"model":"m","input":"hi","INPUT":["x"]}`, "INPUT"},
		// Names the router does not read, or reads elsewhere: accepted.
		{KindChat, `{"model":"m","Vendor":1,` + msgs + `}`, ""},
		{KindChat, `{"model":"m","tools":[{"type":"function","function":{"name":"f","parameters":{"properties":{"Model":{"type":"string"},"Content":{}}}}}],` + msgs + `}`, ""},
		{KindChat, `{"model":"m","messages":[{"role":"user","content":"hi","Extra":{"Model":"x"}}]}`, ""},
		{KindChat, `{"model":"m","response_format":{"Type":"json_object"},` + msgs + `}`, ""},
		{KindChat, `{"model":"m","messages":[{"role":"user","content":"ſ and K in a prompt"}],"vendor_ſ":1}`, ""},
	} {
		_, err := Parse(tt.kind, []byte(tt.body))
		var oe *Error
		switch {
		case tt.key == "" && err != nil:
			t.Errorf("%s: %v, want it accepted", tt.body, err)
		case tt.key == "":
		case !errors.As(err, &oe) || oe.Status != 400 || oe.Param == nil || *oe.Param != tt.key || !strings.Contains(oe.Message, "case-sensitive"):
			t.Errorf("%s: %v, want 400 naming %q", tt.body, err, tt.key)
		}
		if tt.key != "" {
			if _, err := parseDecoded(tt.kind, []byte(tt.body)); err == nil {
				t.Errorf("%s: accepted by encoding/json's path", tt.body)
			}
		}
	}
}
