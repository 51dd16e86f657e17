package experiment

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvroute/kvroute/internal/loadgen"
	"github.com/kvroute/kvroute/internal/report"
	"github.com/kvroute/kvroute/internal/workload"
)

// BenchOptions are the flags of kvroute bench.
type BenchOptions struct {
	// Target is the base URL of the server; Model the model to ask for; APIKey its bearer
	// token; API chat or completions.
	Target, Model, APIKey, API string
	// Trace (Mooncake JSONL) or Workload (a generator spec; default shared-prefix): at most one.
	Trace, Workload string
	// Pacing, at most one: Speedup divides the arrival times; Rate re-times them as Arrival
	// (poisson or constant) arrivals of Rate per second; Concurrency keeps that many in flight.
	Speedup, Rate float64
	Arrival       string
	Concurrency   int
	// Requests sends at most this many (0: all); Duration stops sending after this long (0: no
	// bound); MaxInFlight bounds an open loop; Timeout bounds each request.
	Requests, MaxInFlight int
	Duration, Timeout     time.Duration
	Seed                  uint64
	// IgnoreEOS sends vLLM's ignore_eos; NoUsage sends no stream_options.include_usage;
	// EndpointHeader names the response header that names the backend; Label names the run in
	// the table.
	IgnoreEOS, NoUsage    bool
	EndpointHeader, Label string
	// NonStreamed is the fraction of requests (drawn from Seed) sent with "stream": false
	// (workload.Whole): their TTFT is their whole time.
	NonStreamed float64
	// Progress is how progress is shown on Log (standard error), every ProgressEvery.
	Progress      loadgen.ProgressMode
	ProgressEvery time.Duration
	Log           io.Writer

	// run sends the items: loadgen.Run when nil; a test's stand-in decides which requests
	// finish, and in what order.
	run func(context.Context, loadgen.Config, []loadgen.Item) (loadgen.Result, error)
}

// BenchExtra is what a live run measures beyond report.Result: the generator's own schedule
// keeping, inter-token latency and errors by class.
type BenchExtra struct {
	// RequestedRate is --rate, the arrivals per second asked for (0: not paced by a rate).
	RequestedRate float64 `json:"requested_rate_per_s,omitempty"`
	// AskedRate is the rate of the schedule the generator kept: requests after the first over
	// the span of their arrivals, 0 under --concurrency. A Poisson draw of few requests is far
	// from RequestedRate (5 at 50/s came to 120/s); the text report calls it "scheduled".
	AskedRate    float64        `json:"asked_rate_per_s,omitempty"`
	AchievedRate float64        `json:"achieved_send_rate_per_s"`
	SendLagMS    report.Latency `json:"send_lag_ms"`
	ITLMS        report.Latency `json:"itl_ms"`
	Errors       map[string]int `json:"errors"`
	// FirstErrors is, per class of Errors, the first failed request's reason: the message of
	// the target's error object (an unknown model, a bad key) or what went wrong.
	FirstErrors map[string]string `json:"first_errors,omitempty"`
	// CachedTokensReported is false when the target reported no cached_tokens (hit rate 0 then
	// means "unknown", not "no hits").
	CachedTokensReported bool    `json:"cached_tokens_reported"`
	ElapsedSeconds       float64 `json:"elapsed_seconds"`
}

// BenchReport is what a live run prints with --json: the summary of kvroute simulate --json
// plus the live-only figures, one entry per run.
type BenchReport struct {
	*report.Summary
	Bench []BenchExtra `json:"bench"`
	// Stopped is set when the run ended before its workload: interrupted, or every request
	// refused (refusal).
	Stopped *BenchStopped `json:"stopped,omitempty"`
	// records are every run's requests, for the HTML report.
	records [][]report.Record
}

