package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/des"
	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/loadgen"
	"github.com/kvroute/kvroute/internal/policy"
	"github.com/kvroute/kvroute/internal/proxy"
	"github.com/kvroute/kvroute/internal/report"
	"github.com/kvroute/kvroute/internal/simserver"
	"github.com/kvroute/kvroute/internal/workload"
)

// The demo's default scenario: groups of prompts sharing a long system prompt, few prompts per
// group, so that a policy that ignores prefixes recomputes each system prompt on most
// instances while a prefix-aware one computes it once. Generated, so that it needs no file.
const (
	demoWorkload      = "shared-prefix:groups=48,prompts=4,system=4096,question=1024,output=32,rate=12"
	demoQuickWorkload = "shared-prefix:groups=24,prompts=4,system=4096,question=1024,output=32,rate=12"
	demoPolicies      = "round-robin,least-request,prefix-aware"
	demoReport        = "demo-report.html"
)

// demoFlags are the flags of `kvroute demo`.
type demoFlags struct {
	policies, workload, trace, profile, html string
	instances, requests                      int
	timeScale, speedup                       float64
	seed                                     uint64
	quick, json, quiet                       bool
}

// demoRun is one policy's live run.
type demoRun struct {
	result  report.Result
	records []report.Record
	extra   benchExtra
}

func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("kvroute demo", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var f demoFlags
	fs.StringVar(&f.policies, "policies", demoPolicies, "policies to compare, comma-separated NAME[:key=value,...], or all")
	fs.IntVar(&f.instances, "instances", 4, "simulated engine instances")
	fs.StringVar(&f.workload, "workload", "", "synthetic workload NAME[:key=value,...] (default "+demoWorkload+")")
	fs.StringVar(&f.trace, "trace", "", "Mooncake JSONL trace to replay instead of a synthetic workload")
	fs.Float64Var(&f.speedup, "speedup", 0, "replay arrivals K times faster (default 1; a trace usually needs more)")
	fs.IntVar(&f.requests, "requests", 0, "use only the first N requests (0: all)")
	fs.StringVar(&f.profile, "profile", simserver.DefaultProfile, "engine profile of the simulated instances")
	fs.Float64Var(&f.timeScale, "time-scale", 1, "wall seconds per model second of the simulated engines (0.5: twice as fast); reported times are model time")
	fs.Uint64Var(&f.seed, "seed", 1, "seed of the workload, the engines and the policies")
	fs.BoolVar(&f.quick, "quick", false, "a smaller workload that finishes in well under a minute")
	fs.BoolVar(&f.json, "json", false, "print the summary as JSON (as kvroute simulate --json, plus live figures)")
	fs.StringVar(&f.html, "html", demoReport, "write the HTML report here (empty: none)")
	fs.BoolVar(&f.quiet, "quiet", false, "no progress output")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(stdout, "usage: kvroute demo [--quick] [flags]")
			fmt.Fprintln(stdout, "\nStarts simulated vLLM instances and, for each policy in turn, a kvroute router in front of them")
			fmt.Fprintln(stdout, "(all in this process, on loopback), replays a workload through it and prints the policies side by side.")
			fmt.Fprintln(stdout, "\nflags:")
			fs.SetOutput(stdout)
			fs.PrintDefaults()
			fmt.Fprintf(stdout, "\npolicies: %s\n", strings.Join(policy.Names(), ", "))
			return 0
		}
		fmt.Fprintf(stderr, "kvroute demo: %v (run 'kvroute demo -h')\n", err)
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "kvroute demo: unexpected argument %q (run 'kvroute demo -h')\n", fs.Arg(0))
		return 2
	}
	sum, runs, err := demo(ctx, &f, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "kvroute demo: %s\n", oneLine(err))
		if errors.As(err, new(usageError)) {
			return 2
		}
		return 1
	}
	out := benchJSON{Summary: sum}
	recs := make([][]report.Record, len(runs))
	for i := range runs {
		out.Bench = append(out.Bench, runs[i].extra)
		recs[i] = runs[i].records
	}
	if f.json {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		err = enc.Encode(out)
	} else {
		err = report.WriteTable(stdout, sum)
	}
	if err != nil {
		fmt.Fprintf(stderr, "kvroute demo: %s\n", oneLine(err))
		return 1
	}
	if f.html != "" {
		opt := report.HTMLOptions{
			Title:     "kvroute demo",
			Generated: time.Now(),
			Notes: []string{fmt.Sprintf("live HTTP through the router to simulated engines at time scale %g; times are model time (wall time / %g)", f.timeScale, f.timeScale),
				"load imbalance: max / mean of the instances' engine busy time"},
		}
		if err := writeHTMLFile(f.html, sum, recs, opt); err != nil {
			fmt.Fprintf(stderr, "kvroute demo: %s\n", oneLine(err))
			return 1
		}
		if !f.quiet {
			fmt.Fprintf(stderr, "kvroute demo: report written to %s\n", f.html)
		}
	}
	return 0
}

