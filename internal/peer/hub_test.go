package peer

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

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

// TestHubHandsOn checks who hands a batch on: a publish that finds it due, at once and with
// the event that found it; never one before it is due; the timer, the interval and a quarter
// after the first event, when no publish comes; a publish that fills it.
func TestHubHandsOn(t *testing.T) {
	ev := func(id uint64) *route.Event {
		return &route.Event{Kind: route.EventFirstToken, ID: id, TTFT: time.Millisecond}
	}
	queued := func(s *sub) int {
		select {
		case b := <-s.ch:
			return b.n
		default:
			return 0
		}
	}
	t.Run("publish", func(t *testing.T) {
		h := newHub(DefaultMaxMessageBytes/4, DefaultQueue, time.Hour, metrics.NewPeers(prometheus.NewRegistry()))
		var clock int64 = 1e18
		h.now = func() int64 { return clock }
		s := h.subscribe()
		h.publish(ev(1))
		clock += int64(time.Hour) - 1
		h.publish(ev(2))
		if n := queued(s); n != 0 {
			t.Fatalf("a batch of %d events handed on before it was due", n)
		}
		clock++
		h.publish(ev(3))
		if n := queued(s); n != 3 {
			t.Fatalf("handed on a batch of %d events when it was due, want 3", n)
		}
		h.publish(ev(4)) // a new batch, due an hour later
		if n := queued(s); n != 0 {
			t.Fatalf("the next batch handed on with %d events at once", n)
		}
		if got := [3]int64{h.byPublish.Load(), h.byTimer.Load(), h.byFull.Load()}; got != [3]int64{1, 0, 0} {
			t.Errorf("batches by publish, timer, full: %v, want [1 0 0]", got)
		}
	})
	t.Run("timer", func(t *testing.T) {
		const interval = 20 * time.Millisecond
		h := newHub(DefaultMaxMessageBytes/4, DefaultQueue, interval, metrics.NewPeers(prometheus.NewRegistry()))
		s := h.subscribe()
		start := time.Now()
		h.publish(ev(1))
		h.publish(ev(2))
		select {
		case b := <-s.ch:
			if waited := time.Since(start); b.n != 2 || waited < interval+interval/4 {
				t.Errorf("the timer handed on %d events after %v, want 2 after %v at least", b.n, waited, interval+interval/4)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the last batch was never handed on")
		}
		if got := h.byTimer.Load(); got != 1 {
			t.Errorf("batches by timer: %d, want 1", got)
		}
	})
	t.Run("full", func(t *testing.T) {
		h := newHub(1, DefaultQueue, time.Hour, metrics.NewPeers(prometheus.NewRegistry()))
		s := h.subscribe()
		h.publish(ev(1))
		if n := queued(s); n != 1 {
			t.Fatalf("a full batch handed on with %d events, want 1", n)
		}
		if got := h.byFull.Load(); got != 1 {
			t.Errorf("batches full: %d, want 1", got)
		}
	})
}
