package main

import (
	"bytes"
	"context"
	"encoding/json"
	"regexp"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/experiment"
)

// TestPlanSharedPrefix plans a small shared-prefix workload: every answer meets the SLO, the
// size below it does not, and prefix-aware needs no more instances than round-robin.
func TestPlanSharedPrefix(t *testing.T) {
	var out, errOut bytes.Buffer
	code := run(context.Background(), []string{"plan", "--workload", "shared-prefix:groups=20,prompts=10,system=4000,question=1000,output=64,rate=20",
		"--slo-ttft-p90", "500ms", "--max-instances", "16", "--policies", "prefix-aware,round-robin", "--json"}, &out, &errOut)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	var sum experiment.PlanSummary
	if err := json.Unmarshal(out.Bytes(), &sum); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	if len(sum.Results) != 2 || sum.Requests != 200 || sum.SLOP90MS != 500 {
		t.Fatalf("summary %+v", sum)
	}
	for _, r := range sum.Results {
		if r.Instances < 2 || r.At.TTFT.P90 > 500 || r.At.Failed != 0 {
			t.Errorf("%s: %d instances, p90 %.0f ms, %d failed; want at least 2 meeting the SLO", r.Policy, r.Instances, r.At.TTFT.P90, r.At.Failed)
		}
		if r.Below == nil || r.Below.TTFT.P90 <= 500 && r.Below.Failed == 0 {
			t.Errorf("%s: one instance fewer (%+v) meets the SLO too; want the fewest", r.Policy, r.Below)
		}
	}
	if pa, rr := sum.Results[0], sum.Results[1]; pa.Instances > rr.Instances {
		t.Errorf("prefix-aware needs %d instances, round-robin %d: want no more", pa.Instances, rr.Instances)
	}
	// The table says the same.
	out.Reset()
	if code := run(context.Background(), []string{"plan", "--workload", "shared-prefix:groups=20,prompts=10,system=4000,question=1000,output=64,rate=20",
		"--slo-ttft-p90", "500ms", "--max-instances", "16", "--policies", "prefix-aware,round-robin"}, &out, &errOut); code != 0 {
		t.Fatalf("table: exit %d", code)
	}
	if !strings.Contains(out.String(), "prefix-aware needs ") || !strings.Contains(out.String(), "SLO TTFT p90 <= 500ms") {
		t.Errorf("table:\n%s", out.String())
	}
}

func TestPlanBadInput(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--workload", "multi-turn"}, "--slo-ttft-p90"},
		{[]string{"--slo-ttft-p90", "1s"}, "exactly one of --trace FILE or --workload NAME"},
		{[]string{"--workload", "multi-turn", "--slo-ttft-p90", "1s", "--policies", "nope"}, "--policies"},
		{[]string{"--workload", "multi-turn", "--slo-ttft-p90", "1s", "--max-instances", "0"}, "--max-instances 0"},
		{[]string{"--workload", "multi-turn", "--slo-ttft-p90", "1s", "--max-instances", "10001"}, "--max-instances 10001: want 1 to 10000"},
		// Worded as bench, demo and simulate word it (before: "want a positive factor").
		{[]string{"--workload", "multi-turn", "--slo-ttft-p90", "1s", "--speedup", "-1"}, "kvroute plan: --speedup -1: want " + speedupRange + "\n"},
		{[]string{"--workload", "multi-turn", "--slo-ttft-p90", "1s", "--speedup", "0"}, "kvroute plan: --speedup 0: want " + speedupRange + "\n"},
		// Both ran: an infinite speedup put every arrival at 0, NaN passed "<= 0".
		{[]string{"--workload", "multi-turn", "--slo-ttft-p90", "1s", "--speedup", "Inf"}, "--speedup +Inf: want a positive finite factor, such as 2 (leave it out for 1)"},
		{[]string{"--workload", "multi-turn", "--slo-ttft-p90", "1s", "--speedup", "NaN"}, "--speedup NaN: want a positive finite factor"},
		{[]string{"--workload", "multi-turn", "--slo-ttft-p90", "1s", "--speedup", "fast"}, `--speedup "fast": want a positive finite factor`},
		{[]string{"--workload", "multi-turn", "--slo-ttft-p90", "2"}, `--slo-ttft-p90 "2": give a duration with its unit, like 2s or 500ms`},
		// Said as missing, before.
		{[]string{"--workload", "multi-turn", "--slo-ttft-p90", "-2s"}, "kvroute plan: --slo-ttft-p90 -2s: want a positive duration, like 2s\n"},
		{[]string{"--workload", "multi-turn", "--slo-ttft-p90=1s", "--slo-ttft-p50=fast"}, `--slo-ttft-p50 "fast": give a duration with its unit`},
	} {
		var out, errOut bytes.Buffer
		code := run(context.Background(), append([]string{"plan"}, tc.args...), &out, &errOut)
		if code != 2 || !strings.Contains(errOut.String(), tc.want) {
			t.Errorf("%q: exit %d, %q; want 2 and %q", tc.args, code, errOut.String(), tc.want)
		}
	}
}

