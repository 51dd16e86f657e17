package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/pprof"

	"github.com/kvroute/kvroute/internal/des"
	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/experiment"
	"github.com/kvroute/kvroute/internal/route"
	"github.com/kvroute/kvroute/internal/scorecard"
)

func runSimulate(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return simulateMain(ctx, args, os.Stdin, stdout, stderr)
}

// maxRouters bounds --routers: far above the replicas any deployment runs, each of which the
// simulation keeps a whole router for (10,000 took 20 s on four requests; 10^11 ran out of
// memory).
const maxRouters = 1000

// simulateMain is runSimulate with its standard input given (--trace -), for tests.
func simulateMain(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := newFlagSet("kvroute simulate")
	var o experiment.SimulateOptions
	var cpuprofile string
	var asJSON, card, quiet, quick bool
	var seeds, scenarios string
	fs.StringVar(&o.Trace, "trace", "", "Mooncake JSONL trace `FILE` to replay"+stdinTraceHelp)
	fs.StringVar(&o.Workload, "workload", "", "synthetic workload NAME[:key=value,...] instead of --trace")
	fs.IntVar(&o.Instances, "instances", 8, "number of engine instances")
	fs.StringVar(&o.Profile, "profile", "llama3-70b-h200-tp8", "engine profile (model and hardware): "+profileNames())
	fs.IntVar(&o.BlockSize, "block-size", 0, "engine KV block size in tokens, same KV capacity (0: the profile's; 512 replays the Mooncake trace ~20x faster)")
	fs.StringVar(&o.Policies, "policies", "", "policies to compare, comma-separated, each NAME[:key=value,...] (default: all registered)")
	fs.Float64Var(&o.Load, "load", 0, "scale arrivals so that prefill work without cache hits is this fraction of the fleet's prefill capacity")
	fs.Float64Var(&o.Speedup, "speedup", 0, "replay arrivals this many times faster than the workload's time (instead of --load; default 1)")
	fs.IntVar(&o.Limit, "limit", 0, "use only the first `N` requests (0: all)")
	fs.Float64Var(&o.NonStreamed, "non-streamed", 0, "the fraction of requests whose clients ask for the answer whole (\"stream\": false), from 0 to 1: the router sees no first token of theirs, only the end")
	fs.Uint64Var(&o.Seed, "seed", 1, "seed of the policies' randomness and of synthetic workloads")
	fs.DurationVar(&o.ScrapeInterval, "scrape-interval", des.DefaultScrapeInterval, "how often the router sees fresh engine metrics (kvroute serve's scrape.interval defaults to 1s)")
	fs.DurationVar(&o.NetworkLatency, "network-latency", 0, "one-way router-engine latency")
	fs.IntVar(&o.Routers, "routers", 1, "router replicas behind a load balancer, each with its own policy instance and load counters")
	fs.Var((*listFlag)(&o.Kill), "kill", "kill instance N at virtual time T: `N@T`, T a duration (90s) or a share of the arrivals' span (50%); its requests fail, later ones fall back (repeatable)")
	fs.Var((*listFlag)(&o.Add), "add", "add instance N at virtual time T (`N@T` as for --kill): it takes no request before (repeatable)")
	fs.Var((*listFlag)(&o.Fail), "fail", "from `N@T` (as for --kill) instance N answers every request 500 at once (repeatable)")
	fs.Var((*listFlag)(&o.Hang), "hang", "from `N@T` instance N accepts requests and answers nothing; its metrics still come (repeatable)")
	fs.Var((*listFlag)(&o.Cut), "cut", "from `N@T` instance N cuts every stream after --cut-after tokens (repeatable)")
	fs.Var((*listFlag)(&o.Blind), "blind", "from `N@T` instance N finds nothing cached for any prompt and reports no cached tokens, as an engine with prefix caching off or another cache salt, tokenizer or block size: a silent zero hit, which the router's cache audit finds (repeatable)")
	fs.Var((*listFlag)(&o.Recover), "recover", "at `N@T` instance N's fault (a --kill, --fail, --hang, --cut or --blind of it by then) ends; a killed instance restarts with an empty cache (repeatable)")
	fs.BoolVar(&o.NoAudit, "no-cache-audit", false, "run the routers without the cache audit (on in kvroute serve, always): to measure what it is worth against a --blind instance")
	fs.IntVar(&o.CutAfter, "cut-after", 5, "tokens a stream gets from a --cut instance before the cut")
	fs.DurationVar(&o.FirstTokenTimeout, "first-token-timeout", des.DefaultFirstTokenTimeout, "limits.first_token_timeout: an attempt without its first token by then fails over to the next ranked instance (0: none)")
	fs.DurationVar(&o.StallTimeout, "stall-timeout", des.DefaultStallTimeout, "limits.stall_timeout: an attempt whose instance answers nothing for this long (or 20 x its predicted TTFT, or 20 x its prompt's prefill where no TTFT is predicted, where longer) fails over before the first-token timeout; every policy (0: none)")
	fs.DurationVar(&o.StreamIdleTimeout, "stream-idle-timeout", des.DefaultStreamIdleTimeout, "limits.stream_idle_timeout: a stream silent this long fails (0: none)")
	fs.IntVar(&o.PassiveFailures, "passive-failures", des.DefaultPassiveFailures, "health.passive_failures: consecutive failures (5xx, timeouts, cut streams, connection errors) that eject an instance")
	fs.DurationVar(&o.EjectionTime, "ejection-time", route.DefaultBaseEjection, "health.ejection_time: a first ejection's length (n times that for the n-th in a row)")
	fs.DurationVar(&o.MaxEjectionTime, "max-ejection-time", route.DefaultMaxEjection, "health.max_ejection_time: the longest ejection")
	fs.IntVar(&o.MaxEjectedPercent, "max-ejected-percent", route.DefaultMaxEjectedPercent, "health.max_ejected_percent: the most of the fleet ejected at once")
	fs.StringVar(&o.Autoscale, "autoscale", "", "grow the fleet from start= instances (up to --instances) on the router's saturation signal, as KEDA would: start=N,target=X,interval=30s,delay=2m,window=1m,rate=0,every=D; no target: watch the signal only (docs/kubernetes.md)")
	fs.StringVar(&o.Ramp, "ramp", "", "FROM-TO: the arrival rate goes from FROM to TO times its mean over the run, such as 0.4-1.6")
	fs.StringVar(&o.ReplicaAffinity, "replica-affinity", "none", "how the load balancer spreads requests over --routers: none (round-robin per request) or session (hash of the session key)")
	fs.StringVar(&o.ReplicaSync, "replica-sync", "off", "router replicas share their events (routed, first token, end with its failure, engine found stalled) after this delay, such as 1ms or 50ms; off: each knows only its own")
	fs.Float64Var(&o.ReplicaSyncLoss, "replica-sync-loss", 0, "probability that one shared event does not reach one replica")
	fs.DurationVar(&o.ReplicaSyncBatch, "replica-sync-batch", 0, "send each replica's events in batches of this interval, as the live peers.batch_interval does (10ms by default there), the --replica-sync delay then being the transit; 0: each event on its own")
	fs.BoolVar(&asJSON, "json", false, "print the summary as JSON")
	fs.StringVar(&cpuprofile, "cpuprofile", "", "write a Go CPU profile of the run to this file")
	fs.StringVar(&o.HTML, "html", "", "also write an HTML report with charts to this file")
	fs.StringVar(&o.Records, "records", "", "also write every request's record, policy after policy, to this JSON Lines file")
	fs.BoolVar(&card, "scorecard", false, "score every policy over a fixed matrix of workloads, fleets and loads (docs/results.md); takes --trace (default "+scorecard.DefaultTrace+"; - reads standard input), --policies, --seed or --seeds, --scenarios, --non-streamed, --json, --html, --quick, --quiet; a full one takes 9-10 minutes a seed on 2 cores (--quick: about "+scorecard.QuickDuration.String()+")")
	fs.StringVar(&seeds, "seeds", "", "with --scorecard: the seeds to run, such as 1-5 (default: --seed)")
	fs.StringVar(&scenarios, "scenarios", "", "with --scorecard: run only the scenarios whose names contain one of these, comma-separated")
	fs.BoolVar(&quick, "quick", false, fmt.Sprintf("with --scorecard: a first look in about %v on 2 cores: one seed (--seed), load %g only, each cell cut to its first %d requests; its verdicts are indicative only (the full matrix decides)",
		scorecard.QuickDuration, scorecard.QuickLoad, scorecard.QuickRequests))
	fs.BoolVar(&quiet, "quiet", false, "with --scorecard: no progress on standard error (a line per cell finished, with the time left)")
	if _, code, exit := parseOrExit(fs, args, verbHelp{
		usage: []string{
			"usage: kvroute simulate (--trace FILE | --workload NAME[:k=v,...]) [flags]   (FILE \"-\" reads standard input)",
			"\nReplays a workload on a fleet of modelled engines in virtual time, once per policy.",
		},
		more: columnsHelp(func(w io.Writer) { workloadHelp(w); policyHelp(w) }, summaryColumns, simulateColumns),
		floats: map[string]string{
			"load":              loadRange,
			"speedup":           speedupRange,
			"non-streamed":      nonStreamedRange,
			"replica-sync-loss": "a probability from 0 to below 1",
		},
	}, stdout, stderr); exit {
		return code
	}
	if err := checkOutputs(map[string]string{"html": o.HTML, "records": o.Records, "cpuprofile": cpuprofile}); err != nil {
		return failed(stderr, fs.Name(), err)
	}
	if !card {
		if err := checkSimulate(fs, o, seeds, scenarios); err != nil {
			return failed(stderr, fs.Name(), err)
		}
		if o.Load > 1 {
			// Above 1 is an overload test, or a percentage meant as a fraction: say which it is.
			fmt.Fprintf(stderr, "kvroute simulate: note: --load %g offers %g times the fleet's prefill capacity, which only cache hits can serve (a fraction is written 0.8, not 80)\n", o.Load, o.Load)
		}
	}
	spool, err := spoolIfStdin(&o.Trace, stdin, fs.Name())
	if err != nil {
		return failed(stderr, fs.Name(), err)
	}
	defer spool.remove()
	defer experiment.TuneGC()()
	if card {
		return runScorecard(ctx, fs, o, spool, seeds, scenarios, asJSON, quiet, quick, stdout, stderr)
	}
	if cpuprofile != "" {
		stop, err := startCPUProfile(cpuprofile)
		if err != nil {
			return failed(stderr, fs.Name(), fmt.Errorf("--cpuprofile: %w", err))
		}
		defer stop()
	}
	sim, err := experiment.Simulate(ctx, o)
	if err != nil {
		return failed(stderr, fs.Name(), spool.explain(err))
	}
	if asJSON {
		err = sim.WriteJSON(stdout)
	} else {
		err = sim.WriteTable(stdout)
	}
	if err != nil {
		return failed(stderr, fs.Name(), err)
	}
	return 0
}

