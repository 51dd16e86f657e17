package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"runtime"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/kvroute/kvroute/internal/des"
	"github.com/kvroute/kvroute/internal/report"
	"github.com/kvroute/kvroute/internal/workload"
)

type planFlags struct {
	trace, workload, profile, policies string
	limit, maxInstances                int
	speedup                            float64
	seed                               uint64
	p90, p50                           time.Duration
	json                               bool
}

// planResult is one policy's answer: the fewest instances that meet the SLO (0 when even
// max-instances do not), its figures there, and those of one instance fewer.
type planResult struct {
	Policy    string         `json:"policy"`
	Instances int            `json:"instances"`
	At        *report.Result `json:"at"`              // at Instances, or at max-instances when not met
	Below     *report.Result `json:"below,omitempty"` // at Instances - 1 (absent for 1)
	Runs      int            `json:"runs"`            // simulations it took
}

type planSummary struct {
	Workload     string       `json:"workload"`
	Requests     int          `json:"requests"`
	Profile      string       `json:"profile"`
	Speedup      float64      `json:"speedup"`
	SLOP90MS     float64      `json:"slo_ttft_p90_ms"`
	SLOP50MS     float64      `json:"slo_ttft_p50_ms,omitempty"`
	MaxInstances int          `json:"max_instances"`
	Results      []planResult `json:"results"`
}

func runPlan(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("kvroute plan")
	var f planFlags
	fs.StringVar(&f.trace, "trace", "", "Mooncake JSONL trace to replay")
	fs.StringVar(&f.workload, "workload", "", "synthetic workload NAME[:key=value,...] instead of --trace")
	fs.StringVar(&f.profile, "profile", "llama3-70b-h200-tp8", "engine profile (model and hardware)")
	fs.StringVar(&f.policies, "policies", "prefix-aware,least-request,round-robin", "policies to plan for, comma-separated, each NAME[:key=value,...]")
	fs.DurationVar(&f.p90, "slo-ttft-p90", 0, "the TTFT 90th percentile to meet (required), like 2s")
	fs.DurationVar(&f.p50, "slo-ttft-p50", 0, "also a TTFT median to meet (0: none)")
	fs.IntVar(&f.maxInstances, "max-instances", 64, "the most instances to consider")
	fs.Float64Var(&f.speedup, "speedup", 1, "divide arrival times by this factor (2: twice the traffic)")
	fs.IntVar(&f.limit, "limit", 0, "use only the first N requests (0: all)")
	fs.Uint64Var(&f.seed, "seed", 1, "seed of the policies' randomness and of synthetic workloads")
	fs.BoolVar(&f.json, "json", false, "print the plan as JSON")
	if _, code, exit := parseOrExit(fs, args, verbHelp{
		usage: []string{
			"usage: kvroute plan (--trace FILE | --workload NAME[:k=v,...]) --slo-ttft-p90 D [flags]",
			"\nFinds, for each policy, the fewest instances that serve the workload at its own arrival",
			"rate (times --speedup) with a TTFT p90 (and p50) within the SLO and no failed request,",
			"by simulating it in virtual time (kvroute simulate) at candidate fleet sizes.",
		},
		more: func(w io.Writer) { workloadHelp(w); policyHelp(w) },
	}, stdout, stderr); exit {
		return code
	}
	defer simulationGC()()
	sum, err := plan(ctx, &f)
	if err != nil {
		return failed(stderr, fs.Name(), err)
	}
	if f.json {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		err = enc.Encode(sum)
	} else {
		err = writePlanTable(stdout, sum)
	}
	if err != nil {
		return failed(stderr, fs.Name(), err)
	}
	return 0
}

