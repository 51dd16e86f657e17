package prefix

import (
	"encoding/binary"
	"math/bits"

	"github.com/cespare/xxhash/v2"
)

// The xxHash64 of the two inputs the router hashes most, in Go that the compiler inlines: a
// 64-byte block (16 tokens, the default) and the 16 bytes of Next. Both give exactly what
// xxhash.Sum64 gives (FuzzBlockHash and TestBlockHash check it); doc.go says why they exist.

const (
	xxPrime1 uint64 = 11400714785074694791
	xxPrime2 uint64 = 14029467366897019727
	xxPrime3 uint64 = 1609587929392839161
	xxPrime4 uint64 = 9650029242287828579
	xxPrime5 uint64 = 2870177450012600261
	// The first two and the last lanes' starting values, xxPrime1 + xxPrime2 and -xxPrime1
	// modulo 2^64 (Go's constants do not wrap).
	xxInit1 uint64 = 6983438078262162902
	xxInit4 uint64 = 7046029288634856825
)

func xxRound(acc, input uint64) uint64 {
	acc += input * xxPrime2
	acc = bits.RotateLeft64(acc, 31)
	return acc * xxPrime1
}

func xxMerge(acc, val uint64) uint64 {
	acc ^= xxRound(0, val)
	return acc*xxPrime1 + xxPrime4
}

func xxAvalanche(h uint64) uint64 {
	h ^= h >> 33
	h *= xxPrime2
	h ^= h >> 29
	h *= xxPrime3
	h ^= h >> 32
	return h
}

// sum64Pair is xxhash.Sum64 of a and b written little-endian, one after the other.
func sum64Pair(a, b uint64) uint64 {
	h := xxPrime5 + 16
	h ^= xxRound(0, a)
	h = bits.RotateLeft64(h, 27)*xxPrime1 + xxPrime4
	h ^= xxRound(0, b)
	h = bits.RotateLeft64(h, 27)*xxPrime1 + xxPrime4
	return xxAvalanche(h)
}

// sum64Block is xxhash.Sum64(b[:64]); b must hold at least 64 bytes.
func sum64Block(b []byte) uint64 {
	b = b[:64:64]
	v1 := xxRound(xxInit1, binary.LittleEndian.Uint64(b[0:]))
	v2 := xxRound(xxPrime2, binary.LittleEndian.Uint64(b[8:]))
	v3 := xxRound(0, binary.LittleEndian.Uint64(b[16:]))
	v4 := xxRound(xxInit4, binary.LittleEndian.Uint64(b[24:]))
	v1 = xxRound(v1, binary.LittleEndian.Uint64(b[32:]))
	v2 = xxRound(v2, binary.LittleEndian.Uint64(b[40:]))
	v3 = xxRound(v3, binary.LittleEndian.Uint64(b[48:]))
	v4 = xxRound(v4, binary.LittleEndian.Uint64(b[56:]))
	h := bits.RotateLeft64(v1, 1) + bits.RotateLeft64(v2, 7) + bits.RotateLeft64(v3, 12) + bits.RotateLeft64(v4, 18)
	h = xxMerge(h, v1)
	h = xxMerge(h, v2)
	h = xxMerge(h, v3)
	h = xxMerge(h, v4)
	return xxAvalanche(h + 64)
}

// blockBytesDefault is BlockBytes(DefaultBlockTokens), the block sum64Block hashes.
const blockBytesDefault = DefaultBlockTokens * BytesPerToken

// contentKey is xxhash.Sum64(block), the content key of one block.
func contentKey(block []byte) uint64 {
	if len(block) == blockBytesDefault {
		return sum64Block(block)
	}
	return xxhash.Sum64(block)
}
