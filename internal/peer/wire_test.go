package peer

import (
	"bytes"
	"encoding/hex"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/tinylib/msgp/msgp"
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
	head = msgp.AppendArrayHeader(appendHeader(nil, &h), uint32(len(evs)))
	for i := range evs {
		var err error
		if payload, err = appendEvent(payload, &evs[i]); err != nil {
			t.Fatal(err)
		}
	}
	return head, payload
}

// decodeBatch decodes a batch message as a stream does (origin 0 left as it is).
func decodeBatch(msg []byte) (header, []route.Event, error) {
	h, payload, err := decodeHeader(msg)
	if err != nil {
		return h, nil, err
	}
	var d decoder
	evs, err := d.batch(payload, 0, nil)
	return h, evs, err
}

// TestWireGolden: a batch is encoded as it was before the encoder changed from
// vmihailenco/msgpack to tinylib/msgp (the bytes a replica of the previous release sent): the
// wire did not change, and older and newer replicas understand each other.
func TestWireGolden(t *testing.T) {
	const golden = "990100a16105c41001020300000000000000000000000000097b01969b010001b4687474703a2f2f31302e302e302e313a38303030" +
		"a16da174a173102809c41800000000000000018000000000000000000000000000002a9b014d02a165a0a0a0000000c40094020001ce017d78" +
		"409a030001c3202909ce017d7840ce3b9aca00309a030002c2ff0000000000930400a165"
	head, payload := message(t, header{from: "a", inc: 5, nonce: [16]byte{1, 2, 3}, seq: 9, sentAt: 123, kind: kindBatch}, sampleEvents())
	if got := hex.EncodeToString(append(head, payload...)); got != golden {
		t.Errorf("batch encoded as\n%s\nwant\n%s", got, golden)
	}
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
	b := bytes.NewBuffer(appendHeader(nil, &header{from: "a", seq: 1, kind: kindBatch}))
	enc := msgpack.NewEncoder(b)
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
	b := bytes.NewBuffer(appendHeader(nil, &header{from: "a", seq: 1, kind: kindBatch}))
	enc := msgpack.NewEncoder(b)
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
	hello := msgp.AppendUint64(msgp.AppendUint64(msgp.AppendArrayHeader(appendHeader(nil, &header{from: "b", kind: kindHello}), 2), 1), 2)
	f.Add(hello)
	f.Fuzz(func(t *testing.T, msg []byte) {
		h, payload, err := decodeHeader(msg)
		if err != nil {
			if reason(err) == "" {
				t.Fatalf("header error without a reason: %v", err)
			}
			return
		}
		switch h.kind {
		case kindHello:
			if ids, err := decodeIDs(payload); err == nil && len(ids) > len(msg) {
				t.Fatalf("%d ids from %d bytes", len(ids), len(msg))
			} else if err != nil && reason(err) == "" {
				t.Fatalf("hello error without a reason: %v", err)
			}
		default:
			var d decoder
			evs, err := d.batch(payload, 1, nil)
			if err != nil && reason(err) == "" {
				t.Fatalf("batch error without a reason: %v", err)
			}
			if len(evs) > len(msg) {
				t.Fatalf("%d events from %d bytes", len(evs), len(msg))
			}
			for _, ev := range evs {
				if len(ev.Blocks) > len(msg) {
					t.Fatalf("%d blocks from %d bytes", len(ev.Blocks), len(msg))
				}
				if ev.Origin == 0 {
					t.Fatalf("an event of origin 0: %+v", ev)
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
	var pend []byte
	var d decoder
	var out []route.Event
	b.ReportAllocs()
	for b.Loop() {
		pend = msgp.AppendArrayHeader(pend[:0], uint32(len(evs)))
		for i := range evs {
			var err error
			if pend, err = appendEvent(pend, &evs[i]); err != nil {
				b.Fatal(err)
			}
		}
		var err error
		if out, err = d.batch(pend, 1, out[:0]); err != nil || len(out) != len(evs) {
			b.Fatal(len(out), err)
		}
	}
	b.SetBytes(int64(len(pend)))
}
