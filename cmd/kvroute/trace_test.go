package main

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/internal/workload"
)

// stdinMain is, for each verb that takes --trace, its entry point with standard input given.
func stdinMain(verb string) func(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	return map[string]func(context.Context, []string, io.Reader, io.Writer, io.Writer) int{
		"analyze": analyzeMain, "simulate": simulateMain, "plan": planMain, "bench": benchMain, "demo": demoMain,
	}[verb]
}

// runWithStdin runs `kvroute verb args...` with stdin as its standard input.
func runWithStdin(verb, stdin string, args ...string) (code int, stdout, stderr string) {
	var o, e bytes.Buffer
	code = stdinMain(verb)(context.Background(), args, strings.NewReader(stdin), &o, &e)
	return code, o.String(), e.String()
}

// emptyTempDir points the temporary directory of the test's process at a new directory and
// checks, after the test, that nothing was left in it (the copy of a trace read from
// standard input).
func emptyTempDir(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("TMPDIR", dir)
	t.Cleanup(func() {
		left, err := os.ReadDir(dir)
		if err != nil || len(left) > 0 {
			t.Errorf("temporary directory after the run: %v, %v; want it empty", left, err)
		}
	})
}

// stdinTraceText is a small Mooncake trace: twelve requests, all sharing their first block.
var stdinTraceText = func() string {
	var b strings.Builder
	for i := range 12 {
		fmt.Fprintf(&b, `{"timestamp": %d, "input_length": 1100, "output_length": 4, "hash_ids": [0, %d, %d]}`+"\n", i*40, 1+i%3, 100+i)
	}
	return b.String()
}()

// TestTraceFromStdin: every verb that takes --trace reads "-" from standard input, names it
// stdin in its report as it would a file by its name, and leaves no copy of it behind.
func TestTraceFromStdin(t *testing.T) {
	emptyTempDir(t)
	srv, n := fakeStream(t)
	tests := []struct {
		verb string
		args []string
		// workload finds the name of the trace in the JSON report.
		workload func(t *testing.T, out string) (name string, requests int)
	}{
		{"simulate", []string{"--trace", "-", "--policies", "random", "--instances", "2", "--json"}, scenarioOf},
		{"plan", []string{"--trace", "-", "--policies", "random", "--slo-ttft-p90", "10s", "--max-instances", "2", "--json"},
			func(t *testing.T, out string) (string, int) {
				var s struct {
					Workload string
					Requests int
				}
				unmarshal(t, out, &s)
				return s.Workload, s.Requests
			}},
		{"bench", []string{"--trace", "-", "--target", srv.URL, "--speedup", "1000", "--json", "--quiet"}, scenarioOf},
		{"demo", []string{"--trace", "-", "--policies", "round-robin", "--instances", "2", "--time-scale", "0.1", "--speedup", "10", "--json", "--quiet", "--html", ""}, scenarioOf},
		{"analyze", []string{"--trace", "-", "--json"},
			func(t *testing.T, out string) (string, int) {
				var s struct {
					Source   string
					Requests int
				}
				unmarshal(t, out, &s)
				return s.Source, s.Requests
			}},
	}
	// The trace plain, and gzipped (told by its first bytes: a pipe has no name).
	for _, in := range []struct{ name, text string }{{"plain", stdinTraceText}, {"gzip", gzipText(t, stdinTraceText)}} {
		for _, tt := range tests {
			t.Run(in.name+"/"+tt.verb, func(t *testing.T) {
				code, out, errOut := runWithStdin(tt.verb, in.text, tt.args...)
				if code != 0 {
					t.Fatalf("exit %d: %s", code, errOut)
				}
				name, requests := tt.workload(t, out)
				// One name in every report (analyze said "standard input", the README "stdin").
				want := "stdin"
				if name != want || requests != 12 {
					t.Errorf("report names the trace %q with %d requests; want %q and 12", name, requests, want)
				}
			})
		}
	}
	if got := n.Load(); got != 24 {
		t.Errorf("bench sent %d requests, want the trace's 12 twice", got)
	}
}

