package gguf

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
)

// Token types of tokenizer.ggml.token_type.
const (
	tokenNormal  = 1
	tokenControl = 3
)

// Vocab is a GPT-2 style byte-level BPE vocabulary: the 256 byte tokens, the merges that build
// each chosen word into one token, then the control tokens.
type Vocab struct {
	Tokens []string
	Types  []int32
	// Merges are "left right" pairs, highest priority first.
	Merges   []string
	BOS, EOS uint32
}

// byteRunes is GPT-2's byte-to-unicode table: printable bytes stand for themselves, every
// other byte for a code point from U+0100 up, in byte order, so that every byte has a visible,
// whitespace-free symbol (the space is U+0120, shown as Ġ; the newline U+010A, Ċ).
func byteRunes() [256]rune {
	var t [256]rune
	next := rune(256)
	for b := range 256 {
		if printable(byte(b)) {
			t[b] = rune(b)
		} else {
			t[b] = next
			next++
		}
	}
	return t
}

// printable reports the bytes GPT-2 maps to themselves: '!'..'~', '¡'..'¬', '®'..'ÿ'.
func printable(b byte) bool {
	return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE)
}

// NewVocab builds the vocabulary in which every word of words after a space (" word", the
// pieces the gpt2 pre-tokenizer cuts running text into) is one token, as real tokenizers treat
// common English words, so that a prompt made of those words costs about one token per word.
// A word without the space is mostly one token too (merges of other words may cut it: "an"
// inside "assistant"). Any other text is still encodable, byte by byte. Words are
// deduplicated; empty words and words with spaces are errors.
func NewVocab(words []string) (*Vocab, error) {
	uniq := map[string]bool{}
	var ws []string
	for _, w := range words {
		if w == "" || strings.ContainsAny(w, " \t\n") {
			return nil, fmt.Errorf("gguf: vocabulary word %q: want a non-empty word without spaces", w)
		}
		if !uniq[w] {
			uniq[w] = true
			ws = append(ws, w)
		}
	}
	slices.Sort(ws) // the file does not depend on the order words were given in
	b2r := byteRunes()
	v := &Vocab{}
	have := map[string]bool{}
	add := func(tok string, typ int32) {
		if !have[tok] {
			have[tok] = true
			v.Tokens = append(v.Tokens, tok)
			v.Types = append(v.Types, typ)
		}
	}
	for b := range 256 {
		add(string(b2r[b]), tokenNormal)
	}
	merged := map[string]bool{}
	// chain adds the merges that build s left to right: ((a b) c) d ...; each prefix becomes a
	// token. Every merge of a space-led word starts with Ġ, which no other symbol does, so
	// listing those first gives them priority without ever firing inside another word.
	chain := func(s string) {
		cur := ""
		for i, c := range []byte(s) {
			sym := string(b2r[c])
			if i > 0 {
				m := cur + " " + sym
				if !merged[m] {
					merged[m] = true
					v.Merges = append(v.Merges, m)
				}
			}
			cur += sym
			add(cur, tokenNormal)
		}
	}
	for _, w := range ws {
		chain(" " + w)
	}
	for _, w := range ws {
		chain(w)
	}
	v.BOS = uint32(len(v.Tokens))
	add("<|begin_of_text|>", tokenControl)
	v.EOS = uint32(len(v.Tokens))
	add("<|end_of_text|>", tokenControl)
	return v, nil
}

// visible reports whether sampling token id yields printable text: not a control token, and
// not a lone byte outside printable ASCII, the space and the newline (such a byte alone is an
// invalid or empty text delta, and a stream of them carries no content).
func (v *Vocab) visible(id int) bool {
	if v.Types[id] == tokenControl {
		return false
	}
	r := []rune(v.Tokens[id])
	if len(r) != 1 {
		return true
	}
	return (r[0] >= '!' && r[0] <= '~') || r[0] == 0x120 || r[0] == 0x10A
}

// LlamaConfig shapes a tiny llama model.
type LlamaConfig struct {
	Embedding, Layers, FeedForward, Heads, KVHeads int
	// Context is llama.context_length: the longest context the model accepts.
	Context int
	// Seed makes the random weights; the same seed gives the same file.
	Seed uint64
}

// DefaultLlama is a model that loads in a second and computes about 1,000 prompt tokens per
// second on one CPU thread: embedding 256, 2 layers, 4 heads.
func DefaultLlama() LlamaConfig {
	return LlamaConfig{Embedding: 256, Layers: 2, FeedForward: 768, Heads: 4, KVHeads: 4, Context: 8192, Seed: 1}
}

func (c LlamaConfig) check() error {
	var errs []error
	for _, f := range []struct {
		name string
		v    int
	}{{"Embedding", c.Embedding}, {"Layers", c.Layers}, {"FeedForward", c.FeedForward}, {"Heads", c.Heads}, {"KVHeads", c.KVHeads}, {"Context", c.Context}} {
		if f.v < 1 {
			errs = append(errs, fmt.Errorf("%s = %d: want at least 1", f.name, f.v))
		}
	}
	if c.Heads >= 1 && c.KVHeads >= 1 && (c.Embedding%c.Heads != 0 || c.Heads%c.KVHeads != 0) {
		errs = append(errs, fmt.Errorf("the embedding (Embedding %d) must divide into heads (Heads %d), and heads into KV heads (KVHeads %d)", c.Embedding, c.Heads, c.KVHeads))
	}
	return errors.Join(errs...)
}

