package peer

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"io"
	"math"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/tinylib/msgp/msgp"

	"github.com/kvroute/kvroute/internal/route"
)

// The wire format. Every message on a feed or snapshot stream is one frame:
//
//	length  uint32, big-endian: the bytes that follow (MAC and message)
//	mac     32 bytes: HMAC-SHA256 of the message under the key derived from the shared secret
//	message msgpack array [major, minor, from, incarnation, nonce, seq, sent_at, kind, payload]
//
// from and incarnation name the sender (its node name and start time); nonce is the one the
// receiver put in its request, so that a frame of another stream, or of another receiver, is
// refused; seq counts the stream's frames from 1, so that a frame replayed, dropped or
// reordered within the stream is refused; sent_at (unix nanoseconds) is when the oldest event
// of the message happened, for the lag metric. A message of another major version is refused;
// a newer minor version may append fields to any array, which are skipped.
//
// Payloads by kind: batch, an array of events; hello (first on a feed), an array of the IDs of
// the sender's attempts in flight; index, a piece (bin) of the policy's snapshot; flights, an
// array of events in flight (a snapshot's); end, [index entries, flights] (a snapshot's last).
//
// Since minor 4 a hello's message ends, after its payload, with next and live: the feed's
// numbers (per run of the sender, from 1) of the first batch the stream carries and of the
// first one flushed after it began. A feed numbers its batches of events, not its heartbeats
// (empty batches): the batch frames of a stream that hold events are the feed's batches
// next, next+1, ... in order. Those before live are resent from the sender's log: the
// receiver asked to resume after next-1 (its request's resume_inc and resume_after, signed
// under X-Kvroute-Peer-Resume-Signature with the request's own signature), and its block
// lists go on from its stream before. next is then the batch after the one asked after; a
// stream that does not resume has next equal to live. A sender of minor 3 or older has
// neither: its streams always start afresh.
//
// Events are arrays whose first element is the kind and second the origin (0: the sender):
//
//	routed       [1, origin, id, endpoint, model, tenant, session, block_tokens, prompt_tokens, max_tokens, back, shared, blocks, whole]
//
// where the request's block hashes are the first shared blocks of those of the routed event
// sent back routed events earlier on the same stream (1: the last one; back 0 and shared 0:
// none), then blocks: a bin of the rest, 8 bytes each, big-endian (a third cheaper to decode
// than an array of integers, and a byte smaller per block). Requests share long starts (a
// system prompt, a document, the conversation so far) with requests sent a moment before:
// with the reference a request's three events and its part of a frame are some 100 bytes
// where they were some 590 (docs/sync-cost.md). Both ends keep the block lists of the stream's last ringSize routed events,
// from empty at the stream's start; a reference the receiver cannot resolve is malformed, and
// ends the stream (the next one starts both rings anew).
//	first token  [2, origin, id, ttft_ns]
//	done         [3, origin, id, ok, cached_tokens, prompt_tokens, output_tokens, ttft_ns, duration_ns, predicted_cached, failure]
//
// where failure (minor 3's, only when ok is false and the failure counts against the endpoint:
// left out otherwise) is route.Failure's number, for the receiver's passive health checking.
//	removed      [4, origin, endpoint]
//	stalled      [5, origin, endpoint, silent_ns]
//	backoff      [6, origin, endpoint, rest_ns]
//	ejected      [7, origin, endpoint, rest_ns]

// Protocol versions. A replica refuses messages of another major version.
// Major 2: routed events refer to the blocks of earlier ones (back, shared). Minor 1: routed
// events end with whole (the answer comes whole, not streamed), false when a sender of minor 0
// leaves it out. Minor 2: stalled events (a replica of minor 1 skips them, as any kind it does
// not know). Minor 3: done events of failed attempts end with failure (a replica of minor 2
// skips it; one of minor 3 reads its absence as a failure not to count), backoff events, and
// ejected events in a snapshot (both skipped by a replica of minor 2). Minor 4: a hello ends
// with next and live, and a feed request may ask to resume (a replica of minor 3 ignores both,
// and its streams start afresh).
const (
	Major = 2
	Minor = 4
)

