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
// It is Chain(dst, seed, ContentKeys(nil, text, blockTokens)) without the intermediate slice.
func BlocksBytes(dst []uint64, seed uint64, text []byte, blockTokens int) []uint64 {
	if blockTokens <= 0 {
		blockTokens = DefaultBlockTokens
	}
	return chainBytes(dst, seed, text, BlockBytes(blockTokens))
}

// chainBytes appends to dst the hashes of text's full blocks of size bytes, chained from h.
func chainBytes(dst []uint64, h uint64, text []byte, size int) []uint64 {
	n := len(text) / size
	dst = growUint64(dst, n)
	if size == blockBytesDefault {
		for i := 0; i < n; i++ {
			h = sum64Pair(h, sum64Block(text[i*size:]))
			dst = append(dst, h)
		}
		return dst
	}
	for i := 0; i < n; i++ {
		h = Next(h, xxhash.Sum64(text[i*size:(i+1)*size]))
		dst = append(dst, h)
	}
	return dst
}

// ContentKeys appends to dst the content key of each full block of blockTokens tokens of text:
// the xxhash of its BlockBytes(blockTokens) bytes. A trailing partial block has no key (engines
// cache only full blocks). blockTokens <= 0 means DefaultBlockTokens.
//
// This and Chain are the one way kvroute makes block keys: the router hashes the normalised
// prompt with BlocksBytes (the two fused), the engine simulator server keys the raw prompt an
// engine would see with ContentKeys, and the engine model and the fleet simulator chain content
// keys with Chain, so equal prefixes give equal keys wherever they are computed.
func ContentKeys(dst []uint64, text []byte, blockTokens int) []uint64 {
	if blockTokens <= 0 {
		blockTokens = DefaultBlockTokens
	}
	size := BlockBytes(blockTokens)
	n := len(text) / size
	dst = growUint64(dst, n)
	for i := 0; i < n; i++ {
		dst = append(dst, contentKey(text[i*size:(i+1)*size]))
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

func hashString(s string) uint64 { return xxhash.Sum64String(s) }

// EstimateTokensBytes is EstimateTokens for text held in a byte slice, without a string copy.
func EstimateTokensBytes(text []byte) int { return (len(text) + BytesPerToken - 1) / BytesPerToken }
