package openai

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/google/go-cmp/cmp"
)

func TestParseChat(t *testing.T) {
	body := `{"model":"m","stream":true,"stream_options":{"include_usage":true},"max_completion_tokens":7,"n":2,
	"user":"u","cache_salt":"s","prompt_cache_key":"k","extra":{"x":[1,2]},
	"messages":[{"role":"system","content":"be brief"},
	{"role":"user","content":[{"type":"text","text":"hi"},{"type":"image_url","image_url":{"url":"http://x"}}]},
	{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]},
	{"role":"tool","tool_call_id":"c1","content":"42"}]}`
	r, err := Parse(KindChat, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	if r.Model != "m" || !r.Stream || !r.IncludeUsage || !r.HasStreamOptions || r.MaxTokens != 7 || r.N != 2 ||
		r.User != "u" || r.CacheSalt != "s" || r.PromptCacheKey != "k" || r.SessionKey() != "k" {
		t.Errorf("scalar fields wrong: %+v", r)
	}
	got := r.CanonicalPrompt()
	img := r.Messages[1].Parts[1]
	if !strings.HasPrefix(img, "[image_url ") {
		t.Errorf("image part stand-in = %q", img)
	}
	want := "<|system|>\nbe brief\n<|user|>\nhi\n" + img + "\n<|assistant|>\n<|tool_call|>f({\"a\":1})\n<|tool|> @c1\n42\n"
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("canonical (-want +got):\n%s", diff)
	}
}

func TestCanonicalPrefixProperty(t *testing.T) {
	short := `{"model":"m","messages":[{"role":"system","content":"S"},{"role":"user","content":"Q1"}]}`
	long := `{"model":"m","messages":[{"role":"system","content":"S"},{"role":"user","content":"Q1"},{"role":"assistant","content":"A1"},{"role":"user","content":"Q2"}]}`
	a, err := Parse(KindChat, []byte(short))
	if err != nil {
		t.Fatal(err)
	}
	b, err := Parse(KindChat, []byte(long))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(b.CanonicalPrompt(), a.CanonicalPrompt()) {
		t.Errorf("%q is not a prefix of %q", a.CanonicalPrompt(), b.CanonicalPrompt())
	}
}

func TestParsePrompts(t *testing.T) {
	tests := []struct {
		kind Kind
		body string
		want Prompt
	}{
		{KindCompletion, `{"model":"m","prompt":"abc"}`, Prompt{Texts: []string{"abc"}}},
		{KindCompletion, `{"model":"m","prompt":["a","b"]}`, Prompt{Texts: []string{"a", "b"}}},
		{KindCompletion, `{"model":"m","prompt":[1,2,3]}`, Prompt{Tokens: [][]int64{{1, 2, 3}}}},
		{KindCompletion, `{"model":"m","prompt":[[1],[2,3]]}`, Prompt{Tokens: [][]int64{{1}, {2, 3}}}},
		{KindEmbedding, `{"model":"m","input":"e"}`, Prompt{Texts: []string{"e"}}},
		{KindResponse, `{"model":"m","input":"r"}`, Prompt{Texts: []string{"r"}}},
	}
	for _, tt := range tests {
		r, err := Parse(tt.kind, []byte(tt.body))
		if err != nil {
			t.Errorf("%s: %v", tt.body, err)
			continue
		}
		if diff := cmp.Diff(tt.want, r.Prompt); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tt.body, diff)
		}
	}
	r, err := Parse(KindCompletion, []byte(`{"model":"m","prompt":[1,2,3,4]}`))
	if err != nil {
		t.Fatal(err)
	}
	if n := len(r.CanonicalPrompt()); n != 16 {
		t.Errorf("4 tokens render as %d bytes, want 16", n)
	}
}

func TestParseResponsesItems(t *testing.T) {
	body := `{"model":"m","instructions":"sys","previous_response_id":"resp_1","input":[
	{"role":"user","content":[{"type":"input_text","text":"hello"}]},
	{"type":"function_call","name":"f","arguments":"{}","call_id":"c"},
	{"type":"function_call_output","call_id":"c","output":"ok"}]}`
	r, err := Parse(KindResponse, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	want := "<|system|>\nsys\n<|user|>\nhello\n<|assistant|>\n<|tool_call|>f({})\n<|tool|> @c\nok\n"
	if diff := cmp.Diff(want, r.CanonicalPrompt()); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if r.PreviousResponseID != "resp_1" {
		t.Errorf("previous_response_id = %q", r.PreviousResponseID)
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		kind      Kind
		body      string
		wantParam string
	}{
		{KindChat, `{"model":`, ""},
		{KindChat, `[]`, ""},
		{KindChat, `{"messages":[]}`, "model"},
		{KindChat, `{"model":"m"}`, "messages"},
		{KindChat, `{"model":5,"messages":[]}`, "model"},
		{KindChat, `{"model":"m","messages":[{"content":"x"}]}`, "messages[0].role"},
		{KindChat, `{"model":"m","messages":[{"role":"user","content":5}]}`, "messages[0].content"},
		{KindChat, `{"model":"m","messages":[],"stream":"yes"}`, "stream"},
		{KindCompletion, `{"model":"m"}`, "prompt"},
		{KindCompletion, `{"model":"m","prompt":{}}`, "prompt"},
		{KindCompletion, `{"model":"m","prompt":[true]}`, "prompt"},
		{KindEmbedding, `{"model":"m"}`, "input"},
	}
	for _, tt := range tests {
		_, err := Parse(tt.kind, []byte(tt.body))
		var e *Error
		if !errors.As(err, &e) {
			t.Errorf("%s: error %v is not an *Error", tt.body, err)
			continue
		}
		param := ""
		if e.Param != nil {
			param = *e.Param
		}
		if e.Status != 400 || param != tt.wantParam {
			t.Errorf("%s: status %d param %q, want 400 %q (%s)", tt.body, e.Status, param, tt.wantParam, e.Message)
		}
	}
}

func TestPatchKeepsUnknownFields(t *testing.T) {
	tests := []struct {
		body string
		sets []Set
		want string
	}{
		{`{"a":1, "b" : {"x":[1]}}`, []Set{{"cache_salt", []byte(`"s"`)}}, `{"a":1, "b" : {"x":[1]},"cache_salt":"s"}`},
		{`{"cache_salt":"c","z":true}`, []Set{{"cache_salt", []byte(`"s"`)}}, `{"cache_salt":"s","z":true}`},
		{`{}`, []Set{{"k", []byte(`1`)}}, `{"k":1}`},
		{`{"a":1,"b":2,"c":3}`, []Set{{"b", nil}}, `{"a":1,"c":3}`},
		{`{"a":1,"b":2}`, []Set{{"a", nil}}, `{"b":2}`},
		{`{"a":1,"b":2}`, []Set{{"b", nil}}, `{"a":1}`},
	}
	for _, tt := range tests {
		got, err := Patch([]byte(tt.body), tt.sets...)
		if err != nil {
			t.Errorf("%s: %v", tt.body, err)
			continue
		}
		if diff := cmp.Diff(tt.want, string(got)); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tt.body, diff)
		}
	}
	if _, err := Patch([]byte(`[1]`), Set{"a", []byte("1")}); err == nil {
		t.Error("patching an array: no error")
	}
}