// Bench checks the options, builds the workload and runs it against the target.
func Bench(ctx context.Context, o BenchOptions) (*BenchReport, error) {
	var errs []error
	if o.Target == "" {
		errs = append(errs, errors.New("--target: give the server's base URL, e.g. --target http://127.0.0.1:8000"))
	}
	if o.Trace != "" && o.Workload != "" {
		errs = append(errs, errors.New("give --trace FILE or --workload NAME, not both"))
	}
	paced := 0
	for _, set := range []bool{o.Speedup != 0, o.Rate != 0, o.Concurrency != 0} {
		if set {
			paced++
		}
	}
	if paced > 1 {
		errs = append(errs, errors.New("give at most one of --speedup, --rate and --concurrency"))
	}
	if o.Speedup < 0 || o.Rate < 0 || o.Concurrency < 0 || o.Requests < 0 || o.Duration < 0 || o.MaxInFlight < 1 || o.Timeout <= 0 {
		errs = append(errs, errors.New("--speedup, --rate, --concurrency, --requests and --duration must not be negative; --max-in-flight and --timeout must be positive"))
	}
	if o.Arrival != "poisson" && o.Arrival != "constant" {
		errs = append(errs, fmt.Errorf("--arrival %q: want poisson or constant", o.Arrival))
	}
	if err := CheckNonStreamed(o.NonStreamed); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return nil, &UsageError{errors.Join(errs...)}
	}
	reqs, name, err := loadWorkload(o.Trace, o.Workload, o.Seed)
	if err != nil {
		return nil, err
	}
	switch {
	case o.Rate > 0 && o.Arrival == "constant":
		reqs = constantRate(reqs, o.Rate)
	case o.Rate > 0:
		reqs = workload.Poisson(reqs, o.Rate, o.Seed)
	case o.Speedup > 0:
		reqs = workload.Speedup(reqs, o.Speedup)
	}
	if o.Requests > 0 && o.Requests < len(reqs) {
		reqs = reqs[:o.Requests]
	}
	slices.SortStableFunc(reqs, func(a, b workload.Request) int { return int(a.Arrival - b.Arrival) })
	if o.NonStreamed > 0 {
		reqs = workload.Whole(reqs, o.NonStreamed, o.Seed)
	}

	items := workloadItems(reqs)
	total := len(items)
	if o.Duration > 0 && o.Concurrency == 0 {
		total = 0
		for i := range items {
			if items[i].At < o.Duration {
				total++
			}
		}
	}
	prog := loadgen.NewProgress(o.Log, o.Progress, "bench", total, o.ProgressEvery, nil)
	// The run stops early on Ctrl-C (ctx) or when its first requests show that none will
	// succeed (refusal): a closed port or a wrong key failed every request of a default run,
	// one a tenth of a second, for over a minute.
	runCtx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	refused := refusal{stop: stop}
	cfg := loadgen.Config{
		Target: o.Target, Model: o.Model, APIKey: o.APIKey, API: o.API,
		Concurrency: o.Concurrency, MaxInFlight: o.MaxInFlight, Duration: o.Duration, RequestTimeout: o.Timeout,
		IgnoreEOS: o.IgnoreEOS, NoUsage: o.NoUsage, EndpointHeader: o.EndpointHeader,
		OnRecord: func(r loadgen.Record) {
			prog.Record(r) // counts a request cancelled in flight apart from the errors
			refused.observe(r)
		},
	}
	prog.SetPacing(loadgen.PacingOf(cfg, items))
	run := o.run
	if run == nil {
		run = loadgen.Run
	}
	res, err := run(runCtx, cfg, items)
	prog.Finish()
	var stopped *BenchStopped
	if err != nil {
		if runCtx.Err() == nil {
			return nil, err
		}
		// Interrupted or refused: the report covers the requests that finished; those
		// cancelled in flight measured nothing and are left out.
		stopped = &BenchStopped{Planned: total, Sent: len(res.Records), Interrupted: ctx.Err() != nil}
		res.Records = slices.DeleteFunc(res.Records, func(r loadgen.Record) bool {
			if r.Class == loadgen.ClassCanceled {
				stopped.Canceled++
				return true
			}
			return false
		})
		switch {
		case stopped.Interrupted:
		case stopped.Sent-stopped.Canceled >= total:
			// The last request was the one that told: nothing was left to spare.
			stopped = nil
		default:
			stopped.Refused, stopped.RefusedAfter = refused.label, refusalAfter
		}
	}

	recs, endpoints := reportRecords(o.Label, res.Records, 1)
	r := report.Summarize(o.Label, recs, nil)
	if endpoints == 0 {
		// No answer named its backend (--endpoint-header): one target, whose spread over its
		// backends is unknown, not even.
		r.LoadImbalance = 0
	}
	r.WallSeconds = res.Elapsed.Seconds()
	extra := benchStats(&res, 1)
	// The requests the report covers: those sent and not cancelled in flight. They are not
	// always the first ones: a long request cancelled at an interrupt left later ones
	// finished. Records are in workload order.
	doneItems, doneReqs := make([]loadgen.Item, len(res.Records)), make([]workload.Request, len(res.Records))
	for i := range res.Records {
		k := res.Records[i].Index
		doneItems[i], doneReqs[i] = items[k], reqs[k]
	}
	if o.Concurrency == 0 {
		// The schedule's own rate: a Poisson draw of a few thousand arrivals differs from
		// --rate by a few per cent, which is not the generator's doing.
		extra.AskedRate = scheduledRate(doneItems)
		extra.RequestedRate = o.Rate
	}
	speedup := o.Speedup
	if speedup == 0 {
		speedup = 1
	}
	sum := &report.Summary{
		Scenario: report.Scenario{Workload: name, Requests: len(res.Records), Instances: max(1, endpoints), Profile: o.Target, Speedup: speedup, Seed: int64(o.Seed),
			NonStreamed: o.NonStreamed, Pacing: benchPacing(o)},
		// The target's KV capacity is unknown here, and so is the pooled LRU bound.
		Bounds:  report.Bounds{InfiniteCacheHitRate: workload.InfiniteCacheHitRate(doneReqs, 16), PooledLRUUnknown: true},
		Results: []report.Result{r},
	}
	return &BenchReport{Summary: sum, Bench: []BenchExtra{extra}, Stopped: stopped, records: [][]report.Record{recs}}, nil
}