func plan(ctx context.Context, f *planFlags) (*planSummary, error) {
	prof, specs, errs := checkSimulation(f.trace, f.workload, f.limit, f.profile, f.policies)
	if f.p90 <= 0 {
		errs = append(errs, errors.New("--slo-ttft-p90: give the TTFT p90 to meet, like 2s"))
	}
	if f.p50 < 0 {
		errs = append(errs, fmt.Errorf("--slo-ttft-p50 %v: want 0 (none) or a duration", f.p50))
	}
	if f.maxInstances < 1 {
		errs = append(errs, fmt.Errorf("--max-instances %d: want at least 1", f.maxInstances))
	}
	if f.speedup <= 0 {
		errs = append(errs, fmt.Errorf("--speedup %v: want a positive factor", f.speedup))
	}
	if len(errs) > 0 {
		return nil, usageError{errors.Join(errs...)}
	}
	reqs, name, err := loadRequests(f.trace, f.workload, f.seed, f.limit)
	if err != nil {
		return nil, err
	}
	reqs = workload.Speedup(reqs, f.speedup)
	model := des.ProfileFleet(prof, 1)
	w := des.Prepare(reqs, model.Model, model.BlockSize)

	sum := &planSummary{
		Workload: name, Requests: len(reqs), Profile: prof.Name, Speedup: f.speedup,
		SLOP90MS: ms(f.p90), SLOP50MS: ms(f.p50), MaxInstances: f.maxInstances,
		Results: make([]planResult, len(specs)),
	}
	meets := func(r *report.Result) bool {
		return r.Failed == 0 && r.TTFT.P90 <= ms(f.p90) && (f.p50 == 0 || r.TTFT.P50 <= ms(f.p50))
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg      sync.WaitGroup
		errsMu  sync.Mutex
		runErrs []error
		sem     = make(chan struct{}, max(1, runtime.GOMAXPROCS(0)))
	)
	for i, sp := range specs {
		wg.Go(func() {
			at := func(n int) (*report.Result, error) {
				select {
				case sem <- struct{}{}:
				case <-ctx.Done():
					return nil, ctx.Err()
				}
				defer func() { <-sem }()
				fleet := des.ProfileFleet(prof, n)
				fleet.Seed = f.seed
				res, err := des.Run(ctx, fleet, w, sp.label, des.Named(sp.name, sp.params))
				if err != nil {
					return nil, fmt.Errorf("policy %s, %d instances: %w", sp.label, n, err)
				}
				r := report.Summarize(sp.label, res.Records, res.Busy)
				return &r, nil
			}
			res, err := search(f.maxInstances, at, meets)
			if err != nil {
				errsMu.Lock()
				runErrs = append(runErrs, err)
				errsMu.Unlock()
				cancel()
				return
			}
			res.Policy = sp.label
			sum.Results[i] = res
		})
	}
	wg.Wait()
	for _, err := range runErrs {
		if !errors.Is(err, context.Canceled) {
			return nil, err
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("planning interrupted: %w", err)
	}
	return sum, nil
}

// search finds the fewest instances in [1, most] whose result meets the SLO, by bisection: more
// instances serve the same arrivals with less queueing, so once a size meets the SLO the larger
// ones do too (the answer's neighbour below is reported, and misses). Each size is simulated
// once.
func search(most int, simulate func(int) (*report.Result, error), meets func(*report.Result) bool) (planResult, error) {
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
		return planResult{}, err
	}
	if !meets(top) {
		return planResult{At: top, Runs: len(seen)}, nil // not met even with the most
	}
	lo, hi := 1, most // hi meets
	for lo < hi {
		mid := (lo + hi) / 2
		r, err := at(mid)
		if err != nil {
			return planResult{}, err
		}
		if meets(r) {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	out := planResult{Instances: hi}
	if out.At, err = at(hi); err != nil {
		return planResult{}, err
	}
	if hi > 1 {
		if out.Below, err = at(hi - 1); err != nil {
			return planResult{}, err
		}
	}
	out.Runs = len(seen)
	return out, nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func writePlanTable(w io.Writer, s *planSummary) error {
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
