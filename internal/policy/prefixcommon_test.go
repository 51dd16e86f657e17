package policy

import (
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/endpoint"
)

// warmWith routes r to ep and finishes it, as if ep had served it a moment ago.
func warmWith(t *testing.T, pa *prefixAware, r *Request, ep *endpoint.Endpoint) {
	t.Helper()
	ep.Start(r.PromptTokens)
	pa.Routed(r, ep)
	finish(pa, r, ep, time.Millisecond, 0)
}

// A tool prompt that most of the fleet holds is no new cache content on an instance that
// joined without it: a new session (tool prompt plus its own task) goes to the idle newcomer
// rather than queue behind the old instances' work.
func TestPrefixAware_CommonPrefixCopiedToNewcomer(t *testing.T) {
	pa, _ := newPA(t, Params{"max_load_factor": "100"})
	eps := newEndpoints(4, 1<<20)
	tool := seq(1, 200) // 3,200 tokens every session starts with
	for i := range 3 {
		warmWith(t, pa, req("old", 0, append(append([]uint64{}, tool...), seq(uint64(10000*(i+1)), 100)...)...), eps[i])
		// Some prefill queued on each old instance (a turn of another session).
		q := req("queued", 0, seq(uint64(100000*(i+1)), 60)...)
		eps[i].Start(q.PromptTokens)
		pa.Routed(q, eps[i])
	}
	// Endpoint 3 joined empty. A new session's first turn: the tool prompt plus 100 new blocks.
	first := req("new", 0, append(append([]uint64{}, tool...), seq(500000, 100)...)...)
	if got := mustPick(t, pa, first, eps); got[0].ID != 3 {
		t.Errorf("ranking %v, want the idle newcomer 3 first (the tool prompt is common content)", ids(got))
	}
	// The same request, where only endpoint 0 holds the prefix: that is one conversation's own
	// context, and recomputing it elsewhere is charged in full.
	pb, _ := newPA(t, Params{"max_load_factor": "100"})
	warmWith(t, pb, req("old", 0, append(append([]uint64{}, tool...), seq(10000, 100)...)...), eps[0])
	q := req("queued", 0, seq(100000, 60)...)
	eps[0].Start(q.PromptTokens)
	pb.Routed(q, eps[0])
	if got := mustPick(t, pb, first, eps); got[0].ID != 0 {
		t.Errorf("ranking %v, want 0 (the only holder of the prefix) first", ids(got))
	}
}

// Content held by fewer than half the candidates (in a fleet of six or more, a conversation
// that moved once, held by its old and new homes), or by one alone, is not common: another
// endpoint does not get it at the price of the request's own wait.
func TestPrefixAware_CommonPrefixNeedsHalfTheFleet(t *testing.T) {
	ctx := seq(1, 200)
	r := req("next", 0, append(append([]uint64{}, ctx...), seq(900000, 10)...)...)
	cases := []struct {
		fleet, holders int
		want           int32 // blocks of ctx that count as common
	}{
		{6, 1, 0}, {6, 2, 0}, {6, 3, 200}, {6, 6, 200},
		{8, 3, 0}, {8, 4, 200},
		{4, 1, 0}, {4, 2, 200},
		{2, 1, 0}, {2, 2, 200}, {3, 1, 0}, {3, 2, 200},
	}
	for _, c := range cases {
		pa, _ := newPA(t, nil)
		eps := newEndpoints(c.fleet, 1<<20)
		for i := range c.holders {
			warmWith(t, pa, req("h", 0, ctx...), eps[i])
		}
		sc := pa.score(r, eps)
		got := sc.common
		pa.scratch.Put(sc)
		if got != c.want {
			t.Errorf("%d of %d hold the context: %d common blocks, want %d", c.holders, c.fleet, got, c.want)
		}
	}
}

// A cache-blind endpoint's index is not evidence that it holds anything: it does not count
// towards the half.
func TestPrefixAware_CommonPrefixIgnoresBlind(t *testing.T) {
	pa, _ := newPA(t, nil)
	eps := newEndpoints(6, 1<<20)
	ctx := seq(1, 200)
	for i := range 3 {
		warmWith(t, pa, req("h", 0, ctx...), eps[i])
	}
	pa.SetCacheBlind(eps[0], true)
	sc := pa.score(req("next", 0, append(append([]uint64{}, ctx...), 7)...), eps)
	defer pa.scratch.Put(sc)
	if sc.common != 0 {
		t.Errorf("%d common blocks with one of the three holders blind, want 0", sc.common)
	}
}
