package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"strings"
	"sync"
	"time"

	"golang.org/x/text/language"
	"golang.org/x/text/message"

	"github.com/kvroute/kvroute/internal/des"
	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/experiment"
	"github.com/kvroute/kvroute/internal/report"
	"github.com/kvroute/kvroute/internal/workload"
)

// analyzeFlags are the flags of `kvroute analyze`.
type analyzeFlags struct {
	format, profile, workload string
	trace                     string // --trace FILE, as simulate, bench and plan take it; or FILE
	instances                 int
	seed                      uint64
	json                      bool
	// fleet: --instances was given, so the fleet is known and analyze simulates it, unless
	// noSimulate; simLimit bounds the simulated requests (0: all). setLimit: --sim-limit given.
	fleet, noSimulate, setLimit bool
	simLimit                    int
}

// boundsInstances is the fleet the hit-rate bounds assume when --instances is left out (no
// simulation then).
const boundsInstances = 8

// analyzePolicies are the policies analyze simulates: prefix-aware first, then the two
// prefix-blind ones a fleet would run without it.
const analyzePolicies = "prefix-aware,least-request,round-robin"

// defaultSimLimit is --sim-limit's default: the first 2,000 requests of the Mooncake
// conversation trace (669 s of it) simulate in about 2.6 s on two busy cores, the three
// policies in parallel (all 12,031 took 11 s to 37 s, by how busy the machine was).
const defaultSimLimit = 2000

// maxSimInstances bounds the fleet analyze simulates: every simulated engine keeps its KV
// cache's bookkeeping, about 1.7 MB for llama3-70b-h200-tp8, two policies at a time (1,000
// instances took 3.4 GB and 2 s on a 50-request workload, 10,000 took 21 GB and 76 s). kvroute
// simulate runs larger fleets when asked to.
const maxSimInstances = 256

// sameWithin is the relative TTFT difference under which analyze calls two policies about as
// good: its figures come from one seed and a sample of the workload.
const sameWithin = 0.05

// analyzeReport is what `kvroute analyze --json` prints: the workload's Stats, the setting, and
// the simulation when one ran (its figures are what the verdict rests on).
type analyzeReport struct {
	Source          string  `json:"source"`
	Format          string  `json:"format"`
	Profile         string  `json:"profile"`
	KVTokens        int     `json:"kv_tokens_per_instance"`
	DurationSeconds float64 `json:"duration_s"`
	workload.Stats
	// Simulation is the policies measured on the fleet; nil when none ran, NotSimulated says why.
	Simulation   *analyzeSimulation `json:"simulation,omitempty"`
	NotSimulated string             `json:"not_simulated,omitempty"`
}

// analyzeSimulation is what analyze simulated and what it measured.
type analyzeSimulation struct {
	// Requests is the first requests of the workload simulated, of Of.
	Requests int `json:"requests"`
	Of       int `json:"of_requests"`
	// SpanSeconds is their arrivals' span; Rate requests per second over it.
	SpanSeconds float64 `json:"span_s"`
	Rate        float64 `json:"rate_per_s"`
	// Load is their prefill work without cache hits over the fleet's prefill capacity (0:
	// undefined, when all arrive at once), as kvroute simulate reports it.
	Load      float64 `json:"load"`
	Instances int     `json:"instances"`
	Profile   string  `json:"profile"`
	BlockSize int     `json:"block_size"`
	Seed      uint64  `json:"seed"`
	// WallSeconds is how long the simulation took, all policies together.
	WallSeconds float64 `json:"wall_s"`
	// Command is the kvroute simulate command that gives the same figures, and more.
	Command string       `json:"command"`
	Results []analyzeRun `json:"results"`
}

// analyzeRun is one policy's measured figures.
type analyzeRun struct {
	Policy    string         `json:"policy"`
	Completed int            `json:"completed"`
	Failed    int            `json:"failed"`
	HitRate   float64        `json:"hit_rate"`
	TTFT      report.Latency `json:"ttft_ms"`
}

func runAnalyze(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return analyzeMain(ctx, args, os.Stdin, stdout, stderr)
}