// Message kinds.
const (
	kindBatch   = 1
	kindHello   = 2
	kindIndex   = 3
	kindFlights = 4
	kindEnd     = 5
)

const (
	macSize   = sha256.Size
	nonceSize = 16
	headerLen = 9
)

// Why a frame or message was refused: the metrics' reasons.
var (
	errOversized = errors.New("oversized")
	errTruncated = errors.New("truncated")
	errForged    = errors.New("forged")
	errReplayed  = errors.New("replayed")
	errVersion   = errors.New("version")
	errMalformed = errors.New("malformed")
)

// reason names an error of the wire for metrics: oversized, truncated, forged, replayed,
// version, malformed; "" for others.
func reason(err error) string {
	for _, e := range []error{errOversized, errTruncated, errForged, errReplayed, errVersion, errMalformed} {
		if errors.Is(err, e) {
			return e.Error()
		}
	}
	return ""
}

// keys derives the keys of the shared secret: one for message MACs, one for memberlist's
// gossip encryption (AES-256-GCM), so that neither use can reveal the other's.
func keys(secret []byte) (mac, gossip []byte) {
	derive := func(label string) []byte {
		h := hmac.New(sha256.New, secret)
		h.Write([]byte(label))
		return h.Sum(nil)
	}
	return derive("kvroute peers v1 messages"), derive("kvroute peers v1 gossip")
}

// origin is the route.Event origin of a replica's incarnation: nonzero, and different for
// every name and start.
func origin(name string, inc uint64) uint64 {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], inc)
	d := xxhash.New()
	_, _ = d.WriteString(name)
	_, _ = d.Write([]byte{0})
	_, _ = d.Write(b[:])
	return d.Sum64() | 1
}

// header is a message's fixed part.
type header struct {
	from   string
	inc    uint64
	nonce  [nonceSize]byte
	seq    uint64
	sentAt int64
	kind   int
	// trailing is how many fields follow the payload (a newer minor version's): the
	// message's array holds headerLen+trailing.
	trailing int
}

// The hot path encodes and decodes with tinylib/msgp's functions on byte slices: no
// reflection, no io.Writer or io.ByteScanner call per value, and strings and bins read in
// place. They write the same msgpack as vmihailenco/msgpack (the smallest form of each
// value; a nonnegative integer as an unsigned one), so the bytes on the wire did not change
// with them (TestWireGolden).

// appendInt appends v as vmihailenco's EncodeInt does: unsigned when it is not negative.
func appendInt(b []byte, v int64) []byte {
	if v >= 0 {
		return msgp.AppendUint64(b, uint64(v))
	}
	return msgp.AppendInt64(b, v)
}

// appendHeader appends the message's header fields (the array's first 8 of 9 elements) to b.
func appendHeader(b []byte, h *header) []byte {
	b = msgp.AppendArrayHeader(b, uint32(headerLen+h.trailing))
	b = appendInt(b, Major)
	b = appendInt(b, Minor)
	b = msgp.AppendString(b, h.from)
	b = msgp.AppendUint64(b, h.inc)
	b = msgp.AppendBytes(b, h.nonce[:])
	b = msgp.AppendUint64(b, h.seq)
	b = appendInt(b, h.sentAt)
	return appendInt(b, int64(h.kind))
}

// writeFrame writes one frame of the message head+payload under key.
func writeFrame(w io.Writer, key, head, payload []byte) error {
	b := append(make([]byte, frameStart, frameStart+len(head)+len(payload)), head...)
	b = append(b, payload...)
	sealFrame(b, hmac.New(sha256.New, key))
	_, err := w.Write(b)
	return err
}

// frameStart is the room a frame's length and MAC take before its message.
const frameStart = 4 + macSize

