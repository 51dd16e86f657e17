package experiment

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/kvroute/kvroute/internal/des"
	"github.com/kvroute/kvroute/internal/report"
	"github.com/kvroute/kvroute/internal/workload"
)

// PlanOptions are the flags of kvroute plan.
type PlanOptions struct {
	// Trace (a Mooncake JSONL file) or Workload (a generator spec): exactly one.
	Trace, Workload string
	// Profile of the engines; Policies to plan for, ParsePolicies' form.
	Profile, Policies string
	// Limit keeps the first requests only (0: all); MaxInstances is the most to consider.
	Limit, MaxInstances int
	// Speedup divides the arrival times (2: twice the traffic).
	Speedup float64
	Seed    uint64
	// P90 is the TTFT 90th percentile to meet (required); P50 a median too (0: none).
	P90, P50 time.Duration
	// Progress, when not nil, gets a line per simulation as it ends and one per policy when
	// its answer is known: a plan of a long trace runs for minutes.
	Progress io.Writer
}

// PlanResult is one policy's answer: the fewest instances that meet the SLO (0 when even
// max-instances do not), its figures there, and those of one instance fewer.
type PlanResult struct {
	Policy    string         `json:"policy"`
	Instances int            `json:"instances"`
	At        *report.Result `json:"at"`              // at Instances, or at max-instances when not met
	Below     *report.Result `json:"below,omitempty"` // at Instances - 1 (absent for 1)
	Runs      int            `json:"runs"`            // simulations it took
}

// PlanSummary is kvroute plan's answer for every policy (its --json).
type PlanSummary struct {
	Workload     string       `json:"workload"`
	Requests     int          `json:"requests"`
	Profile      string       `json:"profile"`
	Speedup      float64      `json:"speedup"`
	SLOP90MS     float64      `json:"slo_ttft_p90_ms"`
	SLOP50MS     float64      `json:"slo_ttft_p50_ms,omitempty"`
	MaxInstances int          `json:"max_instances"`
	Results      []PlanResult `json:"results"`
}

