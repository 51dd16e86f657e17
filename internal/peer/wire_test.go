package peer

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strings"
	"syscall"
	"testing"
	"testing/iotest"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/tinylib/msgp/msgp"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvroute/kvroute/internal/route"
)

var testKey = bytes.Repeat([]byte{7}, 32)

func sampleEvents() []route.Event {
	return []route.Event{
		{Kind: route.EventRouted, ID: 1, Endpoint: "http://10.0.0.1:8000", Model: "m", Tenant: "t", SessionKey: "s",
			Blocks: []uint64{1, 1 << 63, 42}, BlockTokens: 16, PromptTokens: 40, MaxTokens: 9},
		{Kind: route.EventRouted, Origin: 77, ID: 2, Endpoint: "e", Whole: true},
		{Kind: route.EventFirstToken, ID: 1, TTFT: 25 * time.Millisecond},
		{Kind: route.EventDone, ID: 1, OK: true, CachedTokens: 32, PromptTokens: 41, OutputTokens: 9, TTFT: 25 * time.Millisecond, Duration: time.Second, Predicted: 48},
		{Kind: route.EventDone, ID: 2, CachedTokens: -1},
		{Kind: route.EventDone, ID: 3, CachedTokens: -1, Failure: route.FailStatus},
		{Kind: route.EventRemoved, Endpoint: "e"},
		{Kind: route.EventStalled, Endpoint: "e", Silent: 12 * time.Second},
		{Kind: route.EventBackoff, Endpoint: "e", Rest: 2 * time.Second},
		{Kind: route.EventEjected, Endpoint: "e", Rest: time.Minute},
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

// TestWireGolden: a batch is encoded as version 2.4 has it (the bytes of version 1, which
// tinylib/msgp kept from vmihailenco/msgpack, with the routed events' back and shared, whole,
// the stalled event, a failed done's failure, the backoff and ejected events; 2.4 changed
// hellos, not batches): a change of the wire is one made on purpose, with its version.
func TestWireGolden(t *testing.T) {
	const golden = "990204a16105c41001020300000000000000000000000000097b019a9e010001b4687474703a2f2f31302e302e302e313a38303030" +
		"a16da174a1731028090000c41800000000000000018000000000000000000000000000002ac29e014d02a165a0a0a00000000000c400c394" +
		"020001ce017d78409a030001c3202909ce017d7840ce3b9aca00309a030002c2ff00000000009b030003c2ff000000000006930400a165" +
		"940500a165cf00000002cb417800940600a165ce77359400940700a165cf0000000df8475800"
	head, payload := message(t, header{from: "a", inc: 5, nonce: [16]byte{1, 2, 3}, seq: 9, sentAt: 123, kind: kindBatch}, sampleEvents())
	if got := hex.EncodeToString(append(head, payload...)); got != golden {
		t.Errorf("batch encoded as\n%s\nwant\n%s", got, golden)
	}
}

// TestWireHello: a hello of version 2.4 carries, after its attempts in flight, where the
// stream starts in the feed; a replica of 2.3, which reads the IDs and nothing after them,
// reads the same IDs; a hello of 2.3 says nothing of the feed (a stream that starts afresh).
func TestWireHello(t *testing.T) {
	const golden = "9b0204a16205c41001000000000000000000000000000000010102920709cd0400cd0402"
	h := header{from: "b", inc: 5, nonce: [16]byte{1}, seq: 1, sentAt: 1, kind: kindHello, trailing: helloTrailing}
	msg := appendHello(appendHeader(nil, &h), []uint64{7, 9}, feedStart{next: 1024, live: 1026})
	if got := hex.EncodeToString(msg); got != golden {
		t.Errorf("hello encoded as\n%s\nwant\n%s", got, golden)
	}
	gh, payload, err := decodeHeader(msg)
	if err != nil {
		t.Fatal(err)
	}
	ids, next, live, err := decodeHello(payload, gh.trailing)
	if err != nil || next != 1024 || live != 1026 || !cmp.Equal(ids, map[uint64]bool{7: true, 9: true}) {
		t.Errorf("decoded: %v, from %d, live from %d (%v)", ids, next, live, err)
	}
	// 2.3's reading: the IDs of the payload, whatever follows them.
	if ids, _, _, err := decodeHello(payload, 0); err != nil || len(ids) != 2 {
		t.Errorf("read as 2.3 reads it: %v (%v)", ids, err)
	}
	// 2.3's hello: nine fields, the IDs and nothing after.
	v23 := msgp.AppendUint64(msgp.AppendArrayHeader(appendHeader(nil, &header{from: "b", inc: 5, seq: 1, kind: kindHello}), 1), 7)
	v23[2] = 3 // the minor
	gh, payload, err = decodeHeader(v23)
	if err != nil {
		t.Fatal(err)
	}
	if ids, next, live, err := decodeHello(payload, gh.trailing); err != nil || len(ids) != 1 || next != 0 || live != 0 {
		t.Errorf("2.3 hello: %v, from %d, live from %d (%v); want no feed numbers", ids, next, live, err)
	}
	// A stream from batch 0, or live before its first: malformed.
	for _, st := range []feedStart{{next: 0, live: 0}, {next: 5, live: 4}} {
		bad := appendHello(appendHeader(nil, &h), nil, st)
		gh, payload, _ := decodeHeader(bad)
		if _, _, _, err := decodeHello(payload, gh.trailing); reason(err) != "malformed" {
			t.Errorf("hello from %d, live from %d: %v, want malformed", st.next, st.live, err)
		}
	}
}

// TestWireMinor0: a batch from a sender of version 2.0, whose routed events have no whole,
// decodes with whole false.
func TestWireMinor0(t *testing.T) {
	const v20 = "990200a16105c41001020300000000000000000000000000097b01969d010001b4687474703a2f2f31302e302e302e313a38303030" +
		"a16da174a1731028090000c41800000000000000018000000000000000000000000000002a9d014d02a165a0a0a00000000000c4009402" +
		"0001ce017d78409a030001c3202909ce017d7840ce3b9aca00309a030002c2ff0000000000930400a165"
	msg, err := hex.DecodeString(v20)
	if err != nil {
		t.Fatal(err)
	}
	_, evs, err := decodeBatch(msg)
	if err != nil {
		t.Fatal(err)
	}
	all := sampleEvents()
	want := append(all[:5:5], all[6]) // no failed done (its failure), backoff or ejected before 2.3, no stalled event before 2.2
	want[1].Whole = false
	if diff := cmp.Diff(want, evs); diff != "" {
		t.Errorf("2.0 batch decoded (-want +got):\n%s", diff)
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
	h2Head[1] = Major + 1
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
		{"another major version", v2.Bytes(), testKey, 1 << 20, "version"},
	} {
		msg, _, err := readFrame(bytes.NewReader(c.data), c.key, c.max, nil)
		if err == nil {
			_, _, err = decodeBatch(msg)
		}
		if got := reason(err); got != c.reason {
			t.Errorf("%s: reason %q (%v), want %q", c.name, got, err, c.reason)
		}
	}
	// A body cut between frames (a peer killed: HTTP/1's chunked reader says
	// io.ErrUnexpectedEOF with nothing read) is the stream's end, not a truncated frame.
	if _, _, err := readFrame(iotest.ErrReader(io.ErrUnexpectedEOF), testKey, 1<<20, nil); err != io.EOF || reason(err) != "" {
		t.Errorf("cut between frames: %v (reason %q), want io.EOF and no reason", err, reason(err))
	}
	// A read that fails within a frame for a reason of this side or of the connection (the
	// follower cancelled the stream: its peer declared gone, its watchdog, the node stopping;
	// a reset) ends the stream; nothing says the message was cut.
	for _, c := range []struct {
		name string
		at   int // bytes of the frame read before the failure
		err  error
		want string // in the error
	}{
		{"cancelled in the body", len(frame) - 3, context.Canceled, fmt.Sprintf("after %d of %d bytes", len(frame)-7, len(frame)-4)},
		{"cancelled in the length", 2, context.Canceled, "after 2 of 4 bytes"},
		{"reset in the body", 10, syscall.ECONNRESET, fmt.Sprintf("after 6 of %d bytes", len(frame)-4)},
	} {
		r := io.MultiReader(bytes.NewReader(frame[:c.at]), iotest.ErrReader(c.err))
		_, _, err := readFrame(r, testKey, 1<<20, nil)
		if !errors.Is(err, c.err) || reason(err) != "" || !strings.Contains(fmt.Sprint(err), c.want) {
			t.Errorf("%s: %v (reason %q), want %v, no reason, %q", c.name, err, reason(err), c.err, c.want)
		}
	}
	// A frame cut by the end of the stream's body says how much of it came.
	if _, _, err := readFrame(bytes.NewReader(frame[:10]), testKey, 1<<20, nil); reason(err) != "truncated" ||
		!strings.Contains(fmt.Sprint(err), fmt.Sprintf("6 of %d bytes", len(frame)-4)) {
		t.Errorf("cut in the body: %v, want truncated after 6 of %d bytes", err, len(frame)-4)
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
	_ = errors.Join(enc.EncodeArrayLen(1), enc.EncodeArrayLen(13), enc.EncodeUint(1), enc.EncodeUint(0), enc.EncodeUint(1),
		enc.EncodeString("e"), enc.EncodeString(""), enc.EncodeString(""), enc.EncodeString(""),
		enc.EncodeInt(16), enc.EncodeInt(10), enc.EncodeInt(0), enc.EncodeInt(0), enc.EncodeInt(0), enc.EncodeBytesLen(8_000_000))
	if _, _, err := decodeBatch(b.Bytes()); reason(err) != "malformed" {
		t.Errorf("a million blocks in a few bytes: %v", err)
	}
}

// refMessage encodes a batch message of routed events whose blocks are those of the event
// refs[i][0] back (0: none), refs[i][1] of them, then three of its own.
func refMessage(t testing.TB, refs [][2]int) (head, payload []byte) {
	t.Helper()
	head = msgp.AppendArrayHeader(appendHeader(nil, &header{from: "a", seq: 1, kind: kindBatch}), uint32(len(refs)))
	for i, r := range refs {
		ev := route.Event{Kind: route.EventRouted, ID: uint64(i + 1), Endpoint: "e", BlockTokens: 16,
			Blocks: make([]uint64, r[1]+3)}
		var err error
		if payload, err = appendEventRef(payload, &ev, r[0], r[1]); err != nil {
			t.Fatal(err)
		}
	}
	return head, payload
}

// streamEvents is a stream's routed events: requests that share a system prompt of 60
// blocks, two of them a conversation's turns, one that shares nothing.
func streamEvents() []route.Event {
	system := make([]uint64, 60)
	for i := range system {
		system[i] = uint64(i+1) * 0x9e3779b97f4a7c15
	}
	ext := func(b []uint64, more ...uint64) []uint64 { return append(append([]uint64(nil), b...), more...) }
	turn1 := ext(system, 1001, 1002)
	evs := []route.Event{
		{Blocks: ext(system, 7)},
		{Blocks: turn1},
		{Blocks: ext(system, 8, 9)},
		{Blocks: []uint64{5, 6}},
		{Blocks: ext(turn1, 1003, 1004, 1005)},
		{Blocks: nil},
		{Blocks: ext(system[:30])},
		{Blocks: ext(system, 7)},
	}
	for i := range evs {
		evs[i].Kind, evs[i].ID, evs[i].Endpoint, evs[i].Model, evs[i].BlockTokens = route.EventRouted, uint64(i+1), "http://10.0.0.1:8000", "m", 16
	}
	return evs
}

// TestWireReferences: a stream's routed events, encoded with references to the earlier
// events' blocks (in batches of three, with other events between), decode to the events
// sent, on the receiver's side of the same stream; the references make them small.
func TestWireReferences(t *testing.T) {
	want := streamEvents()
	var ring blockRing
	var d decoder
	var got []route.Event
	whole, sent := 0, 0
	for i := 0; i < len(want); i += 3 {
		part := want[i:min(i+3, len(want))]
		var payload []byte
		for j := range part {
			var err error
			if payload, err = ring.appendEvent(payload, &part[j]); err != nil {
				t.Fatal(err)
			}
			ft := route.Event{Kind: route.EventFirstToken, ID: part[j].ID}
			payload, _ = ring.appendEvent(payload, &ft)
			w, _ := appendEvent(nil, &part[j])
			whole += len(w)
		}
		sent += len(payload)
		evs, err := d.batch(append(msgp.AppendArrayHeader(nil, uint32(2*len(part))), payload...), 1, nil)
		if err != nil {
			t.Fatalf("batch %d: %v", i/3, err)
		}
		for _, ev := range evs {
			if ev.Kind == route.EventRouted {
				got = append(got, ev)
			}
		}
	}
	for i := range want {
		want[i].Origin = 1
	}
	if diff := cmp.Diff(want, got, cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	// Whole, the routed events take some 550 bytes each; by reference, all but the first
	// and the one that shares nothing take under 60.
	if sent > whole/3 {
		t.Errorf("%d bytes sent for %d whole", sent, whole)
	}
}

// TestBlockRingLongest: the list that starts with the most of the blocks, and how many.
func TestBlockRingLongest(t *testing.T) {
	var r blockRing
	for _, l := range [][]uint64{{1, 2, 3, 4}, {1, 2, 9}, {5}, {1, 2, 3}, nil} {
		r.pushCopy(l)
	}
	for _, c := range []struct {
		blocks       []uint64
		back, shared int
	}{
		{[]uint64{1, 2, 3, 4, 5}, 5, 4}, // the oldest
		{[]uint64{1, 2, 3, 7}, 2, 3},    // the newer of two as good
		{[]uint64{1, 2, 9, 9}, 4, 3},
		{[]uint64{1, 8}, 2, 1},
		{[]uint64{5, 1}, 3, 1},
		{[]uint64{6}, 0, 0},
		{nil, 0, 0},
	} {
		back, shared := r.longest(c.blocks)
		if back != c.back || shared != c.shared {
			t.Errorf("longest(%v) = %d, %d; want %d, %d", c.blocks, back, shared, c.back, c.shared)
		}
	}
	// Past ringSize lists the oldest are forgotten: here the first.
	for range ringSize - 4 {
		r.pushCopy([]uint64{7})
	}
	if back, shared := r.longest([]uint64{1, 2, 3, 4}); back != ringSize-2 || shared != 3 {
		t.Errorf("after %d more lists, longest = %d, %d; want %d, 3", ringSize-4, back, shared, ringSize-2)
	}
	if back, shared := r.longest([]uint64{1, 2, 9}); back != ringSize || shared != 3 {
		t.Errorf("the oldest kept: longest = %d, %d; want %d, 3", back, shared, ringSize)
	}
	r.reset()
	if back, shared := r.longest([]uint64{7}); back != 0 || shared != 0 {
		t.Errorf("after reset, longest = %d, %d; want none", back, shared)
	}
}

// TestWireBadReferences: a reference the receiver cannot resolve is malformed: to an event it
// does not have, or to more blocks than that event has.
func TestWireBadReferences(t *testing.T) {
	for _, c := range []struct {
		name string
		refs [][2]int
	}{
		{"before the stream", [][2]int{{1, 1}}},
		{"past the events", [][2]int{{0, 0}, {0, 0}, {3, 1}}},
		{"past the ring", [][2]int{{ringSize + 1, 0}}},
		{"negative", [][2]int{{0, 0}, {-1, 1}}},
		{"past a list's end", [][2]int{{0, 0}, {1, 4}}},
		{"no event, some blocks", [][2]int{{0, 0}, {0, 2}}},
	} {
		head, payload := refMessage(t, c.refs)
		// refMessage asks for the shared blocks it refers to in the event's own.
		if _, _, err := decodeBatch(append(head, payload...)); reason(err) != "malformed" {
			t.Errorf("%s: %v, want malformed", c.name, err)
		}
	}
	// And what resolves, does.
	head, payload := refMessage(t, [][2]int{{0, 0}, {1, 3}, {2, 2}, {2, 6}})
	_, evs, err := decodeBatch(append(head, payload...))
	if err != nil || len(evs) != 4 || len(evs[3].Blocks) != 9 {
		t.Errorf("valid references: %d events, %v", len(evs), err)
	}
}

// TestWireBatchBlocks: references cannot make a few bytes decode to more blocks than a
// message could hold whole.
func TestWireBatchBlocks(t *testing.T) {
	const n = maxRingBlocks
	refs := [][2]int{{0, 0}}
	for range maxBatchBlocks / n {
		refs = append(refs, [2]int{1, n})
	}
	ev := route.Event{Kind: route.EventRouted, Endpoint: "e", Blocks: make([]uint64, n)}
	payload, _ := appendEvent(nil, &ev)
	for range len(refs) - 1 {
		payload, _ = appendEventRef(payload, &ev, 1, n)
	}
	head := msgp.AppendArrayHeader(appendHeader(nil, &header{from: "a", seq: 1, kind: kindBatch}), uint32(len(refs)))
	if _, _, err := decodeBatch(append(head, payload...)); reason(err) != "malformed" {
		t.Errorf("%d blocks in %d bytes: %v, want malformed", len(refs)*n, len(payload), err)
	}
	// One event less is just the bound.
	payload, _ = appendEvent(payload[:0], &ev)
	for range len(refs) - 2 {
		payload, _ = appendEventRef(payload, &ev, 1, n)
	}
	head = msgp.AppendArrayHeader(appendHeader(nil, &header{from: "a", seq: 1, kind: kindBatch}), uint32(len(refs)-1))
	if _, evs, err := decodeBatch(append(head, payload...)); err != nil || len(evs)*n != maxBatchBlocks {
		t.Errorf("%d events of %d blocks: %d decoded, %v", len(refs)-1, n, len(evs), err)
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
	f.Add(appendHello(appendHeader(nil, &header{from: "b", kind: kindHello, trailing: helloTrailing}), []uint64{1, 2}, feedStart{next: 3, live: 5}))
	// References: the batch's own events (which resolve in a new stream), one to an event
	// before the stream's start (which does not, the first time), and one past a list's end.
	head, payload = refMessage(f, [][2]int{{0, 0}, {1, 2}, {2, 1}})
	f.Add(append(head, payload...))
	head, payload = refMessage(f, [][2]int{{1, 1}, {0, 0}})
	f.Add(append(head, payload...))
	head, payload = refMessage(f, [][2]int{{0, 0}, {1, 4}})
	f.Add(append(head, payload...))
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
			if ids, _, _, err := decodeHello(payload, h.trailing); err == nil && len(ids) > len(msg) {
				t.Fatalf("%d ids from %d bytes", len(ids), len(msg))
			} else if err != nil && reason(err) == "" {
				t.Fatalf("hello error without a reason: %v", err)
			}
		default:
			// Twice on one stream: the second time, references may resolve to the first's
			// events.
			var d decoder
			for range 2 {
				evs, err := d.batch(payload, 1, nil)
				if err != nil && reason(err) == "" {
					t.Fatalf("batch error without a reason: %v", err)
				}
				if len(evs) > len(msg) {
					t.Fatalf("%d events from %d bytes", len(evs), len(msg))
				}
				blocks := 0
				for _, ev := range evs {
					blocks += len(ev.Blocks)
					if ev.Origin == 0 {
						t.Fatalf("an event of origin 0: %+v", ev)
					}
				}
				if blocks > maxBatchBlocks {
					t.Fatalf("%d blocks from one message", blocks)
				}
				if err != nil {
					break
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

// BenchmarkEncodeDecode encodes one request's three events (a 64-block prompt, of which the
// first 60 are a system prompt every request shares and the last 4 its own) as a batch and
// decodes them again: the wire's CPU per request, either side. whole: the blocks written
// whole (as major version 1 did); refs: the stream's references to the last requests.
func BenchmarkEncodeDecode(b *testing.B) {
	for _, refs := range []bool{false, true} {
		b.Run(map[bool]string{false: "whole", true: "refs"}[refs], func(b *testing.B) {
			evs := []route.Event{
				{Kind: route.EventRouted, ID: 1, Endpoint: "http://10.0.0.1:8000", Model: "meta-llama/Llama-3.1-70B-Instruct", Blocks: make([]uint64, 64), BlockTokens: 16, PromptTokens: 1030, MaxTokens: 8},
				{Kind: route.EventFirstToken, ID: 1, TTFT: 20 * time.Millisecond},
				{Kind: route.EventDone, ID: 1, OK: true, CachedTokens: 1008, PromptTokens: 1030, OutputTokens: 8, TTFT: 20 * time.Millisecond, Duration: time.Second},
			}
			for i := range evs[0].Blocks {
				evs[0].Blocks[i] = uint64(i+1) * 0x9e3779b97f4a7c15
			}
			var pend []byte
			var ring blockRing
			var d decoder
			var out []route.Event
			n := uint64(0)
			b.ReportAllocs()
			for b.Loop() {
				n++
				for i := 60; i < 64; i++ {
					evs[0].Blocks[i] = n*64 + uint64(i)
				}
				pend = msgp.AppendArrayHeader(pend[:0], uint32(len(evs)))
				for i := range evs {
					var err error
					if refs {
						pend, err = ring.appendEvent(pend, &evs[i])
					} else {
						pend, err = appendEvent(pend, &evs[i])
					}
					if err != nil {
						b.Fatal(err)
					}
				}
				var err error
				if out, err = d.batch(pend, 1, out[:0]); err != nil || len(out) != len(evs) {
					b.Fatal(len(out), err)
				}
			}
			b.SetBytes(int64(len(pend)))
		})
	}
}