// loadRange is what --load takes.
const loadRange = "a positive fraction of the fleet's prefill capacity, such as 0.8"

// checkSimulate refuses what experiment.Simulate would take in silence or fail on late: a
// --load or --speedup given as 0 or less (it reads 0 as "not set", which only a flag left out
// may mean), --seeds, --scenarios, --quick or --quiet without --scorecard (nothing reads them), more --routers
// than maxRouters, and a --block-size above the profile's KV cache (no block would fit).
func checkSimulate(fs *flag.FlagSet, o experiment.SimulateOptions, seeds, scenarios string) error {
	want := map[string]string{"load": loadRange, "speedup": speedupRange}
	var errs []error
	fs.Visit(func(f *flag.Flag) {
		if w, ok := want[f.Name]; ok {
			if v := f.Value.(flag.Getter).Get().(float64); !(v > 0) {
				errs = append(errs, fmt.Errorf("--%s %g: want %s", f.Name, v, w))
			}
		}
	})
	if seeds != "" {
		errs = append(errs, fmt.Errorf("--seeds %q: only with --scorecard (one simulation takes --seed)", seeds))
	}
	if scenarios != "" {
		errs = append(errs, fmt.Errorf("--scenarios %q: only with --scorecard, which runs scenarios", scenarios))
	}
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "quiet":
			errs = append(errs, errors.New("--quiet: only with --scorecard (a simulation prints no progress)"))
		case "quick":
			errs = append(errs, errors.New("--quick: only with --scorecard (a simulation is as quick as its --limit)"))
		}
	})
	if o.Routers > maxRouters {
		errs = append(errs, fmt.Errorf("--routers %d: want 1 to %d (router replicas, each simulated whole)", o.Routers, maxRouters))
	}
	if prof, err := engine.LookupProfile(o.Profile); err == nil && prof.BlockSize > 0 && o.BlockSize > prof.KVTokens() {
		errs = append(errs, fmt.Errorf("--block-size %d: more than the KV cache of a %s instance (%d tokens): want 0 (the profile's %d) or at most that",
			o.BlockSize, prof.Name, prof.KVTokens(), prof.BlockSize))
	}
	if len(errs) > 0 {
		return usageError{errors.Join(errs...)}
	}
	return nil
}

// startCPUProfile profiles the process into path until stop is called.
func startCPUProfile(path string) (stop func(), err error) {
	fh, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(fh); err != nil {
		fh.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		fh.Close()
	}, nil
}
