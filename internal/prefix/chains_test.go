package prefix

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
)

// A conversation grows turn by turn; each turn's blocks from Chains must be what hashing the
// normalised text from scratch gives, whatever the text holds at the seams.
func TestChainsAgreeWithBlocksBytes(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	pieces := []string{
		"plain words and more words ", "line\n", "two  spaces", "tab\there", "cr\r\nlf", "é", "e\u0301", "\u00a0nbsp",
		" ", "\n", "日本語のテキスト", "x", "trailing ", "\u0301", "end.\n",
	}
	word := func() string {
		if r.IntN(40) > 0 {
			return pieces[0]
		}
		return pieces[r.IntN(len(pieces))]
	}
	c := NewChains(1 << 14)
	seed := Seed("m", "")
	for conv := range 40 {
		var b strings.Builder
		b.WriteString(strings.Repeat("You are a careful assistant. ", 40)) // a shared system prompt
		if conv%3 == 0 {
			b.WriteString(" ") // not every conversation is clean
		}
		for turn := range 12 {
			for b.Len() < 1100+turn*300 {
				b.WriteString(word())
			}
			text := []byte(b.String())
			want := BlocksBytes(nil, seed, (*Normalizer)(nil).NormalizeBytes(text), 1)
			got := c.Blocks([]uint64{42}, seed, text, 1, nil)
			if got[0] != 42 || !slices.Equal(got[1:], want) {
				t.Fatalf("conversation %d turn %d: Chains gave %d blocks, BlocksBytes %d; first difference at %d",
					conv, turn, len(got)-1, len(want), firstDiff(got[1:], want))
			}
		}
	}
	if chains, blocks := c.Len(); chains == 0 || blocks > 1<<14 {
		t.Errorf("%d chains of %d blocks held, want some, at most %d blocks", chains, blocks, 1<<14)
	}
	if c.reused < 100 {
		t.Errorf("only %d of 480 turns took blocks from an earlier one", c.reused)
	}
}

func firstDiff(a, b []uint64) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// A text that extends a remembered one takes the shared blocks from it; so does one that shares
// a long start with it and then goes its own way (a sibling), up to the last mark they share.
func TestChainsReuseOnlyWhatIsShared(t *testing.T) {
	c := NewChains(1 << 20)
	seed := Seed("m", "salt")
	base := strings.Repeat("the same long prompt ", 400) // 8,400 bytes
	first := []byte(base + "first question")
	c.Blocks(nil, seed, first, 1, nil)
	if n, _ := c.Len(); n != 1 {
		t.Fatalf("%d chains after the first prompt, want 1", n)
	}
	next := []byte(base + "first question and an answer, then a second question")
	got := c.Blocks(nil, seed, next, 1, nil)
	if want := BlocksBytes(nil, seed, next, 1); !slices.Equal(got, want) {
		t.Fatalf("extension: blocks differ at %d", firstDiff(got, want))
	}
	if c.reused != 1 {
		t.Errorf("the extension did not take the remembered blocks")
	}
	if n, _ := c.Len(); n != 1 {
		t.Errorf("%d chains after the extension, want 1: the shorter one is replaced", n)
	}
	other := []byte(base + "a different question entirely, and longer than the first")
	if got, want := c.Blocks(nil, seed, other, 1, nil), BlocksBytes(nil, seed, other, 1); !slices.Equal(got, want) {
		t.Fatalf("sibling: blocks differ at %d", firstDiff(got, want))
	}
	if n, _ := c.Len(); n != 1 || c.reused != 2 {
		t.Errorf("%d chains after a sibling, %d reuses; want 1 (it adds too little to be remembered) and 2 (it shares the base's marks)", n, c.reused)
	}
	// A sibling that adds minChainBlocks blocks or more is remembered.
	long := []byte(base + strings.Repeat("a long question of its own ", 50))
	if got, want := c.Blocks(nil, seed, long, 1, nil), blocksRef(seed, string(long), 1); !slices.Equal(got, want) {
		t.Fatalf("long sibling: blocks differ at %d", firstDiff(got, want))
	}
	if n, _ := c.Len(); n != 2 || c.reused != 3 {
		t.Errorf("%d chains after a long sibling, %d reuses; want 2 and 3", n, c.reused)
	}
	// One that shares only the head (the first 1,024 bytes) takes nothing from the others'
	// later marks.
	stranger := []byte(base[:1100] + strings.Repeat("something else altogether ", 300))
	if got, want := c.Blocks(nil, seed, stranger, 1, nil), blocksRef(seed, string(stranger), 1); !slices.Equal(got, want) {
		t.Fatalf("stranger: blocks differ at %d", firstDiff(got, want))
	}
	// Another salt shares nothing.
	if got, want := c.Blocks(nil, Seed("m", "other"), next, 1, nil), BlocksBytes(nil, Seed("m", "other"), next, 1); !slices.Equal(got, want) {
		t.Fatalf("other seed: blocks differ at %d", firstDiff(got, want))
	}
	// Bounded: a small Chains keeps at most its blocks.
	small := NewChains(3000)
	for i := range 10 {
		small.Blocks(nil, seed, []byte(base+strings.Repeat("x", i*10)), 1, nil)
	}
	if _, blocks := small.Len(); blocks > 3000 {
		t.Errorf("%d blocks held, want at most 3000", blocks)
	}
	var none *Chains
	if got, want := none.Blocks(nil, seed, next, 1, nil), BlocksBytes(nil, seed, next, 1); !slices.Equal(got, want) {
		t.Errorf("nil Chains differs from BlocksBytes")
	}
}

