package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/term"

	"github.com/kvroute/kvroute/internal/workload"
)

// A --trace of "-" reads the trace from standard input, in every verb that takes --trace.
// analyze reads it there directly; the others hand their trace to package experiment, which
// opens it by path, so they read standard input once, check it, and keep it in a temporary
// file that experiment opens instead (spoolTrace).

// stdinTrace is the --trace value that means standard input.
const stdinTrace = "-"

// stdinTraceName is what reports call a trace read from standard input, where they would give
// a file's base name: the temporary file is called that.
const stdinTraceName = "stdin"

// stdinTraceHelp ends the help of every --trace flag.
const stdinTraceHelp = `; "-" reads it from standard input; gzip is read as such; other formats: kvroute trace convert`

// checkStdin refuses a terminal as the trace's input: nobody types a trace, and the verb
// would seem to hang until Ctrl-D.
func checkStdin(stdin io.Reader, verb string) error {
	if f, ok := stdin.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		return usageErr("--trace -: standard input is a terminal: pipe the trace in (%s --trace - < trace.jsonl) or give its path", verb)
	}
	return nil
}

// spooledTrace is a trace read from standard input and kept in a temporary file.
type spooledTrace struct {
	dir, path string
}

// spoolTrace reads the Mooncake trace on stdin to its end and keeps it in a temporary file,
// whose path the verb gives experiment as its trace; remove deletes it. The file holds the
// bytes as they came (a gzipped trace stays gzipped: the reader tells it by its first bytes
// wherever it reads). The trace is checked as it is copied, so that a bad line or a trace without a request is reported as standard
// input's (experiment would name the temporary file). A large trace costs its size on disk, not
// in memory: only the check's requests are held, and dropped at once.
func spoolTrace(stdin io.Reader, verb string) (*spooledTrace, error) {
	if err := checkStdin(stdin, verb); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "kvroute-trace-")
	if err != nil {
		return nil, fmt.Errorf("--trace -: keep standard input in a temporary file: %w", err)
	}
	s := &spooledTrace{dir: dir, path: filepath.Join(dir, stdinTraceName)}
	fh, err := os.Create(s.path)
	if err == nil {
		_, err = workload.ReadMooncake(io.TeeReader(stdin, fh))
		if cerr := fh.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("keep it in a temporary file: %w", cerr)
		}
	}
	if err != nil {
		s.remove()
		return nil, fmt.Errorf("standard input: %w", err)
	}
	return s, nil
}

// spoolIfStdin spools the trace (spoolTrace) when *trace is "-", and points *trace at the
// temporary file; nil otherwise. The caller removes it.
func spoolIfStdin(trace *string, stdin io.Reader, verb string) (*spooledTrace, error) {
	if *trace != stdinTrace {
		return nil, nil
	}
	s, err := spoolTrace(stdin, verb)
	if err != nil {
		return nil, err
	}
	*trace = s.path
	return s, nil
}

// remove deletes the temporary file; on a nil s it does nothing.
func (s *spooledTrace) remove() {
	if s != nil {
		_ = os.RemoveAll(s.dir)
	}
}

// explain has err name standard input where it names the temporary file (a bench prompt too
// long for a server, say); errors.Is and errors.As see err as it was.
func (s *spooledTrace) explain(err error) error {
	if s == nil || err == nil || !strings.Contains(err.Error(), s.path) {
		return err
	}
	return renamedError{err, strings.ReplaceAll(err.Error(), s.path, "standard input")}
}

// renamedError is an error with another message.
type renamedError struct {
	err error
	msg string
}

func (e renamedError) Error() string { return e.msg }
func (e renamedError) Unwrap() error { return e.err }

// kvroute trace convert: traces of other formats (an OpenAI gateway's log, ShareGPT, the Azure
// and BurstGPT traces, a Mooncake trace in seconds or with 64-token blocks) turned into the
// Mooncake JSON Lines that every verb above replays. The verbs themselves read Mooncake only,
// and say, when given another format, which command converts it.

func runTrace(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return traceMain(ctx, args, os.Stdin, stdout, stderr)
}

// timeUnits are the values of --time-unit.
var timeUnits = map[string]time.Duration{"s": time.Second, "ms": time.Millisecond, "us": time.Microsecond, "ns": time.Nanosecond}