// analyzeMain is runAnalyze with its standard input given, for tests.
func analyzeMain(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := newFlagSet("kvroute analyze")
	var f analyzeFlags
	fs.StringVar(&f.format, "format", "mooncake", "trace format (mooncake: JSONL with timestamp, input_length, output_length, hash_ids)")
	// Registered with 0, so that -h shows no "(default 8)": left out, --instances runs no
	// simulation, which a default shown would hide; the bounds then assume boundsInstances.
	fs.IntVar(&f.instances, "instances", 0, "simulate on a fleet of `N` instances (off unless given): prefix-aware against least-request and round-robin; their pooled KV cache also bounds the hit rate (left out: no simulation, and the bounds assume "+fmt.Sprint(boundsInstances)+" instances)")
	fs.StringVar(&f.profile, "profile", "llama3-70b-h200-tp8", "engine profile, for its KV capacity per instance and block size: "+profileNames())
	fs.StringVar(&f.trace, "trace", "", "the trace `FILE`, as simulate, bench and plan take it (or give FILE alone)"+stdinTraceHelp)
	fs.StringVar(&f.workload, "workload", "", "analyze a synthetic workload NAME[:key=value,...] instead of a trace")
	fs.Uint64Var(&f.seed, "seed", 1, "seed of the synthetic workload, of random placement and of the simulated policies")
	fs.BoolVar(&f.noSimulate, "no-simulate", false, "do not simulate the fleet given by --instances: statistics only")
	fs.IntVar(&f.simLimit, "sim-limit", defaultSimLimit, "with --instances: simulate only the first `N` requests (0: all; the 12,031 of the Mooncake conversation trace take 10 to 40 s)")
	fs.BoolVar(&f.json, "json", false, "print the report as JSON: the statistics, and the simulation's setting and figures when one ran")
	// Flags may come before or after FILE.
	files, code, exit := parseOrExit(fs, args, verbHelp{
		usage: []string{
			"usage: kvroute analyze [flags] FILE   (or --trace FILE; FILE \"-\" reads standard input)",
			"       kvroute analyze [flags] --workload NAME[:key=value,...]",
			"\nPrefix statistics of a trace: lengths, prefix reuse, the cache hit rates no router can beat.",
			"Given the fleet (--instances), it simulates prefix-aware, least-request and round-robin",
			"routing on it (as kvroute simulate, on the first --sim-limit requests) and says from the",
			"measured TTFT and hit rates whether prefix-aware routing pays off.",
		},
		more:       workloadHelp,
		positional: true,
	}, stdout, stderr)
	if exit {
		return code
	}
	fs.Visit(func(fl *flag.Flag) {
		switch fl.Name {
		case "instances":
			f.fleet = true
		case "sim-limit":
			f.setLimit = true
		}
	})
	if !f.fleet {
		f.instances = boundsInstances
	}
	rep, err := analyze(ctx, &f, files, stdin)
	if err != nil {
		return failed(stderr, fs.Name(), err)
	}
	if f.json {
		err = writeJSON(stdout, rep)
	} else {
		err = writeAnalyzeText(stdout, rep)
	}
	if err != nil {
		fmt.Fprintf(stderr, "kvroute analyze: write: %v\n", err)
		return 1
	}
	return 0
}

