package route

import (
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/policy"
)

// TestRetryOnce: a 5xx or a lost connection before any byte sends the request on once; a
// second failure of either kind ends it, however many endpoints are left, and counts against
// nothing (here or at the other replicas); the failures that are always retried do not use up
// the one retry.
func TestRetryOnce(t *testing.T) {
	clk := &stepClock{t: time.Unix(100, 0)}
	o := NewOutlier(OutlierConfig{Consecutive: 10, MaxEjectedPercent: 100}, clk)
	r := newReplicaOf(t, 1, Config{Picker: &script{order: []string{"a", "b", "c", "d"}}, Clock: clk, Attempts: 4, Health: o},
		clk, ShareConfig{}, "a", "b", "c", "d")
	a, b, c := r.eps[0], r.eps[1], r.eps[2]
	failures := func(e *endpoint.Endpoint) int { here, _ := o.Failures(e); return here }
	begin := func(id string) *Call {
		t.Helper()
		call, err := r.lc.Begin(&policy.Request{ID: id, PromptTokens: 10}, r.eps, "", clk.t)
		if err != nil {
			t.Fatal(err)
		}
		return call
	}
	// doneFailure is the failure the last Done event told the other replicas.
	doneFailure := func() Failure {
		t.Helper()
		for i := len(r.out.evs) - 1; i >= 0; i-- {
			if r.out.evs[i].Kind == EventDone {
				return r.out.evs[i].Failure
			}
		}
		t.Fatal("no done event")
		return FailNone
	}

	// A 500 from a: b serves the request.
	call := begin("r1")
	if ep := call.Next(); ep != a || !call.Fail(FailStatus) {
		t.Fatal("a's 500 before any byte: not sent on")
	}
	if doneFailure() != FailStatus || failures(a) != 1 {
		t.Errorf("a's 500: told %v, a's failures %d; want server_error, 1", doneFailure(), failures(a))
	}
	if ep := call.Next(); ep != b {
		t.Fatalf("after a's 500: %v, want b", ep)
	}
	call.Finish(Outcome{OK: true, CachedTokens: -1})

	// a's 500, b's timeout (always retried), c's lost connection: the second failure of the
	// kind ends the request although d is left, and does not count against c.
	call = begin("r2")
	call.Next()
	if !call.Fail(FailStatus) {
		t.Fatal("a's 500: not sent on")
	}
	call.Next()
	if !call.Fail(FailTimeout) {
		t.Fatal("b's timeout after a's 500: not sent on")
	}
	if ep := call.Next(); ep != c {
		t.Fatalf("third attempt on %v, want c", ep)
	}
	if call.Fail(FailLost) {
		t.Error("a request lost by c after a's 500 was sent on again")
	}
	if f := doneFailure(); f != FailNone || failures(c) != 0 {
		t.Errorf("c's loss, the request's second: told %v, c's failures %d; want none, 0", f, failures(c))
	}
	call.Finish(Outcome{})
	if failures(a) != 2 || failures(b) != 1 {
		t.Errorf("failures a %d, b %d; want 2 and 1", failures(a), failures(b))
	}

	// A lost connection alone is sent on once too.
	call = begin("r3")
	call.Next()
	if !call.Fail(FailLost) || call.Next() != b {
		t.Fatal("a's lost connection: not sent on to b")
	}
	call.Finish(Outcome{OK: true, CachedTokens: -1})
	if failures(a) != 3 || failures(b) != 0 {
		t.Errorf("failures a %d, b %d; want 3 and 0 (b answered)", failures(a), failures(b))
	}
}

