package route

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/policy"
	"github.com/kvroute/kvroute/internal/prefix"
)

// stepClock is a clock a test moves by hand.
type stepClock struct{ t time.Time }

func (c *stepClock) Now() time.Time { return c.t }

// script ranks candidates by name order and records what the lifecycle tells it.
type script struct {
	order []string
	log   []string
}

func (s *script) Pick(_ *policy.Request, c []*endpoint.Endpoint) ([]*endpoint.Endpoint, error) {
	var out []*endpoint.Endpoint
	for _, n := range s.order {
		for _, e := range c {
			if e.Name == n {
				out = append(out, e)
			}
		}
	}
	return out, nil
}
func (s *script) Routed(_ *policy.Request, ep *endpoint.Endpoint) {
	s.log = append(s.log, "routed "+ep.Name)
}
func (s *script) FirstToken(_ *policy.Request, ep *endpoint.Endpoint, ttft time.Duration) {
	s.log = append(s.log, fmt.Sprintf("first %s %v", ep.Name, ttft))
}
func (s *script) Done(_ *policy.Request, ep *endpoint.Endpoint, r policy.Result) {
	s.log = append(s.log, fmt.Sprintf("done %s ok=%v cached=%d ttft=%v", ep.Name, r.OK, r.CachedTokens, r.TTFT))
}
func (s *script) Removed(ep *endpoint.Endpoint) { s.log = append(s.log, "removed "+ep.Name) }
func (s *script) PredictCached(_ *policy.Request, ep *endpoint.Endpoint) int {
	return int(ep.Name[len(ep.Name)-1]-'a') * 16
}

func pool(t *testing.T, names ...string) []*endpoint.Endpoint {
	t.Helper()
	p := endpoint.NewPool()
	specs := make([]endpoint.Spec, len(names))
	for i, n := range names {
		specs[i] = endpoint.Spec{Name: n}
	}
	if _, err := p.Update(specs); err != nil {
		t.Fatal(err)
	}
	return p.All()
}

func newLC(t *testing.T, s *script, clk *stepClock, attempts int) *Lifecycle {
	t.Helper()
	lc, err := New(Config{Picker: s, Clock: clk, Attempts: attempts,
		Health: NewOutlier(OutlierConfig{Consecutive: 2, MaxEjectedPercent: 100}, clk)})
	if err != nil {
		t.Fatal(err)
	}
	return lc
}

// TestCallSuccess: one attempt, its first token, its end: counters and the policy's view.
func TestCallSuccess(t *testing.T) {
	clk := &stepClock{t: time.Unix(100, 0)}
	s := &script{order: []string{"a", "b"}}
	lc := newLC(t, s, clk, 2)
	eps := pool(t, "a", "b")
	req := &policy.Request{PromptTokens: 100}
	c, err := lc.Begin(req, eps, "", clk.t)
	if err != nil {
		t.Fatal(err)
	}
	ep := c.Next()
	if ep.Name != "a" || ep.InFlight() != 1 || ep.PendingPrefill() != 100 || c.Predicted() != 0 {
		t.Fatalf("after Next: %s in flight %d pending %d predicted %d", ep.Name, ep.InFlight(), ep.PendingPrefill(), c.Predicted())
	}
	if again := c.Next(); again != nil {
		t.Errorf("Next during an attempt = %v, want nil", again.Name)
	}
	clk.t = clk.t.Add(30 * time.Millisecond)
	c.FirstToken()
	c.FirstToken() // counted once
	if ep.PendingPrefill() != 0 || c.TTFT() != 30*time.Millisecond {
		t.Errorf("after the first token: pending %d, TTFT %v", ep.PendingPrefill(), c.TTFT())
	}
	clk.t = clk.t.Add(time.Second)
	c.Finish(Outcome{OK: true, CachedTokens: 48, PromptTokens: 90, OutputTokens: 5})
	c.Finish(Outcome{OK: false}) // idempotent
	if ep.InFlight() != 0 || ep.PendingPrefill() != 0 {
		t.Errorf("after Finish: in flight %d pending %d", ep.InFlight(), ep.PendingPrefill())
	}
	// The engine counted 90 prompt tokens for the router's 100: its 48 cached tokens are 53 of
	// the router's, the units the policy predicts in.
	want := []string{"routed a", "first a 30ms", "done a ok=true cached=53 ttft=30ms"}
	if diff := cmp.Diff(want, s.log); diff != "" {
		t.Errorf("policy saw (-want +got):\n%s", diff)
	}
	if s := ep.TokenScale(); s != 0.9 {
		t.Errorf("token scale %v, want 0.9 after one request", s)
	}
	if fin, ok := c.Finished(); !fin || !ok {
		t.Errorf("Finished = %v, %v", fin, ok)
	}
}

