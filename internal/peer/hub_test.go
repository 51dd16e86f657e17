package peer

import (
	"bytes"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/tinylib/msgp/msgp"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/metrics"
	"github.com/kvroute/kvroute/internal/policy"
	"github.com/kvroute/kvroute/internal/prefix"
	"github.com/kvroute/kvroute/internal/route"
)

// BenchmarkPublish runs a request's lifecycle (pick, routed, first token, done on
// least-request, a 64-block prompt) on a replica alone and on one that publishes its events to
// a subscribed peer's queue (drained by another goroutine, as a stream's writer does), a batch
// every 5 requests (a 10 ms batch at 500 requests/s): the difference is what publishing costs
// the request path, the Share's bookkeeping included.
func BenchmarkPublish(b *testing.B) {
	blocks := prefix.Chain(nil, prefix.Seed("m", ""), make([]uint64, 64))
	for _, shared := range []bool{false, true} {
		name := map[bool]string{false: "alone", true: "shared"}[shared]
		b.Run(name, func(b *testing.B) {
			pool := endpoint.NewPool()
			if _, err := pool.Update([]endpoint.Spec{{Name: "e0"}, {Name: "e1"}}); err != nil {
				b.Fatal(err)
			}
			p, err := policy.New("least-request", nil, policy.Env{Rand: rand.New(rand.NewPCG(1, 2))})
			if err != nil {
				b.Fatal(err)
			}
			cfg := route.Config{Picker: p}
			flush := func() {}
			if shared {
				h := newHub(DefaultMaxMessageBytes/4, DefaultQueue, time.Hour, metrics.NewPeers(prometheus.NewRegistry()))
				s, _ := h.subscribe(0, false)
				stop := make(chan struct{})
				drained := make(chan struct{})
				go func() {
					defer close(drained)
					for {
						select {
						case bt := <-s.ch:
							h.written(bt)
						case <-stop:
							return
						}
					}
				}()
				defer func() { close(stop); <-drained }()
				cfg.Share = route.NewShare(route.ShareConfig{Self: 1, Out: hubSync{h}})
				flush = h.flush
			}
			lc, err := route.New(cfg)
			if err != nil {
				b.Fatal(err)
			}
			eps := pool.All()
			req := &policy.Request{Model: "m", Blocks: blocks, BlockTokens: 16, PromptTokens: 1030, MaxTokens: 8}
			b.ReportAllocs()
			n := 0
			for b.Loop() {
				if n++; n%5 == 0 {
					flush()
				}
				c, err := lc.Begin(req, eps, "", time.Now())
				if err != nil {
					b.Fatal(err)
				}
				if c.Next() == nil {
					b.Fatal("no endpoint")
				}
				c.FirstToken()
				c.Finish(route.Outcome{OK: true, CachedTokens: 1008, OutputTokens: 8})
			}
		})
	}
}

// hubSync publishes into a hub, as a Node does.
type hubSync struct{ h *hub }

func (s hubSync) Publish(ev *route.Event) { s.h.publish(ev) }

// TestHubReferences: every stream's receiver resolves the references of the batches it gets:
// a stream that subscribes late gets none to the events before it, and a stream that lost a
// batch gets none after the gap (it ends, and its queue holds only what came before).
func TestHubReferences(t *testing.T) {
	h := newHub(1<<20, 2, time.Hour, metrics.NewPeers(prometheus.NewRegistry()))
	system := make([]uint64, 60)
	for i := range system {
		system[i] = uint64(i+1) * 0x9e3779b97f4a7c15
	}
	routed := func(id uint64) *route.Event {
		return &route.Event{Kind: route.EventRouted, ID: id, Endpoint: "e", BlockTokens: 16,
			Blocks: append(append([]uint64(nil), system...), 1000+id)}
	}
	// decode checks that a batch decodes, on the stream of d, to the routed events of ids.
	decode := func(name string, d *decoder, b *batch, ids ...uint64) {
		t.Helper()
		evs, err := d.batch(append(msgp.AppendArrayHeader(nil, uint32(b.n)), b.events...), 9, nil)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var want []route.Event
		for _, id := range ids {
			ev := routed(id)
			ev.Origin = 9
			want = append(want, *ev)
		}
		if diff := cmp.Diff(want, evs); diff != "" {
			t.Errorf("%s (-want +got):\n%s", name, diff)
		}
	}
	var d1, d2 decoder
	s1, _ := h.subscribe(0, false)
	h.publish(routed(1))
	h.publish(routed(2))
	s2, _ := h.subscribe(0, false) // the pending batch goes to s1 alone
	h.publish(routed(3))
	h.flush()
	if len(s1.ch) != 2 || len(s2.ch) != 1 {
		t.Fatalf("queued: %d and %d batches, want 2 and 1", len(s1.ch), len(s2.ch))
	}
	decode("s1's first", &d1, <-s1.ch, 1, 2)
	b3 := <-s1.ch
	if len(b3.events) < 8*len(system) {
		t.Errorf("the first request after a new stream: %d bytes, want its blocks whole", len(b3.events))
	}
	decode("s1's second", &d1, b3, 3)
	decode("s2's first", &d2, <-s2.ch, 3)

	// s2 does not read: its queue of 2 fills, and it loses the third batch.
	for id := uint64(4); id <= 6; id++ {
		h.publish(routed(id))
		h.flush()
		b := <-s1.ch
		if len(b.events) > 100 {
			t.Errorf("a request that shares 60 blocks with the last: %d bytes", len(b.events))
		}
		decode("s1", &d1, b, id)
	}
	select {
	case <-s2.broken:
	default:
		t.Fatal("s2 lost a batch and was not broken off")
	}
	decode("s2 before the gap", &d2, <-s2.ch, 4)
	decode("s2 before the gap", &d2, <-s2.ch, 5)
	h.publish(routed(7))
	h.flush()
	if len(s2.ch) != 0 {
		t.Errorf("s2 was sent %d batches after the gap", len(s2.ch))
	}
	decode("s1", &d1, <-s1.ch, 7)
}