// sealFrame fills in the length and MAC of frame b, whose first frameStart bytes are
// reserved for them and the rest is the message. mac is reused (a stream's: one per stream,
// not per frame).
func sealFrame(b []byte, mac hash.Hash) {
	mac.Reset()
	mac.Write(b[frameStart:])
	binary.BigEndian.PutUint32(b[:4], uint32(len(b)-4))
	mac.Sum(b[4:4])
}

// readFrame reads one frame into buf (grown as needed, never beyond max bytes) and returns
// its message once its MAC is verified.
func readFrame(r io.Reader, key []byte, max int, buf []byte) (msg, grown []byte, err error) {
	return readFrameMAC(r, hmac.New(sha256.New, key), max, buf)
}

// readFrameMAC is readFrame with a MAC to reuse (a stream's).
func readFrameMAC(r io.Reader, mac hash.Hash, max int, buf []byte) (msg, grown []byte, err error) {
	var pre [4]byte
	if k, err := io.ReadFull(r, pre[:]); err != nil {
		switch {
		case k == 0 && errors.Is(err, io.ErrUnexpectedEOF):
			// Nothing of a frame came: the stream ended between frames, its body cut short (a
			// peer killed, its connection lost, as an HTTP/1 chunked body says): no tampering.
			return nil, buf, io.EOF
		case errors.Is(err, io.ErrUnexpectedEOF):
			return nil, buf, fmt.Errorf("%w: frame length cut after %d of 4 bytes", errTruncated, k)
		case k > 0:
			return nil, buf, fmt.Errorf("frame length cut after %d of 4 bytes: %w", k, err)
		}
		return nil, buf, err // io.EOF: the stream ended between frames; or the read failed
	}
	n := int(binary.BigEndian.Uint32(pre[:]))
	if n > max {
		return nil, buf, fmt.Errorf("%w: frame of %d bytes, limit %d", errOversized, n, max)
	}
	if n < macSize {
		return nil, buf, fmt.Errorf("%w: frame of %d bytes, shorter than its MAC", errMalformed, n)
	}
	if cap(buf) < n {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	if k, err := io.ReadFull(r, buf); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
			// The stream's body ended within the frame: the message was cut.
			return nil, buf, fmt.Errorf("%w: %d of %d bytes (%v)", errTruncated, k, n, err)
		}
		// The read failed (this side cancelled the stream: its peer declared gone, its
		// watchdog, the node stopping; or the connection failed): the stream ended, and
		// nothing says the message was cut, let alone tampered with.
		return nil, buf, fmt.Errorf("frame cut after %d of %d bytes: %w", k, n, err)
	}
	mac.Reset()
	mac.Write(buf[macSize:])
	var sum [macSize]byte
	if !hmac.Equal(mac.Sum(sum[:0]), buf[:macSize]) {
		return nil, buf, fmt.Errorf("%w: MAC does not match", errForged)
	}
	return buf[macSize:], buf, nil
}

// decodeHeader reads a verified message's header; it returns the rest of msg, the payload.
func decodeHeader(msg []byte) (header, []byte, error) {
	var h header
	n, b, err := msgp.ReadArrayHeaderBytes(msg)
	if err != nil || n < headerLen {
		return h, nil, fmt.Errorf("%w: message of %d fields (%v)", errMalformed, n, err)
	}
	major, b, err := msgp.ReadInt64Bytes(b)
	if err != nil {
		return h, nil, fmt.Errorf("%w: version: %v", errMalformed, err)
	}
	if major != Major {
		return h, nil, fmt.Errorf("%w: major version %d, want %d", errVersion, major, Major)
	}
	r := reader{b: b}
	r.int() // minor: anything newer only adds fields
	from := r.bytes(msgp.ReadStringZC)
	inc := r.uint()
	nonce := r.bytes(msgp.ReadBytesZC)
	seq := r.uint()
	sent := r.int()
	kind := r.int()
	if r.err != nil {
		return h, nil, fmt.Errorf("%w: header: %v", errMalformed, r.err)
	}
	if len(nonce) != nonceSize {
		return h, nil, fmt.Errorf("%w: nonce of %d bytes", errMalformed, len(nonce))
	}
	h.from, h.inc, h.seq, h.sentAt, h.kind = string(from), inc, seq, sent, int(kind)
	h.trailing = int(n) - headerLen
	copy(h.nonce[:], nonce)
	return h, r.b, nil // fields after the payload, a newer minor version's, are left unread
}

