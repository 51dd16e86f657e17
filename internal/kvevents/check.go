package kvevents

import (
	"encoding/binary"
	"fmt"
)

// maxDepth bounds the nesting of a KV event batch (vLLM's is four deep).
const maxDepth = 32

// checkShape walks one msgpack value in data, without decoding it, and fails when a length in
// it claims more than data holds, when it nests deeper than maxDepth, or when bytes follow it.
// The msgpack decoder allocates what a length claims before it reads, so a few hostile bytes
// from the network ("an array of four billion") would otherwise cost gigabytes.
func checkShape(data []byte) error {
	pos := 0
	need := func(n uint64) error { // n more bytes must be there
		if n > uint64(len(data)-pos) {
			return fmt.Errorf("msgpack value at byte %d claims %d bytes, %d left", pos, n, len(data)-pos)
		}
		return nil
	}
	u := func(size int) uint64 { // a big-endian length of size bytes at pos
		var v uint64
		switch size {
		case 1:
			v = uint64(data[pos])
		case 2:
			v = uint64(binary.BigEndian.Uint16(data[pos:]))
		case 4:
			v = uint64(binary.BigEndian.Uint32(data[pos:]))
		}
		pos += size
		return v
	}
	// open[i] is how many values the i-th enclosing array or map still holds.
	open := make([]uint64, 1, 8)
	open[0] = 1
	for len(open) > 0 {
		if open[len(open)-1] == 0 {
			open = open[:len(open)-1]
			continue
		}
		open[len(open)-1]--
		if err := need(1); err != nil {
			return err
		}
		c := data[pos]
		pos++
		var skip, items uint64 // payload bytes to skip; values inside
		var err error
		switch {
		case c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3: // fixints, nil, bools
		case c >= 0x80 && c <= 0x8f:
			items = 2 * uint64(c&0x0f)
		case c >= 0x90 && c <= 0x9f:
			items = uint64(c & 0x0f)
		case c >= 0xa0 && c <= 0xbf:
			skip = uint64(c & 0x1f)
		case c == 0xc4 || c == 0xd9: // bin8, str8
			if err = need(1); err == nil {
				skip = u(1)
			}
		case c == 0xc5 || c == 0xda: // bin16, str16
			if err = need(2); err == nil {
				skip = u(2)
			}
		case c == 0xc6 || c == 0xdb: // bin32, str32
			if err = need(4); err == nil {
				skip = u(4)
			}
		case c == 0xc7: // ext8: length, type, data
			if err = need(2); err == nil {
				skip = u(1) + 1
			}
		case c == 0xc8:
			if err = need(3); err == nil {
				skip = u(2) + 1
			}
		case c == 0xc9:
			if err = need(5); err == nil {
				skip = u(4) + 1
			}
		case c == 0xcc || c == 0xd0:
			skip = 1
		case c == 0xcd || c == 0xd1:
			skip = 2
		case c == 0xca || c == 0xce || c == 0xd2:
			skip = 4
		case c == 0xcb || c == 0xcf || c == 0xd3:
			skip = 8
		case c >= 0xd4 && c <= 0xd8: // fixext 1, 2, 4, 8, 16 with their type byte
			skip = 1 + 1<<(c-0xd4)
		case c == 0xdc:
			if err = need(2); err == nil {
				items = u(2)
			}
		case c == 0xdd:
			if err = need(4); err == nil {
				items = u(4)
			}
		case c == 0xde:
			if err = need(2); err == nil {
				items = 2 * u(2)
			}
		case c == 0xdf:
			if err = need(4); err == nil {
				items = 2 * u(4)
			}
		default: // 0xc1 is never used
			return fmt.Errorf("msgpack: bad type byte 0x%02x at byte %d", c, pos-1)
		}
		if err != nil {
			return err
		}
		if err := need(skip); err != nil {
			return err
		}
		pos += int(skip)
		if items > 0 {
			if err := need(items); err != nil { // every value takes at least one byte
				return err
			}
			if len(open) >= maxDepth {
				return fmt.Errorf("msgpack: nested deeper than %d", maxDepth)
			}
			open = append(open, items)
		}
	}
	if pos != len(data) {
		return fmt.Errorf("msgpack: %d bytes after the batch", len(data)-pos)
	}
	return nil
}
