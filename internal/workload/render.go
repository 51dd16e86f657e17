package workload

import (
	"strings"

	"github.com/kvroute/kvroute/internal/prefix"
)

// vocabulary is the fixed word list blocks are written with: 128 words of 2 to 8 letters, so
// a word and its space never take more than 9 bytes. It is read, never written.
var vocabulary = [...]string{
	"the", "of", "and", "to", "in", "is", "it", "that", "for", "on", "as", "with", "was", "by",
	"at", "be", "this", "from", "or", "an", "which", "are", "have", "not", "but", "had", "one",
	"their", "all", "were", "when", "there", "can", "more", "about", "other", "would", "some",
	"time", "these", "could", "first", "people", "into", "only", "new", "over", "after", "most",
	"also", "made", "many", "before", "through", "where", "much", "should", "well", "between",
	"under", "never", "same", "another", "while", "state", "number", "system", "water", "light",
	"small", "large", "group", "point", "order", "world", "house", "place", "bottle", "river",
	"answer", "question", "model", "router", "cache", "prefix", "token", "engine", "memory",
	"request", "server", "block", "history", "context", "summary", "reason", "example", "simple",
	"careful", "quick", "garden", "window", "morning", "evening", "market", "letter", "signal",
	"village", "mountain", "forest", "island", "bridge", "harbor", "planet", "orbit", "current",
	"pattern", "measure", "balance", "problem", "method", "result", "figure", "table", "chapter",
	"section", "detail", "account", "report", "storage",
}

// fillers[n] is a word of exactly n letters, used to end a block on its exact length.
var fillers = [9]string{"", "a", "an", "the", "that", "their", "should", "through", "question"}

// Words returns every word Render writes prompts with (the vocabulary and the fillers), once
// each: a tokenizer that makes each of them one token reads a rendered prompt at one token per
// word (internal/gguf builds such a model). The slice is the caller's.
func Words() []string {
	out := make([]string, 0, len(vocabulary)+len(fillers))
	seen := map[string]bool{}
	for _, w := range append(vocabulary[:], fillers[:]...) {
		if w != "" && !seen[w] {
			seen[w] = true
			out = append(out, w)
		}
	}
	return out
}

// Render returns deterministic prompt text of PromptTokens*prefix.BytesPerToken ASCII bytes (less
// when r's blocks cover fewer tokens). Each workload block renders to BlockTokens*BytesPerToken
// bytes of space-separated words drawn from a fixed vocabulary by a generator seeded with the
// block id only; the last block is cut to the remaining length. So equal block prefixes give
// equal text prefixes, different blocks give different text (but for a 64-bit coincidence), and
// the router's token estimate of a block's text is exactly BlockTokens.
func Render(r *Request) string {
	total := r.PromptTokens * prefix.BytesPerToken
	per := r.BlockTokens * prefix.BytesPerToken
	if total <= 0 || per <= 0 {
		return ""
	}
	var sb strings.Builder
	sb.Grow(total)
	buf := make([]byte, 0, per)
	for _, id := range r.Blocks {
		rem := total - sb.Len()
		if rem <= 0 {
			break
		}
		buf = renderBlock(buf[:0], id, per)
		if len(buf) > rem {
			buf = buf[:rem]
		}
		sb.Write(buf)
	}
	return sb.String()
}

// renderBlock appends exactly n bytes of words derived from id, ending with a space.
func renderBlock(dst []byte, id uint64, n int) []byte {
	state := id ^ 0x6b76726f75746521 // "kvroute!": keeps block 0 from starting at state 0
	for rem := n; rem > 0; {
		if rem <= len(fillers) {
			dst = append(dst, fillers[rem-1]...)
			dst = append(dst, ' ')
			break
		}
		w := vocabulary[splitmix(&state)%uint64(len(vocabulary))]
		dst = append(dst, w...)
		dst = append(dst, ' ')
		rem -= len(w) + 1
	}
	return dst
}

// splitmix advances a SplitMix64 generator and returns its next output.
func splitmix(state *uint64) uint64 {
	*state += 0x9e3779b97f4a7c15
	z := *state
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}