// TestTraceFromStdinBadLine: a bad line on standard input is named as standard input's, not
// as a temporary file's, and stops the verb before it runs, with the exit status of a bad
// command line.
func TestTraceFromStdinBadLine(t *testing.T) {
	emptyTempDir(t)
	bad := stdinTraceText + `{"timestamp": 1, "input_length": "x"}` + "\n"
	for _, tt := range []struct {
		verb string
		args []string
	}{
		{"simulate", []string{"--trace", "-"}},
		{"simulate", []string{"--scorecard", "--trace", "-", "--scenarios", "mooncake"}},
		{"plan", []string{"--trace", "-", "--slo-ttft-p90", "1s"}},
		{"bench", []string{"--trace", "-", "--target", "http://127.0.0.1:1"}},
		{"demo", []string{"--trace", "-", "--html", ""}},
		{"analyze", []string{"-"}},
	} {
		code, out, errOut := runWithStdin(tt.verb, bad, tt.args...)
		want := "kvroute " + tt.verb + ": standard input: line 13: field input_length: want a whole number, got JSON string"
		if code != 2 || out != "" || !strings.HasPrefix(errOut, want) || strings.Count(errOut, "\n") != 1 || strings.Contains(errOut, os.TempDir()) {
			t.Errorf("%s %q: exit %d, stdout %q, stderr %q; want 2 and one line starting %q", tt.verb, tt.args, code, out, errOut, want)
		}
	}
}

// TestTraceFromStdinLaterError: an error that experiment finds in a trace read from standard
// input, after the check of its lines, names standard input, not the temporary file.
func TestTraceFromStdinLaterError(t *testing.T) {
	emptyTempDir(t)
	// One token more than a 16 MiB body holds at 4 bytes a token.
	ids := strings.Repeat("7, ", (4<<20)/512) + "7"
	huge := `{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [7]}` + "\n" +
		`{"timestamp": 5, "input_length": 4194305, "output_length": 1, "hash_ids": [` + ids + `]}` + "\n"
	code, out, errOut := runWithStdin("bench", huge, "--target", "http://127.0.0.1:1", "--trace", "-")
	want := "kvroute bench: --trace standard input: request 1 (non-blank line 2): input_length 4194305 is more than the 4194304 tokens"
	if code != 1 || out != "" || !strings.HasPrefix(errOut, want) || strings.Contains(errOut, os.TempDir()) {
		t.Errorf("exit %d, stdout %q, stderr %q; want 1 and %q", code, out, errOut, want)
	}
}

// TestEmptyTrace: a trace without a request, whether an empty file, blank lines or nothing on
// standard input, fails every verb that takes --trace the same way: exit 2, one line naming
// the trace and saying what a trace line is, nothing on stdout, before anything runs.
func TestEmptyTrace(t *testing.T) {
	emptyTempDir(t)
	empty := writeTempFile(t, "empty.jsonl", "")
	blank := writeTempFile(t, "blank.jsonl", "\n   \n\t\n")
	const want = "no requests: %s (want Mooncake JSON Lines, one object a line with timestamp, input_length, output_length and hash_ids)"
	inputs := []struct {
		name, file, stdin, says string
	}{
		{"empty file", empty, "", empty + ": " + strings.Replace(want, "%s", "the trace is empty", 1)},
		{"blank lines", blank, "", blank + ": " + strings.Replace(want, "%s", "nothing but 3 blank line(s)", 1)},
		{"empty stdin", "-", "", "standard input: " + strings.Replace(want, "%s", "the trace is empty", 1)},
		{"blank stdin", "-", "\n\n", "standard input: " + strings.Replace(want, "%s", "nothing but 2 blank line(s)", 1)},
	}
	for _, v := range traceVerbs {
		for _, in := range inputs {
			t.Run(strings.TrimSpace(v.verb+" "+strings.Join(v.args, " "))+"/"+in.name, func(t *testing.T) {
				args := append([]string{"--trace", in.file}, v.args...)
				code, out, errOut := runWithStdin(v.verb, in.stdin, args...)
				if code != 2 || out != "" || strings.Count(errOut, "\n") != 1 || !strings.HasPrefix(errOut, "kvroute "+v.verb+": ") || !strings.Contains(errOut, in.says) {
					t.Errorf("exit %d, stdout %q, stderr %q; want 2, nothing, and one line with %q", code, out, errOut, in.says)
				}
			})
		}
	}
}