func BenchmarkChains(b *testing.B) {
	seed := Seed("m", "")
	// 400 KB of text each: as it is, and with paragraph breaks and double spaces, which the
	// normalisation collapses.
	for _, kind := range []struct{ name, sentence, turn string }{
		{"", "lorem ipsum dolor sit amet consectetur adipiscing elit ", "another user turn "},
		{"paragraphs/", "lorem ipsum dolor sit amet.\n\nconsectetur  adipiscing elit ", "another  user turn\n\n"},
	} {
		base := strings.Repeat(kind.sentence, 400<<10/len(kind.sentence))
		texts := make([][]byte, 64)
		for i := range texts {
			texts[i] = []byte(base + strings.Repeat(kind.turn, 10*(i+1)))
		}
		dst := make([]uint64, 0, 8192)
		b.Run(kind.name+"scratch", func(b *testing.B) {
			b.SetBytes(int64(len(base)))
			i := 0
			for b.Loop() {
				dst = NormalizedBlocks(dst[:0], seed, texts[i%len(texts)], 16, nil)
				i++
			}
		})
		b.Run(kind.name+"chains", func(b *testing.B) {
			c := NewChains(1 << 20)
			b.SetBytes(int64(len(base)))
			i := 0
			for b.Loop() {
				dst = c.Blocks(dst[:0], seed, texts[i%len(texts)], 16, nil)
				i++
			}
		})
	}
}

func TestChainsConcurrentUse(t *testing.T) {
	c := NewChains(20000)
	seed := Seed("m", "")
	base := strings.Repeat("shared context for every goroutine ", 60)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			text := base
			for turn := range 30 {
				text += strings.Repeat("turn ", 20+g+turn)
				b := []byte(text)
				want := BlocksBytes(nil, seed, (*Normalizer)(nil).NormalizeBytes(b), 1)
				if got := c.Blocks(nil, seed, b, 1, nil); !slices.Equal(got, want) {
					t.Errorf("goroutine %d turn %d: blocks differ at %d", g, turn, firstDiff(got, want))
					return
				}
			}
		})
	}
	wg.Wait()
	if _, blocks := c.Len(); blocks > 20000 {
		t.Errorf("%d blocks held, want at most 20000", blocks)
	}
}

