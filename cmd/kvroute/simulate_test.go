package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/internal/report"
	"github.com/kvroute/kvroute/internal/scorecard"
)

// writeSimulateTrace writes n Mooncake lines: every request starts with block 0, and requests
// in the same group of four share a second block.
func writeSimulateTrace(t *testing.T, n int) string {
	t.Helper()
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, `{"timestamp": %d, "input_length": %d, "output_length": %d, "hash_ids": [0, %d, %d]}`+"\n",
			i*50, 1100+i%7, 5+i%11, 1+i%4, 100+i)
	}
	return writeTempFile(t, "trace.jsonl", b.String())
}

func TestSimulateErrors(t *testing.T) {
	good := writeSimulateTrace(t, 3)
	bad := writeTempFile(t, "bad.jsonl", `{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}`+"\n{\"timestamp\": 1, \"input_length\": \"x\"}\n")
	tests := []struct {
		name     string
		args     []string
		code     int
		contains []string
	}{
		{"bad trace line", []string{"--trace", bad}, 2, []string{"line 2", "input_length"}},
		{"missing trace", []string{"--trace", filepath.Join(t.TempDir(), "none.jsonl")}, 2, []string{"none.jsonl"}},
		{"unknown policy", []string{"--trace", good, "--policies", "round-robin,nope"}, 2, []string{`"nope"`, "round-robin", "least-request"}},
		{"unknown profile", []string{"--trace", good, "--profile", "gpt-9"}, 2, []string{`"gpt-9"`, "llama3-70b-h200-tp8", "instant"}},
		{"zero instances", []string{"--trace", good, "--instances", "0"}, 2, []string{"--instances 0"}},
		{"negative instances", []string{"--trace", good, "--instances", "-3"}, 2, []string{"--instances -3"}},
		{"infinite speedup", []string{"--trace", good, "--speedup", "Inf"}, 2, []string{"--speedup +Inf: want a positive finite factor"}},
		{"too many instances", []string{"--trace", good, "--instances", "100000000"}, 2, []string{"--instances 100000000: want 1 to 10000"}},
		{"no workload", nil, 2, []string{"--trace"}},
		{"both load and speedup", []string{"--trace", good, "--load", "0.5", "--speedup", "2"}, 2, []string{"not both"}},
		// 0 means "not set" only when the flag is left out.
		{"zero speedup", []string{"--trace", good, "--speedup", "0"}, 2, []string{"--speedup 0: want a positive finite factor"}},
		{"zero load", []string{"--trace", good, "--load", "0"}, 2, []string{"--load 0: want a positive fraction"}},
		{"negative load", []string{"--trace", good, "--load", "-0.5"}, 2, []string{"--load -0.5: want a positive fraction"}},
		{"duration without unit", []string{"--trace", good, "--scrape-interval", "2"}, 2, []string{`--scrape-interval "2": give a duration with its unit, like 2s or 500ms`}},
		{"unknown workload", []string{"--workload", "nope"}, 2, []string{`"nope"`, "shared-prefix"}},
		{"trace and workload", []string{"--trace", good, "--workload", "shared-prefix"}, 2, []string{"exactly one"}},
		{"bad flag", []string{"--trace", good, "--instances", "many"}, 2, []string{"instances"}},
		// Output files are checked before the run, and all at once.
		{"unwritable records file", []string{"--trace", good, "--policies", "random", "--records", filepath.Join(t.TempDir(), "no", "such", "dir.jsonl")}, 2, []string{"--records"}},
		{"unwritable outputs", []string{"--trace", good, "--policies", "random", "--html", t.TempDir(), "--cpuprofile", filepath.Join(t.TempDir(), "no", "cpu.out")}, 2, []string{"--html: ", "is a directory", "--cpuprofile: "}},
		{"unwritable scorecard html", []string{"--scorecard", "--scenarios", "none", "--html", filepath.Join(t.TempDir(), "no", "card.html")}, 2, []string{"--html: "}},
		{"negative block size", []string{"--trace", good, "--block-size", "-16"}, 2, []string{"--block-size -16"}},
		{"bad policy parameter", []string{"--trace", good, "--policies", "round-robin:x=1"}, 2, []string{`"x"`}},
		{"zero routers", []string{"--trace", good, "--routers", "0"}, 2, []string{"--routers 0", "at least 1"}},
		{"negative routers", []string{"--trace", good, "--routers", "-2"}, 2, []string{"--routers -2", "at least 1"}},
		{"bad replica affinity", []string{"--trace", good, "--routers", "2", "--replica-affinity", "sticky"}, 2, []string{`"sticky"`, "session"}},
		{"bad kill", []string{"--trace", good, "--kill", "3"}, 2, []string{"--kill", "INSTANCE@TIME"}},
		{"bad add time", []string{"--trace", good, "--add", "1@soon"}, 2, []string{"--add", `"soon"`}},
		{"kill beyond the fleet", []string{"--trace", good, "--instances", "2", "--kill", "5@50%"}, 2, []string{"--kill 5@50%", "instance 5", "0 to 1 (--instances 2)"}},
		// Read by nothing without --scorecard: refused, not ignored.
		{"seeds without scorecard", []string{"--trace", good, "--seeds", "1-3"}, 2, []string{`--seeds "1-3": only with --scorecard`}},
		{"scenarios without scorecard", []string{"--trace", good, "--scenarios", "tool"}, 2, []string{`--scenarios "tool": only with --scorecard`}},
		{"quiet without scorecard", []string{"--trace", good, "--quiet"}, 2, []string{"--quiet: only with --scorecard"}},
		{"quick without scorecard", []string{"--trace", good, "--quick"}, 2, []string{"--quick: only with --scorecard"}},
		{"quick scorecard with seeds", []string{"--scorecard", "--quick", "--seeds", "1-3"}, 2, []string{"--seeds 1-3: --quick runs one seed: give it with --seed"}},
		// 10^11 replicas ran the process out of memory.
		{"too many routers", []string{"--trace", good, "--routers", "99999999999"}, 2, []string{"--routers 99999999999: want 1 to 1000"}},
		// No block fits the instance's KV cache: an engine config error, exit 1, before.
		{"block size above the cache", []string{"--trace", good, "--block-size", "3000000"}, 2, []string{"--block-size 3000000: more than the KV cache of a llama3-70b-h200-tp8 instance (2500000 tokens)"}},
		{"NaN sync loss", []string{"--trace", good, "--replica-sync", "1ms", "--replica-sync-loss", "NaN"}, 2, []string{"--replica-sync-loss NaN: want a probability from 0 to below 1"}},
		{"negative seed", []string{"--trace", good, "--seed", "-1"}, 2, []string{`--seed "-1": want a whole number from 0 to 18446744073709551615`}},
		{"recover from nothing", []string{"--trace", good, "--instances", "2", "--recover", "1@50%"}, 2, []string{"recover of instance 1", "no kill, fail, hang, cut or blind"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, stdout, stderr := runVerb("simulate", tt.args...)
			if code != tt.code {
				t.Errorf("exit %d, want %d (stderr %q)", code, tt.code, stderr)
			}
			if stdout != "" {
				t.Errorf("stdout %q, want nothing", stdout)
			}
			if strings.Count(stderr, "\n") != 1 || !strings.HasPrefix(stderr, "kvroute simulate: ") {
				t.Errorf("stderr %q, want one line starting with the command", stderr)
			}
			for _, s := range tt.contains {
				if !strings.Contains(stderr, s) {
					t.Errorf("stderr %q lacks %q", stderr, s)
				}
			}
		})
	}
}

