package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kvroute/kvroute/internal/app"
	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/des"
	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/loadgen"
	"github.com/kvroute/kvroute/internal/policy"
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
	quick, json, quiet, compare              bool
}

// demoRun is one policy's live run.
type demoRun struct {
	result  report.Result
	records []report.Record
	extra   benchExtra
}

func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("kvroute demo")
	var f demoFlags
	fs.StringVar(&f.policies, "policies", demoPolicies, "policies to compare, comma-separated NAME[:key=value,...], or all")
	fs.IntVar(&f.instances, "instances", 5, "simulated engine instances")
	fs.StringVar(&f.workload, "workload", "", "synthetic workload NAME[:key=value,...] (default "+demoWorkload+")")
	fs.StringVar(&f.trace, "trace", "", "Mooncake JSONL trace to replay instead of a synthetic workload")
	fs.Float64Var(&f.speedup, "speedup", 0, "replay arrivals K times faster (default 1; a trace usually needs more)")
	fs.IntVar(&f.requests, "requests", 0, "use only the first N requests (0: all)")
	fs.StringVar(&f.profile, "profile", simserver.DefaultProfile, "engine profile of the simulated instances")
	fs.Float64Var(&f.timeScale, "time-scale", 0, "wall seconds per model second of the simulated engines (0.5: twice as fast; default 2, 1 with --quick); reported times are model time")
	fs.Uint64Var(&f.seed, "seed", 1, "seed of the workload, the engines and the policies")
	fs.BoolVar(&f.quick, "quick", false, "a smaller workload that finishes in well under a minute")
	fs.BoolVar(&f.json, "json", false, "print the summary as JSON (as kvroute simulate --json, plus live figures)")
	fs.StringVar(&f.html, "html", demoReport, "write the HTML report here (empty: none)")
	fs.BoolVar(&f.quiet, "quiet", false, "no progress output")
	fs.BoolVar(&f.compare, "compare-simulate", false, "also run the same scenario through kvroute simulate (virtual time) and print how far the live figures are from it")
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
	if f.timeScale == 0 {
		// Slower than real time by default: the router's and the simulator's own CPU time on a
		// small machine then adds less to the model-time TTFT (see docs/fidelity.md).
		f.timeScale = 2
		if f.quick {
			f.timeScale = 1
		}
	}
	sum, runs, err := demo(ctx, &f, stderr)
	if err != nil {
		return failed(stderr, fs.Name(), err)
	}
	out := demoJSON{benchJSON: benchJSON{Summary: sum}}
	recs := make([][]report.Record, len(runs))
	for i := range runs {
		out.Bench = append(out.Bench, runs[i].extra)
		recs[i] = runs[i].records
	}
	if f.compare {
		out.Fidelity, err = compareSimulate(ctx, &f, sum)
		if err != nil {
			return failed(stderr, fs.Name(), err)
		}
	}
	if f.json {
		err = writeJSON(stdout, out)
	} else {
		err = report.WriteTable(stdout, sum)
		if err == nil && out.Fidelity != nil {
			err = writeFidelity(stdout, out.Fidelity)
		}
	}
	if err != nil {
		return failed(stderr, fs.Name(), err)
	}
	if f.html != "" {
		opt := report.HTMLOptions{
			Title:     "kvroute demo",
			Generated: time.Now(),
			Notes: []string{fmt.Sprintf("live HTTP through the router to simulated engines at time scale %g; times are model time (wall time / %g)", f.timeScale, f.timeScale),
				"load imbalance: max / mean of the instances' engine busy time"},
		}
		if err := writeHTMLFile(f.html, sum, recs, opt); err != nil {
			return failed(stderr, fs.Name(), err)
		}
		if !f.quiet {
			fmt.Fprintf(stderr, "kvroute demo: report written to %s\n", f.html)
		}
	}
	return 0
}

// demoJSON is `kvroute demo --json`: bench's JSON plus, with --compare-simulate, the
// comparison with the discrete-event simulator.
type demoJSON struct {
	benchJSON
	Fidelity *fidelity `json:"fidelity,omitempty"`
}

