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
// it holds. By position, not by endpoint ID: IDs are never reused, and a slice as long as the
// highest would cost each request every endpoint the pool has ever had.
func matchRuns(x *prefix.Index, c []*endpoint.Endpoint, blocks []uint64) []int32 {
	ids := make([]int, 0, 32) // on the stack for a fleet of up to 32
	for _, e := range c {
		ids = append(ids, e.ID)
	}
	runs := make([]int32, len(c))
	x.MatchAmong(runs, ids, blocks)
	return runs
}
