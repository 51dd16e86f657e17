package prefix

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// TestBlockHash checks the inlined xxHash64 against the library's on random and edge inputs.
func TestBlockHash(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	block := make([]byte, 64)
	for i := range 10000 {
		switch i {
		case 0:
			clear(block)
		case 1:
			for j := range block {
				block[j] = 0xff
			}
		default:
			for j := range block {
				block[j] = byte(r.Uint32())
			}
		}
		if got, want := sum64Block(block), xxhash.Sum64(block); got != want {
			t.Fatalf("sum64Block(%x) = %x, want %x", block, got, want)
		}
		a, b := binary.LittleEndian.Uint64(block), binary.LittleEndian.Uint64(block[8:])
		if got, want := sum64Pair(a, b), xxhash.Sum64(block[:16]); got != want {
			t.Fatalf("sum64Pair(%x, %x) = %x, want %x", a, b, got, want)
		}
	}
}

// FuzzBlockHash checks BlocksBytes's chain, which the inlined hashes compute for 16-token
// blocks, against the library's hashes chained the long way, at the default block and others.
func FuzzBlockHash(f *testing.F) {
	f.Add([]byte("lorem ipsum dolor sit amet consectetur adipiscing elit lorem ipsum dolor sit amet"), uint64(7), uint8(16))
	f.Add(make([]byte, 300), uint64(0), uint8(3))
	f.Fuzz(func(t *testing.T, text []byte, seed uint64, tokens uint8) {
		for _, bt := range []int{DefaultBlockTokens, int(tokens%40) + 1} {
			size := BlockBytes(bt)
			var want []uint64
			h := seed
			for i := 0; i+size <= len(text); i += size {
				var pair [16]byte
				binary.LittleEndian.PutUint64(pair[:], h)
				binary.LittleEndian.PutUint64(pair[8:], xxhash.Sum64(text[i:i+size]))
				h = xxhash.Sum64(pair[:])
				want = append(want, h)
			}
			got := BlocksBytes(nil, seed, text, bt)
			if len(got) != len(want) {
				t.Fatalf("block tokens %d: %d blocks, want %d", bt, len(got), len(want))
			}
			for i := range want {
				if got[i] != want[i] {
					t.Fatalf("block tokens %d: block %d = %x, want %x", bt, i, got[i], want[i])
				}
			}
			if keys := ContentKeys(nil, text, bt); len(keys) > 0 && keys[0] != xxhash.Sum64(text[:size]) {
				t.Fatalf("block tokens %d: content key %x, want %x", bt, keys[0], xxhash.Sum64(text[:size]))
			}
		}
	})
}
