package main

import (
	"context"
	"flag"
	"io"
	"strings"

	"github.com/kvroute/kvroute/internal/experiment"
	"github.com/kvroute/kvroute/internal/scorecard"
)

// runScorecard is `kvroute simulate --scorecard`: of simulate's flags it takes --trace (the
// Mooncake conversation trace; spool holds it when it came on standard input), --policies,
// --seed or --seeds, --scenarios, --non-streamed, --json, --html, --quick and --quiet. Unless
// quiet it tells its progress on stderr, as bench does: a full scorecard runs for many minutes.
func runScorecard(ctx context.Context, fs *flag.FlagSet, o experiment.SimulateOptions, spool *spooledTrace, seeds, scenarios string, asJSON, quiet, quick bool, stdout, stderr io.Writer) int {
	var stray []string
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "scorecard", "trace", "policies", "seed", "seeds", "scenarios", "json", "html", "non-streamed", "quiet", "quick":
		default:
			stray = append(stray, "--"+f.Name)
		}
	})
	if len(stray) > 0 {
		return failed(stderr, fs.Name(), usageErr("%s: not with --scorecard, which sets its own fleets, loads and workloads", strings.Join(stray, ", ")))
	}
	opt := scorecard.Options{Trace: o.Trace, Policies: o.Policies, Seeds: []uint64{o.Seed}, NonStreamed: o.NonStreamed, Quick: quick}
	if !quiet {
		opt.Progress = stderr
	}
	if err := experiment.CheckNonStreamed(o.NonStreamed); err != nil {
		return failed(stderr, fs.Name(), usageError{err})
	}
	if seeds != "" {
		s, err := scorecard.ParseSeeds(seeds)
		if err != nil {
			return failed(stderr, fs.Name(), usageError{err})
		}
		if quick && len(s) > 1 {
			return failed(stderr, fs.Name(), usageErr("--seeds %s: --quick runs one seed: give it with --seed (or leave --quick out)", seeds))
		}
		opt.Seeds = s
	}
	if scenarios != "" {
		opt.Scenarios = strings.Split(scenarios, ",")
	}
	sc, err := scorecard.Run(ctx, opt)
	if err == nil && spool != nil {
		// The report names the trace by its path: not the temporary file's.
		sc.Trace = stdinTraceName
		for i := range sc.Cells {
			if sc.Cells[i].Workload == spool.path {
				sc.Cells[i].Workload = stdinTraceName
			}
		}
	}
	if err == nil && o.HTML != "" {
		err = sc.SaveHTML(o.HTML)
	}
	if err == nil && asJSON {
		err = sc.WriteJSON(stdout)
	} else if err == nil {
		err = sc.WriteTable(stdout)
	}
	if err != nil {
		return failed(stderr, fs.Name(), spool.explain(err))
	}
	return 0
}
