package engine

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// order lists the free blocks in eviction order: never-used ones, then the listed ones.
func (p *blockPool) order() []int32 {
	var ids []int32
	for id := p.fresh; id < p.sentinel; id++ {
		ids = append(ids, id)
	}
	for id := p.blocks[p.sentinel].next; id != p.sentinel && len(ids) < len(p.blocks); id = p.blocks[id].next {
		ids = append(ids, id)
	}
	return ids
}

// TestBlockPoolMatchesList checks the free queue (never-used blocks, then the intrusive list)
// against a plain slice under random allocations, releases, registrations and prefix hits on
// free and shared blocks.
func TestBlockPoolMatchesList(t *testing.T) {
	const n = 6
	rng := rand.New(rand.NewPCG(3, 4))
	p := newBlockPool(n)
	list := []int32{0, 1, 2, 3, 4, 5} // the reference free queue, front first
	refs := make([]int32, n)
	var held []int32
	for op := range 20000 {
		switch k := rng.IntN(8); {
		case k == 0 && len(list) > 0: // allocate
			id, _, _ := p.alloc()
			if id != list[0] {
				t.Fatalf("op %d: alloc = %d, want %d", op, id, list[0])
			}
			list = list[1:]
			refs[id] = 1
			held = append(held, id)
			if rng.IntN(2) == 0 {
				p.register(id, rng.Uint64()|1)
			}
		case k < 4 && len(held) > 0: // release
			i := rng.IntN(len(held))
			id := held[i]
			held = slices.Delete(held, i, i+1)
			refs[id]--
			if refs[id] == 0 {
				list = append(list, id)
			}
			p.release(id)
		case len(list) > 0: // a prefix hit on a free cached block, or a shared one
			id := list[rng.IntN(len(list))]
			if rng.IntN(3) == 0 && len(held) > 0 {
				id = held[rng.IntN(len(held))]
			}
			if refs[id] == 0 && !p.blocks[id].cached {
				continue
			}
			if refs[id] == 0 {
				list = slices.DeleteFunc(list, func(x int32) bool { return x == id })
			}
			refs[id]++
			held = append(held, id)
			p.touch(id)
		}
		if diff := cmp.Diff(list, p.order(), cmp.Comparer(func(a, b []int32) bool { return slices.Equal(a, b) })); diff != "" {
			t.Fatalf("op %d: free order (-want +got):\n%s", op, diff)
		}
		if p.numFree != len(list) || p.blocks[p.sentinel].ref != 0 {
			t.Fatalf("op %d: numFree %d, want %d", op, p.numFree, len(list))
		}
	}
	if p.fresh != n {
		t.Error("some blocks were never used: the test does not cover the list")
	}
}
