package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/internal/experiment"
	"github.com/kvroute/kvroute/internal/report"
)

// tinyDemo is a demo small enough for a unit test: 2 instances, 12 short requests per
// policy, at five times real speed.
var tinyDemo = []string{
	"--workload", "shared-prefix:groups=4,prompts=3,system=512,question=64,output=4,rate=40",
	"--instances", "2", "--time-scale", "0.2",
}

func TestDemoJSONAndReport(t *testing.T) {
	checkLeaks(t)
	html := filepath.Join(t.TempDir(), "demo.html")
	args := append([]string{"--policies", "round-robin,least-request", "--json", "--quiet", "--html", html}, tinyDemo...)
	code, out, errOut := runVerb("demo", args...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	// --quiet takes the progress away; the routers' warnings stay (a scrape of the simulated
	// engines' metrics that timed out on a loaded machine is one), each a line of its own.
	for line := range strings.Lines(errOut) {
		if !strings.Contains(line, "level=WARN") {
			t.Errorf("--quiet demo wrote to stderr: %q", line)
		}
	}
	var doc struct {
		Scenario report.Scenario
		Results  []report.Result
		Bench    []experiment.BenchExtra
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("bad JSON: %v\n%s", err, out)
	}
	var policies []string
	for _, r := range doc.Results {
		policies = append(policies, r.Policy)
		if r.Completed != 12 || r.Failed != 0 {
			t.Errorf("%s: completed %d failed %d, want 12 and 0", r.Policy, r.Completed, r.Failed)
		}
		if got := r.InstanceRequests[0] + r.InstanceRequests[1]; len(r.InstanceRequests) != 2 || got != 12 {
			t.Errorf("%s: per-instance requests %v, want 2 instances summing to 12", r.Policy, r.InstanceRequests)
		}
		if r.HitRate <= 0 || r.HitRate >= 1 || r.TTFT.P50 <= 0 || r.LoadImbalance < 1 {
			t.Errorf("%s: hit rate %v, TTFT p50 %v, imbalance %v: want a hit rate in (0,1), a TTFT and imbalance >= 1", r.Policy, r.HitRate, r.TTFT.P50, r.LoadImbalance)
		}
	}
	if diff := cmp.Diff([]string{"round-robin", "least-request"}, policies); diff != "" {
		t.Errorf("policies (-want +got):\n%s", diff)
	}
	if doc.Scenario.Instances != 2 || doc.Scenario.Requests != 12 || len(doc.Bench) != 2 {
		t.Errorf("scenario %+v, %d bench entries", doc.Scenario, len(doc.Bench))
	}
	page, err := os.ReadFile(html)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(page), "least-request") || strings.Count(string(page), "<svg") != 4 {
		t.Error("report lacks the policies or the four charts")
	}
}