func TestWithIncludeUsage(t *testing.T) {
	tests := []struct{ body, want string }{
		{`{"model":"m","stream":true}`, `{"model":"m","stream":true,"stream_options":{"include_usage":true}}`},
		{`{"stream_options":{"continuous_usage_stats":false}}`, `{"stream_options":{"continuous_usage_stats":false,"include_usage":true}}`},
		{`{"stream_options":null}`, `{"stream_options":{"include_usage":true}}`},
	}
	for _, tt := range tests {
		got, err := WithIncludeUsage([]byte(tt.body))
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(tt.want, string(got)); diff != "" {
			t.Errorf("(-want +got):\n%s", diff)
		}
	}
}

func TestUsage(t *testing.T) {
	u, ok := FindUsage([]byte(`{"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":8}}}`))
	if !ok || u.Prompt() != 10 || u.Completion() != 2 || u.Cached() != 8 {
		t.Errorf("chat usage = %+v ok=%v", u, ok)
	}
	u, ok = FindUsage([]byte(`{"type":"response.completed","response":{"id":"r","usage":{"input_tokens":5,"output_tokens":3}}}`))
	if !ok || u.Prompt() != 5 || u.Completion() != 3 || u.Cached() != -1 {
		t.Errorf("responses usage = %+v ok=%v", u, ok)
	}
	if _, ok := FindUsage([]byte(`{"usage":null}`)); ok {
		t.Error("null usage found")
	}
	if !IsUsageOnlyChunk([]byte(`{"choices":[],"usage":{"prompt_tokens":1}}`)) {
		t.Error("usage-only chunk not recognised")
	}
	if IsUsageOnlyChunk([]byte(`{"choices":[{"delta":{}}],"usage":{"prompt_tokens":1}}`)) {
		t.Error("chunk with choices taken for usage-only")
	}
}

func TestNormalizeUpstreamError(t *testing.T) {
	str := func(s string) *string { return &s }
	tests := []struct {
		status int
		body   string
		want   *Error
	}{
		{400, `{"object":"error","message":"bad","type":"BadRequestError","param":null,"code":400}`,
			&Error{Status: 400, Message: "bad", Type: "BadRequestError", Code: str("400")}},
		{503, `{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}`,
			&Error{Status: 503, Message: "Loading model", Type: "unavailable_error", Code: str("503")}},
		{502, `Bad Gateway`, &Error{Status: 502, Message: "Bad Gateway", Type: TypeUpstream}},
		{500, "Internal trouble\n", &Error{Status: 500, Message: "Internal trouble", Type: TypeUpstream}},
		{500, ``, &Error{Status: 500, Message: "upstream returned 500 Internal Server Error", Type: TypeUpstream}},
	}
	for _, tt := range tests {
		got := NormalizeUpstreamError(tt.status, []byte(tt.body))
		if diff := cmp.Diff(tt.want, got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tt.body, diff)
		}
		var v struct {
			Error map[string]any `json:"error"`
		}
		if err := json.Unmarshal(got.Body(), &v); err != nil || len(v.Error) != 4 {
			t.Errorf("body %s: %v", got.Body(), err)
		}
	}
}

