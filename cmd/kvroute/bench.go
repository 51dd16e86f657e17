package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/experiment"
	"github.com/kvroute/kvroute/internal/simserver"
)

func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return benchMain(ctx, args, os.Stdin, stdout, stderr)
}

// maxInFlight bounds --concurrency and --max-in-flight: more requests at once than one client
// address has ports for (about 28,000 by default on Linux), and a closed loop starts a worker
// per slot before it sends anything (10^11 of them spun for minutes, deaf to Ctrl-C).
const maxInFlight = 100_000

// benchMain is runBench with its standard input given (--trace -), for tests.
func benchMain(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := newFlagSet("kvroute bench")
	var o experiment.BenchOptions
	var html string
	var asJSON, quiet bool
	fs.StringVar(&o.Target, "target", "", "base URL of an OpenAI-compatible server or router (required)")
	fs.StringVar(&o.Model, "model", simserver.DefaultModel, "model name to ask for")
	fs.StringVar(&o.APIKey, "api-key", "", "API key sent as a bearer token (default $OPENAI_API_KEY)")
	fs.StringVar(&o.API, "api", "chat", "chat (/v1/chat/completions) or completions (/v1/completions)")
	fs.StringVar(&o.Trace, "trace", "", "Mooncake JSONL trace `FILE` to replay, rendered into text"+stdinTraceHelp)
	fs.StringVar(&o.Workload, "workload", "", "synthetic workload NAME[:key=value,...] (default shared-prefix when no --trace)")
	fs.Float64Var(&o.Speedup, "speedup", 0, "replay arrivals this many times faster than the workload's time (default 1)")
	fs.Float64Var(&o.Rate, "rate", 0, "re-time arrivals at this many requests/s: a Poisson process, or evenly spaced with --arrival constant")
	fs.StringVar(&o.Arrival, "arrival", "poisson", "with --rate: poisson or constant (evenly spaced) arrivals")
	fs.IntVar(&o.Concurrency, "concurrency", 0, "closed loop: keep this many requests in flight, ignoring arrival times")
	fs.IntVar(&o.Requests, "requests", 0, "send at most the first `N` requests (0: the whole workload)")
	fs.DurationVar(&o.Duration, "duration", 0, "stop sending new requests after this long (0: no bound)")
	fs.IntVar(&o.MaxInFlight, "max-in-flight", 4096, "open loop: at most this many requests in flight (late sends show as send lag)")
	fs.DurationVar(&o.Timeout, "timeout", 10*time.Minute, "per-request timeout")
	fs.Uint64Var(&o.Seed, "seed", 1, "seed of synthetic workloads and Poisson arrivals")
	fs.BoolVar(&o.IgnoreEOS, "ignore-eos", false, "send vLLM's ignore_eos so output lengths follow the workload")
	fs.BoolVar(&o.NoUsage, "no-usage", false, "send no stream_options.include_usage (output tokens are then counted as content chunks)")
	fs.Float64Var(&o.NonStreamed, "non-streamed", 0, "the fraction of requests sent with \"stream\": false, from 0 to 1 (their TTFT is then their whole time)")
	fs.StringVar(&o.EndpointHeader, "endpoint-header", config.SuggestedEndpointHeader, "response header naming the backend that served, for the per-endpoint share (kvroute serve sends it with server.endpoint_header)")
	fs.StringVar(&o.Label, "label", "bench", "name of this run in the table")
	fs.BoolVar(&asJSON, "json", false, "print the summary as JSON (results as in kvroute simulate --json)")
	fs.StringVar(&html, "html", "", "write a self-contained HTML report with charts to this file")
	fs.BoolVar(&quiet, "quiet", false, "no progress output")
	fs.DurationVar(&o.ProgressEvery, "progress-interval", 5*time.Second, "when stderr is not a terminal, print a progress line this often")
	if _, code, exit := parseOrExit(fs, args, verbHelp{
		usage: []string{
			"usage: kvroute bench --target URL [--trace FILE | --workload NAME[:k=v,...]] [--speedup K | --rate R | --concurrency N] [flags]",
			"       (FILE \"-\" reads standard input)",
			"\nSends a workload to any OpenAI-compatible endpoint, streaming, and measures TTFT, ITL, end-to-end latency, cached tokens and errors.",
		},
		more: columnsHelp(workloadHelp, summaryColumns, benchColumns),
		floats: map[string]string{
			"speedup":      speedupRange,
			"rate":         rateRange,
			"non-streamed": nonStreamedRange,
		},
	}, stdout, stderr); exit {
		return code
	}
	if err := checkBench(o, fs); err != nil {
		return failed(stderr, fs.Name(), err)
	}
	if err := checkOutputs(map[string]string{"html": html}); err != nil {
		return failed(stderr, fs.Name(), err)
	}
	spool, err := spoolIfStdin(&o.Trace, stdin, fs.Name())
	if err != nil {
		return failed(stderr, fs.Name(), err)
	}
	defer spool.remove()
	if o.APIKey == "" {
		o.APIKey = os.Getenv("OPENAI_API_KEY")
	}
	o.Progress, o.Log = progressMode(stderr, quiet), stderr
	rep, err := experiment.Bench(ctx, o)
	if err != nil {
		return failed(stderr, fs.Name(), spool.explain(err))
	}
	stop := rep.Stopped
	if stop != nil && stop.Interrupted && rep.Scenario.Requests == 0 {
		fmt.Fprintf(stderr, "kvroute bench: interrupted before any request finished (%d sent, cancelled in flight)\n", stop.Sent)
		return interruptedStatus(ctx)
	}
	if asJSON {
		err = writeJSON(stdout, rep)
	} else {
		err = rep.WriteTable(stdout)
	}
	if err != nil {
		return failed(stderr, fs.Name(), err)
	}
	if html != "" {
		if err := rep.WriteHTML(html, o.Target); err != nil {
			return failed(stderr, fs.Name(), err)
		}
		fmt.Fprintf(stderr, "kvroute bench: report written to %s\n", html)
	}
	if stop != nil && stop.Interrupted {
		fmt.Fprintf(stderr, "kvroute bench: interrupted after sending %d of %d requests: the report covers the %d that finished (%d cancelled in flight)\n",
			stop.Sent, stop.Planned, stop.Sent-stop.Canceled, stop.Canceled)
		return interruptedStatus(ctx)
	}
	// A run in which nothing succeeded (a wrong URL, model or key) is a failure for scripts too;
	// the report above says why.
	if r := rep.Results; len(r) > 0 && r[0].Completed == 0 && r[0].Failed > 0 {
		what := fmt.Sprintf("none of %d requests succeeded", r[0].Failed)
		if stop != nil && stop.Refused != "" {
			what = fmt.Sprintf("stopped early, %d of %d requests sent: the first %d all failed (%s)", stop.Sent, stop.Planned, stop.RefusedAfter, stop.Refused)
		}
		fmt.Fprintf(stderr, "kvroute bench: %s: %s\n", what, failureFix(rep, o))
		return 1
	}
	return 0
}