// TestTraceIsADirectory: a --trace that names a directory fails every verb that takes one as a
// path that names no trace does: exit 2, one line saying what it is (before, exit 1 and "read
// trace after line 0: read DIR: is a directory").
func TestTraceIsADirectory(t *testing.T) {
	dir := t.TempDir()
	want := "open trace: " + dir + " is a directory: give the path of the trace file in it"
	for _, v := range traceVerbs {
		t.Run(strings.TrimSpace(v.verb+" "+strings.Join(v.args, " ")), func(t *testing.T) {
			code, out, errOut := runVerb(v.verb, append([]string{"--trace", dir}, v.args...)...)
			if code != 2 || out != "" || strings.Count(errOut, "\n") != 1 || !strings.HasPrefix(errOut, "kvroute "+v.verb+": ") || !strings.Contains(errOut, want) {
				t.Errorf("exit %d, stdout %q, stderr %q; want 2, nothing, and one line with %q", code, out, errOut, want)
			}
		})
	}
}

// TestFloatFlagsFinite: no float flag of any verb takes a value that is not a finite number,
// and each refusal says the flag, the value and what the flag takes (not merely "a finite
// number": every float flag has its range in its verb's verbHelp.floats).
func TestFloatFlagsFinite(t *testing.T) {
	floatFlag := regexp.MustCompile(`(?m)^  -(\S+) float$`)
	seen := 0
	for _, v := range verbs() {
		_, help, _ := runVerb(v.name, "-h")
		for _, m := range floatFlag.FindAllStringSubmatch(help, -1) {
			seen++
			for value, shown := range map[string]string{"NaN": "NaN", "nan": "NaN", "Inf": "+Inf", "+Inf": "+Inf", "-Infinity": "-Inf"} {
				code, out, errOut := runVerb(v.name, "--"+m[1], value)
				want := "kvroute " + v.name + ": --" + m[1] + " " + shown + ": want "
				if code != 2 || out != "" || strings.Count(errOut, "\n") != 1 || !strings.HasPrefix(errOut, want) || strings.Contains(errOut, "want a finite number") {
					t.Errorf("%s --%s %s: exit %d, stdout %q, stderr %q; want 2 and one line starting %q with the flag's range", v.name, m[1], value, code, out, errOut, want)
				}
			}
		}
	}
	// simulate 4, plan 1, bench 3, demo 2, sim 3, trace 1.
	if seen != 14 {
		t.Errorf("found %d float flags in the verbs' help, want 14: update this test", seen)
	}
}

// scenarioOf is the workload name and requests of a simulate, bench or demo JSON report.
func scenarioOf(t *testing.T, out string) (string, int) {
	var doc struct {
		Scenario struct {
			Workload string
			Requests int
		}
	}
	unmarshal(t, out, &doc)
	return doc.Scenario.Workload, doc.Scenario.Requests
}

func unmarshal(t *testing.T, out string, v any) {
	t.Helper()
	if err := json.Unmarshal([]byte(out), v); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, out)
	}
}

