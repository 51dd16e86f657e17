package openai

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"testing"
	"testing/iotest"

	"github.com/google/go-cmp/cmp"
)

func FuzzParse(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"}]}],"tools":[{}]}`,
		`{"model":"m","prompt":[[1,2],[3]]}`,
		`{"model":"m","input":[{"type":"function_call","name":"f"}]}`,
		`{"model":"m","stream_options":{"include_usage":true}}`,
	} {
		f.Add(uint8(1), []byte(s))
	}
	f.Fuzz(func(t *testing.T, k uint8, body []byte) {
		kind := Kind(k%4 + 1)
		r, err := Parse(kind, body)
		if err != nil {
			if _, ok := err.(*Error); !ok {
				t.Fatalf("error %v is not an *Error", err)
			}
			return
		}
		// Canonicalisation is deterministic and patching keeps a valid object.
		if a, b := r.CanonicalPrompt(), r.CanonicalPrompt(); a != b {
			t.Fatal("canonical prompt not deterministic")
		}
		p, err := Patch(body, Set{Key: "cache_salt", Value: []byte(`"x"`)})
		if err != nil {
			t.Fatalf("patch of a parsed body: %v", err)
		}
		if !json.Valid(p) || string(Field(p, "cache_salt")) != `"x"` {
			t.Fatalf("patch result %q", p)
		}
	})
}

func FuzzCanonicalPrefix(f *testing.F) {
	f.Add("sys", "q1", "a1")
	f.Fuzz(func(t *testing.T, a, b, c string) {
		msg := func(role, s string) map[string]any { return map[string]any{"role": role, "content": s} }
		short, _ := json.Marshal(map[string]any{"model": "m", "messages": []any{msg("system", a), msg("user", b)}})
		long, _ := json.Marshal(map[string]any{"model": "m", "messages": []any{msg("system", a), msg("user", b), msg("assistant", c)}})
		rs, err := Parse(KindChat, short)
		if err != nil {
			return // invalid UTF-8 is replaced by json.Marshal; still valid, but be lenient
		}
		rl, err := Parse(KindChat, long)
		if err != nil {
			t.Fatalf("long parse failed: %v", err)
		}
		if !bytes.HasPrefix(rl.AppendCanonical(nil), rs.AppendCanonical(nil)) {
			t.Fatal("equal conversation prefix gave unequal text prefix")
		}
	})
}

func FuzzSSEReader(f *testing.F) {
	f.Add([]byte("data: a\n\nevent: x\ndata: b\r\n\r\ndata: [DONE]\n\n"))
	f.Add([]byte(": c\n\n\n\ndata"))
	f.Add([]byte("data: a\r\revent: x\rdata: b\rid: 1\r\rdata: [DONE]\r\r"))
	f.Add([]byte("data: a\r\n\rdata: b\r\r\n\r\ndata: c\n\r\n: d\r"))
	f.Add([]byte("\r\r\n\rdata: a\rb\r\r\n"))
	f.Add([]byte("\xef\xbb\xbfdata: a\n\nerror: {\"code\":400}\n\n{\"error\":\"x\"}\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		s := NewSSEReader(bytes.NewReader(in), 4096)
		stream := bytes.TrimPrefix(in, []byte(bom)) // a byte order mark is taken off, in no event's Raw
		var raw []byte
		var whole []string
		for range len(in) + 2 {
			ev, err := s.Next()
			if err != nil {
				if err == io.EOF && len(in) < 4096 && !bytes.HasPrefix(stream, raw) {
					t.Fatalf("raw bytes %q are not a prefix of the input", raw)
				}
				if err == io.EOF && len(in) < 4096 {
					// However the stream is cut into reads, the same events come.
					if diff := cmp.Diff(whole, sseFields(t, iotest.OneByteReader(bytes.NewReader(in)))); diff != "" {
						t.Fatalf("read whole and a byte at a time (-whole +bytes):\n%s", diff)
					}
				}
				return
			}
			raw = append(raw, ev.Raw...)
			whole = append(whole, fmt.Sprintf("%q %q %q %v %v %q", ev.Name, ev.Data, ev.ID, ev.Cut, ev.Foreign, ev.ErrorLine))
		}
		t.Fatal("more events than bytes")
	})
}

// sseFields reads r to its end and gives each event's fields as text.
func sseFields(t *testing.T, r io.Reader) []string {
	s := NewSSEReader(r, 4096)
	var out []string
	for range 1 << 16 {
		ev, err := s.Next()
		if err != nil {
			if err != io.EOF {
				t.Fatalf("read a byte at a time: %v", err)
			}
			return out
		}
		out = append(out, fmt.Sprintf("%q %q %q %v %v %q", ev.Name, ev.Data, ev.ID, ev.Cut, ev.Foreign, ev.ErrorLine))
	}
	t.Fatal("too many events")
	return nil
}

// FuzzEngineBodies feeds engine output (error bodies, responses, stream chunks) to the
// readers of it: none may panic, and a normalised error is always a valid OpenAI body.
func FuzzEngineBodies(f *testing.F) {
	f.Add(503, []byte(`{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}`))
	f.Add(400, []byte(`{"object":"error","message":"x","type":"BadRequestError","param":null,"code":400}`))
	f.Add(200, []byte(`{"choices":[],"usage":{"prompt_tokens":3,"prompt_tokens_details":{"cached_tokens":2}}}`))
	f.Add(200, []byte(`{"type":"response.completed","response":{"id":"r","usage":{"input_tokens":1}}}`))
	for _, c := range responseIDCases {
		f.Add(200, []byte(c))
	}
	f.Fuzz(func(t *testing.T, status int, body []byte) {
		e := NormalizeUpstreamError(status, body)
		var v struct {
			Error map[string]any `json:"error"`
		}
		if err := json.Unmarshal(e.Body(), &v); err != nil || v.Error["message"] == "" {
			t.Fatalf("normalised body %s: %v", e.Body(), err)
		}
		if u, ok := FindUsage(body); ok && u.Cached() < -1 {
			t.Fatalf("cached %d", u.Cached())
		}
		_ = IsUsageOnlyChunk(body)
		checkResponseID(t, body)
	})
}

