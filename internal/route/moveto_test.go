package route

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/policy"
)

// TestMoveTo: a front end that went down the ranking by itself (Envoy) moves the call to the
// endpoint that answered. The attempt in progress is closed as the caller says; an endpoint
// passed with a failure had an attempt made and failed (routed and done for the policy, the
// failure for health), one passed with FailNone none at all; the answering endpoint gets the
// attempt whether or not it is still usable (Next would pass it over); an endpoint the call
// did not rank, or ranked behind its position, is refused with nothing changed. Every
// endpoint's counters are back to 0 after Finish.
func TestMoveTo(t *testing.T) {
	fails := func(m map[string]Failure) func(*endpoint.Endpoint) Failure {
		return func(e *endpoint.Endpoint) Failure { return m[e.Name] }
	}
	for _, tc := range []struct {
		name     string
		before   func(t *testing.T, lc *Lifecycle, eps map[string]*endpoint.Endpoint) // after the pick
		to       string
		passed   map[string]Failure
		log      []string // the policy's, up to the attempt opened on to
		failures map[string]int
		attempts int
	}{
		{
			name: "past one tried and one skipped", to: "c", passed: map[string]Failure{"a": FailConnect},
			log:      []string{"routed a", "done a ok=false cached=-1 ttft=0s", "routed c"},
			failures: map[string]int{"a": 1}, attempts: 2,
		},
		{
			name: "past two failed", to: "d", passed: map[string]Failure{"b": FailConnect, "c": FailUnavailable},
			log: []string{"routed a", "done a ok=false cached=-1 ttft=0s", "routed b", "done b ok=false cached=-1 ttft=0s",
				"routed c", "done c ok=false cached=-1 ttft=0s", "routed d"},
			failures: map[string]int{"b": 1, "c": 1}, attempts: 4,
		},
		{
			name: "past nothing tried", to: "d",
			log:      []string{"routed a", "done a ok=false cached=-1 ttft=0s", "routed d"},
			attempts: 2,
		},
		{
			name: "unavailable since the pick", to: "c", passed: map[string]Failure{"a": FailConnect},
			before:   func(_ *testing.T, _ *Lifecycle, eps map[string]*endpoint.Endpoint) { eps["c"].SetHealthy(false) },
			log:      []string{"routed a", "done a ok=false cached=-1 ttft=0s", "routed c"},
			failures: map[string]int{"a": 1}, attempts: 2,
		},
		{
			name: "ejected since the pick", to: "b",
			before: func(t *testing.T, lc *Lifecycle, eps map[string]*endpoint.Endpoint) {
				for _, e := range eps {
					lc.Health().Succeeded(e) // the fleet health checking knows of: it can spare b
				}
				lc.Health().Failed(eps["b"], FailConnect)
				if !lc.Health().Failed(eps["b"], FailConnect) { // two in a row: ejected
					t.Fatal("b not ejected after two connection errors")
				}
			},
			log:      []string{"routed a", "done a ok=false cached=-1 ttft=0s", "routed b"},
			attempts: 2,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := &stepClock{t: time.Unix(100, 0)}
			s := &script{order: []string{"a", "b", "c", "d"}}
			lc := newLC(t, s, clk, 4)
			all := pool(t, "a", "b", "c", "d")
			eps := map[string]*endpoint.Endpoint{}
			for _, e := range all {
				eps[e.Name] = e
			}
			c, err := lc.Begin(&policy.Request{ID: "r", PromptTokens: 10}, all, "", clk.t)
			if err != nil {
				t.Fatal(err)
			}
			if ep := c.Next(); ep != eps["a"] {
				t.Fatalf("first attempt on %v, want a", ep)
			}
			if tc.before != nil {
				tc.before(t, lc, eps)
			}
			to := eps[tc.to]
			if !c.MoveTo(to, fails(tc.passed)) {
				t.Fatalf("MoveTo(%s) = false", tc.to)
			}
			if diff := cmp.Diff(tc.log, s.log); diff != "" {
				t.Errorf("policy heard (-want +got):\n%s", diff)
			}
			if c.Endpoint() != to || c.Attempts() != tc.attempts {
				t.Errorf("after MoveTo: endpoint %v, attempts %d; want %s, %d", c.Endpoint().Name, c.Attempts(), tc.to, tc.attempts)
			}
			for _, e := range all {
				want := 0
				if e == to {
					want = 1
				}
				if e.InFlight() != want || e.PendingPrefill() != 10*want {
					t.Errorf("%s after MoveTo: in flight %d pending %d, want %d and %d", e.Name, e.InFlight(), e.PendingPrefill(), want, 10*want)
				}
			}
			got := map[string]int{}
			for _, e := range all {
				if n, _ := lc.Health().(*Outlier).Failures(e); n > 0 {
					got[e.Name] = n
				}
			}
			if tc.failures == nil {
				tc.failures = map[string]int{}
			}
			if diff := cmp.Diff(tc.failures, got); diff != "" {
				t.Errorf("consecutive failures after MoveTo (-want +got):\n%s", diff)
			}
			clk.t = clk.t.Add(20 * time.Millisecond)
			c.FirstToken()
			c.Finish(Outcome{OK: true, CachedTokens: -1})
			if got := s.log[len(s.log)-1]; got != "done "+tc.to+" ok=true cached=-1 ttft=20ms" {
				t.Errorf("the policy's last event %q, want %s's answer", got, tc.to)
			}
			for _, e := range all {
				if e.InFlight() != 0 || e.PendingPrefill() != 0 {
					t.Errorf("%s after Finish: in flight %d pending %d", e.Name, e.InFlight(), e.PendingPrefill())
				}
			}
		})
	}
}