// failureFix is what to do about a run in which nothing succeeded, from its most frequent
// error class: the target's own message is in the report above.
func failureFix(rep *experiment.BenchReport, o experiment.BenchOptions) string {
	var class string
	if len(rep.Bench) > 0 {
		for k, n := range rep.Bench[0].Errors {
			if class == "" || n > rep.Bench[0].Errors[class] || n == rep.Bench[0].Errors[class] && k < class {
				class = k
			}
		}
	}
	switch class {
	case "connection":
		return fmt.Sprintf("is a server listening at --target %s? (start it, or fix the URL)", o.Target)
	case "http_401", "http_403":
		return "the target refused the API key: give the right one with --api-key or $OPENAI_API_KEY"
	case "http_404":
		return fmt.Sprintf("the target has no such model or path: check --model %q (GET /v1/models lists the models) and --target's path", o.Model)
	case "http_429":
		return "the target refused them for load or quota: lower --rate or --concurrency, or raise the target's limits"
	case "timeout":
		return fmt.Sprintf("no answer within --timeout %v: raise it, or lower the load", o.Timeout)
	}
	return "see the errors in the report above"
}

// interruptedStatus is the exit status of a verb that ctx's signal stopped: 143 for SIGTERM,
// else 130, as a shell gives a process that the signal killed.
func interruptedStatus(ctx context.Context) int {
	if c := context.Cause(ctx); c != nil && strings.Contains(c.Error(), "terminated") {
		return 143
	}
	return 130
}

// rateRange is what --rate takes.
const rateRange = "requests/s above 0, such as 10 (leave it out to keep the workload's arrival times)"

// checkBench refuses, before the run starts, what the load generator would refuse only once it
// is under way (the target, API and model), and a number out of range, naming the flag of
// each; all of them at once, as a usage error. experiment.Bench checks the rest.
func checkBench(o experiment.BenchOptions, fs *flag.FlagSet) error {
	var errs []error
	// 0 is the default, which means 1 (--speedup) or the workload's own arrival times (--rate):
	// given on the command line it is a mistake.
	fs.Visit(func(f *flag.Flag) {
		switch {
		case f.Name == "speedup" && !(o.Speedup > 0):
			errs = append(errs, fmt.Errorf("--speedup %g: want %s", o.Speedup, speedupRange))
		case f.Name == "rate" && !(o.Rate > 0):
			errs = append(errs, fmt.Errorf("--rate %g: want %s", o.Rate, rateRange))
		}
	})
	if u, err := url.Parse(o.Target); o.Target == "" {
		errs = append(errs, errors.New("--target: give the server's base URL, e.g. --target http://127.0.0.1:8000"))
	} else if err != nil || u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		errs = append(errs, fmt.Errorf("--target %q: want an http(s) URL with a host, e.g. http://127.0.0.1:8000", o.Target))
	}
	if o.API != "chat" && o.API != "completions" {
		errs = append(errs, fmt.Errorf("--api %q: want chat or completions", o.API))
	}
	if strings.TrimSpace(o.Model) == "" {
		errs = append(errs, errors.New("--model: empty: give the model name the server serves"))
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"concurrency", o.Concurrency}, {"requests", o.Requests}} {
		if f.v < 0 {
			errs = append(errs, fmt.Errorf("--%s %d: must not be negative", f.name, f.v))
		}
	}
	if o.Duration < 0 {
		errs = append(errs, fmt.Errorf("--duration %v: must not be negative", o.Duration))
	}
	if o.Concurrency > maxInFlight {
		errs = append(errs, fmt.Errorf("--concurrency %d: want 0 (open loop) to %d (already more connections than one client address has ports for)", o.Concurrency, maxInFlight))
	}
	if o.MaxInFlight < 1 || o.MaxInFlight > maxInFlight {
		errs = append(errs, fmt.Errorf("--max-in-flight %d: want 1 to %d (already more connections than one client address has ports for)", o.MaxInFlight, maxInFlight))
	}
	if o.ProgressEvery <= 0 {
		errs = append(errs, fmt.Errorf("--progress-interval %v: want a positive interval, such as 5s (--quiet: no progress)", o.ProgressEvery))
	}
	if o.Timeout <= 0 {
		errs = append(errs, fmt.Errorf("--timeout %v: must be positive", o.Timeout))
	}
	if len(errs) > 0 {
		return usageError{errors.Join(errs...)}
	}
	return nil
}
