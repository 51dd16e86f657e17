package experiment

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
	DemoWorkload      = "shared-prefix:groups=48,prompts=4,system=4096,question=1024,output=32,rate=12"
	DemoQuickWorkload = "shared-prefix:groups=24,prompts=4,system=4096,question=1024,output=32,rate=12"
	DemoPolicies      = "round-robin,least-request,prefix-aware"
)

// DemoOptions are the flags of kvroute demo.
type DemoOptions struct {
	// Policies to compare, ParsePolicies' form, or all (DemoPolicies: those of them this build
	// has).
	Policies string
	// Workload (a generator spec; default DemoWorkload, or DemoQuickWorkload with Quick) or
	// Trace (Mooncake JSONL): at most one. Requests keeps the first ones (0: all); Speedup
	// divides their arrival times (0: 1).
	Workload, Trace string
	Requests        int
	Speedup         float64
	// Instances of engine Profile, each in simulated time at TimeScale wall seconds per model
	// second (0: 2, or 1 with Quick).
	Instances int
	Profile   string
	TimeScale float64
	Seed      uint64
	Quick     bool
	// CompareSimulate also runs the scenario in virtual time and compares (DemoReport.Fidelity).
	CompareSimulate bool
	// Progress is how progress is shown on Log (standard error); Log also takes the routers'
	// warnings.
	Progress loadgen.ProgressMode
	Log      io.Writer
}

// DemoReport is what kvroute demo prints with --json: bench's report plus, with
// CompareSimulate, the comparison with the discrete-event simulator.
type DemoReport struct {
	BenchReport
	Fidelity *Fidelity `json:"fidelity,omitempty"`
	// InterruptedDuring is the policy whose run was interrupted (Ctrl-C), when one was: the
	// report holds the policies before it. It is DemoComparison when every policy ran and the
	// comparison with the simulator (CompareSimulate) was cut short: the report holds them
	// all, without Fidelity.
	InterruptedDuring string `json:"interrupted_during,omitempty"`
	// timeScale is the one the engines ran at, for the HTML report's notes.
	timeScale float64
}

// Tolerances of the live-versus-simulated comparison (issue #6).
const (
	FidelityHitAbs  = 0.05
	FidelityTTFTRel = 0.25
)

// Fidelity compares, per policy, the live demo with kvroute simulate on the same scenario.
type Fidelity struct {
	HitRateTolerance float64          `json:"hit_rate_tolerance_abs"`
	TTFTP50Tolerance float64          `json:"ttft_p50_tolerance_rel"`
	Policies         []PolicyFidelity `json:"policies"`
	Agree            bool             `json:"agree"`
}

// PolicyFidelity is one policy's live and simulated figures.
type PolicyFidelity struct {
	Policy       string  `json:"policy"`
	LiveHitRate  float64 `json:"live_hit_rate"`
	SimHitRate   float64 `json:"simulated_hit_rate"`
	LiveTTFTP50  float64 `json:"live_ttft_p50_ms"`
	SimTTFTP50   float64 `json:"simulated_ttft_p50_ms"`
	HitRateDelta float64 `json:"hit_rate_delta"`
	TTFTP50Ratio float64 `json:"ttft_p50_ratio"`
	Agree        bool    `json:"agree"`
}

