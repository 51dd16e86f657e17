package scorecard

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kvroute/kvroute/internal/des"
	"github.com/kvroute/kvroute/internal/experiment"
	"github.com/kvroute/kvroute/internal/report"
	"github.com/kvroute/kvroute/internal/workload"
)

// DefaultTrace is where the Mooncake conversation trace is, relative to the repository root.
const DefaultTrace = "../shared/traces/mooncake/conversation_trace.jsonl"

// DefaultSubject is the policy whose targets the scorecard checks.
const DefaultSubject = "prefix-aware"

// Options say what to run.
type Options struct {
	// Trace is the Mooncake conversation trace (empty: DefaultTrace). When the file does not
	// exist its scenario is skipped with a note, not failed.
	Trace string
	// Seeds are the seeds to run each cell with (empty: 1). A seed seeds the policies'
	// randomness and the generated workloads.
	Seeds []uint64
	// Policies are the policies to compare, experiment.ParsePolicies' form (empty: all).
	Policies string
	// Subject is the policy checked against the targets (empty: DefaultSubject). When it is
	// not among the policies no cell has a verdict.
	Subject string
	// Matrix is the scenarios to choose from (nil: Matrix()).
	Matrix []Scenario
	// Scenarios keeps the scenarios whose name contains one of these (empty: all).
	Scenarios []string
	// Loads are the loads of every scenario (empty: Loads).
	Loads []float64
	// Parallel bounds the simulations that run at once (0: one per CPU).
	Parallel int
	// NonStreamed is the fraction of every cell's requests whose answer comes whole
	// (workload.Whole, drawn from the cell's seed): 0, the matrix's own, streams them all.
	NonStreamed float64
	// MaxRequests, when above 0, cuts every cell's workload to its earliest MaxRequests
	// arrivals (the load is then set on what is left): a quicker, rougher cell.
	MaxRequests int
	// Quick runs a reduced matrix for a first look: the first seed only, at QuickLoad (unless
	// Loads is set), each cell cut to QuickRequests requests (unless MaxRequests is set). It
	// takes about QuickDuration where the full matrix of one seed takes 9 to 10 minutes (2
	// cores); its verdicts are indicative only, and the Scorecard and every verdict say so.
	Quick bool
	// Progress, when set, is told how the run goes, for a person waiting on it (a full
	// scorecard takes many minutes): at the start, the scenarios skipped for a trace that is
	// not there; then a line per cell finished, with the time spent and an estimate of the time
	// left. Nil: nothing. The Scorecard is the same either way.
	Progress io.Writer
}

// Scorecard is every cell's scores.
type Scorecard struct {
	Subject string   `json:"subject"`
	Seeds   []uint64 `json:"seeds"`
	// NonStreamed is Options.NonStreamed.
	NonStreamed float64 `json:"non_streamed,omitempty"`
	// Quick says the run was a quick one (Options.Quick): its verdicts are indicative only.
	Quick bool `json:"quick,omitempty"`
	// MaxRequests is the most requests a cell kept (Options.MaxRequests; 0: all).
	MaxRequests int    `json:"max_requests,omitempty"`
	Trace       string `json:"trace"`
	Cells       []Cell `json:"cells"`
	// WallSeconds is how long the whole run took; RunSeconds adds up the simulations' own
	// times (CPU-bound, one goroutine each).
	WallSeconds float64 `json:"wall_seconds"`
	RunSeconds  float64 `json:"run_seconds"`
}

// Cell is one scenario at one load and seed: what ran and every policy's scores.
type Cell struct {
	Scenario  string  `json:"scenario"`
	Workload  string  `json:"workload"`
	Fleet     string  `json:"fleet"`
	Load      float64 `json:"load"`
	Seed      uint64  `json:"seed"`
	NoSharing bool    `json:"no_sharing,omitempty"`
	// Skipped says why the cell did not run ("" when it ran).
	Skipped  string `json:"skipped,omitempty"`
	Requests int    `json:"requests,omitempty"`
	// WorkloadRequests is the workload's own count when Options.MaxRequests cut it to
	// Requests (0: not cut).
	WorkloadRequests int `json:"workload_requests,omitempty"`
	// Speedup divided the workload's arrivals to reach Load; OfferedLoad is the load it gave.
	Speedup     float64       `json:"speedup,omitempty"`
	OfferedLoad float64       `json:"offered_load,omitempty"`
	Bounds      report.Bounds `json:"bounds"`
	Scores      []Score       `json:"scores,omitempty"`
	// Verdict is the subject's, nil when the subject did not run.
	Verdict *Verdict `json:"verdict,omitempty"`
}