// Llama returns a llama-architecture model with vocabulary v and random weights (uniform,
// standard deviation 0.02; norms 1).
//
// Its outputs are noise, except for one thing: every generated token is visible text. Each
// token embedding's first component is set to 1, which survives the two random layers into
// the final norm as a large, positive first activation; the output matrix's first column then
// acts as a per-token logit bias: 0 for tokens that print, -1 for control tokens and bytes
// that do not (visible). With weights of 0.02 the other logits stay far smaller, so those
// tokens are never sampled, and every streamed chunk has content.
func Llama(c LlamaConfig, v *Vocab) (*File, error) {
	if err := c.check(); err != nil {
		return nil, fmt.Errorf("gguf: llama: %w", err)
	}
	nv := len(v.Tokens)
	headDim := c.Embedding / c.Heads
	kvDim := headDim * c.KVHeads
	rng := splitmix{state: c.Seed}
	scale := float32(0.02 * math.Sqrt(3)) // uniform on [-a, a) has standard deviation a/sqrt(3)
	matrix := func(name string, in, out int) Tensor {
		d := make([]float32, in*out)
		for i := range d {
			d[i] = scale * rng.uniform()
		}
		return Tensor{Name: name, Dims: []uint64{uint64(in), uint64(out)}, Data: d}
	}
	ones := func(name string, n int) Tensor {
		d := make([]float32, n)
		for i := range d {
			d[i] = 1
		}
		return Tensor{Name: name, Dims: []uint64{uint64(n)}, Data: d}
	}
	embd := matrix("token_embd.weight", c.Embedding, nv)
	for i := range nv {
		embd.Data[i*c.Embedding] = 1
	}
	ts := []Tensor{embd}
	for l := range c.Layers {
		p := fmt.Sprintf("blk.%d.", l)
		ts = append(ts,
			ones(p+"attn_norm.weight", c.Embedding),
			matrix(p+"attn_q.weight", c.Embedding, c.Embedding),
			matrix(p+"attn_k.weight", c.Embedding, kvDim),
			matrix(p+"attn_v.weight", c.Embedding, kvDim),
			matrix(p+"attn_output.weight", c.Embedding, c.Embedding),
			ones(p+"ffn_norm.weight", c.Embedding),
			matrix(p+"ffn_gate.weight", c.Embedding, c.FeedForward),
			matrix(p+"ffn_up.weight", c.Embedding, c.FeedForward),
			matrix(p+"ffn_down.weight", c.FeedForward, c.Embedding),
		)
	}
	out := matrix("output.weight", c.Embedding, nv)
	for i := range nv {
		out.Data[i*c.Embedding] = 0
		if !v.visible(i) {
			out.Data[i*c.Embedding] = -1
		}
	}
	ts = append(ts, ones("output_norm.weight", c.Embedding), out)
	return &File{
		KV: []KV{
			{"general.architecture", "llama"},
			{"general.name", "kvroute-tiny-random"},
			{"general.file_type", uint32(0)}, // all f32
			{"general.alignment", uint32(DefaultAlignment)},
			{"llama.context_length", uint32(c.Context)},
			{"llama.embedding_length", uint32(c.Embedding)},
			{"llama.block_count", uint32(c.Layers)},
			{"llama.feed_forward_length", uint32(c.FeedForward)},
			{"llama.attention.head_count", uint32(c.Heads)},
			{"llama.attention.head_count_kv", uint32(c.KVHeads)},
			{"llama.attention.layer_norm_rms_epsilon", float32(1e-5)},
			{"llama.rope.dimension_count", uint32(headDim)},
			{"llama.rope.freq_base", float32(10000)},
			{"llama.vocab_size", uint32(nv)},
			{"tokenizer.ggml.model", "gpt2"},
			{"tokenizer.ggml.pre", "gpt-2"},
			{"tokenizer.ggml.tokens", v.Tokens},
			{"tokenizer.ggml.token_type", v.Types},
			{"tokenizer.ggml.merges", v.Merges},
			{"tokenizer.ggml.bos_token_id", v.BOS},
			{"tokenizer.ggml.eos_token_id", v.EOS},
			{"tokenizer.ggml.add_bos_token", true},
			{"tokenizer.ggml.add_eos_token", false},
		},
		Tensors: ts,
	}, nil
}

// splitmix is a SplitMix64 generator: seeded, fast, and the same on every platform.
type splitmix struct{ state uint64 }

// uniform returns a float32 uniform on [-1, 1).
func (s *splitmix) uniform() float32 {
	s.state += 0x9e3779b97f4a7c15
	z := s.state
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	z ^= z >> 31
	return float32(z>>40)/float32(1<<23) - 1
}