// responseIDCases are bodies on which ResponseID and responseIDDecoded must agree.
var responseIDCases = []string{
	`{"id":"resp_1","object":"response","status":"completed","output":[{"type":"message","content":[{"type":"output_text","text":"a"}]}],"usage":{"input_tokens":1}}`,
	`{"type":"response.created","sequence_number":0,"response":{"id":"resp_2","object":"response","output":[]}}`,
	`{"id":"chatcmpl-1","object":"chat.completion"}`,
	`{"id":"r","object":"response","response":{"id":""}}`,
	`{"id":"r","object":"response","response":null}`,
	`{"id":null,"object":"response"}`,
	`{"id":5,"object":"response"}`,
	`{"ID":"r","object":"response"}`,
	`{"id":"r","id":"s","object":"response"}`,
	`{"response":{"id":"a","id":"b"}}`,
	`{"response":"x"}`,
	"{\"id\":\"bad \xff\",\"object\":\"response\"}",
	`{"object":"response"}`,
	`[]`,
	``,
}

func TestResponseIDMatchesDecoder(t *testing.T) {
	for _, c := range responseIDCases {
		checkResponseID(t, []byte(c))
	}
	if got := ResponseID([]byte(responseIDCases[1])); got != "resp_2" {
		t.Errorf("ResponseID of a response.created event = %q, want resp_2", got)
	}
}

func checkResponseID(t *testing.T, body []byte) {
	t.Helper()
	if got, want := ResponseID(body), responseIDDecoded(body); got != want {
		t.Fatalf("ResponseID(%q) = %q, encoding/json: %q", body, got, want)
	}
}

// FuzzRewriteText rewrites the prompt texts of parsed bodies: the result stays a valid JSON
// object and parses as the same kind.
func FuzzRewriteText(f *testing.F) {
	f.Add(uint8(0), []byte(`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":" a "}],"x":1}]}`))
	f.Add(uint8(1), []byte(`{"model":"m","prompt":["a  b"]}`))
	f.Add(uint8(3), []byte(`{"model":"m","input":[{"role":"user","content":"q"}],"instructions":"s"}`))
	f.Fuzz(func(t *testing.T, k uint8, body []byte) {
		kind := Kind(k%4 + 1)
		if _, err := Parse(kind, body); err != nil {
			return
		}
		out, _, err := RewriteText(kind, body, func(s string) string { return "<" + s + ">" })
		if err != nil {
			return // a shape Parse tolerates but the rewriter does not touch is reported, not mangled
		}
		if !json.Valid(out) {
			t.Fatalf("rewrite produced invalid JSON %q", out)
		}
		if _, err := Parse(kind, out); err != nil {
			t.Fatalf("rewritten body no longer parses: %v\n%s", err, out)
		}
	})
}

// FuzzPlainString checks the fast string path against encoding/json.
func FuzzPlainString(f *testing.F) {
	f.Add([]byte(`"hello"`))
	f.Add([]byte(`"a\"b"`))
	f.Add([]byte("\"\xff\""))
	f.Fuzz(func(t *testing.T, lit []byte) {
		s, ok := plainString(lit)
		if !ok {
			return
		}
		var want string
		if err := json.Unmarshal(lit, &want); err != nil {
			t.Fatalf("plainString accepted %q, which json rejects: %v", lit, err)
		}
		if s != want {
			t.Fatalf("plainString(%q) = %q, json gives %q", lit, s, want)
		}
	})
}

// compactCases are JSON texts (and a few that are not) on which compact and json.Compact must
// agree.
var compactCases = []string{
	`[ {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}} ]`,
	"{\n\t\"a\" : [ 1 , 2.5e-3 , true , null ] ,\r\n \"b\" : \"x y\" }",
	`["a \" b", "c \\", "\\\"", "é \u00e9 \ud83d\ude00", " ", ""]`,
	`"lone"`,
	` 12 `,
	`{"a":"unterminated`,
	`["a\`,
	`[1,]`,
	``,
}

func TestCompactMatchesEncodingJSON(t *testing.T) {
	for _, c := range compactCases {
		checkCompact(t, []byte(c))
	}
}

// checkCompact: for valid JSON, compact's output is json.Compact's; for anything else it does
// not panic (the router calls it only with valid JSON).
func checkCompact(t *testing.T, raw []byte) {
	t.Helper()
	got := compact(raw)
	if !json.Valid(raw) {
		return
	}
	var want bytes.Buffer
	if err := json.Compact(&want, raw); err != nil {
		t.Fatalf("json.Compact(%q): %v", raw, err)
	}
	if !bytes.Equal(got, want.Bytes()) {
		t.Fatalf("compact(%q) = %q, json.Compact: %q", raw, got, want.Bytes())
	}
}

func FuzzCompact(f *testing.F) {
	for _, c := range compactCases {
		f.Add([]byte(c))
	}
	f.Fuzz(checkCompact)
}
