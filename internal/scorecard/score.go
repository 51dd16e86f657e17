package scorecard

import (
	"fmt"
	"math"
)

// The targets of issue #16 for the subject policy, in every cell.
const (
	// HitTarget: hit rate at least this fraction of the pooled-LRU bound...
	HitTarget = 0.98
	// HitSlack: ...or, where no policy reaches that, within this much of the best hit rate.
	HitSlack = 0.005
	// TTFTTarget: TTFT mean and p99 at most this multiple of the best other policy's (of
	// least-request's on a workload without shared prefixes).
	TTFTTarget = 1.02
	// ImbalanceTarget: max / mean busy fraction at most this.
	ImbalanceTarget = 1.2
	// baseline is the policy a workload without shared prefixes is compared with.
	baseline = "least-request"
)

// Verdict says whether the subject met its targets in a cell, and where not, by how much.
type Verdict struct {
	Met    bool     `json:"met"`
	Misses []string `json:"misses,omitempty"`
	// Quick: the cell is a quick run's (Options.Quick), one seed and load, its workload
	// perhaps cut short: the verdict is indicative only, the full scorecard's decides.
	Quick bool `json:"quick,omitempty"`
}

// score fills in each policy's hit rate over the bound and its TTFT ratios to the best other.
func score(c *Cell) {
	for i := range c.Scores {
		s := &c.Scores[i]
		if b := c.Bounds.PooledLRUHitRate; b > 0 {
			s.HitOfBound = s.HitRate / b
		}
		mean, p50, p99 := math.Inf(1), math.Inf(1), math.Inf(1)
		for j := range c.Scores {
			o := &c.Scores[j]
			if j == i || o.Completed == 0 {
				continue
			}
			mean, p50, p99 = min(mean, o.TTFT.Mean), min(p50, o.TTFT.P50), min(p99, o.TTFT.P99)
		}
		s.MeanRatio, s.P50Ratio, s.P99Ratio = ratio(s.TTFT.Mean, mean), ratio(s.TTFT.P50, p50), ratio(s.TTFT.P99, p99)
	}
}

// ratio is a / b, 0 when b is no figure (no other policy) or 0.
func ratio(a, b float64) float64 {
	if math.IsInf(b, 0) || b <= 0 {
		return 0
	}
	return a / b
}

// judge checks the subject, Scores[k], against the targets.
func judge(c *Cell, k int) *Verdict {
	s := &c.Scores[k]
	v := &Verdict{}
	miss := func(format string, args ...any) { v.Misses = append(v.Misses, fmt.Sprintf(format, args...)) }
	if s.Failed > 0 {
		miss("%d requests failed", s.Failed)
	}
	if c.NoSharing {
		for j := range c.Scores {
			o := &c.Scores[j]
			if o.Policy != baseline || j == k {
				continue
			}
			if r := s.TTFT.Mean / o.TTFT.Mean; r > TTFTTarget {
				miss("TTFT mean %.4g ms is %.3f x %s's %.4g (target %.2f)", s.TTFT.Mean, r, baseline, o.TTFT.Mean, TTFTTarget)
			}
			if r := s.TTFT.P99 / o.TTFT.P99; r > TTFTTarget {
				miss("TTFT p99 %.4g ms is %.3f x %s's %.4g (target %.2f)", s.TTFT.P99, r, baseline, o.TTFT.P99, TTFTTarget)
			}
		}
	} else {
		reached, best := false, 0.0
		for j := range c.Scores {
			reached = reached || c.Scores[j].HitOfBound >= HitTarget
			best = max(best, c.Scores[j].HitRate)
		}
		switch {
		case reached && s.HitOfBound < HitTarget:
			miss("hit rate %.3f is %.3f of the bound %.3f (target %.2f)", s.HitRate, s.HitOfBound, c.Bounds.PooledLRUHitRate, HitTarget)
		case !reached && s.HitRate < best-HitSlack:
			miss("hit rate %.3f is %.4f below the best, %.3f (target: within %.3f; no policy reaches %.2f of the bound %.3f)",
				s.HitRate, best-s.HitRate, best, HitSlack, HitTarget, c.Bounds.PooledLRUHitRate)
		}
		if s.MeanRatio > TTFTTarget {
			miss("TTFT mean %.4g ms is %.3f x the best other's (target %.2f)", s.TTFT.Mean, s.MeanRatio, TTFTTarget)
		}
		if s.P99Ratio > TTFTTarget {
			miss("TTFT p99 %.4g ms is %.3f x the best other's (target %.2f)", s.TTFT.P99, s.P99Ratio, TTFTTarget)
		}
	}
	if s.Imbalance > ImbalanceTarget {
		miss("imbalance %.3f (target %.1f)", s.Imbalance, ImbalanceTarget)
	}
	v.Met = len(v.Misses) == 0
	return v
}