// The scorecard runs for many minutes: it says at once which scenario it skips, and then
// how it goes, on stderr, unless --quiet; its report is the same either way.
func TestScorecardProgress(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "none.jsonl")
	args := []string{"--scorecard", "--scenarios", "mooncake", "--policies", "random", "--trace", missing}
	code, told, stderr := runVerb("simulate", args...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if want := "scorecard: mooncake conversation skipped: trace not found: " + missing; !strings.HasPrefix(stderr, want) || strings.Count(stderr, "\n") != 1 {
		t.Errorf("stderr %q, want one line that begins %q", stderr, want)
	}
	code, quiet, stderr := runVerb("simulate", append(args, "--quiet")...)
	if code != 0 || stderr != "" {
		t.Errorf("--quiet: exit %d, stderr %q; want 0 and nothing", code, stderr)
	}
	// The run's own time, on the last line, differs from run to run.
	cut := func(s string) string { return s[:strings.LastIndex(strings.TrimSuffix(s, "\n"), "\n")+1] }
	if diff := cmp.Diff(cut(quiet), cut(told)); diff != "" || !strings.Contains(told, "skipped") {
		t.Errorf("report with progress told (-quiet +told):\n%s", diff)
	}
}

// --quick reaches the scorecard: one cell per scenario, at load 0.7, on --seed, said quick.
func TestScorecardQuick(t *testing.T) {
	code, out, stderr := runVerb("simulate", "--scorecard", "--quick", "--scenarios", "no sharing", "--seed", "4",
		"--policies", "prefix-aware,least-request", "--json", "--quiet")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var sc scorecard.Scorecard
	if err := json.Unmarshal([]byte(out), &sc); err != nil {
		t.Fatal(err)
	}
	if !sc.Quick || len(sc.Cells) != 1 || sc.Cells[0].Load != scorecard.QuickLoad || sc.Cells[0].Seed != 4 || sc.Cells[0].Verdict == nil || !sc.Cells[0].Verdict.Quick {
		t.Errorf("quick %v, cells %+v; want one quick cell at load %g, seed 4, its verdict marked quick", sc.Quick, sc.Cells, scorecard.QuickLoad)
	}
}

