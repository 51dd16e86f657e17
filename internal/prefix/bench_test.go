package prefix

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

func BenchmarkChunk(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, size := range []int{4 << 10, 128 << 10} {
		text := randText(r, size)
		b.Run(fmt.Sprintf("bytes=%d", size), func(b *testing.B) {
			dst := make([]uint64, 0, size/64)
			seed := Seed("m", "salt")
			b.SetBytes(int64(size))
			b.ReportAllocs()
			for b.Loop() {
				dst = Blocks(dst[:0], seed, text, DefaultBlockTokens)
			}
		})
	}
	b.Run("normalize+chunk/bytes=131072", func(b *testing.B) {
		text := randText(r, 128<<10)
		var n *Normalizer
		seed := Seed("m", "salt")
		dst := make([]uint64, 0, 2048)
		b.SetBytes(int64(len(text)))
		b.ReportAllocs()
		for b.Loop() {
			dst = Blocks(dst[:0], seed, n.Normalize(text), DefaultBlockTokens)
		}
	})
}

// BenchFleet builds the benchmark fleet: 64 endpoints holding about total (block, endpoint)
// entries in all, and a 2,048-block request (32k tokens) whose first 32 blocks every endpoint
// holds, whose first 1,024 blocks endpoints 6..9 hold and which endpoint 5 holds whole.
func benchFleet(tb testing.TB, total int) (*Index, []uint64) {
	tb.Helper()
	const eps = 64
	x := NewIndex(IndexConfig{DefaultCapacity: total/eps + 4096})
	r := rand.New(rand.NewPCG(5, 6))
	keys := make([]uint64, 2048)
	for i := range keys {
		keys[i] = r.Uint64()
	}
	req := Chain(nil, Seed("m", ""), keys)
	now := int64(0)
	filler := make([]uint64, 64)
	for n := 0; n < total-2048-4*1024-64*32; n += len(filler) {
		for i := range filler {
			filler[i] = r.Uint64()
		}
		now++
		x.Insert(r.IntN(eps), Chain(nil, 1, filler), now)
	}
	for ep := 0; ep < eps; ep++ {
		x.Insert(ep, req[:32], now)
	}
	for ep := 6; ep < 10; ep++ {
		x.Insert(ep, req[:1024], now)
	}
	x.Insert(5, req, now)
	return x, req
}

func BenchmarkIndex_Match(b *testing.B) {
	x, req := benchFleet(b, 1<<20)
	runs := make([]int32, 64)
	b.Run("blocks=2048", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			x.Match(runs, req)
		}
		if runs[5] != 2048 || runs[7] != 1024 || runs[40] != 32 {
			b.Fatalf("runs = %v", runs)
		}
		n, bytes := x.Size()
		b.ReportMetric(float64(bytes)/float64(n), "index-bytes/entry")
		b.ReportMetric(float64(n), "entries")
	})
}

func BenchmarkIndex_Insert(b *testing.B) {
	x, req := benchFleet(b, 1<<18)
	b.ReportAllocs()
	now := int64(1 << 40)
	for b.Loop() {
		now++
		x.Insert(3, req, now)
	}
}
