package engine

import (
	"errors"
	"io/fs"
	"math"
	"testing"

	"github.com/kvroute/kvroute/internal/workload"
)

const tracePath = "../../../shared/traces/mooncake/conversation_trace.jsonl"

// TestMooncakeHitRateBounds feeds the head of the real Mooncake trace, one request at a time,
// through an instant engine with 512-token blocks, and compares its prefix hit rate with the
// workload package's independent bounds: with room for everything it must match the
// infinite-cache rate, and with a small cache it must stay just under the LRU rate (the engine
// also parks uncached partial and output blocks in its free queue, which costs it a little
// capacity, and it always recomputes a prompt's last token).
func TestMooncakeHitRateBounds(t *testing.T) {
	reqs, err := workload.LoadMooncake(tracePath)
	if errors.Is(err, fs.ErrNotExist) {
		t.Skipf("trace absent: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	reqs = reqs[:2000]
	const bs = 512
	run := func(numBlocks int) float64 {
		e := newEngine(t, Config{Profile: Profile{Name: "instant-512", BlockSize: bs, NumBlocks: numBlocks, MaxNumSeqs: 1, MaxBatchedTokens: 1 << 20}})
		var k []uint64
		for i := range reqs {
			r := &reqs[i]
			k = workload.Keys(k[:0], r, bs)
			submit(t, e, 0, Request{ID: "r", PromptTokens: r.PromptTokens, OutputTokens: r.OutputTokens, BlockKeys: k})
			runIdle(t, e, 0)
		}
		st := e.Stats()
		return float64(st.PrefixHitTokens) / float64(st.PrefixQueryTokens)
	}
	inf := workload.InfiniteCacheHitRate(reqs, bs)
	if got := run(1 << 17); math.Abs(got-inf) > 0.003 {
		t.Errorf("big cache: engine hit rate %.4f, infinite-cache rate %.4f", got, inf)
	} else {
		t.Logf("big cache: engine %.4f, infinite cache %.4f", got, inf)
	}
	const small = 2000 // blocks: about 1M tokens
	lru := workload.LRUHitRate(reqs, bs, small*bs)
	if got := run(small); got > lru+0.002 || got < lru-0.05 {
		t.Errorf("%d blocks: engine hit rate %.4f, LRU rate %.4f", small, got, lru)
	} else {
		t.Logf("%d blocks: engine %.4f, LRU %.4f", small, got, lru)
	}
}
