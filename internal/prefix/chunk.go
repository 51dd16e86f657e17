package prefix

import (
	"unsafe"

	"github.com/cespare/xxhash/v2"
)

// DefaultBlockTokens is the router's block: 16 tokens, the same as vLLM's default KV block, so
// that one index entry stands for one engine block.
const DefaultBlockTokens = 16

// BlockBytes is the length in bytes of canonical text that one block of blockTokens tokens
// stands for (the same estimate as EstimateTokens).
func BlockBytes(blockTokens int) int { return blockTokens * BytesPerToken }

// Blocks appends to dst the chained hashes of the full blocks of text: the text is cut into
// blocks of BlockBytes(blockTokens) bytes, each block's content key is the xxhash of its bytes,
// and the keys are chained from seed with Next. A trailing partial block is left out (engines
// cache only full blocks). blockTokens <= 0 means DefaultBlockTokens. It allocates only when dst
// is too small.
func Blocks(dst []uint64, seed uint64, text string, blockTokens int) []uint64 {
	// A read-only view of the string's bytes: BlocksBytes only hashes them.
	return BlocksBytes(dst, seed, unsafe.Slice(unsafe.StringData(text), len(text)), blockTokens)
}

// BlocksBytes is Blocks for text held in a byte slice: the same hashes, without a string copy.
func BlocksBytes(dst []uint64, seed uint64, text []byte, blockTokens int) []uint64 {
	if blockTokens <= 0 {
		blockTokens = DefaultBlockTokens
	}
	size := BlockBytes(blockTokens)
	n := len(text) / size
	dst = growUint64(dst, n)
	h := seed
	for i := 0; i < n; i++ {
		h = Next(h, xxhash.Sum64(text[i*size:(i+1)*size]))
		dst = append(dst, h)
	}
	return dst
}

func growUint64(dst []uint64, n int) []uint64 {
	if cap(dst)-len(dst) >= n {
		return dst
	}
	out := make([]uint64, len(dst), len(dst)+n)
	copy(out, dst)
	return out
}

// Chunker turns one prompt into its routing keys: normalise, then cut into chained block hashes
// seeded with the model and the tenant's cache salt. The zero value uses the default
// normalisation and DefaultBlockTokens. It is safe for concurrent use.
type Chunker struct {
	Normalizer  *Normalizer // nil: the defaults
	BlockTokens int         // 0: DefaultBlockTokens
}

// Chunked is a prompt's routing keys.
type Chunked struct {
	Blocks       []uint64 // chained hashes of the full blocks
	BlockTokens  int      // tokens each block stands for
	PromptTokens int      // EstimateTokens of the canonical text
}

// Chunk normalises text and appends its block hashes to dst (which may be nil).
func (c Chunker) Chunk(dst []uint64, model, salt, text string) Chunked {
	bt := c.BlockTokens
	if bt <= 0 {
		bt = DefaultBlockTokens
	}
	canon := c.Normalizer.Normalize(text)
	return Chunked{
		Blocks:       Blocks(dst, Seed(model, salt), canon, bt),
		BlockTokens:  bt,
		PromptTokens: EstimateTokens(canon),
	}
}

func hashString(s string) uint64 { return xxhash.Sum64String(s) }

// EstimateTokensBytes is EstimateTokens for text held in a byte slice, without a string copy.
func EstimateTokensBytes(text []byte) int { return (len(text) + BytesPerToken - 1) / BytesPerToken }