// benchPacing says what set a run's arrivals when a speed-up did not: --rate replaces the
// workload's times and --concurrency ignores them. "" for a speed-up (or none).
func benchPacing(o BenchOptions) string {
	switch {
	case o.Concurrency > 0:
		return fmt.Sprintf("closed loop, %d in flight", o.Concurrency)
	case o.Rate > 0 && o.Arrival == "constant":
		return fmt.Sprintf("rate %g req/s, evenly spaced", o.Rate)
	case o.Rate > 0:
		return fmt.Sprintf("rate %g req/s, Poisson arrivals", o.Rate)
	}
	return ""
}

// BenchStopped says why and where a run ended before its workload did.
type BenchStopped struct {
	// Interrupted: the run was cancelled (Ctrl-C, SIGTERM).
	Interrupted bool `json:"interrupted"`
	// Refused is the error class ("connection", "http_401") of the first requests, every one
	// of which failed so that none would succeed (refusal), when that stopped the run.
	Refused string `json:"refused,omitempty"`
	// RefusedAfter is the number of those first requests.
	RefusedAfter int `json:"refused_after,omitempty"`
	// Planned is the number of requests the run was to send, Sent the number it sent, and
	// Canceled those of them in flight when it stopped: left out of every figure.
	Planned  int `json:"planned"`
	Sent     int `json:"sent"`
	Canceled int `json:"canceled"`
}

// refusalAfter is how many requests, all failed for one reason that retrying does not cure,
// stop a run before any succeeded.
const refusalAfter = 10

// refusal watches a run's first requests: when the first refusalAfter of them finish and
// every one failed with one class that the target will give every request alike (nothing
// listens, an API key or a model it refuses, a path it has not), it stops the run. A 429 or
// a 503 does not count: a target shedding load is what a run measures.
type refusal struct {
	stop  context.CancelCauseFunc
	mu    sync.Mutex
	seen  int
	label string // the class of the first failures; "" once one differs
	done  bool
}

// errRefused is the cause of a run stopped by refusal.
var errRefused = errors.New("every request refused")

func (f *refusal) observe(r loadgen.Record) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.done || r.Class == loadgen.ClassCanceled {
		return
	}
	label := r.ErrorLabel()
	if !refusedForGood(r) || f.seen > 0 && label != f.label {
		f.done, f.label = true, ""
		return
	}
	f.label = label
	f.seen++
	if f.seen == refusalAfter {
		f.done = true
		f.stop(errRefused)
	}
}