// A remembered chain of a longer text may cover a shorter text's trailing space, which the
// shorter text's normalisation trims: it must not be taken whole.
func TestChainsTrailingSpaceOfAShorterText(t *testing.T) {
	c := NewChains(1 << 20)
	seed := Seed("m", "")
	short := strings.Repeat("abc ", 300) // 1,200 bytes ending in a space: 299 blocks of 4
	long := []byte(short + "abc")        // 1,203 bytes: 300 blocks, the 300th ending in that space
	c.Blocks(nil, seed, long, 1, nil)    // remembered first
	got := c.Blocks(nil, seed, []byte(short), 1, nil)
	want := BlocksBytes(nil, seed, (*Normalizer)(nil).NormalizeBytes([]byte(short)), 1)
	if !slices.Equal(got, want) {
		t.Errorf("%d blocks, want %d (first difference at %d)", len(got), len(want), firstDiff(got, want))
	}
}

// TestChainsReuseCollapsedText: a conversation whose text has paragraph breaks and double
// spaces, which the normalisation collapses, is collapsed and hashed only past what its turns
// share, with the keys of the whole text normalised and hashed.
func TestChainsReuseCollapsedText(t *testing.T) {
	c := NewChains(1 << 16)
	seed := Seed("m", "")
	var b strings.Builder
	b.WriteString(strings.Repeat("A system prompt.\n\nWith  paragraphs and double  spaces. ", 200))
	for turn := range 8 {
		fmt.Fprintf(&b, "\n\nuser:  question %d, asked  twice?\n\nassistant: answer %d.  ", turn, turn)
		text := []byte(b.String())
		want := blocksRef(seed, b.String(), 1)
		if got := c.Blocks(nil, seed, text, 1, nil); !slices.Equal(got, want) {
			t.Fatalf("turn %d: %d blocks, reference %d; first difference at %d", turn, len(got), len(want), firstDiff(got, want))
		}
	}
	if c.reused != 7 {
		t.Errorf("%d of 8 turns took blocks from the turn before, want 7", c.reused)
	}
}

// TestChainsSiblingsShareTheirStart: prompts that share a long system prompt (with runs of
// whitespace to collapse) and each ask their own question get the keys of their whole text
// normalised and hashed, and all but the first take the shared blocks from one before.
func TestChainsSiblingsShareTheirStart(t *testing.T) {
	system := strings.Repeat("A shared system prompt.\n\nWith  paragraphs,  runs\t\tand double  spaces. ", 150)
	var texts []string
	for i := range 20 {
		texts = append(texts, fmt.Sprintf("%s\n\nuser:  question %d,  %s?  \n", system, i, strings.Repeat("and more ", i*7)))
	}
	checkSiblings(t, texts)
}

// checkSiblings sends texts, which share a long start, through one Chains in turn: each gets
// the reference's keys, and every one but the first takes blocks from one before.
func checkSiblings(t *testing.T, texts []string) {
	t.Helper()
	c := NewChains(1 << 16)
	seed := Seed("m", "")
	for i, text := range texts {
		want := blocksRef(seed, text, 1)
		if got := c.Blocks(nil, seed, []byte(text), 1, nil); !slices.Equal(got, want) {
			t.Fatalf("prompt %d: %d blocks, reference %d; first difference at %d", i, len(got), len(want), firstDiff(got, want))
		}
	}
	if want := len(texts) - 1; c.reused != want {
		t.Errorf("%d of %d prompts took blocks from one before, want %d", c.reused, len(texts), want)
	}
}

// TestChainsTextWithoutASCII: marks also lie after characters that are not ASCII, so that a
// document in another script (here with ideographic spaces, which the normalisation collapses
// too) is shared by its siblings; their keys are the reference's.
func TestChainsTextWithoutASCII(t *testing.T) {
	doc := strings.Repeat("日本語の長い文書です。\u3000\u3000次の段落、\n\n続きます。", 120)
	var texts []string
	for i := range 10 {
		texts = append(texts, doc+strings.Repeat("質問\u3000", i+1)+"?")
	}
	checkSiblings(t, texts)
}