func TestSimulateJSON(t *testing.T) {
	trace := writeSimulateTrace(t, 40)
	args := []string{"--trace", trace, "--instances", "2", "--profile", "llama3-8b-h100-tp1",
		"--policies", "round-robin,least-request", "--load", "0.5", "--seed", "7", "--json"}
	code, stdout, stderr := runVerb("simulate", args...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var s report.Summary
	if err := json.Unmarshal([]byte(stdout), &s); err != nil {
		t.Fatalf("stdout is not the JSON summary: %v\n%s", err, stdout)
	}
	sc := s.Scenario
	if sc.Workload != "trace.jsonl" || sc.Requests != 40 || sc.Instances != 2 || sc.Profile != "llama3-8b-h100-tp1" || sc.Seed != 7 || sc.BlockSize != 16 {
		t.Errorf("scenario %+v", sc)
	}
	// --load 0.5 is met by construction.
	if sc.Speedup <= 0 || sc.Load < 0.499 || sc.Load > 0.501 {
		t.Errorf("speedup %v load %v, want a positive speed-up giving load 0.5", sc.Speedup, sc.Load)
	}
	// 40 prompts of 1100 + i%7 tokens (44,115 in all) as three 512-token workload blocks: block
	// 0 shared by all, block 1+i%4 by a group of ten, the last one unique. One infinite cache
	// misses block 0 once and each group's block once: 39 + 36 hits of 512 tokens.
	if b, want := s.Bounds.InfiniteCacheHitRate, 38400.0/44115.0; math.Abs(b-want) > 1e-9 {
		t.Errorf("infinite-cache bound %v, want %v", b, want)
	}
	if s.Bounds.PooledLRUHitRate > s.Bounds.InfiniteCacheHitRate+1e-12 {
		t.Errorf("pooled LRU bound %v above the infinite one %v", s.Bounds.PooledLRUHitRate, s.Bounds.InfiniteCacheHitRate)
	}
	if len(s.Results) != 2 || s.Results[0].Policy != "round-robin" || s.Results[1].Policy != "least-request" {
		t.Fatalf("results %+v, want round-robin then least-request", s.Results)
	}
	for _, r := range s.Results {
		if r.Completed != 40 || r.Failed != 0 {
			t.Errorf("%s: completed %d failed %d, want 40 and 0", r.Policy, r.Completed, r.Failed)
		}
		if r.HitRate <= 0 || r.HitRate > s.Bounds.InfiniteCacheHitRate+1e-9 {
			t.Errorf("%s: hit rate %v, want in (0, bound %v]", r.Policy, r.HitRate, s.Bounds.InfiniteCacheHitRate)
		}
		if r.TTFT.P50 <= 0 || r.TTFT.P99 < r.TTFT.P50 || r.E2E.Mean < r.TTFT.Mean {
			t.Errorf("%s: implausible latencies ttft %+v e2e %+v", r.Policy, r.TTFT, r.E2E)
		}
		if len(r.InstanceBusyFraction) != 2 || r.LoadImbalance < 1 || r.ThroughputTokensPerS <= 0 {
			t.Errorf("%s: busy %v imbalance %v throughput %v", r.Policy, r.InstanceBusyFraction, r.LoadImbalance, r.ThroughputTokensPerS)
		}
	}

	// The same command twice gives the same JSON apart from wall_seconds.
	_, again, _ := runVerb("simulate", args...)
	var s2 report.Summary
	if err := json.Unmarshal([]byte(again), &s2); err != nil {
		t.Fatal(err)
	}
	for i := range s.Results {
		s.Results[i].WallSeconds, s2.Results[i].WallSeconds = 0, 0
	}
	if diff := cmp.Diff(s, s2); diff != "" {
		t.Errorf("second run differs (-first +second):\n%s", diff)
	}
}

func TestSimulateTable(t *testing.T) {
	recs := filepath.Join(t.TempDir(), "records.jsonl")
	html := filepath.Join(t.TempDir(), "report.html")
	code, stdout, stderr := runVerb("simulate", "--trace", writeSimulateTrace(t, 10), "--instances", "2", "--policies", "random,round-robin", "--limit", "6",
		"--records", recs, "--html", html)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, want := range []string{"6 requests", "2 x llama3-70b-h200-tp8", "hit rate", "  random ", "  round-robin "} {
		if !strings.Contains(stdout, want) {
			t.Errorf("table lacks %q:\n%s", want, stdout)
		}
	}
	// --records: six lines per policy, random's first.
	b, err := os.ReadFile(recs)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != 12 || !strings.Contains(lines[0], `"policy":"random"`) || !strings.Contains(lines[11], `"policy":"round-robin"`) {
		t.Errorf("records file: %d lines, want 12, random's first:\n%s", len(lines), b)
	}
	page, err := os.ReadFile(html)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"<html", "kvroute simulate: trace.jsonl", "round-robin", "<svg"} {
		if !strings.Contains(string(page), want) {
			t.Errorf("HTML report lacks %q", want)
		}
	}
}