// TestFallback walks the failure classes: what is retried, what is not, what counts against an
// endpoint, and that an ejected endpoint is left out of later calls.
func TestFallback(t *testing.T) {
	clk := &stepClock{t: time.Unix(100, 0)}
	s := &script{order: []string{"a", "b", "c"}}
	lc := newLC(t, s, clk, 3)
	eps := pool(t, "a", "b", "c")
	a, b := eps[0], eps[1]
	ejected := func(e *endpoint.Endpoint) bool { return lc.Health().Ejected(e, clk.t) }

	// a refuses connections, b answers 429, c serves.
	c, _ := lc.Begin(&policy.Request{PromptTokens: 10}, eps, "", clk.t)
	var tried []string
	for ep := c.Next(); ep != nil; ep = c.Next() {
		tried = append(tried, ep.Name)
		switch ep.Name {
		case "a":
			if !c.Fail(FailConnect) {
				t.Fatal("connect error on a: not retried")
			}
		case "b":
			c.Backoff(time.Second)
			if !c.Fail(FailBusy) {
				t.Fatal("429 on b: not retried")
			}
		default:
			c.Finish(Outcome{OK: true, CachedTokens: -1})
		}
	}
	if diff := cmp.Diff([]string{"a", "b", "c"}, tried); diff != "" {
		t.Errorf("attempts (-want +got):\n%s", diff)
	}
	for _, e := range eps {
		if e.InFlight() != 0 || e.PendingPrefill() != 0 {
			t.Errorf("%s: in flight %d pending %d after the call", e.Name, e.InFlight(), e.PendingPrefill())
		}
	}
	if ejected(a) {
		t.Error("a ejected after one connection error (threshold 2)")
	}
	// b asked for a second of rest: it goes after c while that lasts, then back in its place.
	c, _ = lc.Begin(&policy.Request{PromptTokens: 10}, eps, "", clk.t)
	if diff := cmp.Diff([]string{"a", "c", "b"}, names(c.Ranked())); diff != "" {
		t.Errorf("ranked during b's backoff (-want +got):\n%s", diff)
	}
	// A second connection error in a row ejects a; the call goes on to c.
	if ep := c.Next(); ep != a || !c.Fail(FailConnect) || !ejected(a) {
		t.Fatalf("second connection error: a ejected %v", ejected(a))
	}
	// A request that reached c and lost its connection is sent once more, to b; b's 5xx, its
	// second failure of the kind, ends it and does not count against b.
	if ep := c.Next(); ep == nil || ep.Name != "c" {
		t.Fatalf("after a: %v, want c", ep)
	}
	if !c.Fail(FailLost) {
		t.Error("a lost request was not sent on once")
	}
	if ep := c.Next(); ep != b {
		t.Fatalf("after c: %v, want b", ep)
	}
	if c.Fail(FailStatus) {
		t.Error("a request that failed so twice was sent on again")
	}
	c.Finish(Outcome{OK: false})
	if here, _ := lc.Health().(*Outlier).Failures(b); here != 0 {
		t.Errorf("b's failures %d after the request's second 5xx or loss, want 0: it points at the request", here)
	}
	if here, _ := lc.Health().(*Outlier).Failures(eps[2]); here != 1 {
		t.Errorf("c's failures %d after it lost the request, want 1", here)
	}
	clk.t = clk.t.Add(2 * time.Second)
	// a is left out of the candidates while ejected.
	c, _ = lc.Begin(&policy.Request{PromptTokens: 10}, eps, "", clk.t)
	if diff := cmp.Diff([]string{"b", "c"}, names(c.Ranked())); diff != "" {
		t.Errorf("ranked while a is ejected (-want +got):\n%s", diff)
	}
	c.Next()
	c.Finish(Outcome{OK: true})
	// Its ejection over (the first lasts DefaultBaseEjection), it is taken back.
	clk.t = clk.t.Add(DefaultBaseEjection)
	c, _ = lc.Begin(&policy.Request{PromptTokens: 10}, eps, "", clk.t)
	if diff := cmp.Diff([]string{"a", "b", "c"}, names(c.Ranked())); diff != "" {
		t.Errorf("ranked after the ejection (-want +got):\n%s", diff)
	}
	if !b.Healthy() || a.InFlight() != 0 {
		t.Errorf("b healthy %v, a in flight %d", b.Healthy(), a.InFlight())
	}
}

func names(eps []*endpoint.Endpoint) []string {
	out := make([]string, len(eps))
	for i, e := range eps {
		out[i] = e.Name
	}
	return out
}

