package route

import (
	"math"
	"slices"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/policy"
)

// sendPinned is fleetRun.send for a request that names a previous response (pin: "" for
// none), ending with f (FailNone: served, its response remembered as respID when not "").
func (r *fleetRun) sendPinned(blocks []uint64, tenant, pin string, on []*endpoint.Endpoint, f Failure, respID string) *endpoint.Endpoint {
	r.t.Helper()
	if on == nil {
		on = r.eps
	}
	req := &policy.Request{Model: "m", Tenant: tenant, Blocks: blocks, BlockTokens: 16, PromptTokens: 16*len(blocks) + 5}
	c, err := r.lc.Begin(req, on, pin, r.clk.t)
	if err != nil {
		r.t.Fatal(err)
	}
	ep := c.Next()
	if ep == nil {
		r.t.Fatal("no endpoint")
	}
	r.clk.t = r.clk.t.Add(5 * time.Millisecond)
	if f != FailNone {
		c.Finish(Outcome{Failure: f, CachedTokens: -1})
		return ep
	}
	c.FirstToken()
	r.clk.t = r.clk.t.Add(5 * time.Millisecond)
	c.Finish(Outcome{OK: true, CachedTokens: -1, OutputTokens: 8, ResponseID: respID})
	return ep
}

// TestPinnedRefusalsExcused: a healthy fleet, every engine refusing one client's bad requests
// alike. The client pins its bad requests to a with one previous_response_id (a pinned request
// is never moved away), and sends valid requests of the same prefix unpinned, which the
// keep-away sends to b and c: before, each of those served elsewhere let one more pinned
// refusal at a count, and with a second prefix (two keys) a was ejected after 165 requests;
// and each counted refusal, told to the policy as a failure, steered other tenants' new
// prompts off a (90 of 90 at a without the attack, 0 with). A pinned request's refusal is now
// excused: a is not ejected, and the others' traffic goes where it went (88 of 90).
func TestPinnedRefusalsExcused(t *testing.T) {
	run := func(attack bool) (r *fleetRun, good map[string]int) {
		r = newFleetRun(t, OutlierConfig{})
		a := r.eps[0]
		p1, p2 := longPrefix(1e6, 50), longPrefix(2e6, 50)
		// The client's one response, created on a: its id pins later requests to a.
		if ep := r.sendPinned(append(slices.Clone(p1), 1), "evil", "", []*endpoint.Endpoint{a}, FailNone, "resp-a"); ep != a {
			t.Fatalf("the response made on %s, want a", ep.Name)
		}
		r.clk.t = r.clk.t.Add(5 * DefaultRefusalWindow)
		for i := range 30 { // other tenants' traffic, on each endpoint
			r.sendPinned([]uint64{uint64(5e8 + 2*i), uint64(5e8 + 2*i + 1)}, "good", "", []*endpoint.Endpoint{r.eps[i%3]}, FailNone, "")
		}
		if attack {
			for i := range 2 {
				r.sendPinned(append(slices.Clone(p1), uint64(100+i)), "evil", "resp-a", nil, FailRejected, "")
			}
			for i := range 80 {
				r.sendPinned(append(slices.Clone(p1), uint64(200+i)), "evil", "", nil, FailNone, "")
			}
			for i := range 80 {
				r.sendPinned(append(slices.Clone(p1), uint64(300+i)), "evil", "resp-a", nil, FailRejected, "")
			}
			for i := range 3 {
				r.sendPinned(append(slices.Clone(p2), uint64(400+i)), "evil", "resp-a", nil, FailRejected, "")
			}
		} else {
			r.clk.t = r.clk.t.Add(165 * 10 * time.Millisecond) // the same time passes
		}
		good = map[string]int{}
		for i := range 90 {
			r.clk.t = r.clk.t.Add(200 * time.Millisecond)
			good[r.sendPinned([]uint64{uint64(6e8 + 2*i), uint64(6e8 + 2*i + 1)}, "good", "", nil, FailNone, "").Name]++
		}
		return r, good
	}
	_, quiet := run(false)
	r, good := run(true)
	a := r.eps[0]
	t.Logf("other tenants' new prompts: without the attack %v, with it %v; a's refusals counted %.1f, ejections %v",
		quiet, good, r.o.counted(a, r.clk.t), r.ejections)
	if r.ejections["a"] > 0 {
		t.Errorf("healthy a ejected by one client's pinned refusals (ejections %v)", r.ejections)
	}
	if n := r.o.counted(a, r.clk.t); n > 0 {
		t.Errorf("a's refusals that count: %.1f, want none (each of the client's was pinned)", n)
	}
	if good["a"] < quiet["a"]/2 {
		t.Errorf("other tenants' new prompts at a: %d with the attack, %d without: steered off a", good["a"], quiet["a"])
	}
}