func TestDemoTable(t *testing.T) {
	checkLeaks(t)
	args := append([]string{"--policies", "round-robin", "--html", ""}, tinyDemo...)
	code, out, errOut := runVerb("demo", args...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{"hit rate", "round-robin", "imbalance", "2 x llama3-70b-h200-tp8"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if !strings.Contains(errOut, "round-robin: 12/12 requests") {
		t.Errorf("progress %q lacks the final line", errOut)
	}
}

func TestDemoErrors(t *testing.T) {
	tests := []struct {
		name     string
		args     []string
		contains []string
	}{
		{"unknown policy", []string{"--policies", "round-robin,nope"}, []string{`"nope"`, "prefix-aware"}},
		{"no instances", []string{"--instances", "0"}, []string{"--instances 0"}},
		{"bad time scale", []string{"--time-scale", "-1"}, []string{"--time-scale"}},
		{"bad profile", []string{"--profile", "tpu-9"}, []string{"--profile"}},
		// 0 is the default of both (1; 2, or 1 with --quick): given, it is a mistake.
		{"zero speedup", []string{"--speedup", "0"}, []string{"--speedup 0: want a positive finite factor"}},
		{"zero time scale", []string{"--time-scale", "0"}, []string{"--time-scale 0: want a factor above 0 up to 100"}},
		// A NaN time scale started the fleet and failed there, exit 1; an infinite speedup ran.
		{"NaN time scale", []string{"--time-scale", "NaN"}, []string{"--time-scale NaN: want a factor above 0 up to 100"}},
		{"infinite speedup", []string{"--speedup", "Inf"}, []string{"--speedup +Inf: want a positive finite factor"}},
		{"trace and workload", []string{"--trace", "x.jsonl", "--workload", "shared-prefix"}, []string{"not both"}},
		// Said as "--speedup and --requests must not be negative", and "want a factor above 0"
		// without the bound that refused it.
		{"negative requests", []string{"--requests", "-1"}, []string{"kvroute demo: --requests -1: want 0 (all) or more\n"}},
		{"time scale too large", []string{"--time-scale", "1000"}, []string{"kvroute demo: --time-scale 1000: want a factor above 0 up to 100 (1: real time, 0.5: twice as fast)\n"}},
		{"bad workload", []string{"--workload", "zipf"}, []string{"--workload"}},
		// Checked before the run (which, if it started, is one short policy).
		{"unwritable html", []string{"--quick", "--requests", "2", "--policies", "round-robin", "--quiet", "--html", filepath.Join(t.TempDir(), "no", "report.html")}, []string{"--html: ", "no such file"}},
		{"html is a directory", []string{"--quick", "--requests", "2", "--policies", "round-robin", "--quiet", "--html", t.TempDir()}, []string{"--html: ", "is a directory"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, _, errOut := runVerb("demo", tt.args...)
			if code != 2 {
				t.Errorf("exit %d, want 2 (%s)", code, errOut)
			}
			for _, c := range tt.contains {
				if !strings.Contains(errOut, c) {
					t.Errorf("stderr %q lacks %q", errOut, c)
				}
			}
		})
	}
}

func TestDemoCompareSimulate(t *testing.T) {
	checkLeaks(t)
	args := append([]string{"--policies", "round-robin", "--json", "--quiet", "--html", "", "--compare-simulate"}, tinyDemo...)
	code, out, errOut := runVerb("demo", args...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var doc struct {
		Results  []report.Result
		Fidelity *experiment.Fidelity
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("bad JSON: %v\n%s", err, out)
	}
	if doc.Fidelity == nil || len(doc.Fidelity.Policies) != 1 {
		t.Fatalf("fidelity %+v: want one policy", doc.Fidelity)
	}
	p := doc.Fidelity.Policies[0]
	if p.Policy != "round-robin" || p.LiveHitRate != doc.Results[0].HitRate || p.SimHitRate <= 0 || p.SimTTFTP50 <= 0 {
		t.Errorf("fidelity entry %+v does not hold the live and simulated figures", p)
	}
	if d := p.LiveHitRate - p.SimHitRate; d != p.HitRateDelta {
		t.Errorf("hit-rate delta %v, want live - simulated = %v", p.HitRateDelta, d)
	}
	if r := p.LiveTTFTP50 / p.SimTTFTP50; r != p.TTFTP50Ratio || p.LiveTTFTP50 != doc.Results[0].TTFT.P50 {
		t.Errorf("TTFT p50 ratio %v, want live / simulated = %v", p.TTFTP50Ratio, r)
	}
	// A 12-request run is too small to hold the tolerances; the verdict must follow them.
	want := p.HitRateDelta <= experiment.FidelityHitAbs && p.HitRateDelta >= -experiment.FidelityHitAbs && p.TTFTP50Ratio <= 1+experiment.FidelityTTFTRel && p.TTFTP50Ratio >= 1-experiment.FidelityTTFTRel
	if p.Agree != want || doc.Fidelity.Agree != want {
		t.Errorf("agree %v (overall %v), want %v for %+v", p.Agree, doc.Fidelity.Agree, want, p)
	}
}

// TestDemoStopsRoutersAtOnce: a policy's router stops as soon as its run is over. Nothing
// balances over it, so server.drain_delay, which a router waits out at its stop once /readyz
// was asked (as the demo asks it, to know it is ready), is not for it: 5 s a policy before,
// a third of demo --quick's time.
func TestDemoStopsRoutersAtOnce(t *testing.T) {
	checkLeaks(t)
	args := append([]string{"--policies", "round-robin,least-request", "--json", "--quiet", "--html", ""}, tinyDemo...)
	start := time.Now()
	code, out, errOut := runVerb("demo", args...)
	took := time.Since(start).Seconds()
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var doc struct{ Results []report.Result }
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("bad JSON: %v\n%s", err, out)
	}
	runs := 0.0
	for _, r := range doc.Results {
		runs += r.WallSeconds
	}
	if len(doc.Results) != 2 || took-runs > 4 {
		t.Errorf("the demo took %.1f s for %d policies whose runs took %.1f s: want the routers stopped at once (under 4 s more in all; a drain_delay is 5 s each)",
			took, len(doc.Results), runs)
	}
}

// cancelOnWrite is a standard error that cancels the run when a line with text is written
// to it, as Ctrl-C at that moment would.
type cancelOnWrite struct {
	mu     sync.Mutex
	buf    strings.Builder
	text   string
	cancel context.CancelFunc
}

func (w *cancelOnWrite) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if strings.Contains(string(p), w.text) {
		w.cancel()
	}
	return len(p), nil
}

// Ctrl-C during the second policy: the table and the JSON hold the first, which ran to the
// end, one line says where it stopped, and the exit status is 130. Before, the demo printed
// "policy least-request: loadgen: run cancelled: context canceled" and exited 1, the policies
// already run lost.
func TestDemoInterruptKeepsFinishedPolicies(t *testing.T) {
	checkLeaks(t)
	for _, asJSON := range []bool{false, true} {
		// round-robin's last progress line: its run is over.
		code, out, stderr := interruptedDemo(asJSON, "round-robin: 12/12 requests", "--policies", "round-robin,least-request,prefix-aware")
		if want := "kvroute demo: interrupted during policy least-request: the report holds the 1 before it\n"; code != 130 || !strings.HasSuffix(stderr, want) {
			t.Errorf("json %v: exit %d, stderr %q; want 130 and to end with %q", asJSON, code, stderr, want)
		}
		if !asJSON {
			if !regexp.MustCompile(`(?m)^\s+round-robin\s`).MatchString(out.String()) || strings.Contains(out.String(), "least-request") {
				t.Errorf("table does not hold round-robin alone:\n%s", out.String())
			}
			continue
		}
		var doc struct {
			Results           []report.Result
			InterruptedDuring string `json:"interrupted_during"`
		}
		if err := json.Unmarshal([]byte(out.String()), &doc); err != nil {
			t.Fatalf("bad JSON: %v\n%s", err, out.String())
		}
		if len(doc.Results) != 1 || doc.Results[0].Policy != "round-robin" || doc.Results[0].Completed != 12 || doc.InterruptedDuring != "least-request" {
			t.Errorf("results %+v, interrupted during %q: want round-robin's 12 requests, and least-request", doc.Results, doc.InterruptedDuring)
		}
	}
}

// interruptedDemo runs the tiny demo with args (and --json where asJSON, no page) and cancels
// it as the progress writes at: its exit status, standard output and standard error.
func interruptedDemo(asJSON bool, at string, args ...string) (int, *strings.Builder, string) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errOut := &cancelOnWrite{text: at, cancel: cancel}
	args = append(append(args, "--html", ""), tinyDemo...)
	if asJSON {
		args = append(args, "--json")
	}
	out := new(strings.Builder)
	code := demoMain(ctx, args, strings.NewReader(""), out, errOut)
	return code, out, errOut.buf.String()
}

