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
//
// A slot is 8 bytes: 32 bits of the hash (its tag, which also gives its home slot) and the
// block id. The full hash is the block's own (block.hash), read only when a tag matches: a
// lookup that finds the block reads it next anyway, and the table is half the size it was
// with the hash in the slot, so more of it stays in the CPU caches. Deleting needs no block
// at all: the id names the slot and the tags give the homes.
type hashTable struct {
	slots []uint64 // tag<<32 | (block id + 1); 0: empty, so that a new table needs no initialising
	shift uint     // home = tag >> shift
	mask  uint64
	n     int
}

// minTableBits is the size of a new table: 16 slots.
const minTableBits = 4

// newHashTable returns an empty table for at most maxEntries entries (the table grows on
// demand; maxEntries is only a hint here).
func newHashTable(maxEntries int) hashTable {
	_ = maxEntries
	return makeTable(minTableBits)
}

// makeTable returns an empty table of 2^b slots; b is at most 32 (block ids are int32, and the
// table holds at most twice as many slots as blocks).
func makeTable(b int) hashTable {
	size := 1 << b
	return hashTable{
		slots: make([]uint64, size),
		shift: uint(32 - b),
		mask:  uint64(size - 1),
	}
}

// tag is the hash's 32 bits that a slot keeps: the top of its Fibonacci product, which
// spreads any key pattern, so that the home slot is the tag's top bits.
func tag(h uint64) uint64 { return (h * 0x9E3779B97F4A7C15) >> 32 }

// grow doubles the table, reinserting every entry.
func (t *hashTable) grow() {
	nt := makeTable(bits.Len(uint(len(t.slots))))
	for _, s := range t.slots {
		if s == 0 {
			continue
		}
		for i := (s >> 32) >> nt.shift; ; i = (i + 1) & nt.mask {
			if nt.slots[i] == 0 {
				nt.slots[i] = s
				break
			}
		}
	}
	nt.n = t.n
	*t = nt
}

// get returns the block id cached under h; blocks holds every block's hash.
func (t *hashTable) get(h uint64, blocks []block) (int32, bool) {
	tg := tag(h)
	for i := tg >> t.shift; ; i = (i + 1) & t.mask {
		s := t.slots[i]
		if s == 0 {
			return -1, false
		}
		if s>>32 == tg {
			if id := int32(uint32(s)) - 1; blocks[id].hash == h {
				return id, true
			}
		}
	}
}

// insert maps h to id unless h is present; it reports whether it inserted. blocks holds the
// hash of every block already in the table (id's own may be unset yet).
func (t *hashTable) insert(h uint64, id int32, blocks []block) bool {
	if 2*(t.n+1) > len(t.slots) {
		t.grow()
	}
	tg := tag(h)
	for i := tg >> t.shift; ; i = (i + 1) & t.mask {
		s := t.slots[i]
		if s == 0 {
			t.slots[i] = tg<<32 | uint64(uint32(id+1))
			t.n++
			return true
		}
		if s>>32 == tg && blocks[int32(uint32(s))-1].hash == h {
			return false
		}
	}
}

// delete removes the entry of h, which maps to id, shifting later entries of its probe run
// back so that no tombstone is left.
func (t *hashTable) delete(h uint64, id int32) {
	tg := tag(h)
	want := tg<<32 | uint64(uint32(id+1))
	i := tg >> t.shift
	for ; ; i = (i + 1) & t.mask {
		if t.slots[i] == 0 {
			return
		}
		if t.slots[i] == want {
			break
		}
	}
	t.n--
	j := i
	for {
		j = (j + 1) & t.mask
		s := t.slots[j]
		if s == 0 {
			break
		}
		// The entry at j may move to i unless its home lies cyclically in (i, j].
		k := (s >> 32) >> t.shift
		if (j-k)&t.mask >= (j-i)&t.mask {
			t.slots[i] = s
			i = j
		}
	}
	t.slots[i] = 0
}
