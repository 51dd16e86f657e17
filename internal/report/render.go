package report

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
)

// WriteJSON writes s as indented JSON followed by a newline.
func WriteJSON(w io.Writer, s *Summary) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(s); err != nil {
		return fmt.Errorf("write json summary: %w", err)
	}
	return nil
}

// WriteTable writes s as a human-readable header and an aligned table, one row per policy.
func WriteTable(w io.Writer, s *Summary) error {
	sc := s.Scenario
	whole := ""
	if sc.NonStreamed > 0 {
		whole = fmt.Sprintf(", %g of them not streamed", sc.NonStreamed)
	}
	if _, err := fmt.Fprintf(w, "workload %s: %d requests%s, %d x %s, speed-up %.3g (load %.2f), seed %d\n",
		sc.Workload, sc.Requests, whole, sc.Instances, sc.Profile, sc.Speedup, sc.Load, sc.Seed); err != nil {
		return fmt.Errorf("write table: %w", err)
	}
	if _, err := fmt.Fprintf(w, "hit-rate bounds: infinite cache %.3f, pooled LRU %s\n\n",
		s.Bounds.InfiniteCacheHitRate, rate(s.Bounds.PooledLRUHitRate, s.Bounds.PooledLRUUnknown)); err != nil {
		return fmt.Errorf("write table: %w", err)
	}
	// Numbers are right-aligned; the policy column is padded by hand so that it reads
	// left-aligned.
	width := len("policy")
	for i := range s.Results {
		width = max(width, len(s.Results[i].Policy))
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "%-*s\thit rate\tTTFT mean ms\tp50\tp90\tp99\tTPOT p50 ms\ttok/s\timbalance\tcompleted\tfailed\t\n", width, "policy")
	for i := range s.Results {
		r := &s.Results[i]
		fmt.Fprintf(tw, "%-*s\t%s\t%s\t%s\t%s\t%s\t%s\t%.0f\t%.2f\t%d\t%d\t\n",
			width, r.Policy, rate(r.HitRate, r.HitRateUnknown), Millis(r.TTFT.Mean), Millis(r.TTFT.P50), Millis(r.TTFT.P90), Millis(r.TTFT.P99),
			Millis(r.TPOT.P50), r.ThroughputTokensPerS, r.LoadImbalance, r.Completed, r.Failed)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write table: %w", err)
	}
	// No policy can beat the infinite cache from a cold start: a live run above it found the
	// engines holding the workload's prefixes from before (an earlier run), and its hit rates
	// do not compare with a cold one's.
	for i := range s.Results {
		r := &s.Results[i]
		if !r.HitRateUnknown && r.Completed > 0 && r.HitRate > s.Bounds.InfiniteCacheHitRate+0.005 {
			if _, err := fmt.Fprintf(w, "\nnote: %s's hit rate %.3f is above the infinite-cache bound %.3f: the engines held this workload's prefixes from before the run (warm caches); restart them to compare from cold\n",
				r.Policy, r.HitRate, s.Bounds.InfiniteCacheHitRate); err != nil {
				return fmt.Errorf("write table: %w", err)
			}
		}
	}
	return nil
}

// rate formats a hit rate with three decimals, or "unknown".
func rate(v float64, unknown bool) string {
	if unknown {
		return "unknown"
	}
	return strconv.FormatFloat(v, 'f', 3, 64)
}

// Millis formats a latency in milliseconds with about three significant digits, no exponent.
func Millis(ms float64) string {
	switch {
	case ms >= 100:
		return strconv.FormatFloat(ms, 'f', 0, 64)
	case ms >= 10:
		return strconv.FormatFloat(ms, 'f', 1, 64)
	default:
		return strconv.FormatFloat(ms, 'f', 2, 64)
	}
}
