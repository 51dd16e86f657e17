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
