package policy

import (
	"container/heap"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/endpoint"
)

// fleetSim is a small discrete-event fleet for prefix-aware on a fake clock: Poisson arrivals
// of prompts with no prefix in common, engines that each prefill one request at a time in
// the order they came (the prior model's queue, at a speed the test sets over time), and a
// fixed decode after each first token. Everything is drawn from one seed.
type fleetSim struct {
	t     *testing.T
	pa    *prefixAware
	clk   *fakeClock
	eps   []*endpoint.Endpoint
	rng   *rand.Rand
	rate  float64 // arrivals per second
	mean  float64 // mean prompt tokens (lognormal, sigma 0.5)
	dec   time.Duration
	slow  func(ep int, at time.Duration) float64 // the engine's time per unit of prior work at at: 1 is the prior's speed
	free  []time.Duration                        // when each engine's prefill queue is next empty
	start time.Time
	evs   simEvents
	seq   int
	n     int
	// served counts the requests each endpoint was given, by window of width win.
	win    time.Duration
	served [][]int
	rates  [][]float64 // each endpoint's PrefillRate at each window's end
}

// What a simEvent is.
const (
	simArrival = iota
	simFirstToken
	simDone
)

type simEvent struct {
	at   time.Duration
	seq  int
	kind int // simArrival, simFirstToken or simDone
	r    *Request
	ep   int
	ttft time.Duration
}

type simEvents []simEvent

func (e simEvents) Len() int { return len(e) }
func (e simEvents) Less(i, j int) bool {
	if e[i].at != e[j].at {
		return e[i].at < e[j].at
	}
	return e[i].seq < e[j].seq
}
func (e simEvents) Swap(i, j int) { e[i], e[j] = e[j], e[i] }
func (e *simEvents) Push(x any)   { *e = append(*e, x.(simEvent)) }
func (e *simEvents) Pop() any {
	old := *e
	x := old[len(old)-1]
	*e = old[:len(old)-1]
	return x
}

func newFleetSim(t *testing.T, n int, seed uint64, rate, mean float64) *fleetSim {
	pa, clk := newPA(t, Params{})
	return &fleetSim{
		t: t, pa: pa, clk: clk, eps: newEndpoints(n, 1<<22), rng: rand.New(rand.NewPCG(seed, 1)),
		rate: rate, mean: mean, dec: 2 * time.Second,
		slow:  func(int, time.Duration) float64 { return 1 },
		free:  make([]time.Duration, n),
		start: clk.t, win: 10 * time.Second,
	}
}

func (s *fleetSim) push(e simEvent) {
	s.seq++
	e.seq = s.seq
	heap.Push(&s.evs, e)
}

func (s *fleetSim) now() time.Duration { return s.clk.t.Sub(s.start) }

// run runs the fleet until at (virtual time since the start), arrivals included.
func (s *fleetSim) run(until time.Duration) {
	if len(s.evs) == 0 {
		s.push(simEvent{at: s.now(), kind: simArrival})
	}
	for k := 0; len(s.evs) > 0; k++ {
		if k > 10_000_000 {
			s.t.Fatal("fleetSim: too many events")
		}
		e := s.evs[0]
		if e.at > until {
			break
		}
		heap.Pop(&s.evs)
		s.clk.t = s.start.Add(e.at)
		s.window(e.at)
		switch e.kind {
		case simArrival:
			s.arrive(e.at)
			gap := time.Duration(s.rng.ExpFloat64() / s.rate * 1e9)
			s.push(simEvent{at: e.at + gap, kind: simArrival})
		case simFirstToken:
			s.pa.FirstToken(e.r, s.eps[e.ep], e.ttft)
			s.eps[e.ep].FirstToken(e.r.PromptTokens)
			s.push(simEvent{at: e.at + s.dec, kind: simDone, r: e.r, ep: e.ep})
		case simDone:
			s.eps[e.ep].Finish(e.r.PromptTokens, true)
			s.pa.Done(e.r, s.eps[e.ep], Result{OK: true, CachedTokens: 0})
		}
	}
	s.clk.t = s.start.Add(until)
	s.window(until)
}

// window closes the windows that ended by at, reading each endpoint's rate.
func (s *fleetSim) window(at time.Duration) {
	for time.Duration(len(s.rates)+1)*s.win <= at {
		r := make([]float64, len(s.eps))
		for i := range s.eps {
			r[i] = s.pa.PrefillRate(i)
		}
		s.rates = append(s.rates, r)
	}
}