// traceMain is runTrace with its standard input given, for tests.
func traceMain(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := newFlagSet("kvroute trace")
	var (
		from, unit, output string
		o                  workload.ConvertOptions
	)
	fs.StringVar(&from, "from", "auto", "the input's `format`: "+formatList()+", or auto to tell it from the first bytes")
	fs.StringVar(&unit, "time-unit", "ms", "mooncake input: the unit of its timestamps, s, ms, us or ns")
	fs.IntVar(&o.BlockTokens, "block-tokens", workload.MooncakeBlockTokens, "mooncake input: the tokens each of its hash_ids stands for (regrouped into 512-token blocks)")
	fs.Float64Var(&o.Rate, "rate", workload.DefaultConvertRate, "openai and sharegpt input (no times): requests a second, evenly spaced in the input's order")
	fs.IntVar(&o.OutputTokens, "output-tokens", workload.DefaultOutputTokens, "openai input: output_length of a request without max_tokens")
	fs.StringVar(&output, "o", "", "write the trace to `FILE` (default: standard output)")
	files, code, exit := parseOrExit(fs, args, verbHelp{
		usage: []string{
			"usage: kvroute trace convert [flags] FILE > trace.jsonl   (FILE \"-\" reads standard input; gzip is read as such)",
			"\nConverts a trace of another format into the Mooncake JSON Lines that analyze, simulate, plan,",
			"bench and demo replay: timestamp in milliseconds from the first request, input_length,",
			"output_length, hash_ids of 512-token blocks (equal ids at a position: an equal prompt up to there).",
		},
		more:       convertHelp,
		positional: true,
		floats:     map[string]string{"rate": "a positive number of requests a second, such as 3.4"},
	}, stdout, stderr)
	if exit {
		return code
	}
	in, err := convertArgs(fs, files, from, unit, output, &o)
	if err != nil {
		return failed(stderr, fs.Name(), err)
	}
	var r io.Reader = stdin
	if in == stdinTrace {
		if f, ok := stdin.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
			return failed(stderr, fs.Name(), usageErr("standard input is a terminal: pipe the trace in (kvroute trace convert - < FILE) or give its path"))
		}
	} else {
		f, err := os.Open(in)
		if err != nil {
			return failed(stderr, fs.Name(), usageErr("%v", err))
		}
		defer f.Close()
		// A directory opens, and then reads as no format known: say what it is.
		if fi, err := f.Stat(); err == nil && fi.IsDir() {
			return failed(stderr, fs.Name(), usageErr("%s is a directory: give the path of the trace file in it", in))
		}
		r = f
	}
	head := &headBuffer{max: headBytes}
	stats, err := convertTo(ctx, output, stdout, io.TeeReader(r, head), o)
	if err != nil {
		if errors.Is(err, workload.ErrBadConvertOption) {
			err = usageError{err}
		}
		err = otherFormatHint(err, o.From, head.b)
		name := in
		if in == stdinTrace {
			name = "standard input"
		}
		return failed(stderr, fs.Name(), fmt.Errorf("%s: %w", name, err))
	}
	to := "standard output"
	if output != "" {
		to = output
	}
	noun := "requests"
	if stats.Requests == 1 {
		noun = "request"
	}
	fmt.Fprintf(stderr, "kvroute trace: %d %s (%s) written to %s\n", stats.Requests, noun, stats.Format, to)
	for _, n := range stats.Notes {
		fmt.Fprintf(stderr, "  note: %s\n", n)
	}
	return 0
}

// headBytes is how much of the input trace convert keeps to tell its format by when --from
// turns out wrong: the 16 KiB that workload.ConvertTrace sniffs, with room for gzip.
const headBytes = 64 << 10

// headBuffer keeps the first max bytes written to it and takes the rest without keeping it.
type headBuffer struct {
	b   []byte
	max int
}

func (h *headBuffer) Write(p []byte) (int, error) {
	if n := min(len(p), h.max-len(h.b)); n > 0 {
		h.b = append(h.b, p[:n]...)
	}
	return len(p), nil
}

// otherFormatHint adds to err, the failure of a conversion --from said was from, which format
// the input's first bytes show when that is another one, as analyze names the format of a
// trace that is not Mooncake: --from sharegpt on OpenAI request bodies found no conversation
// and said only that there was no request. Other errors come back as they are.
func otherFormatHint(err error, from workload.TraceFormat, head []byte) error {
	if from == "" || !errors.Is(err, workload.ErrBadTrace) {
		return err
	}
	// The format is told as ConvertTrace tells it without --from; the conversion of the head
	// itself, cut where the head ends, does not matter.
	st, _ := workload.ConvertTrace(io.Discard, bytes.NewReader(head), workload.ConvertOptions{})
	if st.Format == "" || st.Format == from {
		return err
	}
	return fmt.Errorf("%w (its first bytes look like the %s format, not %s: give --from %s, or leave --from out to detect the format)", err, st.Format, from, st.Format)
}