// chatScanCases are chat bodies on which the one-pass scanner and encoding/json must agree
// (both the result and the error).
var chatScanCases = []string{
	// Long strings, for the scan's sixteen and eight bytes at a time: escapes, non-ASCII and
	// invalid UTF-8 at various offsets.
	`{"model":"m","messages":[{"role":"user","content":"0123456789abcdef0123456789\n abcdéfgh0123456789abcdef\"x\u00e9 0123456789abcdefghijk"}]}`,
	`{"model":"m","messages":[{"role":"user","content":"0123456789abcdef0123456789abcdef0123456789ab\u00e9éé0123456789abcdef0123456789"}]}`,
	"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"0123456789abcdef0123456789ab\xff0123456789abcdef01\"}]}",
	"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"0123456789abcdef012345\x01789abcdef0123456789abcdef01\"}]}",
	`{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
	` {"model":"m","messages":[{"role":"user","content":"hi"}]} `,
	`{"model":"m","messages":[]}`,
	`{"model":"m","messages":null}`,
	`{"model":"","messages":[{"role":"user","content":"x"}]}`,
	`{"model":null,"messages":[{"role":"user","content":"x"}]}`,
	`{"model":1,"messages":[{"role":"user","content":"x"}]}`,
	`{"messages":[{"role":"user","content":"hi"}]}`,
	`{"model":"m","messages":[{"role":"user","content":"a\nb\t\"q\" \\ \/ \u00e9 \ud83d\ude00 \u0000"}]}`,
	`{"model":"m","messages":[{"role":"user","content":"lone \ud83d surrogate"}]}`,
	`{"model":"m","messages":[{"role":"user","content":"bad \x"}]}`,
	"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"ctl \x01\"}]}",
	"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"bad utf8 \xff\"}]}",
	"{\"model\":\"m\",\"messages\":[{\"role\":\"us\xffer\",\"content\":\"x\"}]}",
	`{"model":"m","Model":"n","messages":[{"role":"user","content":"x"}]}`,
	`{"model":"m","messages":[{"Role":"user","content":"x"}]}`,
	`{"model":"m","model":"n","messages":[{"role":"user","content":"x"}]}`,
	`{"m\u006fdel":"m","messages":[{"role":"user","content":"x"}]}`,
	`{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":5,"max_completion_tokens":7,"max_output_tokens":9}`,
	`{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":1.5}`,
	`{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":1e2}`,
	`{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":-0}`,
	`{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":99999999999999999999}`,
	`{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":null,"stream":null,"user":null}`,
	`{"model":"m","messages":[{"role":"user","content":"x"}],"n":3}`,
	`{"model":"m","messages":[{"role":"user","content":"x"}],"n":0}`,
	`{"model":"m","messages":[{"role":"user","content":"x"}],"n":null}`,
	`{"model":"m","messages":[{"role":"user","content":"x"}],"N":2}`,
	`{"model":"m","messages":[{"role":"user","content":"x"}],"stream":true,"stream_options":{"include_usage":true}}`,
	`{"model":"m","messages":[{"role":"user","content":"x"}],"stream":false,"stream_options":{"include_usage":1}}`,
	`{"model":"m","messages":[{"role":"user","content":"x"}],"stream":"yes"}`,
	`{"model":"m","messages":[{"role":"user","content":"x"}],"user":"u","cache_salt":"s","prompt_cache_key":"k","previous_response_id":"r","instructions":"be brief"}`,
	`{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[ {"type":"function", "function":{"name":"f"}} ]}`,
	`{"model":"m","messages":[{"role":"user","content":"x"}],"extra":{"a":[1,-2.5e+3,true,false,null,"s",{}],"b":[]}}`,
	`{"model":"m","messages":[{"role":"user","content":"x"}],"extra":01}`,
	`{"model":"m","messages":[{"role":"user","content":"x"}],"extra":1.}`,
	`{"model":"m","messages":[{"role":"user","content":"x"}],"extra":tru}`,
	`{"model":"m","messages":[{"role":"user","content":"x"}],}`,
	`{"model":"m","messages":[{"role":"user","content":"x"},]}`,
	`{"model":"m","messages":[{"role":"user","content":"x"}]} x`,
	`{"model":"m","messages":[null]}`,
	`{"model":"m","messages":[{"content":"x"}]}`,
	`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"u"}}]}]}`,
	`{"model":"m","messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"c","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c","content":"4"}]}`,
	`{"model":"m","messages":[{"role":"assistant","tool_calls":null,"name":null}]}`,
	`{"model":"m","messages":[{"role":"assistant","tool_calls":[{"function":1}]}]}`,
	`{"model":"m","messages":[{"type":"function_call","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"o"}]}`,
	`{"model":"m","messages":[{"role":"user","content":"x","role":"system"}]}`,
	// A function_call_output item's text is its output, whatever its content says.
	`{"model":"m","messages":[{"type":"function_call_output","call_id":"c","content":"a","output":"b"}]}`,
	`{"model":"m","messages":[{"type":"function_call_output","content":[{"type":"text","text":"a"}],"output":"b"}]}`,
	// Content parts: their stand-ins hash each part's JSON as it is, spaces inside included.
	`{"model":"m","messages":[{"role":"user","content":[ {"type":"image_url", "image_url":{"url":"u"}} , {"text":"a\n\u00e9","type":"text"} ,{"type":null,"text":null},{} ]}]}`,
	`{"model":"m","messages":[{"role":"user","content":[]}]}`,
	`{"model":"m","messages":[{"role":"user","content":[null]}]}`,
	`{"model":"m","messages":[{"role":"user","content":["a"]}]}`,
	`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a","text":"b"}]}]}`,
	`{"model":"m","messages":[{"role":"user","content":[{"type":"text","Text":"a"}]}]}`,
	`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":1}]}]}`,
	`{"model":"m","messages":[{"role":"user","content":[{"type":2,"text":"a"}]}]}`,
	"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"bad \xff\"}]}]}",
	`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},]}]}`,
	// Tool calls: what encoding/json reads, the scanner's or its own.
	`{"model":"m","messages":[{"role":"assistant","tool_calls":[{"id":"a","type":"function","function":{"name":"f","arguments":"{\"x\": [1]}"}},{"function":{"arguments":"","name":"g"},"index":1}]}]}`,
	`{"model":"m","messages":[{"role":"assistant","tool_calls":[]}]}`,
	`{"model":"m","messages":[{"role":"assistant","tool_calls":[null,{"function":null},{"function":{"name":null}}]}]}`,
	`{"model":"m","messages":[{"role":"assistant","tool_calls":[{"function":{"name":"f","name":"g"}}]}]}`,
	`{"model":"m","messages":[{"role":"assistant","tool_calls":[{"Function":{"NAME":"f"}}]}]}`,
	`{"model":"m","messages":[{"role":"assistant","tool_calls":[{"function":{"name":"f"},"function":{"name":"g"}}]}]}`,
	`{"model":"m","messages":[{"role":"assistant","tool_calls":[{"function":{"arguments":{"x":1}}}]}]}`,
	"{\"model\":\"m\",\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"name\":\"bad \xff\"}}]}]}",
	`{"model":"m","messages":[{"role":"assistant","tool_calls":{"function":{"name":"f"}}}]}`,
	`{"model":"m","messages":[{"role":"user","content":"x"}], "cache_salt" : null }`,
	`{"model":"m","messages":[{"role":"user","content":"x"}],"cache_salt":"a\u0062"}`,
	`{"model":"m","messages":[{"role":"user","content":"x"}],"Cache_Salt":"a"}`,
	`[]`,
	`null`,
	`"x"`,
	``,
}

// responseScanCases are Responses bodies on which the scanner and encoding/json must agree.
var responseScanCases = []string{
	`{"model":"m","input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"hi"}]},{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"4\n"}]}`,
	`{"model":"m","input":[{"role":"user","content":"a"},{"type":"function_call_output","call_id":"c","output":[{"type":"input_text","text":"o"},{"type":"input_image","image_url":"u"}]}],"instructions":"be brief","previous_response_id":"r","max_output_tokens":9}`,
	`{"model":"m","input":[{"type":"function_call_output","call_id":"c","output":null}]}`,
	`{"model":"m","input":[{"type":"function_call_output","call_id":"c","output":{"x":1}}]}`,
	`{"model":"m","input":[{"type":"reasoning","id":"rs","summary":[{"type":"summary_text","text":"t"}]},{"role":"assistant","content":[{"type":"output_text","text":"a","annotations":[]}]}]}`,
	`{"model":"m","input":[{"type":"message","content":"no role"}]}`,
	`{"model":"m","input":[]}`,
	`{"model":"m","input":"a string"}`,
	`{"model":"m","input":null,"previous_response_id":"r"}`,
	`{"model":"m","previous_response_id":"r"}`,
	`{"model":"m"}`,
	`{"model":"m","input":[{"role":"user","content":"a"}],"input":[]}`,
	`{"model":"m","input":[{"role":"user","content":"a"}],"messages":[{"role":"user","content":"b"}],"prompt":"p"}`,
	`{"model":"m","input":[{"role":"user","content":"a"}],"Input":[]}`,
	`{"model":"m","input":[{"role":"user","content":"a"}],"tools":[{"type":"function","name":"f","parameters":{}}],"stream":true}`,
	`{"model":"m","input":[1]}`,
}

// promptScanCases are completion bodies on which the scanner and encoding/json must agree; as
// embeddings bodies with "input" for "prompt" too.
var promptScanCases = []string{
	`{"model":"m","prompt":"hi","max_tokens":3,"stream":true,"stream_options":{"include_usage":true},"cache_salt":"s"}`,
	`{"model":"m","prompt":"a\nb \u00e9","messages":[1],"input":{}}`,
	`{"model":"m","prompt":""}`,
	`{"model":"m","prompt":["a","b"]}`,
	`{"model":"m","prompt":[1,2,-0,9223372036854775807]}`,
	`{"model":"m","prompt":[[1,2],[],[3]]}`,
	`{"model":"m","prompt":[[],`, // cut after an inner array: flatLen read past the body's end
	`{"model":"m","prompt":[[`,
	`{"model":"m","prompt":[1`,
	`{"model":"m","prompt":[[1],2]}`,
	`{"model":"m","prompt":[1,[2]]}`,
	`{"model":"m","prompt":[1,"a"]}`,
	`{"model":"m","prompt":["a",1]}`,
	`{"model":"m","prompt":["a",null]}`,
	`{"model":"m","prompt":[null]}`,
	`{"model":"m","prompt":[[null]]}`,
	`{"model":"m","prompt":[1.5]}`,
	`{"model":"m","prompt":[1e2]}`,
	`{"model":"m","prompt":[9223372036854775808]}`,
	`{"model":"m","prompt":[-9223372036854775808, 9223372036854775807, -0, 0, -1]}`,
	`{"model":"m","prompt":[-9223372036854775809]}`,
	`{"model":"m","prompt":[12345678901234567890]}`,
	`{"model":"m","prompt":[123456789012345678901]}`,
	`{"model":"m","prompt":[-]}`,
	`{"model":"m","prompt":[01]}`,
	`{"model":"m","prompt":[1E2]}`,
	`{"model":"m","prompt":[]}`,
	`{"model":"m","prompt":[[]]}`,
	`{"model":"m","prompt":null}`,
	`{"model":"m","prompt":5}`,
	`{"model":"m","prompt":{"a":1}}`,
	`{"model":"m"}`,
	`{"model":"m","prompt":"a","prompt":"b"}`,
	`{"model":"m","prompt":"a","PROMPT":"b"}`,
	"{\"model\":\"m\",\"prompt\":\"bad \xff\"}",
	"{\"model\":\"m\",\"prompt\":[\"bad \xff\"]}",
}

func TestScanChatMatchesDecoder(t *testing.T) {
	embeddings := make([]string, len(promptScanCases))
	for i, c := range promptScanCases {
		embeddings[i] = strings.ReplaceAll(strings.ReplaceAll(c, `"input"`, `"x"`), `"prompt"`, `"input"`)
	}
	for _, kc := range []struct {
		kind  Kind
		cases []string
		min   int
	}{{KindChat, chatScanCases, 30}, {KindResponse, responseScanCases, 6}, {KindCompletion, promptScanCases, 7}, {KindEmbedding, embeddings, 7}} {
		scanned := 0
		for _, body := range kc.cases {
			if _, ok := scanBody(kc.kind, []byte(body), nil); ok {
				scanned++
			}
			checkScanAgrees(t, kc.kind, []byte(body))
		}
		if scanned < kc.min {
			t.Errorf("%v: the scanner took only %d of %d bodies: the fast path is not used", kc.kind, scanned, len(kc.cases))
		}
	}
}

// The scanner reads content parts and tool calls of the usual shapes itself: left to
// encoding/json, a long session's parts cost 20 times as much to parse and an agent's tool
// calls 4 times (BenchmarkHandlerLongContext, modes parts and agent).
func TestScanReadsPartsAndToolCalls(t *testing.T) {
	body := `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"u"}}]},` +
		`{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]}]}`
	sb, ok := scanBody(KindChat, []byte(body), nil)
	msgs := sb.msgs
	if !ok || len(msgs) != 2 || len(msgs[0].Parts) != 2 || msgs[0].Parts[0] != "a" || len(msgs[1].ToolCalls) != 1 {
		t.Fatalf("scanBody: ok %v, messages %+v: want the content parts read by the scanner", ok, msgs)
	}
	s := scanner{b: []byte(`[{"id":"c","type":"function","function":{"name":"f","arguments":"{\"x\": 1}"}}]`)}
	calls, ok := s.toolCalls()
	if !ok || !s.end() || len(calls) != 1 || calls[0].Function.Name != "f" || calls[0].Function.Arguments != `{"x": 1}` {
		t.Fatalf("toolCalls: ok %v, %+v", ok, calls)
	}
}

// checkScanAgrees compares Parse (scanner first) with parseDecoded (encoding/json only).
func checkScanAgrees(t *testing.T, kind Kind, body []byte) {
	t.Helper()
	got, gotErr := Parse(kind, body)
	want, wantErr := parseDecoded(kind, body)
	if (gotErr == nil) != (wantErr == nil) || (gotErr != nil && gotErr.Error() != wantErr.Error()) {
		t.Fatalf("body %q: error %v, encoding/json: %v", body, gotErr, wantErr)
	}
	if got != nil && got.CacheSaltEnd != 0 {
		// Only the scanner places cache_salt's value: there, it decodes to the salt read.
		var v *string
		if err := json.Unmarshal(body[got.CacheSaltAt:got.CacheSaltEnd], &v); err != nil || got.CacheSalt != deref(v) {
			t.Fatalf("body %q: cache_salt placed at %d:%d (%q), read as %q", body, got.CacheSaltAt, got.CacheSaltEnd,
				body[got.CacheSaltAt:got.CacheSaltEnd], got.CacheSalt)
		}
		got.CacheSaltAt, got.CacheSaltEnd = 0, 0
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("body %q: request (-encoding/json +scanner):\n%s", body, diff)
	}
}

func FuzzScanChat(f *testing.F) {
	for _, s := range chatScanCases {
		f.Add([]byte(s))
	}
	for _, s := range responseScanCases {
		f.Add([]byte(s))
	}
	for _, s := range promptScanCases {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, k := range []Kind{KindChat, KindResponse, KindCompletion, KindEmbedding} {
			checkScanAgrees(t, k, body)
		}
	})
}

