package experiment

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

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

// BenchmarkPlan plans for least-request on a synthetic shared-prefix workload of a size table
// of requests arriving at 100 a second with short answers: the cost of Plan, its simulations
// and their garbage collection, as the workload grows (at a million requests it was once
// dominated by the collector).
func BenchmarkPlan(b *testing.B) {
	for _, n := range []int{10_000, 30_000} {
		b.Run(fmt.Sprintf("requests=%d", n), func(b *testing.B) {
			o := PlanOptions{
				Workload:     fmt.Sprintf("shared-prefix:n=%d,groups=64,prompts=%d,system=1024,question=64,output=16,rate=100", n, n/64+1),
				Profile:      "llama3-70b-h200-tp8",
				Policies:     "least-request",
				MaxInstances: 16,
				Speedup:      1,
				Seed:         1,
				P90:          2 * time.Second,
			}
			defer TuneGC()()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Plan(context.Background(), o); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