// Score is one policy's figures in a cell.
type Score struct {
	Policy string `json:"policy"`
	// HitRate is the engines' prefix-cache hits over prompt tokens; HitOfBound that over the
	// pooled-LRU bound (0 when the bound is 0).
	HitRate    float64        `json:"hit_rate"`
	HitOfBound float64        `json:"hit_of_bound"`
	TTFT       report.Latency `json:"ttft_ms"`
	// MeanRatio, P50Ratio and P99Ratio are its TTFT mean, p50 and p99 over the best (lowest)
	// of the other policies' (0 when there is no other).
	MeanRatio float64 `json:"ttft_mean_ratio"`
	P50Ratio  float64 `json:"ttft_p50_ratio"`
	P99Ratio  float64 `json:"ttft_p99_ratio"`
	// E2E is its whole time, arrival to last token: what a client that does not stream waits
	// for (no target reads it).
	E2E report.Latency `json:"e2e_ms"`
	// Imbalance is max / mean of the instances' busy fractions, each over the time the
	// instance was part of the fleet.
	Imbalance   float64 `json:"imbalance"`
	Completed   int     `json:"completed"`
	Failed      int     `json:"failed"`
	WallSeconds float64 `json:"wall_seconds"`
}

// Run runs the scorecard: every scenario at every load and seed, every policy in each, at most
// Parallel simulations at once. The cells come back in matrix order (seed, scenario, load).
func Run(ctx context.Context, o Options) (*Scorecard, error) {
	start := time.Now()
	pols, err := experiment.ParsePolicies(o.Policies)
	if err != nil {
		return nil, &experiment.UsageError{Err: fmt.Errorf("--policies: %w", err)}
	}
	if o.Trace == "" {
		o.Trace = DefaultTrace
	}
	if len(o.Seeds) == 0 {
		o.Seeds = []uint64{1}
	}
	if o.Subject == "" {
		o.Subject = DefaultSubject
	}
	if o.Quick {
		o.Seeds = o.Seeds[:1]
		if len(o.Loads) == 0 {
			o.Loads = []float64{QuickLoad}
		}
		if o.MaxRequests == 0 {
			o.MaxRequests = QuickRequests
		}
	}
	if len(o.Loads) == 0 {
		o.Loads = Loads
	}
	var errs []error
	if o.MaxRequests < 0 {
		errs = append(errs, fmt.Errorf("max requests %d: want 0 (all) or more", o.MaxRequests))
	}
	for _, l := range o.Loads {
		if !(l > 0) {
			errs = append(errs, fmt.Errorf("load %g: want a load above 0, such as 0.7", l))
		}
	}
	if o.Matrix == nil {
		o.Matrix = Matrix()
	}
	scenarios := pick(o.Matrix, o.Scenarios)
	if len(scenarios) == 0 {
		errs = append(errs, fmt.Errorf("no scenario matches %q: the scenarios are %s", o.Scenarios, strings.Join(names(o.Matrix), ", ")))
	}
	if o.Parallel < 0 {
		errs = append(errs, fmt.Errorf("parallel %d: want 0 (one per CPU) or more", o.Parallel))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, &experiment.UsageError{Err: err}
	}
	if o.Parallel == 0 {
		o.Parallel = runtime.GOMAXPROCS(0)
	}
	sc := &Scorecard{Subject: o.Subject, Seeds: o.Seeds, Trace: o.Trace, NonStreamed: o.NonStreamed, Quick: o.Quick, MaxRequests: o.MaxRequests}
	subject := slices.IndexFunc(pols, func(p experiment.Policy) bool { return p.Label == o.Subject })

	src := &sources{trace: o.Trace}
	noTrace := false
	if slices.ContainsFunc(scenarios, func(s Scenario) bool { return s.Trace() }) {
		_, err := os.Stat(o.Trace)
		noTrace = errors.Is(err, os.ErrNotExist)
	}
	prog := &progress{w: o.Progress, start: start, now: time.Now, parallel: o.Parallel}
	if noTrace {
		for _, s := range scenarios {
			if s.Trace() {
				prog.printf("scorecard: %s skipped: %v: %s (give its path with --trace)", s.Name, errNoTrace, o.Trace)
			}
		}
	}
	var cells []*cellRun
	for _, seed := range o.Seeds {
		for i := range scenarios {
			for _, load := range o.Loads {
				c := &cellRun{Cell: Cell{
					Scenario: scenarios[i].Name, Workload: scenarios[i].Workload, Fleet: scenarios[i].FleetName(),
					Load: load, Seed: seed, NoSharing: scenarios[i].NoSharing,
				}, scenario: &scenarios[i], pending: len(pols), whole: o.NonStreamed, most: o.MaxRequests, prog: prog}
				if c.Workload == "" {
					c.Workload = o.Trace
				}
				c.Scores = make([]Score, len(pols))
				cells = append(cells, c)
			}
		}
	}

	// Every workload is loaded before the first simulation, so that the estimate of the time
	// left can weigh each cell by its prompt tokens: the cells of one seed range from 2.2
	// million tokens (249 to 1,024 requests) to 203 million (tool-agent's 23,608), and a
	// simulation's time goes with them.
	for _, c := range cells {
		if noTrace && c.scenario.Trace() {
			continue
		}
		reqs, err := c.workload(src)
		if err != nil {
			return nil, fmt.Errorf("%s, seed %d: %w", c.Scenario, c.Seed, err)
		}
		for i := range reqs {
			c.weight += float64(reqs[i].PromptTokens)
		}
		prog.total++
		prog.weight += c.weight
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("scorecard interrupted: %w", err)
		}
	}

	// Jobs are (cell, policy) in matrix order; a cell is prepared by its first job and freed
	// by its last, so that only about Parallel cells are held in memory at once.
	parent := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	jobs := make(chan [2]int)
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
	)
	fail := func(err error) {
		mu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		mu.Unlock()
		cancel()
	}
	for range o.Parallel {
		wg.Go(func() {
			for j := range jobs {
				c, p := cells[j[0]], pols[j[1]]
				if err := c.run(ctx, src, j[1], p); err != nil {
					fail(fmt.Errorf("%s, load %g, seed %d, policy %s: %w", c.Scenario, c.Load, c.Seed, p.Label, err))
				}
			}
		})
	}
