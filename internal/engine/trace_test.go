package engine

import (
	"bufio"
	"bytes"
	"errors"
	"io/fs"
	"math"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/workload"
)

const tracePath = "../../../shared/traces/mooncake/conversation_trace.jsonl"

// loadTraceHead reads the first n requests of the Mooncake trace, skipping the test when the
// trace is absent.
func loadTraceHead(t testing.TB, n int) []workload.Request {
	t.Helper()
	f, err := os.Open(tracePath)
	if errors.Is(err, fs.ErrNotExist) {
		t.Skipf("trace absent: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var head bytes.Buffer
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for i := 0; i < n && sc.Scan(); i++ {
		head.Write(sc.Bytes())
		head.WriteByte('\n')
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	reqs, err := workload.ReadMooncake(&head)
	if err != nil {
		t.Fatal(err)
	}
	if len(reqs) != n {
		t.Fatalf("trace head: %d requests, want %d", len(reqs), n)
	}
	return reqs
}

// TestMooncakeHitRateBounds feeds the head of the real Mooncake trace, one request at a time,
// through an instant engine with 512-token blocks, and compares its prefix hit rate with the
// workload package's independent bounds: with room for everything it must match the
// infinite-cache rate, and with a small cache it must stay just under the LRU rate (the engine
// also parks uncached partial and output blocks in its free queue, which costs it a little
// capacity, and it always recomputes a prompt's last token).
func TestMooncakeHitRateBounds(t *testing.T) {
	reqs := loadTraceHead(t, 2000)
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

// BenchmarkEngine_Trace replays the first 1,500 requests of the real Mooncake trace (about
// 7 minutes of traffic) on 8 x H200 engines, round robin, in virtual time: the engine-model
// share of a fleet simulation, reported per simulated request.
func BenchmarkEngine_Trace(b *testing.B) {
	reqs := loadTraceHead(b, 1500)
	p, err := LookupProfile("llama3-70b-h200-tp8")
	if err != nil {
		b.Fatal(err)
	}
	er := make([]Request, len(reqs))
	for i := range reqs {
		r := &reqs[i]
		er[i] = Request{ID: strconv.Itoa(i), PromptTokens: r.PromptTokens, OutputTokens: r.OutputTokens, BlockKeys: workload.Keys(nil, r, p.BlockSize)}
	}
	const n = 8
	var hits, queries int64
	b.ReportAllocs()
	for b.Loop() {
		var engines [n]*Engine
		var ends [n]time.Duration // next step start of each busy engine
		var busy [n]bool
		for i := range engines {
			engines[i] = newEngine(b, Config{Profile: p})
		}
		next := 0
		for range 100_000_000 {
			which, at := -1, time.Duration(math.MaxInt64)
			for i := range engines {
				if busy[i] && ends[i] < at {
					which, at = i, ends[i]
				}
			}
			if next < len(reqs) && reqs[next].Arrival <= at {
				k, t := next%n, reqs[next].Arrival
				if err := engines[k].Submit(t, er[next]); err != nil {
					b.Fatal(err)
				}
				if !busy[k] {
					busy[k], ends[k] = true, t
				}
				next++
				continue
			}
			if which < 0 {
				break
			}
			end, _, ok := engines[which].Step(at)
			busy[which], ends[which] = ok, end
		}
		hits, queries = 0, 0
		for _, e := range engines {
			st := e.Stats()
			if st.Finished != int64(len(reqs)/n) && st.Finished != int64(len(reqs)/n+1) {
				b.Fatalf("finished %d of about %d", st.Finished, len(reqs)/n)
			}
			hits += st.PrefixHitTokens
			queries += st.PrefixQueryTokens
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(reqs)), "ns/req")
	b.ReportMetric(float64(hits)/float64(queries), "hit-rate")
}
