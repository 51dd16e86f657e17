package policy

import (
	"cmp"
	"slices"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/prefix"
)

// rankByScore returns candidates ordered by score, highest first when high is true, lowest
// first otherwise; ties keep the candidates' order. first, when >= 0, goes in front whatever
// its score.
func rankByScore(c []*endpoint.Endpoint, score []float64, high bool, first int) []*endpoint.Endpoint {
	idx := make([]int, len(c))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int {
		if a == first || b == first {
			if a == b {
				return 0
			}
			if a == first {
				return -1
			}
			return 1
		}
		if high {
			return cmp.Compare(score[b], score[a])
		}
		return cmp.Compare(score[a], score[b])
	})
	out := make([]*endpoint.Endpoint, len(c))
	for k, i := range idx {
		out[k] = c[i]
	}
	return out
}

// matchRuns returns, for each candidate by position, how many leading blocks of blocks x says
// it holds, x naming the candidates by their slots in t, which it writes into slots (as long
// as c; epTable.gather). By position, not by endpoint ID: IDs are never reused, and a slice
// as long as the highest would cost each request every endpoint the pool has ever had.
func matchRuns[T any](x *prefix.Index, t *epTable[T], c []*endpoint.Endpoint, blocks []uint64, slots []int) []int32 {
	t.gather(c, slots, nil)
	runs := make([]int32, len(c))
	x.MatchAmong(runs, slots, blocks)
	return runs
}

// indexTable is the slot table of a policy whose only per-endpoint state is in x: a slot that
// serves a new endpoint starts empty there.
func indexTable(clock Clock, x *prefix.Index) *epTable[struct{}] {
	return newEPTable(clock, func(slot int, reused bool) struct{} {
		if reused {
			x.Remove(slot) // what a late call wrote there after the last one left
		}
		return struct{}{}
	})
}
