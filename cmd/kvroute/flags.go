package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/term"

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
}

// nearFlag is "did you mean -x? " when err is the flag package's unknown flag and one of
// fs's flags is within two edits of it, else "".
func nearFlag(fs *flag.FlagSet, err error) string {
	bad, ok := strings.CutPrefix(err.Error(), "flag provided but not defined: -")
	if !ok {
		return ""
	}
	var names []string
	fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
	if near := suggest.Nearest(strings.TrimPrefix(bad, "-"), names); near != "" {
		return "did you mean -" + near + "? "
	}
	return ""
}

// durationHint rewrites the flag package's error for a duration flag's bad value, which says
// only "parse error", into one that asks for the unit (a bare "2" is the usual mistake); any
// other error comes back as it is.
func durationHint(fs *flag.FlagSet, err error) error {
	msg := err.Error()
	var hint error
	fs.VisitAll(func(f *flag.Flag) {
		g, ok := f.Value.(flag.Getter)
		if !ok {
			return
		}
		if _, ok := g.Get().(time.Duration); !ok {
			return
		}
		quoted, ok := strings.CutSuffix(msg, " for flag -"+f.Name+": parse error")
		if !ok {
			return
		}
		if v, err := strconv.Unquote(strings.TrimPrefix(quoted, "invalid value ")); err == nil {
			hint = fmt.Errorf("--%s %q: give a duration with its unit, like 2s or 500ms", f.Name, v)
		}
	})
	if hint != nil {
		return hint
	}
	return err
}

// parseOrExit parses args into fs. When the verb must stop there it returns exit true and the
// status: 0 after -h or --help (help on stdout), 2 after a bad flag or a stray argument (the
// reason on stderr, one line). Otherwise it returns the positional arguments.
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
		if err != nil {
			fmt.Fprintf(stderr, "%s: %v (%srun '%s -h')\n", name, durationHint(fs, err), nearFlag(fs, err), name)
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
// usageError, 1 otherwise.
func failed(stderr io.Writer, name string, err error) int {
	fmt.Fprintf(stderr, "%s: %s\n", name, oneLine(err))
	if errors.As(err, new(usageError)) || errors.As(err, new(*experiment.UsageError)) {
		return 2
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
