package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/term"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/loadgen"
	"github.com/kvroute/kvroute/internal/report"
	"github.com/kvroute/kvroute/internal/simserver"
	"github.com/kvroute/kvroute/internal/workload"
)

// benchFlags are the flags of `kvroute bench`.
type benchFlags struct {
	target, model, apiKey, api       string
	trace, workload                  string
	speedup, rate                    float64
	concurrency, requests, inFlight  int
	duration, timeout, progressEvery time.Duration
	seed                             uint64
	ignoreEOS, json, quiet           bool
	html, label, endpointHeader      string
	arrival                          string
}

// benchExtra is what a live run measures beyond report.Result: the generator's own schedule
// keeping, inter-token latency and errors by class.
type benchExtra struct {
	AskedRate    float64        `json:"asked_rate_per_s,omitempty"`
	AchievedRate float64        `json:"achieved_send_rate_per_s"`
	SendLagMS    report.Latency `json:"send_lag_ms"`
	ITLMS        report.Latency `json:"itl_ms"`
	Errors       map[string]int `json:"errors"`
	// CachedTokensReported is false when the target reported no cached_tokens (hit rate 0 then
	// means "unknown", not "no hits").
	CachedTokensReported bool    `json:"cached_tokens_reported"`
	ElapsedSeconds       float64 `json:"elapsed_seconds"`
}

// benchJSON is `kvroute bench --json`: the summary of `kvroute simulate --json` plus the
// live-only figures.
type benchJSON struct {
	*report.Summary
	Bench []benchExtra `json:"bench"`
}

func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("kvroute bench")
	var f benchFlags
	fs.StringVar(&f.target, "target", "", "base URL of an OpenAI-compatible server or router (required)")
	fs.StringVar(&f.model, "model", simserver.DefaultModel, "model name to ask for")
	fs.StringVar(&f.apiKey, "api-key", "", "API key sent as a bearer token (default $OPENAI_API_KEY)")
	fs.StringVar(&f.api, "api", "chat", "chat (/v1/chat/completions) or completions (/v1/completions)")
	fs.StringVar(&f.trace, "trace", "", "Mooncake JSONL trace to replay (rendered into text)")
	fs.StringVar(&f.workload, "workload", "", "synthetic workload NAME[:key=value,...] (default shared-prefix when no --trace)")
	fs.Float64Var(&f.speedup, "speedup", 0, "replay arrivals K times faster than the workload's time (default 1)")
	fs.Float64Var(&f.rate, "rate", 0, "re-time arrivals as a Poisson process of this many requests/s")
	fs.StringVar(&f.arrival, "arrival", "poisson", "with --rate: poisson or constant (evenly spaced) arrivals")
	fs.IntVar(&f.concurrency, "concurrency", 0, "closed loop: keep this many requests in flight, ignoring arrival times")
	fs.IntVar(&f.requests, "requests", 0, "send at most N requests (0: the whole workload)")
	fs.DurationVar(&f.duration, "duration", 0, "stop sending new requests after this long (0: no bound)")
	fs.IntVar(&f.inFlight, "max-in-flight", 4096, "open loop: at most this many requests in flight (late sends show as send lag)")
	fs.DurationVar(&f.timeout, "timeout", 10*time.Minute, "per-request timeout")
	fs.Uint64Var(&f.seed, "seed", 1, "seed of synthetic workloads and Poisson arrivals")
	fs.BoolVar(&f.ignoreEOS, "ignore-eos", false, "send vLLM's ignore_eos so output lengths follow the workload")
	fs.StringVar(&f.endpointHeader, "endpoint-header", config.SuggestedEndpointHeader, "response header naming the backend that served, for the per-endpoint share (kvroute serve sends it with server.endpoint_header)")
	fs.StringVar(&f.label, "label", "bench", "name of this run in the table")
	fs.BoolVar(&f.json, "json", false, "print the summary as JSON (results as in kvroute simulate --json)")
	fs.StringVar(&f.html, "html", "", "write a self-contained HTML report with charts to this file")
	fs.BoolVar(&f.quiet, "quiet", false, "no progress output")
	fs.DurationVar(&f.progressEvery, "progress-interval", 5*time.Second, "when stderr is not a terminal, print a progress line this often")
	if _, code, exit := parseOrExit(fs, args, verbHelp{
		usage: []string{
			"usage: kvroute bench --target URL [--trace FILE | --workload NAME[:k=v,...]] [--speedup K | --rate R | --concurrency N] [flags]",
			"\nSends a workload to any OpenAI-compatible endpoint, streaming, and measures TTFT, ITL, end-to-end latency, cached tokens and errors.",
		},
		more: workloadHelp,
	}, stdout, stderr); exit {
		return code
	}
	if f.apiKey == "" {
		f.apiKey = os.Getenv("OPENAI_API_KEY")
	}
	out, err := bench(ctx, &f, stderr)
	if err != nil {
		return failed(stderr, fs.Name(), err)
	}
	if f.json {
		err = writeJSON(stdout, out.json)
	} else {
		err = writeBenchTable(stdout, out.json)
	}
	if err != nil {
		return failed(stderr, fs.Name(), err)
	}
	if f.html != "" {
		var notes strings.Builder
		_ = writeBenchExtras(&notes, out.json)
		opt := report.HTMLOptions{Title: "kvroute bench: " + f.target, Generated: time.Now(), Notes: strings.Split(strings.TrimSpace(notes.String()), "\n")}
		if err := writeHTMLFile(f.html, out.json.Summary, out.records, opt); err != nil {
			return failed(stderr, fs.Name(), err)
		}
		fmt.Fprintf(stderr, "kvroute bench: report written to %s\n", f.html)
	}
	return 0
}

