package openai

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// spliced returns body with field inserted at at.
func spliced(body []byte, at int, field []byte) []byte {
	return bytes.Join([][]byte{body[:at], field, body[at:]}, nil)
}

// checkSplice: where IncludeUsageSplice offers a splice, the spliced body parses as the same
// request asking for usage, and decodes to what WithIncludeUsage makes; where it does not, the
// body names stream_options.
func checkSplice(t *testing.T, kind Kind, body []byte) {
	t.Helper()
	r, err := Parse(kind, body)
	if err != nil {
		return
	}
	at, field, ok := IncludeUsageSplice(body, r)
	if !ok {
		if !r.StreamOptionsField {
			var m map[string]json.RawMessage
			if json.Unmarshal(body, &m) == nil && len(m) > 0 {
				t.Errorf("no splice offered for %q, which does not name stream_options", body)
			}
		}
		return
	}
	got := spliced(body, at, field)
	r2, err := Parse(kind, got)
	if err != nil {
		t.Fatalf("the spliced body %q does not parse: %v", got, err)
	}
	if !r2.IncludeUsage || r2.Model != r.Model || r2.Stream != r.Stream || r2.CanonicalPrompt() != r.CanonicalPrompt() {
		t.Errorf("spliced %q: include_usage %v, model %q (%q), stream %v (%v), same prompt %v",
			got, r2.IncludeUsage, r2.Model, r.Model, r2.Stream, r.Stream, r2.CanonicalPrompt() == r.CanonicalPrompt())
	}
	want, err := WithIncludeUsage(body)
	if err != nil {
		t.Fatalf("WithIncludeUsage(%q): %v", body, err)
	}
	sameJSON(t, body, want, got, "WithIncludeUsage")
}

// sameJSON fails t unless the spliced body got decodes to what the patch by name gave (want).
func sameJSON(t *testing.T, body, want, got []byte, name string) {
	t.Helper()
	var a, b any
	if err := json.Unmarshal(want, &a); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(got, &b); err != nil {
		t.Fatalf("the spliced body %q is not JSON: %v", got, err)
	}
	if diff := cmp.Diff(a, b); diff != "" {
		t.Errorf("spliced %q against %s (-patched +spliced):\n%s", body, name, diff)
	}
}

func TestIncludeUsageSplice(t *testing.T) {
	for _, tt := range []struct {
		body string
		ok   bool
	}{
		{`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`, true},
		{"{\"model\":\"m\",\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}] \n}\n ", true},
		{`{"model":"m","stream":true,"stream_options":null,"messages":[{"role":"user","content":"hi"}]}`, false},
		{`{"model":"m","stream":true,"stream_options":{},"messages":[{"role":"user","content":"hi"}]}`, false},
		{`{"model":"m","stream":true,"stream\u005foptions":{"include_usage":false},"messages":[{"role":"user","content":"hi"}]}`, false},
	} {
		r, err := Parse(KindChat, []byte(tt.body))
		if err != nil {
			t.Fatalf("%s: %v", tt.body, err)
		}
		if _, _, ok := IncludeUsageSplice([]byte(tt.body), r); ok != tt.ok {
			t.Errorf("%s: splice offered %v, want %v", tt.body, ok, tt.ok)
		}
		checkSplice(t, KindChat, []byte(tt.body))
		checkSplice(t, KindCompletion, []byte(strings.Replace(tt.body, `"messages":[{"role":"user","content":"hi"}]`, `"prompt":"hi"`, 1)))
	}
}

func FuzzIncludeUsageSplice(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","stream":true,"stream_options":null,"prompt":"x"}`,
		`{"model":"m","stream":true,"stream_options":{"continuous_usage_stats":true},"messages":[{"role":"user","content":"x"}]}`,
		"{\"model\":\"m\" , \"prompt\":[1,2]\t}",
	} {
		f.Add(uint8(0), []byte(s))
	}
	fuzzChatAndCompletion(f, checkSplice)
}

