package policy

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/endpoint"
)

// TestPrefixAware_ScrapedTTFT checks that answers that come whole calibrate the fleet's speed
// from the engines' TTFT histograms: three times the prior model's prediction, scraped after
// each answer, makes the fleet three times slower than the prior; without the histogram, or
// with streamed answers only (which teach their own), it learns nothing from the scrape; a
// histogram that starts again (an engine restart) or windows in a stall teach nothing.
func TestPrefixAware_ScrapedTTFT(t *testing.T) {
	type run struct {
		name      string
		whole     bool
		histogram bool
		stall     bool // the engine stalls through every window
		reset     int  // the histogram starts again after this many answers (0: never)
		want      float64
	}
	for _, tc := range []run{
		{name: "whole", whole: true, histogram: true, want: 3},
		{name: "no histogram", whole: true, want: 1},
		{name: "streamed", histogram: true, want: 1},
		{name: "stalled", whole: true, histogram: true, stall: true, want: 1},
		{name: "restart", whole: true, histogram: true, reset: 20, want: 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pa, clk := newPA(t, Params{"affinity_window": "0"})
			eps := newEndpoints(2, 1<<20)
			s := pa.state(0)
			probe := req("probe", 0, seq(1, 4)...)
			var sum, count float64
			for i := range 40 {
				r := req(fmt.Sprintf("r%d", i), 0, seq(uint64(1000+i*1000), 100)...)
				r.Whole = tc.whole
				predicted := overhead + float64(pa.work(r, 0))/prefillRate
				eps[0].Start(r.PromptTokens)
				pa.Routed(r, eps[0])
				clk.t = clk.t.Add(10 * time.Second)
				if tc.stall {
					eps[0].Stalled(clk.t.Add(-5*time.Second).UnixNano(), clk.t.UnixNano())
				}
				if !tc.whole {
					// The router's own TTFT says the prior is right; the engine's says 3 x.
					eps[0].FirstToken(r.PromptTokens)
					pa.FirstToken(r, eps[0], time.Duration(predicted*float64(time.Second)))
				}
				eps[0].Finish(r.PromptTokens, true)
				pa.Done(r, eps[0], Result{OK: true, CachedTokens: -1, PromptTokens: r.PromptTokens, OutputTokens: 100})
				if i == tc.reset {
					sum, count = 0, 0
				}
				sum += 3 * predicted
				count++
				snap := &endpoint.Snapshot{At: clk.t}
				if tc.histogram {
					snap.TTFTSum, snap.TTFTCount = sum, count
				}
				eps[0].SetSnapshot(snap)
				mustPick(t, pa, probe, eps) // reads the scrape
			}
			if got := pa.fleet.get(); math.Abs(got/tc.want-1) > 0.01 {
				t.Errorf("the fleet's speed factor = %.3f, want %.3f", got, tc.want)
			}
			// The endpoint's own calibration is its streamed TTFTs' alone; it goes by the fleet's.
			if got := pa.speedOf(s, pa.fleet.get(), clk.t.UnixNano()); math.Abs(got/tc.want-1) > 0.01 {
				t.Errorf("endpoint 0's speed factor = %.3f, want %.3f", got, tc.want)
			}
		})
	}
}
