package route

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/policy"
	"github.com/kvroute/kvroute/internal/prefix"
)

// observerOnly is a policy seen only as a Picker and an Observer: no policy.FlightObserver,
// no policy.Completer. A Share replays remote attempts to it through Routed, FirstToken and
// Done, as before FlightObserver.
type observerOnly struct {
	policy.Picker
	obs policy.Observer
}

func (o observerOnly) Routed(req *policy.Request, ep *endpoint.Endpoint) { o.obs.Routed(req, ep) }
func (o observerOnly) FirstToken(req *policy.Request, ep *endpoint.Endpoint, ttft time.Duration) {
	o.obs.FirstToken(req, ep, ttft)
}
func (o observerOnly) Done(req *policy.Request, ep *endpoint.Endpoint, res policy.Result) {
	o.obs.Done(req, ep, res)
}
func (o observerOnly) Removed(ep *endpoint.Endpoint) { o.obs.Removed(ep) }

// TestApplyFlights: remote attempts replayed to prefix-aware through policy.FlightObserver
// (their state held by the Share's flight) leave a replica as the same events replayed
// through Routed, FirstToken and Done do (prefix-aware's own table of requests in flight):
// the same drops, counts and counters, and the same picks, predicted TTFTs, costs,
// cached-token predictions, learned capacities and holds for every prompt on every endpoint
// after each batch. The requests' events are spread over several batches, as with an engine
// slower than a batch interval, among duplicates, failures before and after the first token,
// engine reports of an eviction, unknown endpoints, attempts whose end never comes (ended by
// their TTL) and an origin that leaves with attempts in flight. The reference applies the
// events one by one; the other replica a batch at a time (ApplyBatch, which also replays
// whole what it can).
func TestApplyFlights(t *testing.T) {
	clk := &stepClock{t: time.Unix(100, 0)}
	pa, pb := newPrefixAware(t, clk), newPrefixAware(t, clk)
	if _, ok := pb.(policy.FlightObserver); !ok {
		t.Fatal("prefix-aware is not a policy.FlightObserver")
	}
	names := []string{"e0", "e1", "e2"}
	cfg := ShareConfig{TTL: 400 * time.Millisecond}
	a := newReplica(t, 3, observerOnly{pa, pa.(policy.Observer)}, clk, cfg, names...)
	b := newReplica(t, 3, pb, clk, cfg, names...)
	for _, p := range []policy.Picker{pa, pb} {
		p.(policy.Replicated).SetReplicas(3, 2, 10*time.Millisecond)
	}
	const groups = 6
	prompt := func(g, turn int) []uint64 {
		return prefix.Chain(nil, prefix.Seed("m", ""), seqBlocks(uint64(g)<<20, 8+4*turn))
	}
	r := rand.New(rand.NewPCG(11, 3))
	type pending struct{ rest []Event } // a started attempt's events still to send
	var open []*pending
	var id uint64
	var last []Event
	for batch := range 120 {
		var evs []Event
		// Continue some of the attempts in flight: their next event, or two.
		for i := 0; i < len(open); i++ {
			p := open[i]
			if r.IntN(3) == 0 {
				continue
			}
			n := 1 + r.IntN(2)
			n = min(n, len(p.rest))
			evs = append(evs, p.rest[:n]...)
			p.rest = p.rest[n:]
			if len(p.rest) == 0 {
				open = slices.Delete(open, i, i+1)
				i--
			}
		}
		for range r.IntN(5) {
			id++
			origin := uint64(1 + r.IntN(2))
			g, turn := r.IntN(groups), r.IntN(4)
			blocks := prompt(g, turn)
			pt := len(blocks)*16 + r.IntN(16)
			ttft := time.Duration(5+r.IntN(80)) * time.Millisecond
			routed := Event{Kind: EventRouted, Origin: origin, ID: id, Endpoint: names[r.IntN(len(names))], Model: "m",
				Blocks: blocks, BlockTokens: 16, PromptTokens: pt, MaxTokens: 8}
			first := Event{Kind: EventFirstToken, Origin: origin, ID: id, TTFT: ttft}
			done := Event{Kind: EventDone, Origin: origin, ID: id, OK: true, CachedTokens: -1, PromptTokens: pt,
				OutputTokens: 8, TTFT: ttft, Duration: 3 * ttft, Predicted: -1}
			rest := []Event{first, done}
			switch r.IntN(10) {
			case 0: // failed before its first token
				done.OK, done.TTFT = false, 0
				rest = []Event{done}
			case 1: // failed after it
				done.OK = false
				rest = []Event{first, done}
			case 2: // the engine reported an eviction the origin saw
				done.CachedTokens, done.Predicted = 16*r.IntN(4), 16*(4+r.IntN(4))
				rest = []Event{first, done}
			case 3: // its end never comes: the TTL ends it
				rest = []Event{first}
			case 4:
				routed.Endpoint = "gone"
			}
			evs = append(evs, routed)
			open = append(open, &pending{rest: rest})
		}
		if batch%7 == 6 && len(last) > 0 { // a replay of what came before
			evs = append(evs, last[:min(3, len(last))]...)
		}
		if batch == 80 { // origin 2 leaves with attempts in flight
			if fa, fb := a.share.ForgetOrigin(2), b.share.ForgetOrigin(2); fa != fb || fa == 0 {
				t.Fatalf("origin 2 left: %d attempts ended one way, %d the other (want equal, above 0)", fa, fb)
			}
		}
		last = evs
		sameReplay(t, fmt.Sprintf("batch %d", batch), evs, a, b, pa, pb, groups, prompt, "through Observer", "through FlightObserver")
		clk.t = clk.t.Add(time.Duration(1+r.IntN(40)) * time.Millisecond)
	}
	st := b.share.Stats()
	if st.Expired == 0 || st.Applied < 200 {
		t.Errorf("the scenario applied %d events and expired %d attempts; want 200 or more, and some", st.Applied, st.Expired)
	}
	t.Logf("%d events applied, %d attempts expired, %d replayed whole, %d in flight at the end", st.Applied, st.Expired, st.Coalesced, st.Remote)
}
