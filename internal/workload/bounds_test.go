package workload

import (
	"container/list"
	"math"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/kvroute/kvroute/internal/prefix"
)

// referenceHitRate is the plain per-engine-block model the bounds must match: engine blocks
// keyed by Keys and chained as the engine chains them, one list node each. capacityTokens < 0
// means unbounded.
func referenceHitRate(reqs []Request, blockSize, capacityTokens int) float64 {
	capacity := capacityTokens / blockSize
	lru := list.New()
	where := map[uint64]*list.Element{}
	var hit, total int64
	for _, i := range arrivalOrder(reqs) {
		r := &reqs[i]
		total += int64(r.PromptTokens)
		hashes := prefix.Chain(nil, 0, Keys(nil, r, blockSize))
		run := 0
		for run < len(hashes) && where[hashes[run]] != nil {
			run++
		}
		hit += int64(run * blockSize)
		for k := len(hashes) - 1; k >= 0; k-- {
			if e := where[hashes[k]]; e != nil {
				lru.MoveToFront(e)
			} else {
				where[hashes[k]] = lru.PushFront(hashes[k])
			}
		}
		for capacityTokens >= 0 && lru.Len() > capacity {
			delete(where, lru.Remove(lru.Back()).(uint64))
		}
	}
	if total == 0 {
		return 0
	}
	return float64(hit) / float64(total)
}

// req builds a request of the given tokens over blocks of blockTokens.
func req(arrival time.Duration, blockTokens, tokens int, blocks ...uint64) Request {
	return Request{Arrival: arrival, Blocks: blocks, BlockTokens: blockTokens, PromptTokens: tokens, OutputTokens: 1}
}

func TestBoundsByHand(t *testing.T) {
	tests := []struct {
		name            string
		reqs            []Request
		blockSize, capT int // capT < 0: infinite cache
		want            float64
	}{
		{"infinite aligned", []Request{
			req(0, 16, 48, 1, 2, 3), req(1, 16, 40, 1, 2, 4), req(2, 16, 16, 5),
		}, 16, -1, 32.0 / 104},
		{"infinite straddling engine blocks", []Request{
			req(0, 16, 48, 1, 2, 3), req(1, 16, 48, 1, 2, 4), req(2, 16, 32, 1, 5),
		}, 24, -1, 24.0 / 128},
		{"infinite coarse engine blocks", []Request{
			req(0, 16, 48, 1, 2, 3), req(1, 16, 48, 1, 2, 4), req(2, 16, 50, 1, 2, 3, 4),
		}, 32, -1, 64.0 / 146},
		{"lru evicts the least recent", []Request{
			req(0, 16, 32, 1, 2), req(1, 16, 16, 3), req(2, 16, 32, 1, 2), req(3, 16, 16, 3),
		}, 16, 32, 16.0 / 96},
		{"lru evicts a workload block's tail first", []Request{
			req(0, 32, 32, 7), req(1, 32, 16, 7), req(2, 32, 32, 9), req(3, 32, 32, 7),
		}, 16, 48, 32.0 / 112},
		{"lru sorts by arrival", []Request{
			req(3, 16, 16, 3), req(2, 16, 32, 1, 2), req(1, 16, 16, 3), req(0, 16, 32, 1, 2),
		}, 16, 32, 16.0 / 96},
		{"empty", nil, 16, -1, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got float64
			if tt.capT < 0 {
				got = InfiniteCacheHitRate(tt.reqs, tt.blockSize)
			} else {
				got = LRUHitRate(tt.reqs, tt.blockSize, tt.capT)
			}
			if math.Abs(got-tt.want) > 1e-12 {
				t.Errorf("hit rate = %v, want %v", got, tt.want)
			}
			if ref := referenceHitRate(tt.reqs, tt.blockSize, tt.capT); math.Abs(ref-tt.want) > 1e-12 {
				t.Errorf("reference hit rate = %v, want %v (the hand-worked figure is wrong)", ref, tt.want)
			}
		})
	}
	if got := LRUHitRate([]Request{req(0, 16, 32, 1), req(1, 16, 32, 1)}, 16, 15); got != 0 {
		t.Errorf("capacity below one block: %v, want 0", got)
	}
}

// randomWorkload builds n requests that extend random earlier prompts, so they share prefixes.
func randomWorkload(seed uint64, n, blockTokens int) []Request {
	state := seed
	reqs := make([]Request, 0, n)
	next := uint64(1)
	for i := 0; i < n; i++ {
		var blocks []uint64
		if i > 0 && splitmix(&state)%4 != 0 {
			p := reqs[splitmix(&state)%uint64(i)].Blocks
			blocks = append(blocks, p[:splitmix(&state)%uint64(len(p)+1)]...)
		}
		for k := int(splitmix(&state) % 5); k >= 0; k-- {
			blocks = append(blocks, next)
			next++
		}
		tokens := len(blocks)*blockTokens - int(splitmix(&state)%uint64(blockTokens))
		arrival := time.Duration(splitmix(&state) % 1000)
		reqs = append(reqs, req(arrival, blockTokens, tokens, blocks...))
	}
	return reqs
}

