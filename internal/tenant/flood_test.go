package tenant

import (
	"context"
	"net/http"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/des"
	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/workload"
)

// TestFloodVirtualTime measures, in virtual time (package des: the router's policy and the
// engine model, no wall clock, so the figures do not depend on the machine), whether a tenant
// flooding at ten times its requests-per-minute limit raises a well-behaved tenant's TTFT p99.
// Every arrival goes through the real gate (its clock set to the arrival's virtual time);
// what the gate refuses never reaches an engine, the rest is simulated on two Llama 3.1 8B
// H100 engines behind the prefix-aware policy. The good tenant sends 10 requests/s (450
// shared + 500 own prompt tokens, 16 out); the flooder, limited to 120 requests/min, sends
// 4,000-token prompts (64 out) at 2/s (its limit) or 20/s. Two virtual minutes; the second
// is measured (the flooder's bucket is empty by then in both cases).
func TestFloodVirtualTime(t *testing.T) {
	prof, err := engine.LookupProfile("llama3-8b-h100-tp1")
	if err != nil {
		t.Fatal(err)
	}
	const (
		span     = 2 * time.Minute
		measured = time.Minute // arrivals from here on count
		blockTok = 16
	)
	// build makes n requests of promptTokens (the first sharedTokens shared by all, ids from
	// base) with Poisson arrivals at rate.
	nextID := uint64(1 << 20)
	build := func(rate float64, shared, own, out int, seed uint64) []workload.Request {
		n := int(rate * span.Seconds())
		reqs := make([]workload.Request, n)
		for i := range reqs {
			var blocks []uint64
			for b := range shared / blockTok {
				blocks = append(blocks, uint64(b+1))
			}
			for range own / blockTok {
				nextID++
				blocks = append(blocks, nextID)
			}
			reqs[i] = workload.Request{Blocks: blocks, BlockTokens: blockTok, PromptTokens: shared + own, OutputTokens: out}
		}
		return workload.Poisson(reqs, rate, seed)
	}
	run := func(floodRate float64) (p50, p99 time.Duration, admitted, refused int) {
		g, clk := newTestGate(t, "tenants:\n"+
			"  - {name: good, api_keys: [\""+HashKey("kg")+"\"], limits: {requests_per_minute: 6000}}\n"+
			"  - {name: flood, api_keys: [\""+HashKey("kf")+"\"], limits: {requests_per_minute: 120}}\n", nil)
		start := clk.Now()
		pass := middleware(g, http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
		type arrival struct {
			req  workload.Request
			good bool
		}
		var all []arrival
		for _, r := range build(10, 448, 496, 16, 1) {
			all = append(all, arrival{r, true})
		}
		if floodRate > 0 {
			for _, r := range build(floodRate, 0, 4000, 64, 2) {
				all = append(all, arrival{r, false})
			}
		}
		slices.SortStableFunc(all, func(a, b arrival) int { return int(a.req.Arrival - b.req.Arrival) })
		var reqs []workload.Request
		var good []bool
		for _, a := range all {
			key := "kf"
			if a.good {
				key = "kg"
			}
			clk.mu.Lock()
			clk.t = start.Add(a.req.Arrival)
			clk.mu.Unlock()
			if w := do(pass, map[string]string{"Authorization": "Bearer " + key}, `{}`); w.Code != http.StatusOK {
				refused++
				continue
			}
			if !a.good {
				admitted++
			}
			a.req.ID = len(reqs)
			reqs = append(reqs, a.req)
			good = append(good, a.good)
		}
		fleet := des.ProfileFleet(prof, 2)
		res, err := des.Run(context.Background(), fleet, des.Prepare(reqs, fleet.Model, fleet.BlockSize), "prefix-aware", des.Named("prefix-aware", nil))
		if err != nil {
			t.Fatal(err)
		}
		var ttfts []time.Duration
		for i, rec := range res.Records {
			if good[i] && rec.Arrival >= measured {
				if !rec.OK() || rec.FirstToken == 0 {
					t.Fatalf("good request %d failed: %s", i, rec.Err)
				}
				ttfts = append(ttfts, rec.FirstToken-rec.Arrival)
			}
		}
		slices.Sort(ttfts)
		return ttfts[len(ttfts)/2], ttfts[int(float64(len(ttfts))*0.99)], admitted, refused
	}
	var p99s []time.Duration
	for _, c := range []struct {
		name string
		rate float64
	}{{"good alone", 0}, {"flooder at its limit", 2}, {"flooder at 10x limit", 20}} {
		p50, p99, adm, ref := run(c.rate)
		t.Logf("%-21s good TTFT p50 %6.1f ms p99 %6.1f ms; flooder admitted %d, refused %d (2 virtual minutes)",
			c.name, float64(p50.Microseconds())/1000, float64(p99.Microseconds())/1000, adm, ref)
		p99s = append(p99s, p99)
	}
	ratio := float64(p99s[2]) / float64(p99s[1])
	t.Logf("TTFT p99 ratio 10x / at limit: %s; 10x / alone: %s", strconv.FormatFloat(ratio, 'f', 2, 64),
		strconv.FormatFloat(float64(p99s[2])/float64(p99s[0]), 'f', 2, 64))
	if ratio > 1.2 {
		t.Errorf("flooding at 10x raised the good tenant's TTFT p99 by %.0f%% over the flooder at its limit; want at most 20%%", (ratio-1)*100)
	}
}
