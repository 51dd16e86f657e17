package prefix

import (
	"math/rand/v2"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
)

// normalizeCases cover each normalisation step and its fast path.
var normalizeCases = []string{
	"", "  ", "plain text", " edges \n", "a  b", "a\tb", "a\r\nb", "a\rb", "a \n b", "line\nline",
	"caf\u00e9", "cafe\u0301", "nbsp\u00a0x", "ideographic\u3000x", "\u00a0edge\u00a0", "\xff\xfe bad utf8",
	strings.Repeat("You are a helpful assistant who answers briefly. ", 80),
}

func TestNormalizeBytes_MatchesNormalize(t *testing.T) {
	keep, err := NewNormalizer(NormalizeOptions{KeepEdges: true, KeepWhitespace: true})
	if err != nil {
		t.Fatal(err)
	}
	rules, err := NewNormalizer(NormalizeOptions{Rules: []Rule{{Pattern: `\d+`, Replace: "N"}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []*Normalizer{nil, keep, rules} {
		for _, s := range append(normalizeCases, "id 42") {
			if got, want := string(n.NormalizeBytes([]byte(s))), n.Normalize(s); got != want {
				t.Errorf("NormalizeBytes(%q) = %q, Normalize gives %q", s, got, want)
			}
		}
	}
}

func TestNormalizeBytes_NoAllocationWhenUnchanged(t *testing.T) {
	var n *Normalizer
	b := []byte(" " + strings.Repeat("You are a helpful assistant who answers briefly.\n", 80) + "\u00e9 ")
	allocs := testing.AllocsPerRun(100, func() { _ = n.NormalizeBytes(b) })
	if allocs != 0 {
		t.Errorf("NormalizeBytes of normal text: %v allocations, want 0", allocs)
	}
}

func TestBlocksBytes_MatchesBlocks(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, size := range []int{0, 63, 64, 65, 4000} {
		text := randText(r, size)
		seed := Seed("m", "salt")
		for _, bt := range []int{0, 1, 16} {
			if diff := cmp.Diff(Blocks(nil, seed, text, bt), BlocksBytes(nil, seed, []byte(text), bt)); diff != "" {
				t.Errorf("size %d, block tokens %d (-Blocks +BlocksBytes):\n%s", size, bt, diff)
			}
		}
	}
}

func FuzzNormalizeBytes(f *testing.F) {
	for _, s := range normalizeCases {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var n *Normalizer
		if got, want := string(n.NormalizeBytes([]byte(s))), n.Normalize(s); got != want {
			t.Fatalf("NormalizeBytes(%q) = %q, Normalize gives %q", s, got, want)
		}
	})
}

func TestEstimateTokensBytes_MatchesEstimateTokens(t *testing.T) {
	for n := range 20 {
		s := strings.Repeat("x", n)
		if got, want := EstimateTokensBytes([]byte(s)), EstimateTokens(s); got != want {
			t.Errorf("EstimateTokensBytes of %d bytes = %d, EstimateTokens gives %d", n, got, want)
		}
	}
}

// needsCollapseRef is needsCollapse a byte at a time, the reference for the word-at-a-time one.
func needsCollapseRef(s string) bool {
	prevSpace := false
	for _, r := range s {
		switch {
		case r == ' ' || r == '\n':
			if prevSpace {
				return true
			}
			prevSpace = true
		case r == utf8.RuneError:
			prevSpace = false
		case unicode.IsSpace(r):
			return true
		default:
			prevSpace = false
		}
	}
	return false
}

func FuzzNeedsCollapse(f *testing.F) {
	for _, s := range normalizeCases {
		f.Add(s)
	}
	f.Add("abcdefgh  abcdefgh")
	f.Add("abcdefg\u00a0hijklmnop")
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := needsCollapse(stringBytes(s)), needsCollapseRef(s); got != want {
			t.Fatalf("needsCollapse(%q) = %v, byte-at-a-time gives %v", s, got, want)
		}
		if got, want := isASCII(stringBytes(s)), utf8.ValidString(s) && len([]rune(s)) == len(s); got != want {
			t.Fatalf("isASCII(%q) = %v, want %v", s, got, want)
		}
		if got := collapseSpace(s) != s; got != needsCollapseRef(s) {
			t.Fatalf("collapseSpace(%q) changes it: %v, byte-at-a-time check says %v", s, got, !got)
		}
	})
}

// collapseSpaceRef is collapseSpace written the plain way: every whitespace run (as
// unicode.IsSpace sees it, invalid UTF-8 being no space) becomes one newline when it holds one,
// else one space.
func collapseSpaceRef(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size <= 1 || !unicode.IsSpace(r) {
			b.WriteString(s[i : i+size])
			i += size
			continue
		}
		newline := false
		for i < len(s) {
			r, size = utf8.DecodeRuneInString(s[i:])
			if r == utf8.RuneError && size <= 1 || !unicode.IsSpace(r) {
				break
			}
			newline = newline || r == '\n'
			i += size
		}
		if newline {
			b.WriteByte('\n')
		} else {
			b.WriteByte(' ')
		}
	}
	return b.String()
}

func FuzzCollapseSpace(f *testing.F) {
	for _, s := range normalizeCases {
		f.Add(s)
	}
	f.Add("first paragraph, long enough.\n\nsecond  one\tand a\u00a0space;\r\nthird")
	f.Add(strings.Repeat("word ", 20) + "\n\n" + strings.Repeat("more\n", 9) + "  end")
	// Bytes the word-at-a-time test may mark falsely ('!' after a space) or that are below a
	// space without being whitespace.
	f.Add("a word !and another ! and\x01one more\x00 \x1f \n!\n\n! end of it all  !")
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := collapseSpace(s), collapseSpaceRef(s); got != want {
			t.Fatalf("collapseSpace(%q) = %q, want %q", s, got, want)
		}
	})
}

// BenchmarkCollapseSpace: 128 KiB of prose with a paragraph break ("\n\n") every 500 bytes or
// so, which the default normalisation collapses: collapseSpace against the plain reference,
// in the same run; "doubles" is collapseSpace on 128 KiB with a double space every 60 bytes.
func BenchmarkCollapseSpace(b *testing.B) {
	var sb strings.Builder
	for sb.Len() < 128<<10 {
		sb.WriteString(strings.Repeat("The router reads each request once and hashes its blocks. ", 9))
		sb.WriteString("\n\n")
	}
	s := sb.String()
	sb.Reset()
	for sb.Len() < 128<<10 { // a double space every 60 bytes or so
		sb.WriteString("the router reads each request once and hashes its blocks  ")
	}
	doubles := sb.String()
	b.Run("collapseSpace/doubles", func(b *testing.B) {
		b.SetBytes(int64(len(doubles)))
		for b.Loop() {
			_ = collapseSpace(doubles)
		}
	})
	for _, c := range []struct {
		name string
		f    func(string) string
	}{{"collapseSpace", collapseSpace}, {"reference", collapseSpaceRef}} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(s)))
			for b.Loop() {
				_ = c.f(s)
			}
		})
	}
}