// Demo checks the options, then, for each policy in turn, starts a fresh fleet of simulated
// engines (cold caches) and a router in front of them, all on loopback, replays the workload
// through the router and stops both. With CompareSimulate it then simulates the same scenario.
func Demo(ctx context.Context, o DemoOptions) (*DemoReport, error) {
	if o.TimeScale == 0 {
		// Slower than real time by default: the router's and the simulator's own CPU time on a
		// small machine then adds less to the model-time TTFT (see docs/fidelity.md).
		o.TimeScale = 2
		if o.Quick {
			o.TimeScale = 1
		}
	}
	var errs []error
	if o.Instances < 1 || o.Instances > 64 {
		errs = append(errs, fmt.Errorf("--instances %d: want 1 to 64", o.Instances))
	}
	if o.TimeScale <= 0 || o.TimeScale > 100 {
		errs = append(errs, fmt.Errorf("--time-scale %g: want a factor above 0 up to 100 (1: real time, 0.5: twice as fast)", o.TimeScale))
	}
	if o.Speedup < 0 {
		errs = append(errs, fmt.Errorf("--speedup %g: want a positive finite factor, such as 2 (leave it out for 1)", o.Speedup))
	}
	if o.Requests < 0 {
		errs = append(errs, fmt.Errorf("--requests %d: want 0 (all) or more", o.Requests))
	}
	if o.Trace != "" && o.Workload != "" {
		errs = append(errs, errors.New("give --trace FILE or --workload NAME, not both"))
	}
	prof, err := engine.LookupProfile(o.Profile)
	if err != nil {
		errs = append(errs, fmt.Errorf("--profile: %w", err))
	}
	specs, err := demoPolicies(o.Policies)
	if err != nil {
		errs = append(errs, fmt.Errorf("--policies: %w", err))
	}
	if len(errs) > 0 {
		return nil, &UsageError{errors.Join(errs...)}
	}
	reqs, err := demoRequests(&o)
	if err != nil {
		return nil, err
	}
	if note := demoLengthNote(reqs, o.TimeScale, len(specs)); note != "" && o.Log != nil {
		// Said before it starts: a trace replayed whole (the Mooncake conversation trace's
		// hour takes two a policy) showed only an ETA of hours, after the first policy began.
		fmt.Fprintln(o.Log, note)
	}
	speedup := o.Speedup
	if speedup == 0 {
		speedup = 1
	}
	d := &DemoReport{timeScale: o.TimeScale, BenchReport: BenchReport{Summary: &report.Summary{
		Scenario: report.Scenario{
			Workload: demoWorkloadName(&o), Requests: len(reqs), Instances: o.Instances, Profile: prof.Name,
			Speedup: speedup, Seed: int64(o.Seed), Load: OfferedLoad(reqs, prof, o.Instances),
			ScrapeIntervalMS: float64(des.DefaultScrapeInterval) / float64(time.Millisecond),
		},
		Bounds: report.Bounds{
			InfiniteCacheHitRate: workload.InfiniteCacheHitRate(reqs, prof.BlockSize),
			PooledLRUHitRate:     workload.LRUHitRate(reqs, prof.BlockSize, o.Instances*prof.KVTokens()),
		},
	}}}
	for _, sp := range specs {
		r, recs, extra, err := demoPolicy(ctx, &o, prof.Name, sp, reqs)
		if err != nil && ctx.Err() != nil {
			// Interrupted (Ctrl-C): the policies that ran to the end are the report; the
			// one cut short compares with nothing.
			d.InterruptedDuring = sp.Label
			return d, nil
		}
		if err != nil {
			return nil, fmt.Errorf("policy %s: %w", sp.Label, err)
		}
		d.Results = append(d.Results, r)
		d.Bench = append(d.Bench, extra)
		d.records = append(d.records, recs)
	}
	if o.CompareSimulate {
		fid, err := compareSimulate(ctx, &o, prof, specs, reqs, d.Summary)
		if err != nil && ctx.Err() != nil {
			// Interrupted after the live runs, which are measured whole: keep them.
			d.InterruptedDuring = DemoComparison
			return d, nil
		}
		if err != nil {
			return nil, err
		}
		d.Fidelity = fid
	}
	return d, nil
}

// demoLongRun is the wall time of a demo's live runs, all policies together, above which Demo
// says how long they will take before it starts them.
const demoLongRun = 10 * time.Minute

// demoLengthNote says how long the live runs of policies policies over reqs (sorted by
// arrival, in model time) take at timeScale, and how to shorten them, when that is more than
// demoLongRun; else "".
func demoLengthNote(reqs []workload.Request, timeScale float64, policies int) string {
	if len(reqs) < 2 {
		return ""
	}
	span := reqs[len(reqs)-1].Arrival - reqs[0].Arrival
	each := time.Duration(float64(span) * timeScale)
	if each*time.Duration(policies) < demoLongRun {
		return ""
	}
	return fmt.Sprintf("demo: the workload's %d arrivals span %v of model time: at --time-scale %g each of the %d policies takes at least %v (%v in all); "+
		"--requests N or --speedup K shortens it, and Ctrl-C keeps the policies that finished",
		len(reqs), span.Round(time.Second), timeScale, policies, each.Round(time.Second), (each * time.Duration(policies)).Round(time.Second))
}

// DemoComparison is DemoReport.InterruptedDuring when Ctrl-C came during the comparison with
// the simulator, after every policy's live run.
const DemoComparison = "compare-simulate"

