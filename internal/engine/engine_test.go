package engine

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// tinyProfile has 4-token blocks and round step costs, so that expected times are worked out by
// hand: a step costs 1000 ns + 10 ns per prefill token + 100 ns per decode + 1 ns per decode
// context token (no attention term).
func tinyProfile() Profile {
	return Profile{
		Name: "tiny", BlockSize: 4, NumBlocks: 64, MaxNumSeqs: 16, MaxBatchedTokens: 1024,
		StepOverhead: 1000, PrefillPerToken: 10, DecodePerSeq: 100, DecodePerCtxToken: 1,
	}
}

func newEngine(t testing.TB, cfg Config) *Engine {
	t.Helper()
	if cfg.Profile.Name == "" {
		cfg.Profile = tinyProfile()
	}
	e, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return e
}

func submit(t testing.TB, e *Engine, now time.Duration, r Request) {
	t.Helper()
	if err := e.Submit(now, r); err != nil {
		t.Fatalf("Submit(%s): %v", r.ID, err)
	}
}

// runIdle steps e from now until it is idle and returns every event and the idle time.
func runIdle(t testing.TB, e *Engine, now time.Duration) ([]Event, time.Duration) {
	t.Helper()
	var all []Event
	for range 100000 {
		end, evs, ok := e.Step(now)
		if !ok {
			return all, now
		}
		if end < now {
			t.Fatalf("Step(%v) ended at %v, before it started", now, end)
		}
		all = append(all, evs...)
		now = end
	}
	t.Fatalf("engine still busy after 100000 steps")
	return nil, 0
}

// keys returns n block keys base, base+1, ...
func keys(base uint64, n int) []uint64 {
	k := make([]uint64, n)
	for i := range k {
		k[i] = base + uint64(i)
	}
	return k
}

// firstTokens maps request id to its first-token event.
func firstTokens(evs []Event) map[string]Event {
	m := map[string]Event{}
	for _, ev := range evs {
		if ev.Kind == EventFirstToken {
			m[ev.ReqID] = ev
		}
	}
	return m
}

func TestPrefixHit(t *testing.T) {
	tests := []struct {
		name       string
		first      Request
		second     Request
		wantCached int
	}{
		{
			// 16 tokens, all 4 blocks cached: the hit is capped at 15 tokens, rounded down to
			// whole blocks: 12, and 4 tokens are computed again.
			name:       "full hit keeps the last block",
			first:      Request{ID: "a", PromptTokens: 16, OutputTokens: 1, BlockKeys: keys(1, 4)},
			second:     Request{ID: "b", PromptTokens: 16, OutputTokens: 1, BlockKeys: keys(1, 4)},
			wantCached: 12,
		},
		{
			// 17 tokens: the 4 full blocks (16 tokens) are all below the cap of 16.
			name:       "full hit with a partial last block",
			first:      Request{ID: "a", PromptTokens: 17, OutputTokens: 1, BlockKeys: keys(1, 4)},
			second:     Request{ID: "b", PromptTokens: 17, OutputTokens: 1, BlockKeys: keys(1, 4)},
			wantCached: 16,
		},
		{
			// Blocks 0 and 1 shared, block 2 differs: 8 tokens; block 3 equal key but another
			// parent, so no hit past the first miss.
			name:       "partial hit stops at the first miss",
			first:      Request{ID: "a", PromptTokens: 16, OutputTokens: 1, BlockKeys: keys(1, 4)},
			second:     Request{ID: "b", PromptTokens: 16, OutputTokens: 1, BlockKeys: []uint64{1, 2, 99, 4}},
			wantCached: 8,
		},
		{
			name:       "last-token rule with a one-block prompt",
			first:      Request{ID: "a", PromptTokens: 4, OutputTokens: 1, BlockKeys: keys(1, 1)},
			second:     Request{ID: "b", PromptTokens: 4, OutputTokens: 1, BlockKeys: keys(1, 1)},
			wantCached: 0,
		},
		{
			name:       "salt separates tenants",
			first:      Request{ID: "a", PromptTokens: 16, OutputTokens: 1, BlockKeys: keys(1, 4), Salt: "t1"},
			second:     Request{ID: "b", PromptTokens: 16, OutputTokens: 1, BlockKeys: keys(1, 4), Salt: "t2"},
			wantCached: 0,
		},
		{
			name:       "same salt shares",
			first:      Request{ID: "a", PromptTokens: 16, OutputTokens: 1, BlockKeys: keys(1, 4), Salt: "t1"},
			second:     Request{ID: "b", PromptTokens: 16, OutputTokens: 1, BlockKeys: keys(1, 4), Salt: "t1"},
			wantCached: 12,
		},
		{
			name:       "no keys, no cache",
			first:      Request{ID: "a", PromptTokens: 16, OutputTokens: 1},
			second:     Request{ID: "b", PromptTokens: 16, OutputTokens: 1},
			wantCached: 0,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEngine(t, Config{})
			submit(t, e, 0, tc.first)
			_, now := runIdle(t, e, 0)
			submit(t, e, now, tc.second)
			evs, end := runIdle(t, e, now)
			got := firstTokens(evs)["b"]
			if got.CachedTokens != tc.wantCached {
				t.Errorf("CachedTokens = %d, want %d", got.CachedTokens, tc.wantCached)
			}
			// The second request computes PromptTokens-cached tokens in one step.
			if want := 1000 + 10*time.Duration(tc.second.PromptTokens-tc.wantCached); end-now != want {
				t.Errorf("TTFT = %v, want %v", end-now, want)
			}
			st := e.Stats()
			wantQ := int64(tc.first.PromptTokens + tc.second.PromptTokens)
			if st.PrefixQueryTokens != wantQ || st.PrefixHitTokens != int64(tc.wantCached) {
				t.Errorf("queries, hits = %d, %d, want %d, %d", st.PrefixQueryTokens, st.PrefixHitTokens, wantQ, tc.wantCached)
			}
			if st.PromptTokens != wantQ || st.GenerationTokens != 2 || st.Finished != 2 || st.UsedBlocks != 0 {
				t.Errorf("stats = %+v", st)
			}
		})
	}
}