// fuzzChatAndCompletion fuzzes check with bodies read as chat requests (even k) or completion
// requests (odd k).
func fuzzChatAndCompletion(f *testing.F, check func(*testing.T, Kind, []byte)) {
	f.Fuzz(func(t *testing.T, k uint8, body []byte) {
		kind := KindChat
		if k%2 == 1 {
			kind = KindCompletion
		}
		check(t, kind, body)
	})
}

// longChat returns a streamed chat request with a 400 KB system prompt (and the fields of
// extra), and its parse.
func longChat(b *testing.B, extra map[string]any) ([]byte, *Request) {
	b.Helper()
	sys := strings.Repeat("You are a helpful assistant who answers briefly. ", 8200)[:400_000]
	m := map[string]any{"model": "m", "stream": true, "messages": []any{
		map[string]any{"role": "system", "content": sys}, map[string]any{"role": "user", "content": "hi"}}}
	maps.Copy(m, extra)
	body, err := json.Marshal(m)
	if err != nil {
		b.Fatal(err)
	}
	r, err := Parse(KindChat, body)
	if err != nil {
		b.Fatal(err)
	}
	return body, r
}

// BenchmarkIncludeUsage: asking a 400 KB streamed chat request for usage, by WithIncludeUsage
// (scan, patch, check: three passes and a copy) and by IncludeUsageSplice (none).
func BenchmarkIncludeUsage(b *testing.B) {
	body, r := longChat(b, nil)
	b.Run("patch", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		b.ReportAllocs()
		for b.Loop() {
			if _, err := WithIncludeUsage(body); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("splice", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		b.ReportAllocs()
		for b.Loop() {
			if _, _, ok := IncludeUsageSplice(body, r); !ok {
				b.Fatal("no splice")
			}
		}
	})
}

// checkSaltSplice: where CacheSaltSplice offers a splice, the spliced body parses as the same
// request with the tenant's salt, names cache_salt once (in any case: no reader, however it
// matches names, can see the client's), and decodes to what Patch makes; where it does not,
// the body names cache_salt and the scanner could not place it.
func checkSaltSplice(t *testing.T, kind Kind, body []byte) {
	t.Helper()
	r, err := Parse(kind, body)
	if err != nil {
		return
	}
	const salt = "tenant-salt"
	v := []byte(strconv.Quote(salt))
	at, end, field, ok := CacheSaltSplice(body, r, v)
	if !ok {
		if !r.CacheSaltField {
			var m map[string]json.RawMessage
			if json.Unmarshal(body, &m) == nil && len(m) > 0 {
				t.Errorf("no splice offered for %q, which does not name cache_salt", body)
			}
		}
		return
	}
	got := bytes.Join([][]byte{body[:at], field, body[end:]}, nil)
	r2, err := Parse(kind, got)
	if err != nil {
		t.Fatalf("the spliced body %q does not parse: %v", got, err)
	}
	if r2.CacheSalt != salt || r2.Model != r.Model || r2.Stream != r.Stream || r2.IncludeUsage != r.IncludeUsage ||
		r2.CanonicalPrompt() != r.CanonicalPrompt() {
		t.Errorf("spliced %q: cache_salt %q, model %q (%q), stream %v (%v), usage %v (%v), same prompt %v",
			got, r2.CacheSalt, r2.Model, r.Model, r2.Stream, r.Stream, r2.IncludeUsage, r.IncludeUsage,
			r2.CanonicalPrompt() == r.CanonicalPrompt())
	}
	spans, _, err := topLevel(got)
	if err != nil {
		t.Fatalf("the spliced body %q: %v", got, err)
	}
	n := 0
	for _, sp := range spans {
		if strings.EqualFold(sp.key, "cache_salt") {
			n++
		}
	}
	if n != 1 {
		t.Errorf("the spliced body %q names cache_salt %d times, want once", got, n)
	}
	want, err := Patch(body, Set{Key: "cache_salt", Value: v})
	if err != nil {
		t.Fatalf("Patch(%q): %v", body, err)
	}
	sameJSON(t, body, want, got, "Patch")
}

func TestCacheSaltSplice(t *testing.T) {
	const msgs = `"messages":[{"role":"user","content":"hi"}]`
	for _, tt := range []struct {
		body    string
		ok      bool
		replace bool // the splice replaces the client's value
	}{
		{`{"model":"m",` + msgs + `}`, true, false},
		{"{\"model\":\"m\"," + msgs + " \n}\n ", true, false},
		{`{"model":"m","cache_salt":"client",` + msgs + `}`, true, true},
		{`{"model":"m", "cache_salt" : "cli\"ent" ,` + msgs + `}`, true, true},
		{`{"model":"m","cache_salt":null,` + msgs + `}`, true, true},
		{`{"model":"m","cache\u005fsalt":"client",` + msgs + `}`, false, false},
		{`{"model":"m","cache_salt":"a","cache_salt":"b",` + msgs + `}`, false, false},
	} {
		body := []byte(tt.body)
		r, err := Parse(KindChat, body)
		if err != nil {
			t.Fatalf("%s: %v", tt.body, err)
		}
		at, end, _, ok := CacheSaltSplice(body, r, []byte(`"s"`))
		if ok != tt.ok || ok && (at != end) != tt.replace {
			t.Errorf("%s: splice offered %v (replacing %v), want %v (%v)", tt.body, ok, at != end, tt.ok, tt.replace)
		}
		checkSaltSplice(t, KindChat, body)
		checkSaltSplice(t, KindCompletion, []byte(strings.Replace(tt.body, msgs, `"prompt":"hi"`, 1)))
	}
	// A body not its parse's (a rewrite) cannot have its value replaced in place.
	body := []byte(`{"model":"m","cache_salt":"client",` + msgs + `}`)
	r, err := Parse(KindChat, body)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, _, ok := CacheSaltSplice(bytes.Clone(body), r, []byte(`"s"`)); ok {
		t.Error("a copy of the body: splice offered, want Patch")
	}
	// encoding/json's path (an escaped key: the scanner gives up) does not place the value:
	// Patch.
	r, err = Parse(KindCompletion, []byte(`{"model":"m","cache_salt":"client","prompt":"x","us\u0065r":"u"}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, _, ok := CacheSaltSplice(r.Raw, r, []byte(`"s"`)); ok {
		t.Error("a completion the scanner gave up on: splice offered, want Patch")
	}
	// The scanner's path places it, for a completion as for a chat.
	r, err = Parse(KindCompletion, []byte(`{"model":"m","cache_salt":"client","prompt":"x"}`))
	if err != nil {
		t.Fatal(err)
	}
	if at, end, _, ok := CacheSaltSplice(r.Raw, r, []byte(`"s"`)); !ok || at == end {
		t.Error("a completion naming cache_salt: no splice in place, want one")
	}
}

func FuzzCacheSaltSplice(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","cache_salt":"c","messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","cache_salt":null,"prompt":"x"}`,
		`{"model":"m","Cache_salt":"c","cache_salt":"d","messages":[{"role":"user","content":"x"}]}`,
		"{\"model\":\"m\" , \"prompt\":[1,2]\t}",
	} {
		f.Add(uint8(0), []byte(s))
	}
	fuzzChatAndCompletion(f, checkSaltSplice)
}

// BenchmarkCacheSalt: giving a 400 KB chat request the tenant's cache_salt, by Patch (scan,
// copy, check) and by CacheSaltSplice, with the client's cache_salt and without.
func BenchmarkCacheSalt(b *testing.B) {
	for _, client := range []bool{false, true} {
		var extra map[string]any
		if client {
			extra = map[string]any{"cache_salt": "client"}
		}
		body, r := longChat(b, extra)
		v := []byte(`"0123456789abcdef"`)
		b.Run(fmt.Sprintf("client=%v/patch", client), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Patch(body, Set{Key: "cache_salt", Value: v}); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("client=%v/splice", client), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if _, _, _, ok := CacheSaltSplice(body, r, v); !ok {
					b.Fatal("no splice")
				}
			}
		})
	}
}
