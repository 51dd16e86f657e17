package peer

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvroute/kvroute/internal/route"
)

var testKey = bytes.Repeat([]byte{7}, 32)

func sampleEvents() []route.Event {
	return []route.Event{
		{Kind: route.EventRouted, ID: 1, Endpoint: "http://10.0.0.1:8000", Model: "m", Tenant: "t", SessionKey: "s",
			Blocks: []uint64{1, 1 << 63, 42}, BlockTokens: 16, PromptTokens: 40, MaxTokens: 9},
		{Kind: route.EventRouted, Origin: 77, ID: 2, Endpoint: "e"},
		{Kind: route.EventFirstToken, ID: 1, TTFT: 25 * time.Millisecond},
		{Kind: route.EventDone, ID: 1, OK: true, CachedTokens: 32, PromptTokens: 41, OutputTokens: 9, TTFT: 25 * time.Millisecond, Duration: time.Second, Predicted: 48},
		{Kind: route.EventDone, ID: 2, CachedTokens: -1},
		{Kind: route.EventRemoved, Endpoint: "e"},
	}
}

// message encodes a whole message of kind batch holding evs, as a stream sends it.
func message(t testing.TB, h header, evs []route.Event) (head, payload []byte) {
	t.Helper()
	var hb, pb bytes.Buffer
	if err := appendHeader(&hb, &h); err != nil {
		t.Fatal(err)
	}
	enc := msgpack.NewEncoder(&hb)
	if err := enc.EncodeArrayLen(len(evs)); err != nil {
		t.Fatal(err)
	}
	enc = msgpack.NewEncoder(&pb)
	for i := range evs {
		if err := appendEvent(enc, &evs[i]); err != nil {
			t.Fatal(err)
		}
	}
	return hb.Bytes(), pb.Bytes()
}

func decodeBatch(msg []byte) (header, []route.Event, error) {
	r := bytes.NewReader(msg)
	dec := msgpack.NewDecoder(r)
	h, err := decodeHeader(dec)
	if err != nil {
		return h, nil, err
	}
	n, err := dec.DecodeArrayLen()
	if err != nil {
		return h, nil, err
	}
	var out []route.Event
	for range n {
		var ev route.Event
		known, err := decodeEvent(dec, r, &ev)
		if err != nil {
			return h, out, err
		}
		if known {
			out = append(out, ev)
		}
	}
	return h, out, nil
}