// refusedForGood reports whether r failed in a way the target repeats for every request: no
// server listening (or no such host), or an HTTP 401, 403 or 404.
func refusedForGood(r loadgen.Record) bool {
	switch r.Class {
	case loadgen.ClassConnection:
		return strings.Contains(r.Err, "connection refused") || strings.Contains(r.Err, "no such host")
	case loadgen.ClassHTTP:
		return r.Status == 401 || r.Status == 403 || r.Status == 404
	}
	return false
}

// constantRate returns a copy of reqs, in order, arriving every 1/rate seconds.
func constantRate(reqs []workload.Request, rate float64) []workload.Request {
	out := slices.Clone(reqs)
	for i := range out {
		out[i].Arrival = time.Duration(float64(i) / rate * float64(time.Second))
	}
	return out
}

// workloadItems turns workload requests into load-generator items whose prompt text is
// rendered when sent, so that equal blocks are equal text.
func workloadItems(reqs []workload.Request) []loadgen.Item {
	items := make([]loadgen.Item, len(reqs))
	for i := range reqs {
		r := &reqs[i]
		items[i] = loadgen.Item{
			At: r.Arrival, Session: r.Session, PromptTokens: r.PromptTokens, MaxTokens: max(1, r.OutputTokens),
			Prompt: func() string { return workload.Render(r) }, Whole: r.Whole,
		}
	}
	return items
}

// reportRecords converts live records to report records, dividing every time by scale (the
// simulator's time scale, to give model time; 1 for a real target). Endpoints are numbered in
// order of first appearance of the endpoint header; it returns their number (0 when unknown:
// every record then counts as endpoint 0).
func reportRecords(label string, recs []loadgen.Record, scale float64) ([]report.Record, int) {
	ids := map[string]int{}
	out := make([]report.Record, len(recs))
	for i := range recs {
		lr := &recs[i]
		at := scaleDur(lr.Sent, scale)
		r := report.Record{
			ID: strconv.Itoa(lr.Index), Policy: label, Arrival: at,
			Finish:       at + scaleDur(lr.E2E, scale),
			PromptTokens: lr.PromptTokens, CachedTokens: max(lr.CachedTokens, 0), CachedUnknown: lr.CachedTokens < 0,
			OutputTokens: lr.OutputTokens, Err: lr.ErrorLabel(),
		}
		if lr.TTFT > 0 {
			r.FirstToken = at + scaleDur(lr.TTFT, scale)
		}
		if lr.Endpoint != "" {
			id, ok := ids[lr.Endpoint]
			if !ok {
				id = len(ids)
				ids[lr.Endpoint] = id
			}
			r.EndpointID, r.Endpoint = id, lr.Endpoint
		}
		out[i] = r
	}
	return out, len(ids)
}

func scaleDur(d time.Duration, scale float64) time.Duration {
	if scale == 1 || scale <= 0 {
		return d
	}
	return time.Duration(float64(d) / scale)
}

// benchStats computes the generator's own figures; ITLs are divided by scale like reportRecords.
func benchStats(res *loadgen.Result, scale float64) BenchExtra {
	e := BenchExtra{AchievedRate: res.SendRate(), Errors: map[string]int{}, FirstErrors: res.FirstErrors(), ElapsedSeconds: res.Elapsed.Seconds()}
	var lag, itl []float64
	for i := range res.Records {
		r := &res.Records[i]
		lag = append(lag, float64(r.Sent-r.Scheduled)/float64(time.Millisecond))
		for _, d := range r.ITL {
			itl = append(itl, float64(scaleDur(d, scale))/float64(time.Millisecond))
		}
		if !r.OK() {
			e.Errors[r.ErrorLabel()]++
		}
		if r.CachedTokens >= 0 {
			e.CachedTokensReported = true
		}
	}
	e.SendLagMS = report.Summarise(lag)
	e.ITLMS = report.Summarise(itl)
	return e
}

// scheduledRate is the rate the schedule asks for: requests after the first over the span.
func scheduledRate(items []loadgen.Item) float64 {
	if len(items) < 2 {
		return 0
	}
	span := items[len(items)-1].At - items[0].At
	if span <= 0 {
		return 0
	}
	return float64(len(items)-1) / span.Seconds()
}

