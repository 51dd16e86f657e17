package des

import (
	"context"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/policy"
	"github.com/kvroute/kvroute/internal/report"
	"github.com/kvroute/kvroute/internal/workload"
)

// An engine that says neither its capacity nor its hits (Opaque, as ollama) and keeps about
// four of the workload's prompts, behind prefix-aware: with 16 prompt groups on 3 such engines
// the index's fallback (65,536 blocks) would hold every group everywhere and predict hits the
// engines no longer have. The policy learns each engine's capacity from its TTFTs, and its
// predictions come to match what the engines keep.
func TestOpaqueEngineCapacityLearned(t *testing.T) {
	p := engine.Profile{
		Name: "opaque", BlockSize: 16, NumBlocks: 480, MaxNumSeqs: 4, MaxBatchedTokens: 4096,
		StepOverhead: time.Millisecond, PrefillPerToken: 100 * time.Microsecond,
		DecodePerSeq: 100 * time.Microsecond,
	}
	reqs, err := workload.Generate("shared-prefix:groups=16,prompts=16,system=1500,question=200,output=8,rate=1", 1)
	if err != nil {
		t.Fatal(err)
	}
	cfg := ProfileFleet(p, 3)
	cfg.KVCapacityTokens = 0
	cfg.Opaque = true
	var pa policy.Picker
	res, err := Run(context.Background(), cfg, Prepare(reqs, cfg.Model, cfg.BlockSize), "prefix-aware",
		func(env policy.Env) (policy.Picker, error) {
			var err error
			pa, err = policy.New("prefix-aware", nil, env)
			return pa, err
		})
	if err != nil {
		t.Fatal(err)
	}
	// Predicted and engine-cached tokens over the second half, once the capacities are learned.
	var predicted, cached, prompt int
	half := res.Records[len(res.Records)/2:]
	for _, r := range half {
		if r.Err != "" {
			t.Fatalf("request %s failed: %s", r.ID, r.Err)
		}
		if !r.Predicted {
			t.Fatalf("request %s: no prediction", r.ID)
		}
		predicted += r.PredictedCachedTokens
		cached += r.CachedTokens
		prompt += r.PromptTokens
	}
	ratio := float64(predicted) / float64(cached)
	t.Logf("second half: predicted %d cached tokens, engines reused %d of %d prompt tokens (predicted/reused %.2f)",
		predicted, cached, prompt, ratio)
	// Without the learning (the fallback's index) it was 1.34; with the capacity configured, 1.01.
	if ratio < 0.8 || ratio > 1.2 {
		t.Errorf("predicted/reused %.2f, want 0.8..1.2", ratio)
	}
	l, ok := pa.(policy.CapacityLearner)
	if !ok {
		t.Fatal("prefix-aware does not implement policy.CapacityLearner")
	}
	for id := range 3 {
		got := l.LearnedKVTokens(id)
		t.Logf("sim-%d: learned %d tokens of %d", id, got, p.KVTokens())
		if got < p.KVTokens()*3/4 || got > p.KVTokens()*4/3 {
			t.Errorf("sim-%d: learned capacity %d tokens, want within 0.75..1.33 x the engine's %d", id, got, p.KVTokens())
		}
	}
	sum := report.Summarize("prefix-aware", res.Records, res.Busy)
	t.Logf("hit rate %.3f, TTFT p50 %v", sum.HitRate, sum.TTFT.P50)
}