// Plan finds, for each policy in parallel, the fewest instances that serve the workload within
// the SLO with no failed request, by bisection over simulated fleet sizes.
func Plan(ctx context.Context, o PlanOptions) (*PlanSummary, error) {
	prof, specs, errs := checkSimulation(o.Trace, o.Workload, o.Limit, o.Profile, o.Policies)
	switch {
	case o.P90 == 0:
		errs = append(errs, errors.New("--slo-ttft-p90: give the TTFT p90 to meet, like 2s"))
	case o.P90 < 0:
		errs = append(errs, fmt.Errorf("--slo-ttft-p90 %v: want a positive duration, like 2s", o.P90))
	}
	if o.P50 < 0 {
		errs = append(errs, fmt.Errorf("--slo-ttft-p50 %v: want 0 (none) or a duration", o.P50))
	}
	if err := CheckInstances("--max-instances", o.MaxInstances); err != nil {
		errs = append(errs, err)
	}
	if o.Speedup <= 0 {
		// Worded as bench, demo and simulate word it (cmd/kvroute's speedupRange).
		errs = append(errs, fmt.Errorf("--speedup %v: want a positive finite factor, such as 2 (leave it out for 1)", o.Speedup))
	}
	if len(errs) > 0 {
		return nil, &UsageError{errors.Join(errs...)}
	}
	reqs, name, err := loadRequests(o.Trace, o.Workload, o.Seed, o.Limit)
	if err != nil {
		return nil, err
	}
	reqs = workload.Speedup(reqs, o.Speedup)
	model := des.ProfileFleet(prof, 1)
	w := des.Prepare(reqs, model.Model, model.BlockSize)

	sum := &PlanSummary{
		Workload: name, Requests: len(reqs), Profile: prof.Name, Speedup: o.Speedup,
		SLOP90MS: ms(o.P90), SLOP50MS: ms(o.P50), MaxInstances: o.MaxInstances,
		Results: make([]PlanResult, len(specs)),
	}
	meets := func(r *report.Result) bool {
		return r.Failed == 0 && r.TTFT.P90 <= ms(o.P90) && (o.P50 == 0 || r.TTFT.P50 <= ms(o.P50))
	}
	slots := newSlots()
	prog := planProgress{w: o.Progress, start: time.Now()}
	err = forEach(ctx, len(specs), "planning", func(ctx context.Context, i int) error {
		sp := specs[i]
		at := func(n int) (*report.Result, error) {
			fleet := des.ProfileFleet(prof, n)
			fleet.Seed = o.Seed
			res, _, err := slots.run(ctx, fleet, w, sp)
			if err != nil {
				return nil, fmt.Errorf("policy %s, %d instances: %w", sp.Label, n, err)
			}
			r := report.Summarize(sp.Label, res.Records, res.Busy)
			verdict := "meets the SLO"
			if !meets(&r) {
				verdict = "misses the SLO"
			}
			prog.printf("%s on %s: TTFT p90 %s ms, %d failed: %s", sp.Label, instances(n), report.Millis(r.TTFT.P90), r.Failed, verdict)
			return &r, nil
		}
		res, err := search(o.MaxInstances, at, meets)
		if err != nil {
			return err
		}
		res.Policy = sp.Label
		sum.Results[i] = res
		if res.Instances == 0 {
			prog.printf("%s: more than %d instances (%d simulations)", sp.Label, o.MaxInstances, res.Runs)
		} else {
			prog.printf("%s: %s (%d simulations)", sp.Label, instances(res.Instances), res.Runs)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return sum, nil
}

// instances is "1 instance", "4 instances".
func instances(n int) string {
	if n == 1 {
		return "1 instance"
	}
	return fmt.Sprintf("%d instances", n)
}

// planProgress writes Plan's progress lines, one at a time from its parallel searches.
type planProgress struct {
	mu    sync.Mutex
	w     io.Writer
	start time.Time
}

func (p *planProgress) printf(format string, args ...any) {
	if p.w == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, "plan: "+format+" (%s elapsed)\n", append(args, time.Since(p.start).Round(time.Second))...)
}

// search finds the fewest instances in [1, most] whose result meets the SLO, by bisection: more
// instances serve the same arrivals with less queueing, so once a size meets the SLO the larger
// ones do too (the answer's neighbour below is reported, and misses). Each size is simulated
// once.
func search(most int, simulate func(int) (*report.Result, error), meets func(*report.Result) bool) (PlanResult, error) {
	seen := map[int]*report.Result{}
	at := func(n int) (*report.Result, error) {
		if r, ok := seen[n]; ok {
			return r, nil
		}
		r, err := simulate(n)
		if err == nil {
			seen[n] = r
		}
		return r, err
	}
	top, err := at(most)
	if err != nil {
		return PlanResult{}, err
	}
	if !meets(top) {
		return PlanResult{At: top, Runs: len(seen)}, nil // not met even with the most
	}
	lo, hi := 1, most // hi meets
	for lo < hi {
		mid := (lo + hi) / 2
		r, err := at(mid)
		if err != nil {
			return PlanResult{}, err
		}
		if meets(r) {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	out := PlanResult{Instances: hi}
	if out.At, err = at(hi); err != nil {
		return PlanResult{}, err
	}
	if hi > 1 {
		if out.Below, err = at(hi - 1); err != nil {
			return PlanResult{}, err
		}
	}
	out.Runs = len(seen)
	return out, nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// WriteTable prints the plan as a table, and what the first policy saves against the others.
func (s *PlanSummary) WriteTable(w io.Writer) error {
	slo := fmt.Sprintf("TTFT p90 <= %gms", s.SLOP90MS)
	if s.SLOP50MS > 0 {
		slo += fmt.Sprintf(", p50 <= %gms", s.SLOP50MS)
	}
	fmt.Fprintf(w, "workload %s: %d requests, arrivals x%g, %s; SLO %s, no failure\n\n", s.Workload, s.Requests, s.Speedup, s.Profile, slo)
	tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "policy\tinstances\tTTFT p50 ms\tp90 ms\thit rate\tone fewer: p90 ms\tfailed\t")
	for _, r := range s.Results {
		n, below, failedBelow := "-", "-", "-"
		if r.Instances > 0 {
			n = fmt.Sprint(r.Instances)
		} else {
			n = fmt.Sprintf("> %d", s.MaxInstances)
		}
		if r.Below != nil {
			below, failedBelow = fmt.Sprintf("%.0f", r.Below.TTFT.P90), fmt.Sprint(r.Below.Failed)
		}
		fmt.Fprintf(tw, "%s\t%s\t%.0f\t%.0f\t%.3f\t%s\t%s\t\n", r.Policy, n, r.At.TTFT.P50, r.At.TTFT.P90, r.At.HitRate, below, failedBelow)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	// What the first policy saves against each of the others.
	if len(s.Results) > 1 && s.Results[0].Instances > 0 {
		first := s.Results[0]
		var parts []string
		for _, r := range s.Results[1:] {
			switch {
			case r.Instances == 0:
				parts = append(parts, fmt.Sprintf("%s needs more than %d", r.Policy, s.MaxInstances))
			case r.Instances > first.Instances:
				d := r.Instances - first.Instances
				parts = append(parts, fmt.Sprintf("%d fewer than %s (%.0f %%)", d, r.Policy, 100*float64(d)/float64(r.Instances)))
			case r.Instances == first.Instances:
				parts = append(parts, "as many as "+r.Policy)
			default:
				parts = append(parts, fmt.Sprintf("%d more than %s", first.Instances-r.Instances, r.Policy))
			}
		}
		unit := "instances"
		if first.Instances == 1 {
			unit = "instance"
		}
		fmt.Fprintf(w, "\n%s needs %d %s: %s.\n", first.Policy, first.Instances, unit, strings.Join(parts, "; "))
	}
	return nil
}