// WriteTable prints the side-by-side table and, after a comparison, the live-versus-simulated
// one.
func (d *DemoReport) WriteTable(w io.Writer) error {
	if err := report.WriteTable(w, d.Summary); err != nil {
		return err
	}
	if d.Fidelity == nil {
		return nil
	}
	fid := d.Fidelity
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

// WriteHTML writes the demo's HTML report to path.
func (d *DemoReport) WriteHTML(path string) error {
	opt := report.HTMLOptions{
		Title:     "kvroute demo",
		Generated: time.Now(),
		Notes: []string{fmt.Sprintf("live HTTP through the router to simulated engines at time scale %g; times are model time (wall time / %g)", d.timeScale, d.timeScale),
			"load imbalance: max / mean of the instances' engine busy time"},
	}
	return writeHTML(path, d.Summary, d.records, opt)
}

// compareSimulate runs the demo's scenario through the discrete-event simulator, one policy
// after the other, and compares hit rate and TTFT p50 with the live results in sum.
func compareSimulate(ctx context.Context, o *DemoOptions, prof engine.Profile, specs []Policy, reqs []workload.Request, sum *report.Summary) (*Fidelity, error) {
	fleet := des.ProfileFleet(prof, o.Instances)
	fleet.ScrapeInterval = des.DefaultScrapeInterval
	fleet.Seed = o.Seed
	w := des.Prepare(reqs, fleet.Model, fleet.BlockSize)
	fid := &Fidelity{HitRateTolerance: FidelityHitAbs, TTFTP50Tolerance: FidelityTTFTRel, Agree: true}
	for i, sp := range specs {
		res, err := des.Run(ctx, fleet, w, sp.Label, des.Named(sp.Name, sp.Params))
		if err != nil {
			return nil, fmt.Errorf("simulate %s: %w", sp.Label, err)
		}
		sim := report.Summarize(sp.Label, res.Records, res.Busy)
		live := sum.Results[i]
		p := PolicyFidelity{
			Policy: sp.Label, LiveHitRate: live.HitRate, SimHitRate: sim.HitRate,
			LiveTTFTP50: live.TTFT.P50, SimTTFTP50: sim.TTFT.P50,
			HitRateDelta: live.HitRate - sim.HitRate,
		}
		if sim.TTFT.P50 > 0 {
			p.TTFTP50Ratio = live.TTFT.P50 / sim.TTFT.P50
		}
		p.Agree = math.Abs(p.HitRateDelta) <= FidelityHitAbs && math.Abs(p.TTFTP50Ratio-1) <= FidelityTTFTRel
		fid.Agree = fid.Agree && p.Agree
		fid.Policies = append(fid.Policies, p)
	}
	return fid, nil
}

// demoPolicies resolves --policies: "all" is every registered policy; the default list keeps
// the policies this build registers; other names not registered are an error naming the valid
// ones.
func demoPolicies(s string) ([]Policy, error) {
	switch strings.TrimSpace(s) {
	case "all":
		s = ""
	case DemoPolicies:
		var names []string
		for n := range strings.SplitSeq(DemoPolicies, ",") {
			if slices.Contains(policy.Names(), n) {
				names = append(names, n)
			}
		}
		s = strings.Join(names, ",")
	}
	return ParsePolicies(s)
}

// demoWorkloadName is the workload's name in the report.
func demoWorkloadName(o *DemoOptions) string {
	switch {
	case o.Trace != "":
		return filepath.Base(o.Trace)
	case o.Workload != "":
		return o.Workload
	case o.Quick:
		return DemoQuickWorkload
	}
	return DemoWorkload
}

// demoRequests builds the demo's requests: the trace or workload, cut to Requests, sped up,
// in arrival order. Deterministic, so that compareSimulate sees the same requests.
func demoRequests(o *DemoOptions) ([]workload.Request, error) {
	spec := o.Workload
	if spec == "" && o.Trace == "" {
		spec = demoWorkloadName(o)
	}
	reqs, _, err := loadWorkload(o.Trace, spec, o.Seed)
	if err != nil {
		return nil, err
	}
	if o.Requests > 0 && o.Requests < len(reqs) {
		reqs = reqs[:o.Requests]
	}
	if o.Speedup > 0 {
		reqs = workload.Speedup(reqs, o.Speedup)
	}
	slices.SortStableFunc(reqs, func(a, b workload.Request) int { return int(a.Arrival - b.Arrival) })
	return reqs, nil
}

// demoPolicy starts a fresh fleet (cold caches) and a router with one policy in front of it,
// replays reqs through the router, and stops both.
func demoPolicy(ctx context.Context, o *DemoOptions, profile string, sp Policy, reqs []workload.Request) (report.Result, []report.Record, BenchExtra, error) {
	var none BenchExtra
	start := time.Now()
	fleet, err := simserver.StartFleet(ctx, simserver.Options{
		Profile: profile, TimeScale: o.TimeScale, Seed: o.Seed, Logger: slog.New(slog.DiscardHandler),
	}, o.Instances, "127.0.0.1", 0)
	if err != nil {
		return report.Result{}, nil, none, fmt.Errorf("start simulated instances: %w", err)
	}
	defer fleet.Close()

	api, stop, err := startRouter(ctx, fleet.URLs(), sp, slog.New(slog.NewTextHandler(o.Log, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		return report.Result{}, nil, none, err
	}
	defer stop()

	items := workloadItems(reqs)
	// Arrivals are in model time: the engines run at TimeScale wall seconds per model second,
	// so the client must too.
	for i := range items {
		items[i].At = scaleDur(items[i].At, 1/o.TimeScale)
	}
	prog := loadgen.NewProgress(o.Log, o.Progress, sp.Label, len(items), 5*time.Second, nil)
	cfg := loadgen.Config{
		Target: api, Model: simserver.DefaultModel, MaxInFlight: 1024, RequestTimeout: 5 * time.Minute,
		OnRecord: prog.Record,
	}
	prog.SetPacing(loadgen.PacingOf(cfg, items))
	res, err := loadgen.Run(ctx, cfg, items)
	prog.Finish()
	if err != nil {
		return report.Result{}, nil, none, err
	}

	recs, _ := reportRecords(sp.Label, res.Records, o.TimeScale)
	// Requests and busy time per instance come from the engines themselves (exact, and busy
	// time is only known there), not from server.endpoint_header: we own both sides here. Busy
	// time is model time, like the records, so the busy fractions are model time over model
	// time. An engine counts a request finished just after it hands over the last tokens, so
	// the client may have seen the end first: wait (2 s at most) until the engines have counted
	// every request the client saw complete.
	completed := 0
	for i := range res.Records {
		if res.Records[i].OK() {
			completed++
		}
	}
	_ = poll(ctx, 5*time.Millisecond, 2*time.Second, func(context.Context) bool {
		finished := 0
		for _, in := range fleet.Instances() {
			finished += int(in.Stats().Finished)
		}
		return finished >= completed
	})
	busy := make([]time.Duration, o.Instances)
	perInstance := make([]int, o.Instances)
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
	r := report.Summarize(sp.Label, recs, busy)
	r.InstanceRequests = perInstance
	r.Preemptions = preemptions
	r.WallSeconds = time.Since(start).Seconds()
	extra := benchStats(&res, o.TimeScale)
	extra.AskedRate = scheduledRate(items) // wall-time rates, as sent
	return r, recs, extra, nil
}

// startRouter serves a router with policy sp in front of the engines at urls, on loopback, and
// waits until it is ready. It returns the API's base URL and what stops the router.
func startRouter(ctx context.Context, urls []string, sp Policy, log *slog.Logger) (api string, stop func(), err error) {
	cfg := config.Quick(urls, simserver.DefaultModel, "vllm")
	cfg.Policy.Name = sp.Name
	cfg.Policy.Params = map[string]any{}
	for k, v := range sp.Params {
		cfg.Policy.Params[k] = v
	}
	// The same scrape interval as kvroute simulate, so that both see equally fresh metrics.
	cfg.Scrape.Interval = config.Duration(des.DefaultScrapeInterval)
	cfg.Scrape.Timeout = config.Duration(des.DefaultScrapeInterval)
	// Nothing balances over this router: its stop need not wait for one to take it out
	// (server.drain_delay, 5 s once /readyz was asked, as waitReady does).
	noDrain := config.Duration(0)
	cfg.Server.DrainDelay = &noDrain
	cfg.SetDefaults()
	if err := cfg.Validate(config.Checks{PolicyNames: policy.Names(), Policy: policy.Check}); err != nil {
		return "", nil, fmt.Errorf("router config: %w", err)
	}
	router, err := app.NewRouter(cfg, log)
	if err != nil {
		return "", nil, fmt.Errorf("router: %w", err)
	}
	apiLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, fmt.Errorf("router listen: %w", err)
	}
	adminLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		apiLn.Close()
		return "", nil, fmt.Errorf("router admin listen: %w", err)
	}
	rctx, cancel := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- router.Serve(rctx, apiLn, adminLn) }()
	stop = func() {
		cancel()
		<-served
	}
	if err := waitReady(ctx, "http://"+adminLn.Addr().String()+"/readyz", 15*time.Second); err != nil {
		stop()
		return "", nil, err
	}
	return "http://" + apiLn.Addr().String(), stop, nil
}

// waitReady polls url until it answers 200, ctx ends or timeout passes.
func waitReady(ctx context.Context, url string, timeout time.Duration) error {
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	ready := func(ctx context.Context) bool {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return false
		}
		resp, err := client.Do(req)
		if err != nil {
			return false
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}
	if err := poll(ctx, 20*time.Millisecond, timeout, ready); err != nil {
		return fmt.Errorf("router not ready at %s: %w", url, err)
	}
	return nil
}

// poll asks done at once and then every interval until it says yes, ctx ends or timeout
// passes; it returns nil when done said yes, else the reason it stopped asking. done gets a
// context that ends with the polling.
func poll(ctx context.Context, interval, timeout time.Duration, done func(ctx context.Context) bool) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for !done(ctx) {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	return nil
}