// Tolerances of the live-versus-simulated comparison (issue #6).
const (
	fidelityHitAbs  = 0.05
	fidelityTTFTRel = 0.25
)

// fidelity compares, per policy, the live demo with kvroute simulate on the same scenario.
type fidelity struct {
	HitRateTolerance float64          `json:"hit_rate_tolerance_abs"`
	TTFTP50Tolerance float64          `json:"ttft_p50_tolerance_rel"`
	Policies         []policyFidelity `json:"policies"`
	Agree            bool             `json:"agree"`
}

type policyFidelity struct {
	Policy       string  `json:"policy"`
	LiveHitRate  float64 `json:"live_hit_rate"`
	SimHitRate   float64 `json:"simulated_hit_rate"`
	LiveTTFTP50  float64 `json:"live_ttft_p50_ms"`
	SimTTFTP50   float64 `json:"simulated_ttft_p50_ms"`
	HitRateDelta float64 `json:"hit_rate_delta"`
	TTFTP50Ratio float64 `json:"ttft_p50_ratio"`
	Agree        bool    `json:"agree"`
}

// compareSimulate runs the demo's scenario through the discrete-event simulator, one policy
// after the other, and compares hit rate and TTFT p50 with the live results in sum.
func compareSimulate(ctx context.Context, f *demoFlags, sum *report.Summary) (*fidelity, error) {
	prof, err := engine.LookupProfile(f.profile)
	if err != nil {
		return nil, err
	}
	specs, err := demoPolicySpecs(f.policies)
	if err != nil {
		return nil, err
	}
	reqs, err := demoRequests(f)
	if err != nil {
		return nil, err
	}
	fleet := des.ProfileFleet(prof, f.instances)
	fleet.ScrapeInterval = des.DefaultScrapeInterval
	fleet.Seed = f.seed
	w := des.Prepare(reqs, fleet.Model, fleet.BlockSize)
	fid := &fidelity{HitRateTolerance: fidelityHitAbs, TTFTP50Tolerance: fidelityTTFTRel, Agree: true}
	for i, sp := range specs {
		res, err := des.Run(ctx, fleet, w, sp.label, des.Named(sp.name, sp.params))
		if err != nil {
			return nil, fmt.Errorf("simulate %s: %w", sp.label, err)
		}
		sim := report.Summarize(sp.label, res.Records, res.Busy)
		live := sum.Results[i]
		p := policyFidelity{
			Policy: sp.label, LiveHitRate: live.HitRate, SimHitRate: sim.HitRate,
			LiveTTFTP50: live.TTFT.P50, SimTTFTP50: sim.TTFT.P50,
			HitRateDelta: live.HitRate - sim.HitRate,
		}
		if sim.TTFT.P50 > 0 {
			p.TTFTP50Ratio = live.TTFT.P50 / sim.TTFT.P50
		}
		p.Agree = math.Abs(p.HitRateDelta) <= fidelityHitAbs && math.Abs(p.TTFTP50Ratio-1) <= fidelityTTFTRel
		fid.Agree = fid.Agree && p.Agree
		fid.Policies = append(fid.Policies, p)
	}
	return fid, nil
}

// writeFidelity prints the live-versus-simulated table.
func writeFidelity(w io.Writer, fid *fidelity) error {
	fmt.Fprintf(w, "\nlive (HTTP, model time) vs kvroute simulate (virtual time); tolerance: hit rate +-%.2f, TTFT p50 +-%.0f%%\n", fid.HitRateTolerance, 100*fid.TTFTP50Tolerance)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "policy\thit live\thit sim\tdelta\tTTFT p50 live\tsim\tratio\tagree\t\n")
	for _, p := range fid.Policies {
		verdict := "yes"
		if !p.Agree {
			verdict = "NO"
		}
		fmt.Fprintf(tw, "%s\t%.3f\t%.3f\t%+.3f\t%.1f\t%.1f\t%.2f\t%s\t\n", p.Policy, p.LiveHitRate, p.SimHitRate, p.HitRateDelta, p.LiveTTFTP50, p.SimTTFTP50, p.TTFTP50Ratio, verdict)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write fidelity table: %w", err)
	}
	return nil
}