type benchOutput struct {
	json    benchJSON
	records [][]report.Record
}

// bench checks the flags, builds the workload and runs it against the target.
func bench(ctx context.Context, f *benchFlags, stderr io.Writer) (*benchOutput, error) {
	var errs []error
	if f.target == "" {
		errs = append(errs, errors.New("--target: give the server's base URL, e.g. --target http://127.0.0.1:8000"))
	}
	if f.trace != "" && f.workload != "" {
		errs = append(errs, errors.New("give --trace FILE or --workload NAME, not both"))
	}
	paced := 0
	for _, set := range []bool{f.speedup != 0, f.rate != 0, f.concurrency != 0} {
		if set {
			paced++
		}
	}
	if paced > 1 {
		errs = append(errs, errors.New("give at most one of --speedup, --rate and --concurrency"))
	}
	if f.speedup < 0 || f.rate < 0 || f.concurrency < 0 || f.requests < 0 || f.duration < 0 || f.inFlight < 1 || f.timeout <= 0 {
		errs = append(errs, errors.New("--speedup, --rate, --concurrency, --requests and --duration must not be negative; --max-in-flight and --timeout must be positive"))
	}
	if f.arrival != "poisson" && f.arrival != "constant" {
		errs = append(errs, fmt.Errorf("--arrival %q: want poisson or constant", f.arrival))
	}
	if len(errs) > 0 {
		return nil, usageError{errors.Join(errs...)}
	}
	reqs, name, err := loadWorkload(f.trace, f.workload, f.seed)
	if err != nil {
		return nil, err
	}
	switch {
	case f.rate > 0 && f.arrival == "constant":
		reqs = constantRate(reqs, f.rate)
	case f.rate > 0:
		reqs = workload.Poisson(reqs, f.rate, f.seed)
	case f.speedup > 0:
		reqs = workload.Speedup(reqs, f.speedup)
	}
	if f.requests > 0 && f.requests < len(reqs) {
		reqs = reqs[:f.requests]
	}
	slices.SortStableFunc(reqs, func(a, b workload.Request) int { return int(a.Arrival - b.Arrival) })

	items := workloadItems(reqs)
	total := len(items)
	if f.duration > 0 && f.concurrency == 0 {
		total = 0
		for i := range items {
			if items[i].At < f.duration {
				total++
			}
		}
	}
	prog := loadgen.NewProgress(stderr, progressMode(stderr, f.quiet), "bench", total, f.progressEvery, nil)
	cfg := loadgen.Config{
		Target: f.target, Model: f.model, APIKey: f.apiKey, API: f.api,
		Concurrency: f.concurrency, MaxInFlight: f.inFlight, Duration: f.duration, RequestTimeout: f.timeout,
		IgnoreEOS: f.ignoreEOS, EndpointHeader: f.endpointHeader, OnRecord: prog.Record,
	}
	res, runErr := loadgen.Run(ctx, cfg, items)
	prog.Finish()
	if runErr != nil && len(res.Records) == 0 {
		return nil, runErr
	}

	recs, endpoints := reportRecords(f.label, res.Records, 1)
	r := report.Summarize(f.label, recs, nil)
	r.WallSeconds = res.Elapsed.Seconds()
	extra := benchStats(&res, 1)
	if f.concurrency == 0 {
		// The schedule's own rate: a Poisson draw of a few thousand arrivals differs from
		// --rate by a few per cent, which is not the generator's doing.
		extra.AskedRate = scheduledRate(items[:len(res.Records)])
	}
	speedup := f.speedup
	if speedup == 0 {
		speedup = 1
	}
	sum := &report.Summary{
		Scenario: report.Scenario{Workload: name, Requests: len(res.Records), Instances: max(1, endpoints), Profile: f.target, Speedup: speedup, Seed: int64(f.seed)},
		// The target's KV capacity is unknown here, and so is the pooled LRU bound.
		Bounds:  report.Bounds{InfiniteCacheHitRate: workload.InfiniteCacheHitRate(reqs[:len(res.Records)], 16), PooledLRUUnknown: true},
		Results: []report.Result{r},
	}
	out := &benchOutput{json: benchJSON{Summary: sum, Bench: []benchExtra{extra}}, records: [][]report.Record{recs}}
	if runErr != nil {
		return out, runErr
	}
	return out, nil
}

