package prefix

// The keying of prompts as it was before it hashed the collapsed text as it read it
// (commit cfcc03e): the reference FuzzKeysAsBefore checks the new code against, byte for byte.
// Only the names differ; the code is as it was.

import (
	"bytes"
	"unicode"
	"unicode/utf8"
	"unsafe"

	"github.com/cespare/xxhash/v2"
	"golang.org/x/text/unicode/norm"
)

func (c *Chains) blocksOld(dst []uint64, seed uint64, text []byte, blockTokens int, n *Normalizer) []uint64 {
	if blockTokens <= 0 {
		blockTokens = DefaultBlockTokens
	}
	size := BlockBytes(blockTokens)
	if c == nil || !n.isDefault() || len(text) < max(headBytes, minChainBlocks*size) || startsWithSpace(text) {
		return normalizedBlocksOld(dst, seed, text, blockTokens, n)
	}
	head := seed ^ xxhash.Sum64(text[:headBytes])
	var d xxhash.Digest
	base, j := c.fork(head, seed, size, text, &d)
	from := 0
	if base != nil {
		from = base.marks[j].raw
	}
	if !collapsibleFrom(text, from) {
		return normalizedBlocksOld(dst, seed, text, blockTokens, n)
	}
	if base == nil {
		d.Reset()
	} else {
		c.mu.Lock()
		c.reused++
		c.mu.Unlock()
	}
	return c.extendOld(dst, head, seed, size, text, base, j, &d)
}

func (c *Chains) extendOld(dst []uint64, head, seed uint64, size int, text []byte, base *remembered, j int, d *xxhash.Digest) []uint64 {
	dst = growUint64(dst, len(text)/size) // the normalised text is no longer than text
	start := len(dst)
	spacing := markBlocks * size
	var marks []mark
	var tails []byte
	bp := normBufs.Get().(*[]byte)
	buf := (*bp)[:0]
	normAt, pos, t := 0, 0, spacing // normAt: the normalised offset of buf[0]
	h := seed
	// A prompt that adds little to what it takes from base (its own question after a shared
	// document) is not remembered: a text that extends it takes the shared part from base all
	// the same, and hashes at most minChainBlocks blocks and its own turn again. Remembering
	// each such prompt cost a copy of all its blocks and its marks, and crowded out the chains
	// that differ.
	remember := true
	if base != nil {
		m := base.marks[j]
		k := m.norm / size
		dst = append(dst, base.blocks[:k]...)
		if k > 0 {
			h = base.blocks[k-1]
		}
		normAt = k * size
		buf = append(buf, base.tails[m.tail:m.tail+m.norm%size]...)
		pos, t = m.raw, markAfter(m.raw, spacing)
		// The blocks past k are at most those of the tail and the rest uncollapsed.
		if remember = (len(buf)+len(text)-pos)/size >= minChainBlocks; remember {
			marks = append(make([]mark, 0, j+1+(len(text)-pos)/spacing+1), base.marks[:j+1]...)
			tails = append(make([]byte, 0, len(base.tails)), base.tails[:m.tail+m.norm%size]...)
		}
	} else {
		marks = make([]mark, 0, len(text)/spacing+1)
	}
	for remember {
		r := nextMark(text, t)
		if r < 0 {
			break
		}
		t = markAfter(r, spacing)
		piece := text[pos:r]
		buf = appendCollapsedOld(buf, unsafe.String(unsafe.SliceData(piece), len(piece)))
		_, _ = d.Write(piece)
		pos = r
		nm := normAt + len(buf)
		cut := len(buf) - nm%size
		marks = append(marks, mark{raw: r, norm: nm, hash: d.Sum64(), tail: len(tails)})
		tails = append(tails, buf[cut:]...)
	}
	rest := text[pos:]
	buf = appendCollapsedOld(buf, unsafe.String(unsafe.SliceData(rest), len(rest)))
	normText := bytes.TrimRightFunc(buf, unicode.IsSpace)
	taken := len(dst) - start
	dst = chainBytes(dst, h, normText, size)
	if len(marks) > 0 && (base == nil || len(dst)-start-taken >= minChainBlocks) {
		c.store(head, seed, size, dst[start:], marks, tails)
	}
	putNorm(bp, buf)
	return dst
}

func normalizedBlocksOld(dst []uint64, seed uint64, text []byte, blockTokens int, n *Normalizer) []uint64 {
	bp := normBufs.Get().(*[]byte)
	norm, grown, _ := n.appendNormalizedOld(*bp, text)
	dst = BlocksBytes(dst, seed, norm, blockTokens)
	putNorm(bp, grown)
	return dst
}

func (n *Normalizer) appendNormalizedOld(buf, b []byte) (text, grown []byte, collapsed bool) {
	if !n.isDefault() || bytes.IndexByte(b, '\r') >= 0 || !isASCII(b) && !norm.NFC.IsNormal(b) {
		return n.NormalizeBytes(b), buf, false
	}
	if !needsCollapse(b) {
		return bytes.TrimSpace(b), buf, false
	}
	buf = appendCollapsedOld(buf[:0], unsafe.String(unsafe.SliceData(b), len(b)))
	return bytes.TrimSpace(buf), buf, true
}

func appendCollapsedOld(out []byte, s string) []byte {
	b := stringBytes(s)
	start := 0 // start of the pending segment, copied as it is
	for i := 0; i < len(s); {
		// Eight ASCII bytes at a time, as long as they change nothing: no tab, carriage return,
		// vertical tab or form feed, and no two spaces or newlines side by side (within the
		// word or across its edge). Then one character or one run at a time.
		prevSpace := false // the byte before i is a space or a newline
		for ; i+8 <= len(b); i += 8 {
			x := word(b, i)
			// low marks the bytes up to ' ' (whitespace is among them), and may mark a byte
			// right after a marked one that is not (a borrow): a false mark only sends the
			// word to the slow path below. One mark next to another, or after a space that
			// ended the word before, may be a run to collapse.
			low := (x - 0x21*ones) &^ x & highs
			if x&highs != 0 || low&(low<<8) != 0 || prevSpace && low&0x80 != 0 {
				break
			}
			// A byte below ' ' (most often a newline) must be a newline to stay.
			if (x-0x20*ones)&^x&highs != 0 && low&^(eqBytes(x, ' ')|eqBytes(x, '\n')) != 0 {
				break
			}
			prevSpace = low>>63 != 0
		}
		if prevSpace {
			i-- // a run may start with the last byte taken
		}
		if i == len(s) {
			break
		}
		if c := s[i]; c > ' ' && c < utf8.RuneSelf {
			i++ // printable ASCII (all ASCII whitespace is <= ' ')
			continue
		}
		size, space := spaceAt(s, i)
		if !space {
			i += size
			continue
		}
		run, newline := i, false
		for i < len(s) {
			size, space = spaceAt(s, i)
			if !space {
				break
			}
			newline = newline || s[i] == '\n'
			i += size
		}
		if i-run == 1 && (s[run] == ' ' || s[run] == '\n') {
			continue // one space or one newline: unchanged
		}
		out = append(out, s[start:run]...)
		if newline {
			out = append(out, '\n')
		} else {
			out = append(out, ' ')
		}
		start = i
	}
	return append(out, s[start:]...)
}