func TestBlockHashesSalt(t *testing.T) {
	e := newEngine(t, Config{})
	a := e.BlockHashes(Request{PromptTokens: 18, BlockKeys: keys(1, 4)})
	b := e.BlockHashes(Request{PromptTokens: 18, BlockKeys: keys(1, 4), Salt: "s"})
	short := e.BlockHashes(Request{PromptTokens: 8, BlockKeys: keys(1, 2)})
	if len(a) != 4 || len(b) != 4 {
		t.Fatalf("len = %d, %d, want 4", len(a), len(b))
	}
	for i := range a {
		if a[i] == b[i] {
			t.Errorf("block %d: salted and unsalted hashes are equal", i)
		}
	}
	if diff := cmp.Diff(a[:2], short); diff != "" {
		t.Errorf("a prefix's hashes differ from the longer prompt's (-long +short):\n%s", diff)
	}
}

func TestEvictionLRUTailFirst(t *testing.T) {
	// 6 blocks of 4 tokens. Free queue at start: 0 1 2 3 4 5.
	e := newEngine(t, Config{NumBlocks: 6, KVEvents: true})
	a := Request{ID: "a", PromptTokens: 12, OutputTokens: 1, BlockKeys: keys(10, 3)}
	ha := e.BlockHashes(a)
	submit(t, e, 0, a) // takes 0 1 2; freed tail first: queue 3 4 5 2 1 0
	_, now := runIdle(t, e, 0)
	submit(t, e, now, Request{ID: "b", PromptTokens: 12, OutputTokens: 1}) // takes 3 4 5, uncached
	_, now = runIdle(t, e, now)
	if st := e.Stats(); st.CachedFreeBlocks != 3 || st.UsedBlocks != 0 {
		t.Fatalf("after a and b: cached free %d, used %d, want 3, 0", st.CachedFreeBlocks, st.UsedBlocks)
	}
	// Queue now 2 1 0 5 4 3: c's two blocks evict a's tail (block 2, then block 1).
	c := Request{ID: "c", PromptTokens: 8, OutputTokens: 1, BlockKeys: keys(20, 2)}
	hc := e.BlockHashes(c)
	submit(t, e, now, c)
	_, now = runIdle(t, e, now)
	// a's first block survived: a hit of 4 tokens.
	submit(t, e, now, Request{ID: "d", PromptTokens: 12, OutputTokens: 1, BlockKeys: keys(10, 3)})
	evs, _ := runIdle(t, e, now)
	if got := firstTokens(evs)["d"].CachedTokens; got != 4 {
		t.Errorf("d CachedTokens = %d, want 4", got)
	}
	want := []KVEvent{
		{Kind: KVBlockStored, Hashes: ha, BlockSize: 4},
		{Kind: KVBlockRemoved, Hashes: []uint64{ha[2], ha[1]}, BlockSize: 4},
		{Kind: KVBlockStored, Hashes: hc, BlockSize: 4},
		// c took 2 and 1 and freed them tail first: queue 0 5 4 3 1 2. d's hit takes block 0
		// out of the queue and its two new blocks are 5 and 4, uncached: c stays cached.
		{Kind: KVBlockStored, Hashes: ha[1:], Parent: ha[0], BlockSize: 4},
	}
	if diff := cmp.Diff(want, e.DrainKVEvents()); diff != "" {
		t.Errorf("KV events (-want +got):\n%s", diff)
	}
	if st := e.Stats(); st.CachedFreeBlocks != 5 {
		t.Errorf("CachedFreeBlocks = %d, want 5 (a's 3 and c's 2)", st.CachedFreeBlocks)
	}
	if got := e.DrainKVEvents(); len(got) != 0 {
		t.Errorf("second drain = %v, want none", got)
	}
}

