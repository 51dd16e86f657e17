package peer

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"io"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/vmihailenco/msgpack/v5"

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

// appendHeader appends the message's header fields (the array's first 8 of 9 elements) to b.
func appendHeader(b *bytes.Buffer, h *header) error {
	enc := msgpack.GetEncoder()
	defer msgpack.PutEncoder(enc)
	enc.Reset(b)
	return errors.Join(enc.EncodeArrayLen(headerLen), enc.EncodeInt(Major), enc.EncodeInt(Minor),
		enc.EncodeString(h.from), enc.EncodeUint(h.inc), enc.EncodeBytes(h.nonce[:]), enc.EncodeUint(h.seq),
		enc.EncodeInt(h.sentAt), enc.EncodeInt(int64(h.kind)))
}

// writeFrame writes one frame of the message head+payload under key.
func writeFrame(w io.Writer, key, head, payload []byte) error {
	return writeFrameMAC(w, hmac.New(sha256.New, key), head, payload)
}

// writeFrameMAC is writeFrame with a MAC to reuse (a stream's: one per stream, not per frame).
func writeFrameMAC(w io.Writer, mac hash.Hash, head, payload []byte) error {
	mac.Reset()
	mac.Write(head)
	mac.Write(payload)
	var pre [4 + macSize]byte
	binary.BigEndian.PutUint32(pre[:4], uint32(macSize+len(head)+len(payload)))
	mac.Sum(pre[4:4])
	for _, b := range [][]byte{pre[:], head, payload} {
		if _, err := w.Write(b); err != nil {
			return err
		}
	}
	return nil
}

// readFrame reads one frame into buf (grown as needed, never beyond max bytes) and returns
// its message once its MAC is verified.
func readFrame(r io.Reader, key []byte, max int, buf []byte) (msg, grown []byte, err error) {
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
	mac := hmac.New(sha256.New, key)
	mac.Write(buf[macSize:])
	if !hmac.Equal(mac.Sum(nil), buf[:macSize]) {
		return nil, buf, fmt.Errorf("%w: MAC does not match", errForged)
	}
	return buf[macSize:], buf, nil
}

// decodeHeader reads a verified message's header; dec is left at the payload.
func decodeHeader(dec *msgpack.Decoder) (header, error) {
	var h header
	n, err := dec.DecodeArrayLen()
	if err != nil || n < headerLen {
		return h, fmt.Errorf("%w: message of %d fields (%v)", errMalformed, n, err)
	}
	major, err := dec.DecodeInt()
	if err != nil {
		return h, fmt.Errorf("%w: version: %v", errMalformed, err)
	}
	if major != Major {
		return h, fmt.Errorf("%w: major version %d, want %d", errVersion, major, Major)
	}
	_, err1 := dec.DecodeInt() // minor: anything newer only adds fields
	from, err2 := dec.DecodeString()
	inc, err3 := dec.DecodeUint64()
	nonce, err4 := dec.DecodeBytes()
	seq, err5 := dec.DecodeUint64()
	sent, err6 := dec.DecodeInt64()
	kind, err7 := dec.DecodeInt()
	if err := errors.Join(err1, err2, err3, err4, err5, err6, err7); err != nil {
		return h, fmt.Errorf("%w: header: %v", errMalformed, err)
	}
	if len(nonce) != nonceSize {
		return h, fmt.Errorf("%w: nonce of %d bytes", errMalformed, len(nonce))
	}
	h.from, h.inc, h.seq, h.sentAt, h.kind = from, inc, seq, sent, kind
	copy(h.nonce[:], nonce)
	return h, nil
}