// convertArgs checks the command line of trace convert, fills o from the flags and returns the
// input's path.
func convertArgs(fs *flag.FlagSet, files []string, from, unit, output string, o *workload.ConvertOptions) (string, error) {
	var errs []error
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	in := ""
	switch {
	case len(files) == 0:
		errs = append(errs, errors.New("want a subcommand: kvroute trace convert [flags] FILE"))
	case files[0] != "convert":
		errs = append(errs, fmt.Errorf("unknown subcommand %q, want convert (kvroute trace convert [flags] FILE)", files[0]))
	case len(files) != 2:
		errs = append(errs, fmt.Errorf("want one input FILE (or - for standard input), got %d", len(files)-1))
	default:
		in = files[1]
	}
	if from != "auto" {
		f, err := workload.ParseTraceFormat(from)
		if err != nil {
			errs = append(errs, fmt.Errorf("--from: %w", err))
		}
		o.From = f
	}
	if d, ok := timeUnits[unit]; ok {
		if set["time-unit"] {
			o.TimeUnit = d
		}
	} else {
		errs = append(errs, fmt.Errorf("--time-unit %q: want s, ms, us or ns", unit))
	}
	if !set["block-tokens"] {
		o.BlockTokens = 0
	} else if o.BlockTokens < 1 {
		errs = append(errs, fmt.Errorf("--block-tokens %d: want a whole number of tokens from 1", o.BlockTokens))
	}
	if !(o.Rate > 0) {
		errs = append(errs, fmt.Errorf("--rate %v: want a positive number of requests a second, such as 3.4", o.Rate))
	}
	if o.OutputTokens < 1 {
		errs = append(errs, fmt.Errorf("--output-tokens %d: want a whole number from 1", o.OutputTokens))
	}
	if o.From != "" && o.From != workload.FormatMooncake {
		for _, name := range []string{"time-unit", "block-tokens"} {
			if set[name] {
				errs = append(errs, fmt.Errorf("--%s is for a mooncake input, not %s", name, o.From))
			}
		}
	}
	if output != "" && in != "" && in != stdinTrace && sameFile(in, output) {
		errs = append(errs, fmt.Errorf("-o %s: the input itself", output))
	} else if err := checkConvertOutput(output); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return "", usageError{errors.Join(errs...)}
	}
	return in, nil
}

// checkConvertOutput tries, before the conversion reads anything, whether -o's file can be
// written as convertTo writes it: a temporary file beside it, renamed over it. A directory, a
// directory that does not exist or one without the right to write were found only at the end
// (a rename's "file exists"), or named the temporary file.
func checkConvertOutput(output string) error {
	if output == "" {
		return nil
	}
	if fi, err := os.Stat(output); err == nil && fi.IsDir() {
		return fmt.Errorf("-o %s: is a directory: give the path of the file to write", output)
	}
	dir := filepath.Dir(output)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(output)+".*")
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return fmt.Errorf("-o %s: cannot write in %s: %w", output, dir, err)
	}
	_ = tmp.Close()
	_ = os.Remove(tmp.Name())
	return nil
}

// sameFile reports whether paths a and b name one existing file.
func sameFile(a, b string) bool {
	sa, err := os.Stat(a)
	if err != nil {
		return false
	}
	sb, err := os.Stat(b)
	return err == nil && os.SameFile(sa, sb)
}

// convertTo converts r into output (stdout when ""). A file is written whole or not at all:
// the trace goes to a temporary file beside it, renamed over it at the end.
func convertTo(ctx context.Context, output string, stdout io.Writer, r io.Reader, o workload.ConvertOptions) (workload.ConvertStats, error) {
	r = ctxReader{ctx, r}
	if output == "" {
		return workload.ConvertTrace(stdout, r, o)
	}
	tmp, err := os.CreateTemp(filepath.Dir(output), "."+filepath.Base(output)+".*")
	if err != nil {
		return workload.ConvertStats{}, usageErr("-o: %v", err)
	}
	stats, err := workload.ConvertTrace(tmp, r, o)
	if cerr := tmp.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("write %s: %w", output, cerr)
	}
	if err == nil {
		err = os.Rename(tmp.Name(), output)
	}
	if err != nil {
		_ = os.Remove(tmp.Name())
	}
	return stats, err
}

// ctxReader stops reading when ctx is done (Ctrl-C during a long conversion).
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// formatList is the formats, comma-separated.
func formatList() string {
	var names []string
	for _, f := range workload.TraceFormats() {
		names = append(names, string(f))
	}
	return strings.Join(names, ", ")
}

// convertHelp follows the flags in trace convert's help.
func convertHelp(w io.Writer) {
	fmt.Fprint(w, `
formats (--from; auto tells them apart from the first bytes):
  openai    JSON Lines of OpenAI request bodies (chat completions, completions, Responses), as a
            gateway logs them; Batch API input lines ({"body": ...}); vLLM benchmark prompts
            ({"prompt": ..., "output_tokens": N}). Prompts are rendered and hashed as the router
            does, tokens counted at 4 bytes each; output_length is max_tokens (or --output-tokens).
            No times: requests are spaced evenly at --rate.
  sharegpt  a JSON array (or JSON Lines) of {"conversations": [{"from": ..., "value": ...}]}: one
            request per assistant turn, its prompt the conversation before it; spaced at --rate.
  azure     Azure LLM inference trace CSV (TIMESTAMP,ContextTokens,GeneratedTokens).
  burstgpt  BurstGPT CSV (Timestamp,Model,Request tokens,Response tokens,...).
            Both have token counts but no text: every request gets block ids of its own, so the
            converted trace shows no prefix sharing.
  mooncake  a Mooncake trace with timestamps in another unit (--time-unit s, us or ns) or blocks
            of another size (--block-tokens 64): rescaled and regrouped into 512-token blocks.

examples:
  kvroute trace convert --from openai gateway.jsonl.gz > trace.jsonl
  kvroute trace convert --time-unit s trace-in-seconds.jsonl > trace.jsonl
  kvroute trace convert --from sharegpt --rate 3 sharegpt.json.gz | kvroute analyze -
`)
}
