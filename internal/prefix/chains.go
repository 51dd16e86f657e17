package prefix

import (
	"bytes"
	"sync"
	"unicode"
	"unicode/utf8"

	"github.com/cespare/xxhash/v2"
	"golang.org/x/text/unicode/norm"
)

// Chains remembers the block chains of recent long prompts, so that a prompt that shares a long
// start with one of them is normalised and hashed only past what they share: a conversation's
// next turn (99 % of a 100k-token text is the turn before), and a prompt that shares a long
// system prompt or document with an earlier one but asks its own question (the shared part is
// most of the text; normalising and hashing it was most of the router's CPU per request). What
// is shared is checked, not assumed: one xxhash pass over it must give what the earlier prompt
// gave.
//
// The check is made at marks: a remembered prompt keeps, every markBlocks blocks' worth of
// text, the xxhash of its text up to there, the length of that text once normalised, and the
// normalised bytes past its last full block there. Where the marks lie depends only on the text
// before them (the first offset at or past each multiple of the spacing that ends a character
// other than whitespace, so that no whitespace run crosses it), so two texts with the same start
// have the same marks in it, and a new text is hashed once, mark by mark, against every
// remembered chain filed under its head until none matches: the deepest mark matched gives the
// blocks taken over, and the rest is collapsed and hashed from there.
//
// A prompt that adds fewer than minChainBlocks blocks to the chain it took from is not itself
// remembered: the next turn takes the shared part from that chain too, and hashes the little
// more again. Only text whose default normalisation at most collapses whitespace (no carriage
// return, in NFC: the common case for machine-built prompts and prose alike) is remembered or
// extended; any other text takes the full path. Memory is bounded by the blocks remembered in
// all (each block also carries about a 64th of a mark, 32 to 100 bytes). It is safe for
// concurrent use; a nil *Chains remembers nothing.
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

// remembered is what one prompt left: the chained hashes of its normalised text's full blocks,
// and its marks. Its fields do not change after it is stored.
type remembered struct {
	head   uint64
	seed   uint64
	size   int // block bytes
	blocks []uint64
	marks  []mark
	tails  []byte // every mark's tail, one after the other
	used   uint64 // Chains.tick when last matched or stored; guarded by Chains.mu
}

// mark is a point of a remembered text at which another text that starts the same way may take
// over its blocks.
type mark struct {
	raw  int    // bytes of text before the mark, which end a character (markEnd)
	norm int    // bytes of the normalised text[:raw]
	hash uint64 // xxhash of text[:raw]
	// tail is where the mark's tail starts in tails: the norm % size normalised bytes past the
	// last full block.
	tail int
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
	// markBlocks is the spacing of marks in blocks' worth of raw text (4 KB at 16-token
	// blocks): at most that much shared text is hashed again, and a mark costs about 1/64 of
	// the blocks it stands for.
	markBlocks = 64
)

// NewChains returns a Chains that remembers at most maxBlocks blocks (8 bytes each, plus about
// 100 bytes per prompt and up to 100 bytes per 64 blocks).
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
	if c == nil || !n.isDefault() || len(text) < max(headBytes, minChainBlocks*size) || startsWithSpace(text) {
		return NormalizedBlocks(dst, seed, text, blockTokens, n)
	}
	head := seed ^ xxhash.Sum64(text[:headBytes])
	var d xxhash.Digest
	base, j := c.fork(head, seed, size, text, &d)
	from := 0
	if base != nil {
		from = base.marks[j].raw
	}
	if !collapsibleFrom(text, from) {
		return NormalizedBlocks(dst, seed, text, blockTokens, n)
	}
	if base == nil {
		d.Reset()
	} else {
		c.mu.Lock()
		c.reused++
		c.mu.Unlock()
	}
	return c.extend(dst, head, seed, size, text, base, j, &d)
}

// startsWithSpace reports whether text starts with a character the normalisation trims.
func startsWithSpace(text []byte) bool {
	r, _ := utf8.DecodeRune(text)
	return unicode.IsSpace(r)
}

// collapsibleFrom reports whether the default normalisation of text only collapses whitespace
// past from, where text[:from] is known to need no more than that: no carriage return, NFC (from
// the last normalisation boundary before from).
func collapsibleFrom(text []byte, from int) bool {
	rest := text[from:]
	if bytes.IndexByte(rest, '\r') >= 0 {
		return false
	}
	if isASCII(rest) {
		return true
	}
	if from == 0 {
		return norm.NFC.IsNormal(text)
	}
	b := norm.NFC.LastBoundary(text[:from])
	return b >= 0 && norm.NFC.IsNormal(text[b:])
}