// TestSpeedupSaidAlike: the verbs that take --speedup refuse a value below 0 in the same words,
// each on its own line with exit status 2 (plan's said "want a positive factor").
func TestSpeedupSaidAlike(t *testing.T) {
	for _, args := range [][]string{
		{"bench", "--target", "http://127.0.0.1:1"},
		{"demo"},
		{"simulate", "--workload", "multi-turn"},
		{"plan", "--workload", "multi-turn", "--slo-ttft-p90", "1s"},
	} {
		var out, errOut bytes.Buffer
		code := run(context.Background(), append(args, "--speedup", "-1"), &out, &errOut)
		if want := "kvroute " + args[0] + ": --speedup -1: want " + speedupRange + "\n"; code != 2 || errOut.String() != want {
			t.Errorf("%q: exit %d, %q; want 2 and %q", args, code, errOut.String(), want)
		}
	}
}

// TestPlanProgress: plan says on stderr what each simulation found as it ends, and each
// policy's answer; --quiet, nothing. Before, a plan of the Mooncake trace printed nothing for
// a minute and a half.
func TestPlanProgress(t *testing.T) {
	args := []string{"plan", "--workload", "shared-prefix:groups=4,prompts=4,system=2000,question=200,output=16,rate=20",
		"--slo-ttft-p90", "10s", "--max-instances", "4", "--policies", "round-robin"}
	var out, errOut bytes.Buffer
	if code := run(context.Background(), args, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	// 10 s is met by every size: 4, then 2, then 1 (the bisection), and round-robin needs 1.
	want := regexp.MustCompile(`^plan: round-robin on 4 instances: TTFT p90 [0-9.]+ ms, 0 failed: meets the SLO \([0-9]+s elapsed\)
plan: round-robin on 2 instances: TTFT p90 [0-9.]+ ms, 0 failed: meets the SLO \([0-9]+s elapsed\)
plan: round-robin on 1 instance: TTFT p90 [0-9.]+ ms, 0 failed: meets the SLO \([0-9]+s elapsed\)
plan: round-robin: 1 instance \(3 simulations\) \([0-9]+s elapsed\)
$`)
	if !want.MatchString(errOut.String()) {
		t.Errorf("progress:\n%s\nwant it to match:\n%s", errOut.String(), want)
	}
	out.Reset()
	errOut.Reset()
	if code := run(context.Background(), append(args, "--quiet"), &out, &errOut); code != 0 || errOut.Len() > 0 || !regexp.MustCompile(`(?m)^\s+round-robin\s+1\s`).MatchString(out.String()) {
		t.Errorf("--quiet: exit %d, stderr %q, stdout:\n%s\nwant 0, nothing on stderr, the plan", code, errOut.String(), out.String())
	}
}