func TestSimulateGeneratedWorkload(t *testing.T) {
	args := []string{"--workload", "prefix-repetition:n=60,prefixes=3", "--instances", "3", "--speedup", "2",
		"--policies", "round-robin", "--json"}
	code, stdout, stderr := runVerb("simulate", args...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var s report.Summary
	if err := json.Unmarshal([]byte(stdout), &s); err != nil {
		t.Fatal(err)
	}
	if s.Scenario.Requests != 60 || s.Scenario.Speedup != 2 || s.Scenario.Workload != "prefix-repetition:n=60,prefixes=3" {
		t.Errorf("scenario %+v", s.Scenario)
	}
	if r := s.Results[0]; r.Completed != 60 || r.HitRate <= 0 {
		t.Errorf("round-robin: completed %d hit rate %v, want 60 and some hits on 3 shared prefixes", r.Completed, r.HitRate)
	}
}

// A --load above 1 runs (an overload test is one), with a note on stderr that says what it
// offers and how a fraction is written: --load 80, meant as 80 %, ran 80 times over in silence.
func TestSimulateLoadAboveOne(t *testing.T) {
	args := []string{"--workload", "prefix-repetition:n=20,prefixes=2", "--instances", "2", "--policies", "round-robin", "--json"}
	for load, note := range map[string]string{
		"0.8": "",
		"1":   "",
		"80":  "kvroute simulate: note: --load 80 offers 80 times the fleet's prefill capacity, which only cache hits can serve (a fraction is written 0.8, not 80)\n",
	} {
		code, stdout, stderr := runVerb("simulate", append(args, "--load", load)...)
		var s report.Summary
		if code != 0 || stderr != note || json.Unmarshal([]byte(stdout), &s) != nil || s.Results[0].Completed != 20 {
			t.Errorf("--load %s: exit %d, stderr %q; want 0, %q and 20 requests completed", load, code, stderr, note)
		}
	}
}

// TestSimulateKillAndAdd: an instance killed at half time loses only what it held; an added
// one takes requests once it is there.
func TestSimulateKillAndAdd(t *testing.T) {
	args := []string{"--workload", "prefix-repetition:n=200,prefixes=4", "--instances", "4", "--load", "0.8",
		"--policies", "least-request", "--kill", "0@50%", "--add", "3@25%", "--json", "--records", filepath.Join(t.TempDir(), "r.jsonl")}
	code, stdout, stderr := runVerb("simulate", args...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var s report.Summary
	if err := json.Unmarshal([]byte(stdout), &s); err != nil {
		t.Fatal(err)
	}
	r := s.Results[0]
	if r.Completed+r.Failed != 200 || r.Completed < 150 {
		t.Errorf("completed %d failed %d of 200: only the requests on the killed instance may fail", r.Completed, r.Failed)
	}
}

func TestSimulateBlockSize(t *testing.T) {
	// 512-token blocks: the same trace, the same KV capacity, coarser blocks. The infinite-cache
	// bound is unchanged here since every shared block is a whole 512-token one.
	code, stdout, stderr := runVerb("simulate", "--trace", writeSimulateTrace(t, 40), "--instances", "2", "--block-size", "512",
		"--policies", "round-robin", "--speedup", "1", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var s report.Summary
	if err := json.Unmarshal([]byte(stdout), &s); err != nil {
		t.Fatal(err)
	}
	if s.Scenario.BlockSize != 512 || s.Results[0].Completed != 40 {
		t.Errorf("block size %d completed %d, want 512 and 40", s.Scenario.BlockSize, s.Results[0].Completed)
	}
	if b, want := s.Bounds.InfiniteCacheHitRate, 38400.0/44115.0; math.Abs(b-want) > 1e-9 {
		t.Errorf("infinite-cache bound %v, want %v", b, want)
	}
}

func TestSimulateRouters(t *testing.T) {
	trace := writeSimulateTrace(t, 40)
	sim := func(extra ...string) (report.Summary, map[string]any, string) {
		t.Helper()
		args := append([]string{"--trace", trace, "--instances", "2", "--profile", "llama3-8b-h100-tp1",
			"--policies", "prefix-aware,least-request", "--load", "0.9", "--seed", "7", "--json"}, extra...)
		code, stdout, stderr := runVerb("simulate", args...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", extra, code, stderr)
		}
		var s report.Summary
		var raw map[string]any
		if err := json.Unmarshal([]byte(stdout), &s); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal([]byte(stdout), &raw); err != nil {
			t.Fatal(err)
		}
		for i := range s.Results {
			s.Results[i].WallSeconds = 0
		}
		return s, raw, stdout
	}
	type fig struct {
		Policy            string
		Hit, Mean, P99    float64
		InstanceRequests  []int
		Completed, Failed int
	}
	figs := func(s report.Summary) []fig {
		var out []fig
		for _, r := range s.Results {
			out = append(out, fig{r.Policy, r.HitRate, r.TTFT.Mean, r.TTFT.P99, r.InstanceRequests, r.Completed, r.Failed})
		}
		return out
	}

	// One router is the simulator as it was before replicas: these figures are the output of
	// the same command at 5a1c7fa, and the JSON has no routers field.
	one, raw, _ := sim()
	old := []fig{
		{"prefix-aware", 0.858846197438513, 14.598167275000003, 37.59684778, []int{20, 20}, 40, 0},
		{"least-request", 0.858846197438513, 14.598167275000003, 37.59684778, []int{20, 20}, 40, 0},
	}
	if diff := cmp.Diff(old, figs(one)); diff != "" {
		t.Errorf("one router against 5a1c7fa (-old +now):\n%s", diff)
	}
	if _, ok := raw["scenario"].(map[string]any)["routers"]; ok {
		t.Errorf("one router: scenario %v has a routers field", raw["scenario"])
	}
	explicit, _, _ := sim("--routers", "1")
	if diff := cmp.Diff(one, explicit); diff != "" {
		t.Errorf("--routers 1 differs from the default (-default +explicit):\n%s", diff)
	}

	// Two routers: the scenario says so, everything completes, and least-request, which each
	// replica now runs on its own in-flight counts, places requests differently.
	two, raw, _ := sim("--routers", "2")
	sc := raw["scenario"].(map[string]any)
	if sc["routers"] != 2.0 || sc["replica_affinity"] != "none" || sc["requests"] != 40.0 {
		t.Errorf("two routers: scenario %v, want routers 2, replica_affinity none and the usual fields", sc)
	}
	for _, f := range figs(two) {
		if f.Completed != 40 || f.Failed != 0 {
			t.Errorf("two routers, %s: completed %d failed %d", f.Policy, f.Completed, f.Failed)
		}
	}
	if cmp.Equal(one.Results[1], two.Results[1]) {
		t.Errorf("least-request: two routers gave the same result as one: %+v", two.Results[1])
	}
	if diff := cmp.Diff(one.Bounds, two.Bounds); diff != "" {
		t.Errorf("bounds depend on the routers (-one +two):\n%s", diff)
	}

	// The table's header line names them.
	code, stdout, stderr := runVerb("simulate", "--trace", trace, "--instances", "2", "--policies", "round-robin", "--routers", "3", "--replica-affinity", "session")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if head, _, _ := strings.Cut(stdout, "\n"); !strings.HasPrefix(head, "workload trace.jsonl: 40 requests") || !strings.HasSuffix(head, ", 3 router replicas (by session key)") {
		t.Errorf("header line %q, want the scenario then the 3 router replicas", head)
	}
}

func TestSimulateMooncakeSample(t *testing.T) {
	const trace = "../../../shared/traces/mooncake/conversation_trace.jsonl"
	if _, err := os.Stat(trace); err != nil {
		t.Skip("Mooncake trace not present")
	}
	if testing.Short() {
		t.Skip("reads the whole trace")
	}
	code, stdout, stderr := runVerb("simulate", "--trace", trace, "--limit", "200", "--instances", "4",
		"--policies", "round-robin", "--load", "0.7", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var s report.Summary
	if err := json.Unmarshal([]byte(stdout), &s); err != nil {
		t.Fatal(err)
	}
	r := s.Results[0]
	if r.Completed+r.Failed != 200 || r.HitRate > s.Bounds.InfiniteCacheHitRate {
		t.Errorf("completed %d failed %d hit rate %v (bound %v)", r.Completed, r.Failed, r.HitRate, s.Bounds.InfiniteCacheHitRate)
	}
}

// TestSimulateFaultFlags: the fault flags reach the simulation: an instance cutting streams
// fails some requests until it is ejected, or until it recovers; a hung one, with a short first-token timeout, makes
// requests fail over (none fails); bad values are usage errors.
func TestSimulateFaultFlags(t *testing.T) {
	sim := func(extra ...string) report.Result {
		t.Helper()
		args := append([]string{"--workload", "prefix-repetition:n=200,prefixes=4", "--instances", "4", "--load", "0.5",
			"--policies", "round-robin", "--json"}, extra...)
		code, stdout, stderr := runVerb("simulate", args...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", extra, code, stderr)
		}
		var s report.Summary
		if err := json.Unmarshal([]byte(stdout), &s); err != nil {
			t.Fatal(err)
		}
		return s.Results[0]
	}
	if r := sim("--cut", "2@0%", "--cut-after", "2"); r.Failed != 3 {
		t.Errorf("--cut: failed %d, want 3 (the default passive_failures, then ejected)", r.Failed)
	}
	always := sim("--cut", "2@0%", "--cut-after", "2", "--passive-failures", "1000")
	recovered := sim("--cut", "2@0%", "--recover", "2@20%", "--cut-after", "2", "--passive-failures", "1000")
	if always.Failed < 30 || recovered.Failed > always.Failed/2 {
		t.Errorf("without ejection: %d failed cutting all along, %d with a recovery at 20 %%; want its share (50) and far fewer",
			always.Failed, recovered.Failed)
	}
	if r := sim("--hang", "1@0%", "--first-token-timeout", "1s"); r.Failed != 0 || r.TTFT.P99 < 1000 {
		t.Errorf("--hang: failed %d, TTFT p99 %v ms; want none failed and the slowest past the 1 s timeout", r.Failed, r.TTFT.P99)
	}
	// prefix-aware predicts TTFTs: a request the hung instance holds is given up as stalled
	// after limits.stall_timeout (10 s), not the first-token timeout (2 min).
	stalled := sim("--policies", "prefix-aware", "--hang", "1@20%")
	held := sim("--policies", "prefix-aware", "--hang", "1@20%", "--stall-timeout", "0")
	if stalled.Stalls == 0 || stalled.TTFT.P99 > 15000 || held.Stalls != 0 || held.TTFT.P99 < 120000 {
		t.Errorf("--hang with prefix-aware: %d stalls, TTFT p99 %v ms; with --stall-timeout 0 %d, %v ms; want some and under 15 s, then none and the 2 min timeout",
			stalled.Stalls, stalled.TTFT.P99, held.Stalls, held.TTFT.P99)
	}
	if code, _, stderr := runVerb("simulate", "--workload", "multi-turn", "--cut", "1@5%", "--cut-after", "0"); code != 2 || !strings.Contains(stderr, "--cut-after 0") {
		t.Errorf("--cut-after 0: exit %d %s, want a usage error", code, stderr)
	}
}