// TestStallWatchWithoutPrediction: an attempt is watched for StallTimeout alone whatever the
// policy predicts, nothing included: a policy that predicts no TTFT, and prefix-aware before
// its calibration (a prediction of 0).
func TestStallWatchWithoutPrediction(t *testing.T) {
	clk := &stepClock{t: time.Unix(100, 0)}
	eps := pool(t, "a", "b")
	for name, p := range map[string]policy.Picker{
		"no predictor":  &script{order: []string{"a", "b"}},
		"no prediction": predicting{&script{order: []string{"a", "b"}}, 0},
	} {
		t.Run(name, func(t *testing.T) {
			lc, err := New(Config{Picker: p, Clock: clk, Attempts: 2, StallTimeout: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			c, _ := lc.Begin(&policy.Request{ID: "r"}, eps, "", clk.t)
			a := c.Next()
			defer func() {
				c.Finish(Outcome{})
				a.Progressed(clk.t.Add(2 * time.Second).UnixNano()) // the next case starts unstalled
				clk.t = clk.t.Add(3 * time.Second)
			}()
			w := c.Stall()
			if w.After() != time.Second {
				t.Fatalf("watched for %v, want the 1s stall timeout", w.After())
			}
			if stalled, _ := w.Due(clk.t.Add(1500 * time.Millisecond).UnixNano()); !stalled {
				t.Error("1.5 s without an answer: not stalled")
			}
			if a.StalledSince() == 0 {
				t.Error("the watch that found the stall did not mark a stalled")
			}
			c.Fail(FailTimeout)
			if c.Next(); c.Stall().After() != 0 {
				t.Errorf("the last attempt watched for %v, want not watched", c.Stall().After())
			}
		})
	}
}

// TestCanceledWhileStalled: a client that leaves an attempt its engine had held, silent, for a
// stall watch's span or more (watched or not: the last attempt) leaves a failure that counts
// against the endpoint, as a timeout, and the endpoint marked stalled; one that leaves sooner,
// or while the engine answers others, or a whole answer whose engine's counters cannot tell a
// stall, leaves nothing against it.
func TestCanceledWhileStalled(t *testing.T) {
	for _, tc := range []struct {
		name     string
		attempts int           // 1: the last attempt, not watched
		stall    time.Duration // StallTimeout
		whole    bool
		snap     *endpoint.Snapshot // scraped 1.5 s after the attempt was sent (At set here)
		answered bool               // the engine answers another request 1.5 s in
		left     time.Duration      // the client leaves this long after the attempt was sent
		want     bool
	}{
		{name: "last attempt, silent", attempts: 1, stall: time.Second, left: 2 * time.Second, want: true},
		{name: "watched, silent", attempts: 2, stall: time.Second, left: 2 * time.Second, want: true},
		{name: "left before the stall timeout", attempts: 1, stall: time.Second, left: 500 * time.Millisecond},
		{name: "engine answered meanwhile", attempts: 1, stall: time.Second, answered: true, left: 2 * time.Second},
		{name: "stall watch off", attempts: 1, left: time.Minute},
		{name: "whole, no counters", attempts: 1, stall: time.Second, whole: true, left: time.Minute},
		{name: "whole, counters not stepwise", attempts: 1, stall: time.Second, whole: true,
			snap: &endpoint.Snapshot{Work: 100}, left: 2 * time.Second},
		{name: "whole, stepwise counters unchanged", attempts: 1, stall: time.Second, whole: true,
			snap: &endpoint.Snapshot{Work: 100, Stepwise: true}, left: 2 * time.Second, want: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := &stepClock{t: time.Unix(100, 0)}
			o := NewOutlier(OutlierConfig{Consecutive: 10, MaxEjectedPercent: 100}, clk)
			s := &script{order: []string{"a", "b"}}
			lc, err := New(Config{Picker: s, Clock: clk, Attempts: tc.attempts, StallTimeout: tc.stall, Health: o})
			if err != nil {
				t.Fatal(err)
			}
			eps := pool(t, "a", "b")
			a := eps[0]
			c, _ := lc.Begin(&policy.Request{ID: "r", PromptTokens: 10, Whole: tc.whole}, eps, "", clk.t)
			if c.Next() != a {
				t.Fatal("not sent to a")
			}
			if tc.snap != nil {
				tc.snap.At = clk.t.Add(1500 * time.Millisecond)
				a.SetSnapshot(tc.snap)
			}
			if tc.answered {
				a.Progressed(clk.t.Add(1500 * time.Millisecond).UnixNano())
			}
			clk.t = clk.t.Add(tc.left)
			if c.Fail(FailCanceled) {
				t.Error("a request whose client left was sent on")
			}
			c.Finish(Outcome{})
			here, _ := o.Failures(a)
			if got := here == 1; got != tc.want || here > 1 {
				t.Errorf("a's failures %d, want counted %v", here, tc.want)
			}
			if got := a.StalledSince() != 0; got != tc.want {
				t.Errorf("a marked stalled %v, want %v", got, tc.want)
			}
			if c.LastFailure() != FailCanceled {
				t.Errorf("the call's last failure %v, want canceled (the client left)", c.LastFailure())
			}
		})
	}
}

// TestNoRetryAfterFirstToken: an attempt that fails after its first token came (the simulator
// fails so a stream whose instance died under it) is never sent again, whatever the failure:
// its first token may have reached the client.
func TestNoRetryAfterFirstToken(t *testing.T) {
	clk := &stepClock{t: time.Unix(100, 0)}
	lc := newLC(t, &script{order: []string{"a", "b"}}, clk, 2)
	for _, f := range []Failure{FailLost, FailTimeout, FailConnect} {
		c, _ := lc.Begin(&policy.Request{ID: "r", PromptTokens: 10}, pool(t, "a", "b"), "", clk.t)
		c.Next()
		c.FirstToken()
		if c.Fail(f) {
			t.Errorf("%s after the first token: sent again", f)
		}
		c.Finish(Outcome{})
	}
}
