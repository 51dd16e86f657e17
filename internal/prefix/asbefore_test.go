package prefix

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// keyPieces are what randPrompt builds prompts of: words, every kind of whitespace run the
// normalisation collapses or keeps (CRLF, lone CR, tabs, NBSP, NEL, ideographic and en
// spaces), text not in NFC (a decomposed accent, an en quad), combining marks after a space,
// text in other scripts, and bytes that are not UTF-8.
var keyPieces = []string{
	"word ", "words and more words ", "line\n", "two  spaces", "\t", "tab\there", "cr\r\nlf", "lone\rcr",
	"\r\n\r\n", "\n\n\n", "   ", " ", "\n", "é", "e\u0301", " \u0301", "\u00a0nbsp", "\u0085nel", "\u3000",
	"日本語のテキスト", "次、\u3000\u3000続き。", "\u2000quad", "\u2002en", "x", "end.", "\xff", "\xe3\x80",
	"\xc2", "\v\f", "Ω", "ﬁ",
}

// collapsible are the pieces whose default normalisation only collapses whitespace (no
// carriage return, NFC): the text Chains remembers.
var collapsible = slices.DeleteFunc(slices.Clone(keyPieces), func(p string) bool {
	return strings.ContainsRune(p, '\r') || strings.Contains(p, "\u0301") || strings.Contains(p, "\u2000")
})

// randPrompt returns about n bytes of pieces, mostly plain words when plain, so that Chains
// finds the marks it needs.
func randPrompt(r *rand.Rand, n int, pieces []string, plain bool) string {
	var b strings.Builder
	for b.Len() < n {
		if plain && r.IntN(8) > 0 {
			b.WriteString(pieces[r.IntN(2)])
			continue
		}
		b.WriteString(pieces[r.IntN(len(pieces))])
	}
	return b.String()
}

// checkAsBefore sends texts through NormalizedBlocks and a Chains, and through the code as it
// was before (keysold_test.go) and a Chains of their own: every text's keys must be the same,
// and the two Chains must take from and remember the same texts.
func checkAsBefore(t *testing.T, texts []string, blockTokens int, n *Normalizer) {
	t.Helper()
	seed := Seed("m", "salt")
	now, was := NewChains(1<<16), NewChains(1<<16)
	for i, s := range texts {
		text := []byte(s)
		if got, want := NormalizedBlocks([]uint64{7}, seed, text, blockTokens, n), normalizedBlocksOld([]uint64{7}, seed, text, blockTokens, n); !slices.Equal(got, want) {
			t.Fatalf("NormalizedBlocks(text %d %.200q, %d): %d keys, before %d; first difference at %d",
				i, s, blockTokens, len(got), len(want), firstDiff(got, want))
		}
		if got, want := now.Blocks([]uint64{7}, seed, text, blockTokens, n), was.blocksOld([]uint64{7}, seed, text, blockTokens, n); !slices.Equal(got, want) {
			t.Fatalf("Chains.Blocks(text %d %.200q, %d): %d keys, before %d; first difference at %d",
				i, s, blockTokens, len(got), len(want), firstDiff(got, want))
		}
		if string(text) != s {
			t.Fatalf("text %d was written to", i)
		}
	}
	c1, b1 := now.Len()
	c2, b2 := was.Len()
	if c1 != c2 || b1 != b2 || now.reused != was.reused {
		t.Errorf("Chains hold %d chains of %d blocks and reused %d times, before %d, %d and %d", c1, b1, now.reused, c2, b2, was.reused)
	}
}

// conversation returns texts that grow from start turn by turn, then siblings of the first
// turn: what Chains remembers and takes from.
func conversation(start string, turns []string) []string {
	texts := []string{start}
	for _, turn := range turns {
		texts = append(texts, texts[len(texts)-1]+turn)
	}
	for _, turn := range turns {
		texts = append(texts, start+turn, start+turn+turn)
	}
	return texts
}

// TestKeysAsBefore: on random prompts of every kind of text, at several block sizes and
// normalisations, the keys are those the code gave before it hashed the collapsed text as it
// read it, and Chains remembers and reuses the same prompts.
func TestKeysAsBefore(t *testing.T) {
	r := rand.New(rand.NewPCG(10, 10))
	keep, err := NewNormalizer(NormalizeOptions{KeepLineEndings: true})
	if err != nil {
		t.Fatal(err)
	}
	rules, err := NewNormalizer(NormalizeOptions{Rules: []Rule{{Pattern: `\d+`, Replace: "N"}}})
	if err != nil {
		t.Fatal(err)
	}
	for round := range 24 {
		bt := []int{1, 2, 3, 16, 1, 17, 2, 40}[round%8]
		size := BlockBytes(bt)
		var n *Normalizer
		switch round % 10 {
		case 3:
			n = keep
		case 7:
			n = rules
		}
		// The collapsible pieces, mostly words, then mixed, then all the pieces the same.
		pieces, plain := collapsible, round/8 == 0
		if round/8 == 2 {
			pieces = keyPieces
		}
		// Twice what Chains takes, since the text may collapse to half of it.
		start := randPrompt(r, 2*max(headBytes, minChainBlocks*size)+r.IntN(4*size), pieces, plain)
		if round%7 == 1 {
			start = " " + start // Chains leaves text with a leading space to NormalizedBlocks
		}
		var turns []string
		for range 3 {
			turns = append(turns, randPrompt(r, r.IntN(markBlocks*size*2), pieces, plain))
		}
		texts := conversation(start, turns)
		for _, edge := range []string{" ", "\u3000", "\t\u00a0 ", "\n\n", "\u0085", "\r\n"} {
			texts = append(texts, start+turns[0]+edge) // trailing whitespace of each kind
		}
		for range 10 {
			texts = append(texts, randPrompt(r, r.IntN(3*size), keyPieces, false)) // short ones, edges
		}
		checkAsBefore(t, texts, bt, n)
	}
	checkAsBefore(t, normalizeCases, 1, nil)
}

// FuzzKeysAsBefore is TestKeysAsBefore on the fuzzer's texts: a prompt long enough for Chains,
// grown by the fuzzer's turns, cut into blocks of 1 to 4 tokens.
func FuzzKeysAsBefore(f *testing.F) {
	f.Add("para one.\n\npara two,  with  runs\t\tand tabs.\r\n", "more\n\n\nmore", "\r\n end \u3000", uint8(0))
	f.Add("cafe\u0301  \u0301x\r\r\n", "日本語\u3000\u3000。", "\xff\xc2 \u0085", uint8(2))
	f.Fuzz(func(t *testing.T, s, next, last string, bt uint8) {
		start := strings.Repeat("System prompt line.\n\nWith  a run. ", 40) + s
		for len(start) < 1100 {
			start += s + "x"
		}
		checkAsBefore(t, conversation(start, []string{next, last, s}), 1+int(bt%4), nil)
	})
}