feed:
	for i := range cells {
		for k := range pols {
			select {
			case jobs <- [2]int{i, k}:
			case <-ctx.Done():
				break feed
			}
		}
	}
	close(jobs)
	wg.Wait()
	// Interrupted (Ctrl-C): the simulations it stopped failed too, each saying so in its own
	// words; the run's end is the interruption, not the first of them.
	if err := parent.Err(); err != nil {
		return nil, fmt.Errorf("scorecard interrupted: %w", err)
	}
	if firstErr != nil {
		return nil, firstErr
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("scorecard interrupted: %w", err)
	}
	for _, c := range cells {
		if c.Skipped != "" {
			c.Scores = nil
		} else {
			score(&c.Cell)
			if subject >= 0 {
				c.Verdict = judge(&c.Cell, subject)
				c.Verdict.Quick = o.Quick
			}
			for k := range c.Scores {
				sc.RunSeconds += c.Scores[k].WallSeconds
			}
		}
		sc.Cells = append(sc.Cells, c.Cell)
	}
	sc.WallSeconds = time.Since(start).Seconds()
	return sc, nil
}

// pick keeps the scenarios whose name contains one of the filters (all when none).
func pick(all []Scenario, filters []string) []Scenario {
	if len(filters) == 0 {
		return all
	}
	var out []Scenario
	for _, s := range all {
		for _, f := range filters {
			if strings.Contains(s.Name, strings.TrimSpace(f)) {
				out = append(out, s)
				break
			}
		}
	}
	return out
}

