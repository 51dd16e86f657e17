package prefix

import (
	"bytes"
	"sync"
	"unicode"
	"unicode/utf8"
	"unsafe"

	"github.com/cespare/xxhash/v2"
	"golang.org/x/text/unicode/norm"
)

// Chains remembers the block chains of recent long prompts, so that a prompt that extends one
// of them, a conversation's next turn, is normalised and hashed only past what it shares: on
// a 100k-token conversation the shared part is 99 % of the text, and normalising and hashing
// it was a quarter of the router's CPU per request. What is shared is checked, not assumed:
// one xxhash pass over it (an eighth of the cost of hashing it block by block) must give what
// the earlier prompt gave.
//
// Text that the default normalisation leaves as it is (the common case for machine-built
// prompts) is remembered as it is; text whose normalisation only collapses whitespace (prose
// with paragraph breaks) is remembered with its normalised tail, and a turn that extends it is
// collapsed and hashed only past the shared part; any other text takes the full path. Memory
// is bounded by the blocks remembered in all. It is safe for concurrent use; a nil *Chains remembers nothing.
type Chains struct {
	maxBlocks int

	mu      sync.Mutex
	byHead  map[uint64][]*remembered // by seed and the text's first headBytes bytes
	blocks  int                      // held by every chain together
	tick    uint64
	entries int // chains held
	reused  int // prompts that took blocks from a remembered chain
}

