package prefix

// The keying of prompts as it was before it hashed the collapsed text as it read it
// (commit cfcc03e): the reference FuzzKeysAsBefore checks the new code against, byte for byte.
// Only the names differ; the code is as it was, but for appendCollapsed, which is unchanged
// and called where it stands.

import (
	"bytes"
	"unicode"
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
		buf = appendCollapsed(buf, unsafe.String(unsafe.SliceData(piece), len(piece)))
		_, _ = d.Write(piece)
		pos = r
		nm := normAt + len(buf)
		cut := len(buf) - nm%size
		marks = append(marks, mark{raw: r, norm: nm, hash: d.Sum64(), tail: len(tails)})
		tails = append(tails, buf[cut:]...)
	}
	rest := text[pos:]
	buf = appendCollapsed(buf, unsafe.String(unsafe.SliceData(rest), len(rest)))
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
	buf = appendCollapsed(buf[:0], unsafe.String(unsafe.SliceData(b), len(b)))
	return bytes.TrimSpace(buf), buf, true
}
