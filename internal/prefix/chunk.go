package prefix

import (
	"unicode/utf8"
	"unsafe"

	"github.com/cespare/xxhash/v2"
)

// DefaultBlockTokens is the router's block: 16 tokens, the same as vLLM's default KV block, so
// that one index entry stands for one engine block.
const DefaultBlockTokens = 16

// BlockBytes is the length in bytes of canonical text that one block of blockTokens tokens
// stands for (the same estimate as EstimateTokens).
func BlockBytes(blockTokens int) int { return blockTokens * BytesPerToken }

// Blocks appends to dst the chained hashes of the full blocks of text: the text is cut into
// blocks of BlockBytes(blockTokens) bytes, each block's content key is the xxhash of its bytes,
// and the keys are chained from seed with Next. A trailing partial block is left out (engines
// cache only full blocks). blockTokens <= 0 means DefaultBlockTokens. It allocates only when dst
// is too small.
func Blocks(dst []uint64, seed uint64, text string, blockTokens int) []uint64 {
	// A read-only view of the string's bytes: BlocksBytes only hashes them.
	return BlocksBytes(dst, seed, unsafe.Slice(unsafe.StringData(text), len(text)), blockTokens)
}

// BlocksBytes is Blocks for text held in a byte slice: the same hashes, without a string copy.
// It is Chain(dst, seed, ContentKeys(nil, text, blockTokens)) without the intermediate slice.
func BlocksBytes(dst []uint64, seed uint64, text []byte, blockTokens int) []uint64 {
	if blockTokens <= 0 {
		blockTokens = DefaultBlockTokens
	}
	return chainBytes(dst, seed, text, BlockBytes(blockTokens))
}

// chainBytes appends to dst the hashes of text's full blocks of size bytes, chained from h.
func chainBytes(dst []uint64, h uint64, text []byte, size int) []uint64 {
	n := len(text) / size
	dst = growUint64(dst, n)
	if size == blockBytesDefault {
		for i := 0; i < n; i++ {
			h = sum64Pair(h, sum64Block(text[i*size:]))
			dst = append(dst, h)
		}
		return dst
	}
	for i := 0; i < n; i++ {
		h = Next(h, xxhash.Sum64(text[i*size:(i+1)*size]))
		dst = append(dst, h)
	}
	return dst
}

// ContentKeys appends to dst the content key of each full block of blockTokens tokens of text:
// the xxhash of its BlockBytes(blockTokens) bytes. A trailing partial block has no key (engines
// cache only full blocks). blockTokens <= 0 means DefaultBlockTokens.
//
// This and Chain are the one way kvroute makes block keys: the router hashes the normalised
// prompt with BlocksBytes (the two fused), the engine simulator server keys the raw prompt an
// engine would see with ContentKeys, and the engine model and the fleet simulator chain content
// keys with Chain, so equal prefixes give equal keys wherever they are computed.
func ContentKeys(dst []uint64, text []byte, blockTokens int) []uint64 {
	if blockTokens <= 0 {
		blockTokens = DefaultBlockTokens
	}
	size := BlockBytes(blockTokens)
	n := len(text) / size
	dst = growUint64(dst, n)
	for i := 0; i < n; i++ {
		dst = append(dst, contentKey(text[i*size:(i+1)*size]))
	}
	return dst
}

func growUint64(dst []uint64, n int) []uint64 {
	if cap(dst)-len(dst) >= n {
		return dst
	}
	out := make([]uint64, len(dst), len(dst)+n)
	copy(out, dst)
	return out
}

func hashString(s string) uint64 { return xxhash.Sum64String(s) }

// EstimateTokensBytes is EstimateTokens for text held in a byte slice, without a string copy.
func EstimateTokensBytes(text []byte) int { return (len(text) + BytesPerToken - 1) / BytesPerToken }

// blockWriter hashes text written to it in pieces into the chained hashes of its full blocks:
// the hashes chainBytes gives for the pieces joined, without joining them. Short pieces (the
// words between two runs of whitespace the collapse replaces) are gathered in a small
// recycled window and hashed a few thousand bytes at a time; long ones are hashed where they
// lie. Call blocks for the hashes, then release.
type blockWriter struct {
	dst  []uint64
	h    uint64 // the last hash appended, or the seed
	size int    // block bytes
	n    int    // bytes written
	// buf holds the last bytes written that are not hashed yet: whole blocks, then the
	// n % size bytes past the last full block. It never grows past its capacity,
	// writerWindow + size: at writerWindow bytes its whole blocks are hashed.
	buf []byte
	bp  *[]byte // buf's pooled memory
}

// writerWindow is how many bytes a blockWriter gathers before it hashes them, and
// writerDirect the piece from which it hashes a piece where it lies: copying is cheaper below,
// a hash call per piece above.
const (
	writerWindow = 8 << 10
	writerDirect = 1 << 10
)

// newBlockWriter returns a blockWriter that appends to dst the blocks of size bytes chained
// from h.
func newBlockWriter(dst []uint64, h uint64, size int) blockWriter {
	bp := normBufs.Get().(*[]byte)
	need := writerWindow + size
	if cap(*bp) < need {
		*bp = make([]byte, 0, need)
	}
	return blockWriter{dst: dst, h: h, size: size, buf: (*bp)[:0:need], bp: bp}
}

