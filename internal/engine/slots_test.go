package engine

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// slotProfile is tinyProfile with a cache of n sequence slots of 16 blocks (64 tokens) each, and
// as many sequences running as there are slots (ollama's OLLAMA_NUM_PARALLEL is both).
func slotProfile(n int) Profile {
	p := tinyProfile()
	p.CacheSlots, p.MaxNumSeqs, p.NumBlocks = n, n, 16*n
	return p
}

// hitOf runs r alone from now on an otherwise idle e and returns its cached tokens and the time
// the engine is idle again.
func hitOf(t *testing.T, e *Engine, now time.Duration, r Request) (int, time.Duration) {
	t.Helper()
	submit(t, e, now, r)
	evs, end := runIdle(t, e, now)
	ft, ok := firstTokens(evs)[r.ID]
	if !ok {
		t.Fatalf("%s: no first token", r.ID)
	}
	return ft.CachedTokens, end
}

// loadOrder returns each slot's load number (0: never loaded).
func loadOrder(e *Engine) []uint64 {
	var out []uint64
	for _, sl := range e.slots.slots {
		out = append(out, sl.lastUsed)
	}
	return out
}

// A second request of a group finds the first one's slot, copies the shared prefix into a free
// slot (the first one's slot keeps its whole sequence), and so on: four requests of a group hold
// four copies of its prefix, and a fifth group evicts only the oldest of them.
func TestSlotCacheCopiesPrefix(t *testing.T) {
	e := newEngine(t, Config{Profile: slotProfile(4)})
	group := keys(100, 4) // 16 tokens
	req := func(id string, g []uint64, q uint64) Request {
		return Request{ID: id, PromptTokens: 24, OutputTokens: 1, BlockKeys: append(append([]uint64{}, g...), keys(q, 2)...)}
	}
	var now time.Duration
	var hits []int
	for i := range 4 {
		var h int
		h, now = hitOf(t, e, now, req(fmt.Sprint("a", i), group, uint64(1000*(i+1))))
		hits = append(hits, h)
	}
	if diff := cmp.Diff([]int{0, 16, 16, 16}, hits); diff != "" {
		t.Errorf("hits of a group's four requests (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]uint64{1, 2, 3, 4}, loadOrder(e)); diff != "" {
		t.Errorf("slot loads (-want +got):\n%s", diff)
	}
	prefix := e.BlockHashes(Request{PromptTokens: 16, BlockKeys: group})
	for i, sl := range e.slots.slots {
		if sl.tokens != 24 || len(sl.hashes) != 6 || commonPrefix(sl.hashes, prefix) != 4 {
			t.Errorf("slot %d: %d tokens, %d blocks, %d of them the group's prefix; want 24, 6 and 4", i, sl.tokens, len(sl.hashes), commonPrefix(sl.hashes, prefix))
		}
	}
	// Another group takes the least recently loaded slot (0); the group keeps three copies.
	if h, end := hitOf(t, e, now, req("b", keys(500, 4), 9000)); h != 0 || e.slots.slots[0].lastUsed != 5 {
		t.Errorf("b: hit %d in slot loads %v, want 0 in slot 0 (load 5)", h, loadOrder(e))
	} else {
		now = end
	}
	if h, _ := hitOf(t, e, now, req("a4", group, 8000)); h != 16 {
		t.Errorf("a4 after b: hit %d, want 16", h)
	}
	if st := e.Stats(); st.PrefixHitTokens != 4*16 || st.PrefixQueryTokens != 6*24 || st.Preemptions != 0 {
		t.Errorf("stats %+v: want 64 of 144 prompt tokens hit, no preemption", st)
	}
}

// Slots are evicted whole, least recently loaded first: recency is the time a slot was taken
// (ollama's lastUsed), not the time its sequence finished. A block cache of the same size keeps
// every prefix of this test.
func TestSlotCacheLRUWholeSequences(t *testing.T) {
	group := func(g int, q uint64) []uint64 { return append(keys(uint64(100*g), 4), keys(q, 2)...) }
	run := func(p Profile) []int {
		e := newEngine(t, Config{Profile: p})
		// A (long output) and B, C, D start together: A loads first and finishes last.
		for g, out := range []int{40, 1, 1, 1} {
			submit(t, e, 0, Request{ID: fmt.Sprint("g", g), PromptTokens: 24, OutputTokens: out, BlockKeys: group(g, 1000)})
		}
		evs, now := runIdle(t, e, 0)
		if fin := evs[len(evs)-1]; fin.ReqID != "g0" || fin.Kind != EventFinished {
			t.Fatalf("last event %+v, want g0's finish", fin)
		}
		var hits []int
		// E evicts A's slot; A's next request misses and evicts B's (loaded second); C's hits
		// and takes C's own slot (the oldest, holding the longest prefix); B's misses.
		for i, g := range []int{4, 0, 2, 1} {
			var h int
			h, now = hitOf(t, e, now, Request{ID: fmt.Sprint("n", i), PromptTokens: 24, OutputTokens: 1, BlockKeys: group(g, 2000)})
			hits = append(hits, h)
		}
		return hits
	}
	if diff := cmp.Diff([]int{0, 0, 16, 0}, run(slotProfile(4))); diff != "" {
		t.Errorf("slot cache hits of E, A, C, B (-want +got):\n%s", diff)
	}
	block := slotProfile(4)
	block.CacheSlots = 0
	if diff := cmp.Diff([]int{0, 16, 16, 16}, run(block)); diff != "" {
		t.Errorf("block cache hits of E, A, C, B (-want +got):\n%s", diff)
	}
}

// A request whose best match is a busy slot copies what that slot has computed so far into a
// free one.
func TestSlotCacheBusyBestSlot(t *testing.T) {
	p := slotProfile(4)
	p.MaxBatchedTokens = 12
	e := newEngine(t, Config{Profile: p})
	shared := keys(100, 7) // 28 tokens
	a := Request{ID: "a", PromptTokens: 32, OutputTokens: 1, BlockKeys: append(append([]uint64{}, shared...), 1000)}
	b := Request{ID: "b", PromptTokens: 32, OutputTokens: 1, BlockKeys: append(append([]uint64{}, shared...), 2000)}
	submit(t, e, 0, a)
	now, _, _ := e.Step(0)  // a: 12 tokens
	now, _, _ = e.Step(now) // a: 24 tokens; its prefill takes the whole budget
	submit(t, e, now, b)    // b is admitted beside a's last 8 tokens
	evs, now := runIdle(t, e, now)
	ft := firstTokens(evs)
	if ft["a"].CachedTokens != 0 || ft["b"].CachedTokens != 24 {
		t.Errorf("hits a %d, b %d: want 0 and the 24 tokens a had computed when b arrived", ft["a"].CachedTokens, ft["b"].CachedTokens)
	}
	if diff := cmp.Diff([]uint64{1, 2, 0, 0}, loadOrder(e)); diff != "" {
		t.Errorf("slot loads (-want +got):\n%s", diff)
	}
	// Once a is done its slot holds all 28 shared tokens.
	if h, _ := hitOf(t, e, now, Request{ID: "c", PromptTokens: 32, OutputTokens: 1, BlockKeys: append(append([]uint64{}, shared...), 3000)}); h != 28 {
		t.Errorf("c: hit %d, want 28", h)
	}
}

// A free slot whose whole content is a prefix of the prompt (the conversation so far) is
// continued in place, however recently it was used; other slots keep what they hold.
func TestSlotCacheContinuesWholeMatch(t *testing.T) {
	e := newEngine(t, Config{Profile: slotProfile(3)})
	turn := keys(100, 4)
	// a leaves exactly its 16 prompt tokens (output 1: the sampled token is not kept).
	h, now := hitOf(t, e, 0, Request{ID: "a", PromptTokens: 16, OutputTokens: 1, BlockKeys: turn})
	if h != 0 {
		t.Fatalf("a: hit %d", h)
	}
	_, now = hitOf(t, e, now, Request{ID: "c", PromptTokens: 16, OutputTokens: 2, BlockKeys: keys(500, 4)})
	h, now = hitOf(t, e, now, Request{ID: "b", PromptTokens: 24, OutputTokens: 1, BlockKeys: append(append([]uint64{}, turn...), 7, 8)})
	if h != 16 {
		t.Errorf("b: hit %d, want 16", h)
	}
	if diff := cmp.Diff([]uint64{3, 2, 0}, loadOrder(e)); diff != "" {
		t.Errorf("slot loads (-want +got): b continues a's slot, slot 2 stays unused:\n%s", diff)
	}
	// A prompt equal to a slot's content reuses all but its last token, in whole blocks.
	if h, _ := hitOf(t, e, now, Request{ID: "a2", PromptTokens: 16, OutputTokens: 1, BlockKeys: turn}); h != 12 {
		t.Errorf("a2: hit %d, want 12 (the last token is computed: its block is)", h)
	}
}

func TestSlotCacheErrors(t *testing.T) {
	for _, tc := range []struct {
		slots, seqs, blocks int
	}{
		{-1, 4, 64},
		{2, 4, 64}, // more sequences than slots
		{4, 4, 3},  // less than a block per slot
	} {
		p := tinyProfile()
		p.CacheSlots, p.MaxNumSeqs, p.NumBlocks = tc.slots, tc.seqs, tc.blocks
		if _, err := New(Config{Profile: p}); err == nil || !strings.Contains(err.Error(), "CacheSlots") {
			t.Errorf("slots %d, seqs %d, blocks %d: error %v, want one about CacheSlots", tc.slots, tc.seqs, tc.blocks, err)
		}
	}
	// A sequence must fit one slot (16 blocks of 4 tokens), not the whole cache.
	e := newEngine(t, Config{Profile: slotProfile(4)})
	err := e.Submit(0, Request{ID: "x", PromptTokens: 64, OutputTokens: 2})
	if err == nil || !strings.Contains(err.Error(), "need 17 KV blocks but a cache slot holds 16") {
		t.Errorf("Submit of 65 tokens: %v", err)
	}
	submit(t, e, 0, Request{ID: "y", PromptTokens: 64, OutputTokens: 1})
}

// Random requests, aborts included, on a slot cache: every request gets its tokens, nothing is
// preempted, at most one sequence per slot runs, a hit is never the whole prompt, and the blocks
// the slots hold never exceed the cache.
func TestSlotCacheRandomInvariants(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	p := slotProfile(3)
	p.MaxBatchedTokens = 20
	e := newEngine(t, Config{Profile: p, TokenEvents: true, KVEvents: true})
	produced, wantOut, prompt := map[string]int{}, map[string]int{}, map[string]int{}
	var now time.Duration
	next := 0
	for step := 0; step < 20000 && (next < 300 || e.Stats().Running+e.Stats().Waiting > 0); step++ {
		for next < 300 && rng.IntN(3) == 0 {
			id := fmt.Sprint(next)
			n := 1 + rng.IntN(50)
			k := keys(uint64(rng.IntN(3))*100, rng.IntN(n/4+1))
			out := 1 + rng.IntN(64-n)
			submit(t, e, now, Request{ID: id, PromptTokens: n, OutputTokens: out, BlockKeys: k})
			wantOut[id], prompt[id] = out, n
			next++
		}
		if rng.IntN(40) == 0 {
			if id := fmt.Sprint(rng.IntN(max(next, 1))); e.Abort(now, id) {
				delete(wantOut, id)
				delete(produced, id)
			}
		}
		end, evs, ok := e.Step(now)
		for _, ev := range evs {
			if ev.Kind == EventFirstToken && ev.CachedTokens >= prompt[ev.ReqID] {
				t.Fatalf("%s: hit %d of a %d-token prompt", ev.ReqID, ev.CachedTokens, prompt[ev.ReqID])
			}
			if ev.Kind == EventFirstToken || ev.Kind == EventToken {
				produced[ev.ReqID]++
			}
		}
		if ok {
			now = end
		}
		st := e.Stats()
		if st.Running > 3 || st.Preemptions != 0 || st.UsedBlocks+st.CachedFreeBlocks > p.NumBlocks {
			t.Fatalf("step %d: bad stats %+v", step, st)
		}
	}
	st := e.Stats()
	if st.Running != 0 || st.Waiting != 0 || st.UsedBlocks != 0 || st.PrefixHitTokens == 0 {
		t.Fatalf("not drained, or never a hit: %+v", st)
	}
	if diff := cmp.Diff(wantOut, produced); diff != "" {
		t.Errorf("tokens per request (-want +got):\n%s", diff)
	}
	if kv := e.DrainKVEvents(); len(kv) != 0 {
		t.Errorf("%d KV events from a slot cache, want none (ollama publishes none)", len(kv))
	}
}