func TestRefcountSharing(t *testing.T) {
	e := newEngine(t, Config{})
	a := Request{ID: "a", PromptTokens: 16, OutputTokens: 10, BlockKeys: keys(1, 4)}
	submit(t, e, 0, a)
	now, _, _ := e.Step(0) // a's prefill: 4 blocks
	b := a
	b.ID = "b"
	submit(t, e, now, b)
	_, evs, _ := e.Step(now)
	// a decodes token 17 into a 5th block; b hits 3 shared blocks and computes 4 tokens into
	// a block of its own: 5 + 1 blocks in use.
	if got := firstTokens(evs)["b"].CachedTokens; got != 12 {
		t.Fatalf("b CachedTokens = %d, want 12", got)
	}
	if got := e.Stats().UsedBlocks; got != 6 {
		t.Errorf("UsedBlocks = %d, want 6", got)
	}
	if !e.Abort(now, "a") {
		t.Fatal("Abort(a) = false")
	}
	// b still holds the 3 shared blocks; a's 4th (cached) and 5th (uncached) are free.
	if st := e.Stats(); st.UsedBlocks != 4 || st.CachedFreeBlocks != 1 || st.Running != 1 {
		t.Errorf("after abort: used %d cached free %d running %d, want 4 1 1", st.UsedBlocks, st.CachedFreeBlocks, st.Running)
	}
	if e.Abort(now, "a") {
		t.Error("second Abort(a) = true")
	}
	runIdle(t, e, now)
	if st := e.Stats(); st.UsedBlocks != 0 || st.CachedFreeBlocks != 4 {
		t.Errorf("idle: used %d cached free %d, want 0 4", st.UsedBlocks, st.CachedFreeBlocks)
	}
}

func TestPreemptionAndResume(t *testing.T) {
	// 3 blocks of 4 tokens. a: 8 prompt + 4 output (needs 11 tokens of KV = 3 blocks);
	// b: 4 + 2 (5 tokens = 2 blocks).
	e := newEngine(t, Config{NumBlocks: 3})
	submit(t, e, 0, Request{ID: "a", PromptTokens: 8, OutputTokens: 4})
	submit(t, e, 0, Request{ID: "b", PromptTokens: 4, OutputTokens: 2})
	evs, end := runIdle(t, e, 0)
	// step 1: prefill a (8) and b (4): 1000+120 = 1120; a 2 blocks, b 1 block, none free.
	// step 2: a decodes token 9, needs a 3rd block: b, the last admitted, is preempted;
	//         1000+100+9 = 1109 -> 2229. No admission in a step that preempted.
	// step 3: a decodes with context 10: 1110 -> 3339; b needs 2 blocks, none free: waits.
	// step 4: a decodes with context 11: 1111 -> 4450, its 4th token: finished.
	// step 5: b recomputes 4 prompt + 1 generated tokens: 1050 -> 5500, its 2nd token.
	want := []Event{
		{Kind: EventFirstToken, ReqID: "a", At: 1120, OutputTokens: 1},
		{Kind: EventFirstToken, ReqID: "b", At: 1120, OutputTokens: 1},
		{Kind: EventPreempted, ReqID: "b", At: 2229, OutputTokens: 1},
		{Kind: EventFinished, ReqID: "a", At: 4450, OutputTokens: 4},
		{Kind: EventFinished, ReqID: "b", At: 5500, OutputTokens: 2},
	}
	if diff := cmp.Diff(want, evs); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	st := e.Stats()
	if st.Preemptions != 1 || st.Finished != 2 || st.GenerationTokens != 6 || end != 5500 || st.Busy != 5500 {
		t.Errorf("stats %+v end %v", st, end)
	}
}