// TestOutlierEjection: consecutive counted failures eject; a success in between resets the
// count; the n-th ejection in a row lasts n base intervals; a bounded share of the fleet is
// ejected at once, never the last endpoint.
func TestOutlierEjection(t *testing.T) {
	clk := &stepClock{t: time.Unix(100, 0)}
	eps := pool(t, "a", "b", "c", "d")
	var ejections []string
	o := NewOutlier(OutlierConfig{Consecutive: 3, BaseEjection: 10 * time.Second, MaxEjection: 25 * time.Second,
		MaxEjectedPercent: 50, Fleet: func() int { return len(eps) },
		OnEject: func(ep *endpoint.Endpoint, d time.Duration, byFleet bool) {
			if byFleet {
				t.Errorf("%s ejected by the fleet's count: no peer failed", ep.Name)
			}
			ejections = append(ejections, fmt.Sprintf("%s %v", ep.Name, d))
		}}, clk)
	a := eps[0]
	o.Failed(a, FailStatus)
	o.Failed(a, FailStatus)
	o.Succeeded(a)
	o.Failed(a, FailTimeout)
	o.Failed(a, FailTimeout)
	if o.Ejected(a, clk.t) {
		t.Fatal("ejected after 2 failures since a success (threshold 3)")
	}
	if !o.Failed(a, FailCut) || !o.Ejected(a, clk.t) {
		t.Fatal("not ejected after 3 consecutive failures")
	}
	// Back after 10 s; failing again at once, out for 20 s, then 25 s (the cap).
	for i, want := range []time.Duration{10 * time.Second, 20 * time.Second, 25 * time.Second} {
		clk.t = clk.t.Add(want - time.Millisecond)
		if !o.Ejected(a, clk.t) {
			t.Fatalf("ejection %d over before %v", i+1, want)
		}
		clk.t = clk.t.Add(time.Millisecond)
		if o.Ejected(a, clk.t) {
			t.Fatalf("ejection %d still on after %v", i+1, want)
		}
		for range 3 {
			o.Failed(a, FailConnect)
		}
	}
	// Two of four may be out at once: b goes, c stays.
	for _, e := range eps[1:3] {
		for range 3 {
			o.Failed(e, FailStatus)
		}
	}
	if !o.Ejected(eps[1], clk.t) || o.Ejected(eps[2], clk.t) {
		t.Errorf("b ejected %v, c ejected %v; want b out and c kept (50%% of 4)", o.Ejected(eps[1], clk.t), o.Ejected(eps[2], clk.t))
	}
	want := []string{"a 10s", "a 20s", "a 25s", "a 25s", "b 10s"}
	if diff := cmp.Diff(want, ejections); diff != "" {
		t.Errorf("ejections (-want +got):\n%s", diff)
	}
	// Never the last one: with two endpoints and 100 %, one may go.
	two := pool(t, "x", "y")
	o2 := NewOutlier(OutlierConfig{Consecutive: 1, MaxEjectedPercent: 100, Fleet: func() int { return 2 }}, clk)
	o2.Failed(two[0], FailConnect)
	o2.Failed(two[1], FailConnect)
	if !o2.Ejected(two[0], clk.t) || o2.Ejected(two[1], clk.t) {
		t.Error("both endpoints of two ejected")
	}
}

// TestOutlierPeerFailures: the other replicas' failures of the engine's own doing count
// towards the fleet's consecutive failures, which eject as this replica's own would; their
// successes reset only that count; their connection failures count for nothing here.
func TestOutlierPeerFailures(t *testing.T) {
	clk := &stepClock{t: time.Unix(100, 0)}
	eps := pool(t, "a", "b", "c", "d")
	var ejections []string
	o := NewOutlier(OutlierConfig{Consecutive: 3, BaseEjection: 10 * time.Second, MaxEjectedPercent: 100, Fleet: func() int { return len(eps) },
		OnEject: func(ep *endpoint.Endpoint, _ time.Duration, byFleet bool) {
			ejections = append(ejections, fmt.Sprintf("%s by fleet %v", ep.Name, byFleet))
		}}, clk)
	a, b := eps[0], eps[1]
	if o.PeerFailed(a, FailStatus) || o.PeerFailed(a, FailCut) {
		t.Fatal("ejected after 2 failures")
	}
	if here, fleet := o.Failures(a); here != 0 || fleet != 2 {
		t.Errorf("failures here %d, fleet %d; want 0 and 2", here, fleet)
	}
	if !o.Failed(a, FailLost) || !o.Ejected(a, clk.t) {
		t.Fatal("not ejected after 2 peer failures and 1 of its own")
	}
	// A peer's success resets the fleet's count: two more of the peers' and one connection
	// failure of theirs do not eject.
	o.PeerFailed(b, FailTimeout)
	o.PeerSucceeded(b)
	o.PeerFailed(b, FailUnavailable)
	o.PeerFailed(b, FailConnect)
	if o.PeerFailed(b, FailStatus) || o.Ejected(b, clk.t) {
		t.Fatal("b ejected: a peer's success came between, and a peer's connection failure does not count")
	}
	if !o.PeerFailed(b, FailStatus) {
		t.Fatal("b not ejected after 3 peer failures in a row")
	}
	// This replica's own count is not reset by a peer's success: its path may be the one
	// that fails.
	c := eps[2]
	o.Failed(c, FailConnect)
	o.Failed(c, FailConnect)
	o.PeerSucceeded(c)
	if o.Ejected(c, clk.t) || !o.Failed(c, FailConnect) {
		t.Error("c not ejected after 3 connection failures here, a peer's success between")
	}
	// Failures that do not count (429, 4xx, the client's) never do.
	d := eps[3]
	for range 5 {
		o.PeerFailed(d, FailBusy)
		o.PeerFailed(d, FailRejected)
		o.PeerFailed(d, FailCanceled)
	}
	if o.Ejected(d, clk.t) || o.counting.Load() != 0 {
		t.Errorf("d ejected %v, endpoints counting %d; want neither", o.Ejected(d, clk.t), o.counting.Load())
	}
	if diff := cmp.Diff([]string{"a by fleet true", "b by fleet true", "c by fleet false"}, ejections); diff != "" {
		t.Errorf("ejections (-want +got):\n%s", diff)
	}
}

