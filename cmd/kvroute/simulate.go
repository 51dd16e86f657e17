package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"strings"
	"sync"
	"time"

	"github.com/kvroute/kvroute/internal/des"
	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/policy"
	"github.com/kvroute/kvroute/internal/report"
	"github.com/kvroute/kvroute/internal/workload"
)

// simulateFlags are the flags of `kvroute simulate`.
type simulateFlags struct {
	trace, workload, profile, policies string
	records, html, cpuprofile          string
	replicaAffinity                    string
	kill, add                          listFlag
	instances, limit, blockSize        int
	routers                            int
	load, speedup                      float64
	seed                               uint64
	scrape, latency                    time.Duration
	json                               bool
}

// policySpec is one policy to compare: its name, its parameters and its label in the report.
type policySpec struct {
	label, name string
	params      policy.Params
}

// simulateMemoryLimit is the soft memory limit of a simulation run, in bytes.
const simulateMemoryLimit = 1200 << 20

// simulateGCPercent is the GC percentage (GOGC) of a simulation run.
const simulateGCPercent = 25

// simulationGC sets the garbage collector up for simulations and returns what restores it.
// Simulations of many policies over a large trace make garbage fast; a soft memory limit
// (unless the user set GOMEMLIMIT) keeps the peak well under 2 GB by collecting sooner. Most of
// a simulation's heap is large pointer-free arrays (block indexes, engine blocks, the
// workload's hashes) that a collection marks almost for free, so collecting at 25% growth
// rather than 100% (unless the user set GOGC) costs no measurable CPU and keeps the peak near
// the live heap: on the Mooncake trace, about 0.7 GB instead of 1.2.
func simulationGC() (restore func()) {
	var undo []func()
	if os.Getenv("GOMEMLIMIT") == "" {
		old := debug.SetMemoryLimit(simulateMemoryLimit)
		undo = append(undo, func() { debug.SetMemoryLimit(old) })
	}
	if os.Getenv("GOGC") == "" {
		old := debug.SetGCPercent(simulateGCPercent)
		undo = append(undo, func() { debug.SetGCPercent(old) })
	}
	return func() {
		for _, u := range undo {
			u()
		}
	}
}

func runSimulate(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("kvroute simulate")
	var f simulateFlags
	fs.StringVar(&f.trace, "trace", "", "Mooncake JSONL trace to replay")
	fs.StringVar(&f.workload, "workload", "", "synthetic workload NAME[:key=value,...] instead of --trace")
	fs.IntVar(&f.instances, "instances", 8, "number of engine instances")
	fs.StringVar(&f.profile, "profile", "llama3-70b-h200-tp8", "engine profile (model and hardware)")
	fs.IntVar(&f.blockSize, "block-size", 0, "engine KV block size in tokens, same KV capacity (0: the profile's; 512 replays the Mooncake trace ~20x faster)")
	fs.StringVar(&f.policies, "policies", "", "policies to compare, comma-separated, each NAME[:key=value,...] (default: all registered)")
	fs.Float64Var(&f.load, "load", 0, "scale arrivals so that prefill work without cache hits is this fraction of the fleet's prefill capacity")
	fs.Float64Var(&f.speedup, "speedup", 0, "divide arrival times by this factor (instead of --load; default 1)")
	fs.IntVar(&f.limit, "limit", 0, "use only the first N requests (0: all)")
	fs.Uint64Var(&f.seed, "seed", 1, "seed of the policies' randomness and of synthetic workloads")
	fs.DurationVar(&f.scrape, "scrape-interval", des.DefaultScrapeInterval, "how often the router sees fresh engine metrics")
	fs.DurationVar(&f.latency, "network-latency", 0, "one-way router-engine latency")
	fs.IntVar(&f.routers, "routers", 1, "router replicas behind a load balancer, each with its own policy instance and load counters")
	fs.Var(&f.kill, "kill", "kill instance N at virtual time T: N@T, T a duration (90s) or a share of the arrivals' span (50%); its requests fail, later ones fall back (repeatable)")
	fs.Var(&f.add, "add", "add instance N at virtual time T (N@T as for --kill): it takes no request before (repeatable)")
	fs.StringVar(&f.replicaAffinity, "replica-affinity", "none", "how the load balancer spreads requests over --routers: none (round-robin per request) or session (hash of the session key)")
	fs.BoolVar(&f.json, "json", false, "print the summary as JSON")
	fs.StringVar(&f.cpuprofile, "cpuprofile", "", "write a Go CPU profile of the run to this file")
	fs.StringVar(&f.html, "html", "", "also write an HTML report with charts to this file")
	fs.StringVar(&f.records, "records", "", "also write every request's record, policy after policy, to this JSON Lines file")
	if _, code, exit := parseOrExit(fs, args, verbHelp{
		usage: []string{
			"usage: kvroute simulate (--trace FILE | --workload NAME[:k=v,...]) [flags]",
			"\nReplays a workload on a fleet of modelled engines in virtual time, once per policy.",
		},
		more: func(w io.Writer) { workloadHelp(w); policyHelp(w) },
	}, stdout, stderr); exit {
		return code
	}
	defer simulationGC()()
	if f.cpuprofile != "" {
		stop, err := startCPUProfile(f.cpuprofile)
		if err != nil {
			return failed(stderr, fs.Name(), fmt.Errorf("--cpuprofile: %w", err))
		}
		defer stop()
	}
	sum, err := simulate(ctx, &f)
	if err != nil {
		return failed(stderr, fs.Name(), err)
	}
	if f.json {
		err = writeSimulateJSON(stdout, sum, &f)
	} else {
		err = writeSimulateTable(stdout, sum, &f)
	}
	if err != nil {
		return failed(stderr, fs.Name(), err)
	}
	return 0
}

