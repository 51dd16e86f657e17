package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/term"

	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/experiment"
	"github.com/kvroute/kvroute/internal/loadgen"
	"github.com/kvroute/kvroute/internal/policy"
	"github.com/kvroute/kvroute/internal/suggest"
	"github.com/kvroute/kvroute/internal/workload"
)

// What every verb shares on its command line: one flag set that prints nothing itself, one
// way of answering -h and bad flags, one exit status per kind of failure, one JSON encoder.

// newFlagSet returns the flag set of the verb called name ("kvroute bench"). It prints
// nothing itself: parseOrExit decides where help and errors go.
func newFlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return fs
}

// verbHelp is what parseOrExit needs besides the flags.
type verbHelp struct {
	// usage: the lines -h prints before the flags ("usage: ..." and a description).
	usage []string
	// more prints what follows the flags in -h (workloads, policies); nil: nothing.
	more func(w io.Writer)
	// positional: arguments (files) are allowed, before, after or between the flags.
	positional bool
	// argsHint follows "unexpected arguments" when positional is false (default: a pointer to -h).
	argsHint string
	// floats gives each float flag's allowed values ("a positive finite factor, such as 2"),
	// which a value that is not a number or not finite (NaN, Inf) is refused with.
	floats map[string]string
}

// profileNames lists the engine profiles, for the help of --profile.
func profileNames() string {
	var names []string
	for _, p := range engine.Profiles() {
		names = append(names, p.Name)
	}
	return strings.Join(names, ", ")
}

// sameFlags are flags that do one thing under different names in different verbs: how many
// of the workload's requests to use is --requests to bench and demo, --limit to simulate and
// plan, --sim-limit to analyze.
var sameFlags = [][]string{{"requests", "limit", "sim-limit"}}

// nearFlag is "did you mean -x? " when err is the flag package's unknown flag and fs has a
// flag that another verb calls by that name (sameFlags), or one within two edits of it, else "".
func nearFlag(fs *flag.FlagSet, err error) string {
	bad, ok := strings.CutPrefix(err.Error(), "flag provided but not defined: -")
	if !ok {
		return ""
	}
	name := strings.TrimPrefix(bad, "-")
	for _, same := range sameFlags {
		if !slices.Contains(same, name) {
			continue
		}
		for _, s := range same {
			if fs.Lookup(s) != nil {
				return "did you mean -" + s + "? "
			}
		}
	}
	var names []string
	fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
	if near := suggest.Nearest(name, names); near != "" {
		return "did you mean -" + near + "? "
	}
	return ""
}

// valueHint rewrites the flag package's error for a bad value of a duration, number or bool
// flag, which says only "parse error" or "value out of range", into one that says what the
// flag takes (a bare "2" is the usual mistake for a duration); floats gives the float flags'
// allowed values. Any other error comes back as it is.
func valueHint(fs *flag.FlagSet, floats map[string]string, err error) error {
	msg := err.Error()
	// The flag package words a bool's error its own way.
	if rest, ok := strings.CutPrefix(msg, "invalid boolean value "); ok {
		if quoted, name, ok := strings.Cut(rest, " for -"); ok {
			name, _, _ = strings.Cut(name, ":")
			if v, err := strconv.Unquote(quoted); err == nil {
				return fmt.Errorf("--%s=%q: want true or false (or --%s alone for true)", name, v, name)
			}
		}
	}
	var hint error
	fs.VisitAll(func(f *flag.Flag) {
		g, ok := f.Value.(flag.Getter)
		if !ok {
			return
		}
		quoted, ok := strings.CutPrefix(msg, "invalid value ")
		if !ok {
			return
		}
		quoted, big := strings.CutSuffix(quoted, " for flag -"+f.Name+": value out of range")
		if !big {
			if quoted, ok = strings.CutSuffix(quoted, " for flag -"+f.Name+": parse error"); !ok {
				return
			}
		}
		v, err := strconv.Unquote(quoted)
		if err != nil {
			return
		}
		var want string
		switch g.Get().(type) {
		case time.Duration:
			want = "give a duration with its unit, like 2s or 500ms"
		case int:
			want = "want a whole number, such as 8"
			if big {
				want = fmt.Sprintf("out of range (want a whole number from %d to %d)", math.MinInt, math.MaxInt)
			}
		case uint64:
			want = fmt.Sprintf("want a whole number from 0 to %d", uint64(math.MaxUint64))
		case float64:
			want = "want " + floatRange(floats, f.Name)
		default:
			return
		}
		hint = fmt.Errorf("--%s %q: %s", f.Name, v, want)
	})
	if hint != nil {
		return hint
	}
	return err
}

// The allowed values of the float flags that several verbs share, for verbHelp.floats.
const (
	speedupRange     = "a positive finite factor, such as 2 (leave it out for 1)"
	nonStreamedRange = "a fraction of the requests from 0 to 1"
)

// floatRange is what the float flag called name takes, for its errors.
func floatRange(floats map[string]string, name string) string {
	if r := floats[name]; r != "" {
		return r
	}
	return "a finite number"
}

