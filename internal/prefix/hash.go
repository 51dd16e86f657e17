package prefix

import (
	"github.com/cespare/xxhash/v2"
)

// BytesPerToken is the tokenizer-free estimate shared by the router and the engine simulator:
// one token stands for four bytes of UTF-8 text (close to BPE tokenizers on English prose).
const BytesPerToken = 4

// EstimateTokens estimates the number of tokens in text. The router's estimate and the
// simulator's tokenizer are this one function, so they always agree.
func EstimateTokens(text string) int { return (len(text) + BytesPerToken - 1) / BytesPerToken }

// Seed derives the hash chain's seed from the model and the tenant's cache salt, so that the
// same prompt under another model or salt shares no block hash.
func Seed(model, salt string) uint64 {
	d := xxhash.New()
	_, _ = d.WriteString("kvroute/v1\x00")
	_, _ = d.WriteString(model)
	_, _ = d.WriteString("\x00")
	_, _ = d.WriteString(salt)
	return d.Sum64()
}

// Next returns the hash of a block whose parent hash is parent and whose content key is key.
// A chain h[i] = Next(h[i-1], key[i]) with h[-1] = seed makes h[i] depend on every block up to i.
func Next(parent, key uint64) uint64 { return sum64Pair(parent, key) }

// Chain appends to dst the chained hashes of content keys, starting from seed.
func Chain(dst []uint64, seed uint64, keys []uint64) []uint64 {
	h := seed
	for _, k := range keys {
		h = Next(h, k)
		dst = append(dst, h)
	}
	return dst
}