// appendEvent appends ev (origin 0 stands for the sender), a routed event with its blocks
// whole.
func appendEvent(b []byte, ev *route.Event) ([]byte, error) { return appendEventRef(b, ev, 0, 0) }

// appendEventRef appends ev; a routed event's first shared blocks are those of the routed
// event sent back events earlier on the stream (see blockRing.longest), and only the rest are
// written.
func appendEventRef(b []byte, ev *route.Event, back, shared int) ([]byte, error) {
	n := eventFields(uint64(ev.Kind))
	if n == 0 {
		return b, fmt.Errorf("event kind %d: nothing to send", ev.Kind)
	}
	switch {
	case ev.Kind == route.EventRouted:
		n++ // whole, minor 1's
	case ev.Kind == route.EventDone && ev.Failure != route.FailNone:
		n++ // failure, minor 3's
	}
	b = msgp.AppendArrayHeader(b, uint32(n))
	b = msgp.AppendUint64(b, uint64(ev.Kind))
	b = msgp.AppendUint64(b, ev.Origin)
	switch ev.Kind {
	case route.EventRouted:
		b = msgp.AppendUint64(b, ev.ID)
		for _, s := range [...]string{ev.Endpoint, ev.Model, ev.Tenant, ev.SessionKey} {
			b = msgp.AppendString(b, s)
		}
		b = appendInts(b, int64(ev.BlockTokens), int64(ev.PromptTokens), int64(ev.MaxTokens), int64(back), int64(shared))
		b = msgp.AppendBytesHeader(b, uint32(8*(len(ev.Blocks)-shared)))
		for _, h := range ev.Blocks[shared:] {
			b = binary.BigEndian.AppendUint64(b, h)
		}
		b = msgp.AppendBool(b, ev.Whole)
	case route.EventFirstToken:
		b = msgp.AppendUint64(b, ev.ID)
		b = appendInt(b, int64(ev.TTFT))
	case route.EventDone:
		b = msgp.AppendUint64(b, ev.ID)
		b = msgp.AppendBool(b, ev.OK)
		b = appendInts(b, int64(ev.CachedTokens), int64(ev.PromptTokens), int64(ev.OutputTokens),
			int64(ev.TTFT), int64(ev.Duration), int64(ev.Predicted))
		if ev.Failure != route.FailNone {
			b = msgp.AppendUint64(b, uint64(ev.Failure))
		}
	case route.EventRemoved:
		b = msgp.AppendString(b, ev.Endpoint)
	case route.EventStalled:
		b = msgp.AppendString(b, ev.Endpoint)
		b = appendInt(b, int64(ev.Silent))
	case route.EventBackoff, route.EventEjected:
		b = msgp.AppendString(b, ev.Endpoint)
		b = appendInt(b, int64(ev.Rest))
	}
	return b, nil
}

func appendInts(b []byte, vs ...int64) []byte {
	for _, v := range vs {
		b = appendInt(b, v)
	}
	return b
}

// Bounds on a decoded event: more is malformed.
const (
	maxBlocks    = 1 << 20
	maxStringLen = 4096
	// maxBatchBlocks bounds the blocks of a message's events together, which references
	// would otherwise let a few bytes multiply: 4 MB of hashes, what a message of
	// DefaultMaxMessageBytes could hold whole. The sender ends a batch before it would hold
	// more.
	maxBatchBlocks = 1 << 19
)

// eventFields is how many fields an event of kind has in this version (0: a kind it does not
// know).
func eventFields(kind uint64) int {
	switch route.EventKind(kind) {
	case route.EventRouted:
		return 13
	case route.EventFirstToken:
		return 4
	case route.EventDone:
		return 10
	case route.EventRemoved:
		return 3
	case route.EventStalled, route.EventBackoff, route.EventEjected:
		return 4
	}
	return 0
}