func TestPreemptSelf(t *testing.T) {
	// a is admitted before b; b's decode needs a block when none is free and b is the most
	// recently admitted: b preempts itself.
	e := newEngine(t, Config{NumBlocks: 3, TokenEvents: true})
	submit(t, e, 0, Request{ID: "a", PromptTokens: 7, OutputTokens: 2})
	submit(t, e, 0, Request{ID: "b", PromptTokens: 4, OutputTokens: 3})
	// step 1: a 2 blocks, b 1 block. step 2: a decodes token 8 into its 2nd block (no new
	// block); b needs a 2nd block: preempts itself.
	evs, _ := runIdle(t, e, 0)
	var kinds []string
	for _, ev := range evs {
		kinds = append(kinds, fmt.Sprintf("%s:%d:%d", ev.ReqID, ev.Kind, ev.OutputTokens))
	}
	want := []string{
		"a:1:1", "b:1:1",
		"b:4:1", "a:2:2", "a:3:2",
		"b:2:2", // recompute of 5 tokens yields b's 2nd token
		"b:2:3", "b:3:3",
	}
	if diff := cmp.Diff(want, kinds); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
}

func TestFCFS(t *testing.T) {
	// 4 blocks. a holds 3 (12 tokens) while decoding; b needs 2 and waits; c needs 1 and
	// would fit, but must not pass b.
	e := newEngine(t, Config{NumBlocks: 4})
	submit(t, e, 0, Request{ID: "a", PromptTokens: 9, OutputTokens: 4})
	submit(t, e, 0, Request{ID: "b", PromptTokens: 8, OutputTokens: 1})
	submit(t, e, 0, Request{ID: "c", PromptTokens: 3, OutputTokens: 1})
	evs, _ := runIdle(t, e, 0)
	var order []string
	for _, ev := range evs {
		if ev.Kind == EventFirstToken {
			order = append(order, ev.ReqID)
		}
	}
	if diff := cmp.Diff([]string{"a", "b", "c"}, order); diff != "" {
		t.Errorf("first-token order (-want +got):\n%s", diff)
	}
	ft := firstTokens(evs)
	if ft["b"].At != ft["c"].At {
		t.Errorf("b at %v, c at %v: c should be admitted with b once a has left", ft["b"].At, ft["c"].At)
	}

	// MaxNumSeqs 1: strictly one at a time, in submission order.
	e = newEngine(t, Config{MaxNumSeqs: 1})
	for _, id := range []string{"x", "y", "z"} {
		submit(t, e, 0, Request{ID: id, PromptTokens: 5, OutputTokens: 2})
	}
	evs, _ = runIdle(t, e, 0)
	order = order[:0]
	for _, ev := range evs {
		order = append(order, ev.ReqID+fmt.Sprint(ev.Kind))
	}
	if diff := cmp.Diff([]string{"x1", "x3", "y1", "y3", "z1", "z3"}, order); diff != "" {
		t.Errorf("MaxNumSeqs 1 order (-want +got):\n%s", diff)
	}
}

func TestChunkedPrefillBudget(t *testing.T) {
	e := newEngine(t, Config{MaxBatchedTokens: 8})
	submit(t, e, 0, Request{ID: "a", PromptTokens: 4, OutputTokens: 5})
	now, _, _ := e.Step(0) // 1000 + 40
	if now != 1040 {
		t.Fatalf("step 1 ended at %v, want 1040", now)
	}
	submit(t, e, now, Request{ID: "b", PromptTokens: 20, OutputTokens: 1})
	// Each step: a decodes first (1 token), b gets the other 7, then 7, then 6.
	// step 2: 1000 + 70 + 100 + 5 = 1175; step 3: 1000+70+100+6 = 1176;
	// step 4: 1000 + 60 + 100 + 7 = 1167.
	var ends []time.Duration
	var bFirst time.Duration
	for range 3 {
		end, evs, ok := e.Step(now)
		if !ok {
			t.Fatal("idle too early")
		}
		for _, ev := range evs {
			if ev.ReqID == "b" && ev.Kind == EventFirstToken {
				bFirst = ev.At
			}
		}
		ends = append(ends, end-now)
		now = end
	}
	if diff := cmp.Diff([]time.Duration{1175, 1176, 1167}, ends); diff != "" {
		t.Errorf("step times (-want +got):\n%s", diff)
	}
	if bFirst != now {
		t.Errorf("b first token at %v, want %v (end of its 3rd chunk)", bFirst, now)
	}
}