func (s *fleetSim) arrive(at time.Duration) { s.send(at, -1) }

// send routes a new request arriving at at: to endpoint to, or where the policy picks (-1).
func (s *fleetSim) send(at time.Duration, to int) {
	s.n++
	tokens := max(int(s.mean*math.Exp(0.5*s.rng.NormFloat64()-0.125)), 32)
	r := req(fmt.Sprint("q", s.n), tokens%16, seq(uint64(s.n)<<20, uint64(tokens/16))...)
	ep := to
	if ep < 0 {
		ranked, err := s.pa.Pick(r, s.eps)
		if err != nil {
			s.t.Fatal(err)
		}
		ep = ranked[0].ID
	}
	s.pa.Routed(r, s.eps[ep])
	s.eps[ep].Start(r.PromptTokens)
	k := int(at / s.win)
	for len(s.served) <= k {
		s.served = append(s.served, make([]int, len(s.eps)))
	}
	s.served[k][ep]++
	// The engine: FCFS, the prior's time for the request's work, times its slowness then.
	begin := max(at, s.free[ep])
	work := s.pa.work(r, 0)
	end := begin + time.Duration(priorTTFT(work)*s.slow(ep, begin)*1e9)
	s.free[ep] = end
	s.push(simEvent{at: end, kind: simFirstToken, r: r, ep: ep, ttft: end - at})
}

// share is endpoint ep's share of the requests sent in the windows from..to (seconds).
func (s *fleetSim) share(ep int, from, to time.Duration) float64 {
	var mine, all int
	for k := int(from / s.win); k < int(to/s.win) && k < len(s.served); k++ {
		for i, n := range s.served[k] {
			all += n
			if i == ep {
				mine += n
			}
		}
	}
	return float64(mine) / float64(max(all, 1))
}

// TestStarvedEndpointRecovers: endpoint 3 of four is sent a burst of 40 requests and computes
// them at a quarter of its speed (an engine overloaded, a noisy neighbour) for 30 s, then at
// full speed again like the others. Calibrated four times slower, it takes a request only
// when the others' queues are deep, always on an empty queue of its own; its TTFTs then say
// it is as fast as the others, and within three minutes of its recovery it is calibrated as
// they are and takes its share of the traffic again. Before, each of those rare TTFTs,
// predicted short, weighed next to nothing against the burst's long ones, and the calibration
// still said four times slower (a prefill rate of 2,733 tokens/s against 9,563) ten minutes on,
// the endpoint taking 0 to 13 requests in 10 s against about 40 for each of the others.
func TestStarvedEndpointRecovers(t *testing.T) {
	s := newFleetSim(t, 4, 1, 12, 2000)
	const slowFrom, slowTo = 120 * time.Second, 150 * time.Second
	s.slow = func(ep int, at time.Duration) float64 {
		if ep == 3 && at >= slowFrom && at < slowTo {
			return 4
		}
		return 1
	}
	s.run(slowFrom)
	if got := s.share(3, 60*time.Second, slowFrom); got < 0.2 {
		t.Fatalf("before the burst: endpoint 3 took %.2f of the requests, want its share (0.25)", got)
	}
	for range 40 {
		s.send(s.now(), 3)
	}
	s.run(slowTo)
	if got, fleet := s.pa.PrefillRate(3), s.pa.PrefillRate(0); got > fleet/2.5 {
		t.Fatalf("after the burst: endpoint 3's prefill rate %.0f tokens/s, want it calibrated as slow (endpoint 0's %.0f)", got, fleet)
	}
	s.run(slowTo + 180*time.Second)
	if got, want := s.pa.PrefillRate(3), s.pa.PrefillRate(0); got != want {
		t.Errorf("three minutes after it recovered: endpoint 3's prefill rate %.0f tokens/s, want endpoint 0's %.0f", got, want)
	}
	if got := s.share(3, slowTo+150*time.Second, slowTo+180*time.Second); got < 0.2 {
		t.Errorf("two and a half to three minutes after it recovered: endpoint 3 took %.2f of the requests, want its share (0.25)", got)
	}
	if t.Failed() {
		s.print()
	}
}

func (s *fleetSim) print() {
	for k := range s.served {
		line := fmt.Sprintf("%4ds", k*int(s.win/time.Second))
		for i := range s.eps {
			line += fmt.Sprintf(" %4d", s.served[k][i])
		}
		if k < len(s.rates) {
			for i := range s.eps {
				line += fmt.Sprintf(" %7.0f", s.rates[k][i])
			}
		}
		s.t.Log(line)
	}
}