// Len returns the chains held and the blocks they hold.
func (c *Chains) Len() (chains, blocks int) {
	if c == nil {
		return 0, 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.entries, c.blocks
}

// remembered is what one prompt left: the chained hashes of its full blocks and a hash of the text
// they cover. Its fields do not change after it is stored.
type remembered struct {
	head    uint64
	seed    uint64
	size    int    // block bytes
	rawLen  int    // bytes of text the blocks cover: len(blocks) x size, unless collapsed
	rawHash uint64 // xxhash of those bytes
	blocks  []uint64
	// collapsed: the text's whitespace was collapsed, and the blocks are those of the
	// normalised text[:rawLen], which ends on a printable ASCII byte (no whitespace run crosses
	// it); tail is that normalised text past the last full block (shorter than a block).
	collapsed bool
	tail      []byte
	used      uint64 // Chains.tick when last matched or stored; guarded by Chains.mu
}

const (
	// headBytes is the part of a prompt its chain is filed under: long enough to tell
	// conversations apart in most fleets, and a conversation's first turn already has it.
	headBytes = 1024
	// minChainBlocks is the shortest prompt worth remembering (a 32k-token one is 2,000 blocks
	// of 16 tokens); shorter ones cost too little to bother.
	minChainBlocks = 256
	// maxPerHead bounds the chains filed under one head: conversations that share a long
	// system prompt share a head.
	maxPerHead = 64
)

// NewChains returns a Chains that remembers at most maxBlocks blocks (8 bytes each, plus about
// 100 bytes per prompt).
func NewChains(maxBlocks int) *Chains {
	return &Chains{maxBlocks: maxBlocks, byHead: map[uint64][]*remembered{}}
}

// Blocks appends to dst what BlocksBytes(dst, seed, n.NormalizeBytes(text), blockTokens)
// appends.
func (c *Chains) Blocks(dst []uint64, seed uint64, text []byte, blockTokens int, n *Normalizer) []uint64 {
	if blockTokens <= 0 {
		blockTokens = DefaultBlockTokens
	}
	size := BlockBytes(blockTokens)
	if c == nil || !n.isDefault() || len(text) < max(headBytes, minChainBlocks*size) || isSpace(text[0]) {
		return NormalizedBlocks(dst, seed, text, blockTokens, n)
	}
	head := seed ^ xxhash.Sum64(text[:headBytes])
	// Trailing whitespace is trimmed before hashing: a remembered chain may cover only what
	// is left (it may come from a longer text that shares this one's bytes).
	end := len(bytes.TrimRight(text, " \n"))
	base, d, at := c.longest(head, seed, size, text[:end])
	start := len(dst)
	if base != nil && base.collapsed && collapsibleAfter(text, base.rawLen) {
		return c.extendCollapsed(dst, head, seed, size, text, end, base, d)
	}
	if base == nil || base.collapsed || !cleanAfter(text, base.rawLen) {
		bp := normBufs.Get().(*[]byte)
		norm, grown, collapsed := n.appendNormalized(*bp, text)
		dst = BlocksBytes(dst, seed, norm, blockTokens)
		// The digest of the text's start that longest computed to check the chains under head
		// (none of which this text extends) is carried on, not computed again.
		switch {
		case len(norm) > 0 && &norm[0] == &text[0]: // unchanged but for trailing whitespace
			rawLen := len(dst[start:]) * size
			c.store(head, seed, size, text, rawLen, dst[start:], false, nil, digestUpTo(d, at, rawLen), at)
		case collapsed && printableASCII(text[end-1]):
			// norm is also the normalised text[:end]: what follows end is trimmed.
			c.store(head, seed, size, text, end, dst[start:], true, norm[len(dst[start:])*size:], digestUpTo(d, at, end), at)
		}
		putNorm(bp, grown)
		return dst
	}
	c.mu.Lock()
	c.reused++
	c.mu.Unlock()
	// The shared blocks, then the rest of the (trailing-trimmed) text block by block.
	dst = append(dst, base.blocks...)
	h := base.blocks[len(base.blocks)-1]
	for i := base.rawLen; i+size <= end; i += size {
		h = Next(h, contentKey(text[i:i+size]))
		dst = append(dst, h)
	}
	c.store(head, seed, size, text, len(dst[start:])*size, dst[start:], false, nil, d, base.rawLen)
	return dst
}

// extendCollapsed is Blocks for a text that extends base, a chain of collapsed text: the
// shared part is neither collapsed nor hashed again. Because base's text ends on a printable
// byte, no whitespace run crosses its end, so the normalised text is base's followed by the
// rest collapsed on its own (and trimmed at its end).
func (c *Chains) extendCollapsed(dst []uint64, head, seed uint64, size int, text []byte, end int, base *remembered, d *xxhash.Digest) []uint64 {
	c.mu.Lock()
	c.reused++
	c.mu.Unlock()
	start := len(dst)
	bp := normBufs.Get().(*[]byte)
	rest := text[base.rawLen:]
	buf := append((*bp)[:0], base.tail...)
	buf = appendCollapsed(buf, unsafe.String(unsafe.SliceData(rest), len(rest)))
	norm := bytes.TrimRightFunc(buf, unicode.IsSpace)
	dst = append(dst, base.blocks...)
	h := base.blocks[len(base.blocks)-1]
	full := 0
	for ; full+size <= len(norm); full += size {
		h = Next(h, contentKey(norm[full:full+size]))
		dst = append(dst, h)
	}
	if printableASCII(text[end-1]) {
		c.store(head, seed, size, text, end, dst[start:], true, norm[full:], d, base.rawLen)
	}
	putNorm(bp, buf)
	return dst
}

// printableASCII reports whether b is an ASCII byte that is neither whitespace nor a control.
func printableASCII(b byte) bool { return b > ' ' && b < utf8.RuneSelf }

// collapsibleAfter reports whether the default normalisation of text only collapses
// whitespace past from, where text[:from] is known to need no more than that: no carriage
// return, NFC from the last normalisation boundary before from.
func collapsibleAfter(text []byte, from int) bool {
	rest := text[from:]
	if bytes.IndexByte(rest, '\r') >= 0 {
		return false
	}
	if isASCII(rest) {
		return true
	}
	b := norm.NFC.LastBoundary(text[:from])
	return b >= 0 && norm.NFC.IsNormal(text[b:])
}

// NormalizedBlocks appends to dst what BlocksBytes(dst, seed, n.NormalizeBytes(text),
// blockTokens) appends. Text whose whitespace must be collapsed (prose with paragraph breaks)
// is collapsed into a recycled buffer: a 400 KB prompt then allocates nothing.
func NormalizedBlocks(dst []uint64, seed uint64, text []byte, blockTokens int, n *Normalizer) []uint64 {
	bp := normBufs.Get().(*[]byte)
	norm, grown, _ := n.appendNormalized(*bp, text)
	dst = BlocksBytes(dst, seed, norm, blockTokens)
	putNorm(bp, grown)
	return dst
}

// normBufs recycles the buffers normalised text is written into; buffers grown past
// maxPooledNorm are left to the garbage collector, so that one huge prompt is not kept.
var normBufs = sync.Pool{New: func() any { b := make([]byte, 0, 64<<10); return &b }}

const maxPooledNorm = 4 << 20

func putNorm(bp *[]byte, grown []byte) {
	if cap(grown) <= maxPooledNorm {
		*bp = grown[:0]
		normBufs.Put(bp)
	}
}

// isDefault reports whether n normalises as the zero options do (a nil n does).
func (n *Normalizer) isDefault() bool {
	return n == nil || !n.opts.KeepLineEndings && !n.opts.KeepUnicodeForm && !n.opts.KeepWhitespace &&
		!n.opts.KeepEdges && len(n.rules) == 0
}

func isSpace(b byte) bool {
	return b == ' ' || b == '\n' || b == '\t' || b == '\r' || b == '\v' || b == '\f'
}

// cleanAfter reports whether the default normalisation leaves text as it is past from, where
// text[:from] is known to be left as it is: no carriage return, no run of whitespace to
// collapse (the byte before from included, for a run across it), NFC from the last
// normalisation boundary before from.
func cleanAfter(text []byte, from int) bool {
	rest := text[from:]
	if bytes.IndexByte(rest, '\r') >= 0 || needsCollapse(text[from-1:]) {
		return false
	}
	if isASCII(rest) {
		return true
	}
	b := norm.NFC.LastBoundary(text[:from])
	return b >= 0 && norm.NFC.IsNormal(text[b:])
}

// digestUpTo returns d, the digest of a text's first at bytes, when it can be carried on to
// the text's first n bytes; else nil.
func digestUpTo(d *xxhash.Digest, at, n int) *xxhash.Digest {
	if d == nil || at > n {
		return nil
	}
	return d
}

// longest returns the longest remembered chain under head that text extends (nil when there
// is none), and d, the xxhash digest of text[:at]: up to that chain's end, or, when there is
// none, up to where the checks of the chains under head read (d nil when there were none).
func (c *Chains) longest(head, seed uint64, size int, text []byte) (best *remembered, d *xxhash.Digest, at int) {
	c.mu.Lock()
	cands := append([]*remembered(nil), c.byHead[head]...)
	c.mu.Unlock()
	// Shortest first, so that one pass of the digest checks every candidate.
	for i := 1; i < len(cands); i++ {
		for j := i; j > 0 && cands[j].rawLen < cands[j-1].rawLen; j-- {
			cands[j], cands[j-1] = cands[j-1], cands[j]
		}
	}
	for _, ch := range cands {
		if ch.seed != seed || ch.size != size || ch.rawLen > len(text) {
			continue
		}
		if d == nil {
			d = xxhash.New()
		}
		_, _ = d.Write(text[at:ch.rawLen])
		at = ch.rawLen
		if d.Sum64() == ch.rawHash {
			best = ch
		}
	}
	if best == nil {
		return nil, d, at
	}
	// Rewind the digest to the best chain's end: the longer candidates read past it.
	if at != best.rawLen {
		d.Reset()
		_, _ = d.Write(text[:best.rawLen])
		at = best.rawLen
	}
	c.mu.Lock()
	c.tick++
	best.used = c.tick
	c.mu.Unlock()
	return best, d, at
}

// store remembers blocks, the chain of the (normalised, when collapsed) text[:rawLen], and
// tail, the normalised bytes after its last full block. d, when not nil, is the digest of
// text[:from]; it is carried on rather than computed again.
func (c *Chains) store(head, seed uint64, size int, text []byte, rawLen int, blocks []uint64, collapsed bool, tail []byte, d *xxhash.Digest, from int) {
	if len(blocks) < minChainBlocks || len(blocks) > c.maxBlocks {
		return
	}
	if d == nil {
		d = xxhash.New()
		from = 0
	}
	_, _ = d.Write(text[from:rawLen])
	ch := &remembered{head: head, seed: seed, size: size, rawLen: rawLen, rawHash: d.Sum64(), blocks: append([]uint64(nil), blocks...),
		collapsed: collapsed, tail: append([]byte(nil), tail...)}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.tick++
	ch.used = c.tick
	list := c.byHead[head]
	// A chain that this one extends is not needed any more: the conversation moved on.
	list = deleteChains(list, func(o *remembered) bool {
		drop := o.seed == seed && o.size == size && o.rawLen <= rawLen && o.rawLen > 0 &&
			len(o.blocks) <= len(blocks) && o.blocks[len(o.blocks)-1] == blocks[len(o.blocks)-1]
		if drop {
			c.blocks -= len(o.blocks)
			c.entries--
		}
		return drop
	})
	list = append(list, ch)
	c.blocks += len(ch.blocks)
	c.entries++
	if len(list) > maxPerHead {
		c.dropOldest(&list)
	}
	c.byHead[head] = list
	for c.blocks > c.maxBlocks {
		c.evict()
	}
}

func deleteChains(list []*remembered, drop func(*remembered) bool) []*remembered {
	out := list[:0]
	for _, ch := range list {
		if !drop(ch) {
			out = append(out, ch)
		}
	}
	clear(list[len(out):])
	return out
}

// dropOldest removes the least recently used chain of list.
func (c *Chains) dropOldest(list *[]*remembered) {
	k := 0
	for i, ch := range *list {
		if ch.used < (*list)[k].used {
			k = i
		}
	}
	c.blocks -= len((*list)[k].blocks)
	c.entries--
	*list = append((*list)[:k], (*list)[k+1:]...)
}

// evict removes the least recently used chain of all. It scans every chain: there are few
// (each holds at least minChainBlocks blocks of a bounded total).
func (c *Chains) evict() {
	var oldest *remembered
	for _, list := range c.byHead {
		for _, ch := range list {
			if oldest == nil || ch.used < oldest.used {
				oldest = ch
			}
		}
	}
	if oldest == nil {
		c.blocks = 0
		return
	}
	list := deleteChains(c.byHead[oldest.head], func(o *remembered) bool { return o == oldest })
	c.blocks -= len(oldest.blocks)
	c.entries--
	if len(list) == 0 {
		delete(c.byHead, oldest.head)
	} else {
		c.byHead[oldest.head] = list
	}
}