// BenchmarkParseChat4K compares the one-pass scanner (Parse) with encoding/json on a 4 KB chat
// request.
func BenchmarkParseChat4K(b *testing.B) {
	sys := strings.Repeat("You are a helpful assistant who answers briefly. ", 80)[:3900]
	body, err := json.Marshal(map[string]any{"model": "m", "max_tokens": 1, "messages": []any{
		map[string]any{"role": "system", "content": sys}, map[string]any{"role": "user", "content": "hi"}}})
	if err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name  string
		parse func(Kind, []byte) (*Request, error)
	}{{"scan", Parse}, {"encoding-json", parseDecoded}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if _, err := bc.parse(KindChat, body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkParseChat400K is Parse on a chat request of some 100k tokens (a 400 KB system
// prompt): "plain" has no escapes (its prompt is a view of the body), "paragraphs" a line break
// every 300 bytes or so (decoded into a copy), as scripts/longctx.sh's prompts have; "-scratch"
// with the copy in a reused Scratch.
func BenchmarkParseChat400K(b *testing.B) {
	word := "lorem ipsum dolor sit amet consectetur adipiscing elit "
	for _, bc := range []struct{ name, sep string }{{"plain", " "}, {"paragraphs", "\n\n"}} {
		text := strings.Repeat(strings.Repeat(word, 6)+bc.sep, 400_000/(6*len(word)))
		body, err := json.Marshal(map[string]any{"model": "m", "max_tokens": 1, "messages": []any{
			map[string]any{"role": "system", "content": text}, map[string]any{"role": "user", "content": "hi"}}})
		if err != nil {
			b.Fatal(err)
		}
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if _, err := Parse(KindChat, body); err != nil {
					b.Fatal(err)
				}
			}
		})
		// With a Scratch reused from one request to the next, as the router's handler does.
		b.Run(bc.name+"-scratch", func(b *testing.B) { benchParse(b, KindChat, body) })
	}
}

