package route

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/policy"
)

// TestRetryPastEjected: ranked a, b, c, d with two attempts, a fails and b is ejected
// meanwhile (by other requests' failures): the request goes to c, b passed over without using
// up the second attempt. Cut to the attempts at the pick, the ranking held a and b alone, and
// the request gave up with healthy endpoints left (QA: 2 of 15 streams got 504 at 2 s with
// max_retries: 1). c's failure then ends it: both attempts are used, d stays untried, and c's
// attempt, the last, is not watched for a stall. Ranked, what ext_proc hands Envoy, is still
// the first two.
func TestRetryPastEjected(t *testing.T) {
	clk := &stepClock{t: time.Unix(100, 0)}
	lc, err := New(Config{Picker: &script{order: []string{"a", "b", "c", "d"}}, Clock: clk, Attempts: 2,
		Health:       NewOutlier(OutlierConfig{Consecutive: 2, MaxEjectedPercent: 100, Fleet: func() int { return 4 }}, clk),
		StallTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	eps := pool(t, "a", "b", "c", "d")
	a, b, c, d := eps[0], eps[1], eps[2], eps[3]

	call, err := lc.Begin(&policy.Request{PromptTokens: 10}, eps, "", clk.t)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"a", "b"}, names(call.Ranked())); diff != "" {
		t.Errorf("Ranked, the list Envoy gets (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"a", "b", "c", "d"}, names(call.Ranking())); diff != "" {
		t.Errorf("Ranking (-want +got):\n%s", diff)
	}
	if ep := call.Next(); ep != a {
		t.Fatalf("first attempt on %v, want a", ep)
	}
	if call.Stall().After() == 0 {
		t.Error("a's attempt is not watched for a stall: an attempt and usable endpoints are left")
	}
	// Two other requests, which only b can take, fail there: b is ejected.
	for range 2 {
		other, err := lc.Begin(&policy.Request{PromptTokens: 10}, []*endpoint.Endpoint{b}, "", clk.t)
		if err != nil {
			t.Fatal(err)
		}
		if ep := other.Next(); ep != b {
			t.Fatalf("another request on %v, want b", ep)
		}
		other.Fail(FailConnect)
		other.Finish(Outcome{})
	}
	if !lc.Health().Ejected(b, clk.t) {
		t.Fatal("b not ejected after two connection errors (threshold 2)")
	}
	clk.t = clk.t.Add(time.Second)
	if !call.Fail(FailConnect) {
		t.Fatal("a's connection error: not sent on, with c and d usable and an attempt left")
	}
	if ep := call.Next(); ep != c {
		t.Fatalf("second attempt on %v, want c (b is ejected)", ep)
	}
	if call.Stall().After() != 0 {
		t.Error("c's attempt, the last, is watched for a stall: it should wait for its first token")
	}
	if call.Fail(FailConnect) {
		t.Error("c's connection error: sent on, with both attempts used")
	}
	if ep := call.Next(); ep != nil {
		t.Errorf("a third attempt, on %s, with two allowed", ep.Name)
	}
	call.Finish(Outcome{})
	if got := call.Attempts(); got != 2 {
		t.Errorf("%d attempts, want 2", got)
	}
	for _, e := range eps {
		if e.InFlight() != 0 || e.PendingPrefill() != 0 {
			t.Errorf("%s: in flight %d pending %d after the call", e.Name, e.InFlight(), e.PendingPrefill())
		}
	}
	if d.InFlight() != 0 {
		t.Error("d was tried")
	}
}

// TestRetryNoneUsableLeft: a failure that may be retried is not when every endpoint left is
// ejected: Fail says so, and the front end answers with the failure it has (the last 503 as it
// came, say) instead of trying a Next that has nothing.
func TestRetryNoneUsableLeft(t *testing.T) {
	clk := &stepClock{t: time.Unix(100, 0)}
	lc, err := New(Config{Picker: &script{order: []string{"a", "b", "c"}}, Clock: clk, Attempts: 3,
		Health: NewOutlier(OutlierConfig{Consecutive: 2, MaxEjectedPercent: 100, Fleet: func() int { return 3 }}, clk)})
	if err != nil {
		t.Fatal(err)
	}
	eps := pool(t, "a", "b", "c")
	call, err := lc.Begin(&policy.Request{PromptTokens: 10}, eps, "", clk.t)
	if err != nil {
		t.Fatal(err)
	}
	if ep := call.Next(); ep != eps[0] {
		t.Fatalf("first attempt on %v, want a", ep)
	}
	for _, e := range eps[1:] {
		for range 2 {
			other, err := lc.Begin(&policy.Request{PromptTokens: 10}, []*endpoint.Endpoint{e}, "", clk.t)
			if err != nil {
				t.Fatal(err)
			}
			other.Next()
			other.Fail(FailConnect)
			other.Finish(Outcome{})
		}
	}
	if call.Fail(FailUnavailable) {
		t.Error("a's 503: sent on, with b and c ejected")
	}
	if ep := call.Next(); ep != nil {
		t.Errorf("an attempt on ejected %s", ep.Name)
	}
	call.Finish(Outcome{})
}
