package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/report"
	"github.com/kvroute/kvroute/internal/workload"
)

const analyzeTrace = `{"timestamp": 0, "input_length": 1024, "output_length": 10, "hash_ids": [0, 1]}
{"timestamp": 1000, "input_length": 1500, "output_length": 20, "hash_ids": [0, 1, 2]}
{"timestamp": 2000, "input_length": 600, "output_length": 30, "hash_ids": [0, 3]}
`

// runAnalyzeForTest runs the verb and returns its exit status, stdout and stderr.
func runAnalyzeForTest(t *testing.T, stdin string, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := analyzeMain(context.Background(), args, strings.NewReader(stdin), &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestAnalyzeText(t *testing.T) {
	path := writeTempFile(t, "trace.jsonl", analyzeTrace)
	// Flags after the file work too.
	code, out, errOut := runAnalyzeForTest(t, "", path, "--instances", "2")
	if code != 0 || errOut != "" {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	// Infinite cache at 16-token blocks: request 2 hits 1024 of 1500 tokens, request 3 hits 512
	// of 600: 1536 of 3124 tokens.
	for _, want := range []string{
		"requests        3 over 2 s (1.50 requests/s)",
		"prompt tokens   p50 1,024  p90 1,024  p99 1,024  max 1,500  mean 1,041  (total 3,124)",
		"blocks          4 distinct (512 tokens); working set 1,588 tokens",
		"common prefix   1 block(s) shared by every request",
		">= 1: 66.7%  >= 2: 33.3%  >= 4: 0.0%",
		"unbounded cache 0.492; pooled LRU of 2 x 2,500,000 tokens (llama3-70b-h200-tp8) 0.492; random over 2 instances 0.",
		"verdict         prefix-aware routing pays off, simulated on 2 x llama3-70b-h200-tp8",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	// --trace FILE, as simulate, bench and plan take it, says the same (but for the wall time).
	code, outFlag, errOut := runAnalyzeForTest(t, "", "--trace", path, "--instances", "2")
	wall := regexp.MustCompile(`policies in [0-9.]+ s`)
	if code != 0 || errOut != "" || wall.ReplaceAllString(outFlag, "") != wall.ReplaceAllString(out, "") {
		t.Errorf("--trace: exit %d, stderr %q, output:\n%s\nwant FILE's:\n%s", code, errOut, outFlag, out)
	}
	// Every request at the same time: no rate is made up.
	same := writeTempFile(t, "same.jsonl", strings.Repeat(`{"timestamp": 5, "input_length": 10, "output_length": 5, "hash_ids": [1]}`+"\n", 2))
	if code, out, _ := runAnalyzeForTest(t, "", same, "--no-simulate"); code != 0 || !strings.Contains(out, "requests        2, all at the same time") {
		t.Errorf("one instant: exit %d, output:\n%s", code, out)
	}
}

func TestAnalyzeJSONFromStdin(t *testing.T) {
	code, out, errOut := runAnalyzeForTest(t, analyzeTrace, "--json", "--profile", "llama3-70b-h100-tp4", "-")
	if code != 0 {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	var got struct {
		Source    string  `json:"source"`
		Requests  int     `json:"requests"`
		Duration  float64 `json:"duration_s"`
		KVTokens  int     `json:"kv_tokens_per_instance"`
		Capacity  int     `json:"capacity_tokens"`
		Infinite  float64 `json:"infinite_hit_rate"`
		Verdict   string  `json:"verdict"`
		Instances int     `json:"instances"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, out)
	}
	if got.Source != "stdin" || got.Requests != 3 || got.Duration != 2 || got.KVTokens != 461376 ||
		got.Instances != 8 || got.Capacity != 8*461376 || got.Infinite < 0.49 || got.Infinite > 0.50 || got.Verdict == "" {
		t.Errorf("JSON report: %+v", got)
	}
	// No --instances: no fleet to simulate, so no verdict on least-request, and the command
	// that would give one.
	var rest map[string]any
	if err := json.Unmarshal([]byte(out), &rest); err != nil {
		t.Fatal(err)
	}
	if _, ok := rest["simulation"]; ok || rest["not_simulated"] != "no fleet given (--instances N)" ||
		!strings.Contains(got.Verdict, "kvroute simulate --trace - --instances N --profile llama3-70b-h100-tp4 --policies prefix-aware,least-request,round-robin") ||
		strings.Contains(got.Verdict, "should do about as well") {
		t.Errorf("no fleet: simulation %v, not_simulated %v, verdict %q", rest["simulation"], rest["not_simulated"], got.Verdict)
	}
}

// analyzeJSON is the part of analyze's --json that the simulation tests read.
type analyzeJSON struct {
	Requests     int                `json:"requests"`
	Verdict      string             `json:"verdict"`
	Findings     string             `json:"findings"`
	NotSimulated string             `json:"not_simulated"`
	Simulation   *analyzeSimulation `json:"simulation"`
}

// analyzeForJSON runs analyze with --json and decodes its output.
func analyzeForJSON(t *testing.T, args ...string) analyzeJSON {
	t.Helper()
	code, out, errOut := runAnalyzeForTest(t, "", append(args, "--json")...)
	if code != 0 {
		t.Fatalf("analyze %v: exit %d, stderr %q", args, code, errOut)
	}
	var got analyzeJSON
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, out)
	}
	return got
}

// TestAnalyzeSimulatesTheFleet: given --instances, analyze simulates the three policies on the
// fleet, carries their measured figures in --json, bases the verdict on them and names the
// kvroute simulate command that gives the same figures.
func TestAnalyzeSimulatesTheFleet(t *testing.T) {
	got := analyzeForJSON(t, "--workload", "shared-prefix:groups=4,prompts=40", "--instances", "4", "--sim-limit", "100")
	sim := got.Simulation
	if sim == nil || got.NotSimulated != "" {
		t.Fatalf("no simulation (not simulated: %q)", got.NotSimulated)
	}
	if got.Requests != 160 || sim.Requests != 100 || sim.Of != 160 || sim.Instances != 4 || sim.Profile != "llama3-70b-h200-tp8" ||
		sim.BlockSize != 16 || sim.Seed != 1 || !(sim.SpanSeconds > 0) || !(sim.Rate > 0) || !(sim.Load > 0) || !(sim.WallSeconds > 0) {
		t.Errorf("simulation setting: %+v", sim)
	}
	if len(sim.Results) != 3 {
		t.Fatalf("results: %+v", sim.Results)
	}
	for i, want := range []string{"prefix-aware", "least-request", "round-robin"} {
		r := sim.Results[i]
		if r.Policy != want || r.Completed != 100 || r.Failed != 0 || !(r.TTFT.Mean > 0) || !(r.TTFT.P90 >= r.TTFT.P50) || r.HitRate < 0 || r.HitRate > 1 {
			t.Errorf("result %d: %+v, want %s with 100 completed and figures", i, r, want)
		}
	}
	wantCmd := "kvroute simulate --workload shared-prefix:groups=4,prompts=40 --seed 1 --instances 4 --profile llama3-70b-h200-tp8 --limit 100 --policies prefix-aware,least-request,round-robin"
	if sim.Command != wantCmd {
		t.Errorf("command %q, want %q", sim.Command, wantCmd)
	}
	checkSimulateAgrees(t, sim)
	// The verdict quotes the measured TTFT of prefix-aware.
	if !strings.Contains(got.Verdict, "TTFT mean "+msFigure(sim.Results[0].TTFT.Mean)+" ms against") ||
		!strings.Contains(got.Verdict, "simulated on 4 x llama3-70b-h200-tp8 at load") || !strings.Contains(got.Verdict, "over the first 100 of 160 requests") {
		t.Errorf("verdict does not quote the simulation: %q", got.Verdict)
	}

	// The text says what was simulated and how long it took.
	code, out, errOut := runAnalyzeForTest(t, "", "--workload", "shared-prefix:groups=4,prompts=40", "--instances", "4", "--sim-limit", "100")
	if code != 0 {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	for _, want := range []string{
		"simulated       the first 100 of 160 requests (",
		"on 4 x llama3-70b-h200-tp8, 16-token blocks, seed 1: 3 policies in ",
		"                  prefix-aware   hit rate ",
		"                  least-request  hit rate ",
		"(the same, and more: " + wantCmd + ")",
		"verdict         ",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}

	// --no-simulate: statistics only, with the command to measure.
	skip := analyzeForJSON(t, "--workload", "shared-prefix:groups=4,prompts=40", "--instances", "4", "--no-simulate")
	if skip.Simulation != nil || skip.NotSimulated != "--no-simulate" ||
		!strings.Contains(skip.Verdict, "kvroute simulate --workload shared-prefix:groups=4,prompts=40 --seed 1 --instances 4 ") {
		t.Errorf("--no-simulate: simulation %+v, not simulated %q, verdict %q", skip.Simulation, skip.NotSimulated, skip.Verdict)
	}
	// A fleet larger than analyze simulates: statistics only, with the command for that fleet.
	big := analyzeForJSON(t, "--workload", "shared-prefix:groups=4,prompts=40", "--instances", "300")
	if big.Simulation != nil || big.NotSimulated != "--instances 300: more than the 256 analyze simulates (kvroute simulate takes any fleet)" ||
		!strings.Contains(big.Verdict, "kvroute simulate --workload shared-prefix:groups=4,prompts=40 --seed 1 --instances 300 ") {
		t.Errorf("300 instances: simulation %+v, not simulated %q, verdict %q", big.Simulation, big.NotSimulated, big.Verdict)
	}
	// One instance: nothing to place, nothing to simulate.
	one := analyzeForJSON(t, "--workload", "shared-prefix:groups=4,prompts=40", "--instances", "1")
	if one.Simulation != nil || !strings.HasPrefix(one.Verdict, "with one instance there is nothing to place") {
		t.Errorf("one instance: simulation %+v, verdict %q", one.Simulation, one.Verdict)
	}
}

// checkSimulateAgrees runs the kvroute simulate command analyze printed and checks that it
// measures what analyze reported.
func checkSimulateAgrees(t *testing.T, sim *analyzeSimulation) {
	t.Helper()
	args, ok := strings.CutPrefix(sim.Command, "kvroute simulate ")
	if !ok {
		t.Fatalf("command %q is not kvroute simulate's", sim.Command)
	}
	code, out, errOut := runVerb("simulate", append(strings.Fields(args), "--json")...)
	if code != 0 {
		t.Fatalf("%s: exit %d, stderr %q", sim.Command, code, errOut)
	}
	var sum report.Summary
	if err := json.Unmarshal([]byte(out), &sum); err != nil {
		t.Fatal(err)
	}
	if sum.Scenario.Requests != sim.Requests || len(sum.Results) != len(sim.Results) || math.Abs(sum.Scenario.Load-sim.Load) > 1e-9 {
		t.Fatalf("simulate: %d requests, load %v, %d results; analyze: %d, %v, %d", sum.Scenario.Requests, sum.Scenario.Load, len(sum.Results),
			sim.Requests, sim.Load, len(sim.Results))
	}
	for i, r := range sum.Results {
		a := sim.Results[i]
		if r.Policy != a.Policy || r.Completed != a.Completed || r.Failed != a.Failed || math.Abs(r.HitRate-a.HitRate) > 1e-9 ||
			math.Abs(r.TTFT.Mean-a.TTFT.Mean) > 1e-6 || math.Abs(r.TTFT.P90-a.TTFT.P90) > 1e-6 {
			t.Errorf("%s: simulate measured hit rate %v, TTFT mean %v p90 %v; analyze %v, %v, %v",
				r.Policy, r.HitRate, r.TTFT.Mean, r.TTFT.P90, a.HitRate, a.TTFT.Mean, a.TTFT.P90)
		}
	}
}

// TestAnalyzeNoSharing: where no prompt repeats a prefix, analyze says prefix routing will not
// pay off through the cache, simulated or not, and the simulation finds no hit anywhere.
func TestAnalyzeNoSharing(t *testing.T) {
	for _, spec := range []string{"unique:n=300", "prefix-repetition:n=100,prefixes=100,prefix=16,suffix=200"} {
		t.Run(spec, func(t *testing.T) {
			const want = "prefix-aware routing will not pay off through the cache: no request repeats a prefix"
			got := analyzeForJSON(t, "--workload", spec, "--instances", "4")
			if got.Simulation == nil || !strings.HasPrefix(got.Verdict, want) || strings.Contains(got.Verdict, "prefix-aware routing pays off") {
				t.Fatalf("verdict %q (simulation %v), want it to start %q", got.Verdict, got.Simulation != nil, want)
			}
			for _, r := range got.Simulation.Results {
				if r.HitRate != 0 {
					t.Errorf("%s hit %v of prompt tokens, want 0", r.Policy, r.HitRate)
				}
			}
			if stats := analyzeForJSON(t, "--workload", spec); !strings.HasPrefix(stats.Verdict, want) {
				t.Errorf("without a fleet: verdict %q", stats.Verdict)
			}
		})
	}
}

// TestAnalyzeTraceSlices: on the first 200, 1,000 and 1,500 requests of the Mooncake
// conversation trace over 4 instances, prefix-aware routing halves the TTFT mean of
// least-request and round-robin (kvroute simulate: 1,332 against 2,423 and 2,650 ms on 200;
// 1,169 against 2,415 and 2,751 on 1,000); the verdict must say so, on every slice alike (it
// said "unlikely to pay off" on 200 and 1,000 and "likely" on 1,500, from hit-rate cut-offs).
func TestAnalyzeTraceSlices(t *testing.T) {
	const trace = "../../../shared/traces/mooncake/conversation_trace.jsonl"
	fh, err := os.Open(trace)
	if err != nil {
		t.Skipf("trace not available: %v", err)
	}
	var lines []string
	sc := bufio.NewScanner(fh)
	sc.Buffer(nil, 1<<20)
	for len(lines) < 1500 && sc.Scan() {
		lines = append(lines, sc.Text())
	}
	fh.Close()
	if err := sc.Err(); err != nil || len(lines) < 1500 {
		t.Fatalf("read %d lines of %s: %v", len(lines), trace, err)
	}
	for _, n := range []int{200, 1000, 1500} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			if n > 200 && testing.Short() {
				t.Skip("simulates a thousand requests or more")
			}
			path := writeTempFile(t, fmt.Sprintf("h%d.jsonl", n), strings.Join(lines[:n], "\n")+"\n")
			got := analyzeForJSON(t, path, "--instances", "4")
			if !strings.HasPrefix(got.Verdict, "prefix-aware routing pays off, simulated on 4 x llama3-70b-h200-tp8") ||
				strings.Contains(got.Verdict, "unlikely") || strings.Contains(got.Verdict, "should do about as well") {
				t.Errorf("verdict %q", got.Verdict)
			}
			sim := got.Simulation
			if sim == nil || sim.Requests != n || len(sim.Results) != 3 {
				t.Fatalf("simulation %+v", sim)
			}
			pa, lr, rr := sim.Results[0], sim.Results[1], sim.Results[2]
			if !(pa.TTFT.Mean < lr.TTFT.Mean && pa.TTFT.Mean < rr.TTFT.Mean && pa.TTFT.P90 < lr.TTFT.P90 && pa.HitRate > lr.HitRate) {
				t.Errorf("prefix-aware %+v, least-request %+v, round-robin %+v: want prefix-aware ahead", pa, lr, rr)
			}
			if n == 200 {
				checkSimulateAgrees(t, sim)
			}
		})
	}
}

func TestAnalyzeWorkload(t *testing.T) {
	code, out, errOut := runAnalyzeForTest(t, "", "--workload", "shared-prefix:groups=2,prompts=4", "--seed", "3")
	if code != 0 || !strings.Contains(out, "source          shared-prefix:groups=2,prompts=4 (generated)") ||
		!strings.Contains(out, "requests        8 over") {
		t.Errorf("exit %d, stderr %q, output:\n%s", code, errOut, out)
	}
}

func TestAnalyzeBadInput(t *testing.T) {
	bad := writeTempFile(t, "trace.jsonl", analyzeTrace+`{"timestamp": 3000, "input_length": -5, "output_length": 1, "hash_ids": []}`+"\n")
	tests := []struct {
		name  string
		stdin string
		args  []string
		code  int
		want  string
	}{
		{"bad line", "", []string{bad}, 2, "line 4: field input_length: -5"},
		{"bad json on stdin", "{", []string{"-"}, 2, "standard input: line 1: invalid JSON"},
		{"missing file", "", []string{filepath.Join(t.TempDir(), "none.jsonl")}, 2, "open trace"},
		// --workload is the other way: said too.
		{"no file", "", nil, 2, "kvroute analyze: give a trace FILE (- for standard input) or --workload NAME\n"},
		{"two files", "", []string{"a", "b"}, 2, `kvroute analyze: want one trace FILE (- for standard input), got 2: ["a" "b"]` + "\n"},
		{"file and workload", "", []string{"a", "--workload", "multi-turn"}, 2, "not both"},
		{"file and --trace", "", []string{"a", "--trace", "b"}, 2, "as FILE or as --trace FILE, not both"},
		{"--trace and workload", "", []string{"--trace", "a", "--workload", "multi-turn"}, 2, "--trace or --workload, not both"},
		{"missing --trace file", "", []string{"--trace", filepath.Join(t.TempDir(), "none.jsonl")}, 2, "open trace"},
		{"unknown flag", "", []string{"--colour", "x"}, 2, "flag provided but not defined"},
		{"bad instances", "", []string{"--instances", "0", "x"}, 2, "--instances 0: want 1 to 10000"},
		{"too many instances", "", []string{"--instances", "9223372036854775807", "x"}, 2, "--instances 9223372036854775807: want 1 to 10000"},
		{"bad profile", "", []string{"--profile", "nope", "x"}, 2, `--profile: engine: unknown profile "nope"`},
		{"bad format", "", []string{"--format", "csv", "x"}, 2, `--format "csv": unknown, want mooncake`},
		{"format to convert", "", []string{"--format", "sharegpt", "x"}, 2, "--format sharegpt: analyze reads Mooncake traces only: convert it first with kvroute trace convert --from sharegpt FILE > trace.jsonl"},
		{"bad workload", "", []string{"--workload", "nope"}, 2, `--workload: workload "nope": unknown name`},
		{"negative sim limit", "", []string{"--instances", "2", "--sim-limit", "-1", "x"}, 2, "--sim-limit -1: want 0 (all requests) or more"},
		{"sim limit without a fleet", "", []string{"--sim-limit", "10", "x"}, 2, "--sim-limit: only with --instances N"},
		{"sim limit, no simulation", "", []string{"--instances", "2", "--sim-limit", "10", "--no-simulate", "x"}, 2, "--sim-limit: nothing is simulated with --no-simulate"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out, errOut := runAnalyzeForTest(t, tt.stdin, tt.args...)
			if code != tt.code || !strings.Contains(errOut, tt.want) || out != "" {
				t.Errorf("exit %d (want %d), stderr %q (want %q), stdout %q", code, tt.code, errOut, tt.want, out)
			}
			if strings.Count(errOut, "\n") != 1 {
				t.Errorf("stderr is not one line: %q", errOut)
			}
		})
	}
}

func TestAnalyzeHelp(t *testing.T) {
	code, out, _ := runAnalyzeForTest(t, "", "-h")
	if code != 0 || !strings.Contains(out, "usage: kvroute analyze") || !strings.Contains(out, "-instances") || !strings.Contains(out, "multi-turn:") {
		t.Errorf("exit %d, help:\n%s", code, out)
	}
}

// TestAnalyzeInstancesHelp: -h says that --instances left out runs no simulation. It showed
// "(default 8)", yet analyze without --instances simulated nothing and with --instances 8 did;
// and --sim-limit without --instances says how to have a simulation.
func TestAnalyzeInstancesHelp(t *testing.T) {
	_, out, _ := runAnalyzeForTest(t, "", "-h")
	_, entry, _ := strings.Cut(out, "\n  -instances")
	entry, _, _ = strings.Cut(entry, "\n  -")
	if !strings.HasPrefix(entry, " N\n") || strings.Contains(entry, "(default") || !strings.Contains(entry, "simulate on a fleet of N instances (off unless given)") ||
		!strings.Contains(entry, "left out: no simulation, and the bounds assume 8 instances") {
		t.Errorf("-h on --instances:%s", entry)
	}

	file := writeTempFile(t, "trace.jsonl", analyzeTrace)
	// Left out: the bounds over 8 instances, no simulation; given as 8: the same bounds, simulated.
	code, out, errOut := runAnalyzeForTest(t, "", file)
	if code != 0 || !strings.Contains(out, "random over 8 instances") || !strings.Contains(out, "simulated       nothing: no fleet given (--instances N)") {
		t.Errorf("no --instances: exit %d, stderr %q, output:\n%s", code, errOut, out)
	}
	code, out, errOut = runAnalyzeForTest(t, "", file, "--instances", "8")
	if code != 0 || !strings.Contains(out, "random over 8 instances") || !strings.Contains(out, "on 8 x llama3-70b-h200-tp8") {
		t.Errorf("--instances 8: exit %d, stderr %q, output:\n%s", code, errOut, out)
	}
	code, out, errOut = runAnalyzeForTest(t, "", file, "--sim-limit", "0")
	if want := "kvroute analyze: --sim-limit: only with --instances N, the fleet to simulate (without it analyze simulates nothing; add --instances 8 for the fleet the bounds assume)\n"; code != 2 || out != "" || errOut != want {
		t.Errorf("--sim-limit 0 alone: exit %d, stderr %q; want 2 and %q", code, errOut, want)
	}
}

func TestAnalyzeRealTrace(t *testing.T) {
	path := "../../../shared/traces/mooncake/conversation_trace.jsonl"
	if _, err := os.Stat(path); err != nil {
		t.Skipf("trace not available: %v", err)
	}
	code, out, errOut := runAnalyzeForTest(t, "", path)
	if code != 0 {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	for _, want := range []string{"12,031 over 3,537 s (3.40 requests/s)", "p50 6,909  p90 27,367  p99 85,399", "182,790 distinct", "unbounded cache 0.374",
		"so placement can add at most 25.4 points of hit rate to it", "simulated       nothing: no fleet given (--instances N)",
		"kvroute simulate --trace " + path + " --instances N"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

// TestMeasuredVerdict: the verdict follows the measured TTFT of prefix-aware against the better
// prefix-blind policy, quotes both figures and how far apart they are, and says where a gain
// comes from.
func TestMeasuredVerdict(t *testing.T) {
	run := func(policy string, hit, mean, p90 float64) analyzeRun {
		return analyzeRun{Policy: policy, Completed: 100, HitRate: hit, TTFT: report.Latency{Mean: mean, P90: p90}}
	}
	reuse := workload.Stats{Requests: 100, RepeatBeyondCommon: 0.3}
	none := workload.Stats{Requests: 100, Verdict: "prefix-aware routing will not pay off through the cache: no request repeats a prefix, so where a request goes does not change its cache hits."}
	tests := []struct {
		name  string
		stats workload.Stats
		runs  []analyzeRun
		of    int
		want  []string
	}{
		{"pays off", reuse, []analyzeRun{run("prefix-aware", 0.2, 1000, 2000), run("least-request", 0.1, 2000, 6000), run("round-robin", 0.1, 2500, 8000)}, 100, []string{
			"prefix-aware routing pays off, simulated on 4 x p at load 0.60: TTFT mean 1,000 ms against 2,000 ms with least-request (50% lower) and p90 2,000 against 6,000 ms (67% lower); its hit rate 0.200 against 0.100.",
		}},
		// The better prefix-blind policy by TTFT mean is the one to beat, whichever it is.
		{"does not pay off", reuse, []analyzeRun{run("prefix-aware", 0.2, 1200, 3000), run("least-request", 0.1, 1300, 2000), run("round-robin", 0.1, 1100, 2500)}, 400, []string{
			"prefix-aware routing does not pay off, simulated on 4 x p at load 0.60 over the first 100 of 400 requests: TTFT mean 1,200 ms against 1,100 ms with round-robin (9.1% higher) and p90 3,000 against 2,500 ms (20% higher)",
		}},
		{"about as well", reuse, []analyzeRun{run("prefix-aware", 0.1, 1030, 1990), run("least-request", 0.1, 1000, 2000), run("round-robin", 0.1, 1100, 2100)}, 100, []string{
			"prefix-aware routing does about as well as least-request, simulated on 4 x p at load 0.60 (both TTFT figures within 5%): TTFT mean 1,030 ms against 1,000 ms with least-request (3.0% higher) and p90 1,990 against 2,000 ms (0.5% lower).",
		}},
		{"close to the line", reuse, []analyzeRun{run("prefix-aware", 0.1, 951, 1000), run("least-request", 0.1, 1000, 1000), run("round-robin", 0.1, 1100, 1100)}, 100, []string{
			"does about as well as least-request", "(4.9% lower) and p90 1,000 against 1,000 ms (the same)",
		}},
		{"mixed", reuse, []analyzeRun{run("prefix-aware", 0.15, 800, 2400), run("least-request", 0.1, 1000, 2000), run("round-robin", 0.1, 1100, 2100)}, 100, []string{
			"prefix-aware routing gives a mixed result", "TTFT mean 800 ms against 1,000 ms with least-request (20% lower) and p90 2,400 against 2,000 ms (20% higher)", "its hit rate 0.150 against 0.100",
		}},
		{"no reuse, placement wins", none, []analyzeRun{run("prefix-aware", 0, 80, 150), run("least-request", 0, 98, 180), run("round-robin", 0, 90, 170)}, 100, []string{
			"prefix-aware routing will not pay off through the cache: no request repeats a prefix, so where a request goes does not change its cache hits; as a load balancer, prefix-aware routing pays off",
			"TTFT mean 80 ms against 90 ms with round-robin (11% lower)",
			"with the same hit rate (0.000) the difference comes from placing requests by predicted TTFT, not from the cache.",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sim := &analyzeSimulation{Requests: 100, Of: tt.of, Instances: 4, Profile: "p", Load: 0.6, Results: tt.runs}
			got := measuredVerdict(tt.stats, sim)
			for _, w := range tt.want {
				if !strings.Contains(got, w) {
					t.Errorf("verdict %q lacks %q", got, w)
				}
			}
		})
	}
	// Failed requests are named.
	sim := &analyzeSimulation{Requests: 10, Of: 10, Instances: 2, Profile: "p", Results: []analyzeRun{
		run("prefix-aware", 0.2, 100, 200), {Policy: "least-request", Completed: 8, Failed: 2, TTFT: report.Latency{Mean: 300, P90: 600}}, run("round-robin", 0.1, 400, 800),
	}}
	if got := measuredVerdict(reuse, sim); !strings.Contains(got, "simulated on 2 x p:") || !strings.HasSuffix(got, "; requests failed: 2 under least-request.") {
		t.Errorf("verdict %q, want no load (undefined) and the failures", got)
	}
}
