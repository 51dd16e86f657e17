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
	// Load 0 is unknown: a live target's capacity (bench), or arrivals that span no time.
	load := ""
	if sc.Load > 0 {
		load = fmt.Sprintf(" (load %.2f)", sc.Load)
	}
	if _, err := fmt.Fprintf(w, "workload %s: %d requests%s, %d x %s, %s%s, seed %d\n",
		sc.Workload, sc.Requests, whole, sc.Instances, sc.Profile, pacing(&sc), load, sc.Seed); err != nil {
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
		// Without a completed request nothing was timed, nor spread: "-", not a 0 that
		// reads as instant.
		mean, p50, p90, p99, tpot, imb := "-", "-", "-", "-", "-", "-"
		if r.Completed > 0 {
			mean, p50, p90, p99 = Millis(r.TTFT.Mean), Millis(r.TTFT.P50), Millis(r.TTFT.P90), Millis(r.TTFT.P99)
			tpot, imb = Millis(r.TPOT.P50), imbalance(r.LoadImbalance)
		}
		fmt.Fprintf(tw, "%-*s\t%s\t%s\t%s\t%s\t%s\t%s\t%.0f\t%s\t%d\t%d\t\n",
			width, r.Policy, rate(r.HitRate, r.HitRateUnknown), mean, p50, p90, p99, tpot, r.ThroughputTokensPerS, imb, r.Completed, r.Failed)
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

// pacing is what set the arrivals: "speed-up 2", or the Pacing that replaced the workload's
// times (bench --rate, --concurrency), where a speed-up did not apply.
func pacing(sc *Scenario) string {
	if sc.Pacing != "" {
		return sc.Pacing
	}
	return fmt.Sprintf("speed-up %.3g", sc.Speedup)
}

// imbalance formats a load imbalance with two decimals, or "-" for 0: no instance was busy,
// or (a live target that does not name its backends) nothing tells the instances apart.
func imbalance(v float64) string {
	if v == 0 {
		return "-"
	}
	return strconv.FormatFloat(v, 'f', 2, 64)
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
