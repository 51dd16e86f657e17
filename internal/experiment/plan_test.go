package experiment

import (
	"errors"
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