// TestBrokenEnginePinnedTraffic: an engine that breaks after it made responses that clients
// pin their next requests to is still found. Refusing everything, it is judged by its other
// traffic, its pinned refusals excused (they have nowhere else to go: only it holds their
// previous responses). Behind round-robin it is ejected by the refusal rule after 26 new
// prompts refused there (7 when the pinned refusals counted); behind prefix-aware the policy's
// charge for refusals keeps new prompts off it after 2, and it is not ejected (it was, on the
// pinned refusals alone). Answering 500 to its pinned requests, it is ejected by its
// consecutive failures, which count whether the request was pinned or not.
func TestBrokenEnginePinnedTraffic(t *testing.T) {
	for _, tc := range []struct {
		policy string
		eject  bool
	}{
		// The policy's charge for refusals keeps new prompts off it after a few (its pinned
		// conversations have nowhere else to go); not ejected, as without pins.
		{"prefix-aware", false},
		{"round-robin", true},
	} {
		t.Run("refuses/"+tc.policy, func(t *testing.T) {
			r := newFleetRunWith(t, OutlierConfig{}, tc.policy)
			a := r.eps[0]
			pins := []string{"r0", "r1", "r2", "r3", "r4"}
			for i, id := range pins {
				r.sendPinned([]uint64{uint64(7e8 + 2*i), uint64(7e8 + 2*i + 1)}, "app", "", []*endpoint.Endpoint{a}, FailNone, id)
			}
			for i := range 30 { // the others' answers, for the rule to compare with
				r.sendPinned([]uint64{uint64(6e8 + 2*i), uint64(6e8 + 2*i + 1)}, "other", "", r.eps[1:], FailNone, "")
			}
			r.clk.t = r.clk.t.Add(time.Second)
			r.refuse = func(ep *endpoint.Endpoint, _ bool) bool { return ep == a }
			refused := 0
			for i := range 200 {
				if r.ejections["a"] > 0 {
					break
				}
				r.clk.t = r.clk.t.Add(100 * time.Millisecond)
				// A conversation pinned to a, and a new prompt (unpinned, a new key).
				if ep := r.sendPinned([]uint64{uint64(8e8 + 2*i), uint64(8e8 + 2*i + 1)}, "app", pins[i%len(pins)], nil, FailRejected, ""); ep != a {
					t.Fatalf("a request pinned to a went to %s", ep.Name)
				}
				if _, ok := r.send([]uint64{uint64(9e8 + 2*i), uint64(9e8 + 2*i + 1)}, "other", nil, false); !ok {
					refused++
				}
			}
			t.Logf("ejections %v, new prompts refused at a %d", r.ejections, refused)
			if got := r.ejections["a"] > 0; got != tc.eject {
				t.Errorf("a, refusing everything, ejected by the refusal rule: %v, want %v (new prompts refused at a: %d)", got, tc.eject, refused)
			}
			if refused > 30 {
				t.Errorf("%d new prompts refused at a, want at most 30", refused)
			}
		})
	}
	t.Run("5xx", func(t *testing.T) {
		r := newFleetRun(t, OutlierConfig{Consecutive: 3})
		a := r.eps[0]
		r.sendPinned([]uint64{1, 2}, "app", "", []*endpoint.Endpoint{a}, FailNone, "r0")
		for i := range 3 {
			if ep := r.sendPinned([]uint64{uint64(10 + i)}, "app", "r0", nil, FailStatus, ""); ep != a {
				t.Fatalf("a request pinned to a went to %s", ep.Name)
			}
		}
		if !r.o.Ejected(a, r.clk.t) {
			t.Error("a not ejected after 3 of its pinned requests failed with a 500")
		}
	})
}

// TestPinnedRefusalsExcusedOnlyThere: a request's refusal is excused at the endpoint it is
// pinned to, not at another one. Pinned to a (its previous response made there) but sent to b
// (a ejected or left out of the candidates), its refusals at b count as an unpinned request's
// would: before, every refusal of a request naming a pin was excused wherever it came (each of
// ten bad requests, a new prompt each, counted 0 at b, against 10 at c unpinned).
func TestPinnedRefusalsExcusedOnlyThere(t *testing.T) {
	r := newFleetRun(t, OutlierConfig{})
	a, b, c := r.eps[0], r.eps[1], r.eps[2]
	r.sendPinned([]uint64{1, 2}, "app", "", []*endpoint.Endpoint{a}, FailNone, "resp-a")
	for i := range 30 { // the others' answers, for the rule to compare with
		r.sendPinned([]uint64{uint64(5e8 + 2*i), uint64(5e8 + 2*i + 1)}, "good", "", []*endpoint.Endpoint{r.eps[i%3]}, FailNone, "")
	}
	for i := range 10 {
		if ep := r.sendPinned([]uint64{uint64(7e8 + 2*i), uint64(7e8 + 2*i + 1)}, "app", "resp-a", []*endpoint.Endpoint{b}, FailRejected, ""); ep != b {
			t.Fatalf("a request sent to b alone went to %s", ep.Name)
		}
		r.sendPinned([]uint64{uint64(8e8 + 2*i), uint64(8e8 + 2*i + 1)}, "app", "", []*endpoint.Endpoint{c}, FailRejected, "")
		if ep := r.sendPinned([]uint64{uint64(9e8 + 2*i), uint64(9e8 + 2*i + 1)}, "app", "resp-a", nil, FailRejected, ""); ep != a {
			t.Fatalf("a request pinned to a went to %s", ep.Name)
		}
	}
	gotA, gotB, gotC := r.o.counted(a, r.clk.t), r.o.counted(b, r.clk.t), r.o.counted(c, r.clk.t)
	t.Logf("counted refusals: a %.1f (pinned there), b %.1f (pinned to a), c %.1f (unpinned)", gotA, gotB, gotC)
	if gotA > 0 {
		t.Errorf("a's refusals of requests pinned to it count %.1f, want none", gotA)
	}
	if gotC == 0 || math.Abs(gotB-gotC) > 0.01 {
		t.Errorf("b's refusals of requests pinned to a count %.1f, want as many as c's of unpinned ones (%.1f)", gotB, gotC)
	}
}