// TestMoveToRefused: MoveTo to an endpoint the call did not rank, to the one of the attempt in
// progress, to one behind the call's position, or after the call finished reports false and
// changes nothing.
func TestMoveToRefused(t *testing.T) {
	clk := &stepClock{t: time.Unix(100, 0)}
	s := &script{order: []string{"a", "b", "c"}} // d is not ranked
	lc := newLC(t, s, clk, 3)
	eps := pool(t, "a", "b", "c", "d")
	a, b, c, d := eps[0], eps[1], eps[2], eps[3]
	call, err := lc.Begin(&policy.Request{ID: "r", PromptTokens: 10}, eps, "", clk.t)
	if err != nil {
		t.Fatal(err)
	}
	call.Next()
	passed := func(*endpoint.Endpoint) Failure { return FailConnect }
	check := func(when string, ep *endpoint.Endpoint, open *endpoint.Endpoint, log []string, attempts int) {
		t.Helper()
		if call.MoveTo(ep, passed) {
			t.Errorf("%s: MoveTo(%s) = true, want false", when, ep.Name)
		}
		if diff := cmp.Diff(log, s.log); diff != "" {
			t.Errorf("%s: MoveTo(%s): policy heard (-want +got):\n%s", when, ep.Name, diff)
		}
		if call.Attempts() != attempts {
			t.Errorf("%s: MoveTo(%s): attempts %d, want %d", when, ep.Name, call.Attempts(), attempts)
		}
		for _, e := range eps {
			if want := map[bool]int{true: 1}[e == open]; e.InFlight() != want {
				t.Errorf("%s: MoveTo(%s): %s in flight %d, want %d", when, ep.Name, e.Name, e.InFlight(), want)
			}
		}
		if here, _ := lc.Health().(*Outlier).Failures(a); here != 0 {
			t.Errorf("%s: MoveTo(%s): a's failures %d, want 0", when, ep.Name, here)
		}
	}
	check("on a", d, a, []string{"routed a"}, 1)
	check("on a", a, a, []string{"routed a"}, 1)

	if !call.MoveTo(c, func(*endpoint.Endpoint) Failure { return FailNone }) {
		t.Fatal("MoveTo(c) = false")
	}
	moved := []string{"routed a", "done a ok=false cached=-1 ttft=0s", "routed c"}
	check("on c", b, c, moved, 2)
	check("on c", a, c, moved, 2)

	call.Finish(Outcome{OK: true, CachedTokens: -1})
	done := append(moved, "done c ok=true cached=-1 ttft=0s")
	check("finished", b, nil, done, 2)
	if call.Next() != nil {
		t.Error("Next after Finish opened an attempt")
	}

	// A call whose answer has begun goes nowhere else.
	call, _ = lc.Begin(&policy.Request{ID: "r2", PromptTokens: 10}, eps, "", clk.t)
	call.Next()
	call.FirstToken()
	s.log = nil
	if call.MoveTo(b, passed) || len(s.log) != 0 || call.Endpoint() != a || a.InFlight() != 1 {
		t.Errorf("MoveTo after the first token: policy heard %v, endpoint %s, a in flight %d; want nothing, a, 1", s.log, call.Endpoint().Name, a.InFlight())
	}
	call.Finish(Outcome{OK: true, CachedTokens: -1})
}