// TestOutlierEjections: a replica tells a starting one of its ejections for failures of the
// engine's own doing, not of those for failures to connect (its path alone, maybe); the
// starting one ejects for the rest told, bounded by its own longest ejection and its share of
// the fleet, and its next ejection of that endpoint lasts as a second in a row.
func TestOutlierEjections(t *testing.T) {
	clk := &stepClock{t: time.Unix(100, 0)}
	eps := pool(t, "a", "b", "c", "d")
	cfg := OutlierConfig{Consecutive: 2, BaseEjection: 10 * time.Second, MaxEjection: time.Minute, MaxEjectedPercent: 50, Fleet: func() int { return len(eps) }}
	o := NewOutlier(cfg, clk)
	if got := o.Ejections(clk.t); got != nil {
		t.Fatalf("ejections before any: %v", got)
	}
	o.Failed(eps[0], FailStatus)
	o.Failed(eps[0], FailConnect) // the engine's own count is 1: ejected for the path's sake
	o.Failed(eps[1], FailCut)
	o.Failed(eps[1], FailTimeout)
	clk.t = clk.t.Add(4 * time.Second)
	got := o.Ejections(clk.t)
	if len(got) != 1 || got[0].Endpoint != eps[1] || got[0].Rest != 6*time.Second {
		t.Fatalf("ejections %+v, want b's alone with 6s left", got)
	}
	var told []string // what the starting replica tells its OnEject (the reason metrics count)
	cfg.OnEject = func(ep *endpoint.Endpoint, d time.Duration, byFleet bool) {
		told = append(told, fmt.Sprintf("%s %v by fleet %v", ep.Name, d, byFleet))
	}
	n := NewOutlier(cfg, clk)
	if !n.PeerEjected(eps[1], got[0].Rest) || !n.Ejected(eps[1], clk.t) {
		t.Fatal("b not ejected from the peer's ejection")
	}
	if n.PeerEjected(eps[1], time.Hour) {
		t.Error("b ejected again while ejected")
	}
	// 50 % of four: one more may go, for at most a minute.
	if !n.PeerEjected(eps[2], time.Hour) || n.PeerEjected(eps[3], time.Second) {
		t.Error("want c ejected and d kept: two of four at most")
	}
	if until := n.EjectedUntil(eps[2]); until != clk.t.Add(time.Minute) {
		t.Errorf("c ejected until %v, want a minute on (MaxEjection)", until)
	}
	// b's next ejection here is its second in a row: 20 s.
	clk.t = clk.t.Add(6 * time.Second)
	n.Ejected(eps[1], clk.t)
	n.Failed(eps[1], FailStatus)
	n.Failed(eps[1], FailStatus)
	if until := n.EjectedUntil(eps[1]); until != clk.t.Add(20*time.Second) {
		t.Errorf("b's next ejection until %v, want 20 s on", until)
	}
	// The peers' ejections are told as the fleet's; b's own failures as its own.
	if diff := cmp.Diff([]string{"b 6s by fleet true", "c 1m0s by fleet true", "b 20s by fleet false"}, told); diff != "" {
		t.Errorf("OnEject told (-want +got):\n%s", diff)
	}
}

// TestFailureClasses pins what each failure means.
func TestFailureClasses(t *testing.T) {
	retry := map[Failure]bool{FailConnect: true, FailUnavailable: true, FailBusy: true, FailTimeout: true, FailNotServed: true}
	once := map[Failure]bool{FailLost: true, FailStatus: true}
	counts := map[Failure]bool{FailConnect: true, FailUnavailable: true, FailTimeout: true, FailLost: true, FailStatus: true, FailCut: true}
	named := map[string]Failure{}
	for f := FailNone; f <= FailUnknown; f++ {
		if f.Retryable() != retry[f] || f.RetryableOnce() != once[f] || f.Counts() != counts[f] {
			t.Errorf("%s: retryable %v once %v counts %v; want %v %v %v", f, f.Retryable(), f.RetryableOnce(), f.Counts(), retry[f], once[f], counts[f])
		}
		if g, ok := named[f.String()]; ok || f.String() == "failure" {
			t.Errorf("failures %d and %d are both named %q", g, f, f)
		}
		named[f.String()] = f
	}
	if FailUnknown.String() != "unknown" {
		t.Errorf("FailUnknown is named %q, want unknown", FailUnknown)
	}
}

// failRecorder is a policy that ranks candidates as given and records which attempts it was
// told failed (policy.Result.Failed).
type failRecorder struct{ failed []string }

func (*failRecorder) Pick(_ *policy.Request, c []*endpoint.Endpoint) ([]*endpoint.Endpoint, error) {
	return c, nil
}
func (*failRecorder) Routed(*policy.Request, *endpoint.Endpoint)                    {}
func (*failRecorder) FirstToken(*policy.Request, *endpoint.Endpoint, time.Duration) {}
func (*failRecorder) Removed(*endpoint.Endpoint)                                    {}
func (p *failRecorder) Done(_ *policy.Request, ep *endpoint.Endpoint, r policy.Result) {
	if r.Failed {
		p.failed = append(p.failed, ep.Name)
	}
}

