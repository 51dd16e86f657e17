package engine

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// BenchmarkEngine_Step measures one step of a steady batch of 64 decoding requests with 2k
// prompts sharing a 1k prefix, each finished request replaced by a new one.
func BenchmarkEngine_Step(b *testing.B) {
	p, err := LookupProfile("llama3-70b-h200-tp8")
	if err != nil {
		b.Fatal(err)
	}
	e := newEngine(b, Config{Profile: p})
	const batch = 64
	ids := make([]string, batch)
	reqKeys := make([][]uint64, batch)
	for i := range ids {
		ids[i] = fmt.Sprint("r", i)
		reqKeys[i] = append(keys(0, 64), keys(uint64(1000+i*100), 64)...)
	}
	newReq := func(i, gen int) Request {
		return Request{ID: ids[i], PromptTokens: 2048 + 5, OutputTokens: 50 + (i*7+gen)%200, BlockKeys: reqKeys[i]}
	}
	index := make(map[string]int, batch)
	for i := range ids {
		index[ids[i]] = i
		submit(b, e, 0, newReq(i, 0))
	}
	var now time.Duration
	gen := 0
	b.ReportAllocs()
	for b.Loop() {
		end, evs, _ := e.Step(now)
		now = end
		for _, ev := range evs {
			if ev.Kind == EventFinished {
				gen++
				if err := e.Submit(now, newReq(index[ev.ReqID], gen)); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
}

// mooncakeLike returns n requests shaped like the Mooncake conversation trace: one every 4 s
// (keeping one 8 x H200 engine about 90 % busy), log-normal prompts with a median near 7k tokens (mean about 12k),
// outputs averaging about 340 tokens, every prompt starting with a shared 512-token system
// prompt, and half of them continuing an earlier conversation (its prompt and output, then new
// tokens).
func mooncakeLike(n, blockSize int, seed uint64) ([]Request, []time.Duration) {
	rng := rand.New(rand.NewPCG(seed, 1))
	reqs := make([]Request, n)
	at := make([]time.Duration, n)
	next := uint64(1 << 32)
	for i := range reqs {
		at[i] = time.Duration(i) * 4 * time.Second
		prompt := int(math.Min(100000, math.Exp(8.85+1.0*rng.NormFloat64())))
		prompt = max(prompt, 600)
		out := 1 + rng.IntN(680)
		var k []uint64
		if i > 0 && rng.IntN(2) == 0 {
			prev := reqs[rng.IntN(i)]
			prompt += prev.PromptTokens + prev.OutputTokens
			k = append(k, prev.BlockKeys...)
		} else {
			k = append(k, keys(0, 512/blockSize)...)
		}
		prompt = min(prompt, 120000)
		for len(k) < prompt/blockSize {
			k = append(k, next)
			next++
		}
		k = k[:prompt/blockSize]
		reqs[i] = Request{ID: fmt.Sprint(i), PromptTokens: prompt, OutputTokens: out, BlockKeys: k}
	}
	return reqs, at
}

// BenchmarkEngine_Mooncake runs 1,000 Mooncake-like requests through one 8 x H200 engine and
// reports the cost per simulated request.
func BenchmarkEngine_Mooncake(b *testing.B) {
	p, err := LookupProfile("llama3-70b-h200-tp8")
	if err != nil {
		b.Fatal(err)
	}
	const n = 1000
	reqs, at := mooncakeLike(n, p.BlockSize, 7)
	var st Stats
	var last time.Duration
	b.ReportAllocs()
	for b.Loop() {
		e := newEngine(b, Config{Profile: p})
		var now time.Duration
		next, done := 0, 0
		for steps := 0; done < n && steps < 10_000_000; steps++ {
			for next < n && at[next] <= now {
				if err := e.Submit(at[next], reqs[next]); err != nil {
					b.Fatal(err)
				}
				next++
			}
			end, evs, ok := e.Step(now)
			if !ok {
				now = at[next]
				continue
			}
			for _, ev := range evs {
				if ev.Kind == EventFinished {
					done++
				}
			}
			now = end
		}
		st, last = e.Stats(), now
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/req")
	b.ReportMetric(float64(st.PrefixHitTokens)/float64(st.PrefixQueryTokens), "hit-rate")
	b.ReportMetric(float64(st.Busy)/float64(last), "busy-frac")
}
