package des

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/policy"
	"github.com/kvroute/kvroute/internal/report"
	"github.com/kvroute/kvroute/internal/workload"
)

// smallProfile is a tiny engine whose single-request timings are easy to work out: 1 ms per
// step, 10 us per prefill token, nothing else, 4-token blocks.
func smallProfile() engine.Profile {
	return engine.Profile{
		Name: "small", BlockSize: 4, NumBlocks: 64, MaxNumSeqs: 8, MaxBatchedTokens: 64,
		StepOverhead: time.Millisecond, PrefillPerToken: 10 * time.Microsecond,
	}
}

func TestRealEngineSamePrefix(t *testing.T) {
	// Two engines, round-robin, three 20-token requests sharing the first 16 tokens (workload
	// blocks of 8 tokens: ids 1, 2 shared, then 3 or 4). Request 0 on sim-0 and request 1 on
	// sim-1 find nothing; request 2 on sim-0 finds request 0's 16 tokens.
	reqs := []workload.Request{
		{ID: 0, Arrival: 0, Blocks: []uint64{1, 2, 3}, BlockTokens: 8, PromptTokens: 20, OutputTokens: 3},
		{ID: 1, Arrival: ms(100), Blocks: []uint64{1, 2, 4}, BlockTokens: 8, PromptTokens: 20, OutputTokens: 3},
		{ID: 2, Arrival: ms(200), Blocks: []uint64{1, 2, 5}, BlockTokens: 8, PromptTokens: 20, OutputTokens: 3},
	}
	p := smallProfile()
	cfg := ProfileFleet(p, 2)
	res, err := Run(context.Background(), cfg, Prepare(reqs, cfg.Model, cfg.BlockSize), "round-robin", Named("round-robin", nil))
	if err != nil {
		t.Fatal(err)
	}
	// Prefill of 20 tokens: 1 ms + 0.2 ms; two decode steps of 1 ms. With 16 cached: 1.04 ms.
	want := []report.Record{
		{ID: "0", Policy: "round-robin", EndpointID: 0, Endpoint: "sim-0", Arrival: 0, FirstToken: ms(1.2), Finish: ms(3.2), PromptTokens: 20, OutputTokens: 3, Attempts: 1},
		{ID: "1", Policy: "round-robin", EndpointID: 1, Endpoint: "sim-1", Arrival: ms(100), FirstToken: ms(101.2), Finish: ms(103.2), PromptTokens: 20, OutputTokens: 3, Attempts: 1},
		{ID: "2", Policy: "round-robin", EndpointID: 0, Endpoint: "sim-0", Arrival: ms(200), FirstToken: ms(201.04), Finish: ms(203.04), PromptTokens: 20, CachedTokens: 16, OutputTokens: 3, Attempts: 1},
	}
	if diff := cmp.Diff(want, res.Records); diff != "" {
		t.Errorf("records (-want +got):\n%s", diff)
	}
	if got := p.UnloadedTTFT(20, 0); got != ms(1.2) {
		t.Errorf("UnloadedTTFT(20, 0) = %v, want 1.2ms (the hand computation above relies on it)", got)
	}
	sum := report.Summarize("round-robin", res.Records, res.Busy)
	if want := 16.0 / 60.0; sum.HitRate != want {
		t.Errorf("hit rate %v, want %v", sum.HitRate, want)
	}
}

func TestRealEngineOversizedRequestFails(t *testing.T) {
	// 64 blocks of 4 tokens: a 300-token prompt can never fit.
	reqs := []workload.Request{
		{ID: 0, Arrival: 0, Blocks: []uint64{1}, BlockTokens: 300, PromptTokens: 300, OutputTokens: 1},
		{ID: 1, Arrival: 0, Blocks: []uint64{2}, BlockTokens: 8, PromptTokens: 8, OutputTokens: 1},
	}
	cfg := ProfileFleet(smallProfile(), 1)
	res, err := Run(context.Background(), cfg, Prepare(reqs, cfg.Model, cfg.BlockSize), "rr", Named("round-robin", nil))
	if err != nil {
		t.Fatal(err)
	}
	if res.Records[0].Err == "" || res.Records[1].Err != "" || res.Records[1].FirstToken == 0 {
		t.Errorf("records %+v: want the first failed and the second completed", res.Records)
	}
}

func TestEveryPolicyIsDeterministic(t *testing.T) {
	// Every registered policy, on a small multi-prefix workload over three small engines: two
	// runs with the same seed give identical records. This catches map-order or wall-clock
	// dependence anywhere in a policy.
	reqs := make([]workload.Request, 120)
	for i := range reqs {
		g := uint64(i % 6)
		reqs[i] = workload.Request{
			ID: i, Arrival: time.Duration(i) * 3 * time.Millisecond,
			Blocks: []uint64{1, 10 + g, uint64(100 + i)}, BlockTokens: 8,
			PromptTokens: 20 + i%4, OutputTokens: 2 + i%5,
		}
	}
	cfg := ProfileFleet(smallProfile(), 3)
	cfg.ScrapeInterval = 5 * time.Millisecond
	cfg.Seed = 9
	w := Prepare(reqs, cfg.Model, cfg.BlockSize)
	for _, name := range policy.Names() {
		t.Run(name, func(t *testing.T) {
			var runs [2]*Result
			for k := range runs {
				res, err := Run(context.Background(), cfg, w, name, Named(name, nil))
				if err != nil {
					t.Fatal(err)
				}
				runs[k] = res
			}
			if diff := cmp.Diff(runs[0].Records, runs[1].Records); diff != "" {
				t.Errorf("two runs differ (-first +second):\n%s", diff)
			}
			for _, r := range runs[0].Records {
				if r.Err != "" {
					t.Errorf("request %s failed: %s", r.ID, r.Err)
				}
			}
		})
	}
}
