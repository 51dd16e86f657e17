package prefix

import (
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
)

// uniqueByHand counts ep's blocks that no other endpoint holds, block by block through Match.
func uniqueByHand(x *Index, ep, eps int, chains [][]uint64) int {
	held := map[uint64]bool{}
	runs := make([]int32, eps)
	for _, c := range chains {
		for i := range c {
			x.Match(runs, c[:i+1])
			if runs[ep] != int32(i+1) {
				continue
			}
			alone := true
			for o := range runs {
				alone = alone && (o == ep || runs[o] != int32(i+1))
			}
			if alone {
				held[c[i]] = true
			}
		}
	}
	return len(held)
}

func TestIndex_Unique(t *testing.T) {
	x := NewIndex(IndexConfig{DefaultCapacity: 100})
	sys := chain(1, 2)        // everyone's system prompt
	a := chain(1, 2, 3, 4)    // a conversation on endpoint 0
	b := chain(1, 2, 3, 4, 5) // its next turn, also on endpoint 1
	c := chain(1, 2, 7, 8, 9) // another on endpoint 1 only
	sec := int64(time.Second)
	x.Insert(0, sys, 10*sec)
	x.Insert(1, sys, 10*sec)
	x.Insert(0, a, 20*sec)
	x.Insert(1, b, 30*sec)
	x.Insert(1, c, 40*sec)

	// Endpoint 0 holds 1, 2, 3, 4: endpoint 1 holds all of them. Nothing is its alone.
	if n, v := x.Unique(0, 40*sec, time.Minute); n != 0 || v != 0 {
		t.Errorf("endpoint 0: %d blocks, value %g; want 0, 0 (endpoint 1 holds all it holds)", n, v)
	}
	// Endpoint 1 alone holds b's block 5 (touched at 30 s) and c's 7, 8, 9 (at 40 s; Insert
	// stamps a chain's blocks a nanosecond apart, the first last).
	n, v := x.Unique(1, 40*sec, time.Minute)
	if n != 4 {
		t.Errorf("endpoint 1: %d blocks alone, want 4", n)
	}
	want := math.Exp(-10.0/60) + 3 // within a few nanoseconds
	if math.Abs(v-want) > 1e-6 {
		t.Errorf("endpoint 1: value %g, want %g (block 5 ten seconds old, three blocks new)", v, want)
	}
	if got := uniqueByHand(x, 1, 2, [][]uint64{sys, a, b, c}); got != n {
		t.Errorf("by hand endpoint 1 holds %d alone, Unique says %d", got, n)
	}
	// No window: every block counts 1. An endpoint never seen, or negative, holds nothing.
	if _, v := x.Unique(1, 40*sec, 0); v != 4 {
		t.Errorf("no window: value %g, want 4", v)
	}
	for _, ep := range []int{-1, 7} {
		if n, v := x.Unique(ep, 40*sec, time.Minute); n != 0 || v != 0 {
			t.Errorf("endpoint %d: %d, %g; want nothing", ep, n, v)
		}
	}
	// Endpoint 0 forgets a's tail: block 4 becomes endpoint 1's alone; old blocks decay.
	x.Drop(0, a[3:])
	if n, _ := x.Unique(1, 40*sec, time.Minute); n != 5 {
		t.Errorf("after endpoint 0 dropped block 4: endpoint 1 holds %d alone, want 5", n)
	}
	if _, v := x.Unique(1, 40*sec+60*60*sec, time.Minute); v > 1e-20 {
		t.Errorf("an hour later: value %g, want about 0", v)
	}
}