// TestFailUnknown: an attempt whose failure nothing tells (a front end that retried past it:
// Envoy, through ext_proc) is not retried by the lifecycle, is told to the policy as a failure, and neither counted
// towards ejection (one failure ejects here) nor told to the other replicas: the done event
// carries no failure.
func TestFailUnknown(t *testing.T) {
	clk := &stepClock{t: time.Unix(100, 0)}
	pk := &failRecorder{}
	o := NewOutlier(OutlierConfig{Consecutive: 1, MaxEjectedPercent: 100}, clk)
	r := newReplicaOf(t, 1, Config{Picker: pk, Clock: clk, Attempts: 2, Health: o}, clk, ShareConfig{}, "a", "b")
	c, err := r.lc.Begin(&policy.Request{ID: "r", PromptTokens: 10}, r.eps, "", clk.t)
	if err != nil {
		t.Fatal(err)
	}
	if ep := c.Next(); ep.Name != "a" {
		t.Fatalf("first attempt on %s, want a", ep.Name)
	}
	if c.Fail(FailUnknown) {
		t.Error("Fail(FailUnknown) = true: the front end that met it retried, not the lifecycle")
	}
	if c.LastFailure() != FailUnknown {
		t.Errorf("LastFailure %s, want unknown", c.LastFailure())
	}
	if o.Ejected(r.eps[0], clk.t) {
		t.Error("a was ejected by a failure nothing tells")
	}
	if diff := cmp.Diff([]string{"a"}, pk.failed); diff != "" {
		t.Errorf("failures told to the policy (-want +got):\n%s", diff)
	}
	var done []Event
	for _, ev := range r.out.evs {
		if ev.Kind == EventDone {
			done = append(done, ev)
		}
	}
	if len(done) != 1 || done[0].Failure != FailNone || done[0].OK {
		t.Errorf("done events %+v, want one, not OK, carrying no failure", done)
	}
}

// TestAttemptsBound: a request is sent to at most Attempts endpoints.
func TestAttemptsBound(t *testing.T) {
	clk := &stepClock{t: time.Unix(100, 0)}
	lc := newLC(t, &script{order: []string{"a", "b", "c"}}, clk, 2)
	eps := pool(t, "a", "b", "c")
	c, _ := lc.Begin(&policy.Request{}, eps, "", clk.t)
	n := 0
	for ep := c.Next(); ep != nil; ep = c.Next() {
		n++
		if c.Fail(FailUnavailable) != (n < 2) {
			t.Errorf("attempt %d: retry answer wrong", n)
		}
	}
	if n != 2 || c.Attempts() != 2 {
		t.Errorf("%d attempts, want 2", n)
	}
}

// TestPins: the endpoint that created a response goes first for a request naming it.
func TestPins(t *testing.T) {
	clk := &stepClock{t: time.Unix(100, 0)}
	s := &script{order: []string{"a", "b"}}
	lc := newLC(t, s, clk, 2)
	eps := pool(t, "a", "b")
	s.order = []string{"b", "a"}
	c, _ := lc.Begin(&policy.Request{}, eps, "", clk.t)
	c.Next()
	c.Finish(Outcome{OK: true, ResponseID: "resp_1"})
	s.order = []string{"a", "b"}
	c, _ = lc.Begin(&policy.Request{}, eps, "resp_1", clk.t)
	if ep := c.Next(); ep.Name != "b" {
		t.Errorf("pinned request went to %s, want b", ep.Name)
	}
	c.Finish(Outcome{OK: true})
	// A pin shared through State survives a new Lifecycle (a config reload).
	lc2, _ := New(Config{Picker: s, Clock: clk, State: lc.state})
	c, _ = lc2.Begin(&policy.Request{}, eps, "resp_1", clk.t)
	if ep := c.Next(); ep.Name != "b" {
		t.Errorf("after a reload the pinned request went to %s, want b", ep.Name)
	}
	// Only the policy's candidates count: a pin to an endpoint that is gone changes nothing.
	c, _ = lc.Begin(&policy.Request{}, eps[:1], "resp_1", clk.t)
	if ep := c.Next(); ep.Name != "a" {
		t.Errorf("pin to a missing endpoint: %s, want a", ep.Name)
	}
}

func TestBeginNoCandidate(t *testing.T) {
	lc := newLC(t, &script{}, &stepClock{}, 1)
	if _, err := lc.Begin(&policy.Request{}, nil, "", time.Time{}); err != ErrNoCandidate {
		t.Errorf("no candidates: %v", err)
	}
	if _, err := lc.Begin(&policy.Request{}, pool(t, "a"), "", time.Time{}); err != ErrNoCandidate {
		t.Errorf("policy ranks none: %v", err)
	}
}