func TestBoundsMatchReference(t *testing.T) {
	for seed := uint64(1); seed <= 12; seed++ {
		bt := []int{16, 32, 64}[seed%3]
		reqs := randomWorkload(seed, 120, bt)
		for _, bs := range []int{16, 24, 32, 100} {
			if got, want := InfiniteCacheHitRate(reqs, bs), referenceHitRate(reqs, bs, -1); math.Abs(got-want) > 1e-12 {
				t.Errorf("seed %d blockSize %d: infinite %v, reference %v", seed, bs, got, want)
			}
			for _, capT := range []int{bs, 10 * bs, 60 * bs, 400 * bs} {
				if got, want := LRUHitRate(reqs, bs, capT), referenceHitRate(reqs, bs, capT); math.Abs(got-want) > 1e-12 {
					t.Errorf("seed %d blockSize %d capacity %d: LRU %v, reference %v", seed, bs, capT, got, want)
				}
			}
		}
	}
}

// checkTraceBounds checks the bounds against the figures in the trace's README.
func checkTraceBounds(t *testing.T, reqs []Request) {
	tests := []struct {
		name        string
		got, want   float64
		maxAbsError float64
	}{
		{"infinite, 512-token blocks", InfiniteCacheHitRate(reqs, 512), 0.374, 0.001},
		{"infinite, 16-token blocks", InfiniteCacheHitRate(reqs, 16), 0.374, 0.001},
		{"LRU 8 x 4882 blocks of 512", LRUHitRate(reqs, 512, 8*4882*512), 0.36, 0.005},
		{"LRU 8 x 2.5M tokens, 16-token blocks", LRUHitRate(reqs, 16, 8*2500000), 0.36, 0.005},
		{"LRU 4 x 901 blocks of 512", LRUHitRate(reqs, 512, 4*901*512), 0.08, 0.005},
		{"LRU 4 x 461,376 tokens, 16-token blocks", LRUHitRate(reqs, 16, 4*461376), 0.08, 0.005},
	}
	for _, tt := range tests {
		if math.Abs(tt.got-tt.want) > tt.maxAbsError {
			t.Errorf("%s: %.4f, want %.3f +- %.3f", tt.name, tt.got, tt.want, tt.maxAbsError)
		}
	}
}

func TestArrivalOrder(t *testing.T) {
	reqs := []Request{req(3, 16, 1, 1), req(1, 16, 1, 1), req(3, 16, 1, 1), req(0, 16, 1, 1)}
	if diff := cmp.Diff([]int{3, 1, 0, 2}, arrivalOrder(reqs)); diff != "" {
		t.Errorf("arrivalOrder (-want +got):\n%s", diff)
	}
}

func BenchmarkLRUHitRate(b *testing.B) {
	reqs := randomWorkload(7, 2000, 512)
	b.ReportAllocs()
	for b.Loop() {
		_ = LRUHitRate(reqs, 16, 200*512)
	}
}

func BenchmarkInfiniteCacheHitRate(b *testing.B) {
	reqs := randomWorkload(7, 2000, 512)
	b.ReportAllocs()
	for b.Loop() {
		_ = InfiniteCacheHitRate(reqs, 16)
	}
}

func TestRandomPlacementHitRate(t *testing.T) {
	reqs := randomWorkload(3, 300, 32)
	for _, capT := range []int{160, 1600, 1 << 20} {
		if got, want := RandomPlacementHitRate(reqs, 16, 1, capT, 9), LRUHitRate(reqs, 16, capT); got != want {
			t.Errorf("capacity %d: one instance %v, want the LRU bound %v", capT, got, want)
		}
	}
	a := RandomPlacementHitRate(reqs, 16, 4, 1<<20, 9)
	if b := RandomPlacementHitRate(reqs, 16, 4, 1<<20, 9); a != b {
		t.Errorf("same seed, different results: %v and %v", a, b)
	}
	if inf := InfiniteCacheHitRate(reqs, 16); !(a > 0 && a < inf) {
		t.Errorf("4 random instances hit %v, want above 0 and below the infinite cache's %v", a, inf)
	}
	// Two requests sharing 32 tokens on 2 instances: over seeds, the second hits about half the time.
	pair := []Request{req(0, 16, 32, 1, 2), req(1, 16, 32, 1, 2)}
	hits := 0
	for seed := uint64(0); seed < 400; seed++ {
		if RandomPlacementHitRate(pair, 16, 2, 1<<10, seed) > 0 {
			hits++
		}
	}
	if hits < 150 || hits > 250 {
		t.Errorf("second request hit in %d of 400 seeds, want about 200", hits)
	}
	if got := RandomPlacementHitRate(pair, 16, 0, 1<<10, 1); got != 0 {
		t.Errorf("no instances: %v, want 0", got)
	}
}