// release gives the window back to the pool; w is not used after.
func (w *blockWriter) release() {
	putNorm(w.bp, (*w.bp)[:0])
	w.buf, w.bp = nil, nil
}

// blocks hashes what is gathered and returns dst with every full block's hash appended.
func (w *blockWriter) blocks() []uint64 {
	w.flush()
	return w.dst
}

// partial returns the bytes written past the last full block; they are the writer's own,
// valid until the next write.
func (w *blockWriter) partial() []byte { return w.buf[len(w.buf)-w.n%w.size:] }

// take starts w from blocks already hashed, with tail (fewer than size bytes) written past
// them.
func (w *blockWriter) take(blocks []uint64, tail []byte) {
	w.dst = append(w.dst, blocks...)
	if len(blocks) > 0 {
		w.h = blocks[len(blocks)-1]
	}
	w.n = len(blocks) * w.size
	w.write(tail)
}

// write hashes p as the next bytes of the text.
func (w *blockWriter) write(p []byte) {
	w.n += len(p)
	if len(p) < writerDirect && len(w.buf)+len(p) <= cap(w.buf) {
		w.buf = append(w.buf, p...)
		if len(w.buf) >= writerWindow {
			w.flush()
		}
		return
	}
	// The block under way is completed from p, as far as p goes, and hashed with the rest of
	// buf (which holds less than writerWindow bytes: it takes what the block lacks); p's full
	// blocks after it are hashed where they lie.
	k := min((w.size-len(w.buf)%w.size)%w.size, len(p))
	w.buf = append(w.buf, p[:k]...)
	w.flush()
	p = p[k:]
	full := len(p) - len(p)%w.size
	w.hash(p[:full])
	w.buf = append(w.buf, p[full:]...)
}

// writeByte is write of one byte.
func (w *blockWriter) writeByte(c byte) {
	w.n++
	w.buf = append(w.buf, c) // buf holds less than writerWindow bytes
	if len(w.buf) >= writerWindow {
		w.flush()
	}
}

// flush hashes the full blocks gathered in buf, leaving the partial block.
func (w *blockWriter) flush() {
	full := len(w.buf) - len(w.buf)%w.size
	if full == 0 {
		return
	}
	w.hash(w.buf[:full])
	w.buf = w.buf[:copy(w.buf, w.buf[full:])]
}

// hash appends the hashes of p's blocks (p holds whole blocks).
func (w *blockWriter) hash(p []byte) {
	if len(p) == 0 {
		return
	}
	w.dst = chainBytes(w.dst, w.h, p, w.size)
	w.h = w.dst[len(w.dst)-1]
}

// writeCollapsed writes p with its whitespace collapsed as the default normalisation does: as
// appendCollapsed collapses it, a carriage return counting as the newline the normalisation
// first turns it into. p must not end inside a character or a run that the text written next
// continues. The loop is appendCollapsed's, written out again (a call per run cost 5 % on prose
// with a run every 30 bytes); FuzzKeysAsBefore and FuzzFastKeys hold it to the reference.
func (w *blockWriter) writeCollapsed(p []byte) {
	s := unsafe.String(unsafe.SliceData(p), len(p))
	start := 0 // start of the pending segment, written as it is
	for i := 0; i < len(p); {
		// Eight ASCII bytes at a time while they change nothing (appendCollapsed says how).
		prevSpace := false // the byte before i is a space or a newline
		for ; i+8 <= len(p); i += 8 {
			x := word(p, i)
			low := (x - 0x21*ones) &^ x & highs
			if x&highs != 0 || low&(low<<8) != 0 || prevSpace && low&0x80 != 0 {
				break
			}
			if (x-0x20*ones)&^x&highs != 0 && low&^(eqBytes(x, ' ')|eqBytes(x, '\n')) != 0 {
				break
			}
			prevSpace = low>>63 != 0
		}
		if prevSpace {
			i-- // a run may start with the last byte taken
		}
		if i == len(p) {
			break
		}
		if c := p[i]; c > ' ' && c < utf8.RuneSelf {
			i++ // printable ASCII
			continue
		}
		size, space := spaceAt(s, i)
		if !space {
			i += size
			continue
		}
		run, newline := i, false
		for i < len(p) {
			size, space = spaceAt(s, i)
			if !space {
				break
			}
			newline = newline || p[i] == '\n' || p[i] == '\r'
			i += size
		}
		if i-run == 1 && (p[run] == ' ' || p[run] == '\n') {
			continue // one space or one newline: unchanged
		}
		c := byte(' ')
		if newline {
			c = '\n'
		}
		if seg := p[start:run]; len(seg) < writerDirect && len(w.buf)+len(seg)+1 <= cap(w.buf) {
			// write and writeByte, for the short words between runs, without the calls.
			w.buf = append(append(w.buf, seg...), c)
			w.n += len(seg) + 1
			if len(w.buf) >= writerWindow {
				w.flush()
			}
		} else {
			w.write(seg)
			w.writeByte(c)
		}
		start = i
	}
	w.write(p[start:])
}