func TestAttentionChunkInvariant(t *testing.T) {
	// 1 ns per pair: a prompt of n tokens costs n(n+1)/2 ns of attention however it is chunked.
	p := Profile{BlockSize: 16, NumBlocks: 1 << 12, MaxNumSeqs: 8, MaxBatchedTokens: 1000, AttentionPerMPairs: time.Millisecond}
	for _, n := range []int{1, 999, 1000, 1001, 4321} {
		want := time.Duration(n * (n + 1) / 2)
		if got := p.UnloadedTTFT(n, 0); got != want {
			t.Errorf("UnloadedTTFT(%d) = %v, want %v", n, got, want)
		}
	}
}

func TestUnloadedTTFTCachedCap(t *testing.T) {
	p := tinyProfile()
	tests := []struct{ prompt, cached, computed int }{
		{16, 16, 4},  // cap 15, whole blocks: 12 cached
		{16, 100, 4}, // more than the prompt
		{17, 16, 1},
		{16, 7, 12}, // 7 -> 4
		{16, -3, 16},
		{1, 1, 1},
	}
	for _, tc := range tests {
		if got, want := p.UnloadedTTFT(tc.prompt, tc.cached), 1000+10*time.Duration(tc.computed); got != want {
			t.Errorf("UnloadedTTFT(%d, %d) = %v, want %v", tc.prompt, tc.cached, got, want)
		}
	}
	if got := p.UnloadedTTFT(0, 0); got != 0 {
		t.Errorf("UnloadedTTFT(0, 0) = %v, want 0", got)
	}
}

func TestSubmitErrors(t *testing.T) {
	e := newEngine(t, Config{NumBlocks: 4})
	submit(t, e, 0, Request{ID: "dup", PromptTokens: 4, OutputTokens: 1})
	tests := []struct {
		r    Request
		want string
	}{
		{Request{PromptTokens: 4, OutputTokens: 1}, "ID is empty"},
		{Request{ID: "dup", PromptTokens: 4, OutputTokens: 1}, "already in the engine"},
		{Request{ID: "x", PromptTokens: 0, OutputTokens: 1}, "PromptTokens is 0"},
		{Request{ID: "x", PromptTokens: 4, OutputTokens: 0}, "OutputTokens is 0"},
		{Request{ID: "x", PromptTokens: 7, OutputTokens: 1, BlockKeys: keys(1, 2)}, "2 block keys for 7 prompt tokens"},
		{Request{ID: "x", PromptTokens: 17, OutputTokens: 1}, "need 5 KV blocks but the engine has 4"},
		{Request{ID: "x", PromptTokens: 10, OutputTokens: 8}, "need 5 KV blocks"},
	}
	for _, tc := range tests {
		err := e.Submit(0, tc.r)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Submit(%+v) = %v, want an error containing %q", tc.r, err, tc.want)
		}
	}
	// The largest request that fits alone is accepted: 16 + 1 output needs 16 tokens of KV.
	if err := e.Submit(0, Request{ID: "big", PromptTokens: 16, OutputTokens: 1}); err != nil {
		t.Errorf("Submit(big) = %v", err)
	}
}

