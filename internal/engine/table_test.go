package engine

import (
	"math/rand/v2"
	"testing"
)

// TestHashTableMatchesMap applies random inserts and deletes to a small table (long probe runs,
// wrap-around) and to a Go map, and checks that they agree after every operation.
func TestHashTableMatchesMap(t *testing.T) {
	for _, maxEntries := range []int{1, 5, 64} {
		rng := rand.New(rand.NewPCG(uint64(maxEntries), 9))
		tab := newHashTable(maxEntries)
		ref := map[uint64]int32{}
		universe := make([]uint64, 3*maxEntries)
		for i := range universe {
			universe[i] = rng.Uint64() >> uint(rng.IntN(64)) // some tiny keys, 0 included
		}
		for op := range 6000 {
			h := universe[rng.IntN(len(universe))]
			if _, in := ref[h]; !in && len(ref) < maxEntries && rng.IntN(2) == 0 {
				if !tab.insert(h, int32(op)) {
					t.Fatalf("insert(%x) = false for a new key", h)
				}
				ref[h] = int32(op)
			} else if in {
				if tab.insert(h, -2) {
					t.Fatalf("insert(%x) = true for a present key", h)
				}
				tab.delete(h)
				delete(ref, h)
			}
			if tab.n != len(ref) {
				t.Fatalf("op %d: n = %d, want %d", op, tab.n, len(ref))
			}
			for _, k := range universe {
				v, ok := tab.get(k)
				w, wok := ref[k]
				if ok != wok || (ok && v != w) {
					t.Fatalf("op %d: get(%x) = %d %v, want %d %v", op, k, v, ok, w, wok)
				}
			}
		}
	}
}
