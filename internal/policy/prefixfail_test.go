package policy

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/internal/endpoint"
)

// fail ends r's attempt on ep at once, before its first token, as a refusal or an error of the
// engine does.
func fail(pa *prefixAware, r *Request, ep *endpoint.Endpoint) {
	ep.Finish(r.PromptTokens, false)
	pa.Done(r, ep, Result{OK: false, Failed: true, CachedTokens: -1, PromptTokens: r.PromptTokens})
}

// TestPrefixAware_FailingEndpointDrawsNoTraffic: of three endpoints, one refuses every request
// at once (an engine without a chat template answers 400 to each). It never builds the queue
// or the cache that make the working ones look busier; charged the attempts an answer takes
// there, it is not ranked first again while the others answer. QA (one such engine and two
// `kvroute sim` behind the router): it drew 40 of 40 requests before.
func TestPrefixAware_FailingEndpointDrawsNoTraffic(t *testing.T) {
	pa, clk := newPA(t, nil)
	eps := newEndpoints(3, 1<<20)
	var got []int
	for i := range 30 {
		r := req(fmt.Sprint("r", i), 5, seq(uint64(1000*(i+1)), 8)...)
		ep := route(t, pa, r, eps)
		got = append(got, ep.ID)
		if ep.ID == 0 {
			fail(pa, r, ep) // refused: not sent again (a 4xx is the client's answer)
		} else {
			finish(pa, r, ep, 30*time.Millisecond, 0)
		}
		clk.t = clk.t.Add(100 * time.Millisecond)
	}
	n := 0
	for _, id := range got {
		if id == 0 {
			n++
		}
	}
	if n > 1 {
		t.Errorf("the refusing endpoint drew %d of 30 requests, want 1 at most (picks %v)", n, got)
	}
}

// TestPrefixAware_AttemptsPerAnswer: the multiplier of an endpoint's cost, step by step.
func TestPrefixAware_AttemptsPerAnswer(t *testing.T) {
	pa, clk := newPA(t, nil)
	s := pa.state(0)
	r := req("r", 0, 1)
	now := func() int64 { return clk.t.UnixNano() }
	if m := pa.attemptsPerAnswer(s, now()); m != 1 {
		t.Fatalf("never failed: %v, want exactly 1", m)
	}
	// Clients that leave and other replicas' attempts say nothing of the engine.
	pa.countAttempt(s, r, Result{OK: false, CachedTokens: -1})
	pa.countAttempt(s, &Request{Remote: true}, Result{OK: false, Failed: true})
	if m := pa.attemptsPerAnswer(s, now()); m != 1 {
		t.Fatalf("after a client left and a peer's failure: %v, want exactly 1", m)
	}
	near := func(what string, got, want float64) {
		t.Helper()
		if math.Abs(got-want) > 1e-9 {
			t.Errorf("%s: %v attempts per answer, want %v", what, got, want)
		}
	}
	// No answer yet: each failure counts as one attempt more, as against one answer.
	pa.countAttempt(s, r, Result{Failed: true})
	near("one failure, no answer", pa.attemptsPerAnswer(s, now()), 2)
	pa.countAttempt(s, r, Result{Failed: true})
	near("two failures, no answer", pa.attemptsPerAnswer(s, now()), 3)
	// They fade over the affinity window (60 s): after 60 s x ln 2, half as many.
	clk.t = clk.t.Add(time.Duration(math.Round(60 * math.Ln2 * 1e9)))
	near("two failures 41.6 s ago", pa.attemptsPerAnswer(s, now()), 2)
	// Many answers: one failure among them costs next to nothing.
	for range 8 {
		pa.countAttempt(s, r, Result{OK: true})
	}
	near("one failure (faded), eight answers", pa.attemptsPerAnswer(s, now()), 1+1.0/8)
	// An endpoint removed while its requests ran takes no count.
	pa.Removed(&endpoint.Endpoint{ID: 0})
	pa.countAttempt(s, r, Result{Failed: true})
	near("after Removed", pa.attemptsPerAnswer(s, now()), 1+1.0/8)
}