// demoPolicySpecs resolves --policies: "all" is every registered policy; names not registered
// in this build are an error naming the valid ones.
func demoPolicySpecs(s string) ([]policySpec, error) {
	if strings.TrimSpace(s) == "all" {
		s = ""
	}
	return parsePolicies(s)
}

// demo checks the flags, then runs every policy in turn on a fresh fleet.
func demo(ctx context.Context, f *demoFlags, stderr io.Writer) (*report.Summary, []demoRun, error) {
	var errs []error
	if f.instances < 1 || f.instances > 64 {
		errs = append(errs, fmt.Errorf("--instances %d: want 1 to 64", f.instances))
	}
	if f.timeScale <= 0 || f.timeScale > 100 {
		errs = append(errs, fmt.Errorf("--time-scale %g: want a factor above 0 (1: real time, 0.5: twice as fast)", f.timeScale))
	}
	if f.speedup < 0 || f.requests < 0 {
		errs = append(errs, errors.New("--speedup and --requests must not be negative"))
	}
	if f.trace != "" && f.workload != "" {
		errs = append(errs, errors.New("give --trace FILE or --workload NAME, not both"))
	}
	prof, err := engine.LookupProfile(f.profile)
	if err != nil {
		errs = append(errs, fmt.Errorf("--profile: %w", err))
	}
	specs, err := demoPolicySpecs(f.policies)
	if err != nil {
		errs = append(errs, fmt.Errorf("--policies: %w", err))
	}
	if len(errs) > 0 {
		return nil, nil, usageError{errors.Join(errs...)}
	}
	spec := f.workload
	if spec == "" && f.trace == "" {
		spec = demoWorkload
		if f.quick {
			spec = demoQuickWorkload
		}
	}
	reqs, name, err := loadWorkload(f.trace, spec, f.seed)
	if err != nil {
		return nil, nil, err
	}
	if f.requests > 0 && f.requests < len(reqs) {
		reqs = reqs[:f.requests]
	}
	speedup := f.speedup
	if speedup == 0 {
		speedup = 1
	}
	reqs = workload.Speedup(reqs, speedup)
	slices.SortStableFunc(reqs, func(a, b workload.Request) int { return int(a.Arrival - b.Arrival) })

	sum := &report.Summary{
		Scenario: report.Scenario{
			Workload: name, Requests: len(reqs), Instances: f.instances, Profile: prof.Name,
			Speedup: speedup, Seed: int64(f.seed), Load: offeredLoad(reqs, prof, f.instances),
			ScrapeIntervalMS: float64(des.DefaultScrapeInterval) / float64(time.Millisecond),
		},
		Bounds: report.Bounds{
			InfiniteCacheHitRate: workload.InfiniteCacheHitRate(reqs, prof.BlockSize),
			PooledLRUHitRate:     workload.LRUHitRate(reqs, prof.BlockSize, f.instances*prof.KVTokens()),
		},
	}
	runs := make([]demoRun, 0, len(specs))
	for _, sp := range specs {
		run, err := demoPolicy(ctx, f, prof.Name, sp, reqs, stderr)
		if err != nil {
			return nil, nil, fmt.Errorf("policy %s: %w", sp.label, err)
		}
		sum.Results = append(sum.Results, run.result)
		runs = append(runs, run)
	}
	return sum, runs, nil
}

