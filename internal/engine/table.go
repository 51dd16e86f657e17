package engine

import "math/bits"

// hashTable maps block hashes to block ids: open addressing with linear probing and
// backward-shift deletion. It never holds more entries than there are blocks and has at least
// twice as many slots, so probes stay short and the table never fills. It does one probe
// sequence per operation where a Go map needed two for insert-if-absent, and it allocates
// nothing after construction.
type hashTable struct {
	slots []slot
	shift uint
	mask  uint64
	n     int
}

// slot is one entry; key and value side by side cost one cache miss, not two.
type slot struct {
	key uint64
	val int32 // block id + 1; 0: empty, so that a new table needs no initialising
}

func newHashTable(maxEntries int) hashTable {
	b := max(4, bits.Len(uint(2*maxEntries-1)))
	size := 1 << b
	t := hashTable{
		slots: make([]slot, size),
		shift: uint(64 - b),
		mask:  uint64(size - 1),
	}
	return t
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
