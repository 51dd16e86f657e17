package route

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/internal/policy"
	"github.com/kvroute/kvroute/internal/prefix"
)

// TestApplyBatch: a batch applied whole leaves a replica as the same events applied one by
// one do: the same drops, counters, attempts in flight and prefix-aware predictions.
func TestApplyBatch(t *testing.T) {
	clk := &stepClock{t: time.Unix(100, 0)}
	newPA := func() policy.Picker {
		p, err := policy.New("prefix-aware", nil, policy.Env{Rand: rand.New(rand.NewPCG(1, 2)), Clock: clk})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	pa, pb := newPA(), newPA()
	a := newReplica(t, 2, pa, clk, ShareConfig{}, "e0", "e1")
	b := newReplica(t, 2, pb, clk, ShareConfig{}, "e0", "e1")
	blocks := func(g uint64) []uint64 { return prefix.Chain(nil, prefix.Seed("m", ""), seqBlocks(g<<20, 12)) }
	evs := []Event{
		{Kind: EventRouted, Origin: 1, ID: 1, Endpoint: "e0", Model: "m", Blocks: blocks(1), BlockTokens: 16, PromptTokens: 200},
		{Kind: EventRouted, Origin: 1, ID: 2, Endpoint: "e1", Model: "m", Blocks: blocks(2), BlockTokens: 16, PromptTokens: 200},
		{Kind: EventFirstToken, Origin: 1, ID: 1, TTFT: 30 * time.Millisecond},
		{Kind: EventDone, Origin: 1, ID: 1, OK: true, CachedTokens: 0, PromptTokens: 200, TTFT: 30 * time.Millisecond, Predicted: 0},
		{Kind: EventRouted, Origin: 1, ID: 1, Endpoint: "e0", Model: "m", Blocks: blocks(1), BlockTokens: 16, PromptTokens: 200}, // a replay
		{Kind: EventFirstToken, Origin: 1, ID: 9, TTFT: time.Millisecond},                                                        // never routed
		{Kind: EventRouted, Origin: 1, ID: 3, Endpoint: "gone", Model: "m", Blocks: blocks(3), BlockTokens: 16, PromptTokens: 200},
		{Kind: EventRouted, Origin: 2, ID: 4, Endpoint: "e0"}, // its own
		{Kind: EventRouted, Origin: 1, ID: 5, Endpoint: "e1", Model: "m", Blocks: blocks(1), BlockTokens: 16, PromptTokens: 200},
	}
	var one []Drop
	for i := range evs {
		ev := evs[i]
		ev.Blocks = append([]uint64(nil), ev.Blocks...)
		if d := a.lc.Apply(&ev); d != DropNone {
			one = append(one, d)
		}
	}
	var batch []Drop
	b.lc.ApplyBatch(evs, func(d Drop) { batch = append(batch, d) })
	want := []Drop{DropDuplicate, DropUnknown, DropUnknownEndpoint, DropSelf}
	if diff := cmp.Diff(want, one); diff != "" {
		t.Errorf("one by one, drops (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(one, batch); diff != "" {
		t.Errorf("drops, one by one (-) and as a batch (+):\n%s", diff)
	}
	if diff := cmp.Diff(a.share.Stats(), b.share.Stats()); diff != "" {
		t.Errorf("stats, one by one (-) and as a batch (+):\n%s", diff)
	}
	if diff := cmp.Diff(load(a.eps), load(b.eps)); diff != "" {
		t.Errorf("counters, one by one (-) and as a batch (+):\n%s", diff)
	}
	for g := uint64(1); g <= 3; g++ {
		req := &policy.Request{Model: "m", Blocks: blocks(g), BlockTokens: 16, PromptTokens: 200}
		for i := range a.eps {
			wa := pa.(policy.Predictor).PredictCached(req, a.eps[i])
			wb := pb.(policy.Predictor).PredictCached(req, b.eps[i])
			if wa != wb {
				t.Errorf("prompt %d on %s: predicted %d one by one, %d as a batch", g, a.eps[i].Name, wa, wb)
			}
		}
	}
	if st := b.share.Stats(); st.Applied != 5 || st.Remote != 2 {
		t.Errorf("as a batch: %d applied, %d remote in flight; want 5 and 2", st.Applied, st.Remote)
	}
}
