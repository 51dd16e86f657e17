package policy

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/prefix"
)

// benchFleet is 64 endpoints of 2.5M KV tokens whose index holds about 1M (block, endpoint)
// entries, and a 32k-token request (2,048 blocks) whose first 32 blocks every endpoint holds,
// whose first 1,024 blocks endpoints 6..9 hold and which endpoint 5 holds whole.
func benchFleet(b *testing.B) (*prefixAware, []*endpoint.Endpoint, *Request) {
	b.Helper()
	pk, err := New("prefix-aware", nil, Env{Clock: &fakeClock{t: time.Unix(1000, 0)}})
	if err != nil {
		b.Fatal(err)
	}
	pa := pk.(*prefixAware)
	eps := newEndpoints(64, 2_500_000)
	r := rand.New(rand.NewPCG(5, 6))
	keys := make([]uint64, 2048)
	for i := range keys {
		keys[i] = r.Uint64()
	}
	rq := &Request{ID: "bench", Model: "m", BlockTokens: 16, PromptTokens: 32768,
		Blocks: prefix.Chain(nil, prefix.Seed("m", ""), keys)}
	filler := make([]uint64, 64)
	now := int64(0)
	for n := 0; n < 1<<20-2048-4*1024-64*32; n += len(filler) {
		for i := range filler {
			filler[i] = r.Uint64()
		}
		now++
		pa.index.Insert(r.IntN(64), prefix.Chain(nil, 1, filler), now)
	}
	for _, e := range eps {
		pa.index.Insert(e.ID, rq.Blocks[:32], now)
		pa.sizeIndex(e, pa.state(e.ID), 16)
	}
	for id := 6; id < 10; id++ {
		pa.index.Insert(id, rq.Blocks[:1024], now)
	}
	pa.index.Insert(5, rq.Blocks, now)
	// Some load, so that the guard and the queue terms have work to do.
	for i, e := range eps {
		for k := 0; k < i%5; k++ {
			e.Start(1000)
		}
	}
	return pa, eps, rq
}

func BenchmarkPrefixAware_Pick(b *testing.B) {
	pa, eps, rq := benchFleet(b)
	b.Run("endpoints=64/blocks=2048", func(b *testing.B) {
		b.ReportAllocs()
		var got []*endpoint.Endpoint
		for b.Loop() {
			got, _ = pa.Pick(rq, eps)
		}
		if got[0].ID != 5 {
			b.Fatalf("picked %d, want 5 (holds the whole prompt)", got[0].ID)
		}
		n, bytes := pa.IndexSize()
		b.ReportMetric(float64(bytes)/float64(n), "index-bytes/entry")
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		start := time.Now()
		b.RunParallel(func(p *testing.PB) {
			for p.Next() {
				_, _ = pa.Pick(rq, eps)
			}
		})
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "picks/s")
	})
}

// BenchmarkPrefixAware_Defer is what one router adds before each Pick (stepHold): a pass over
// the candidates' queues where none has a step to hold for, and a second ranking of the
// candidates where the best one has (here a request held for endpoint 5).
func BenchmarkPrefixAware_Defer(b *testing.B) {
	pa, eps, rq := benchFleet(b)
	for range 10 {
		pa.fleet.add(1, 1, learnWeight, 0, 0, 0) // calibrated: holds are possible
	}
	b.Run("nothing-to-hold", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if pa.Defer(rq, eps) != 0 {
				b.Fatal("held with every queue empty")
			}
		}
	})
	b.Run("held", func(b *testing.B) {
		pa.state(5).heldUntil.Store(pa.clock.Now().UnixNano() + int64(time.Hour))
		b.ReportAllocs()
		for b.Loop() {
			if pa.Defer(rq, eps) == 0 {
				b.Fatal("not held behind the request held for endpoint 5")
			}
		}
	})
}

// BenchmarkPrefixAware_Lifecycle is what the policy does for one request besides its Pick:
// Routed, FirstToken and Done on the pick benchmark's fleet.
func BenchmarkPrefixAware_Lifecycle(b *testing.B) {
	pa, eps, rq := benchFleet(b)
	b.ReportAllocs()
	for b.Loop() {
		pa.Routed(rq, eps[5])
		pa.FirstToken(rq, eps[5], time.Millisecond)
		pa.Done(rq, eps[5], Result{OK: true, CachedTokens: rq.PromptTokens, PromptTokens: rq.PromptTokens})
	}
}