// BenchmarkParseAgent400K is ParseScratch on an agent's session of some 100k tokens in about
// 550 messages (a system prompt, then steps of one tool call and its result of 80 to 560
// tokens), in the shapes clients send it: "chat" with string contents, "chat-parts" with each
// content an array of text parts (as many SDKs send text), "responses" as the Responses API's
// input items (function_call, function_call_output, input_text parts), which encoding/json
// reads; "chat-encoding-json" is "chat" by encoding/json alone (parseDecoded).
func BenchmarkParseAgent400K(b *testing.B) {
	word := "lorem ipsum dolor sit amet consectetur adipiscing elit "
	text := func(tokens, salt int) string {
		return fmt.Sprintf("%d %s", salt, strings.Repeat(word, tokens*4/len(word)+1)[:tokens*4])
	}
	var chat, parts, items []any
	chat = append(chat, map[string]any{"role": "system", "content": text(2000, 0)})
	parts = append(parts, map[string]any{"role": "system", "content": []any{map[string]any{"type": "text", "text": text(2000, 0)}}})
	items = append(items, map[string]any{"type": "message", "role": "system", "content": []any{map[string]any{"type": "input_text", "text": text(2000, 0)}}})
	for k, left := 1, 98_000; left > 0; k++ {
		id, n := fmt.Sprintf("call_%08d", k), 80+(k*97)%480
		args := fmt.Sprintf(`{"path": "src/pkg%d/file%d.go", "lines": [1, %d]}`, k%7, k, 40+k%300)
		call := map[string]any{"id": id, "type": "function", "function": map[string]any{"name": "read_file", "arguments": args}}
		chat = append(chat, map[string]any{"role": "assistant", "content": nil, "tool_calls": []any{call}},
			map[string]any{"role": "tool", "tool_call_id": id, "content": text(n, k)})
		parts = append(parts, map[string]any{"role": "assistant", "content": nil, "tool_calls": []any{call}},
			map[string]any{"role": "tool", "tool_call_id": id, "content": []any{map[string]any{"type": "text", "text": text(n, k)}}})
		items = append(items, map[string]any{"type": "function_call", "call_id": id, "name": "read_file", "arguments": args},
			map[string]any{"type": "function_call_output", "call_id": id, "output": text(n, k)})
		left -= 40 + n
	}
	body := func(key string, v []any) []byte {
		out, err := json.Marshal(map[string]any{"model": "m", "max_tokens": 1, key: v})
		if err != nil {
			b.Fatal(err)
		}
		return out
	}
	for _, bc := range []struct {
		name  string
		kind  Kind
		body  []byte
		parse func(Kind, []byte, *Scratch) (*Request, error)
	}{
		{"chat", KindChat, body("messages", chat), ParseScratch},
		{"chat-parts", KindChat, body("messages", parts), ParseScratch},
		{"responses", KindResponse, body("input", items), ParseScratch},
		{"chat-encoding-json", KindChat, body("messages", chat), func(k Kind, b []byte, _ *Scratch) (*Request, error) { return parseDecoded(k, b) }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(bc.body)))
			var sc Scratch
			for b.Loop() {
				sc.Reset()
				if _, err := bc.parse(bc.kind, bc.body, &sc); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkParsePrompt400K is ParseScratch on a prompt of some 100k tokens (400 KB of text with a
// line break every 56 bytes) in each API's shape: a chat's one message, a completion's prompt
// string, a Responses request's input string, an embeddings input, and a completion's prompt of
// 100,000 token ids.
func BenchmarkParsePrompt400K(b *testing.B) {
	text := strings.Repeat("lorem ipsum dolor sit amet consectetur adipiscing elit\n", 400_000/56)
	ids := make([]int, 100_000)
	for i := range ids {
		ids[i] = (i * 7919) % 128_256
	}
	for _, bc := range []struct {
		name string
		kind Kind
		v    map[string]any
	}{
		{"chat", KindChat, map[string]any{"messages": []any{map[string]any{"role": "user", "content": text}}}},
		{"completion", KindCompletion, map[string]any{"prompt": text}},
		{"responses", KindResponse, map[string]any{"input": text}},
		{"embeddings", KindEmbedding, map[string]any{"input": text}},
		{"completion-token-ids", KindCompletion, map[string]any{"prompt": ids}},
	} {
		bc.v["model"] = "m"
		body, err := json.Marshal(bc.v)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(bc.name, func(b *testing.B) { benchParse(b, bc.kind, body) })
	}
}

// BenchmarkParseImage2M is ParseScratch on a chat message with a question and a 2 MB base64 image
// as content parts.
func BenchmarkParseImage2M(b *testing.B) {
	img := "data:image/png;base64," + strings.Repeat("iVBORw0KGgoAAAANSUhEUgAAA+/", 2_000_000/27)
	body, err := json.Marshal(map[string]any{"model": "m", "messages": []any{map[string]any{"role": "user", "content": []any{
		map[string]any{"type": "text", "text": "what is in this image?"},
		map[string]any{"type": "image_url", "image_url": map[string]any{"url": img}}}}}})
	if err != nil {
		b.Fatal(err)
	}
	benchParse(b, KindChat, body)
}

// BenchmarkParseTools is ParseScratch on a short chat that carries an agent's tool list: 40 tools
// with long descriptions, written as Python's json.dumps writes JSON (a space after every colon
// and comma), 36 KB.
func BenchmarkParseTools(b *testing.B) {
	var tools []string
	for i := range 40 {
		tools = append(tools, fmt.Sprintf(`{"type": "function", "function": {"name": "tool_%d", "description": "%s", "parameters": {"type": "object", "properties": {"path": {"type": "string", "description": "the file's path"}, "limit": {"type": "integer"}}, "required": ["path"]}}}`,
			i, strings.Repeat("Reads a file from the workspace and returns its lines. ", 12)))
	}
	body := []byte(`{"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [` + strings.Join(tools, ", ") + `]}`)
	benchParse(b, KindChat, body)
}

// benchParse runs ParseScratch on body b.N times as the router's handler does, with a Scratch
// reused from one request to the next.
func benchParse(b *testing.B, kind Kind, body []byte) {
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	var sc Scratch
	for b.Loop() {
		sc.Reset()
		if _, err := ParseScratch(kind, body, &sc); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkResponsesAnswer is what the router reads of a Responses API answer of 4,000 tokens
// (16 KB): "usage" and "id" of the non-streamed body, "usage" of a stream's response.completed
// event, which holds the whole response.
func BenchmarkResponsesAnswer(b *testing.B) {
	text := strings.Repeat("lorem ipsum dolor sit amet consectetur adipiscing elit ", 284)
	resp := map[string]any{"id": "resp_1", "object": "response", "status": "completed", "model": "m",
		"output": []any{map[string]any{"type": "message", "id": "msg_1", "role": "assistant",
			"content": []any{map[string]any{"type": "output_text", "text": text, "annotations": []any{}}}}},
		"usage": map[string]any{"input_tokens": 1000, "output_tokens": 4000, "input_tokens_details": map[string]any{"cached_tokens": 900}}}
	body, err := json.Marshal(resp)
	if err != nil {
		b.Fatal(err)
	}
	event, err := json.Marshal(map[string]any{"type": "response.completed", "sequence_number": 4003, "response": resp})
	if err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name string
		read func()
	}{
		{"body-usage", func() { ScanUsage(body) }},
		{"body-id", func() { ResponseID(body) }},
		{"event-usage", func() { ScanUsage(event) }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				bc.read()
			}
		})
	}
}

// usageCases are response bodies on which ScanUsage and FindUsage must agree.
var usageCases = []string{
	`{"id":"c","choices":[{"index":0,"message":{"role":"assistant","content":"x \"q\""}}],"usage":{"prompt_tokens":1000,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":992}}}`,
	`{"usage":{"input_tokens":5,"output_tokens":2}}`,
	`{"usage":null}`,
	`{"usage":"x"}`,
	`{"usage":{"prompt_tokens":"1"}}`,
	`{"Usage":{"prompt_tokens":3}}`,
	`{"usage":{"prompt_tokens":1},"usage":{"prompt_tokens":2}}`,
	`{"response":{"usage":{"input_tokens":7}}}`,
	`{"usage":{"prompt_tokens":1},"response":"x"}`,
	// Responses events and bodies: the top-level usage first, then the response's.
	`{"type":"response.completed","sequence_number":9,"response":{"id":"r","object":"response","output":[{"type":"message","content":[{"type":"output_text","text":"a \"b\""}]}],"usage":{"input_tokens":7,"output_tokens":2,"input_tokens_details":{"cached_tokens":5}}}}`,
	`{"usage":{"input_tokens":1},"response":{"usage":{"input_tokens":2}}}`,
	`{"usage":null,"response":{"usage":{"input_tokens":2}}}`,
	`{"response":null,"usage":{"input_tokens":1}}`,
	`{"response":{"usage":null}}`,
	`{"response":{}}`,
	`{"response":[]}`,
	`{"response":{"usage":{"input_tokens":1},"usage":{"input_tokens":2}}}`,
	`{"response":{"Usage":{"input_tokens":1}}}`,
	`{"response":{"usage":"x"},"usage":{"input_tokens":1}}`,
	`{"usage":"x","response":{"usage":{"input_tokens":1}}}`,
	`{"response":{"usage":{"input_tokens":1.5}}}`,
	`{"response":{"usage":{"input_tokens":1}},"response":{}}`,
	`{"choices":[]}`,
	`{"choices":[],"usage":{"prompt_tokens":1}}`,
	`{"choices" : [ ] ,"usage":{"prompt_tokens":1}}`,
	`{"choices":null,"usage":{"prompt_tokens":1}}`,
	`{"usage":{"prompt_tokens":1}}`,
	`{"choices":[{"index":0,"delta":{"content":"x"}}],"usage":{"prompt_tokens":1,"completion_tokens":1}}`,
	`{"choices":[1],"choices":[],"usage":{"prompt_tokens":1}}`,
	`{"choices":[],"choices":[1],"usage":{"prompt_tokens":1}}`,
	`{"choices":"x","choices":[],"usage":{"prompt_tokens":1}}`,
	`{"choices":{},"usage":{"prompt_tokens":1}}`,
	`{"Choices":[1],"usage":{"prompt_tokens":1}}`,
	`{"choices":[1],"usage":{"prompt_tokens":1}`,
	`{"choices":[],"usage":{"prompt_tokens":"1"}}`,
	`{"usage":{"prompt_tokens":1}} x`,
	`{"usage":{"prompt_tokens":1}`,
	`[]`,
	``,
}

func TestScanUsageMatchesFindUsage(t *testing.T) {
	for _, body := range usageCases {
		checkUsageAgrees(t, []byte(body))
	}
	if u, ok := ScanUsage([]byte(usageCases[0])); !ok || u.Cached() != 992 || u.Prompt() != 1000 {
		t.Errorf("ScanUsage = %+v, %v; want 1000 prompt tokens, 992 cached", u, ok)
	}
}

func checkUsageAgrees(t *testing.T, body []byte) {
	t.Helper()
	gu, gok := ScanUsage(body)
	wu, wok := FindUsage(body)
	if gok != wok {
		t.Fatalf("body %q: ScanUsage ok %v, FindUsage ok %v", body, gok, wok)
	}
	if diff := cmp.Diff(wu, gu); diff != "" {
		t.Fatalf("body %q: usage (-FindUsage +ScanUsage):\n%s", body, diff)
	}
	if got, want := IsUsageOnlyChunk(body), usageOnlyByDecode(body); got != want {
		t.Fatalf("body %q: IsUsageOnlyChunk %v, encoding/json says %v", body, got, want)
	}
}

// usageOnlyByDecode is IsUsageOnlyChunk without its scan: what encoding/json decodes, for a
// chunk that spells "usage" in lower case (IsUsageOnlyChunk never took a case-folded key).
func usageOnlyByDecode(data []byte) bool {
	return strings.Contains(string(data), `"usage"`) && usageOnlyDecoded(data)
}

func FuzzScanUsage(f *testing.F) {
	for _, s := range usageCases {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) { checkUsageAgrees(t, body) })
}

func TestScanUsageObjectCases(t *testing.T) {
	for _, body := range []string{
		`{"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3,"prompt_tokens_details":{"cached_tokens":4,"audio_tokens":0}}}`,
		`{"usage":{"prompt_tokens":null,"prompt_tokens_details":null,"input_tokens_details":{"cached_tokens":null}}}`,
		`{"usage":{"input_tokens":5,"output_tokens":6,"input_tokens_details":{"cached_tokens":1},"extra":[1]}}`,
		`{"usage":{"prompt_tokens":1.5}}`,
		`{"usage":{"Prompt_Tokens":1}}`,
		`{"usage":{"prompt_tokens_details":{"Cached_Tokens":1}}}`,
		`{"usage":{"prompt_tokens_details":{"cached_tokens":1,"cached_tokens":2}}}`,
		`{"usage":{"prompt_tokens_details":[]}}`,
		`{"usage":[]}`,
	} {
		checkUsageAgrees(t, []byte(body))
	}
	if _, ok := scanUsageObject([]byte(`{"prompt_tokens":1,"prompt_tokens_details":{"cached_tokens":4}}`)); !ok {
		t.Error("scanUsageObject gave up on a plain usage object")
	}
}

// TestSpecialWord checks the word-at-a-time test against the byte table: a word with one byte
// that stops the scan is always flagged, wherever the byte is, and a word flagged clean has no
// such byte (words built from random bytes, mostly ASCII).
func TestSpecialWord(t *testing.T) {
	for c := range 256 {
		for pos := range 8 {
			w := []byte("abcdefgh")
			w[pos] = byte(c)
			got := special(binary.LittleEndian.Uint64(w)) != 0
			if got != strSpecial[c] {
				t.Errorf("byte %#x at %d: special %v, the table says %v", c, pos, got, strSpecial[c])
			}
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 200_000 {
		var w [8]byte
		for k := range w {
			w[k] = byte(r.IntN(0x90))
		}
		if special(binary.LittleEndian.Uint64(w[:])) != 0 {
			continue
		}
		for _, c := range w {
			if strSpecial[c] {
				t.Fatalf("word %q: flagged clean, holds %#x", w, c)
			}
		}
	}
}

// TestScanLongStrings: strings long enough to be views of the body (minShared) are checked for
// UTF-8 as the short ones are, wherever a non-ASCII byte lies, escaped or not.
func TestScanLongStrings(t *testing.T) {
	long := strings.Repeat("0123456789abcdef", minShared/16+1)
	for _, tail := range []string{"", "é", "\xff", `\n`, `\n\xff`, `\u00e9`, "\xe9t\xe9"} {
		for _, at := range []int{0, 7, 8, 15, 16, len(long)} {
			content := long[:at] + tail + long[at:]
			checkScanAgrees(t, KindChat, []byte(`{"model":"m","messages":[{"role":"user","content":"`+content+`"}]}`))
		}
	}
}

// TestParseScratch: a long message content with escapes is decoded into the Scratch, whose
// memory the next request reuses after Reset; every string that is not a message content is
// the request's own, even a long one, so that changing the body (or reusing the scratch)
// leaves it as it was.
func TestParseScratch(t *testing.T) {
	long := strings.Repeat("0123456789abcdef", minShared/16+1)
	body := func(i int) []byte {
		return []byte(`{"model":"m` + long + `","user":"u` + long + `","prompt_cache_key":"k` + long +
			`","messages":[{"role":"user","content":"` + strconv.Itoa(i) + `\n` + long + `"}]}`)
	}
	var sc Scratch
	b0 := body(0)
	want, err := Parse(KindChat, b0)
	if err != nil {
		t.Fatal(err)
	}
	r0, err := ParseScratch(KindChat, b0, &sc)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, r0); diff != "" {
		t.Fatalf("ParseScratch differs from Parse (-Parse +ParseScratch):\n%s", diff)
	}
	c0 := r0.Messages[0].Parts[0]
	if sc.Cap() < len(c0) || unsafe.StringData(c0) != unsafe.SliceData(sc.buf[:1]) {
		t.Fatalf("the content (%d bytes) is not in the scratch (%d bytes)", len(c0), sc.Cap())
	}
	model, user, key := r0.Model, r0.User, r0.PromptCacheKey
	clear(b0) // the body is reused...
	sc.Reset()
	r1, err := ParseScratch(KindChat, body(1), &sc) // ...and the scratch
	if err != nil {
		t.Fatal(err)
	}
	if c1 := r1.Messages[0].Parts[0]; unsafe.StringData(c1) != unsafe.StringData(c0) || c1[:2] != "1\n" {
		t.Errorf("the second content does not reuse the scratch, or is wrong: %.8q", c1)
	}
	if model != "m"+long || user != "u"+long || key != "k"+long {
		t.Errorf("a string that is not a message content changed with the body: model %.8q user %.8q prompt_cache_key %.8q", model, user, key)
	}
}

// continuousUsageChunk is a token's chunk from an engine that reports usage in every chunk
// (vLLM's stream_options.continuous_usage_stats).
const continuousUsageChunk = `{"id":"chatcmpl-7f3a","object":"chat.completion.chunk","created":1764950000,"model":"meta-llama/Llama-3.1-70B-Instruct","choices":[{"index":0,"delta":{"content":" the"},"logprobs":null,"finish_reason":null}],"usage":{"prompt_tokens":1843,"total_tokens":1861,"completion_tokens":18}}`

func TestIsUsageOnlyChunkAllocs(t *testing.T) {
	data := []byte(continuousUsageChunk)
	if IsUsageOnlyChunk(data) {
		t.Fatal("a token's chunk taken for the usage-only chunk")
	}
	if n := testing.AllocsPerRun(100, func() { IsUsageOnlyChunk(data) }); n != 0 {
		t.Errorf("IsUsageOnlyChunk of a token's chunk with usage: %v allocations, want 0", n)
	}
}

func BenchmarkIsUsageOnlyChunk(b *testing.B) {
	for _, c := range []struct{ name, data string }{
		{"token", continuousUsageChunk},
		{"usage-only", `{"id":"chatcmpl-7f3a","object":"chat.completion.chunk","created":1764950000,"model":"m","choices":[],"usage":{"prompt_tokens":1843,"total_tokens":1861,"completion_tokens":18}}`},
	} {
		data := []byte(c.data)
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				IsUsageOnlyChunk(data)
			}
		})
		b.Run(c.name+"/decode", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				usageOnlyByDecode(data)
			}
		})
	}
}

