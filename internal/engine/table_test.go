package engine

import (
	"math/rand/v2"
	"testing"
)

// TestHashTableMatchesMap applies random inserts and deletes to a small table (long probe runs,
// wrap-around) and to a Go map, and checks that they agree after every operation. The table
// reads full hashes from the blocks, so each insert first gives its block the hash, as
// blockPool.register does.
func TestHashTableMatchesMap(t *testing.T) {
	for _, maxEntries := range []int{1, 5, 64} {
		rng := rand.New(rand.NewPCG(uint64(maxEntries), 9))
		tab := newHashTable(maxEntries)
		ref := map[uint64]int32{}
		blocks := make([]block, 6000)
		universe := make([]uint64, 3*maxEntries)
		// phiInv * phi = 1 (mod 2^64), so k and k + c*phiInv share their tag for small c:
		// keys that the tags alone cannot tell apart.
		const phi = 0x9E3779B97F4A7C15
		phiInv := uint64(phi)
		for range 6 {
			phiInv *= 2 - phi*phiInv
		}
		for i := range universe {
			universe[i] = rng.Uint64() >> uint(rng.IntN(64)) // some tiny keys, 0 included
			if i%3 == 2 {
				universe[i] = universe[i-1] + uint64(i)*phiInv
			}
		}
		for op := range 6000 {
			h := universe[rng.IntN(len(universe))]
			if _, in := ref[h]; !in && len(ref) < maxEntries && rng.IntN(2) == 0 {
				blocks[op].hash = h
				if !tab.insert(h, int32(op), blocks) {
					t.Fatalf("insert(%x) = false for a new key", h)
				}
				ref[h] = int32(op)
			} else if in {
				if tab.insert(h, -2, blocks) {
					t.Fatalf("insert(%x) = true for a present key", h)
				}
				tab.delete(h, ref[h])
				delete(ref, h)
			}
			if tab.n != len(ref) {
				t.Fatalf("op %d: n = %d, want %d", op, tab.n, len(ref))
			}
			for _, k := range universe {
				v, ok := tab.get(k, blocks)
				w, wok := ref[k]
				if ok != wok || (ok && v != w) {
					t.Fatalf("op %d: get(%x) = %d %v, want %d %v", op, k, v, ok, w, wok)
				}
			}
		}
	}
}
