package prefix

import (
	"math"
	"math/bits"
)

// positions maps endpoint IDs to their positions in a candidate list, so that a match costs
// what the candidates and the holders cost whatever the IDs are. Where the candidates' IDs
// span no more than the table (a fleet that came up or rolled over together), slot ID - base
// holds position + 1; otherwise the table is open addressing over at least twice as many
// slots as candidates, each (ID + 1) << 32 | position. 0 is an empty slot either way. With
// no slots and not hashed, ID base + i is at position i (Match: base 0).
type positions struct {
	slots  []uint64
	base   int
	shift  uint8
	hashed bool
	dup    bool // an ID is listed twice: the table holds its first position
}

// newPositions maps the endpoints of eps (at least one) in buf, which must have room for
// twice as many slots as eps rounded up to a power of two; a direct table takes at most
// len(buf) slots.
func newPositions(buf []uint64, eps []int) positions {
	lo, hi := math.MaxInt, -1
	for _, ep := range eps {
		if ep >= 0 && ep < math.MaxUint32 {
			lo, hi = min(lo, ep), max(hi, ep)
		}
	}
	if hi < 0 {
		return positions{slots: buf[:0:0], hashed: true} // no ID any node can hold
	}
	if hi-lo < len(buf) {
		m := positions{slots: buf[:hi-lo+1], base: lo}
		clear(m.slots)
		for i, ep := range eps {
			if ep < lo || ep > hi {
				continue
			}
			if m.slots[ep-lo] != 0 {
				m.dup = true
				continue
			}
			m.slots[ep-lo] = uint64(i) + 1
		}
		return m
	}
	n := bits.Len(uint(2*len(eps) - 1))
	m := positions{slots: buf[:1<<n], shift: uint8(64 - n), hashed: true}
	clear(m.slots)
	mask := len(m.slots) - 1
	for i, ep := range eps {
		if ep < 0 || ep >= math.MaxUint32 {
			continue // no node holds it: it matches nothing
		}
		key := uint64(ep) + 1
		for j := m.slot(uint32(ep)); ; j = (j + 1) & mask {
			if m.slots[j] == 0 {
				m.slots[j] = key<<32 | uint64(i)
				break
			}
			if m.slots[j]>>32 == key {
				m.dup = true
				break
			}
		}
	}
	return m
}

// slot is where ep's search starts (Fibonacci hashing: dense IDs spread over the table).
func (m positions) slot(ep uint32) int {
	return int(uint64(ep) * 0x9E3779B97F4A7C15 >> m.shift)
}

// of returns the position of ep (an index node's endpoint), or -1 when ep is not a candidate;
// n is how many candidates there are.
func (m positions) of(ep uint32, n int) int {
	if m.hashed {
		return m.find(ep)
	}
	return m.direct(ep, n)
}

// direct is of for the identity or a direct table; small enough to be inlined in a loop.
func (m positions) direct(ep uint32, n int) int {
	d := int(ep) - m.base
	switch {
	case m.slots == nil: // ID base + i at position i
		if uint(d) < uint(n) {
			return d
		}
	case uint(d) < uint(len(m.slots)):
		return int(m.slots[d]) - 1
	}
	return -1
}

// find is of for a hashed table.
func (m positions) find(ep uint32) int {
	if len(m.slots) == 0 {
		return -1
	}
	key := uint64(ep) + 1
	for j := m.slot(ep); ; j = (j + 1) & (len(m.slots) - 1) {
		s := m.slots[j]
		if s>>32 == key {
			return int(uint32(s))
		}
		if s == 0 {
			return -1
		}
	}
}