// nonFinite refuses NaN and infinities in the float flags given: strconv.ParseFloat, which the
// flag package uses, reads "NaN", "Inf", "+Inf" and "-Infinity" as numbers, and no flag of
// ours means one (an infinite --speedup put every arrival at 0; a NaN compares false with
// every bound, so range checks written as v < 0 let it through).
func nonFinite(fs *flag.FlagSet, floats map[string]string) error {
	var errs []error
	fs.Visit(func(f *flag.Flag) {
		g, ok := f.Value.(flag.Getter)
		if !ok {
			return
		}
		if v, ok := g.Get().(float64); ok && (math.IsNaN(v) || math.IsInf(v, 0)) {
			errs = append(errs, fmt.Errorf("--%s %v: want %s", f.Name, v, floatRange(floats, f.Name)))
		}
	})
	return errors.Join(errs...)
}

// parseOrExit parses args into fs. When the verb must stop there it returns exit true and the
// status: 0 after -h or --help (help on stdout), 2 after a bad flag, a float flag's value
// that is not a finite number, or a stray argument (the reason on stderr, one line).
// Otherwise it returns the positional arguments.
func parseOrExit(fs *flag.FlagSet, args []string, h verbHelp, stdout, stderr io.Writer) (rest []string, code int, exit bool) {
	name := fs.Name()
	for {
		err := fs.Parse(args)
		if errors.Is(err, flag.ErrHelp) {
			for _, l := range h.usage {
				fmt.Fprintln(stdout, l)
			}
			fmt.Fprintln(stdout, "\nflags:")
			fs.SetOutput(stdout)
			fs.PrintDefaults()
			fs.SetOutput(io.Discard)
			if h.more != nil {
				h.more(stdout)
			}
			return nil, 0, true
		}
		if err == nil {
			err = nonFinite(fs, h.floats)
		} else {
			err = valueHint(fs, h.floats, err)
		}
		if err != nil {
			fmt.Fprintf(stderr, "%s: %s (%srun '%s -h')\n", name, oneLine(err), nearFlag(fs, err), name)
			return nil, 2, true
		}
		if fs.NArg() == 0 {
			return rest, 0, false
		}
		if !h.positional {
			hint := h.argsHint
			if hint == "" {
				hint = fmt.Sprintf("run '%s -h'", name)
			}
			fmt.Fprintf(stderr, "%s: unexpected arguments %q (%s)\n", name, fs.Args(), hint)
			return nil, 2, true
		}
		rest = append(rest, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// workloadHelp lists the synthetic workloads, after the flags in -h.
func workloadHelp(w io.Writer) {
	fmt.Fprintln(w, "\nworkloads (--workload NAME:key=value,...):")
	fmt.Fprint(w, workload.WorkloadHelp())
}

// policyHelp lists the registered policies, after the flags in -h.
func policyHelp(w io.Writer) {
	fmt.Fprintf(w, "\npolicies: %s\n", strings.Join(policy.Names(), ", "))
}

// usageError marks a bad command line: exit status 2 rather than 1 (experiment.UsageError is
// the same for the verbs that run experiments).
type usageError struct{ error }

func (e usageError) Unwrap() error { return e.error }

// usageErr is a command-line problem.
func usageErr(format string, args ...any) error {
	return usageError{fmt.Errorf(format, args...)}
}

// failed prints err for the verb on one line and returns the exit status: 2 for a
// usageError, or a trace that cannot be used (workload.ErrBadTrace: --trace named a path that
// does not open, or a file that is not a trace or has no request, and nothing ran); 130 for
// a run interrupted (Ctrl-C: context.Canceled), as a shell gives a process SIGINT stopped
// (run makes it 143 where the signal was SIGTERM); 1 otherwise.
func failed(stderr io.Writer, name string, err error) int {
	fmt.Fprintf(stderr, "%s: %s\n", name, oneLine(err))
	switch {
	case errors.As(err, new(usageError)) || errors.As(err, new(*experiment.UsageError)) || errors.Is(err, workload.ErrBadTrace):
		return 2
	case errors.Is(err, context.Canceled):
		return 130
	}
	return 1
}

// checkOutputs tries, before a run, each file that the run is to write, so that a report that
// cannot be written fails the command at once rather than after minutes of work.
// paths maps a flag's name ("html") to its value; an empty value is not checked. Each file is
// opened for writing without truncating it, and removed again when the check created it. All
// the flags that fail come back at once, as a usage error.
func checkOutputs(paths map[string]string) error {
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(paths)) {
		path := paths[name]
		if path == "" {
			continue
		}
		_, statErr := os.Lstat(path)
		fh, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE, 0o666)
		if err != nil {
			errs = append(errs, fmt.Errorf("--%s: %w", name, err))
			continue
		}
		_ = fh.Close()
		if errors.Is(statErr, os.ErrNotExist) {
			_ = os.Remove(path)
		}
	}
	if len(errs) > 0 {
		return usageError{errors.Join(errs...)}
	}
	return nil
}

// oneLine keeps an error message on one line (errors.Join separates with newlines).
func oneLine(err error) string { return strings.ReplaceAll(err.Error(), "\n", "; ") }

// writeJSON prints v as indented JSON, what every verb's --json gives.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
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

// listFlag is a flag that may be given several times; each value is kept in order.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }

func (l *listFlag) Set(v string) error {
	*l = append(*l, v)
	return nil
}

// namesFlag is a flag that may be given several times, each value one name or several
// separated by commas; the names are kept in order, without surrounding spaces.
type namesFlag []string

func (l *namesFlag) String() string { return strings.Join(*l, ",") }

func (l *namesFlag) Set(v string) error {
	for name := range strings.SplitSeq(v, ",") {
		name = strings.TrimSpace(name)
		if name == "" {
			return errors.New("empty name (give names separated by commas)")
		}
		*l = append(*l, name)
	}
	return nil
}
