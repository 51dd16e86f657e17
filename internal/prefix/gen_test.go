package prefix

import (
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
)

// holdings is what the index holds: for each endpoint, the set of its blocks (none after the
// last endpoint that holds any).
func holdings(x *Index) []map[uint64]bool {
	var out []map[uint64]bool
	for _, l := range x.lists() {
		m := map[uint64]bool{}
		for _, e := range l {
			m[e.Hash] = true
		}
		out = append(out, m)
	}
	for len(out) > 0 && len(out[len(out)-1]) == 0 {
		out = out[:len(out)-1]
	}
	return out
}

// FuzzGenMovesWithHoldings drives an index through every call that changes it (inserts of new
// and of held blocks, InsertTwice, Drop, Forget, Expire, SetCapacity, Remove) and checks after
// each that Gen stayed put only if no endpoint gained or lost a block, and that Match, and
// MatchGen with the Gen it returns, then give what they gave before: the promise that lets a
// caller reuse a match while Gen stays put.
func FuzzGenMovesWithHoldings(f *testing.F) {
	indexSeeds(f)
	f.Fuzz(func(t *testing.T, seed uint64, capacity, maxEntries uint8) {
		r := rand.New(rand.NewPCG(seed, 13))
		x := NewIndex(fuzzConfig(capacity, maxEntries))
		var convs conversations
		var probes [][]uint64
		now := int64(0)
		gen, held := x.Gen(), holdings(x)
		runs := func() [][]int32 {
			var out [][]int32
			for _, p := range probes {
				rs := make([]int32, 3)
				if g := x.MatchGen(rs, p); g != x.Gen() {
					t.Fatalf("MatchGen returned %d, Gen %d", g, x.Gen())
				}
				if want := match(x, 3, p); !slices.Equal(rs, want) {
					t.Fatalf("MatchGen %v, Match %v", rs, want)
				}
				out = append(out, rs)
			}
			return out
		}
		before := runs()
		stayed := 0
		for step := range 300 {
			now += int64(r.IntN(3))
			ep := r.IntN(3)
			blocks := slices.Clone(convs.next(r))
			switch op := r.IntN(12); {
			case op < 4:
				x.Insert(ep, blocks, now)
				if len(probes) < 6 {
					probes = append(probes, blocks)
					before = runs() // a new probe: compared from the next step on
				}
			case op < 6: // a request sent again: its blocks held, only stamped anew (unless evicted)
				if len(probes) > 0 {
					x.Insert(ep, probes[r.IntN(len(probes))], now)
				}
			case op == 6:
				x.InsertTwice(ep, blocks, now)
			case op == 7:
				x.Drop(ep, blocks)
			case op == 8:
				if lists := x.lists(); ep < len(lists) && len(lists[ep]) > 0 {
					x.Forget(ep, lists[ep][r.IntN(len(lists[ep]))].Stamp)
				}
			case op == 9:
				x.Expire(now - int64(r.IntN(20)))
			case op == 10:
				x.SetCapacity(ep, r.IntN(int(capacity%64)+2))
			default:
				x.Remove(ep)
			}
			g, h, after := x.Gen(), holdings(x), runs()
			if g == gen {
				stayed++
				if !slices.EqualFunc(h, held, maps.Equal) {
					t.Fatalf("step %d: what the index holds changed, Gen stayed at %d", step, g)
				}
				for i := range min(len(before), len(after)) {
					if !slices.Equal(before[i], after[i]) {
						t.Fatalf("step %d: Gen stayed at %d, probe %d matched %v then %v", step, g, i, before[i], after[i])
					}
				}
			}
			gen, held, before = g, h, after
		}
		if testing.Verbose() {
			t.Logf("Gen stayed put at %d of 300 steps", stayed)
		}
	})
}
