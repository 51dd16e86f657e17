package main

import (
	"context"
	"fmt"
	"io"

	"github.com/kvroute/kvroute/internal/experiment"
	"github.com/kvroute/kvroute/internal/simserver"
)

func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("kvroute demo")
	var o experiment.DemoOptions
	var html string
	var asJSON, quiet bool
	fs.StringVar(&o.Policies, "policies", experiment.DemoPolicies, "policies to compare, comma-separated NAME[:key=value,...], or all")
	fs.IntVar(&o.Instances, "instances", 5, "simulated engine instances")
	fs.StringVar(&o.Workload, "workload", "", "synthetic workload NAME[:key=value,...] (default "+experiment.DemoWorkload+"; with --quick "+experiment.DemoQuickWorkload+")")
	fs.StringVar(&o.Trace, "trace", "", "Mooncake JSONL trace to replay instead of a synthetic workload")
	fs.Float64Var(&o.Speedup, "speedup", 0, "replay arrivals K times faster (default 1; a trace usually needs more)")
	fs.IntVar(&o.Requests, "requests", 0, "use only the first N requests (0: all)")
	fs.StringVar(&o.Profile, "profile", simserver.DefaultProfile, "engine profile of the simulated instances")
	fs.Float64Var(&o.TimeScale, "time-scale", 0, "wall seconds per model second of the simulated engines (0.5: twice as fast; default 2, 1 with --quick); reported times are model time")
	fs.Uint64Var(&o.Seed, "seed", 1, "seed of the workload, the engines and the policies")
	fs.BoolVar(&o.Quick, "quick", false, "a smaller workload (half the groups) at time-scale 1 that finishes in well under a minute")
	fs.BoolVar(&asJSON, "json", false, "print the summary as JSON (as kvroute simulate --json, plus live figures)")
	fs.StringVar(&html, "html", "demo-report.html", "write the HTML report here (empty: none)")
	fs.BoolVar(&quiet, "quiet", false, "no progress output")
	fs.BoolVar(&o.CompareSimulate, "compare-simulate", false, "also run the same scenario through kvroute simulate (virtual time) and print how far the live figures are from it")
	if _, code, exit := parseOrExit(fs, args, verbHelp{
		usage: []string{
			"usage: kvroute demo [--quick] [flags]",
			"\nStarts simulated vLLM instances and, for each policy in turn, a kvroute router in front of them",
			"(all in this process, on loopback), replays a workload through it and prints the policies side by side.",
		},
		more: policyHelp,
	}, stdout, stderr); exit {
		return code
	}
	if err := checkOutputs(map[string]string{"html": html}); err != nil {
		return failed(stderr, fs.Name(), err)
	}
	o.Progress, o.Log = progressMode(stderr, quiet), stderr
	d, err := experiment.Demo(ctx, o)
	if err != nil {
		return failed(stderr, fs.Name(), err)
	}
	if asJSON {
		err = writeJSON(stdout, d)
	} else {
		err = d.WriteTable(stdout)
	}
	if err != nil {
		return failed(stderr, fs.Name(), err)
	}
	if html != "" {
		if err := d.WriteHTML(html); err != nil {
			return failed(stderr, fs.Name(), err)
		}
		if !quiet {
			fmt.Fprintf(stderr, "kvroute demo: report written to %s\n", html)
		}
	}
	return 0
}
