package main

import (
	"context"
	"io"
	"os"

	"github.com/kvroute/kvroute/internal/experiment"
)

func runPlan(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return planMain(ctx, args, os.Stdin, stdout, stderr)
}

// planMain is runPlan with its standard input given (--trace -), for tests.
func planMain(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := newFlagSet("kvroute plan")
	var o experiment.PlanOptions
	var asJSON, quiet bool
	fs.StringVar(&o.Trace, "trace", "", "Mooncake JSONL trace `FILE` to replay"+stdinTraceHelp)
	fs.StringVar(&o.Workload, "workload", "", "synthetic workload NAME[:key=value,...] instead of --trace")
	fs.StringVar(&o.Profile, "profile", "llama3-70b-h200-tp8", "engine profile (model and hardware): "+profileNames())
	fs.StringVar(&o.Policies, "policies", "prefix-aware,least-request,round-robin", "policies to plan for, comma-separated, each NAME[:key=value,...]")
	fs.DurationVar(&o.P90, "slo-ttft-p90", 0, "the TTFT 90th percentile to meet (required), like 2s")
	fs.DurationVar(&o.P50, "slo-ttft-p50", 0, "also a TTFT median to meet (0: none)")
	fs.IntVar(&o.MaxInstances, "max-instances", 64, "the most instances to consider")
	fs.Float64Var(&o.Speedup, "speedup", 1, "replay arrivals this many times faster than the workload's time (2: twice the traffic)")
	fs.IntVar(&o.Limit, "limit", 0, "use only the first `N` requests (0: all)")
	fs.Uint64Var(&o.Seed, "seed", 1, "seed of the policies' randomness and of synthetic workloads")
	fs.BoolVar(&asJSON, "json", false, "print the plan as JSON")
	fs.BoolVar(&quiet, "quiet", false, "no progress on standard error (a line per simulation as it ends)")
	if _, code, exit := parseOrExit(fs, args, verbHelp{
		usage: []string{
			"usage: kvroute plan (--trace FILE | --workload NAME[:k=v,...]) --slo-ttft-p90 D [flags]   (FILE \"-\" reads standard input)",
			"\nFinds, for each policy, the fewest instances that serve the workload at its own arrival",
			"rate (times --speedup) with a TTFT p90 (and p50) within the SLO and no failed request,",
			"by simulating it in virtual time (kvroute simulate) at candidate fleet sizes.",
		},
		more:   columnsHelp(func(w io.Writer) { workloadHelp(w); policyHelp(w) }, planColumns),
		floats: map[string]string{"speedup": speedupRange},
	}, stdout, stderr); exit {
		return code
	}
	spool, err := spoolIfStdin(&o.Trace, stdin, fs.Name())
	if err != nil {
		return failed(stderr, fs.Name(), err)
	}
	defer spool.remove()
	defer experiment.TuneGC()()
	if !quiet {
		o.Progress = stderr
	}
	sum, err := experiment.Plan(ctx, o)
	if err != nil {
		return failed(stderr, fs.Name(), spool.explain(err))
	}
	if asJSON {
		err = writeJSON(stdout, sum)
	} else {
		err = sum.WriteTable(stdout)
	}
	if err != nil {
		return failed(stderr, fs.Name(), err)
	}
	return 0
}