// TestPrefixAware_FailuresAlikeKeepTheRanking: one client's bad requests, refused by every
// endpoint alike (as large a share of each one's attempts), change no endpoint's place.
func TestPrefixAware_FailuresAlikeKeepTheRanking(t *testing.T) {
	pa, clk := newPA(t, nil)
	eps := newEndpoints(4, 1<<20)
	answers := map[int]int{}
	for i := range 16 {
		r := req(fmt.Sprint("w", i), 5, seq(uint64(100*(i%5+1)), uint64(6+i))...)
		ep := route(t, pa, r, eps)
		if i < 12 {
			finish(pa, r, ep, 20*time.Millisecond, 0)
			answers[ep.ID]++
		}
		clk.t = clk.t.Add(10 * time.Millisecond)
	}
	if len(answers) != len(eps) {
		t.Fatalf("answers by endpoint %v: want every endpoint to have answered", answers)
	}
	probe := req("probe", 3, seq(100, 9)...)
	before, _ := pa.Pick(probe, eps)
	for _, e := range eps {
		for range answers[e.ID] {
			pa.countAttempt(pa.state(e.ID), probe, Result{Failed: true}) // half its attempts
		}
	}
	after, _ := pa.Pick(probe, eps)
	if diff := cmp.Diff(ids(before), ids(after)); diff != "" {
		t.Errorf("ranking changed by failures alike (-before +after):\n%s", diff)
	}
	for _, e := range eps {
		if m := pa.attemptsPerAnswer(pa.state(e.ID), clk.t.UnixNano()); math.Abs(m-2) > 0.01 { // answers faded a little
			t.Errorf("endpoint %d: %v attempts per answer, want about 2", e.ID, m)
		}
	}
}

// TestPrefixAware_TakeBack: a failed attempt taken back (Result.TakeBack: one client's bad
// requests, the router found since) no longer costs the endpoint anything, however long ago
// it failed, while the others stay; taking back more than was told leaves nothing below 0.
func TestPrefixAware_TakeBack(t *testing.T) {
	pa, clk := newPA(t, nil)
	s := pa.state(0)
	r := req("r", 0, 1)
	now := func() int64 { return clk.t.UnixNano() }
	near := func(what string, got, want float64) {
		t.Helper()
		if math.Abs(got-want) > 1e-9 {
			t.Errorf("%s: %v attempts per answer, want %v", what, got, want)
		}
	}
	for range 4 {
		pa.countAttempt(s, r, Result{OK: true})
	}
	first := clk.t
	pa.countAttempt(s, r, Result{Failed: true})
	near("one failure, four answers", pa.attemptsPerAnswer(s, now()), 1+1.0/4)
	clk.t = clk.t.Add(300 * time.Millisecond)
	pa.countAttempt(s, r, Result{TakeBack: first}) // a refusal not blamed, taking the first back
	near("the failure taken back", pa.attemptsPerAnswer(s, now()), 1)
	// Another failure, then the first taken back a second time (it never is: the router takes
	// each back once), 20 s on: the other failure stays, never less than nothing.
	pa.countAttempt(s, r, Result{Failed: true})
	second := clk.t
	clk.t = clk.t.Add(20 * time.Second)
	near("a second failure, 20 s on", pa.attemptsPerAnswer(s, now()), 1+math.Exp(-20.0/60)/(4*math.Exp(-20.3/60)))
	pa.countAttempt(s, r, Result{TakeBack: second})
	near("the second taken back", pa.attemptsPerAnswer(s, now()), 1)
	pa.countAttempt(s, r, Result{TakeBack: second})
	if m := pa.attemptsPerAnswer(s, now()); m != 1 {
		t.Errorf("taken back twice: %v attempts per answer, want 1 (nothing below 0)", m)
	}
}
