package prefix

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestNormalize_Defaults(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", ""},
		{"plain text", "plain text"},
		{"a\r\nb\rc", "a\nb\nc"},
		{"  lead and trail \n", "lead and trail"},
		{"a  b\t\tc", "a b c"},
		{"a \n\n b", "a\nb"},
		{"caf\u0065\u0301", "caf\u00e9"}, // NFD -> NFC
		{"x\u00a0\u3000y", "x y"},        // Unicode spaces collapse
		{"über  straße", "über straße"},
	} {
		var n *Normalizer
		if got := n.Normalize(tc.in); got != tc.want {
			t.Errorf("Normalize(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestNormalize_Options(t *testing.T) {
	n, err := NewNormalizer(NormalizeOptions{KeepWhitespace: true, KeepEdges: true, KeepLineEndings: true})
	if err != nil {
		t.Fatal(err)
	}
	in := " a  b\r\n"
	if got := n.Normalize(in); got != in {
		t.Errorf("Normalize with everything kept = %q, want %q", got, in)
	}
	n, err = NewNormalizer(NormalizeOptions{KeepUnicodeForm: true})
	if err != nil {
		t.Fatal(err)
	}
	if got := n.Normalize("e\u0301"); got != "e\u0301" {
		t.Errorf("KeepUnicodeForm changed the text: %q", got)
	}
}

func TestNormalize_Rules(t *testing.T) {
	n, err := NewNormalizer(NormalizeOptions{Rules: []Rule{
		{Pattern: `\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z`, Replace: "<time>"},
		{Pattern: `req-([a-f0-9]+)`, Replace: "req-<id>"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	got := n.Normalize("Now is 2026-12-02T09:10:00Z,  req-abc123.")
	if want := "Now is <time>, req-<id>."; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	var plain *Normalizer
	if a, b := plain.Normalize("t 2026-12-02T09:10:00Z"), plain.Normalize("t 2026-12-02T09:11:00Z"); a == b {
		t.Errorf("rules must be off by default")
	}
}

func TestNewNormalizer_BadRules(t *testing.T) {
	_, err := NewNormalizer(NormalizeOptions{Rules: []Rule{
		{Pattern: "ok+"}, {Pattern: "("}, {Pattern: ""}, {Pattern: "a*"},
	}})
	if err == nil {
		t.Fatal("want an error")
	}
	msg := err.Error()
	for _, want := range []string{"rule 1", "not a valid RE2", "rule 2: pattern is empty", "rule 3", "matches the empty string"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not mention %q", msg, want)
		}
	}
	if strings.Contains(msg, "rule 0") {
		t.Errorf("valid rule 0 reported: %q", msg)
	}
}

func TestNormalize_Idempotent(t *testing.T) {
	var n *Normalizer
	for _, s := range []string{" a \r\n\r\n b\t", "e\u0301 \u00a0x", "x"} {
		once := n.Normalize(s)
		if twice := n.Normalize(once); twice != once {
			t.Errorf("Normalize not idempotent on %q: %q then %q", s, once, twice)
		}
	}
}

func FuzzNormalizeBlocks(f *testing.F) {
	for _, s := range []string{"", "hello world", " a\r\n b ", "caf\u0065\u0301", "\xff\xfe bad utf8", strings.Repeat("z", 200)} {
		f.Add(s, 16)
	}
	f.Fuzz(func(t *testing.T, s string, bt int) {
		var n *Normalizer
		out := n.Normalize(s)
		if utf8.ValidString(s) && !utf8.ValidString(out) {
			t.Fatalf("valid input %q gave invalid output %q", s, out)
		}
		if again := n.Normalize(out); utf8.ValidString(s) && again != out {
			t.Fatalf("not idempotent: %q -> %q -> %q", s, out, again)
		}
		bt = bt % 64
		blocks := Blocks(nil, Seed("m", ""), out, bt)
		if bt <= 0 {
			bt = DefaultBlockTokens
		}
		if want := len(out) / BlockBytes(bt); len(blocks) != want {
			t.Fatalf("%d blocks, want %d", len(blocks), want)
		}
	})
}