// TestErrorsSayNoGoTypes: a 400 words the client's JSON in JSON's terms: not encoding/json's
// Go types ("cannot unmarshal number into Go value of type openai.wireMessage"), not Go's
// "bool", and a null body is said to be one rather than a body without its model (R1 review).
func TestErrorsSayNoGoTypes(t *testing.T) {
	for _, tc := range []struct {
		kind  Kind
		body  string
		param string
		want  string
	}{
		{KindChat, `{"model":"m","messages":[1]}`, "messages[0]", "messages[0] must be a message object with string role and content, not a JSON number"},
		{KindResponse, `{"model":"m","input":["x"]}`, "input[0]", "input[0] must be a message object with string role and content, not a JSON string"},
		{KindChat, `{"model":"m","messages":[{"role":1,"content":"x"}]}`, "messages[0].role", "field messages[0].role must be a string, not a JSON number"},
		{KindChat, `{"model":"m","messages":[{"role":"user","content":"x"},{"role":"user","content":"y","name":true}]}`, "messages[1].name", "field messages[1].name must be a string, not a JSON boolean"},
		{KindChat, `true`, "", "the request body must be a JSON object, not a JSON boolean"},
		{KindChat, `null`, "", "the request body must be a JSON object, not JSON null"},
		{KindCompletion, " null\n", "", "the request body must be a JSON object, not JSON null"},
		{KindChat, `{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":false}`, "max_tokens", "max_tokens must be an integer, not a JSON boolean"},
	} {
		_, err := Parse(tc.kind, []byte(tc.body))
		var e *Error
		if !errors.As(err, &e) || e.Status != 400 {
			t.Errorf("%s: %v, want a 400", tc.body, err)
			continue
		}
		param := ""
		if e.Param != nil {
			param = *e.Param
		}
		if param != tc.param || e.Message != tc.want {
			t.Errorf("%s: param %q, %q;\nwant %q, %q", tc.body, param, e.Message, tc.param, tc.want)
		}
	}
}