// nextMark returns the offset of the first mark at or past t: the first offset r >= t that ends a
// character other than whitespace or a control (markEnd), or -1 when there is none in text.
func nextMark(text []byte, t int) int {
	for r := max(t, 1); r <= len(text); r++ {
		if markEnd(text, r) {
			return r
		}
	}
	return -1
}

// markEnd reports whether text[:r] ends with a character after which a mark may lie: printable
// ASCII, or a whole, valid multi-byte character that is not whitespace. Decoding text from its
// start reaches r-size as a character's start (a leading byte is never part of the invalid bytes
// or characters before it), so the collapse sees the same character whether it reads the text
// whole or in pieces cut at r, and no whitespace run crosses r.
func markEnd(text []byte, r int) bool {
	b := text[r-1]
	if b < utf8.RuneSelf {
		return printableASCII(b)
	}
	c, size := utf8.DecodeLastRune(text[:r])
	return size > 1 && !unicode.IsSpace(c) && !unicode.IsControl(c)
}

// markAfter is where the search for the mark after one at r starts.
func markAfter(r, spacing int) int { return (r/spacing + 1) * spacing }

// fork returns the remembered chain under head that shares the most marks with text, and the
// index j of the deepest mark they share (base nil when none shares one); d is then the digest
// of text up to that mark.
func (c *Chains) fork(head, seed uint64, size int, text []byte, d *xxhash.Digest) (base *remembered, j int) {
	var buf [maxPerHead]*remembered
	c.mu.Lock()
	alive := buf[:0]
	for _, ch := range c.byHead[head] {
		if ch.seed == seed && ch.size == size && len(ch.marks) > 0 {
			alive = append(alive, ch)
		}
	}
	c.mu.Unlock()
	if len(alive) == 0 {
		return nil, 0
	}
	spacing := markBlocks * size
	d.Reset()
	pos := 0
	for i, t := 0, spacing; len(alive) > 0; i++ {
		r := nextMark(text, t)
		if r < 0 {
			break
		}
		t = markAfter(r, spacing)
		before := *d
		_, _ = d.Write(text[pos:r])
		h := d.Sum64()
		keep := alive[:0]
		for _, ch := range alive {
			if i < len(ch.marks) && ch.marks[i].raw == r && ch.marks[i].hash == h {
				keep = append(keep, ch)
			}
		}
		if len(keep) == 0 {
			*d = before // back to the deepest mark shared
			break
		}
		alive, pos, base, j = keep, r, keep[0], i
	}
	if base != nil {
		c.mu.Lock()
		c.tick++
		base.used = c.tick
		c.mu.Unlock()
	}
	return base, j
}

// extend appends to dst the blocks of text, whose default normalisation only collapses
// whitespace: those of base up to its mark j (base nil: none), then those of the rest,
// collapsed and hashed mark by mark as it is read (no normalised copy of the text is made: a
// 15 MiB prompt collapsed into a growing buffer cost about 90 MB); d is the digest of text up
// to where it starts. The text is then remembered, with its marks, unless it adds fewer than
// minChainBlocks blocks to base's.
func (c *Chains) extend(dst []uint64, head, seed uint64, size int, text []byte, base *remembered, j int, d *xxhash.Digest) []uint64 {
	w := newBlockWriter(growUint64(dst, len(text)/size), seed, size) // the normalised text is no longer than text
	start := len(w.dst)
	spacing := markBlocks * size
	var marks []mark
	var tails []byte
	pos, t := 0, spacing
	// A prompt that adds little to what it takes from base (its own question after a shared
	// document) is not remembered: a text that extends it takes the shared part from base all
	// the same, and hashes at most minChainBlocks blocks and its own turn again. Remembering
	// each such prompt cost a copy of all its blocks and its marks, and crowded out the chains
	// that differ.
	remember := true
	if base != nil {
		m := base.marks[j]
		k := m.norm / size
		w.take(base.blocks[:k], base.tails[m.tail:m.tail+m.norm%size])
		pos, t = m.raw, markAfter(m.raw, spacing)
		// The blocks past k are at most those of the tail and the rest uncollapsed.
		if remember = (m.norm%size+len(text)-pos)/size >= minChainBlocks; remember {
			marks = append(make([]mark, 0, j+1+(len(text)-pos)/spacing+1), base.marks[:j+1]...)
			tails = append(make([]byte, 0, len(base.tails)), base.tails[:m.tail+m.norm%size]...)
		}
	} else {
		marks = make([]mark, 0, len(text)/spacing+1)
	}
	taken := len(w.dst) - start
	for remember {
		r := nextMark(text, t)
		if r < 0 {
			break
		}
		t = markAfter(r, spacing)
		piece := text[pos:r]
		w.writeCollapsed(piece)
		_, _ = d.Write(piece)
		pos = r
		marks = append(marks, mark{raw: r, norm: w.n, hash: d.Sum64(), tail: len(tails)})
		tails = append(tails, w.partial()...)
	}
	// The normalisation trims the text's trailing whitespace; no mark lies in it (a mark ends a
	// character other than whitespace), so it is all in the rest.
	w.writeCollapsed(bytes.TrimRightFunc(text[pos:], unicode.IsSpace))
	dst = w.blocks()
	w.release()
	if len(marks) > 0 && (base == nil || len(dst)-start-taken >= minChainBlocks) {
		c.store(head, seed, size, dst[start:], marks, tails)
	}
	return dst
}