// simulateSummary is report.Summary with the router replicas added to its scenario. The
// replicas are left out for one router, so that a single router's output is what it always was.
type simulateSummary struct {
	Scenario simulateScenario `json:"scenario"`
	*report.Summary
}

type simulateScenario struct {
	report.Scenario
	Routers         int    `json:"routers"`
	ReplicaAffinity string `json:"replica_affinity"`
}

// writeSimulateJSON writes sum as JSON, with the router replicas in the scenario when there
// are several.
func writeSimulateJSON(w io.Writer, sum *report.Summary, f *simulateFlags) error {
	if f.routers <= 1 {
		return report.WriteJSON(w, sum)
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	s := simulateSummary{Scenario: simulateScenario{Scenario: sum.Scenario, Routers: f.routers, ReplicaAffinity: f.replicaAffinity}, Summary: sum}
	if err := enc.Encode(s); err != nil {
		return fmt.Errorf("write json summary: %w", err)
	}
	return nil
}

// writeSimulateTable writes sum as a table, with the router replicas at the end of its header
// line when there are several.
func writeSimulateTable(w io.Writer, sum *report.Summary, f *simulateFlags) error {
	if f.routers <= 1 {
		return report.WriteTable(w, sum)
	}
	var b bytes.Buffer
	if err := report.WriteTable(&b, sum); err != nil {
		return err
	}
	head, rest, _ := bytes.Cut(b.Bytes(), []byte("\n"))
	if _, err := fmt.Fprintf(w, "%s, %s\n%s", head, routersNote(f), rest); err != nil {
		return fmt.Errorf("write table: %w", err)
	}
	return nil
}

// routersNote says how many router replicas there are and how requests reach them.
func routersNote(f *simulateFlags) string {
	how := "round-robin per request"
	if f.replicaAffinity == "session" {
		how = "by session key"
	}
	return fmt.Sprintf("%d router replicas (%s)", f.routers, how)
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

// simulate checks the flags, loads the workload and runs every policy on it.
func simulate(ctx context.Context, f *simulateFlags) (*report.Summary, error) {
	prof, specs, errs := checkSimulation(f.trace, f.workload, f.limit, f.profile, f.policies)
	if f.instances < 1 {
		errs = append(errs, fmt.Errorf("--instances %d: want at least 1", f.instances))
	}
	if f.load < 0 || f.speedup < 0 {
		errs = append(errs, errors.New("--load and --speedup must be positive"))
	}
	if f.load > 0 && f.speedup > 0 {
		errs = append(errs, errors.New("give --load or --speedup, not both"))
	}
	if f.blockSize < 0 {
		errs = append(errs, fmt.Errorf("--block-size %d: want 0 (the profile's) or a positive number of tokens", f.blockSize))
	}
	if f.scrape <= 0 {
		errs = append(errs, fmt.Errorf("--scrape-interval %v: want a positive duration such as 200ms", f.scrape))
	}
	if f.latency < 0 {
		errs = append(errs, fmt.Errorf("--network-latency %v: want 0 or more", f.latency))
	}
	if f.routers < 1 {
		errs = append(errs, fmt.Errorf("--routers %d: want at least 1 (the number of router replicas)", f.routers))
	}
	spread := des.SpreadRoundRobin
	switch f.replicaAffinity {
	case "none":
	case "session":
		spread = des.SpreadSession
	default:
		errs = append(errs, fmt.Errorf("--replica-affinity %q: want none (round-robin per request) or session", f.replicaAffinity))
	}
	if f.blockSize > 0 {
		prof = prof.WithBlockSize(f.blockSize)
	}
	if len(errs) > 0 {
		return nil, usageError{errors.Join(errs...)}
	}

	reqs, name, err := loadRequests(f.trace, f.workload, f.seed, f.limit)
	if err != nil {
		return nil, err
	}
	speedup := f.speedup
	if f.load > 0 {
		speedup, err = speedupForLoad(reqs, prof, f.instances, f.load)
		if err != nil {
			return nil, err
		}
	}
	if speedup == 0 {
		speedup = 1
	}
	reqs = workload.Speedup(reqs, speedup)

	fleet := des.ProfileFleet(prof, f.instances)
	fleet.ScrapeInterval = f.scrape
	fleet.NetworkLatency = f.latency
	fleet.Seed = f.seed
	fleet.Routers = f.routers
	fleet.Spread = spread
	for _, c := range []struct {
		kind  des.ChangeKind
		specs listFlag
	}{{des.Kill, f.kill}, {des.Add, f.add}} {
		for _, spec := range c.specs {
			ch, err := des.ParseChange(c.kind, spec, span(reqs))
			if err != nil {
				return nil, usageError{err}
			}
			fleet.Changes = append(fleet.Changes, ch)
		}
	}

	sum := &report.Summary{
		Scenario: report.Scenario{
			Workload: name, Requests: len(reqs), Instances: f.instances, Profile: prof.Name,
			Speedup: speedup, Seed: int64(f.seed), BlockSize: prof.BlockSize,
			Load:             offeredLoad(reqs, prof, f.instances),
			ScrapeIntervalMS: float64(f.scrape) / float64(time.Millisecond),
		},
		Results: make([]report.Result, len(specs)),
	}
	var records [][]report.Record
	if f.records != "" || f.html != "" {
		records = make([][]report.Record, len(specs))
	}
	w := des.Prepare(reqs, fleet.Model, fleet.BlockSize)

	// One simulation per policy, at most one per CPU at a time, plus the bounds beside them.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg      sync.WaitGroup
		errsMu  sync.Mutex
		runErrs = make([]error, len(specs))
		sem     = make(chan struct{}, max(1, runtime.GOMAXPROCS(0)))
	)
	wg.Go(func() {
		sum.Bounds.InfiniteCacheHitRate = workload.InfiniteCacheHitRate(reqs, prof.BlockSize)
		sum.Bounds.PooledLRUHitRate = workload.LRUHitRate(reqs, prof.BlockSize, f.instances*prof.KVTokens())
	})
	for i, sp := range specs {
		wg.Go(func() {
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				return
			}
			defer func() { <-sem }()
			start := time.Now()
			res, err := des.Run(ctx, fleet, w, sp.label, des.Named(sp.name, sp.params))
			if err != nil {
				errsMu.Lock()
				runErrs[i] = fmt.Errorf("policy %s: %w", sp.label, err)
				errsMu.Unlock()
				cancel()
				return
			}
			r := report.Summarize(sp.label, res.Records, res.Busy)
			r.Preemptions = res.Preemptions()
			r.WallSeconds = time.Since(start).Seconds()
			sum.Results[i] = r
			if records != nil {
				records[i] = res.Records
			}
		})
	}
	wg.Wait()
	for _, err := range runErrs {
		if err != nil && !errors.Is(err, context.Canceled) {
			return nil, err
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("simulation interrupted: %w", err)
	}
	if f.records != "" {
		if err := writeRecords(f.records, records); err != nil {
			return nil, err
		}
	}
	if f.html != "" {
		opt := report.HTMLOptions{
			Title: "kvroute simulate: " + name,
			Notes: []string{fmt.Sprintf("Virtual time: arrivals divided by %.3g; engine metrics scraped every %v; router-engine latency %v.",
				speedup, f.scrape, f.latency)},
		}
		if f.routers > 1 {
			opt.Notes = append(opt.Notes, routersNote(f)+", each with its own policy instance and load counters.")
		}
		if err := writeFile(f.html, func(w io.Writer) error { return report.WriteHTML(w, sum, records, opt) }); err != nil {
			return nil, fmt.Errorf("--html: %w", err)
		}
	}
	return sum, nil
}

// checkSimulation checks the flags simulate and plan share: a trace or a workload, the limit,
// the profile and the policies. It returns every problem found.
func checkSimulation(trace, work string, limit int, profile, policies string) (engine.Profile, []policySpec, []error) {
	var errs []error
	if (trace == "") == (work == "") {
		errs = append(errs, errors.New("give exactly one of --trace FILE or --workload NAME"))
	}
	if limit < 0 {
		errs = append(errs, fmt.Errorf("--limit %d: want 0 (all) or more", limit))
	}
	prof, err := engine.LookupProfile(profile)
	if err != nil {
		errs = append(errs, fmt.Errorf("--profile: %w", err))
	}
	specs, err := parsePolicies(policies)
	if err != nil {
		errs = append(errs, fmt.Errorf("--policies: %w", err))
	}
	return prof, specs, errs
}

// loadRequests reads the trace, or generates the workload, and keeps its first limit requests
// (0: all); name names it in reports.
func loadRequests(trace, work string, seed uint64, limit int) (reqs []workload.Request, name string, err error) {
	if trace != "" {
		name = filepath.Base(trace)
		reqs, err = workload.LoadMooncake(trace)
	} else {
		name = work
		reqs, err = workload.Generate(work, seed)
		if err != nil {
			err = usageError{fmt.Errorf("--workload: %w", err)}
		}
	}
	if err != nil {
		return nil, "", err
	}
	if limit > 0 && limit < len(reqs) {
		reqs = reqs[:limit]
	}
	if len(reqs) == 0 {
		return nil, "", errors.New("the workload has no requests")
	}
	return reqs, name, nil
}

// writeRecords writes every policy's records to path as JSON Lines.
func writeRecords(path string, records [][]report.Record) error {
	err := writeFile(path, func(w io.Writer) error {
		for _, recs := range records {
			if err := report.WriteRecords(w, recs); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("--records: %w", err)
	}
	return nil
}

// writeFile creates path and fills it with write.
func writeFile(path string, write func(io.Writer) error) (err error) {
	fh, err := os.Create(path)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := fh.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("close %s: %w", path, cerr)
		}
	}()
	if err := write(fh); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// parsePolicies splits "a,b:k=v,k2=v2,c" into policy specs: a comma-separated piece that holds
// "=" but no ":" continues the previous policy's parameters. Every policy is built once here so
// that an unknown name or a bad parameter is reported before any work. Empty means every
// registered policy.
func parsePolicies(s string) ([]policySpec, error) {
	var pieces []string
	if strings.TrimSpace(s) == "" {
		pieces = policy.Names()
	} else {
		for p := range strings.SplitSeq(s, ",") {
			if n := len(pieces); n > 0 && strings.Contains(p, "=") && !strings.Contains(p, ":") {
				pieces[n-1] += "," + p
				continue
			}
			pieces = append(pieces, p)
		}
	}
	specs := make([]policySpec, 0, len(pieces))
	seen := map[string]bool{}
	var errs []error
	for _, p := range pieces {
		name, params, err := policy.ParseSpec(p)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		label := strings.TrimSpace(p)
		if seen[label] {
			errs = append(errs, fmt.Errorf("policy %q given twice", label))
			continue
		}
		seen[label] = true
		if _, err := policy.New(name, params, policy.Env{}); err != nil {
			errs = append(errs, err)
			continue
		}
		specs = append(specs, policySpec{label: label, name: name, params: params})
	}
	return specs, errors.Join(errs...)
}

// prefillWork is the prefill time of every prompt on an idle engine with an empty cache.
func prefillWork(reqs []workload.Request, p engine.Profile) time.Duration {
	var work time.Duration
	for i := range reqs {
		work += p.UnloadedTTFT(reqs[i].PromptTokens, 0)
	}
	return work
}

// span is the time from the first arrival to the last.
func span(reqs []workload.Request) time.Duration {
	lo, hi := reqs[0].Arrival, reqs[0].Arrival
	for i := range reqs {
		lo = min(lo, reqs[i].Arrival)
		hi = max(hi, reqs[i].Arrival)
	}
	return hi - lo
}

// speedupForLoad is the factor K by which arrivals must be compressed for the prefill work
// without cache hits to be load times the fleet's prefill capacity: work / (span / K) = load x n.
func speedupForLoad(reqs []workload.Request, p engine.Profile, n int, load float64) (float64, error) {
	d := span(reqs)
	work := prefillWork(reqs, p)
	if d <= 0 || work <= 0 {
		return 0, usageErr("--load needs a workload whose arrivals spread over time and a profile with a prefill cost (use --speedup)")
	}
	return load * float64(n) * d.Seconds() / work.Seconds(), nil
}

// offeredLoad is the prefill work without cache hits over the fleet's capacity during the
// (already scaled) arrivals' span; 0 when undefined.
func offeredLoad(reqs []workload.Request, p engine.Profile, n int) float64 {
	d := span(reqs)
	if d <= 0 {
		return 0
	}
	return prefillWork(reqs, p).Seconds() / d.Seconds() / float64(n)
}