// appendEvent encodes ev (origin 0 stands for the sender).
func appendEvent(enc *msgpack.Encoder, ev *route.Event) error {
	switch ev.Kind {
	case route.EventRouted:
		if err := errors.Join(enc.EncodeArrayLen(11), enc.EncodeUint(uint64(ev.Kind)), enc.EncodeUint(ev.Origin), enc.EncodeUint(ev.ID),
			enc.EncodeString(ev.Endpoint), enc.EncodeString(ev.Model), enc.EncodeString(ev.Tenant), enc.EncodeString(ev.SessionKey),
			enc.EncodeInt(int64(ev.BlockTokens)), enc.EncodeInt(int64(ev.PromptTokens)), enc.EncodeInt(int64(ev.MaxTokens)),
			enc.EncodeBytesLen(8*len(ev.Blocks))); err != nil {
			return err
		}
		// The encoder does not buffer: the bin's bytes go straight after its header.
		var b [8]byte
		w := enc.Writer()
		for _, h := range ev.Blocks {
			binary.BigEndian.PutUint64(b[:], h)
			if _, err := w.Write(b[:]); err != nil {
				return err
			}
		}
		return nil
	case route.EventFirstToken:
		return errors.Join(enc.EncodeArrayLen(4), enc.EncodeUint(uint64(ev.Kind)), enc.EncodeUint(ev.Origin), enc.EncodeUint(ev.ID),
			enc.EncodeInt(int64(ev.TTFT)))
	case route.EventDone:
		return errors.Join(enc.EncodeArrayLen(10), enc.EncodeUint(uint64(ev.Kind)), enc.EncodeUint(ev.Origin), enc.EncodeUint(ev.ID),
			enc.EncodeBool(ev.OK), enc.EncodeInt(int64(ev.CachedTokens)), enc.EncodeInt(int64(ev.PromptTokens)),
			enc.EncodeInt(int64(ev.OutputTokens)), enc.EncodeInt(int64(ev.TTFT)), enc.EncodeInt(int64(ev.Duration)),
			enc.EncodeInt(int64(ev.Predicted)))
	case route.EventRemoved:
		return errors.Join(enc.EncodeArrayLen(3), enc.EncodeUint(uint64(ev.Kind)), enc.EncodeUint(ev.Origin), enc.EncodeString(ev.Endpoint))
	}
	return fmt.Errorf("event kind %d: nothing to send", ev.Kind)
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

// decodeEvent decodes one event into ev and reports whether it was of a kind this version
// knows; an unknown kind is skipped whole. The blocks are a new slice: Apply keeps them. msg
// is the reader under dec (what is left of the message bounds the counts).
func decodeEvent(dec *msgpack.Decoder, msg *bytes.Reader, ev *route.Event) (known bool, err error) {
	n, err := dec.DecodeArrayLen()
	if err != nil || n < 2 {
		return false, fmt.Errorf("%w: event of %d fields (%v)", errMalformed, n, err)
	}
	kind, err1 := dec.DecodeUint64()
	orig, err2 := dec.DecodeUint64()
	if err := errors.Join(err1, err2); err != nil {
		return false, fmt.Errorf("%w: event: %v", errMalformed, err)
	}
	*ev = route.Event{Kind: route.EventKind(kind), Origin: orig}
	want := eventFields(kind)
	if want == 0 {
		return false, skip(dec, n-2)
	}
	if n < want {
		return false, fmt.Errorf("%w: %s event of %d fields, want %d", errMalformed, ev.Kind, n, want)
	}
	f := fields{dec: dec}
	switch ev.Kind {
	case route.EventRouted:
		ev.ID = f.uint()
		ev.Endpoint, ev.Model, ev.Tenant, ev.SessionKey = f.str(), f.str(), f.str(), f.str()
		ev.BlockTokens, ev.PromptTokens, ev.MaxTokens = f.count(), f.count(), f.count()
		if f.err == nil {
			ev.Blocks, f.err = decodeBlocks(dec, msg)
		}
	case route.EventFirstToken:
		ev.ID, ev.TTFT = f.uint(), f.dur()
	case route.EventDone:
		ev.ID, ev.OK = f.uint(), f.bool()
		ev.CachedTokens, ev.PromptTokens, ev.OutputTokens = f.count(), f.count(), f.count()
		ev.TTFT, ev.Duration = f.dur(), f.dur()
		ev.Predicted = f.count()
	case route.EventRemoved:
		ev.Endpoint = f.str()
	}
	if f.err != nil {
		return false, fmt.Errorf("%w: %s event: %v", errMalformed, ev.Kind, f.err)
	}
	return true, skip(dec, n-want)
}

// fields reads an event's fields in order, keeping the first error (later reads do nothing).
type fields struct {
	dec *msgpack.Decoder
	err error
}

func (f *fields) uint() uint64 {
	if f.err != nil {
		return 0
	}
	v, err := f.dec.DecodeUint64()
	f.err = err
	return v
}

func (f *fields) bool() bool {
	if f.err != nil {
		return false
	}
	v, err := f.dec.DecodeBool()
	f.err = err
	return v
}

func (f *fields) str() string {
	if f.err != nil {
		return ""
	}
	v, err := f.dec.DecodeString() // at most what is left of the message
	if err == nil && len(v) > maxStringLen {
		err = fmt.Errorf("string of %d bytes", len(v))
	}
	f.err = err
	return v
}

// count reads a token count: -1 (unknown) up to 2^40.
func (f *fields) count() int {
	if f.err != nil {
		return 0
	}
	v, err := f.dec.DecodeInt64()
	if err == nil && (v < -1 || v > 1<<40) {
		err = fmt.Errorf("count %d out of range", v)
	}
	f.err = err
	return int(v)
}

func (f *fields) dur() time.Duration {
	if f.err != nil {
		return 0
	}
	v, err := f.dec.DecodeInt64()
	f.err = err
	return time.Duration(v)
}

// decodeBlocks reads a bin of 8-byte big-endian block hashes. The decoder reads msg itself,
// unbuffered (a bytes.Reader is an io.ByteScanner): the bin's bytes are the next ones.
func decodeBlocks(dec *msgpack.Decoder, msg *bytes.Reader) ([]uint64, error) {
	nb, err := dec.DecodeBytesLen()
	// A length beyond what is left of the message is a lie: nothing is allocated for it.
	if err != nil || nb < 0 || nb%8 != 0 || nb/8 > maxBlocks || nb > msg.Len() {
		return nil, fmt.Errorf("blocks of %d bytes (%v)", nb, err)
	}
	if nb == 0 {
		return nil, nil
	}
	out := make([]uint64, nb/8)
	var b [512]byte
	for i := 0; i < len(out); {
		k := min(len(out)-i, len(b)/8)
		if _, err := io.ReadFull(msg, b[:8*k]); err != nil {
			return nil, fmt.Errorf("blocks: %v", err)
		}
		for j := range k {
			out[i+j] = binary.BigEndian.Uint64(b[8*j:])
		}
		i += k
	}
	return out, nil
}

// skip skips n values (fields of a newer minor version).
func skip(dec *msgpack.Decoder, n int) error {
	for range n {
		if err := dec.Skip(); err != nil {
			return fmt.Errorf("%w: %v", errMalformed, err)
		}
	}
	return nil
}
