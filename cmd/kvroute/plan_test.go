package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/report"
)

// TestPlanSearch: bisection finds the threshold of a monotone SLO, checks the size below it,
// runs each size once, and says when even the most instances miss.
func TestPlanSearch(t *testing.T) {
	for _, tc := range []struct {
		most, threshold, want int
	}{{64, 5, 5}, {64, 1, 1}, {64, 64, 64}, {8, 9, 0}} {
		calls := map[int]int{}
		at := func(n int) (*report.Result, error) {
			calls[n]++
			return &report.Result{Completed: n, TTFT: report.Latency{P90: float64(100 - n)}}, nil
		}
		meets := func(r *report.Result) bool { return r.Completed >= tc.threshold }
		got, err := search(tc.most, at, meets)
		if err != nil {
			t.Fatal(err)
		}
		if got.Instances != tc.want {
			t.Errorf("threshold %d of %d: %d instances, want %d", tc.threshold, tc.most, got.Instances, tc.want)
		}
		for n, c := range calls {
			if c > 1 {
				t.Errorf("threshold %d: size %d simulated %d times", tc.threshold, n, c)
			}
		}
		switch {
		case tc.want == 0:
			if got.At == nil || got.At.Completed != tc.most || got.Below != nil {
				t.Errorf("not met: at %+v below %+v; want the result at %d and nothing below", got.At, got.Below, tc.most)
			}
		case tc.want > 1:
			if got.Below == nil || got.Below.Completed != tc.want-1 {
				t.Errorf("threshold %d: below %+v, want the result at %d", tc.threshold, got.Below, tc.want-1)
			}
		}
		if len(calls) > 9 {
			t.Errorf("threshold %d: %d sizes simulated for %d candidates; want a bisection", tc.threshold, len(calls), tc.most)
		}
	}
	boom := errors.New("boom")
	if _, err := search(4, func(int) (*report.Result, error) { return nil, boom }, nil); !errors.Is(err, boom) {
		t.Errorf("a failed simulation: err %v, want it returned", err)
	}
}

// TestPlanSharedPrefix plans a small shared-prefix workload: every answer meets the SLO, the
// size below it does not, and prefix-aware needs no more instances than round-robin.
func TestPlanSharedPrefix(t *testing.T) {
	var out, errOut bytes.Buffer
	code := run(context.Background(), []string{"plan", "--workload", "shared-prefix:groups=20,prompts=10,system=4000,question=1000,output=64,rate=20",
		"--slo-ttft-p90", "500ms", "--max-instances", "16", "--policies", "prefix-aware,round-robin", "--json"}, &out, &errOut)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	var sum planSummary
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
		{[]string{"--workload", "multi-turn", "--slo-ttft-p90", "1s", "--speedup", "-1"}, "--speedup -1"},
	} {
		var out, errOut bytes.Buffer
		code := run(context.Background(), append([]string{"plan"}, tc.args...), &out, &errOut)
		if code != 2 || !strings.Contains(errOut.String(), tc.want) {
			t.Errorf("%q: exit %d, %q; want 2 and %q", tc.args, code, errOut.String(), tc.want)
		}
	}
}
