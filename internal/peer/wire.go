package peer

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"io"
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
// Events are arrays whose first element is the kind and second the origin (0: the sender):
//
//	routed       [1, origin, id, endpoint, model, tenant, session, block_tokens, prompt_tokens, max_tokens, blocks]
//
// where blocks is a bin of the block hashes, 8 bytes each, big-endian (a third cheaper to decode
// than an array of integers, and a byte smaller per block).
//	first token  [2, origin, id, ttft_ns]
//	done         [3, origin, id, ok, cached_tokens, prompt_tokens, output_tokens, ttft_ns, duration_ns, predicted_cached]
//	removed      [4, origin, endpoint]

// Protocol versions. A replica refuses messages of another major version.
const (
	Major = 1
	Minor = 0
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
	b = msgp.AppendArrayHeader(b, headerLen)
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
	if _, err := io.ReadFull(r, pre[:]); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, buf, fmt.Errorf("%w: frame length cut", errTruncated)
		}
		return nil, buf, err // io.EOF: the stream ended between frames
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
	if _, err := io.ReadFull(r, buf); err != nil {
		return nil, buf, fmt.Errorf("%w: %d of %d bytes (%v)", errTruncated, len(buf), n, err)
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
	copy(h.nonce[:], nonce)
	return h, r.b, nil // fields after the payload, a newer minor version's, are left unread
}

// appendEvent appends ev (origin 0 stands for the sender).
func appendEvent(b []byte, ev *route.Event) ([]byte, error) {
	n := eventFields(uint64(ev.Kind))
	if n == 0 {
		return b, fmt.Errorf("event kind %d: nothing to send", ev.Kind)
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
		b = appendInts(b, int64(ev.BlockTokens), int64(ev.PromptTokens), int64(ev.MaxTokens))
		b = msgp.AppendBytesHeader(b, uint32(8*len(ev.Blocks)))
		for _, h := range ev.Blocks {
			b = binary.BigEndian.AppendUint64(b, h)
		}
	case route.EventFirstToken:
		b = msgp.AppendUint64(b, ev.ID)
		b = appendInt(b, int64(ev.TTFT))
	case route.EventDone:
		b = msgp.AppendUint64(b, ev.ID)
		b = msgp.AppendBool(b, ev.OK)
		b = appendInts(b, int64(ev.CachedTokens), int64(ev.PromptTokens), int64(ev.OutputTokens),
			int64(ev.TTFT), int64(ev.Duration), int64(ev.Predicted))
	case route.EventRemoved:
		b = msgp.AppendString(b, ev.Endpoint)
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
)

// eventFields is how many fields an event of kind has in this version (0: a kind it does not
// know).
func eventFields(kind uint64) int {
	switch route.EventKind(kind) {
	case route.EventRouted:
		return 11
	case route.EventFirstToken:
		return 4
	case route.EventDone:
		return 10
	case route.EventRemoved:
		return 3
	}
	return 0
}

// decoder decodes a stream's events. It keeps the strings that repeat from event to event
// (endpoint names, models, tenants), so that an event allocates only what it must: its
// blocks and its session key. Not safe for concurrent use.
type decoder struct {
	strs map[string]string
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
		ev.Blocks = r.blocks()
	case route.EventFirstToken:
		ev.ID, ev.TTFT = r.uint(), time.Duration(r.int())
	case route.EventDone:
		ev.ID, ev.OK = r.uint(), r.bool()
		ev.CachedTokens, ev.PromptTokens, ev.OutputTokens = r.count(), r.count(), r.count()
		ev.TTFT, ev.Duration = time.Duration(r.int()), time.Duration(r.int())
		ev.Predicted = r.count()
	case route.EventRemoved:
		ev.Endpoint = d.intern(r.str())
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

// blocks reads a bin of 8-byte big-endian block hashes into a new slice. The bin is read in
// place: nothing is allocated for a length beyond what the message holds.
func (r *reader) blocks() []uint64 {
	raw := r.bytes(msgp.ReadBytesZC)
	if r.err != nil {
		return nil
	}
	if len(raw)%8 != 0 || len(raw)/8 > maxBlocks {
		r.err = fmt.Errorf("blocks of %d bytes", len(raw))
		return nil
	}
	if len(raw) == 0 {
		return nil
	}
	out := make([]uint64, len(raw)/8)
	for i := range out {
		out[i] = binary.BigEndian.Uint64(raw[8*i:])
	}
	return out
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
