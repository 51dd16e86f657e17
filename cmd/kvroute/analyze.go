package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"golang.org/x/text/language"
	"golang.org/x/text/message"

	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/experiment"
	"github.com/kvroute/kvroute/internal/workload"
)

// analyzeFlags are the flags of `kvroute analyze`.
type analyzeFlags struct {
	format, profile, workload string
	trace                     string // --trace FILE, as simulate, bench and plan take it; or FILE
	instances                 int
	seed                      uint64
	json                      bool
}

// analyzeReport is what `kvroute analyze --json` prints: the workload's Stats and the setting.
type analyzeReport struct {
	Source          string  `json:"source"`
	Format          string  `json:"format"`
	Profile         string  `json:"profile"`
	KVTokens        int     `json:"kv_tokens_per_instance"`
	DurationSeconds float64 `json:"duration_s"`
	workload.Stats
}

func runAnalyze(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return analyzeMain(ctx, args, os.Stdin, stdout, stderr)
}

// analyzeMain is runAnalyze with its standard input given, for tests.
func analyzeMain(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := newFlagSet("kvroute analyze")
	var f analyzeFlags
	fs.StringVar(&f.format, "format", "mooncake", "trace format (mooncake: JSONL with timestamp, input_length, output_length, hash_ids)")
	fs.IntVar(&f.instances, "instances", 8, "instances in the fleet whose pooled KV cache bounds the hit rate")
	fs.StringVar(&f.profile, "profile", "llama3-70b-h200-tp8", "engine profile: KV capacity per instance and block size")
	fs.StringVar(&f.trace, "trace", "", "the trace `FILE`, as simulate, bench and plan take it (or give FILE alone)"+stdinTraceHelp)
	fs.StringVar(&f.workload, "workload", "", "analyze a synthetic workload NAME[:key=value,...] instead of a trace")
	fs.Uint64Var(&f.seed, "seed", 1, "seed of the synthetic workload")
	fs.BoolVar(&f.json, "json", false, "print the statistics as JSON")
	// Flags may come before or after FILE.
	files, code, exit := parseOrExit(fs, args, verbHelp{
		usage: []string{
			"usage: kvroute analyze [flags] FILE   (or --trace FILE; FILE \"-\" reads standard input)",
			"       kvroute analyze [flags] --workload NAME[:key=value,...]",
			"\nPrefix statistics of a trace: lengths, prefix reuse, the cache hit rates no router can beat,",
			"and whether prefix-aware routing is likely to pay off.",
		},
		more:       workloadHelp,
		positional: true,
	}, stdout, stderr)
	if exit {
		return code
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
	case f.workload == "" && len(files) != 1:
		errs = append(errs, fmt.Errorf("want one trace FILE (or - for standard input), got %d", len(files)))
	case f.workload != "" && len(files) > 0:
		errs = append(errs, errors.New("give a trace FILE or --workload, not both"))
	}
	if f.format != "mooncake" {
		errs = append(errs, fmt.Errorf("--format %q: unknown, want mooncake", f.format))
	}
	if err := experiment.CheckInstances("--instances", f.instances); err != nil {
		errs = append(errs, err)
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
		rep.Source = "standard input"
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
		return nil, err
	}
	rep.Stats = workload.Analyze(reqs, workload.AnalyzeOptions{
		BlockSize: prof.BlockSize, CapacityTokens: f.instances * prof.KVTokens(), Instances: f.instances, Seed: f.seed,
	})
	rep.DurationSeconds = rep.Duration.Seconds()
	return rep, nil
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
	line("requests", "%d over %.0f s (%.2f requests/s)", r.Requests, r.DurationSeconds, r.Rate)
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
	line("verdict", "%s", r.Verdict)
	_, err := io.WriteString(w, b.String())
	return err
}