// WriteTable prints the summary table and, per run, the live-only figures.
func (b *BenchReport) WriteTable(w io.Writer) error {
	if err := report.WriteTable(w, b.Summary); err != nil {
		return err
	}
	if _, err := fmt.Fprintln(w); err != nil {
		return fmt.Errorf("write table: %w", err)
	}
	return b.writeExtras(w)
}

// WriteHTML writes the HTML report of a bench against target to path, the live-only figures
// as its notes.
func (b *BenchReport) WriteHTML(path, target string) error {
	var notes strings.Builder
	_ = b.writeExtras(&notes)
	opt := report.HTMLOptions{Title: "kvroute bench: " + target, Generated: time.Now(), Notes: strings.Split(strings.TrimSpace(notes.String()), "\n")}
	return writeHTML(path, b.Summary, b.records, opt)
}

// rateNote is what follows the send rate in writeExtras: the rate asked (--rate), and the
// schedule's own where it differs, with how far the sending was from the schedule (which is
// the generator's doing; the schedule's distance from the rate asked is the draw's).
func rateNote(e BenchExtra, requests int) string {
	off := func(sched float64) string { return "sent " + offSchedule(e.AchievedRate, sched) }
	switch req, sched := e.RequestedRate, e.AskedRate; {
	case req > 0 && sched > 0 && math.Abs(sched/req-1) > 0.005:
		note := fmt.Sprintf(" (asked %.1f, scheduled %.1f, %s", req, sched, off(sched))
		if math.Abs(sched/req-1) > 0.05 {
			note += fmt.Sprintf(": the random arrivals of %d requests come to a rate far from the one asked; more requests come closer", requests)
		}
		return note + ")"
	case req > 0 && sched > 0:
		return fmt.Sprintf(" (asked %.1f, %s)", req, off(sched))
	case req > 0:
		return fmt.Sprintf(" (asked %.1f)", req)
	case sched > 0:
		return fmt.Sprintf(" (scheduled %.1f, %s)", sched, off(sched))
	}
	return ""
}

// offSchedule says how far the rate sent is from the schedule's, in words: "0.03% below the
// schedule", "1.20% above the schedule", or "on the schedule" within 0.005 %.
func offSchedule(sent, sched float64) string {
	d := 100 * (sent/sched - 1)
	switch {
	case math.Abs(d) < 0.005:
		return "on the schedule"
	case d < 0:
		return fmt.Sprintf("%.2f%% below the schedule", -d)
	}
	return fmt.Sprintf("%.2f%% above the schedule", d)
}

// writeExtras prints one line per run: send rate, send lag, ITL, errors by class.
func (b *BenchReport) writeExtras(w io.Writer) error {
	for i, e := range b.Bench {
		label := b.Results[i].Policy
		var sb strings.Builder
		fmt.Fprintf(&sb, "%s: sent %.1f req/s", label, e.AchievedRate)
		sb.WriteString(rateNote(e, b.Scenario.Requests))
		fmt.Fprintf(&sb, "; send lag ms p50 %.2f p99 %.2f", e.SendLagMS.P50, e.SendLagMS.P99)
		if b.Results[i].Completed > 0 {
			fmt.Fprintf(&sb, "; ITL ms p50 %.1f p90 %.1f p99 %.1f", e.ITLMS.P50, e.ITLMS.P90, e.ITLMS.P99)
		} else {
			sb.WriteString("; ITL ms - (no request completed)")
		}
		if !e.CachedTokensReported {
			sb.WriteString("; the target reported no cached_tokens (hit rate unknown)")
		}
		if len(e.Errors) > 0 {
			keys := make([]string, 0, len(e.Errors))
			for k := range e.Errors {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			sb.WriteString("; errors:")
			for _, k := range keys {
				fmt.Fprintf(&sb, " %s %d", k, e.Errors[k])
				if msg := e.FirstErrors[k]; msg != "" {
					fmt.Fprintf(&sb, " (first: %q)", msg)
				}
			}
		}
		if _, err := fmt.Fprintln(w, sb.String()); err != nil {
			return fmt.Errorf("write table: %w", err)
		}
	}
	return nil
}
