package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/internal/engine"
)

// runVerb runs `kvroute verb args...` and returns its exit status, stdout and stderr.
func runVerb(verb string, args ...string) (code int, stdout, stderr string) {
	var o, e bytes.Buffer
	code = run(context.Background(), append([]string{verb}, args...), &o, &e)
	return code, o.String(), e.String()
}

// writeTempFile writes text to a new file called name in a test directory and returns its path.
func writeTempFile(t *testing.T, name, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestUnknownCommand: a verb that does not exist exits 2 and names the nearest one, if any is
// within two edits.
func TestUnknownCommand(t *testing.T) {
	for verb, want := range map[string]string{
		"analyse":    `kvroute: unknown command "analyse" (did you mean "analyze"? run 'kvroute help')`,
		"server":     `kvroute: unknown command "server" (did you mean "serve"? run 'kvroute help')`,
		"frobnicate": `kvroute: unknown command "frobnicate" (run 'kvroute help')`,
	} {
		code, stdout, stderr := runVerb(verb)
		if code != 2 || stdout != "" || strings.TrimSpace(stderr) != want {
			t.Errorf("kvroute %s: exit %d, stdout %q, stderr %q; want 2 and %q", verb, code, stdout, stderr, want)
		}
	}
}

// A flag typed in the singular for a plural, or the other way round, is three edits from its
// name when the word ends in y (policy, policies), and a flag's first letters are more: each
// is suggested all the same.
func TestUnknownFlagSuggested(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"simulate", "--policy", "x"}, "kvroute simulate: flag provided but not defined: -policy (did you mean -policies? run 'kvroute simulate -h')"},
		{[]string{"serve", "--policies", "x"}, "kvroute serve: flag provided but not defined: -policies (did you mean -policy? run 'kvroute serve -h')"},
		{[]string{"simulate", "--inst", "4"}, "kvroute simulate: flag provided but not defined: -inst (did you mean -instances? run 'kvroute simulate -h')"},
		{[]string{"plan", "--slo-ttft", "1s"}, "kvroute plan: flag provided but not defined: -slo-ttft (run 'kvroute plan -h')"}, // -slo-ttft-p50 or -p90: no guess
		// One thing, a name per verb: the verb's own name for it.
		{[]string{"simulate", "--requests", "10"}, "kvroute simulate: flag provided but not defined: -requests (did you mean -limit? run 'kvroute simulate -h')"},
		{[]string{"demo", "--limit", "10"}, "kvroute demo: flag provided but not defined: -limit (did you mean -requests? run 'kvroute demo -h')"},
		{[]string{"analyze", "--requests", "10", "x"}, "kvroute analyze: flag provided but not defined: -requests (did you mean -sim-limit? run 'kvroute analyze -h')"},
		{[]string{"bench", "--sim-limit", "10"}, "kvroute bench: flag provided but not defined: -sim-limit (did you mean -requests? run 'kvroute bench -h')"},
		{[]string{"version", "--jsn"}, "kvroute version: flag provided but not defined: -jsn (did you mean -json? run 'kvroute version -h')"},
	} {
		code, stdout, stderr := runVerb(tt.args[0], tt.args[1:]...)
		if code != 2 || stdout != "" || strings.TrimSpace(stderr) != tt.want {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want 2 and %q", tt.args, code, stdout, stderr, tt.want)
		}
	}
}

// kvroute help CMD is kvroute CMD -h: the same help on stdout, the same exit status; kvroute
// help alone is the list of commands.
func TestHelpCommand(t *testing.T) {
	for _, v := range verbs() {
		code, out, errOut := runVerb("help", v.name)
		wantCode, wantOut, _ := runVerb(v.name, "-h")
		if code != wantCode || errOut != "" {
			t.Errorf("help %s: exit %d, stderr %q; want %d and nothing", v.name, code, errOut, wantCode)
		}
		if diff := cmp.Diff(wantOut, out); diff != "" {
			t.Errorf("help %s differs from %s -h (-want +got):\n%s", v.name, v.name, diff)
		}
	}
	code, out, _ := runVerb("help")
	if code != 0 || !strings.Contains(out, "\ncommands:\n") {
		t.Errorf("help: exit %d, stdout:\n%s", code, out)
	}
	for _, args := range [][]string{{"nope"}, {"serve", "bench"}} {
		code, out, errOut := runVerb("help", args...)
		if code != 2 || out != "" || strings.Count(errOut, "\n") != 1 {
			t.Errorf("help %v: exit %d, stdout %q, stderr %q; want 2 and one line on stderr", args, code, out, errOut)
		}
	}
}