func TestNewErrors(t *testing.T) {
	_, err := New(Config{Profile: Profile{Name: "bad", StepOverhead: -1}})
	if err == nil {
		t.Fatal("New with an empty profile: no error")
	}
	for _, want := range []string{"BlockSize is 0", "NumBlocks is 0", "MaxNumSeqs is 0", "MaxBatchedTokens is 0", "StepOverhead is -1ns"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	e := newEngine(t, Config{Profile: tinyProfile(), NumBlocks: 7})
	got := e.Config()
	if got.NumBlocks != 7 || got.BlockSize != 4 || got.MaxNumSeqs != 16 || got.MaxBatchedTokens != 1024 {
		t.Errorf("Config() = %+v", got)
	}
}

func TestProfiles(t *testing.T) {
	var names []string
	for _, p := range Profiles() {
		names = append(names, p.Name)
		if _, err := New(Config{Profile: p}); err != nil {
			t.Errorf("profile %s: %v", p.Name, err)
		}
	}
	want := []string{"fixed-step", "instant", "llama3-70b-h100-tp4", "llama3-70b-h200-tp8", "llama3-8b-h100-tp1", "ollama-tiny-cpu"}
	if diff := cmp.Diff(want, names); diff != "" {
		t.Errorf("Profiles() names (-want +got):\n%s", diff)
	}
	p, err := LookupProfile("llama3-70b-h100-tp4")
	if err != nil || p.KVTokens() != 461376 {
		t.Errorf("h100-tp4: KVTokens %d err %v, want 461376", p.KVTokens(), err)
	}
	_, err = LookupProfile("nope")
	if err == nil || !strings.Contains(err.Error(), "instant, llama3-70b-h100-tp4") {
		t.Errorf("LookupProfile(nope) = %v, want the valid names", err)
	}
}

func TestWithBlockSize(t *testing.T) {
	p, err := LookupProfile("llama3-70b-h100-tp4")
	if err != nil {
		t.Fatal(err)
	}
	q := p.WithBlockSize(512)
	// 461,376 tokens = 901 blocks of 512 (and 64 tokens left over).
	if q.BlockSize != 512 || q.NumBlocks != 901 || q.StepOverhead != p.StepOverhead {
		t.Errorf("WithBlockSize(512) = block %d x %d, overhead %v", q.BlockSize, q.NumBlocks, q.StepOverhead)
	}
	if got := p.WithBlockSize(0); got != p {
		t.Errorf("WithBlockSize(0) changed the profile: %+v", got)
	}
}

func TestInstantProfile(t *testing.T) {
	p, err := LookupProfile("instant")
	if err != nil {
		t.Fatal(err)
	}
	e := newEngine(t, Config{Profile: p, TokenEvents: true})
	for i := range 10 {
		submit(t, e, 5, Request{ID: fmt.Sprint(i), PromptTokens: 30000, OutputTokens: 3, BlockKeys: keys(0, 100)})
	}
	evs, end := runIdle(t, e, 5)
	if end != 5 || len(evs) != 40 {
		t.Errorf("end %v, %d events; want 5ns, 40", end, len(evs))
	}
	for _, ev := range evs {
		if ev.At != 5 {
			t.Fatalf("event %+v not at 5ns", ev)
		}
	}
}

// TestRandomInvariants drives an engine with a seeded random workload and checks the block
// accounting after every step, and that every request finishes with all its tokens.
func TestRandomInvariants(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	e := newEngine(t, Config{NumBlocks: 40, MaxBatchedTokens: 32, MaxNumSeqs: 6, KVEvents: true, TokenEvents: true})
	produced := map[string]int{}
	wantOut := map[string]int{}
	var now time.Duration
	next := 0
	for step := 0; step < 20000 && (next < 300 || e.Stats().Running+e.Stats().Waiting > 0); step++ {
		for next < 300 && rng.IntN(3) == 0 {
			id := fmt.Sprint(next)
			prompt := 1 + rng.IntN(60)
			nk := rng.IntN(prompt/4 + 1)
			k := keys(uint64(rng.IntN(3))*100, nk)
			out := 1 + rng.IntN(30)
			if (prompt+out-1+3)/4 > 40 {
				out = 1
			}
			submit(t, e, now, Request{ID: id, PromptTokens: prompt, OutputTokens: out, BlockKeys: k, Salt: fmt.Sprint(rng.IntN(2))})
			wantOut[id] = out
			next++
		}
		if next%50 == 7 && rng.IntN(10) == 0 {
			if id := fmt.Sprint(rng.IntN(next)); e.Abort(now, id) {
				delete(wantOut, id)
				delete(produced, id)
			}
		}
		end, evs, ok := e.Step(now)
		for _, ev := range evs {
			if ev.Kind == EventFirstToken || ev.Kind == EventToken {
				produced[ev.ReqID]++
				if produced[ev.ReqID] != ev.OutputTokens {
					t.Fatalf("%s: token %d reported as %d", ev.ReqID, produced[ev.ReqID], ev.OutputTokens)
				}
			}
		}
		if ok {
			now = end
		}
		st := e.Stats()
		if st.UsedBlocks < 0 || st.UsedBlocks > 40 || st.CachedFreeBlocks > 40-st.UsedBlocks || st.Running > 6 {
			t.Fatalf("step %d: bad stats %+v", step, st)
		}
	}
	st := e.Stats()
	if st.Running != 0 || st.Waiting != 0 || st.UsedBlocks != 0 {
		t.Fatalf("not drained: %+v", st)
	}
	if diff := cmp.Diff(wantOut, produced); diff != "" {
		t.Errorf("tokens per request (-want +got):\n%s", diff)
	}
	// The KV events replay to exactly the engine's cached set.
	set := map[uint64]bool{}
	for _, ev := range e.DrainKVEvents() {
		for _, h := range ev.Hashes {
			switch ev.Kind {
			case KVBlockStored:
				if set[h] {
					t.Fatalf("hash %x stored twice", h)
				}
				set[h] = true
			case KVBlockRemoved:
				if !set[h] {
					t.Fatalf("hash %x removed but not stored", h)
				}
				delete(set, h)
			}
		}
	}
	if len(set) != e.pool.byHash.n || len(set) != st.CachedFreeBlocks {
		t.Errorf("replayed %d hashes, engine caches %d, cached free %d", len(set), e.pool.byHash.n, st.CachedFreeBlocks)
	}
}

func TestAbort(t *testing.T) {
	// MaxBatchedTokens 8: a's 16-token prompt takes two steps.
	e := newEngine(t, Config{MaxBatchedTokens: 8, MaxNumSeqs: 1})
	submit(t, e, 0, Request{ID: "a", PromptTokens: 16, OutputTokens: 3, BlockKeys: keys(1, 4)})
	submit(t, e, 0, Request{ID: "b", PromptTokens: 4, OutputTokens: 1})
	submit(t, e, 0, Request{ID: "c", PromptTokens: 4, OutputTokens: 1})
	now, evs, _ := e.Step(0) // a's first chunk: blocks 0 and 1 cached
	if len(evs) != 0 || now != 1080 {
		t.Fatalf("step 1: end %v events %v, want 1080ns and none", now, evs)
	}
	if !e.Abort(now, "b") { // waiting
		t.Fatal("Abort(b) = false")
	}
	if !e.Abort(now, "a") { // running, mid-prefill
		t.Fatal("Abort(a) = false")
	}
	if st := e.Stats(); st.Running != 0 || st.Waiting != 1 || st.UsedBlocks != 0 || st.CachedFreeBlocks != 2 {
		t.Fatalf("after aborts: %+v", st)
	}
	evs, _ = runIdle(t, e, now)
	if len(evs) != 2 || evs[0].ReqID != "c" || evs[1].Kind != EventFinished {
		t.Errorf("events after aborts = %+v, want c's first token and finish", evs)
	}
	// a's computed blocks stayed cached: a new a hits its first chunk (8 tokens).
	submit(t, e, now, Request{ID: "a", PromptTokens: 16, OutputTokens: 1, BlockKeys: keys(1, 4)})
	evs, _ = runIdle(t, e, now)
	if got := firstTokens(evs)["a"].CachedTokens; got != 8 {
		t.Errorf("resubmitted a: CachedTokens %d, want 8", got)
	}
}

func TestDecodeBudget(t *testing.T) {
	// Budget 2 tokens a step: a and b's prefills, then their decodes, use it all, so c is not
	// admitted until they finish.
	e := newEngine(t, Config{MaxBatchedTokens: 2})
	for _, id := range []string{"a", "b", "c"} {
		submit(t, e, 0, Request{ID: id, PromptTokens: 1, OutputTokens: 3})
	}
	now, _, _ := e.Step(0)     // a and b prefill
	now, _, _ = e.Step(now)    // a and b decode
	now, evs, _ := e.Step(now) // a and b finish; c still waits for the budget
	var got []string
	for _, ev := range evs {
		got = append(got, ev.ReqID+fmt.Sprint(ev.Kind))
	}
	if diff := cmp.Diff([]string{"a3", "b3"}, got); diff != "" {
		t.Errorf("step 3 events (-want +got):\n%s", diff)
	}
	evs, _ = runIdle(t, e, now)
	if ft := firstTokens(evs)["c"]; ft.At != now+1010 {
		t.Errorf("c first token at %v, want %v (the step after a and b finish)", ft.At, now+1010)
	}
	if st := e.Stats(); st.Finished != 3 || st.Preemptions != 0 {
		t.Errorf("stats %+v", st)
	}
}