// TestIndex_UniqueChunks: walked in chunks, with the lock let go between them, the answer is
// the one a single walk gives.
func TestIndex_UniqueChunks(t *testing.T) {
	x := NewIndex(IndexConfig{DefaultCapacity: 1 << 16})
	r := rand.New(rand.NewPCG(1, 2))
	var chains [][]uint64
	for i := range 400 {
		keys := []uint64{uint64(r.IntN(20))} // 20 system prompts, then private content
		for range 1 + r.IntN(30) {
			keys = append(keys, r.Uint64())
		}
		c := chain(keys...)
		chains = append(chains, c)
		x.Insert(r.IntN(3), c, int64(i+1)*1000)
		if r.IntN(4) == 0 { // some conversations also went elsewhere
			x.Insert(r.IntN(3), c[:1+r.IntN(len(c))], int64(i+1)*1000+500)
		}
	}
	now := int64(401 * 1000)
	for ep := range 3 {
		n1, v1 := x.unique(ep, now, time.Microsecond, math.MaxInt, nil)
		n2, v2 := x.unique(ep, now, time.Microsecond, 7, nil)
		if n1 != n2 || math.Abs(v1-v2) > 1e-9*math.Max(1, v1) {
			t.Errorf("endpoint %d: one walk %d, %g; in chunks of 7 %d, %g", ep, n1, v1, n2, v2)
		}
		if hand := uniqueByHand(x, ep, 3, chains); hand != n1 {
			t.Errorf("endpoint %d: by hand %d alone, Unique %d", ep, hand, n1)
		}
		if n1 == 0 {
			t.Errorf("endpoint %d holds nothing alone: the test proves nothing", ep)
		}
	}
}

// TestIndex_UniquePlaceLost: entries touched or evicted while the walk pauses make it start
// again from the most recent entry, skipping what it counted, and it ends.
func TestIndex_UniquePlaceLost(t *testing.T) {
	x := NewIndex(IndexConfig{DefaultCapacity: 1000})
	var chains [][]uint64
	for i := range 50 {
		c := chain(uint64(1000+i), uint64(2000+i))
		chains = append(chains, c)
		x.Insert(0, c, int64(i+1))
	}
	want, _ := x.unique(0, 100, 0, math.MaxInt, nil)
	pauses := 0
	n, _ := x.unique(0, 100, 0, 10, func() {
		// Touch the oldest chain: it moves to the front with new stamps, and the entry the
		// walk stopped at may be among them; evict nothing.
		pauses++
		x.Insert(0, chains[0], int64(100+pauses))
		chains = append(chains[1:], chains[0])
	})
	if pauses == 0 {
		t.Fatal("the walk never paused")
	}
	// Touched entries the walk had not reached are skipped after a restart: at most a chain
	// per pause is missed, and nothing is counted twice.
	if n > want || n < want-2*pauses {
		t.Errorf("walk with touches during %d pauses counted %d, want at most %d and at least %d", pauses, n, want, want-2*pauses)
	}
	// Removing the whole endpoint during a pause ends the walk without a panic.
	x.Insert(0, chain(9), 1000)
	n, _ = x.unique(0, 2000, 0, 3, func() { x.Remove(0) })
	if n > 3+want {
		t.Errorf("walk over a removed endpoint counted %d", n)
	}
}

// TestIndex_UniqueConcurrent: a walk beside writers ends and stays within what the endpoint
// can hold (run with -race).
func TestIndex_UniqueConcurrent(t *testing.T) {
	x := NewIndex(IndexConfig{DefaultCapacity: 5000})
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for w := range 2 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 9))
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				c := chain(uint64(r.IntN(50)), r.Uint64(), r.Uint64(), r.Uint64())
				x.Insert(r.IntN(2), c, int64(i))
				if i > 200_000 {
					return
				}
			}
		})
	}
	for range 50 {
		n, v := x.unique(0, math.MaxInt64/2, time.Second, 64, nil)
		if n < 0 || n > 5000 || v < 0 || v > float64(n) {
			t.Errorf("walk: %d blocks, value %g; the endpoint holds at most 5,000", n, v)
		}
	}
	close(stop)
	wg.Wait()
}

func BenchmarkIndex_Unique(b *testing.B) {
	for _, total := range []int{150_000} {
		x := NewIndex(IndexConfig{DefaultCapacity: total})
		r := rand.New(rand.NewPCG(3, 4))
		now := int64(0)
		for x.Len(0) < total-64 {
			keys := make([]uint64, 64)
			for i := range keys {
				keys[i] = r.Uint64()
			}
			now++
			ep := 0
			if r.IntN(4) == 0 {
				ep = 1
			}
			x.Insert(ep, chain(keys...), now)
		}
		b.Run("entries=150000", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				x.Unique(0, now, time.Minute)
			}
		})
	}
}