// decoder decodes a stream's events. It keeps the strings that repeat from event to event
// (endpoint names, models, tenants), so that an event allocates only what it must: its
// blocks and its session key; and the block lists of the stream's last routed events, which
// the next ones refer to. Not safe for concurrent use.
type decoder struct {
	strs map[string]string
	ring blockRing // the lists the lifecycle was given: it only reads them
	left int       // blocks the message being decoded may still hold
}

// maxInterned bounds the strings a decoder keeps; beyond, strings are allocated each time.
const maxInterned = 1024

// intern returns b as a string, the same one each time while the decoder keeps it.
func (d *decoder) intern(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	if s, ok := d.strs[string(b)]; ok { // no allocation: the compiler looks up b in place
		return s
	}
	s := string(b)
	if len(d.strs) < maxInterned {
		if d.strs == nil {
			d.strs = map[string]string{}
		}
		d.strs[s] = s
	}
	return s
}

// event decodes one event of b into ev and reports whether it was of a kind this version
// knows; an unknown kind is skipped whole. It returns the rest of b. The blocks are a new
// slice: Apply keeps them.
func (d *decoder) event(b []byte, ev *route.Event) (known bool, rest []byte, err error) {
	n, b, err := msgp.ReadArrayHeaderBytes(b)
	if err != nil || n < 2 {
		return false, nil, fmt.Errorf("%w: event of %d fields (%v)", errMalformed, n, err)
	}
	r := reader{b: b}
	kind, orig := r.uint(), r.uint()
	if r.err != nil {
		return false, nil, fmt.Errorf("%w: event: %v", errMalformed, r.err)
	}
	*ev = route.Event{Kind: route.EventKind(kind), Origin: orig}
	want := eventFields(kind)
	if want == 0 {
		rest, err := skipFields(r.b, int(n)-2)
		return false, rest, err
	}
	if int(n) < want {
		return false, nil, fmt.Errorf("%w: %s event of %d fields, want %d", errMalformed, ev.Kind, n, want)
	}
	switch ev.Kind {
	case route.EventRouted:
		ev.ID = r.uint()
		ev.Endpoint, ev.Model, ev.Tenant = d.intern(r.str()), d.intern(r.str()), d.intern(r.str())
		if s := r.str(); len(s) > 0 {
			ev.SessionKey = string(s)
		}
		ev.BlockTokens, ev.PromptTokens, ev.MaxTokens = r.count(), r.count(), r.count()
		back, shared := r.int(), r.int()
		start, refErr := d.ring.ref(back, shared)
		ev.Blocks = r.blocks(start, refErr, d.left)
		if r.err == nil {
			d.ring.push(ev.Blocks)
			d.left -= len(ev.Blocks)
		}
		if n > uint32(want) && r.err == nil {
			ev.Whole = r.bool()
			want++ // read: the fields a newer minor version appends follow it
		}
	case route.EventFirstToken:
		ev.ID, ev.TTFT = r.uint(), time.Duration(r.int())
	case route.EventDone:
		ev.ID, ev.OK = r.uint(), r.bool()
		ev.CachedTokens, ev.PromptTokens, ev.OutputTokens = r.count(), r.count(), r.count()
		ev.TTFT, ev.Duration = time.Duration(r.int()), time.Duration(r.int())
		ev.Predicted = r.count()
		if n > uint32(want) && r.err == nil {
			if f := r.uint(); !ev.OK && f <= math.MaxUint8 {
				ev.Failure = route.Failure(f) // a kind this version does not know counts for nothing
			}
			want++ // read: the fields a newer minor version appends follow it
		}
	case route.EventRemoved:
		ev.Endpoint = d.intern(r.str())
	case route.EventStalled:
		ev.Endpoint, ev.Silent = d.intern(r.str()), time.Duration(r.int())
	case route.EventBackoff, route.EventEjected:
		ev.Endpoint, ev.Rest = d.intern(r.str()), time.Duration(r.int())
	}
	if r.err != nil {
		return false, nil, fmt.Errorf("%w: %s event: %v", errMalformed, ev.Kind, r.err)
	}
	rest, err = skipFields(r.b, int(n)-want)
	return true, rest, err
}

