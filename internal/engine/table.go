package engine

import "math/bits"

// hashTable maps block hashes to block ids: open addressing with linear probing and
// backward-shift deletion. It keeps at least twice as many slots as entries, so probes stay
// short and the table never fills. It does one probe sequence per operation where a Go map
// needed two for insert-if-absent. It starts small and doubles as entries come (up to twice
// the block count), so that an engine whose cache holds a few thousand blocks probes a table
// that fits in the CPU cache rather than one of several megabytes (each probe of a table sized
// for every block was a cache miss, the engine's largest cost). Growing allocates; nothing
// else does.
type hashTable struct {
	slots []slot
	shift uint
	mask  uint64
	n     int
}

// minTableBits is the size of a new table: 16 slots.
const minTableBits = 4

// slot is one entry; key and value side by side cost one cache miss, not two.
type slot struct {
	key uint64
	val int32 // block id + 1; 0: empty, so that a new table needs no initialising
}

// newHashTable returns an empty table for at most maxEntries entries (the table grows on
// demand; maxEntries is only a hint here).
func newHashTable(maxEntries int) hashTable {
	_ = maxEntries
	return makeTable(minTableBits)
}

func makeTable(b int) hashTable {
	size := 1 << b
	return hashTable{
		slots: make([]slot, size),
		shift: uint(64 - b),
		mask:  uint64(size - 1),
	}
}

// grow doubles the table, reinserting every entry.
func (t *hashTable) grow() {
	nt := makeTable(bits.Len(uint(len(t.slots))))
	for _, s := range t.slots {
		if s.val == 0 {
			continue
		}
		for i := nt.home(s.key); ; i = (i + 1) & nt.mask {
			if nt.slots[i].val == 0 {
				nt.slots[i] = s
				break
			}
		}
	}
	nt.n = t.n
	*t = nt
}

// home is the slot where a probe for h starts (Fibonacci hashing spreads any key pattern).
func (t *hashTable) home(h uint64) uint64 { return (h * 0x9E3779B97F4A7C15) >> t.shift }

// get returns the block id cached under h.
func (t *hashTable) get(h uint64) (int32, bool) {
	for i := t.home(h); ; i = (i + 1) & t.mask {
		s := &t.slots[i]
		if s.val == 0 {
			return -1, false
		}
		if s.key == h {
			return s.val - 1, true
		}
	}
}

// insert maps h to id unless h is present; it reports whether it inserted.
func (t *hashTable) insert(h uint64, id int32) bool {
	if 2*(t.n+1) > len(t.slots) {
		t.grow()
	}
	for i := t.home(h); ; i = (i + 1) & t.mask {
		s := &t.slots[i]
		if s.val == 0 {
			*s = slot{key: h, val: id + 1}
			t.n++
			return true
		}
		if s.key == h {
			return false
		}
	}
}

// delete removes h, shifting later entries of its probe run back so that no tombstone is left.
func (t *hashTable) delete(h uint64) {
	i := t.home(h)
	for ; ; i = (i + 1) & t.mask {
		if t.slots[i].val == 0 {
			return
		}
		if t.slots[i].key == h {
			break
		}
	}
	t.n--
	j := i
	for {
		j = (j + 1) & t.mask
		if t.slots[j].val == 0 {
			break
		}
		// The entry at j may move to i unless its home lies cyclically in (i, j].
		k := t.home(t.slots[j].key)
		if (j-k)&t.mask >= (j-i)&t.mask {
			t.slots[i] = t.slots[j]
			i = j
		}
	}
	t.slots[i].val = 0
}