func TestParseOrExit(t *testing.T) {
	h := verbHelp{usage: []string{"usage: kvroute x [flags]"}, more: policyHelp}
	tests := []struct {
		name       string
		args       []string
		positional bool
		code       int
		exit       bool
		rest       []string
		stdout     []string // substrings
		stderr     []string
	}{
		{name: "flags only", args: []string{"--n", "3"}},
		{name: "help", args: []string{"-h"}, code: 0, exit: true,
			stdout: []string{"usage: kvroute x [flags]", "\nflags:\n", "-n int", "policies: "}},
		{name: "bad flag", args: []string{"--nope"}, code: 2, exit: true,
			stderr: []string{"kvroute x: flag provided but not defined: -nope (run 'kvroute x -h')"}},
		{name: "near flag", args: []string{"--nn", "3"}, code: 2, exit: true,
			stderr: []string{"kvroute x: flag provided but not defined: -nn (did you mean -n? run 'kvroute x -h')"}},
		{name: "bad value", args: []string{"--n", "many"}, code: 2, exit: true, stderr: []string{"-n", "kvroute x -h"}},
		{name: "duration without unit", args: []string{"--d", "2"}, code: 2, exit: true,
			stderr: []string{`kvroute x: --d "2": give a duration with its unit, like 2s or 500ms (run 'kvroute x -h')`}},
		// The flag package says only "parse error" for these; the hint says what the flag takes.
		{name: "negative uint", args: []string{"--seed", "-1"}, code: 2, exit: true,
			stderr: []string{`kvroute x: --seed "-1": want a whole number from 0 to 18446744073709551615 (run 'kvroute x -h')`}},
		{name: "word for int", args: []string{"--n", "many"}, code: 2, exit: true,
			stderr: []string{`kvroute x: --n "many": want a whole number, such as 8`}},
		{name: "int out of range", args: []string{"--n", "99999999999999999999"}, code: 2, exit: true,
			stderr: []string{`kvroute x: --n "99999999999999999999": out of range (want a whole number from -9223372036854775808 to 9223372036854775807)`}},
		{name: "word for float", args: []string{"--f", "fast"}, code: 2, exit: true,
			stderr: []string{`kvroute x: --f "fast": want a factor above 0`}},
		{name: "word for bool", args: []string{"--v=maybe"}, code: 2, exit: true,
			stderr: []string{`kvroute x: --v="maybe": want true or false (or --v alone for true)`}},
		// strconv.ParseFloat reads these as numbers; no flag means one.
		{name: "NaN", args: []string{"--f", "NaN"}, code: 2, exit: true,
			stderr: []string{"kvroute x: --f NaN: want a factor above 0 (run 'kvroute x -h')"}},
		{name: "infinities", args: []string{"--f", "+Inf", "--g", "-inf"}, code: 2, exit: true,
			stderr: []string{"kvroute x: --f +Inf: want a factor above 0; --g -Inf: want a finite number (run 'kvroute x -h')"}},
		{name: "finite float", args: []string{"--f", "1e308", "--g", "-0"}},
		{name: "stray argument", args: []string{"--n", "1", "file"}, code: 2, exit: true,
			stderr: []string{`kvroute x: unexpected arguments ["file"] (run 'kvroute x -h')`}},
		{name: "positional anywhere", args: []string{"a", "--n", "1", "b", "-v"}, positional: true, rest: []string{"a", "b"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fs := newFlagSet("kvroute x")
			fs.Int("n", 0, "a number")
			fs.Bool("v", false, "verbose")
			fs.Duration("d", 0, "a duration")
			fs.Uint64("seed", 0, "a seed")
			fs.Float64("f", 0, "a factor")
			fs.Float64("g", 0, "a float without a range in floats")
			hh := h
			hh.floats = map[string]string{"f": "a factor above 0"}
			hh.positional = tc.positional
			var o, e bytes.Buffer
			rest, code, exit := parseOrExit(fs, tc.args, hh, &o, &e)
			if code != tc.code || exit != tc.exit {
				t.Errorf("code, exit = %d, %v; want %d, %v", code, exit, tc.code, tc.exit)
			}
			if diff := cmp.Diff(tc.rest, rest); diff != "" {
				t.Errorf("rest (-want +got):\n%s", diff)
			}
			for _, want := range tc.stdout {
				if !strings.Contains(o.String(), want) {
					t.Errorf("stdout lacks %q:\n%s", want, o.String())
				}
			}
			for _, want := range tc.stderr {
				if !strings.Contains(e.String(), want) {
					t.Errorf("stderr lacks %q:\n%s", want, e.String())
				}
			}
			if len(tc.stdout) == 0 && o.Len() > 0 || len(tc.stderr) == 0 && e.Len() > 0 {
				t.Errorf("unexpected output: stdout %q, stderr %q", o.String(), e.String())
			}
		})
	}
}

