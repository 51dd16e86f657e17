package prefix

import (
	"slices"
	"strings"
	"testing"

	"golang.org/x/text/unicode/norm"
)

// normalizeRef is the default normalisation step by step, the plain way: line endings, NFC,
// whitespace runs (collapseSpaceRef), edges.
func normalizeRef(s string) string {
	s = strings.ReplaceAll(s, "\r\n", "\n")
	s = strings.ReplaceAll(s, "\r", "\n")
	s = norm.NFC.String(s)
	return strings.TrimSpace(collapseSpaceRef(s))
}

// blocksRef is a prompt's routing keys the reference way: normalise, cut into content keys,
// chain them.
func blocksRef(seed uint64, s string, blockTokens int) []uint64 {
	return Chain(nil, seed, ContentKeys(nil, []byte(normalizeRef(s)), blockTokens))
}

// FuzzFastKeys checks that the fast paths give the reference keys: NormalizedBlocks (collapsing
// into a recycled buffer) and Chains.Blocks on a growing conversation (the turn before, then
// this one, then the same again, then siblings that share the turn before's start), long enough
// for Chains to remember it.
func FuzzFastKeys(f *testing.F) {
	for _, s := range normalizeCases {
		f.Add(s, " and the next turn\n\n")
	}
	f.Add("para one.\n\npara two,  with  runs\t\tand tabs.\r\n", "more\n\n\nmore")
	f.Add(strings.Repeat("日本語のテキスト。\u3000\u3000次、\n\n", 20), "質問\u3000です")
	f.Fuzz(func(t *testing.T, s, next string) {
		seed := Seed("m", "salt")
		if got, want := NormalizedBlocks([]uint64{7}, seed, []byte(s), 1, nil), blocksRef(seed, s, 1); got[0] != 7 || !slices.Equal(got[1:], want) {
			t.Fatalf("NormalizedBlocks(%q): %d blocks, reference %d; first difference at %d", s, len(got)-1, len(want), firstDiff(got[1:], want))
		}
		long := strings.Repeat("System prompt line.\n\nWith  a run. ", 40) + s
		c := NewChains(1 << 14)
		for i, text := range []string{long, long + next, long + next, long + next + s, long + s + next, long + s} {
			want := blocksRef(seed, text, 1)
			if got := c.Blocks(nil, seed, []byte(text), 1, nil); !slices.Equal(got, want) {
				t.Fatalf("Chains.Blocks, turn %d of %q + %q: %d blocks, reference %d; first difference at %d",
					i, s, next, len(got), len(want), firstDiff(got, want))
			}
		}
	})
}
