package peer

import (
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
				s := h.subscribe()
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
	s1 := h.subscribe()
	h.publish(routed(1))
	h.publish(routed(2))
	s2 := h.subscribe() // the pending batch goes to s1 alone
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
	s := h.subscribe()
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