// constantRate returns a copy of reqs, in order, arriving every 1/rate seconds.
func constantRate(reqs []workload.Request, rate float64) []workload.Request {
	out := slices.Clone(reqs)
	for i := range out {
		out[i].Arrival = time.Duration(float64(i) / rate * float64(time.Second))
	}
	return out
}

// loadWorkload reads the trace or generates the named workload (shared-prefix when neither).
func loadWorkload(trace, spec string, seed uint64) ([]workload.Request, string, error) {
	if trace != "" {
		reqs, err := workload.LoadMooncake(trace)
		if err != nil {
			return nil, "", fmt.Errorf("--trace: %w", err)
		}
		if len(reqs) == 0 {
			return nil, "", usageErr("--trace %s: no requests", trace)
		}
		return reqs, filepath.Base(trace), nil
	}
	if spec == "" {
		spec = "shared-prefix"
	}
	reqs, err := workload.Generate(spec, seed)
	if err != nil {
		return nil, "", usageError{fmt.Errorf("--workload: %w", err)}
	}
	if len(reqs) == 0 {
		return nil, "", usageErr("--workload %s: no requests", spec)
	}
	return reqs, spec, nil
}

// workloadItems turns workload requests into load-generator items whose prompt text is
// rendered when sent, so that equal blocks are equal text.
func workloadItems(reqs []workload.Request) []loadgen.Item {
	items := make([]loadgen.Item, len(reqs))
	for i := range reqs {
		r := &reqs[i]
		items[i] = loadgen.Item{
			At: r.Arrival, Session: r.Session, PromptTokens: r.PromptTokens, MaxTokens: max(1, r.OutputTokens),
			Prompt: func() string { return workload.Render(r) },
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
func benchStats(res *loadgen.Result, scale float64) benchExtra {
	e := benchExtra{AchievedRate: res.SendRate(), Errors: map[string]int{}, ElapsedSeconds: res.Elapsed.Seconds()}
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

// progressMode draws a bar on a terminal, plain lines elsewhere, nothing when quiet.
func progressMode(w io.Writer, quiet bool) loadgen.ProgressMode {
	if quiet {
		return loadgen.ProgressNone
	}
	if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		return loadgen.ProgressBar
	}
	return loadgen.ProgressLines
}

// writeBenchTable prints the summary table and, per run, the live-only figures.
func writeBenchTable(w io.Writer, b benchJSON) error {
	if err := report.WriteTable(w, b.Summary); err != nil {
		return err
	}
	if _, err := fmt.Fprintln(w); err != nil {
		return fmt.Errorf("write table: %w", err)
	}
	return writeBenchExtras(w, b)
}

// writeBenchExtras prints one line per run: send rate, send lag, ITL, errors by class.
func writeBenchExtras(w io.Writer, b benchJSON) error {
	for i, e := range b.Bench {
		label := b.Results[i].Policy
		var sb strings.Builder
		fmt.Fprintf(&sb, "%s: sent %.1f req/s", label, e.AchievedRate)
		if e.AskedRate > 0 {
			fmt.Fprintf(&sb, " (asked %.1f, %+.2f%%)", e.AskedRate, 100*(e.AchievedRate/e.AskedRate-1))
		}
		fmt.Fprintf(&sb, "; send lag ms p50 %.2f p99 %.2f; ITL ms p50 %.1f p90 %.1f p99 %.1f",
			e.SendLagMS.P50, e.SendLagMS.P99, e.ITLMS.P50, e.ITLMS.P90, e.ITLMS.P99)
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
			}
		}
		if _, err := fmt.Fprintln(w, sb.String()); err != nil {
			return fmt.Errorf("write table: %w", err)
		}
	}
	return nil
}

// writeHTMLFile writes the HTML report to path.
func writeHTMLFile(path string, s *report.Summary, recs [][]report.Record, opt report.HTMLOptions) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("--html: %w", err)
	}
	if err := report.WriteHTML(f, s, recs, opt); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("--html: %w", err)
	}
	return nil
}
