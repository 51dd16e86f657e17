package engine

import (
	"fmt"
	"testing"
)

// FuzzEngine drives a small engine with operations decoded from the input (submits of any
// shape, valid or not, aborts, steps) and checks that nothing panics, every step ends at or after
// its start, the block accounting stays within bounds, and that the engine drains: every
// accepted request that was not aborted finishes. An input of odd length runs a slot cache (3
// slots of 4 blocks), one of even length a block cache.
func FuzzEngine(f *testing.F) {
	f.Add([]byte{0, 10, 3, 2, 1, 2, 2, 2})
	f.Add([]byte{0, 60, 9, 9, 0, 60, 9, 9, 0, 60, 9, 9, 2, 2, 1, 1, 2, 2, 2})
	f.Add([]byte{0, 255, 255, 255, 0, 0, 0, 0, 0, 1, 1, 0})
	f.Add([]byte{0, 20, 3, 0, 0, 20, 3, 3, 2, 3, 0, 0, 0, 20, 3, 6, 2, 3, 2, 2, 2})
	f.Fuzz(func(t *testing.T, ops []byte) {
		p := tinyProfile()
		if len(ops)%2 == 1 {
			p.CacheSlots = 3
		}
		e := newEngine(t, Config{Profile: p, NumBlocks: 12, MaxNumSeqs: 3, MaxBatchedTokens: 10, KVEvents: true, TokenEvents: true})
		live := map[string]bool{}
		for i := 0; i+3 < len(ops) && i < 400; i += 4 {
			op, a, b, c := ops[i]%3, int(ops[i+1]), int(ops[i+2]), int(ops[i+3])
			switch op {
			case 0:
				id := fmt.Sprint(c % 8)
				r := Request{ID: id, PromptTokens: a - 5, OutputTokens: b%40 - 1, BlockKeys: keys(uint64(c%3), c%20), Salt: fmt.Sprint(c % 2)}
				if err := e.Submit(0, r); err == nil {
					live[id] = true
				}
			case 1:
				id := fmt.Sprint(a % 8)
				if e.Abort(0, id) != live[id] {
					t.Fatalf("Abort(%s) disagrees with the live set", id)
				}
				delete(live, id)
			case 2:
				for range 1 + a%4 {
					end, evs, _ := e.Step(0)
					if end < 0 {
						t.Fatalf("step ended at %v", end)
					}
					for _, ev := range evs {
						if ev.Kind == EventFinished {
							delete(live, ev.ReqID)
						}
					}
				}
			}
			st := e.Stats()
			if st.UsedBlocks < 0 || st.UsedBlocks > 12 || st.CachedFreeBlocks < 0 || st.CachedFreeBlocks > 12-st.UsedBlocks || st.Running > 3 {
				t.Fatalf("bad stats %+v", st)
			}
		}
		for range 5000 {
			_, evs, ok := e.Step(0)
			if !ok {
				break
			}
			for _, ev := range evs {
				if ev.Kind == EventFinished {
					delete(live, ev.ReqID)
				}
			}
		}
		if st := e.Stats(); len(live) != 0 || st.Running+st.Waiting != 0 || st.UsedBlocks != 0 {
			t.Fatalf("not drained: live %v stats %+v", live, st)
		}
	})
}
