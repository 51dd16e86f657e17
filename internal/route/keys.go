package route

import (
	"math"
	"sync"

	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/policy"
	"github.com/kvroute/kvroute/internal/prefix"
)

// Keys builds a request's routing keys: its canonical prompt, normalised, cut into blocks of
// BlockTokens tokens whose hashes are chained from a seed of the model and the cache salt the
// engine will use (prefix.Seed), so equal leading hashes mean an equal prompt prefix. The zero
// value uses prefix.DefaultBlockTokens and the default normalisation.
type Keys struct {
	BlockTokens int
	Normalizer  *prefix.Normalizer
	// Chains, when set, remembers long prompts' block chains, so that a conversation's next
	// turn is normalised and hashed only past what it shares with the last (nil: none).
	Chains *prefix.Chains
}

func (k Keys) blockTokens() int {
	if k.BlockTokens <= 0 {
		return prefix.DefaultBlockTokens
	}
	return k.BlockTokens
}

// textBufs recycles the buffers the canonical prompt text is written into; buffers grown past
// maxPooledText are left to the garbage collector so one huge prompt is not kept forever.
var textBufs = sync.Pool{New: func() any { b := make([]byte, 0, 16<<10); return &b }}

const maxPooledText = 1 << 20

func putText(b *[]byte) {
	if cap(*b) <= maxPooledText {
		*b = (*b)[:0]
		textBufs.Put(b)
	}
}

// verbatim is the normaliser that changes nothing: for prompts of token ids.
var verbatim = func() *prefix.Normalizer {
	n, err := prefix.NewNormalizer(prefix.NormalizeOptions{KeepLineEndings: true, KeepUnicodeForm: true, KeepWhitespace: true, KeepEdges: true})
	if err != nil {
		panic(err) // no rules: it cannot fail
	}
	return n
}()

// FromOpenAI fills dst's keys from a parsed OpenAI request body: Model, Blocks, BlockTokens,
// PromptTokens (the router's estimate of the canonical text), MaxTokens, Whole (not streamed)
// and, when the body names one, SessionKey. salt is the cache salt the engine will use (the
// tenant's, or the client's cache_salt without tenants). A list of prompts (completions) is as
// many engine requests, each cached from its start: its blocks are each prompt's chain in
// turn, and each may produce max_tokens. dst.Blocks is reused.
func (k Keys) FromOpenAI(dst *policy.Request, req *openai.Request, salt string) {
	bt := k.blockTokens()
	seed := prefix.Seed(req.Model, salt)
	// The text lives in a pooled buffer and is hashed where it lies (normalisation usually
	// changes nothing and then copies nothing); only the block hashes outlive this call.
	tb := textBufs.Get().(*[]byte)
	*tb = req.AppendCanonical((*tb)[:0])
	dst.Model = req.Model
	dst.BlockTokens = bt
	dst.PromptTokens = prefix.EstimateTokensBytes(*tb)
	// Within [0, math.MaxInt32], and so is its product by the prompts below: a client's
	// value is the client's (the parser refuses one below 1; an int's worth times several
	// prompts wrapped), and the peers refuse a routed event whose count is negative or above
	// 2^40 as malformed.
	dst.MaxTokens = min(max(req.MaxTokens, 0), math.MaxInt32)
	dst.Whole = !req.Stream
	if s := req.SessionKey(); s != "" {
		dst.SessionKey = s
	}
	dst.Blocks = dst.Blocks[:0]
	norm := k.Normalizer
	if len(req.Prompt.Tokens) > 0 {
		// Token ids are what the engine caches, exactly: their bytes are no text to normalise
		// (as text, token 13 would become token 10, and a leading token 32 would be trimmed).
		norm = verbatim
	}
	if n := req.Prompts(); n > 1 {
		pb := textBufs.Get().(*[]byte)
		for i := range n {
			*pb = req.AppendPrompt((*pb)[:0], i)
			dst.Blocks = prefix.NormalizedBlocks(dst.Blocks, seed, *pb, bt, norm)
		}
		putText(pb)
		dst.MaxTokens = int(min(float64(dst.MaxTokens)*float64(n), math.MaxInt32))
	} else {
		dst.Blocks = k.Chains.Blocks(dst.Blocks, seed, *tb, bt, norm)
	}
	putText(tb)
}

// FromContent appends to dst the routing blocks of a prompt given as content keys, one per
// block of BlockTokens tokens (prefix.ContentKeys of its text, or a simulated workload's keys):
// the same chain FromOpenAI makes of the text.
func (k Keys) FromContent(dst []uint64, model, salt string, keys []uint64) []uint64 {
	return prefix.Chain(dst, prefix.Seed(model, salt), keys)
}
