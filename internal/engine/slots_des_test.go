package engine_test

import (
	"context"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/des"
	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/policy"
	"github.com/kvroute/kvroute/internal/report"
	"github.com/kvroute/kvroute/internal/workload"
)

// The real-engine suite's 16-group workload (more prompt groups than the fleet's 12 slots) on
// three ollama-tiny-cpu engines behind prefix-aware, as in the suite: the engines say neither
// their capacity nor their hits, so the router learns each one's capacity from TTFTs. What an
// instance keeps is its last four sequences, at most 4 x 1,708 prompt tokens; the learned
// capacities come out near that, and the index's predictions come closer to what the engines
// reuse than with the slots' whole KV (24,192 tokens) configured. (The hit rate hardly moves:
// the real suite measured 0.393-0.429 learning against 0.434 without.)
func TestSlotEngineCapacityLearned(t *testing.T) {
	p, err := engine.LookupProfile("ollama-tiny-cpu")
	if err != nil {
		t.Fatal(err)
	}
	reqs, err := workload.Generate("shared-prefix:groups=16,prompts=6,system=1500,question=200,output=8,rate=1", 1)
	if err != nil {
		t.Fatal(err)
	}
	const keeps = 4 * 1708
	run := func(learn bool) (ratio float64, learned []int) {
		cfg := des.ProfileFleet(p, 3)
		cfg.NetworkLatency = 12 * time.Millisecond
		cfg.Seed = 1
		if learn {
			cfg.KVCapacityTokens, cfg.Opaque = 0, true
		}
		var pa policy.Picker
		res, err := des.Run(context.Background(), cfg, des.Prepare(reqs, cfg.Model, cfg.BlockSize), "prefix-aware",
			func(env policy.Env) (policy.Picker, error) {
				var err error
				pa, err = policy.New("prefix-aware", nil, env)
				return pa, err
			})
		if err != nil {
			t.Fatal(err)
		}
		var predicted, cached int
		for _, r := range res.Records {
			if r.Err != "" {
				t.Fatalf("request %s failed: %s", r.ID, r.Err)
			}
			predicted += r.PredictedCachedTokens
			cached += r.CachedTokens
		}
		l, ok := pa.(policy.CapacityLearner)
		if !ok {
			t.Fatal("prefix-aware does not implement policy.CapacityLearner")
		}
		for id := range cfg.Instances {
			learned = append(learned, l.LearnedKVTokens(id))
		}
		sum := report.Summarize("prefix-aware", res.Records, res.Busy)
		ratio = float64(predicted) / float64(cached)
		t.Logf("learning %v: hit rate %.3f, TTFT p50 %.0f ms, predicted %d cached tokens, engines reused %d (%.2f), learned %v tokens, requests per instance %v",
			learn, sum.HitRate, sum.TTFT.P50, predicted, cached, ratio, learned, sum.InstanceRequests)
		return ratio, learned
	}
	configured, _ := run(false)
	learnt, learned := run(true)
	for id, got := range learned {
		if got < keeps*6/10 || got > keeps*12/10 {
			t.Errorf("sim-%d: learned %d tokens, want 0.6..1.2 x the %d of four sequences", id, got, keeps)
		}
	}
	if learnt >= configured {
		t.Errorf("predicted/reused %.2f learning, %.2f with the whole KV configured: learning should come closer to 1", learnt, configured)
	}
}
