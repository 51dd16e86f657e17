package des

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/workload"
)

// BenchmarkRun simulates 2,000 requests sharing a few prefixes on four engines of the H200
// profile, round-robin: the cost of the event loop plus the engine model.
func BenchmarkRun(b *testing.B) {
	p, err := engine.LookupProfile("llama3-70b-h200-tp8")
	if err != nil {
		b.Fatal(err)
	}
	reqs := make([]workload.Request, 2000)
	for i := range reqs {
		g := uint64(i % 20)
		reqs[i] = workload.Request{
			ID: i, Arrival: time.Duration(i) * 40 * time.Millisecond,
			Blocks: []uint64{1, 10 + g, uint64(1000 + i)}, BlockTokens: 512,
			PromptTokens: 1200 + i%300, OutputTokens: 50 + i%100,
		}
	}
	cfg := ProfileFleet(p, 4)
	w := Prepare(reqs, cfg.Model, cfg.BlockSize)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Run(context.Background(), cfg, w, "round-robin", Named("round-robin", nil)); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRunMooncake replays the first 1,000 requests of the Mooncake trace on eight H200
// engines at about the must-reach load (skipped when the trace is absent).
func BenchmarkRunMooncake(b *testing.B) {
	const trace = "../../../shared/traces/mooncake/conversation_trace.jsonl"
	if _, err := os.Stat(trace); err != nil {
		b.Skip("Mooncake trace not present")
	}
	reqs, err := workload.LoadMooncake(trace)
	if err != nil {
		b.Fatal(err)
	}
	reqs = workload.Speedup(reqs[:1000], 2.44)
	p, err := engine.LookupProfile("llama3-70b-h200-tp8")
	if err != nil {
		b.Fatal(err)
	}
	cfg := ProfileFleet(p, 8)
	w := Prepare(reqs, cfg.Model, cfg.BlockSize)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Run(context.Background(), cfg, w, "round-robin", Named("round-robin", nil)); err != nil {
			b.Fatal(err)
		}
	}
}