// TestHubBatchBlocks: a batch ends before its events would hold more blocks than a receiver
// decodes from one message.
func TestHubBatchBlocks(t *testing.T) {
	h := newHub(1<<30, 4, time.Hour, metrics.NewPeers(prometheus.NewRegistry()))
	s, _ := h.subscribe(0, false)
	big := &route.Event{Kind: route.EventRouted, Endpoint: "e", Blocks: make([]uint64, maxBatchBlocks/2+1)}
	for i := range big.Blocks {
		big.Blocks[i] = uint64(i) + 1
	}
	h.publish(big)
	if len(s.ch) != 0 {
		t.Fatal("a batch of one event handed on")
	}
	big.Blocks[0] = 0 // shares nothing with the first
	h.publish(big)
	if len(s.ch) != 1 {
		t.Fatalf("%d batches handed on before the second event; want 1", len(s.ch))
	}
	h.flush()
	var d decoder
	for range 2 {
		b := <-s.ch
		if _, err := d.batch(append(msgp.AppendArrayHeader(nil, uint32(b.n)), b.events...), 9, nil); err != nil || b.n != 1 {
			t.Errorf("batch of %d events: %v", b.n, err)
		}
	}
}

// drain reads every batch queued for s, as its stream would write them, and gives them back.
func drain(h *hub, s *sub) []*batch {
	var out []*batch
	for {
		select {
		case b := <-s.ch:
			out = append(out, b)
		default:
			return out
		}
	}
}

// TestHubResume: a stream that resumes after the last batch its receiver applied is sent the
// batches it missed, then the live ones; on the receiver's decoder of its stream before,
// they decode to the events published, references included, also across another stream's
// start meanwhile (which reset the sender's block lists).
func TestHubResume(t *testing.T) {
	h := newHub(1<<20, 16, time.Hour, metrics.NewPeers(prometheus.NewRegistry()))
	system := make([]uint64, 40)
	for i := range system {
		system[i] = uint64(i+1) * 0x9e3779b97f4a7c15
	}
	routed := func(id uint64) *route.Event {
		return &route.Event{Kind: route.EventRouted, ID: id, Endpoint: "e", BlockTokens: 16,
			Blocks: append(append([]uint64(nil), system...), 1000+id)}
	}
	var d decoder // the receiver's, kept from one stream to the next
	decode := func(what string, bs []*batch, ids ...uint64) {
		t.Helper()
		var got []uint64
		for _, b := range bs {
			evs, err := d.batch(append(msgp.AppendArrayHeader(nil, uint32(b.n)), b.events...), 9, nil)
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			for _, ev := range evs {
				if diff := cmp.Diff(routed(ev.ID).Blocks, ev.Blocks); diff != "" {
					t.Errorf("%s: request %d's blocks (-want +got):\n%s", what, ev.ID, diff)
				}
				got = append(got, ev.ID)
			}
			h.written(b)
		}
		if diff := cmp.Diff(ids, got); diff != "" {
			t.Errorf("%s: requests (-want +got):\n%s", what, diff)
		}
	}
	s1, st := h.subscribe(0, false)
	if st != (feedStart{next: 1, live: 1}) {
		t.Errorf("the first stream starts at %+v, want batch 1", st)
	}
	h.publish(routed(1))
	h.flush()
	h.publish(routed(2))
	h.flush()
	decode("s1", drain(h, s1), 1, 2)
	h.unsubscribe(s1) // the stream breaks after batch 2

	h.publish(routed(3)) // refers to request 2's blocks
	h.flush()
	other, _ := h.subscribe(0, false) // another peer's stream: the lists start again
	h.publish(routed(4))
	h.flush()
	h.publish(routed(5))
	h.flush()
	for _, b := range drain(h, other) {
		h.written(b)
	}
	if n := len(h.log.buf); h.log.n != 5 || n == 0 {
		t.Fatalf("the log holds %d batches, want 5", h.log.n)
	}
	s2, st := h.subscribe(2, true)
	if want := (feedStart{next: 3, live: 6, resumed: true}); st != want {
		t.Errorf("resumed stream starts at %+v, want %+v", st, want)
	}
	if len(s2.backlog) != 3 {
		t.Fatalf("backlog of %d batches, want 3", len(s2.backlog))
	}
	if len(h.log.at(2).events) > 100 {
		t.Errorf("request 3 took %d bytes: its blocks were not sent by reference", len(h.log.at(2).events))
	}
	decode("s2's backlog", s2.backlog, 3, 4, 5)
	s2.backlog = nil
	h.publish(routed(6))
	h.flush()
	decode("s2 live", drain(h, s2), 6)

	// A point the log holds no longer, or past its end: a fresh stream.
	for _, after := range []uint64{7, 99} {
		s, st := h.subscribe(after, true)
		if st.resumed || len(s.backlog) != 0 || st.next != 7 || st.live != 7 {
			t.Errorf("resume after %d: %+v with %d batches, want a fresh stream from 7", after, st, len(s.backlog))
		}
		h.unsubscribe(s)
	}
	h.mu.Lock()
	h.log.maxBytes = 0 // every batch is let go at once
	h.trimLocked(time.Now().UnixNano())
	h.mu.Unlock()
	if s, st := h.subscribe(5, true); st.resumed || len(s.backlog) != 0 || h.log.n != 0 {
		t.Errorf("resume after a batch no longer in the log: %+v, %d batches", st, len(s.backlog))
	}
}

