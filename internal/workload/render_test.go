package workload

import (
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/prefix"
)

func TestVocabulary(t *testing.T) {
	seen := map[string]bool{}
	for _, w := range vocabulary {
		if len(w) < 2 || len(w)+1 > len(fillers) || strings.Trim(w, "abcdefghijklmnopqrstuvwxyz") != "" {
			t.Errorf("word %q: want 2 to %d lower-case letters", w, len(fillers)-1)
		}
		if seen[w] {
			t.Errorf("word %q twice", w)
		}
		seen[w] = true
	}
	for n, w := range fillers {
		if len(w) != n {
			t.Errorf("fillers[%d] = %q has %d letters", n, w, len(w))
		}
	}
}

func TestRenderLength(t *testing.T) {
	for _, tokens := range []int{1, 15, 16, 17, 100, 511, 512, 513, 4000} {
		r := &Request{Blocks: make([]uint64, (tokens+15)/16), BlockTokens: 16, PromptTokens: tokens}
		for i := range r.Blocks {
			r.Blocks[i] = uint64(i) * 7919
		}
		text := Render(r)
		if len(text) != tokens*prefix.BytesPerToken {
			t.Errorf("tokens %d: %d bytes, want %d", tokens, len(text), tokens*prefix.BytesPerToken)
		}
		if got := prefix.EstimateTokens(text); got != tokens {
			t.Errorf("tokens %d: estimate %d", tokens, got)
		}
		for i := 0; i < len(text); i++ {
			if c := text[i]; c != ' ' && (c < 'a' || c > 'z') {
				t.Fatalf("tokens %d: byte %d is %q, want a letter or a space", tokens, i, c)
			}
		}
	}
	if got := Render(&Request{Blocks: []uint64{1}, BlockTokens: 16, PromptTokens: 0}); got != "" {
		t.Errorf("empty prompt rendered %q", got)
	}
}

func TestRenderPrefixProperty(t *testing.T) {
	state := uint64(42)
	per := 16 * prefix.BytesPerToken
	for trial := 0; trial < 200; trial++ {
		n := 1 + int(splitmix(&state)%20)
		shared := int(splitmix(&state) % uint64(n))
		a := &Request{BlockTokens: 16, PromptTokens: n * 16}
		b := &Request{BlockTokens: 16, PromptTokens: n*16 - int(splitmix(&state)%16)}
		for i := 0; i < n; i++ {
			id := splitmix(&state)
			a.Blocks = append(a.Blocks, id)
			if i >= shared {
				id = splitmix(&state)
			}
			b.Blocks = append(b.Blocks, id)
		}
		ta, tb := Render(a), Render(b)
		if ta[:shared*per] != tb[:shared*per] {
			t.Fatalf("trial %d: %d shared blocks but texts differ in them", trial, shared)
		}
		if Render(a) != ta {
			t.Fatalf("trial %d: Render is not deterministic", trial)
		}
		// The first differing block differs in text (b's may be cut short).
		end := min((shared+1)*per, len(tb))
		if ta[shared*per:end] == tb[shared*per:end] && end-shared*per >= 16 {
			t.Fatalf("trial %d: different block %d renders to the same text", trial, shared)
		}
	}
}

func TestRenderDistinctBlocks(t *testing.T) {
	seen := map[string]uint64{}
	for id := uint64(0); id < 5000; id++ {
		text := string(renderBlock(nil, id, 64))
		if other, ok := seen[text]; ok {
			t.Fatalf("blocks %d and %d render to the same text %q", other, id, text)
		}
		seen[text] = id
	}
}

func BenchmarkRender(b *testing.B) {
	r := &Request{Blocks: make([]uint64, 512), BlockTokens: 16, PromptTokens: 8192}
	for i := range r.Blocks {
		r.Blocks[i] = uint64(i)
	}
	b.ReportAllocs()
	b.SetBytes(int64(r.PromptTokens * prefix.BytesPerToken))
	for b.Loop() {
		_ = Render(r)
	}
}

// Words covers every word of rendered text, once each.
func TestWords(t *testing.T) {
	words := Words()
	set := map[string]bool{}
	for _, w := range words {
		if set[w] || w == "" {
			t.Fatalf("word %q repeated or empty", w)
		}
		set[w] = true
	}
	// Whole blocks: a cut last block may end in part of a word.
	r := Request{Blocks: []uint64{1, 2, 3, 42, 1 << 40}, BlockTokens: 16, PromptTokens: 80}
	for _, w := range strings.Fields(Render(&r)) {
		if !set[w] {
			t.Errorf("rendered word %q is not in Words()", w)
		}
	}
	if !set["a"] || !set["storage"] {
		t.Error("Words lacks a filler or a vocabulary word")
	}
	words[0] = "changed"
	if Words()[0] == "changed" {
		t.Error("Words returned shared state")
	}
}
