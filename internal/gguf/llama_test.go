package gguf

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"slices"
	"strings"
	"testing"
)

func mustVocab(t *testing.T, words []string) *Vocab {
	t.Helper()
	v, err := NewVocab(words)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// encode is byte-level BPE as llama.cpp's gpt2 tokenizer applies it to one pre-tokenized
// piece: map bytes to their symbols, then merge the adjacent pair of best rank until none
// applies. It returns the token ids.
func encode(t *testing.T, v *Vocab, piece string) []int {
	t.Helper()
	b2r := byteRunes()
	syms := make([]string, 0, len(piece))
	for _, c := range []byte(piece) {
		syms = append(syms, string(b2r[c]))
	}
	rank := map[string]int{}
	for i, m := range v.Merges {
		rank[m] = i
	}
	for {
		best, at := len(v.Merges), -1
		for i := 0; i+1 < len(syms); i++ {
			if r, ok := rank[syms[i]+" "+syms[i+1]]; ok && r < best {
				best, at = r, i
			}
		}
		if at < 0 {
			break
		}
		syms = slices.Replace(syms, at, at+2, syms[at]+syms[at+1])
	}
	ids := make([]int, len(syms))
	for i, s := range syms {
		ids[i] = slices.Index(v.Tokens, s)
		if ids[i] < 0 {
			t.Fatalf("symbol %q of %q is no token", s, piece)
		}
	}
	return ids
}

func TestNewVocab_WordsAreOneToken(t *testing.T) {
	words := []string{"the", "router", "cache", "prefix", "there", "a", "an", "assistant"}
	v := mustVocab(t, append(words, "the")) // a repeated word is one entry
	decode := func(ids []int) string {
		var sb strings.Builder
		for _, id := range ids {
			sb.WriteString(v.Tokens[id])
		}
		return sb.String()
	}
	for _, w := range words {
		// Running text reaches the tokenizer as space-led words (the gpt2 pre-tokenizer's
		// pieces): each is one token.
		if ids := encode(t, v, " "+w); len(ids) != 1 {
			t.Errorf("%q encodes to %d tokens %v, want 1", " "+w, len(ids), ids)
		}
	}
	// Without the space a word is usually one token too, but merges of other words may cut it
	// ("an" fires inside "assistant" first); any text encodes losslessly, down to bytes.
	b2r := byteRunes()
	for piece, want := range map[string]int{"the": 1, "router": 1, "assistant": 3, "other": 2, " zebra": 6, "théâtre\n": 9} {
		ids := encode(t, v, piece)
		var sym strings.Builder
		for _, c := range []byte(piece) {
			sym.WriteRune(b2r[c])
		}
		if len(ids) != want || decode(ids) != sym.String() {
			t.Errorf("%q encodes to %d tokens (%q), want %d, lossless", piece, len(ids), decode(ids), want)
		}
	}
	if len(v.Tokens) != len(v.Types) || v.Tokens[v.BOS] != "<|begin_of_text|>" || v.Tokens[v.EOS] != "<|end_of_text|>" ||
		v.Types[v.BOS] != tokenControl || v.Types[0] != tokenNormal {
		t.Errorf("control tokens: BOS %d EOS %d of %d tokens", v.BOS, v.EOS, len(v.Tokens))
	}
	if v.Tokens[' '] != "Ġ" || v.Tokens['\n'] != "Ċ" || v.Tokens['A'] != "A" {
		t.Errorf("byte tokens: space %q newline %q A %q, want Ġ Ċ A", v.Tokens[' '], v.Tokens['\n'], v.Tokens['A'])
	}
	// The word order given does not matter.
	r := mustVocab(t, []string{"assistant", "an", "a", "there", "prefix", "cache", "router", "the"})
	if !slices.Equal(v.Tokens, r.Tokens) || !slices.Equal(v.Merges, r.Merges) {
		t.Error("the vocabulary depends on the order of the words")
	}
}

func TestNewVocab_BadWords(t *testing.T) {
	for _, w := range []string{"", "two words", "tab\there"} {
		if _, err := NewVocab([]string{"ok", w}); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%q", w)) {
			t.Errorf("word %q: err = %v, want one naming it", w, err)
		}
	}
}

func TestLlama(t *testing.T) {
	v := mustVocab(t, []string{"hello", "world"})
	c := LlamaConfig{Embedding: 16, Layers: 2, FeedForward: 24, Heads: 4, KVHeads: 2, Context: 512, Seed: 7}
	f, err := Llama(c, v)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := f.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	got := parse(t, buf.Bytes())
	nv := uint64(len(v.Tokens))
	dims := map[string][]uint64{}
	for _, tn := range got.Tensors {
		dims[tn.Name] = tn.Dims
	}
	for name, want := range map[string][]uint64{
		"token_embd.weight":        {16, nv},
		"blk.0.attn_q.weight":      {16, 16},
		"blk.1.attn_k.weight":      {16, 8}, // 2 KV heads of 4
		"blk.1.ffn_down.weight":    {24, 16},
		"output.weight":            {16, nv},
		"output_norm.weight":       {16},
		"blk.1.attn_output.weight": {16, 16},
	} {
		if !slices.Equal(dims[name], want) {
			t.Errorf("%s dims %v, want %v", name, dims[name], want)
		}
	}
	if len(got.Tensors) != 1+2*9+2 {
		t.Errorf("%d tensors, want 21", len(got.Tensors))
	}
	// The logit bias: column 0 of the output matrix is -1 exactly for the tokens that must not
	// be sampled, and every embedding's first component is 1.
	var out, embd []float32
	for _, tn := range got.Tensors {
		switch tn.Name {
		case "output.weight":
			out = tn.Data
		case "token_embd.weight":
			embd = tn.Data
		}
	}
	banned := 0
	for id := range int(nv) {
		want := float32(0)
		if !v.visible(id) {
			want = -1
			banned++
		}
		if out[id*16] != want || embd[id*16] != 1 {
			t.Fatalf("token %d %q: bias %v embd[0] %v, want %v and 1", id, v.Tokens[id], out[id*16], embd[id*16], want)
		}
	}
	// 256 bytes: 94 printable ASCII, space and newline visible; so 160 banned, plus BOS and EOS.
	if banned != 162 {
		t.Errorf("%d banned tokens, want 162", banned)
	}
	// Same seed, same file; another seed, other weights.
	again, _ := Llama(c, v)
	c.Seed = 8
	other, _ := Llama(c, v)
	if sum(t, again) != sum(t, f) || sum(t, other) == sum(t, f) {
		t.Error("the file is not a function of the seed")
	}
}

func sum(t *testing.T, f *File) [32]byte {
	t.Helper()
	var buf bytes.Buffer
	if _, err := f.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(buf.Bytes())
}

func TestLlama_BadConfig(t *testing.T) {
	v := mustVocab(t, []string{"a"})
	for _, c := range []LlamaConfig{
		{Embedding: 10, Layers: 1, FeedForward: 8, Heads: 4, KVHeads: 4, Context: 64},
		{Embedding: 8, Layers: 1, FeedForward: 8, Heads: 4, KVHeads: 3, Context: 64},
		{Embedding: 8, Layers: 0, FeedForward: 8, Heads: 4, KVHeads: 4, Context: 64},
		{},
	} {
		if _, err := Llama(c, v); err == nil {
			t.Errorf("%+v: want an error", c)
		}
	}
	if err := DefaultLlama().check(); err != nil {
		t.Errorf("DefaultLlama: %v", err)
	}
}