func TestFailedExitStatus(t *testing.T) {
	var e bytes.Buffer
	if code := failed(&e, "kvroute x", usageErr("--n %d: want at least 1", 0)); code != 2 {
		t.Errorf("usage error: %d, want 2", code)
	}
	if code := failed(&e, "kvroute x", os.ErrNotExist); code != 1 {
		t.Errorf("other error: %d, want 1", code)
	}
	if got, want := e.String(), "kvroute x: --n 0: want at least 1\nkvroute x: file does not exist\n"; got != want {
		t.Errorf("stderr = %q, want %q", got, want)
	}
}

// A --trace that cannot be used (a path that does not open, a bad line) is the command line's
// fault: exit 2 and one line naming it, as for a bad flag, from every verb that reads one.
func TestBadTraceExitStatus(t *testing.T) {
	bad := writeTempFile(t, "bad.jsonl", "{\"timestamp\": 1, \"input_length\": 5}\n")
	missing := filepath.Join(t.TempDir(), "none.jsonl")
	for _, args := range [][]string{
		{"analyze", "--trace", missing},
		{"analyze", "--trace", bad},
		{"simulate", "--trace", missing},
		{"simulate", "--trace", bad},
		{"plan", "--slo-ttft-p90", "2s", "--trace", bad},
	} {
		code, _, errOut := runVerb(args[0], args[1:]...)
		if code != 2 || strings.Count(errOut, "\n") != 1 || !strings.Contains(errOut, args[len(args)-1]) && !strings.Contains(errOut, "open trace") {
			t.Errorf("%v: exit %d, stderr %q; want 2 and one line about the trace", args, code, errOut)
		}
	}
}

// Every verb answers -h on stdout with exit 0 and a bad flag with exit 2 and one line.
func TestVerbsHelpAndBadFlag(t *testing.T) {
	for _, v := range verbs() {
		code, out, _ := runVerb(v.name, "-h")
		if code != 0 || !strings.Contains(out, "usage: kvroute "+v.name) || !strings.Contains(out, "flags:") {
			t.Errorf("%s -h: exit %d, stdout:\n%s", v.name, code, out)
		}
		code, _, errOut := runVerb(v.name, "--no-such-flag")
		if code != 2 || strings.Count(errOut, "\n") != 1 || !strings.Contains(errOut, "kvroute "+v.name+": ") {
			t.Errorf("%s --no-such-flag: exit %d, stderr %q", v.name, code, errOut)
		}
	}
}

// checkOutputs finds the files that cannot be written, all at once, and leaves the files it
// tries as they were: an existing one keeps its content, a new one is removed.
func TestCheckOutputs(t *testing.T) {
	dir := t.TempDir()
	existing := writeTempFile(t, "old.html", "keep me")
	fresh := filepath.Join(dir, "new.html")
	if err := checkOutputs(map[string]string{"html": existing, "records": fresh, "json": ""}); err != nil {
		t.Fatalf("writable paths: %v", err)
	}
	if b, err := os.ReadFile(existing); err != nil || string(b) != "keep me" {
		t.Errorf("existing file after the check: %q, %v; want it unchanged", b, err)
	}
	if _, err := os.Stat(fresh); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the check left %s behind (stat: %v)", fresh, err)
	}

	err := checkOutputs(map[string]string{"html": filepath.Join(dir, "no", "such.html"), "records": dir})
	if err == nil {
		t.Fatal("no error for a missing directory and a directory")
	}
	if !errors.As(err, new(usageError)) {
		t.Errorf("%v is not a usage error", err)
	}
	for _, want := range []string{"--html: ", "no such file or directory", "--records: ", "is a directory"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
}

// A run that Ctrl-C stops exits 130, as a shell gives a process that SIGINT killed, with one
// line saying it was interrupted: 1 before, the status of a run that failed.
func TestInterruptedExits130(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, args := range [][]string{
		{"simulate", "--workload", "multi-turn", "--policies", "round-robin"},
		{"plan", "--workload", "multi-turn", "--slo-ttft-p90", "1s", "--policies", "round-robin", "--quiet"},
		{"analyze", "--workload", "multi-turn", "--instances", "2"},
		{"simulate", "--scorecard", "--scenarios", "no sharing", "--policies", "round-robin", "--quiet"},
	} {
		var out, errOut bytes.Buffer
		code := run(ctx, args, &out, &errOut)
		if code != 130 || out.Len() > 0 || strings.Count(errOut.String(), "\n") != 1 || !strings.Contains(errOut.String(), "interrupted: context canceled") {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want 130, nothing and one line saying it was interrupted", args, code, out.String(), errOut.String())
		}
	}
}

