package route

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/policy"
)

// inOrder ranks the candidates as given.
type inOrder struct{}

func (inOrder) Pick(_ *policy.Request, c []*endpoint.Endpoint) ([]*endpoint.Endpoint, error) {
	return c, nil
}

// BenchmarkOutlierRequest is what passive health checking adds to a request that succeeds,
// through the lifecycle (Begin, Next, Finish; a policy that does nothing): with no request key
// followed, and with maxRefusalKeys followed (a flood of bad requests from many clients),
// the request's own key not among them. parallel: 8 goroutines per CPU at once.
func BenchmarkOutlierRequest(b *testing.B) {
	p := endpoint.NewPool()
	if _, err := p.Update([]endpoint.Spec{{Name: "a"}, {Name: "b"}, {Name: "c"}}); err != nil {
		b.Fatal(err)
	}
	eps := p.All()
	reqs := make([]*policy.Request, 1024)
	for i := range reqs {
		reqs[i] = keyed(uint64(1+2*i), "")
	}
	for _, keys := range []int{0, maxRefusalKeys} {
		setup := func() *Lifecycle {
			clk := &stepClock{t: time.Unix(100, 0)}
			o := NewOutlier(OutlierConfig{}, clk)
			for i := range keys {
				for range 2 {
					o.RefusedRequest(eps[i%3], keyed(uint64(1e6+i), "flood"))
				}
			}
			lc, err := New(Config{Picker: inOrder{}, Clock: clk, Health: o})
			if err != nil {
				b.Fatal(err)
			}
			return lc
		}
		do := func(lc *Lifecycle, req *policy.Request) {
			c, err := lc.Begin(req, eps, "", time.Time{})
			if err != nil {
				b.Fatal(err)
			}
			c.Next()
			c.Finish(Outcome{OK: true, CachedTokens: -1})
		}
		b.Run(fmt.Sprintf("keys=%d", keys), func(b *testing.B) {
			lc := setup()
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				do(lc, reqs[i%len(reqs)])
				i++
			}
		})
		b.Run(fmt.Sprintf("keys=%d/parallel", keys), func(b *testing.B) {
			lc := setup()
			b.ReportAllocs()
			b.SetParallelism(8)
			b.RunParallel(func(pb *testing.PB) {
				i := 0
				for pb.Next() {
					do(lc, reqs[i%len(reqs)])
					i++
				}
			})
		})
	}
}

// BenchmarkAvoidRefusing is the refusal rule's share of Begin for a request whose key no
// endpoint refused (nearly every request): with no key followed, and with maxRefusalKeys
// followed, over a ranking of 4.
func BenchmarkAvoidRefusing(b *testing.B) {
	p := endpoint.NewPool()
	if _, err := p.Update([]endpoint.Spec{{Name: "a"}, {Name: "b"}, {Name: "c"}, {Name: "d"}}); err != nil {
		b.Fatal(err)
	}
	eps := p.All()
	req := keyed(3, "")
	for _, keys := range []int{0, maxRefusalKeys} {
		b.Run(fmt.Sprintf("keys=%d", keys), func(b *testing.B) {
			clk := &stepClock{t: time.Unix(100, 0)}
			o := NewOutlier(OutlierConfig{}, clk)
			for i := range keys {
				for range 2 {
					o.RefusedRequest(eps[i%4], keyed(uint64(1e6+i), "flood"))
				}
			}
			lc, err := New(Config{Picker: inOrder{}, Clock: clk, Health: o})
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if got := lc.avoidRefusing(req, eps, "", clk.t); got[0] != eps[0] {
					b.Fatal("moved")
				}
			}
		})
	}
}
