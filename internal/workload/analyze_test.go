package workload

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

func TestPercentiles(t *testing.T) {
	got := percentiles([]int{5, 1, 4, 2, 3, 10, 9, 8, 7, 6})
	want := Percentiles{P50: 5, P90: 9, P99: 9, Max: 10, Mean: 5.5}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("percentiles (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(Percentiles{}, percentiles(nil)); diff != "" {
		t.Errorf("percentiles(nil) (-want +got):\n%s", diff)
	}
}

func TestAnalyzeByHand(t *testing.T) {
	// Four requests of 16-token blocks; all share block 1.
	reqs := []Request{
		req(0, 16, 40, 1, 2, 3),                   // new: 3 blocks, 40 tokens (last block 8 tokens)
		req(2*time.Second, 16, 48, 1, 2, 3),       // repeats 3 blocks (block 3 seen partial)
		req(1*time.Second, 16, 32, 1, 4),          // repeats 1 block
		req(4*time.Second, 16, 80, 1, 2, 5, 6, 7), // repeats 2 blocks
	}
	reqs[3].OutputTokens = 9
	got := Analyze(reqs, AnalyzeOptions{BlockSize: 16, CapacityTokens: 1 << 20})
	// Arrival order: r0 (0s), r2 (1s), r1 (2s), r3 (4s).
	// Infinite cache at 16: r0 stores (1),(1,2); r2 hits 16; r1 hits 32 (block 3 was partial),
	// stores (1,2,3); r3 hits 32. Hits 80 of 200 tokens.
	want := Stats{
		Requests: 4, Duration: 4 * time.Second, Rate: 1,
		Prompt:           Percentiles{P50: 40, P90: 48, P99: 48, Max: 80, Mean: 50},
		Output:           Percentiles{P50: 1, P90: 1, P99: 1, Max: 9, Mean: 3},
		PromptTotal:      200,
		BlockTokens:      16,
		DistinctBlocks:   7, // (1) (1,2) (1,2,3) (1,4) (1,2,5) (1,2,5,6) (1,2,5,6,7)
		WorkingSetTokens: 16 + 16 + 16 + 16 + 16 + 16 + 16,
		CommonBlocks:     1,
		Repeats: []Repeat{
			{Blocks: 1, Share: 0.75}, {Blocks: 2, Share: 0.5}, {Blocks: 4, Share: 0}, {Blocks: 8, Share: 0},
		},
		RepeatBeyondCommon: 0.5,
		CommonHitShare:     48.0 / 200,
		BlockSize:          16,
		CapacityTokens:     1 << 20,
		InfiniteHitRate:    80.0 / 200,
		LRUHitRate:         80.0 / 200,
	}
	if diff := cmp.Diff(want, got, cmpopts.EquateApprox(0, 1e-12), cmpopts.IgnoreFields(Stats{}, "Verdict")); diff != "" {
		t.Errorf("Analyze (-want +got):\n%s", diff)
	}
	// 0.5 repeat beyond the common block is not more than half; placement-dependent hits are
	// 0.40 - 0.24 = 0.16, below a fifth: unlikely.
	for _, s := range []string{"unlikely to pay off", "50% of requests repeat a prefix longer than the 1 block(s)", "same 1 block(s)"} {
		if !strings.Contains(got.Verdict, s) {
			t.Errorf("verdict %q lacks %q", got.Verdict, s)
		}
	}
}

func TestAnalyzeVerdicts(t *testing.T) {
	shared, err := Generate("shared-prefix:groups=4,prompts=8", 1)
	if err != nil {
		t.Fatal(err)
	}
	s := Analyze(shared, AnalyzeOptions{BlockSize: 16, CapacityTokens: 1 << 20})
	if !strings.HasPrefix(s.Verdict, "prefix-aware routing is likely to pay off: 88% of requests repeat a prefix, and") {
		t.Errorf("shared-prefix verdict: %q", s.Verdict)
	}
	if strings.Contains(s.Verdict, "working set") || strings.Contains(s.Verdict, "same") {
		t.Errorf("shared-prefix verdict warns of what is not there: %q", s.Verdict)
	}
	small := Analyze(shared, AnalyzeOptions{BlockSize: 16, CapacityTokens: 2048})
	if !strings.Contains(small.Verdict, "the working set (12.3k tokens) is 6.0x the fleet's KV cache (2.0k tokens)") {
		t.Errorf("small-cache verdict: %q", small.Verdict)
	}
	unique, err := Generate("prefix-repetition:n=20,prefixes=20,prefix=16,suffix=200", 1)
	if err != nil {
		t.Fatal(err)
	}
	if u := Analyze(unique, AnalyzeOptions{}); !strings.HasPrefix(u.Verdict, "prefix-aware routing is unlikely to pay off: 0% of requests") || u.BlockSize != 16 {
		t.Errorf("unique prompts verdict: %q (block size %d)", u.Verdict, u.BlockSize)
	}
	one := Analyze(shared, AnalyzeOptions{BlockSize: 16, CapacityTokens: 1 << 20, Instances: 1})
	if one.RandomHitRate != one.LRUHitRate || !strings.HasPrefix(one.Verdict, "prefix-aware routing is unlikely to pay off: placement can add little") ||
		!strings.Contains(one.Verdict, "routing at random over 1 instances would hit 82%") {
		t.Errorf("one instance: random %v, LRU %v, verdict %q", one.RandomHitRate, one.LRUHitRate, one.Verdict)
	}
	if e := Analyze(nil, AnalyzeOptions{}); e.Verdict != "no requests: nothing to route" || e.Requests != 0 {
		t.Errorf("empty workload: %+v", e)
	}
}

// checkTraceAnalyze checks Analyze against the figures in the trace's README.
func checkTraceAnalyze(t *testing.T, reqs []Request) {
	// The pooled LRU bound is checked in checkTraceBounds; a capacity of 1M tokens is quick.
	s := Analyze(reqs, AnalyzeOptions{BlockSize: 16, CapacityTokens: 1 << 20, Instances: 2, Seed: 1})
	if s.Requests != 12031 || s.Duration.Round(time.Second) != 3537*time.Second || s.Prompt.P50 != 6909 ||
		s.Prompt.P90 != 27367 || s.Prompt.P99 != 85399 || s.Prompt.Max != 126195 || s.DistinctBlocks != 182790 {
		t.Errorf("trace stats: %d requests, %v, prompt %+v, %d distinct blocks; want 12031, 3537s, 6909/27367/85399/126195, 182790",
			s.Requests, s.Duration, s.Prompt, s.DistinctBlocks)
	}
	if math.Abs(s.Rate-3.40) > 0.005 || math.Abs(s.Prompt.Mean-12035) > 1 || math.Abs(s.Output.Mean-343) > 1 {
		t.Errorf("rate %.3f, mean input %.1f, mean output %.1f; want 3.40, 12035, 343", s.Rate, s.Prompt.Mean, s.Output.Mean)
	}
	if s.RandomHitRate <= 0 || s.RandomHitRate >= s.LRUHitRate {
		t.Errorf("random placement %v, want above 0 and below the pooled LRU's %v", s.RandomHitRate, s.LRUHitRate)
	}
	if s.CommonBlocks != 1 || !strings.Contains(s.Verdict, "likely to pay off") || !strings.Contains(s.Verdict, "working set") {
		t.Errorf("common blocks %d, verdict %q", s.CommonBlocks, s.Verdict)
	}
}