func names(ss []Scenario) []string {
	out := make([]string, len(ss))
	for i := range ss {
		out[i] = ss[i].Name
	}
	return out
}

// sources loads workloads once: the trace for every cell that replays it, a generated
// workload for every load of its scenario and seed.
type sources struct {
	trace string

	mu        sync.Mutex
	traceOnce sync.Once
	traceReqs []workload.Request
	traceErr  error
	generated map[string][]workload.Request
}

// errNoTrace marks a trace file that is not there: its cells are skipped.
var errNoTrace = errors.New("trace not found")

func (s *sources) load(sc *Scenario, seed uint64) ([]workload.Request, error) {
	if sc.Trace() {
		s.traceOnce.Do(func() {
			if _, err := os.Stat(s.trace); errors.Is(err, os.ErrNotExist) {
				s.traceErr = fmt.Errorf("%w: %s (give its path with --trace)", errNoTrace, s.trace)
				return
			}
			s.traceReqs, s.traceErr = workload.LoadMooncake(s.trace)
		})
		return s.traceReqs, s.traceErr
	}
	key := fmt.Sprintf("%s\x00%d", sc.Workload, seed)
	s.mu.Lock()
	defer s.mu.Unlock()
	if r, ok := s.generated[key]; ok {
		return r, nil
	}
	r, err := workload.Generate(sc.Workload, seed)
	if err != nil {
		return nil, err
	}
	if s.generated == nil {
		s.generated = map[string][]workload.Request{}
	}
	s.generated[key] = r
	return r, nil
}

// progress tells Options.Progress of the cells finished.
type progress struct {
	w        io.Writer // nil: nothing is told
	start    time.Time
	now      func() time.Time
	parallel int     // simulations at once
	total    int     // the cells to run: all but those skipped
	weight   float64 // the prompt tokens of those cells, all together

	mu         sync.Mutex
	done       int
	doneWeight float64       // the prompt tokens of the cells done
	took       time.Duration // the time their simulations took, added up
}

func (p *progress) printf(format string, args ...any) {
	if p.w != nil {
		fmt.Fprintf(p.w, format+"\n", args...)
	}
}

// cellDone tells of c finished, its simulations having taken took together and its prompts
// weighing weight tokens.
func (p *progress) cellDone(c *Cell, weight float64, took time.Duration) {
	if p.w == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done++
	p.doneWeight += weight
	p.took += took
	elapsed := p.now().Sub(p.start)
	// The cells differ a hundredfold in cost, and the cheap ones come first: the mean time of
	// a cell so far foretold a small part of the rest (3 s where 64 s were left, four cells
	// into a quick run). A simulation's time goes with its prompt
	// tokens (within a factor of about 3 over the matrix): the time per token measured so far,
	// over the tokens left, Parallel simulations at a time.
	var left time.Duration
	if p.doneWeight > 0 {
		left = time.Duration(float64(p.took) / p.doneWeight * (p.weight - p.doneWeight) / float64(max(1, p.parallel)))
	}
	rest := fmt.Sprintf("about %s left", left.Round(time.Second))
	if p.done == p.total {
		rest = "all done"
	}
	p.printf("scorecard: %d/%d cells: %s, load %g, seed %d (%s of simulations); %s elapsed, %s",
		p.done, p.total, c.Scenario, c.Load, c.Seed, took.Round(time.Second), elapsed.Round(time.Second), rest)
}

// cellRun is a cell while it runs: what its jobs share.
type cellRun struct {
	Cell
	scenario *Scenario
	whole    float64 // Options.NonStreamed
	most     int     // Options.MaxRequests
	prog     *progress
	weight   float64 // the prompt tokens of its workload (after most), for the progress

	once    sync.Once
	err     error
	fleet   fleet
	w       *des.Workload
	mu      sync.Mutex
	pending int // jobs not yet finished
	took    time.Duration
}