// TestMoveToShared: the other replicas hear a call moved past endpoints as they hear one walked
// there by Fail and Next (the same events, a failed attempt on each endpoint passed with a
// failure and none on one passed without), and their counters of the call's endpoints are back
// to 0 after its end.
func TestMoveToShared(t *testing.T) {
	clk := &stepClock{t: time.Unix(100, 0)}
	cfg := Config{Picker: &script{order: []string{"a", "b", "c", "d"}}, Clock: clk, Attempts: 4,
		Health: NewOutlier(OutlierConfig{Consecutive: 10, MaxEjectedPercent: 100}, clk)}
	walked := newReplicaOf(t, 1, cfg, clk, ShareConfig{}, "a", "b", "c", "d")
	ms := &script{order: []string{"a", "b", "c", "d"}}
	cfg.Picker = ms
	cfg.Health = NewOutlier(OutlierConfig{Consecutive: 10, MaxEjectedPercent: 100}, clk)
	moved := newReplicaOf(t, 2, cfg, clk, ShareConfig{}, "a", "b", "c", "d")
	ps := &script{order: []string{"a", "b", "c", "d"}}
	peer := newReplica(t, 3, ps, clk, ShareConfig{}, "a", "b", "c", "d")

	req := func() *policy.Request {
		return &policy.Request{ID: "r", Model: "m", PromptTokens: 10, Blocks: []uint64{1}, BlockTokens: 16}
	}
	// a failed, b skipped untried, c failed, d answered.
	w, _ := walked.lc.Begin(req(), walked.eps, "", clk.t)
	w.Next()
	w.Fail(FailConnect)
	walked.eps[1].SetHealthy(false) // so that Next passes b over, as Envoy skipped it
	w.Next()
	w.Fail(FailUnavailable)
	if ep := w.Next(); ep != walked.eps[3] {
		t.Fatalf("walked to %v, want d", ep)
	}
	m, _ := moved.lc.Begin(req(), moved.eps, "", clk.t)
	m.Next()
	if !m.MoveTo(moved.eps[3], func(e *endpoint.Endpoint) Failure {
		return map[string]Failure{"a": FailConnect, "c": FailUnavailable}[e.Name]
	}) {
		t.Fatal("MoveTo(d) = false")
	}
	clk.t = clk.t.Add(30 * time.Millisecond)
	for _, c := range []*Call{w, m} {
		c.FirstToken()
		c.Finish(Outcome{OK: true, CachedTokens: 16, OutputTokens: 3})
	}
	ignoreID := cmpopts.IgnoreFields(Event{}, "ID", "Origin")
	if diff := cmp.Diff(walked.out.evs, moved.out.evs, ignoreID); diff != "" {
		t.Errorf("events published (-walked +moved):\n%s", diff)
	}
	var kinds []string
	for _, e := range moved.out.evs {
		kinds = append(kinds, e.Kind.String()+" "+e.Endpoint+" "+e.Failure.String())
	}
	want := []string{"routed a none", "done  connect_error", "routed c none", "done  unavailable", "routed d none", "first_token  none", "done  none"}
	if diff := cmp.Diff(want, kinds); diff != "" {
		t.Errorf("events published (-want +got):\n%s", diff)
	}
	for _, d := range moved.deliver(peer) {
		if d != DropNone {
			t.Errorf("the peer dropped an event: %v", d)
		}
	}
	if diff := cmp.Diff(ms.log, ps.log); diff != "" {
		t.Errorf("the peer's policy heard otherwise (-origin +peer):\n%s", diff)
	}
	if diff := cmp.Diff(make([][2]int, 4), load(peer.eps)); diff != "" {
		t.Errorf("the peer's counters after the call (-want +got):\n%s", diff)
	}
	if st := moved.share.Stats(); st.Local != 0 {
		t.Errorf("local attempts after the end: %d", st.Local)
	}
}