// batch decodes a batch's payload (an array of events) and appends the events of kinds this
// version knows to evs, with origin 0 (the sender) replaced by sender.
func (d *decoder) batch(payload []byte, sender uint64, evs []route.Event) ([]route.Event, error) {
	n, b, err := arrayLen(payload, "batch")
	if err != nil {
		return evs, err
	}
	d.left = maxBatchBlocks
	for range n {
		evs = append(evs, route.Event{})
		ev := &evs[len(evs)-1]
		known, rest, err := d.event(b, ev)
		if err != nil {
			return evs[:len(evs)-1], err
		}
		b = rest
		switch {
		case !known:
			evs = evs[:len(evs)-1]
		case ev.Origin == 0:
			ev.Origin = sender
		}
	}
	return evs, nil
}

// reader reads a message's values in order, keeping the first error (later reads do
// nothing).
type reader struct {
	b   []byte
	err error
}

// read reads one value with f, unless an earlier read failed.
func read[T any](r *reader, f func([]byte) (T, []byte, error)) T {
	var v T
	if r.err == nil {
		v, r.b, r.err = f(r.b)
	}
	return v
}

func (r *reader) uint() uint64 { return read(r, msgp.ReadUint64Bytes) }
func (r *reader) int() int64   { return read(r, msgp.ReadInt64Bytes) }
func (r *reader) bool() bool   { return read(r, msgp.ReadBoolBytes) }

// bytes reads a string (msgp.ReadStringZC) or bin (msgp.ReadBytesZC) in place: valid while
// the message is.
func (r *reader) bytes(f func([]byte) ([]byte, []byte, error)) []byte { return read(r, f) }

// str reads a string, in place, of at most maxStringLen bytes.
func (r *reader) str() []byte {
	v := r.bytes(msgp.ReadStringZC)
	if r.err == nil && len(v) > maxStringLen {
		r.err = fmt.Errorf("string of %d bytes", len(v))
	}
	return v
}

// count reads a token count: -1 (unknown) up to 2^40.
func (r *reader) count() int {
	v := r.int()
	if r.err == nil && (v < -1 || v > 1<<40) {
		r.err = fmt.Errorf("count %d out of range", v)
	}
	return int(v)
}

// blocks reads a bin of 8-byte big-endian block hashes into a new slice, after the blocks of
// start (an earlier event's, which ref resolved; ref's error, if any, is the reader's), all
// of them at most limit. The bin is read in place: nothing is allocated for a length beyond
// what the message and the earlier event hold.
func (r *reader) blocks(start []uint64, ref error, limit int) []uint64 {
	if r.err == nil && ref != nil {
		r.err = ref
	}
	raw := r.bytes(msgp.ReadBytesZC)
	if r.err != nil {
		return nil
	}
	if len(raw)%8 != 0 || len(start)+len(raw)/8 > min(maxBlocks, limit) {
		r.err = fmt.Errorf("blocks of %d bytes after %d, %d left to the message", len(raw), len(start), limit)
		return nil
	}
	if len(start)+len(raw) == 0 {
		return nil
	}
	out := make([]uint64, len(start)+len(raw)/8)
	k := copy(out, start)
	for i := range out[k:] {
		out[k+i] = binary.BigEndian.Uint64(raw[8*i:])
	}
	return out
}

// ringSize is how many routed events back an event's blocks may refer to. With 16 the
// sender's search for the longest shared start costs a full comparison with the newest list
// that starts alike and one or two comparisons with each of the others (see longest).
const ringSize = 16

// maxRingBlocks bounds a list the sender keeps (a copy, in a buffer it reuses): a longer one
// is kept as empty, so that a burst's huge request does not hold its buffer for good.
const maxRingBlocks = 1 << 16