// printableASCII reports whether b is an ASCII byte that is neither whitespace nor a control.
func printableASCII(b byte) bool { return b > ' ' && b < utf8.RuneSelf }

// NormalizedBlocks appends to dst what BlocksBytes(dst, seed, n.NormalizeBytes(text),
// blockTokens) appends. Under the default normalisation the text is collapsed and hashed as it
// is read: text that is not in NFC is put in NFC into a buffer (recycled up to maxPooledNorm),
// and nothing else is copied, so a prompt allocates only its block hashes (a 15 MiB one
// collapsed into a growing buffer cost about 90 MB). Other normalisations (rules, options) go
// through NormalizeBytes.
func NormalizedBlocks(dst []uint64, seed uint64, text []byte, blockTokens int, n *Normalizer) []uint64 {
	if blockTokens <= 0 {
		blockTokens = DefaultBlockTokens
	}
	if !n.isDefault() {
		return BlocksBytes(dst, seed, n.NormalizeBytes(text), blockTokens)
	}
	var bp *[]byte
	var nfc []byte
	if !isASCII(text) && !norm.NFC.IsNormal(text) {
		// Carriage returns are left to the collapse: they and line feeds are starters that
		// compose with nothing, so NFC keeps them where they are.
		bp = normBufs.Get().(*[]byte)
		nfc = *bp
		if cap(nfc) < len(text) {
			nfc = make([]byte, 0, len(text)) // NFC seldom makes text longer
		}
		nfc = norm.NFC.Append(nfc[:0], text...)
		text = nfc
	}
	// Trimming the edges first leaves no run at either to collapse: the same text as
	// collapsing first and trimming the one whitespace byte left at each.
	text = bytes.TrimSpace(text)
	if !needsCollapse(text) {
		dst = BlocksBytes(dst, seed, text, blockTokens)
	} else {
		size := BlockBytes(blockTokens)
		w := newBlockWriter(growUint64(dst, len(text)/size), seed, size)
		w.writeCollapsed(text)
		dst = w.blocks()
		w.release()
	}
	if bp != nil {
		putNorm(bp, nfc)
	}
	return dst
}

// normBufs recycles the buffers text is put in NFC into and blockWriter's windows; buffers
// grown past maxPooledNorm are left to the garbage collector, so that one huge prompt is not
// kept.
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

// store remembers blocks, the chain of a text's normalised full blocks, with the text's marks and
// their tails.
func (c *Chains) store(head, seed uint64, size int, blocks []uint64, marks []mark, tails []byte) {
	if len(blocks) < minChainBlocks || len(blocks) > c.maxBlocks {
		return
	}
	ch := &remembered{head: head, seed: seed, size: size, blocks: append([]uint64(nil), blocks...), marks: marks, tails: tails}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.tick++
	ch.used = c.tick
	list := c.byHead[head]
	// A chain that this one extends is not needed any more: the conversation moved on.
	list = deleteChains(list, func(o *remembered) bool {
		drop := o.seed == seed && o.size == size && len(o.blocks) > 0 &&
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