// demoPolicy starts a fresh fleet (cold caches) and a router with one policy in front of it,
// replays reqs through the router, and stops both.
func demoPolicy(ctx context.Context, f *demoFlags, profile string, sp policySpec, reqs []workload.Request, stderr io.Writer) (demoRun, error) {
	start := time.Now()
	quietLog := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	fleet, err := simserver.StartFleet(ctx, simserver.Options{
		Profile: profile, TimeScale: f.timeScale, Seed: f.seed, Logger: slog.New(slog.DiscardHandler),
	}, f.instances, "127.0.0.1", 0)
	if err != nil {
		return demoRun{}, fmt.Errorf("start simulated instances: %w", err)
	}
	defer fleet.Close()

	spec := sp.name
	if len(sp.params) > 0 {
		var kv []string
		for k, v := range sp.params {
			kv = append(kv, k+"="+v)
		}
		slices.Sort(kv)
		spec += ":" + strings.Join(kv, ",")
	}
	cfg, err := quickConfig(fleet.URLs(), simserver.DefaultModel, "vllm", spec)
	if err != nil {
		return demoRun{}, fmt.Errorf("router config: %w", err)
	}
	// The same scrape interval as kvroute simulate, so that both see equally fresh metrics.
	cfg.Scrape.Interval = config.Duration(des.DefaultScrapeInterval)
	cfg.Scrape.Timeout = config.Duration(des.DefaultScrapeInterval)
	router, err := proxy.NewRouter(cfg, quietLog)
	if err != nil {
		return demoRun{}, fmt.Errorf("router: %w", err)
	}
	apiLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return demoRun{}, fmt.Errorf("router listen: %w", err)
	}
	adminLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		apiLn.Close()
		return demoRun{}, fmt.Errorf("router admin listen: %w", err)
	}
	rctx, stopRouter := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- router.Serve(rctx, apiLn, adminLn) }()
	defer func() {
		stopRouter()
		<-served
	}()
	api := "http://" + apiLn.Addr().String()
	if err := waitReady(ctx, "http://"+adminLn.Addr().String()+"/readyz", 15*time.Second); err != nil {
		return demoRun{}, err
	}

	items := workloadItems(reqs)
	mode := progressMode(stderr, f.quiet)
	prog := loadgen.NewProgress(stderr, mode, sp.label, len(items), 5*time.Second, nil)
	res, err := loadgen.Run(ctx, loadgen.Config{
		Target: api, Model: simserver.DefaultModel, MaxInFlight: 1024, RequestTimeout: 5 * time.Minute,
		OnRecord: prog.Record,
	}, items)
	prog.Finish()
	if err != nil {
		return demoRun{}, err
	}

	recs, _ := reportRecords(sp.label, res.Records, f.timeScale)
	// Requests and busy time per instance come from the engines themselves: the router names
	// no backend in its responses, and we own both sides here.
	busy := make([]time.Duration, f.instances)
	perInstance := make([]int, f.instances)
	for i, in := range fleet.Instances() {
		st := in.Stats()
		busy[i] = st.Busy
		perInstance[i] = int(st.Finished)
	}
	for i := range recs {
		recs[i].EndpointID = -1
	}
	r := report.Summarize(sp.label, recs, busy)
	r.InstanceRequests = perInstance
	r.Preemptions = 0
	for _, in := range fleet.Instances() {
		r.Preemptions += in.Stats().Preemptions
	}
	// Busy fractions: model-time busy over the model-time span (records are in model time).
	r.WallSeconds = time.Since(start).Seconds()
	extra := benchStats(&res, f.timeScale)
	extra.AskedRate = scheduledRate(items)
	return demoRun{result: r, records: recs, extra: extra}, nil
}

// waitReady polls url until it answers 200, ctx ends or timeout passes.
func waitReady(ctx context.Context, url string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return fmt.Errorf("readiness: %w", err)
		}
		if resp, err := client.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("router not ready at %s: %w", url, ctx.Err())
		case <-tick.C:
		}
	}
}