// The scorecard names a trace read from standard input stdin, as simulate does, not by the
// temporary file's path.
func TestScorecardTraceFromStdin(t *testing.T) {
	emptyTempDir(t)
	code, out, errOut := runWithStdin("simulate", stdinTraceText, "--scorecard", "--trace", "-", "--scenarios", "mooncake", "--policies", "random", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var sc struct {
		Trace string
		Cells []struct{ Workload, Skipped string }
	}
	unmarshal(t, out, &sc)
	var got []string
	for _, c := range sc.Cells {
		if c.Skipped != "" {
			t.Errorf("cell skipped: %s", c.Skipped)
		}
		got = append(got, c.Workload)
	}
	if sc.Trace != "stdin" || len(got) == 0 {
		t.Fatalf("trace %q, %d cells; want stdin and some", sc.Trace, len(got))
	}
	want := make([]string, len(got))
	for i := range want {
		want[i] = "stdin"
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("cells' workloads (-want +got):\n%s", diff)
	}
	if strings.Contains(out, os.TempDir()) {
		t.Errorf("the report names the temporary directory:\n%s", out)
	}
}

// gzipText is text gzipped.
func gzipText(t *testing.T, text string) string {
	t.Helper()
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	if _, err := zw.Write([]byte(text)); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// secondsTrace is stdinTraceText's requests with their timestamps in seconds: 0, 0.04, ...
var secondsTrace = func() string {
	var b strings.Builder
	for i := range 12 {
		fmt.Fprintf(&b, `{"timestamp": %.2f, "input_length": 1100, "output_length": 4, "hash_ids": [0, %d, %d]}`+"\n", float64(i)*0.04, 1+i%3, 100+i)
	}
	return b.String()
}()

// traceVerbs are the verbs that take --trace, each with the flags that make it run at once.
var traceVerbs = []struct {
	verb string
	args []string
}{
	{"analyze", nil},
	{"simulate", []string{"--policies", "random"}},
	{"simulate", []string{"--scorecard", "--scenarios", "mooncake", "--policies", "random"}},
	{"plan", []string{"--slo-ttft-p90", "1s", "--policies", "random"}},
	{"bench", []string{"--target", "http://127.0.0.1:1"}},
	{"demo", []string{"--html", "", "--policies", "round-robin"}},
}

// TestTraceInSeconds: a trace whose timestamps are seconds (they have fractions of a
// millisecond) is refused by every verb that takes --trace, from a file or standard input,
// before anything runs: exit 2, one line that says so and names the conversion. Read as
// milliseconds, it replayed a thousand times too fast.
func TestTraceInSeconds(t *testing.T) {
	emptyTempDir(t)
	file := writeTempFile(t, "seconds.jsonl", secondsTrace)
	const want = "line 2: timestamp 0.04 has a fraction of a millisecond: the timestamps look like seconds (kvroute reads milliseconds; as milliseconds, its 12 requests of 1100 prompt tokens on average arrive within 440µs, 27272.73 requests/s); if they are seconds, convert the trace: kvroute trace convert --time-unit s FILE > trace.jsonl"
	for _, v := range traceVerbs {
		for _, in := range []struct{ trace, stdin, name string }{{file, "", file}, {"-", secondsTrace, "standard input"}} {
			code, out, errOut := runWithStdin(v.verb, in.stdin, append([]string{"--trace", in.trace}, v.args...)...)
			if code != 2 || out != "" || strings.Count(errOut, "\n") != 1 || !strings.HasPrefix(errOut, "kvroute "+v.verb+": ") || !strings.Contains(errOut, in.name+": "+want) {
				t.Errorf("%s %q --trace %s: exit %d, stdout %q, stderr %q; want 2, nothing, and one line with %q", v.verb, v.args, in.trace, code, out, errOut, want)
			}
		}
	}
	// Converted, it is the trace in milliseconds.
	var conv bytes.Buffer
	code, _, errOut := runTraceWithStdin(secondsTrace, &conv, "convert", "--time-unit", "s", "-")
	if code != 0 {
		t.Fatalf("trace convert: exit %d: %s", code, errOut)
	}
	if diff := cmp.Diff(stdinTraceText, conv.String()); diff != "" {
		t.Errorf("converted from seconds (-the trace in ms +converted):\n%s", diff)
	}
}

// TestTraceGzipFile: every verb that takes --trace reads a gzipped trace file whatever its
// name, as the README's zcat pipe did.
func TestTraceGzipFile(t *testing.T) {
	emptyTempDir(t)
	file := writeTempFile(t, "trace.jsonl", gzipText(t, stdinTraceText))
	for _, v := range traceVerbs {
		if v.verb == "bench" || v.verb == "demo" {
			continue // they send requests; TestTraceFromStdin has them read gzip
		}
		code, out, errOut := runWithStdin(v.verb, "", append([]string{"--trace", file, "--json"}, v.args...)...)
		if code != 0 || !strings.Contains(out, `12`) {
			t.Errorf("%s %q: exit %d, stderr %q", v.verb, v.args, code, errOut)
		}
	}
}

// runTraceWithStdin runs kvroute trace with stdin, its standard output into out.
func runTraceWithStdin(stdin string, out io.Writer, args ...string) (code int, stdout, stderr string) {
	var e bytes.Buffer
	code = traceMain(context.Background(), args, strings.NewReader(stdin), out, &e)
	return code, "", e.String()
}

// TestTraceConvert: kvroute trace convert writes the Mooncake trace on standard output (or
// -o FILE, whole or not at all), says what it did on standard error, and the verbs replay it.
func TestTraceConvert(t *testing.T) {
	emptyTempDir(t)
	var lines strings.Builder
	for i := range 12 {
		fmt.Fprintf(&lines, `{"model": "m", "messages": [{"role": "system", "content": %q}, {"role": "user", "content": "question %d"}], "max_tokens": 5}`+"\n",
			strings.Repeat("You are a careful assistant. ", 100), i)
	}
	gateway := writeTempFile(t, "gateway.jsonl", lines.String())
	empty := writeTempFile(t, "empty.jsonl", "")
	dirOut := t.TempDir()

	var out bytes.Buffer
	code, _, errOut := runTraceWithStdin("", &out, "convert", gateway, "--rate", "4")
	wantErr := "kvroute trace: 12 requests (openai) written to standard output\n  note: openai has no times: the requests are spaced evenly, 250ms apart (4 a second), in the input's order; bench --rate re-times them as a Poisson process\n"
	if code != 0 || errOut != wantErr {
		t.Fatalf("exit %d, stderr %q; want 0 and %q", code, errOut, wantErr)
	}
	reqs, err := workload.ReadMooncake(bytes.NewReader(out.Bytes()))
	if err != nil || len(reqs) != 12 {
		t.Fatalf("the converted trace: %d requests, %v; want 12", len(reqs), err)
	}
	// 2,900 bytes of system prompt: one 512-token (2,048-byte) block shared by all, the
	// next block each request's own.
	for i, r := range reqs {
		if r.Blocks[0] != 0 || r.Blocks[1] != uint64(i+1) || r.OutputTokens != 5 {
			t.Errorf("request %d: ids %v, output %d; want 0, %d and 5", i, r.Blocks, r.OutputTokens, i+1)
		}
	}

	// -o FILE; from standard input; gzip.
	dst := filepath.Join(t.TempDir(), "out.jsonl")
	code, _, errOut = runTraceWithStdin(gzipText(t, lines.String()), io.Discard, "convert", "--rate", "4", "-o", dst, "-")
	if b, err := os.ReadFile(dst); code != 0 || err != nil || string(b) != out.String() || !strings.Contains(errOut, "written to "+dst) {
		t.Errorf("-o from gzipped stdin: exit %d, stderr %q, file %v; want the same trace", code, errOut, err)
	}
	// A failed conversion leaves -o as it was.
	if err := os.WriteFile(dst, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	bad := writeTempFile(t, "bad.jsonl", lines.String()+`{"model": "m"}`+"\n")
	code, _, errOut = runTraceWithStdin("", io.Discard, "convert", "-o", dst, bad)
	if b, _ := os.ReadFile(dst); code != 2 || string(b) != "keep" || errOut != "kvroute trace: "+bad+": line 13: no messages, prompt or input: not a chat, completion or Responses request body\n" {
		t.Errorf("bad line: exit %d, stderr %q, -o now %q; want 2, the line named, the file kept", code, errOut, b)
	}
	left, _ := filepath.Glob(filepath.Join(filepath.Dir(dst), ".out.jsonl.*"))
	if len(left) > 0 {
		t.Errorf("temporary files left: %v", left)
	}

	for _, tt := range []struct {
		args []string
		want string
	}{
		{nil, "kvroute trace: want a subcommand: kvroute trace convert [flags] FILE\n"},
		{[]string{"merge", gateway}, `kvroute trace: unknown subcommand "merge", want convert (kvroute trace convert [flags] FILE)` + "\n"},
		{[]string{"convert"}, "kvroute trace: want one input FILE (or - for standard input), got 0\n"},
		{[]string{"convert", "--from", "csv", gateway}, `kvroute trace: --from: unknown trace format "csv", want one of openai, sharegpt, azure, burstgpt, mooncake` + "\n"},
		{[]string{"convert", "--from", "azure", "--time-unit", "s", gateway}, "kvroute trace: --time-unit is for a mooncake input, not azure\n"},
		{[]string{"convert", "--time-unit", "min", gateway}, `kvroute trace: --time-unit "min": want s, ms, us or ns` + "\n"},
		{[]string{"convert", "--rate", "0", gateway}, "kvroute trace: --rate 0: want a positive number of requests a second, such as 3.4\n"},
		{[]string{"convert", "--rate", "NaN", gateway}, "kvroute trace: --rate NaN: want a positive number of requests a second, such as 3.4 (run 'kvroute trace -h')\n"},
		{[]string{"convert", "--block-tokens", "64", gateway}, "kvroute trace: " + gateway + ": the time unit and the block size are settings of a Mooncake trace, not of an openai one\n"},
		{[]string{"convert", "-o", gateway, gateway}, "kvroute trace: -o " + gateway + ": the input itself\n"},
		{[]string{"convert", gateway + ".nope"}, "kvroute trace: open " + gateway + ".nope: no such file or directory\n"},
		// A directory, an empty file: said as such (they read as "in no format known here").
		{[]string{"convert", filepath.Dir(gateway)}, "kvroute trace: " + filepath.Dir(gateway) + " is a directory: give the path of the trace file in it\n"},
		{[]string{"convert", empty}, "kvroute trace: " + empty + ": no requests: the input is empty\n"},
		// An -o that cannot be written fails before the input is read, naming -o and not the
		// temporary file (a directory failed only at the end, on a rename's "file exists").
		{[]string{"convert", "-o", dirOut, gateway}, "kvroute trace: -o " + dirOut + ": is a directory: give the path of the file to write\n"},
		{[]string{"convert", "-o", filepath.Join(dirOut, "no", "t.jsonl"), gateway}, "kvroute trace: -o " + filepath.Join(dirOut, "no", "t.jsonl") + ": cannot write in " + filepath.Join(dirOut, "no") + ": no such file or directory\n"},
	} {
		code, _, errOut := runTraceWithStdin("", io.Discard, tt.args...)
		if code != 2 || errOut != tt.want {
			t.Errorf("trace %q: exit %d, stderr %q; want 2 and %q", tt.args, code, errOut, tt.want)
		}
	}
}

// TestTraceSummaryNamesEveryFormat: kvroute help's line for trace names every format that trace
// convert takes (--from), as the README's table does: it left Mooncake out (in seconds, or
// with 64-token blocks), which the README lists.
func TestTraceSummaryNamesEveryFormat(t *testing.T) {
	var summary string
	for _, v := range verbs() {
		if v.name == "trace" {
			summary = strings.ToLower(v.summary)
		}
	}
	for _, f := range workload.TraceFormats() {
		if !strings.Contains(summary, string(f)) {
			t.Errorf("kvroute help says of trace %q: it lacks the format %s", summary, f)
		}
	}
}

// TestTraceConvertWrongFrom: a --from that does not fit the input says which format its first
// bytes show, as analyze does for a trace that is not Mooncake: --from sharegpt on OpenAI
// request bodies found no conversation and said only "no requests". One request is "1 request".
func TestTraceConvertWrongFrom(t *testing.T) {
	emptyTempDir(t)
	body := `{"model": "m", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 10}` + "\n"
	oai := writeTempFile(t, "oai.jsonl", body)
	sg := writeTempFile(t, "sg.jsonl", `{"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]}`+"\n")
	hint := func(is, not string) string {
		return " (its first bytes look like the " + is + " format, not " + not + ": give --from " + is + ", or leave --from out to detect the format)\n"
	}
	for _, tt := range []struct {
		stdin string
		args  []string
		want  string
	}{
		{"", []string{"convert", "--from", "sharegpt", oai}, "kvroute trace: " + oai + ": no requests: the input has no request to convert" + hint("openai", "sharegpt")},
		{gzipText(t, body), []string{"convert", "--from", "sharegpt", "-"}, "kvroute trace: standard input: no requests: the input has no request to convert" + hint("openai", "sharegpt")},
		{"", []string{"convert", "--from", "openai", sg}, "kvroute trace: " + sg + ": line 1: no messages, prompt or input: not a chat, completion or Responses request body" + hint("sharegpt", "openai")},
		{"", []string{"convert", "--from", "mooncake", oai}, "kvroute trace: " + oai + ": line 1: field timestamp: missing (milliseconds; arrivals are measured from the earliest)" + hint("openai", "mooncake")},
		// The format given is the input's: its own error, nothing added.
		{"", []string{"convert", "--from", "openai", writeTempFile(t, "bad.jsonl", body+`{"model": "m"}`+"\n")}, "line 2: no messages, prompt or input: not a chat, completion or Responses request body\n"},
	} {
		code, _, errOut := runTraceWithStdin(tt.stdin, io.Discard, tt.args...)
		if code != 2 || !strings.HasSuffix(errOut, tt.want) || strings.Count(errOut, "\n") != 1 {
			t.Errorf("trace %q: exit %d, stderr %q; want 2 and %q", tt.args, code, errOut, tt.want)
		}
	}

	code, _, errOut := runTraceWithStdin("", io.Discard, "convert", "--from", "openai", oai)
	if want := "kvroute trace: 1 request (openai) written to standard output\n"; code != 0 || !strings.HasPrefix(errOut, want) {
		t.Errorf("one request: exit %d, stderr %q; want 0 and %q", code, errOut, want)
	}
}
