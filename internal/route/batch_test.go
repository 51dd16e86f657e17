package route

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/policy"
	"github.com/kvroute/kvroute/internal/prefix"
)

// TestApplyBatch: a batch applied whole leaves a replica as the same events applied one by
// one do: the same drops, counters, attempts in flight and prefix-aware predictions.
func TestApplyBatch(t *testing.T) {
	clk := &stepClock{t: time.Unix(100, 0)}
	pa, pb := newPrefixAware(t, clk), newPrefixAware(t, clk)
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

// TestApplyBatchCoalesced: batches in which most requests' three events follow each other
// (replayed whole, policy.Completer) leave a replica running prefix-aware as the same events
// applied one by one do: the same drops, counts and counters, and the same picks, predicted
// TTFTs, costs, cached-token predictions, learned capacities and holds for every prompt on
// every endpoint after each batch. The batches mix in what must not be coalesced: requests
// whose events interleave, duplicates, a failure, an engine report of an eviction, an
// unknown endpoint.
func TestApplyBatchCoalesced(t *testing.T) {
	clk := &stepClock{t: time.Unix(100, 0)}
	pa, pb := newPrefixAware(t, clk), newPrefixAware(t, clk)
	names := []string{"e0", "e1", "e2"}
	a := newReplica(t, 2, pa, clk, ShareConfig{}, names...)
	b := newReplica(t, 2, pb, clk, ShareConfig{}, names...)
	for _, p := range []policy.Picker{pa, pb} { // as the lifecycle does before a pick
		p.(policy.Replicated).SetReplicas(2, 1, 10*time.Millisecond)
	}
	const groups = 6
	prompt := func(g, turn int) []uint64 { // conversations that grow: later turns hit earlier ones
		return prefix.Chain(nil, prefix.Seed("m", ""), seqBlocks(uint64(g)<<20, 8+4*turn))
	}
	r := rand.New(rand.NewPCG(7, 7))
	var id uint64
	var last []Event // the previous batch's events, for replays
	coalescible := 0
	for batch := range 60 {
		var evs []Event
		for range 1 + r.IntN(6) {
			id++
			g, turn := r.IntN(groups), r.IntN(4)
			blocks := prompt(g, turn)
			pt := len(blocks)*16 + r.IntN(16)
			ttft := time.Duration(5+r.IntN(40)) * time.Millisecond
			routed := Event{Kind: EventRouted, Origin: 1, ID: id, Endpoint: names[r.IntN(len(names))], Model: "m",
				Blocks: blocks, BlockTokens: 16, PromptTokens: pt, MaxTokens: 8}
			first := Event{Kind: EventFirstToken, Origin: 1, ID: id, TTFT: ttft}
			done := Event{Kind: EventDone, Origin: 1, ID: id, OK: true, CachedTokens: -1, PromptTokens: pt,
				OutputTokens: 8, TTFT: ttft, Duration: 2 * ttft, Predicted: -1}
			switch r.IntN(12) {
			case 0: // failed after its first token
				done.OK = false
			case 1: // the engine reported an eviction the origin saw
				done.CachedTokens, done.Predicted = 0, 16
			case 2:
				routed.Endpoint = "gone"
			case 3: // interleaved with the next request's events
				evs = append(evs, routed, first)
				id++
				other := routed
				other.ID, other.Endpoint = id, names[r.IntN(len(names))]
				evs = append(evs, other, done, Event{Kind: EventFirstToken, Origin: 1, ID: id, TTFT: ttft})
				d2 := done
				d2.ID = id
				evs = append(evs, d2)
				continue
			case 4: // only started in this batch; half of them answers that come whole, which
				// the requests replayed after them take off the queue
				routed.Whole = r.IntN(2) == 0
				evs = append(evs, routed)
				continue
			}
			if routed.Endpoint != "gone" {
				coalescible++
			}
			evs = append(evs, routed, first, done)
		}
		if batch%5 == 4 && len(last) > 0 { // a replay of what came before
			evs = append(evs, last[:min(3, len(last))]...)
		}
		last = evs
		sameReplay(t, fmt.Sprintf("batch %d", batch), evs, a, b, pa, pb, groups, prompt, "one by one", "as a batch")
		clk.t = clk.t.Add(time.Duration(1+r.IntN(20)) * time.Millisecond)
	}
	if got := b.share.Stats().Coalesced; got == 0 || got > int64(coalescible) {
		t.Errorf("coalesced %d requests, want 1 to %d", got, coalescible)
	}
	t.Logf("%d of %d requests coalesced", b.share.Stats().Coalesced, id)
}

// sameReplay applies evs to a one event at a time (Apply) and to b as a batch (ApplyBatch), and
// fails the test unless both replicas end alike in everything their policies (pa, pb) can
// observe: the drops, the Share's stats (but for how many it replayed whole), the endpoints'
// counters, the learned capacities, and for each of the groups' prompts the ranking,
// predictions and hold. wayA and wayB name the two replays in failure messages.
func sameReplay(t *testing.T, at string, evs []Event, a, b *replica, pa, pb policy.Picker, groups int, prompt func(g, turn int) []uint64, wayA, wayB string) {
	t.Helper()
	var one, whole []Drop
	for i := range evs {
		ev := evs[i]
		if d := a.lc.Apply(&ev); d != DropNone {
			one = append(one, d)
		}
	}
	b.lc.ApplyBatch(slices.Clone(evs), func(d Drop) { whole = append(whole, d) })
	if diff := cmp.Diff(one, whole); diff != "" {
		t.Fatalf("%s: drops, %s (-) and %s (+):\n%s", at, wayA, wayB, diff)
	}
	sa, sb := a.share.Stats(), b.share.Stats()
	sb.Coalesced = 0
	if diff := cmp.Diff(sa, sb); diff != "" {
		t.Fatalf("%s: stats, %s (-) and %s (+):\n%s", at, wayA, wayB, diff)
	}
	if diff := cmp.Diff(load(a.eps), load(b.eps)); diff != "" {
		t.Fatalf("%s: counters, %s (-) and %s (+):\n%s", at, wayA, wayB, diff)
	}
	for i := range a.eps {
		la, lb := pa.(policy.CapacityLearner).LearnedKVTokens(a.eps[i].ID), pb.(policy.CapacityLearner).LearnedKVTokens(b.eps[i].ID)
		if la != lb {
			t.Fatalf("%s: %s's learned capacity %d %s, %d %s", at, a.eps[i].Name, la, wayA, lb, wayB)
		}
	}
	for g := range groups + 1 {
		for turn := range 5 {
			req := &policy.Request{Model: "m", Blocks: prompt(g, turn), BlockTokens: 16, PromptTokens: 16 * (9 + 4*turn), MaxTokens: 8}
			if diff := cmp.Diff(explain(pa, req, a.eps), explain(pb, req, b.eps)); diff != "" {
				t.Fatalf("%s, prompt %d/%d: %s (-) and %s (+):\n%s", at, g, turn, wayA, wayB, diff)
			}
			if da, db := pa.(policy.Deferrer).Defer(req, a.eps), pb.(policy.Deferrer).Defer(req, b.eps); da != db {
				t.Fatalf("%s, prompt %d/%d: held %v %s, %v %s", at, g, turn, da, wayA, db, wayB)
			}
		}
	}
}

// explain is what prefix-aware weighs for req on eps, by endpoint name, and what it predicts
// each holds.
type explained struct {
	Name               string
	Cached, Predicted  int
	TTFT               time.Duration
	Cost               float64
	WithinBound, Blind bool
}

func explain(p policy.Picker, req *policy.Request, eps []*endpoint.Endpoint) []explained {
	var out []explained
	for _, e := range p.(policy.Explainer).Explain(req, eps) {
		out = append(out, explained{Name: e.Endpoint.Name, Cached: e.CachedTokens, Predicted: p.(policy.Predictor).PredictCached(req, e.Endpoint),
			TTFT: e.PredictedTTFT, Cost: e.Cost, WithinBound: e.WithinBound, Blind: e.CacheBlind})
	}
	return out
}

// BenchmarkApplyBatch replays one remote request (routed, first token, done) of a 64-block
// prompt on a replica running prefix-aware, as BenchmarkApply does: whole, its three events in
// one batch (replayed as one placement), and split, each event in a batch of its own (the
// events one by one, as when other requests' events come between them).
func BenchmarkApplyBatch(b *testing.B) {
	for _, whole := range []bool{true, false} {
		b.Run(map[bool]string{true: "whole", false: "split"}[whole], func(b *testing.B) {
			clk, lc, s, chains, names := newApplyBench(b)
			const groups = applyBenchGroups
			fail := func(d Drop) { b.Fatal(d) }
			evs := make([]Event, 3)
			b.ReportAllocs()
			var id uint64
			for b.Loop() {
				id++
				g := int(id % groups)
				evs[0] = Event{Kind: EventRouted, Origin: 1, ID: id, Endpoint: names[g%4], Model: "m", Blocks: chains[g], BlockTokens: 16, PromptTokens: 1030, MaxTokens: 8}
				evs[1] = Event{Kind: EventFirstToken, Origin: 1, ID: id, TTFT: 20 * time.Millisecond}
				evs[2] = Event{Kind: EventDone, Origin: 1, ID: id, OK: true, CachedTokens: -1, PromptTokens: 1030, OutputTokens: 8, TTFT: 20 * time.Millisecond, Predicted: -1}
				if whole {
					lc.ApplyBatch(evs, fail)
				} else {
					for i := range evs {
						lc.ApplyBatch(evs[i:i+1], fail)
					}
				}
				clk.t = clk.t.Add(time.Millisecond)
			}
			if st := s.Stats(); whole != (st.Coalesced > 0) {
				b.Fatalf("coalesced %d", st.Coalesced)
			}
		})
	}
}