// workload is the cell's workload, cut to its earliest c.most requests when it has more. The
// slice is src's, shared by the cells of a scenario and seed: read only.
func (c *cellRun) workload(src *sources) ([]workload.Request, error) {
	reqs, err := src.load(c.scenario, c.Seed)
	if err != nil || c.most == 0 || len(reqs) <= c.most {
		return reqs, err
	}
	if !slices.IsSortedFunc(reqs, byArrival) {
		reqs = slices.Clone(reqs)
		slices.SortStableFunc(reqs, byArrival)
	}
	return reqs[:c.most:c.most], nil
}

func byArrival(a, b workload.Request) int { return cmp.Compare(a.Arrival, b.Arrival) }

// prepare loads the cell's workload, scales it to the load and computes the bounds.
func (c *cellRun) prepare(src *sources) error {
	reqs, err := c.workload(src)
	if errors.Is(err, errNoTrace) {
		c.Skipped = err.Error()
		return nil
	}
	if err != nil {
		return err
	}
	f, scaled, err := c.scenario.buildFleet(reqs, c.Load, c.Seed)
	if err != nil {
		return err
	}
	c.fleet = f
	c.Requests, c.Speedup, c.OfferedLoad = len(scaled), f.speedup, f.load
	if all, _ := src.load(c.scenario, c.Seed); len(all) > len(reqs) {
		c.WorkloadRequests = len(all)
	}
	c.Bounds = report.Bounds{
		InfiniteCacheHitRate: workload.InfiniteCacheHitRate(scaled, f.config.BlockSize),
		PooledLRUHitRate:     workload.LRUHitRate(scaled, f.config.BlockSize, f.kv),
	}
	if c.whole > 0 {
		scaled = workload.Whole(scaled, c.whole, c.Seed)
	}
	c.w = des.Prepare(scaled, f.config.Model, f.config.BlockSize)
	return nil
}

// run simulates policy k of the cell.
func (c *cellRun) run(ctx context.Context, src *sources, k int, p experiment.Policy) (err error) {
	start := time.Now()
	defer func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.took += time.Since(start)
		if err != nil {
			c.err = err // the cell will not finish: told of by the run's error
		}
		if c.pending--; c.pending == 0 {
			c.w = nil // the last job frees the prepared workload
			if c.err == nil && c.Skipped == "" {
				c.prog.cellDone(&c.Cell, c.weight, c.took)
			}
		}
	}()
	c.once.Do(func() { c.err = c.prepare(src) })
	c.mu.Lock()
	err = c.err
	c.mu.Unlock()
	if err != nil || c.Skipped != "" {
		return err
	}
	res, err := des.Run(ctx, c.fleet.config, c.w, p.Label, des.Named(p.Name, p.Params))
	if err != nil {
		return err
	}
	r := report.Summarize(p.Label, res.Records, res.Busy)
	c.Scores[k] = Score{
		Policy: p.Label, HitRate: r.HitRate, TTFT: r.TTFT, E2E: r.E2E, Completed: r.Completed, Failed: r.Failed,
		Imbalance:   imbalance(res, c.fleet.config.Changes),
		WallSeconds: time.Since(start).Seconds(),
	}
	return nil
}

// imbalance is max / mean of the instances' busy fractions, each over the time from when the
// instance joined (0, or its Add change) to the last request's end.
func imbalance(res *des.Result, changes []des.Change) float64 {
	var end time.Duration
	for i := range res.Records {
		end = max(end, res.Records[i].Finish)
	}
	from := make([]time.Duration, len(res.Busy))
	for _, ch := range changes {
		if ch.Kind == des.Add {
			from[ch.Instance] = ch.At
		}
	}
	busy := make([]float64, len(res.Busy))
	for i, b := range res.Busy {
		if d := end - from[i]; d > 0 {
			busy[i] = b.Seconds() / d.Seconds()
		}
	}
	return report.Imbalance(busy)
}