func TestWireRoundTrip(t *testing.T) {
	h := header{from: "a", inc: 5, nonce: [16]byte{1, 2, 3}, seq: 9, sentAt: 123, kind: kindBatch}
	evs := sampleEvents()
	head, payload := message(t, h, evs)
	var frame bytes.Buffer
	if err := writeFrame(&frame, testKey, head, payload); err != nil {
		t.Fatal(err)
	}
	msg, _, err := readFrame(&frame, testKey, 1<<20, nil)
	if err != nil {
		t.Fatal(err)
	}
	gh, got, err := decodeBatch(msg)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(h, gh, cmp.AllowUnexported(header{})); diff != "" {
		t.Errorf("header (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(evs, got); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
}

// TestWireRefuses: a forged, cut, oversized or foreign-version frame is refused with its
// reason; nothing of it is decoded.
func TestWireRefuses(t *testing.T) {
	h := header{from: "a", inc: 5, seq: 1, kind: kindBatch}
	head, payload := message(t, h, sampleEvents())
	var good bytes.Buffer
	if err := writeFrame(&good, testKey, head, payload); err != nil {
		t.Fatal(err)
	}
	frame := good.Bytes()
	flip := func(i int) []byte { b := bytes.Clone(frame); b[i] ^= 1; return b }
	h2 := h
	var v2 bytes.Buffer
	// Another major version, correctly signed: refused after the MAC, by its version.
	h2Head, _ := message(t, h2, nil)
	h2Head[1] = 0x02
	if err := writeFrame(&v2, testKey, h2Head, nil); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		data   []byte
		key    []byte
		max    int
		reason string
	}{
		{"a byte of the message changed", flip(len(frame) - 1), testKey, 1 << 20, "forged"},
		{"a byte of the MAC changed", flip(5), testKey, 1 << 20, "forged"},
		{"another secret", frame, bytes.Repeat([]byte{8}, 32), 1 << 20, "forged"},
		{"cut in the body", frame[:len(frame)-3], testKey, 1 << 20, "truncated"},
		{"cut in the length", frame[:2], testKey, 1 << 20, "truncated"},
		{"over the limit", frame, testKey, 64, "oversized"},
		{"shorter than a MAC", []byte{0, 0, 0, 3, 1, 2, 3}, testKey, 1 << 20, "malformed"},
		{"major version 2", v2.Bytes(), testKey, 1 << 20, "version"},
	} {
		msg, _, err := readFrame(bytes.NewReader(c.data), c.key, c.max, nil)
		if err == nil {
			_, _, err = decodeBatch(msg)
		}
		if got := reason(err); got != c.reason {
			t.Errorf("%s: reason %q (%v), want %q", c.name, got, err, c.reason)
		}
	}
}

// TestWireNewerMinor: fields a newer minor version appends, and event kinds it adds, are
// skipped.
func TestWireNewerMinor(t *testing.T) {
	var b bytes.Buffer
	h := header{from: "a", seq: 1, kind: kindBatch}
	if err := appendHeader(&b, &h); err != nil {
		t.Fatal(err)
	}
	enc := msgpack.NewEncoder(&b)
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	must(enc.EncodeArrayLen(2))
	// A first-token event with two more fields, then an event of kind 9.
	must(errors.Join(enc.EncodeArrayLen(6), enc.EncodeUint(2), enc.EncodeUint(0), enc.EncodeUint(3), enc.EncodeInt(1000), enc.EncodeString("new"), enc.EncodeBool(true)))
	must(errors.Join(enc.EncodeArrayLen(3), enc.EncodeUint(9), enc.EncodeUint(0), enc.EncodeString("?")))
	_, got, err := decodeBatch(b.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	want := []route.Event{{Kind: route.EventFirstToken, ID: 3, TTFT: 1000}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

// TestWireLies: counts that claim more than the message holds are refused before anything
// is allocated for them.
func TestWireLies(t *testing.T) {
	var b bytes.Buffer
	h := header{from: "a", seq: 1, kind: kindBatch}
	if err := appendHeader(&b, &h); err != nil {
		t.Fatal(err)
	}
	enc := msgpack.NewEncoder(&b)
	_ = errors.Join(enc.EncodeArrayLen(1), enc.EncodeArrayLen(11), enc.EncodeUint(1), enc.EncodeUint(0), enc.EncodeUint(1),
		enc.EncodeString("e"), enc.EncodeString(""), enc.EncodeString(""), enc.EncodeString(""),
		enc.EncodeInt(16), enc.EncodeInt(10), enc.EncodeInt(0), enc.EncodeBytesLen(8_000_000))
	if _, _, err := decodeBatch(b.Bytes()); reason(err) != "malformed" {
		t.Errorf("a million blocks in a few bytes: %v", err)
	}
}

// FuzzDecode: whatever a peer's message holds (past its MAC: a peer with the secret), decoding
// it returns events or an error, never panics, and allocates in proportion to its size.
func FuzzDecode(f *testing.F) {
	head, payload := message(f, header{from: "a", seq: 1, kind: kindBatch}, sampleEvents())
	f.Add(append(head, payload...))
	f.Add(head)
	var hello bytes.Buffer
	_ = appendHeader(&hello, &header{from: "b", kind: kindHello})
	enc := msgpack.NewEncoder(&hello)
	_ = errors.Join(enc.EncodeArrayLen(2), enc.EncodeUint(1), enc.EncodeUint(2))
	f.Add(hello.Bytes())
	f.Fuzz(func(t *testing.T, msg []byte) {
		r := bytes.NewReader(msg)
		dec := msgpack.NewDecoder(r)
		h, err := decodeHeader(dec)
		if err != nil {
			if reason(err) == "" {
				t.Fatalf("header error without a reason: %v", err)
			}
			return
		}
		switch h.kind {
		case kindHello:
			if ids, err := decodeIDs(dec, r); err == nil && len(ids) > len(msg) {
				t.Fatalf("%d ids from %d bytes", len(ids), len(msg))
			}
		default:
			n, err := dec.DecodeArrayLen()
			if err != nil || n > r.Len() {
				return
			}
			for range n {
				var ev route.Event
				if _, err := decodeEvent(dec, r, &ev); err != nil {
					if reason(err) == "" {
						t.Fatalf("event error without a reason: %v", err)
					}
					return
				}
				if len(ev.Blocks) > len(msg) {
					t.Fatalf("%d blocks from %d bytes", len(ev.Blocks), len(msg))
				}
			}
		}
	})
}

// FuzzReadFrame: any byte stream, read as frames under a key, is refused with a reason or
// yields verified messages; never a panic, never a read past the limit.
func FuzzReadFrame(f *testing.F) {
	head, payload := message(f, header{from: "a", seq: 1, kind: kindBatch}, sampleEvents())
	var frame bytes.Buffer
	_ = writeFrame(&frame, testKey, head, payload)
	f.Add(frame.Bytes())
	f.Add([]byte{0, 0, 0, 40})
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bytes.NewReader(data)
		var buf []byte
		for range 100 {
			msg, grown, err := readFrame(r, testKey, 4096, buf)
			buf = grown
			if cap(buf) > 4096 {
				t.Fatalf("buffer grew to %d past the limit", cap(buf))
			}
			if err != nil {
				return
			}
			if _, _, err := decodeBatch(msg); err != nil && reason(err) == "" {
				t.Fatalf("decode error without a reason: %v", err)
			}
		}
	})
}

// BenchmarkEncodeDecode encodes one request's three events (a 64-block prompt) as a batch and
// decodes them again: the wire's CPU per request, either side.
func BenchmarkEncodeDecode(b *testing.B) {
	evs := []route.Event{
		{Kind: route.EventRouted, ID: 1, Endpoint: "http://10.0.0.1:8000", Model: "meta-llama/Llama-3.1-70B-Instruct", Blocks: make([]uint64, 64), BlockTokens: 16, PromptTokens: 1030, MaxTokens: 8},
		{Kind: route.EventFirstToken, ID: 1, TTFT: 20 * time.Millisecond},
		{Kind: route.EventDone, ID: 1, OK: true, CachedTokens: 1008, PromptTokens: 1030, OutputTokens: 8, TTFT: 20 * time.Millisecond, Duration: time.Second},
	}
	for i := range evs[0].Blocks {
		evs[0].Blocks[i] = uint64(i) * 0x9e3779b97f4a7c15
	}
	var pend bytes.Buffer
	enc := msgpack.NewEncoder(&pend)
	b.ReportAllocs()
	for b.Loop() {
		pend.Reset()
		for i := range evs {
			if err := appendEvent(enc, &evs[i]); err != nil {
				b.Fatal(err)
			}
		}
		r := bytes.NewReader(pend.Bytes())
		dec := msgpack.NewDecoder(r)
		var ev route.Event
		for range evs {
			if _, err := decodeEvent(dec, r, &ev); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.SetBytes(int64(pend.Len()))
}
