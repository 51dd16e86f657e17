package prefix

import (
	"math/rand/v2"
	"testing"
)

// TestIndex_MatchAfterDrop: Drop can take blocks whose descendants a later Insert added (a
// request that failed before its first token, after another one extended its prompt on the same
// endpoint), leaving descendants without their parent. Match must not fail on such an index
// (it indexed a missing entry, and a simulation on 4 overloaded instances, whose first-token
// timeouts drop blocks, panicked). Its answer for such an endpoint may be off (Match relies on
// whole prefixes); it stays within the chain.
func TestIndex_MatchAfterDrop(t *testing.T) {
	for seed := range uint64(3000) {
		r := rand.New(rand.NewPCG(seed, 1))
		x := NewIndex(IndexConfig{DefaultCapacity: 100})
		var chains [][]uint64
		for i := range 8 {
			keys := make([]uint64, 1+r.IntN(5))
			for k := range keys {
				keys[k] = uint64(1 + k)
			}
			keys[len(keys)-1] += uint64(r.IntN(2)) * 10
			c := chain(keys...)
			chains = append(chains, c)
			if ep := r.IntN(2); r.IntN(3) == 0 {
				x.Drop(ep, c[r.IntN(len(c)):])
			} else {
				x.Insert(ep, c, int64(i+1))
			}
		}
		for _, c := range chains {
			runs := make([]int32, 2)
			x.Match(runs, c)
			for ep, n := range runs {
				if n < 0 || int(n) > len(c) {
					t.Fatalf("seed %d: endpoint %d's run is %d blocks of a %d-block chain", seed, ep, n, len(c))
				}
			}
		}
	}
}