// Output that cannot be written fails the command, with a line on stderr: help, version,
// every -h and the reports. Before, kvroute help > /dev/full exited 0, having said nothing.
func TestOutputWriteErrorFails(t *testing.T) {
	for _, args := range [][]string{
		{"help"},
		{"--help"},
		{"version"},
		{"--version"},
		{"version", "--json"},
		{"help", "simulate"},
		{"bench", "-h"},
		{"serve", "--help"},
		{"trace", "-h"},
		{"simulate", "--workload", "prefix-repetition:n=6", "--instances", "2", "--policies", "round-robin"},
		{"simulate", "--workload", "prefix-repetition:n=6", "--instances", "2", "--policies", "round-robin", "--json"},
		{"analyze", "--workload", "prefix-repetition:n=6", "--instances", "2"},
		{"plan", "--workload", "prefix-repetition:n=6", "--slo-ttft-p90", "10s", "--max-instances", "2", "--policies", "round-robin", "--quiet"},
	} {
		var errOut bytes.Buffer
		code := run(context.Background(), args, failingWriter{}, &errOut)
		// The reports say it in their own words ("write table: ..."); the rest through run.
		if code != 1 || strings.Count(errOut.String(), "\n") != 1 || !strings.HasSuffix(errOut.String(), ": no space left on device\n") {
			t.Errorf("%q: exit %d, stderr %q; want 1 and a line saying the output was lost", args, code, errOut.String())
		}
	}
	// A command that failed keeps its status and its own message.
	var errOut bytes.Buffer
	if code := run(context.Background(), []string{"simulate", "--nope"}, failingWriter{}, &errOut); code != 2 || strings.Contains(errOut.String(), "could not be written") {
		t.Errorf("bad flag: exit %d, stderr %q; want 2 and the flag's error alone", code, errOut.String())
	}
}

// SIGTERM gives 143 whichever verb it stopped, as bench and demo already gave: simulate,
// plan, analyze and the scorecard gave 130, the status of SIGINT.
func TestTerminatedExits143(t *testing.T) {
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(errors.New("terminated signal received")) // what signal.NotifyContext's cause says
	for _, args := range [][]string{
		{"simulate", "--workload", "multi-turn", "--policies", "round-robin"},
		{"analyze", "--workload", "multi-turn", "--instances", "2"},
	} {
		var out, errOut bytes.Buffer
		if code := run(ctx, args, &out, &errOut); code != 143 {
			t.Errorf("%q: exit %d (%s), want 143", args, code, errOut.String())
		}
	}
}

// The verbs' help says one thing one way: the count of requests to use is N and the speed-up
// replays arrivals faster in every verb, and --profile lists the profiles, as the error for an
// unknown one does, so that a first run need not fail to learn them.
func TestHelpSharedFlags(t *testing.T) {
	const profiles = "llama3-70b-h200-tp8"
	const speedup = "-speedup float\n    \treplay arrivals this many times faster than the workload's time"
	for _, tt := range []struct {
		verb string
		want []string
	}{
		{"bench", []string{"-requests N\n", speedup}},
		{"demo", []string{"-requests N\n", speedup, profiles}},
		{"simulate", []string{"-limit N\n", speedup, profiles}},
		{"plan", []string{"-limit N\n", speedup, profiles}},
		{"analyze", []string{"-sim-limit N\n", "with --instances: simulate only", profiles}},
	} {
		code, stdout, _ := runVerb(tt.verb, "-h")
		if code != 0 {
			t.Fatalf("%s -h: exit %d", tt.verb, code)
		}
		for _, w := range tt.want {
			if w == profiles {
				// Every profile, on the line of --profile.
				_, help, _ := strings.Cut(stdout, "-profile string\n")
				line, _, _ := strings.Cut(help, "\n")
				for _, p := range engine.Profiles() {
					if !strings.Contains(line, p.Name) {
						t.Errorf("%s -h: --profile's help %q does not name %s", tt.verb, line, p.Name)
					}
				}
				continue
			}
			if !strings.Contains(stdout, w) {
				t.Errorf("%s -h: no %q in\n%s", tt.verb, w, stdout)
			}
		}
	}
}

// serve with both a config file and endpoints says which to drop, and where the endpoints go;
// with neither, what to give.
func TestServeConfigOrEndpoints(t *testing.T) {
	code, _, stderr := runVerb("serve", "--config", "x.yaml", "--endpoint", "http://127.0.0.1:1")
	if code != 2 || !strings.Contains(stderr, "not both") {
		t.Errorf("both: exit %d, %q; want 2 and 'not both'", code, stderr)
	}
	code, _, stderr = runVerb("serve")
	if code != 2 || !strings.Contains(stderr, "give either --config FILE or one or more --endpoint URL") || strings.Contains(stderr, "not both") {
		t.Errorf("neither: exit %d, %q", code, stderr)
	}
}