// demoPolicySpecs resolves --policies: "all" is every registered policy; names not registered
// in this build are an error naming the valid ones.
func demoPolicySpecs(s string) ([]policySpec, error) {
	switch strings.TrimSpace(s) {
	case "all":
		s = ""
	case demoPolicies:
		// The default list keeps only the policies this build registers.
		var names []string
		for n := range strings.SplitSeq(demoPolicies, ",") {
			if slices.Contains(policy.Names(), n) {
				names = append(names, n)
			}
		}
		s = strings.Join(names, ",")
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
	reqs, err := demoRequests(f)
	if err != nil {
		return nil, nil, err
	}
	name := demoWorkloadName(f)
	speedup := f.speedup
	if speedup == 0 {
		speedup = 1
	}

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

// demoWorkloadName is the workload's name in the report.
func demoWorkloadName(f *demoFlags) string {
	switch {
	case f.trace != "":
		return filepath.Base(f.trace)
	case f.workload != "":
		return f.workload
	case f.quick:
		return demoQuickWorkload
	}
	return demoWorkload
}

// demoRequests builds the demo's requests: the trace or workload, cut to --requests, sped up,
// in arrival order. Deterministic, so that compareSimulate sees the same requests.
func demoRequests(f *demoFlags) ([]workload.Request, error) {
	spec := f.workload
	if spec == "" && f.trace == "" {
		spec = demoWorkloadName(f)
	}
	reqs, _, err := loadWorkload(f.trace, spec, f.seed)
	if err != nil {
		return nil, err
	}
	if f.requests > 0 && f.requests < len(reqs) {
		reqs = reqs[:f.requests]
	}
	if f.speedup > 0 {
		reqs = workload.Speedup(reqs, f.speedup)
	}
	slices.SortStableFunc(reqs, func(a, b workload.Request) int { return int(a.Arrival - b.Arrival) })
	return reqs, nil
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
	cfg, err := quickConfig(fleet.URLs(), simserver.DefaultModel, "vllm", spec, nil)
	if err != nil {
		return demoRun{}, fmt.Errorf("router config: %w", err)
	}
	// The same scrape interval as kvroute simulate, so that both see equally fresh metrics.
	cfg.Scrape.Interval = config.Duration(des.DefaultScrapeInterval)
	cfg.Scrape.Timeout = config.Duration(des.DefaultScrapeInterval)
	router, err := app.NewRouter(cfg, quietLog)
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
	// Arrivals are in model time: the engines run at timeScale wall seconds per model second,
	// so the client must too.
	for i := range items {
		items[i].At = scaleDur(items[i].At, 1/f.timeScale)
	}
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
	// Requests and busy time per instance come from the engines themselves (exact, and busy
	// time is only known there), not from server.endpoint_header: we own both sides here. Busy time is model time, like
	// the records, so the busy fractions are model time over model time.
	// An engine counts a request finished just after it hands over the last tokens, so the
	// client may have seen the end first: wait (2 s at most) until the engines have counted
	// every request the client saw complete.
	completed := 0
	for i := range res.Records {
		if res.Records[i].OK() {
			completed++
		}
	}
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		finished := 0
		for _, in := range fleet.Instances() {
			finished += int(in.Stats().Finished)
		}
		if finished >= completed {
			break
		}
	}
	busy := make([]time.Duration, f.instances)
	perInstance := make([]int, f.instances)
	var preemptions int64
	for i, in := range fleet.Instances() {
		st := in.Stats()
		busy[i] = st.Busy
		perInstance[i] = int(st.Finished)
		preemptions += st.Preemptions
	}
	for i := range recs {
		recs[i].EndpointID = -1
	}
	r := report.Summarize(sp.label, recs, busy)
	r.InstanceRequests = perInstance
	r.Preemptions = preemptions
	r.WallSeconds = time.Since(start).Seconds()
	extra := benchStats(&res, f.timeScale)
	extra.AskedRate = scheduledRate(items) // wall-time rates, as sent
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