// TestKeys: the live request and a simulated one built from the same text's content keys get
// the same routing blocks, so the simulator routes on what the router would.
func TestKeys(t *testing.T) {
	k := Keys{BlockTokens: 4}
	text := strings.Repeat("You are a helpful assistant. ", 30)
	req, err := openai.Parse(openai.KindCompletion, fmt.Appendf(nil, `{"model":"m","max_tokens":9,"prompt":%q}`, text))
	if err != nil {
		t.Fatal(err)
	}
	var live policy.Request
	k.FromOpenAI(&live, req, "salt")
	sim := k.FromContent(nil, "m", "salt", prefix.ContentKeys(nil, []byte(text), 4))
	if diff := cmp.Diff(sim, live.Blocks); diff != "" || len(sim) == 0 {
		t.Errorf("blocks differ (-sim +live):\n%s", diff)
	}
	if live.PromptTokens != prefix.EstimateTokens(text) || live.MaxTokens != 9 || live.BlockTokens != 4 || live.Model != "m" || !live.Whole {
		t.Errorf("request = %+v; want its estimates, and whole (no stream)", live)
	}
	streamed, err := openai.Parse(openai.KindCompletion, fmt.Appendf(nil, `{"model":"m","stream":true,"prompt":%q}`, text))
	if err != nil {
		t.Fatal(err)
	}
	k.FromOpenAI(&live, streamed, "salt")
	if live.Whole {
		t.Error("a streamed request is taken as whole")
	}
	var other policy.Request
	k.FromOpenAI(&other, req, "another salt")
	if other.Blocks[0] == live.Blocks[0] {
		t.Error("another salt shares the first block")
	}
	// Token ids are keyed as they are, as the engine (and kvroute sim) caches them: token 13
	// is not token 10 (a carriage return is no line feed here), and a leading token 32 (a
	// space) is not trimmed away.
	ids := func(first int) *openai.Request {
		var b strings.Builder
		fmt.Fprintf(&b, `{"model":"m","prompt":[%d`, first)
		for i := range 40 {
			fmt.Fprintf(&b, ",%d", 1000+i)
		}
		b.WriteString("]}")
		r, err := openai.Parse(openai.KindCompletion, []byte(b.String()))
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	var cr, lf, space policy.Request
	k.FromOpenAI(&cr, ids(13), "salt")
	k.FromOpenAI(&lf, ids(10), "salt")
	k.FromOpenAI(&space, ids(32), "salt")
	if cr.Blocks[0] == lf.Blocks[0] {
		t.Error("token prompts starting 13 and 10 share their first block")
	}
	text13 := ids(32).AppendCanonical(nil)
	if want := k.FromContent(nil, "m", "salt", prefix.ContentKeys(nil, text13, 4)); !slices.Equal(space.Blocks, want) {
		t.Errorf("a token prompt starting with 32: blocks %x, want the raw ids' %x", space.Blocks, want)
	}
}

// TestWarmUp: an endpoint that joins later takes its first places gradually over the warm-up;
// the endpoints there from the start are not held back.
func TestWarmUp(t *testing.T) {
	clk := &stepClock{t: time.Unix(100, 0)}
	s := &script{order: []string{"c", "a", "b"}}
	lc, err := New(Config{Picker: s, Clock: clk, Attempts: 2, WarmUp: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	eps := pool(t, "a", "b", "c")
	firstOf := func(cands []*endpoint.Endpoint, id int) string {
		c, err := lc.Begin(&policy.Request{ID: fmt.Sprint(id)}, cands, "", clk.t)
		if err != nil {
			t.Fatal(err)
		}
		return c.Ranked()[0].Name
	}
	// a and b from the start: a is first whenever c is absent, at once.
	if got := firstOf(eps[:2], 0); got != "a" {
		t.Fatalf("start: %s first, want a", got)
	}
	// c joins a minute later: its share of first places grows with time.
	clk.t = clk.t.Add(time.Minute)
	share := func() float64 {
		n := 0
		for i := range 400 {
			if firstOf(eps, i) == "c" {
				n++
			}
		}
		return float64(n) / 400
	}
	var got []float64
	for range 3 {
		got = append(got, share())
		clk.t = clk.t.Add(4 * time.Second)
	}
	got = append(got, share()) // 12 s after it joined
	if got[0] > 0.05 || got[1] < 0.25 || got[1] > 0.55 || got[2] < 0.65 || got[2] > 0.95 || got[3] != 1 {
		t.Errorf("c's share of first places at 0, 4, 8, 12 s: %.2f; want about 0, 0.4, 0.8, then 1", got)
	}
}

// predicting is a script that predicts every attempt's TTFT.
type predicting struct {
	*script
	ttft time.Duration
}

func (p predicting) PredictTTFT(*policy.Request, *endpoint.Endpoint) time.Duration { return p.ttft }

// stallConfig is a lifecycle that watches stalls: endpoints ranked a then b, every TTFT
// predicted as ttft, two attempts, a StallTimeout of 1 s, no ejection.
func stallConfig(clk *stepClock, ttft time.Duration) Config {
	return Config{Picker: predicting{&script{order: []string{"a", "b"}}, ttft}, Clock: clk,
		Attempts: 2, StallTimeout: time.Second, Health: NewOutlier(OutlierConfig{Consecutive: 10, MaxEjectedPercent: 100}, clk)}
}

// TestStallWatchScraped: a non-streamed attempt's watch trusts the engine's silence only when
// the engine's token counters were scraped in the second half of the silent span.
func TestStallWatchScraped(t *testing.T) {
	clk := &stepClock{t: time.Unix(100, 0)}
	lc, err := New(stallConfig(clk, 100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	eps := pool(t, "a", "b")
	c, _ := lc.Begin(&policy.Request{ID: "r", PromptTokens: 10}, eps, "", clk.t)
	a := c.Next()
	w := c.Stall() // 2 s: 20 x 100 ms
	at := func(d time.Duration) int64 { return clk.t.Add(d).UnixNano() }
	if stalled, wait := w.DueScraped(at(3 * time.Second)); stalled || wait != 200*time.Millisecond {
		t.Errorf("no snapshot: stalled %v, wait %v; want not, and a look again in a tenth of the span", stalled, wait)
	}
	a.SetSnapshot(&endpoint.Snapshot{At: clk.t.Add(500 * time.Millisecond), Work: 100})
	if stalled, _ := w.DueScraped(at(3 * time.Second)); stalled {
		t.Error("a snapshot from the silence's first half only: stalled")
	}
	a.SetSnapshot(&endpoint.Snapshot{At: clk.t.Add(1500 * time.Millisecond), Work: 100})
	if a.StalledSince() != 0 {
		t.Fatal("marked stalled before any watch said so")
	}
	if stalled, _ := w.DueScraped(at(3 * time.Second)); !stalled {
		t.Error("counters scraped 1.5 s in, unchanged, nothing else for 3 s: not stalled")
	}
	c.Finish(Outcome{})
}

// TestStallWatch: an attempt is stalled once it has waited its watch's span for its first token
// and its engine answered nothing for as long (an answer to another request puts it off); the
// span is StallTimeout or MaxSlowdown times the predicted TTFT, the longer; the endpoint found
// stalled is ranked after the others until it answers again; the last attempt and a lifecycle
// without StallTimeout watch nothing; a policy without predictions is watched for StallTimeout.
func TestStallWatch(t *testing.T) {
	clk := &stepClock{t: time.Unix(100, 0)}
	newLC := func(p policy.Picker, stall time.Duration) *Lifecycle {
		lc, err := New(Config{Picker: p, Clock: clk, Attempts: 3, StallTimeout: stall,
			Health: NewOutlier(OutlierConfig{Consecutive: 10, MaxEjectedPercent: 100}, clk)})
		if err != nil {
			t.Fatal(err)
		}
		return lc
	}
	eps := pool(t, "a", "b", "c")
	p := predicting{&script{order: []string{"a", "b", "c"}}, 100 * time.Millisecond}
	lc := newLC(p, time.Second)
	c, err := lc.Begin(&policy.Request{ID: "r", PromptTokens: 10}, eps, "", clk.t)
	if err != nil {
		t.Fatal(err)
	}
	a := c.Next()
	w := c.Stall()
	if w.After() != 2*time.Second { // 20 x 100 ms, over the 1 s floor
		t.Fatalf("watched for %v, want 2s (MaxSlowdown x the predicted 100ms)", w.After())
	}
	at := func(d time.Duration) int64 { return clk.t.Add(d).UnixNano() }
	if stalled, wait := w.Due(at(time.Second)); stalled || wait != time.Second {
		t.Errorf("1 s in: stalled %v, wait %v; want not yet, 1s more", stalled, wait)
	}
	a.Progressed(at(1500 * time.Millisecond)) // the engine answers another request
	if stalled, wait := w.Due(at(2 * time.Second)); stalled || wait != 1500*time.Millisecond {
		t.Errorf("2 s in, an answer at 1.5 s: stalled %v, wait %v; want not yet, 1.5s more", stalled, wait)
	}
	if a.StalledDuring(at(0), at(2*time.Second)) {
		t.Error("an attempt not yet given up marked its endpoint stalled")
	}
	if stalled, _ := w.Due(at(3500 * time.Millisecond)); !stalled {
		t.Error("3.5 s in, nothing since 1.5 s: not stalled")
	}
	// The endpoint is stalled from its last answer until its next: the TTFTs of the requests
	// it held meanwhile are not its speed.
	if !a.StalledDuring(at(1600*time.Millisecond), at(1700*time.Millisecond)) || a.StalledDuring(at(0), at(1400*time.Millisecond)) {
		t.Error("a stall found by the watch is not marked from the endpoint's last answer on")
	}
	clk.t = clk.t.Add(3500 * time.Millisecond)
	if !c.Fail(FailTimeout) {
		t.Fatal("a stalled attempt may not be retried")
	}
	c.Next()
	if got := c.Stall().After(); got != 2*time.Second {
		t.Errorf("second attempt watched for %v, want 2s", got)
	}
	c.Fail(FailTimeout)
	c.Next()
	if got := c.Stall().After(); got != 0 {
		t.Errorf("the last attempt watched for %v, want not watched", got)
	}
	c.Finish(Outcome{})

	// What counts as an answer: a first token and a complete answer, of any request. The
	// endpoint found stalled goes after the others until it answers.
	var sent *endpoint.Endpoint
	for i, step := range []func(*Call){(*Call).FirstToken, func(c *Call) { c.Finish(Outcome{OK: true}) }} {
		clk.t = clk.t.Add(time.Second)
		if i == 0 {
			c, _ = lc.Begin(&policy.Request{ID: "r1"}, eps, "", clk.t)
			if sent = c.Next(); sent == a {
				t.Errorf("a request went first to %s, found stalled and silent since", a.Name)
			}
		}
		step(c)
		if got := sent.LastProgress(); got != clk.t.UnixNano() {
			t.Errorf("step %d: the engine's last answer at %v, want now (%v)", i, time.Unix(0, got), clk.t)
		}
	}
	a.Progressed(clk.t.UnixNano())
	if c, _ := lc.Begin(&policy.Request{ID: "r1b"}, eps, "", clk.t); c.Next() != a {
		t.Errorf("once it answered again, %s still went after the others", a.Name)
	}

	p.ttft = 10 * time.Millisecond
	c, _ = newLC(p, time.Second).Begin(&policy.Request{ID: "r2"}, eps, "", clk.t)
	if c.Next(); c.Stall().After() != time.Second {
		t.Errorf("predicted 10ms: watched for %v, want the 1s floor", c.Stall().After())
	}
	c.Finish(Outcome{})
	for name, tc := range map[string]struct {
		lc   *Lifecycle
		want time.Duration
	}{"no prediction": {newLC(p.script, time.Second), time.Second}, "no StallTimeout": {newLC(p, 0), 0}} {
		c, _ := tc.lc.Begin(&policy.Request{ID: "r3"}, eps, "", clk.t)
		if c.Next(); c.Stall().After() != tc.want {
			t.Errorf("%s: watched for %v, want %v", name, c.Stall().After(), tc.want)
		}
		c.Finish(Outcome{})
	}
}

// TestRetriedAttemptTTFT: the policy learns a retried request's TTFT from its last attempt's
// own wait, not from the request's arrival: the endpoint that answered at once after another
// stalled for 10 s is not taught that it takes 10 s. The request's TTFT stays the client's.
func TestRetriedAttemptTTFT(t *testing.T) {
	clk := &stepClock{t: time.Unix(100, 0)}
	s := &script{order: []string{"a", "b"}}
	lc := newLC(t, s, clk, 2)
	c, err := lc.Begin(&policy.Request{ID: "r", PromptTokens: 10}, pool(t, "a", "b"), "", clk.t)
	if err != nil {
		t.Fatal(err)
	}
	c.Next()
	clk.t = clk.t.Add(10 * time.Second)
	if !c.Fail(FailTimeout) {
		t.Fatal("no retry")
	}
	c.Next()
	clk.t = clk.t.Add(50 * time.Millisecond)
	c.FirstToken()
	c.Finish(Outcome{OK: true, CachedTokens: 0})
	want := []string{"routed a", "done a ok=false cached=-1 ttft=0s", "routed b", "first b 50ms", "done b ok=true cached=0 ttft=50ms"}
	if diff := cmp.Diff(want, s.log); diff != "" {
		t.Errorf("what the policy heard (-want +got):\n%s", diff)
	}
	if got := c.TTFT(); got != 10050*time.Millisecond {
		t.Errorf("the request's TTFT %v, want 10.05s (from its arrival)", got)
	}
}

// TestTimeoutFindsStall: a watched stream that waits out its first-token timeout while its
// engine answers nothing at all marks the engine stalled (its watch, 20 x a long prediction,
// would never have fired); not when the engine answered meanwhile, not for an answer that
// comes whole, and not before StallTimeout.
func TestTimeoutFindsStall(t *testing.T) {
	for _, tc := range []struct {
		name     string
		whole    bool
		answered bool          // the engine answers another request 30 s in
		wait     time.Duration // from sent to the timeout
		want     bool
	}{
		{"silent", false, false, 2 * time.Minute, true},
		{"answered meanwhile", false, true, 2 * time.Minute, false},
		{"whole", true, false, 2 * time.Minute, false},
		{"under the stall timeout", false, false, 500 * time.Millisecond, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := &stepClock{t: time.Unix(100, 0)}
			lc, err := New(stallConfig(clk, 10*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			eps := pool(t, "a", "b")
			eps[0].Progressed(clk.t.Add(-time.Second).UnixNano())
			c, _ := lc.Begin(&policy.Request{ID: "r", PromptTokens: 10, Whole: tc.whole}, eps, "", clk.t)
			a := c.Next()
			if got := c.Stall().After(); got != 200*time.Second {
				t.Fatalf("watched for %v, want 200s (past the timeout)", got)
			}
			if tc.answered {
				a.Progressed(clk.t.Add(30 * time.Second).UnixNano())
			}
			clk.t = clk.t.Add(tc.wait)
			c.Fail(FailTimeout)
			if got := a.StalledSince() != 0; got != tc.want {
				t.Errorf("stalled %v, want %v", got, tc.want)
			}
			if tc.want && a.StalledSince() != time.Unix(99, 0).UnixNano() {
				t.Errorf("stalled since %v, want its last answer, 99 s", time.Unix(0, a.StalledSince()))
			}
			c.Next()
			c.Finish(Outcome{OK: true})
		})
	}
}

// TestMoved: a call says why its first endpoint is not the policy's pick: the pick's backoff
// after a 429, or a probe of a cache-blind endpoint; nothing when it is the pick.
func TestMoved(t *testing.T) {
	clk := &stepClock{t: time.Unix(100, 0)}
	lc := newLC(t, &script{order: []string{"a", "b"}}, clk, 3)
	eps := pool(t, "a", "b")
	c, _ := lc.Begin(&policy.Request{PromptTokens: 10}, eps, "", clk.t)
	if m := c.Moved(); m != "" {
		t.Errorf("the pick first: moved by %q, want nothing", m)
	}
	if ep := c.Next(); ep.Name != "a" {
		t.Fatalf("first attempt on %s, want a", ep.Name)
	}
	c.Backoff(time.Second) // a answers 429
	if !c.Fail(FailBusy) {
		t.Fatal("429 not retried")
	}
	c.Next()
	c.Finish(Outcome{OK: true, CachedTokens: -1})
	c, _ = lc.Begin(&policy.Request{PromptTokens: 10}, eps, "", clk.t)
	if m, first := c.Moved(), c.Ranked()[0].Name; m != MovedBackoff || first != "b" {
		t.Errorf("during a's backoff: first %s moved by %q, want b moved by %q", first, m, MovedBackoff)
	}

	_, _, audit, plc, peps := probeSetup(t, nil)
	for range 10 {
		audit.Observe(peps[1], 64, 0, clk.t)
	}
	c, _ = plc.Begin(&policy.Request{PromptTokens: 100}, peps, "", clk.t)
	if m, first := c.Moved(), c.Ranked()[0].Name; m != MovedCacheProbe || first != "b" {
		t.Errorf("blind b due a probe: first %s moved by %q, want b moved by %q", first, m, MovedCacheProbe)
	}
}
