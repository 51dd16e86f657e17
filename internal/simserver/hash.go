package simserver

import (
	"github.com/cespare/xxhash/v2"
	"github.com/kvroute/kvroute/internal/prefix"
)

// BlockHashes returns the block hashes a simulated instance stores for a prompt and publishes in
// its KV events: the engine chains the prefix.ContentKeys of the raw canonical text (no normalisation)
// from prefix.Seed("", cacheSalt). A router in precise mode computes these to match the events.
func BlockHashes(text []byte, blockSize int, cacheSalt string) []uint64 {
	keys := prefix.ContentKeys(nil, text, blockSize)
	return prefix.Chain(keys[:0], prefix.Seed("", cacheSalt), keys)
}

// Vocab is the size of the simulated vocabulary: Llama 3's 128,256 token ids.
const Vocab = 128256

// TokenID is the simulated token id of one token's bytes (prefix.BytesPerToken of them, as
// the simulator cuts text): a hash of the bytes modulo Vocab, so that equal text always gives
// equal ids without a tokenizer.
func TokenID(tok []byte) int64 { return int64(xxhash.Sum64(tok) % Vocab) }

// TokenIDs appends to dst the TokenID of each token of each full block of blockSize tokens of
// the canonical prompt text (the blocks of prefix.ContentKeys, blockSize ids each, in order): the
// token_ids a simulated instance publishes with the blocks it stores.
func TokenIDs(dst []int64, text []byte, blockSize int) []int64 {
	size := prefix.BlockBytes(blockSize)
	end := len(text) / size * size
	for i := 0; i < end; i += prefix.BytesPerToken {
		dst = append(dst, TokenID(text[i:i+prefix.BytesPerToken]))
	}
	return dst
}
