package policy

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/endpoint"
)

// inFlightOn routes r to ep and, with first, gives it its first token: a request decoding
// there (in flight, not waiting), or without first one waiting for its first token.
func inFlightOn(pa *prefixAware, r *Request, ep *endpoint.Endpoint, first bool) {
	ep.Start(r.PromptTokens)
	pa.Routed(r, ep)
	if first {
		ep.FirstToken(r.PromptTokens)
		pa.FirstToken(r, ep, time.Millisecond)
	}
}

// A conversation's home over the load bound (6 in flight, the bound 5 for 10 in a fleet of
// four) keeps the conversation's next request while nothing waits there for its first token
// and it has been less busy than the fleet's mean, each over about the last affinity window
// (60 s here: the 100 s before count, the more recent the more). It is moved, as before, when
// a request waits there, or when it has been the busiest, unless as many of the requests in
// flight there as it is over the bound (one) have shorter prompts than it: those are the
// sessions the bound sheds, cheaper to move, when their next requests come.
func TestPrefixAware_HomeOverBoundKeepsSessionWhenIdleAndNotBusier(t *testing.T) {
	ctx := seq(1, 300)
	next := req("next", 0, append(append([]uint64{}, ctx...), seq(9000, 10)...)...)
	for _, c := range []struct {
		name        string
		busyHome    bool // the home, not the others, was busy for the 100 s before
		waiting     bool // one of the home's six waits for its first token
		shorter     int  // of the home's six, how many have shorter prompts than next (the others longer)
		wantHomeTop bool
	}{
		{"idle home, the others were busy", false, false, 6, true},
		{"idle home, the others were busy, longer requests there", false, false, 0, true},
		{"a request waits at the home", false, true, 6, false},
		{"the home was the busiest, longer requests there", true, false, 0, false},
		{"the home was the busiest, one shorter request there", true, false, 1, true},
		{"the home was the busiest, a request waits there", true, true, 6, false},
	} {
		pa, clk := newPA(t, nil)
		eps := newEndpoints(4, 1<<20)
		mustPick(t, pa, req("hello", 0, 1), eps) // all four in the fleet from now
		warmWith(t, pa, req("ctx", 0, ctx...), eps[0])
		// 100 s in which either the home or each of the others serves one long request.
		var long []*Request
		for i := range 4 {
			if (i == 0) == c.busyHome {
				r := req(fmt.Sprintf("long%d", i), 0, seq(uint64(100000*(i+1)), 5)...)
				inFlightOn(pa, r, eps[i], true)
				long = append(long, r)
			}
		}
		clk.t = clk.t.Add(100 * time.Second)
		for _, r := range long {
			for _, e := range eps {
				if pa.PredictCached(r, e) > 0 {
					e.Finish(r.PromptTokens, true)
					pa.Done(r, e, Result{OK: true, CachedTokens: 0, PromptTokens: r.PromptTokens})
					break
				}
			}
		}
		// Now: six in flight at the home, one at each of the others.
		for i := range 4 {
			for k := range 1 + 5*b2i(i == 0) {
				blocks := uint64(5)
				if i == 0 && k >= c.shorter {
					blocks = 400 // longer than next's 310
				}
				r := req(fmt.Sprintf("run%d-%d", i, k), 0, seq(uint64(1000000*(i+1)+1000*k), blocks)...)
				inFlightOn(pa, r, eps[i], !(c.waiting && i == 0 && k == 0))
			}
		}
		clk.t = clk.t.Add(time.Second)
		got := mustPick(t, pa, next, eps)
		if top := got[0].ID == 0; top != c.wantHomeTop {
			t.Errorf("%s: ranking %v, home 0 first %v, want %v (within bound: %v)", c.name, ids(got), top, c.wantHomeTop, bound(pa, next, eps))
		}
	}
}