// Ctrl-C during --compare-simulate, once every policy has run live: the report holds the live
// runs, uncompared, and says so; exit 130. Before, the demo printed "simulate round-robin:
// ...: context canceled" and nothing else, the live runs it had measured lost.
func TestDemoInterruptDuringComparisonKeepsLiveRuns(t *testing.T) {
	checkLeaks(t)
	for _, asJSON := range []bool{false, true} {
		// The last policy's last progress line: its live run is over, the comparison next.
		code, out, stderr := interruptedDemo(asJSON, "round-robin: 12/12 requests", "--policies", "round-robin", "--compare-simulate")
		if want := "kvroute demo: interrupted during --compare-simulate: the report holds the live runs of all 1 policies, not compared\n"; code != 130 || !strings.HasSuffix(stderr, want) {
			t.Errorf("json %v: exit %d, stderr %q; want 130 and to end with %q", asJSON, code, stderr, want)
		}
		if !asJSON {
			if !regexp.MustCompile(`(?m)^\s+round-robin\s`).MatchString(out.String()) || strings.Contains(out.String(), "live (HTTP, model time) vs kvroute simulate") {
				t.Errorf("table does not hold round-robin's live run alone:\n%s", out.String())
			}
			continue
		}
		var doc struct {
			Results           []report.Result
			Fidelity          any    `json:"fidelity"`
			InterruptedDuring string `json:"interrupted_during"`
		}
		if err := json.Unmarshal([]byte(out.String()), &doc); err != nil {
			t.Fatalf("bad JSON: %v\n%s", err, out.String())
		}
		if len(doc.Results) != 1 || doc.Results[0].Completed != 12 || doc.Fidelity != nil || doc.InterruptedDuring != "compare-simulate" {
			t.Errorf("results %+v, fidelity %v, interrupted during %q: want round-robin's 12 requests, no fidelity, and compare-simulate", doc.Results, doc.Fidelity, doc.InterruptedDuring)
		}
	}
}
