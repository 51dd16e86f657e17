package workload

import (
	"encoding/binary"

	"github.com/cespare/xxhash/v2"
)

// Keys appends to dst the content keys of r's full engine blocks of blockSize tokens, as the
// engine's Request.BlockKeys wants them: floor(PromptTokens/blockSize) keys, fewer when r's
// blocks cover fewer tokens. Workload block b covers tokens [b*BlockTokens, (b+1)*BlockTokens).
// The key of engine block j hashes the id of the workload block holding its last token and the
// offset of its end inside that block; since a workload block's id stands for the whole prefix
// up to it, two requests get equal keys exactly where they share that prefix. The engine
// chains the keys, so a key need not identify its position by itself. A blockSize below 1
// appends nothing.
func Keys(dst []uint64, r *Request, blockSize int) []uint64 {
	if blockSize < 1 || r.BlockTokens < 1 {
		return dst
	}
	n := r.PromptTokens / blockSize
	if covered := len(r.Blocks) * r.BlockTokens / blockSize; n > covered {
		n = covered
	}
	for j := 0; j < n; j++ {
		end := (j + 1) * blockSize // exclusive end token of engine block j
		b := (end - 1) / r.BlockTokens
		dst = append(dst, blockKey(r.Blocks[b], end-b*r.BlockTokens))
	}
	return dst
}

// blockKey hashes a workload block id with an offset inside it.
func blockKey(id uint64, offset int) uint64 {
	var buf [16]byte
	binary.LittleEndian.PutUint64(buf[:8], id)
	binary.LittleEndian.PutUint64(buf[8:], uint64(offset))
	return xxhash.Sum64(buf[:])
}