// blockRing is the block lists of a stream's last ringSize routed events, the newest last:
// the sender's, to find what an event shares with one of them; the receiver's, to resolve the
// reference. Both push every routed event in the stream's order, so that back counts the
// same events at both ends.
type blockRing struct {
	lists [ringSize][]uint64
	next  int // where the next list goes
	n     int // lists held, at most ringSize
}

// at returns the list pushed back lists ago (1: the last), 1 <= back <= r.n.
func (r *blockRing) at(back int) []uint64 { return r.lists[(r.next-back+ringSize)%ringSize] }

// push keeps blocks itself (the receiver's: the lifecycle only reads them).
func (r *blockRing) push(blocks []uint64) {
	r.lists[r.next] = blocks
	r.next = (r.next + 1) % ringSize
	r.n = min(r.n+1, ringSize)
}

// pushCopy keeps a copy of blocks, in the buffer of the list it replaces (the sender's: the
// caller's blocks are the caller's).
func (r *blockRing) pushCopy(blocks []uint64) {
	l := r.lists[r.next][:0]
	if len(blocks) <= maxRingBlocks {
		l = append(l, blocks...)
	} else {
		l = nil
	}
	r.lists[r.next] = l
	r.next = (r.next + 1) % ringSize
	r.n = min(r.n+1, ringSize)
}

// reset forgets the lists (a new stream starts from none); the sender's buffers stay.
func (r *blockRing) reset() { r.n = 0 }

// longest returns which list (back: 1 for the last) starts with the most of blocks, and how
// many (shared); 0, 0 when none starts with blocks[0]. A list can do better than the best so
// far only if it holds blocks[shared] at the same place, so the others cost a comparison or
// two each.
func (r *blockRing) longest(blocks []uint64) (back, shared int) {
	for j := 1; j <= r.n && shared < len(blocks); j++ {
		l := r.at(j)
		if len(l) <= shared || l[shared] != blocks[shared] || l[0] != blocks[0] {
			continue
		}
		k := 1
		for m := min(len(l), len(blocks)); k < m && l[k] == blocks[k]; k++ {
		}
		if k > shared {
			back, shared = j, k
		}
	}
	return back, shared
}

// appendEvent appends ev as the stream's next event: a routed one's blocks by reference to
// the list that starts with the most of them, which it then keeps (a copy).
func (r *blockRing) appendEvent(b []byte, ev *route.Event) ([]byte, error) {
	if ev.Kind != route.EventRouted {
		return appendEvent(b, ev)
	}
	back, shared := r.longest(ev.Blocks)
	b, err := appendEventRef(b, ev, back, shared)
	if err == nil {
		r.pushCopy(ev.Blocks)
	}
	return b, err
}

// ref resolves a reference read from a peer: the first shared blocks of the list back lists
// ago. Anything it cannot resolve is malformed.
func (r *blockRing) ref(back, shared int64) ([]uint64, error) {
	switch {
	case back == 0 && shared == 0:
		return nil, nil
	case back < 1 || back > int64(r.n):
		return nil, fmt.Errorf("blocks of the routed event %d back, of %d", back, r.n)
	}
	l := r.at(int(back))
	if shared < 0 || shared > int64(len(l)) {
		return nil, fmt.Errorf("%d blocks of a routed event of %d", shared, len(l))
	}
	return l[:shared], nil
}

// arrayLen reads an array's length, refused (malformed) when it claims more elements than
// b has bytes left.
func arrayLen(b []byte, what string) (int, []byte, error) {
	n, rest, err := msgp.ReadArrayHeaderBytes(b)
	if err != nil || int64(n) > int64(len(rest)) {
		return 0, nil, fmt.Errorf("%w: %s of %d elements (%v)", errMalformed, what, n, err)
	}
	return int(n), rest, nil
}

// skipFields skips n values of b and returns the rest.
func skipFields(b []byte, n int) ([]byte, error) {
	for range n {
		var err error
		if b, err = msgp.Skip(b); err != nil {
			return nil, fmt.Errorf("%w: %v", errMalformed, err)
		}
	}
	return b, nil
}
