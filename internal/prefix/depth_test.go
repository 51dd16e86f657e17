package prefix

import (
	"math/rand/v2"
	"testing"
)

// FuzzDepth drives an index through inserts (growing conversations that share prefixes and
// repeat blocks), inserts twice, drops, forgets, expiries, capacity changes and removals, and
// after each step checks that Depth, which counts within the run of consecutive stamps at a
// list's head, answers what walking the list answers, for every stamp the list holds (and the
// ones beside them) at several limits; and that the run is what it says.
func FuzzDepth(f *testing.F) {
	indexSeeds(f)
	f.Fuzz(func(t *testing.T, seed uint64, capacity, maxEntries uint8) {
		r := rand.New(rand.NewPCG(seed, 11))
		x := NewIndex(fuzzConfig(capacity, maxEntries))
		var convs conversations
		now := int64(0)
		fast := 0
		for step := range 200 {
			blocks := convs.next(r)
			ep := r.IntN(3)
			now += int64(r.IntN(3))
			switch r.IntN(10) {
			case 0, 1, 2:
				x.Insert(ep, blocks, now)
			case 3:
				x.Insert(ep, blocks, now)
				x.Insert(ep, blocks, now)
			case 4:
				x.InsertTwice(ep, blocks, now)
			case 5:
				x.Drop(ep, blocks[len(blocks)-r.IntN(len(blocks)+1):])
			case 6:
				if l := x.lists(); ep < len(l) && len(l[ep]) > 0 {
					x.Forget(ep, l[ep][r.IntN(len(l[ep]))].Stamp)
				}
			case 7:
				x.Expire(now - int64(r.IntN(40)))
			case 8:
				x.SetCapacity(ep, r.IntN(70)-2)
			case 9:
				if r.IntN(4) == 0 {
					x.Remove(ep)
				}
			}
			for e, list := range x.lists() {
				run, top := x.eps[e].run, x.eps[e].runTop
				if run > len(list) {
					t.Fatalf("step %d, endpoint %d: run of %d in a list of %d", step, e, run, len(list))
				}
				for i := range run {
					if list[i].Stamp != top-int64(i) {
						t.Fatalf("step %d, endpoint %d: entry %d stamped %d, the run says %d", step, e, i, list[i].Stamp, top-int64(i))
					}
				}
				var stamps []int64
				for _, en := range list {
					stamps = append(stamps, en.Stamp-1, en.Stamp, en.Stamp+1)
				}
				stamps = append(stamps, now+1000, -1)
				for _, s := range stamps {
					for _, limit := range []int{-1, 0, 1, 3, len(list), len(list) + 5} {
						want := x.depthWalk(e, s, limit)
						if got := x.Depth(e, s, limit); got != want {
							t.Fatalf("step %d, endpoint %d: Depth(%d, limit %d) = %d, walking gives %d (run %d from %d)", step, e, s, limit, got, want, run, top)
						}
						if run > 0 && s <= top && s > top-int64(run) {
							fast++
						}
					}
				}
			}
		}
		if seed < 4 && fast == 0 {
			t.Errorf("no Depth answered from a run")
		}
	})
}