// TestHubLogKeeping: with no stream for logAge the log is let go and publishing does nothing
// (an idle replica pays nothing); a stream that resumes from before is refused.
func TestHubLogKeeping(t *testing.T) {
	h := newHub(1<<20, 16, time.Hour, metrics.NewPeers(prometheus.NewRegistry()))
	ev := &route.Event{Kind: route.EventDone, ID: 1}
	h.publish(ev)
	if h.count != 0 || h.log.seq != 0 {
		t.Fatalf("a hub never subscribed to encoded an event: %d pending, %d batches", h.count, h.log.seq)
	}
	h.mu.Lock()
	h.log.maxAge = 200 * time.Millisecond
	h.mu.Unlock()
	s, _ := h.subscribe(0, false)
	h.publish(ev)
	h.flush()
	drain(h, s)
	h.unsubscribe(s)
	h.publish(ev) // kept: the peer may come back
	h.flush()
	h.mu.Lock()
	seq, n := h.log.seq, h.log.n
	h.mu.Unlock()
	if seq != 2 || n != 2 {
		t.Fatalf("after the stream left: %d batches, %d in the log; want 2 and 2", seq, n)
	}
	waitFor(t, 5*time.Second, "the log's keeping to end", func() bool { return !h.logging.Load() })
	h.publish(ev)
	h.mu.Lock()
	pending, logged := h.count, h.log.n
	h.mu.Unlock()
	if pending != 0 || logged != 0 {
		t.Errorf("after logAge without a stream: %d events pending, %d batches logged; want none", pending, logged)
	}
	if s, st := h.subscribe(2, true); st.resumed || len(s.backlog) != 0 || st.next <= 3 {
		t.Errorf("resume after the log was let go: %+v, %d batches; want a fresh stream past a skipped number", st, len(s.backlog))
	}
}

// TestHubLogHoldsBuffers: a batch in the log keeps its buffer while the streams' written
// buffers are reused for the next batches: what a stream that resumes is sent is what was
// published.
func TestHubLogHoldsBuffers(t *testing.T) {
	h := newHub(1<<20, 64, time.Hour, metrics.NewPeers(prometheus.NewRegistry()))
	s, _ := h.subscribe(0, false)
	var logged [][]byte
	for id := range uint64(200) {
		h.publish(&route.Event{Kind: route.EventDone, ID: id, OK: id%2 == 0})
		h.flush()
		for _, b := range drain(h, s) {
			if id < 20 {
				logged = append(logged, bytes.Clone(b.events))
			}
			h.written(b)
		}
	}
	r, st := h.subscribe(0, true)
	if !st.resumed || len(r.backlog) != 200 {
		t.Fatalf("resume from the start: %+v, %d batches", st, len(r.backlog))
	}
	for i, want := range logged {
		if !bytes.Equal(r.backlog[i].events, want) {
			t.Fatalf("batch %d changed while in the log: its buffer was reused", i+1)
		}
	}
}
