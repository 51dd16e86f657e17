package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/kvroute/kvroute/internal/experiment"
	"github.com/kvroute/kvroute/internal/simserver"
)

// demoTimeScaleRange is what demo's --time-scale takes (experiment.Demo's bounds).
const demoTimeScaleRange = "a factor above 0 up to 100 (1: real time, 0.5: twice as fast)"

func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return demoMain(ctx, args, os.Stdin, stdout, stderr)
}

// demoMain is runDemo with its standard input given (--trace -), for tests.
func demoMain(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := newFlagSet("kvroute demo")
	var o experiment.DemoOptions
	var html string
	var asJSON, quiet bool
	fs.StringVar(&o.Policies, "policies", experiment.DemoPolicies, "policies to compare, comma-separated NAME[:key=value,...], or all")
	fs.IntVar(&o.Instances, "instances", 5, "simulated engine instances")
	fs.StringVar(&o.Workload, "workload", "", "synthetic workload NAME[:key=value,...] (default "+experiment.DemoWorkload+"; with --quick "+experiment.DemoQuickWorkload+")")
	fs.StringVar(&o.Trace, "trace", "", "Mooncake JSONL trace `FILE` to replay instead of a synthetic workload"+stdinTraceHelp)
	fs.Float64Var(&o.Speedup, "speedup", 0, "replay arrivals this many times faster than the workload's time (default 1; a trace usually needs more, or --requests)")
	fs.IntVar(&o.Requests, "requests", 0, "use only the first `N` requests (0: all)")
	fs.StringVar(&o.Profile, "profile", simserver.DefaultProfile, "engine profile of the simulated instances: "+profileNames())
	fs.Float64Var(&o.TimeScale, "time-scale", 0, "wall seconds per model second of the simulated engines (0.5: twice as fast; default 2, 1 with --quick); reported times are model time")
	fs.Uint64Var(&o.Seed, "seed", 1, "seed of the workload, the engines and the policies")
	fs.BoolVar(&o.Quick, "quick", false, "a smaller workload (half the groups) at time-scale 1 that finishes in well under a minute")
	fs.BoolVar(&asJSON, "json", false, "print the summary as JSON (as kvroute simulate --json, plus live figures)")
	fs.StringVar(&html, "html", "demo-report.html", "write the HTML report here (empty: none)")
	fs.BoolVar(&quiet, "quiet", false, "no progress output")
	fs.BoolVar(&o.CompareSimulate, "compare-simulate", false, "also run the same scenario through kvroute simulate (virtual time) and print how far the live figures are from it")
	if _, code, exit := parseOrExit(fs, args, verbHelp{
		usage: []string{
			"usage: kvroute demo [--quick] [flags]   (--trace FILE: FILE \"-\" reads standard input)",
			"\nStarts simulated vLLM instances and, for each policy in turn, a kvroute router in front of them",
			"(all in this process, on loopback), replays a workload through it and prints the policies side by side.",
		},
		more: columnsHelp(policyHelp, summaryColumns, demoColumns),
		floats: map[string]string{
			"speedup":    speedupRange,
			"time-scale": demoTimeScaleRange,
		},
	}, stdout, stderr); exit {
		return code
	}
	// 0 is the default of both, which means 1 (--speedup) or 2, 1 with --quick (--time-scale):
	// given on the command line it is a mistake.
	var errs []error
	fs.Visit(func(f *flag.Flag) {
		switch {
		case f.Name == "speedup" && !(o.Speedup > 0):
			errs = append(errs, fmt.Errorf("--speedup %g: want %s", o.Speedup, speedupRange))
		case f.Name == "time-scale" && !(o.TimeScale > 0):
			errs = append(errs, fmt.Errorf("--time-scale %g: want %s", o.TimeScale, demoTimeScaleRange))
		}
	})
	if err := errors.Join(errs...); err != nil {
		return failed(stderr, fs.Name(), usageError{err})
	}
	if err := checkOutputs(map[string]string{"html": html}); err != nil {
		return failed(stderr, fs.Name(), err)
	}
	spool, err := spoolIfStdin(&o.Trace, stdin, fs.Name())
	if err != nil {
		return failed(stderr, fs.Name(), err)
	}
	defer spool.remove()
	o.Progress, o.Log = progressMode(stderr, quiet), stderr
	d, err := experiment.Demo(ctx, o)
	if err != nil {
		return failed(stderr, fs.Name(), spool.explain(err))
	}
	if d.InterruptedDuring != "" && len(d.Results) == 0 {
		fmt.Fprintf(stderr, "kvroute demo: interrupted during the first policy, %s: no policy ran to the end\n", d.InterruptedDuring)
		return interruptedStatus(ctx)
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
	switch d.InterruptedDuring {
	case "":
	case experiment.DemoComparison:
		fmt.Fprintf(stderr, "kvroute demo: interrupted during --compare-simulate: the report holds the live runs of all %d policies, not compared\n", len(d.Results))
		return interruptedStatus(ctx)
	default:
		fmt.Fprintf(stderr, "kvroute demo: interrupted during policy %s: the report holds the %d before it\n", d.InterruptedDuring, len(d.Results))
		return interruptedStatus(ctx)
	}
	return 0
}