// analyze checks the command line, reads the workload and measures it.
func analyze(ctx context.Context, f *analyzeFlags, files []string, stdin io.Reader) (*analyzeReport, error) {
	var errs []error
	switch {
	case f.trace != "" && len(files) > 0:
		errs = append(errs, errors.New("give the trace as FILE or as --trace FILE, not both"))
	case f.trace != "" && f.workload != "":
		errs = append(errs, errors.New("give --trace or --workload, not both"))
	case f.trace != "":
		files = []string{f.trace}
	case f.workload == "" && len(files) == 0:
		errs = append(errs, errors.New("give a trace FILE (- for standard input) or --workload NAME"))
	case f.workload == "" && len(files) > 1:
		errs = append(errs, fmt.Errorf("want one trace FILE (- for standard input), got %d: %q", len(files), files))
	case f.workload != "" && len(files) > 0:
		errs = append(errs, errors.New("give a trace FILE or --workload, not both"))
	}
	if f.format != "mooncake" {
		if _, err := workload.ParseTraceFormat(f.format); err == nil {
			// A format the verbs do not read but kvroute trace convert does: say how.
			errs = append(errs, fmt.Errorf("--format %s: analyze reads Mooncake traces only: convert it first with kvroute trace convert --from %s FILE > trace.jsonl", f.format, f.format))
		} else {
			errs = append(errs, fmt.Errorf("--format %q: unknown, want mooncake", f.format))
		}
	}
	if err := experiment.CheckInstances("--instances", f.instances); err != nil {
		errs = append(errs, err)
	}
	switch {
	case f.simLimit < 0:
		errs = append(errs, fmt.Errorf("--sim-limit %d: want 0 (all requests) or more", f.simLimit))
	case f.setLimit && f.noSimulate:
		errs = append(errs, errors.New("--sim-limit: nothing is simulated with --no-simulate"))
	case f.setLimit && !f.fleet:
		errs = append(errs, fmt.Errorf("--sim-limit: only with --instances N, the fleet to simulate (without it analyze simulates nothing; add --instances %d for the fleet the bounds assume)", boundsInstances))
	}
	prof, err := engine.LookupProfile(f.profile)
	if err != nil {
		errs = append(errs, fmt.Errorf("--profile: %w", err))
	}
	if len(errs) > 0 {
		return nil, usageError{errors.Join(errs...)}
	}
	var reqs []workload.Request
	rep := &analyzeReport{Format: f.format, Profile: prof.Name, KVTokens: prof.KVTokens()}
	switch {
	case f.workload != "":
		rep.Source, rep.Format = f.workload, "generated"
		if reqs, err = workload.Generate(f.workload, f.seed); err != nil {
			return nil, usageError{fmt.Errorf("--workload: %w", err)}
		}
	case files[0] == stdinTrace:
		rep.Source = stdinTraceName // as the other verbs' reports call it
		if err := checkStdin(stdin, "kvroute analyze"); err != nil {
			return nil, err
		}
		if reqs, err = workload.ReadMooncake(stdin); err != nil {
			return nil, fmt.Errorf("standard input: %w", err)
		}
	default:
		rep.Source = files[0]
		if reqs, err = workload.LoadMooncake(files[0]); err != nil {
			return nil, err
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("analysis interrupted: %w", err)
	}
	rep.Stats = workload.Analyze(reqs, workload.AnalyzeOptions{
		BlockSize: prof.BlockSize, CapacityTokens: f.instances * prof.KVTokens(), Instances: f.instances, Seed: f.seed,
	})
	rep.DurationSeconds = rep.Duration.Seconds()
	switch {
	case len(reqs) == 0:
		rep.NotSimulated = "no requests"
	case !f.fleet:
		rep.NotSimulated = "no fleet given (--instances N)"
	case f.noSimulate:
		rep.NotSimulated = "--no-simulate"
	case f.instances == 1:
		rep.NotSimulated = "one instance: every policy routes alike"
	case f.instances > maxSimInstances:
		rep.NotSimulated = fmt.Sprintf("--instances %d: more than the %d analyze simulates (kvroute simulate takes any fleet)", f.instances, maxSimInstances)
	}
	if rep.NotSimulated != "" {
		if len(reqs) > 0 && f.instances > 1 {
			rep.Verdict = strings.TrimSuffix(rep.Verdict, ".") + "; " + measureHint(f, files) + "."
		}
		return rep, nil
	}
	if rep.Simulation, err = simulateAnalyze(ctx, f, files, reqs, prof); err != nil {
		return nil, err
	}
	rep.Verdict = measuredVerdict(rep.Stats, rep.Simulation)
	return rep, nil
}

// workloadArgs are the flags that give simulate and plan the workload analyze read (with
// --seed, which a generated one needs).
func workloadArgs(f *analyzeFlags, files []string) string {
	if f.workload != "" {
		return fmt.Sprintf("--workload %s --seed %d", shellWord(f.workload), f.seed)
	}
	return "--trace " + shellWord(files[0])
}

// measureHint says how to measure what the statistics leave open.
func measureHint(f *analyzeFlags, files []string) string {
	src := workloadArgs(f, files)
	n, analyzeToo := "N", " (kvroute analyze does it given --instances)"
	if f.fleet {
		n, analyzeToo = fmt.Sprint(f.instances), ""
	}
	return fmt.Sprintf("to compare the policies on a fleet: kvroute simulate %s --instances %s --profile %s --policies %s%s, or kvroute plan %s --profile %s --slo-ttft-p90 2s for the fleet each policy needs",
		src, n, f.profile, analyzePolicies, analyzeToo, src, f.profile)
}

// shellWord quotes s for a POSIX shell when it holds anything but the characters file names
// and workload specs are usually made of.
func shellWord(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./:=,+@%") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// simulateAnalyze runs analyzePolicies on the fleet of f.instances engines of prof over the first
// f.simLimit requests, in virtual time, at most one policy per CPU at a time, as kvroute simulate
// would with the same flags (its defaults for everything else).
func simulateAnalyze(ctx context.Context, f *analyzeFlags, files []string, reqs []workload.Request, prof engine.Profile) (*analyzeSimulation, error) {
	specs, err := experiment.ParsePolicies(analyzePolicies)
	if err != nil {
		return nil, err
	}
	sample := reqs
	if f.simLimit > 0 && f.simLimit < len(reqs) {
		sample = reqs[:f.simLimit]
	}
	defer experiment.TuneGC()()
	start := time.Now()
	fleet := des.ProfileFleet(prof, f.instances)
	fleet.Seed = f.seed
	w := des.Prepare(sample, fleet.Model, fleet.BlockSize)
	sim := &analyzeSimulation{
		Requests: len(sample), Of: len(reqs), Instances: f.instances, Profile: prof.Name, BlockSize: fleet.BlockSize, Seed: f.seed,
		Results: make([]analyzeRun, len(specs)),
	}
	first, last := sample[0].Arrival, sample[0].Arrival
	for i := range sample {
		first, last = min(first, sample[i].Arrival), max(last, sample[i].Arrival)
	}
	if span := last - first; span > 0 {
		sim.SpanSeconds = span.Seconds()
		sim.Rate = float64(len(sample)) / span.Seconds()
		sim.Load = experiment.OfferedLoad(sample, prof, f.instances)
	}
	limit := ""
	if len(sample) < len(reqs) {
		limit = fmt.Sprintf(" --limit %d", len(sample))
	}
	src := workloadArgs(f, files)
	if f.workload == "" {
		src += fmt.Sprintf(" --seed %d", f.seed) // the policies' seed
	}
	sim.Command = fmt.Sprintf("kvroute simulate %s --instances %d --profile %s%s --policies %s",
		src, f.instances, prof.Name, limit, analyzePolicies)

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cpus := make(chan struct{}, max(1, runtime.GOMAXPROCS(0)))
	errs := make([]error, len(specs))
	var wg sync.WaitGroup
	for i, sp := range specs {
		wg.Go(func() {
			select {
			case cpus <- struct{}{}:
			case <-ctx.Done():
				errs[i] = ctx.Err()
				return
			}
			defer func() { <-cpus }()
			res, err := des.Run(ctx, fleet, w, sp.Label, des.Named(sp.Name, sp.Params))
			if err != nil {
				errs[i] = fmt.Errorf("simulate %s: %w", sp.Label, err)
				cancel()
				return
			}
			r := report.Summarize(sp.Label, res.Records, res.Busy)
			sim.Results[i] = analyzeRun{Policy: r.Policy, Completed: r.Completed, Failed: r.Failed, HitRate: r.HitRate, TTFT: r.TTFT}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil && !errors.Is(err, context.Canceled) {
			return nil, err
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("simulation interrupted: %w", err)
	}
	sim.WallSeconds = time.Since(start).Seconds()
	return sim, nil
}

// measuredVerdict says whether prefix-aware routing paid off in the simulation: its TTFT mean
// and p90 against those of the better prefix-blind policy (by TTFT mean), each difference given
// so that the reader sees how close it is; within sameWithin both ways it is a draw. Where no
// prefix repeats it says first that routing by prefix wins no hits, whatever the TTFTs show.
func measuredVerdict(s workload.Stats, sim *analyzeSimulation) string {
	pa, blind := sim.Results[0], sim.Results[1]
	for _, r := range sim.Results[2:] {
		if r.TTFT.Mean < blind.TTFT.Mean {
			blind = r
		}
	}
	mean, p90 := relative(pa.TTFT.Mean, blind.TTFT.Mean), relative(pa.TTFT.P90, blind.TTFT.P90)
	on := fmt.Sprintf("simulated on %d x %s", sim.Instances, sim.Profile)
	if sim.Load > 0 {
		on += fmt.Sprintf(" at load %.2f", sim.Load)
	}
	if sim.Requests < sim.Of {
		on += message.NewPrinter(language.English).Sprintf(" over the first %d of %d requests", sim.Requests, sim.Of)
	}
	figures := fmt.Sprintf("TTFT mean %s ms against %s ms with %s (%s) and p90 %s against %s ms (%s)",
		msFigure(pa.TTFT.Mean), msFigure(blind.TTFT.Mean), blind.Policy, change(mean), msFigure(pa.TTFT.P90), msFigure(blind.TTFT.P90), change(p90))
	var b strings.Builder
	subject := "prefix-aware routing"
	if s.NoReuse() {
		b.WriteString(strings.TrimSuffix(s.Verdict, ".") + "; ")
		subject = "as a load balancer, prefix-aware routing"
	}
	switch {
	case mean <= -sameWithin && p90 <= -sameWithin:
		fmt.Fprintf(&b, "%s pays off, %s: %s", subject, on, figures)
	case mean >= sameWithin && p90 >= sameWithin:
		fmt.Fprintf(&b, "%s does not pay off, %s: %s", subject, on, figures)
	case math.Abs(mean) < sameWithin && math.Abs(p90) < sameWithin:
		fmt.Fprintf(&b, "%s does about as well as %s, %s (both TTFT figures within %.0f%%): %s", subject, blind.Policy, on, 100*sameWithin, figures)
	default:
		fmt.Fprintf(&b, "%s gives a mixed result, %s (one TTFT figure %.0f%% or more apart, the other not or the other way): %s", subject, on, 100*sameWithin, figures)
	}
	switch hits := pa.HitRate - blind.HitRate; {
	case hits >= 0.0005 || hits <= -0.0005:
		fmt.Fprintf(&b, "; its hit rate %.3f against %.3f", pa.HitRate, blind.HitRate)
	case math.Abs(mean) >= sameWithin || math.Abs(p90) >= sameWithin:
		fmt.Fprintf(&b, "; with the same hit rate (%.3f) the difference comes from placing requests by predicted TTFT, not from the cache", pa.HitRate)
	}
	var failed []string
	for _, r := range sim.Results {
		if r.Failed > 0 {
			failed = append(failed, fmt.Sprintf("%d under %s", r.Failed, r.Policy))
		}
	}
	if failed != nil {
		fmt.Fprintf(&b, "; requests failed: %s", strings.Join(failed, ", "))
	}
	return b.String() + "."
}

// relative is (a - b) / b, 0 when b is 0.
func relative(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return (a - b) / b
}

// change writes a relative difference as "52% lower", "4.9% higher" (a tenth of a point below
// 10%, so that one just under sameWithin does not read as on it) or "the same".
func change(d float64) string {
	p := 100 * math.Abs(d)
	word := "higher"
	if d < 0 {
		word = "lower"
	}
	switch {
	case p < 0.05:
		return "the same"
	case p < 9.95:
		return fmt.Sprintf("%.1f%% %s", p, word)
	}
	return fmt.Sprintf("%.0f%% %s", p, word)
}

// msFigure writes milliseconds with thousands separators, to three significant digits below 100.
func msFigure(v float64) string {
	if v < 100 {
		return fmt.Sprintf("%.3g", v)
	}
	return message.NewPrinter(language.English).Sprintf("%.0f", v)
}

// writeAnalyzeText prints the report as aligned lines, numbers with thousands separators.
func writeAnalyzeText(w io.Writer, r *analyzeReport) error {
	p := message.NewPrinter(language.English)
	var b strings.Builder
	line := func(label, format string, args ...any) {
		fmt.Fprintf(&b, "%-16s%s\n", label, p.Sprintf(format, args...))
	}
	lengths := func(q workload.Percentiles) string {
		return p.Sprintf("p50 %d  p90 %d  p99 %d  max %d  mean %.0f", q.P50, q.P90, q.P99, q.Max, q.Mean)
	}
	line("source", "%s (%s)", r.Source, r.Format)
	if r.DurationSeconds > 0 {
		line("requests", "%d over %.0f s (%.2f requests/s)", r.Requests, r.DurationSeconds, r.Rate)
	} else {
		line("requests", "%d, all at the same time (no rate: every timestamp is equal)", r.Requests)
	}
	line("prompt tokens", "%s  (total %d)", lengths(r.Prompt), r.PromptTotal)
	line("output tokens", "%s", lengths(r.Output))
	blockSize := "mixed sizes"
	if r.BlockTokens > 0 {
		blockSize = p.Sprintf("%d tokens", r.BlockTokens)
	}
	line("blocks", "%d distinct (%s); working set %d tokens", r.DistinctBlocks, blockSize, r.WorkingSetTokens)
	line("common prefix", "%d block(s) shared by every request", r.CommonBlocks)
	var rep []string
	for _, x := range r.Repeats {
		rep = append(rep, p.Sprintf(">= %d: %.1f%%", x.Blocks, 100*x.Share))
	}
	line("repeat a prefix", "%s  (beyond the common prefix: %.1f%%)", strings.Join(rep, "  "), 100*r.RepeatBeyondCommon)
	line("hit rate", "unbounded cache %.3f; pooled LRU of %d x %d tokens (%s) %.3f; random over %d instances %.3f",
		r.InfiniteHitRate, r.Instances, r.KVTokens, r.Profile, r.LRUHitRate, r.Instances, r.RandomHitRate)
	line("", "(token-weighted, %d-token blocks; the first two bound any router, the last is a prefix-blind one)", r.BlockSize)
	line("placement", "%s", r.Findings)
	if sim := r.Simulation; sim != nil {
		load := "load undefined: every request arrives at once"
		if sim.SpanSeconds > 0 {
			load = p.Sprintf("%.0f s, %.2f requests/s, load %.2f", sim.SpanSeconds, sim.Rate, sim.Load)
		}
		which := p.Sprintf("all %d requests", sim.Of)
		if sim.Requests < sim.Of {
			which = p.Sprintf("the first %d of %d requests", sim.Requests, sim.Of)
		}
		line("simulated", "%s (%s) on %d x %s, %d-token blocks, seed %d: %d policies in %.1f s",
			which, load, sim.Instances, sim.Profile, sim.BlockSize, sim.Seed, len(sim.Results), sim.WallSeconds)
		for _, x := range sim.Results {
			failed := ""
			if x.Failed > 0 {
				failed = p.Sprintf("  failed %d", x.Failed)
			}
			line("", "  %-14s hit rate %.3f  TTFT mean %s ms  p50 %s  p90 %s  p99 %s%s",
				x.Policy, x.HitRate, msFigure(x.TTFT.Mean), msFigure(x.TTFT.P50), msFigure(x.TTFT.P90), msFigure(x.TTFT.P99), failed)
		}
		line("", "(the same, and more: %s)", sim.Command)
	} else {
		line("simulated", "nothing: %s", r.NotSimulated)
	}
	line("verdict", "%s", r.Verdict)
	_, err := io.WriteString(w, b.String())
	return err
}
