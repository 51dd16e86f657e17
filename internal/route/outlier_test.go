package route

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/policy"
)

// answer tells o of n attempts that ep answered, refused of them refused and the rest served.
func answer(o *Outlier, ep *endpoint.Endpoint, n, refused int) {
	for i := range n {
		if i < refused {
			o.Refused(ep)
		} else {
			o.Succeeded(ep)
		}
	}
}

// TestOutlierRefusals: an endpoint that refuses most of what it answers while the rest of the
// fleet does not is ejected, once it has answered enough; refusals that the whole fleet shares
// (one client's bad requests), or that every engine makes, eject nothing.
func TestOutlierRefusals(t *testing.T) {
	clk := &stepClock{t: time.Unix(100, 0)}
	eps := pool(t, "a", "b", "c")
	a, b, c := eps[0], eps[1], eps[2]
	var told []string
	cfg := OutlierConfig{Fleet: func() int { return len(eps) },
		OnRefusals: func(ep *endpoint.Endpoint, d time.Duration, share, rest float64) {
			told = append(told, fmt.Sprintf("%s %v %.2f %.2f", ep.Name, d, share, rest))
		},
		OnEject: func(ep *endpoint.Endpoint, _ time.Duration, _ bool) {
			t.Errorf("%s: OnEject told of an ejection for refusals (OnRefusals is set)", ep.Name)
		}}
	o := NewOutlier(cfg, clk)
	answer(o, b, 10, 0)
	answer(o, c, 10, 0)
	answer(o, a, 19, 19)
	if o.Ejected(a, clk.t) {
		t.Fatal("a ejected after 19 answers (DefaultRefusalVolume 20)")
	}
	if !o.Refused(a) || !o.Ejected(a, clk.t) {
		t.Fatal("a not ejected after refusing 20 of 20 while b and c served 20 of 20")
	}
	if diff := cmp.Diff([]string{"a 30s 1.00 0.00"}, told); diff != "" {
		t.Errorf("OnRefusals (-want +got):\n%s", diff)
	}
	if here, fleet := o.Failures(a); here != 0 || fleet != 0 {
		t.Errorf("a's consecutive failures %d, %d: refusals count only in the refusal rule", here, fleet)
	}
	// Readmitted, it is judged on what it answers from then on; ejected again, for longer.
	clk.t = clk.t.Add(DefaultBaseEjection)
	if o.Ejected(a, clk.t) {
		t.Fatal("a still ejected after its ejection")
	}
	answer(o, b, 20, 0)
	answer(o, a, 19, 19)
	if o.Ejected(a, clk.t) {
		t.Fatal("a ejected again after 19 refusals since its readmission")
	}
	o.Refused(a)
	if until := o.EjectedUntil(a); until != clk.t.Add(2*DefaultBaseEjection) {
		t.Errorf("a's second ejection until %v, want %v (the second in a row)", until, clk.t.Add(2*DefaultBaseEjection))
	}

	for _, tc := range []struct {
		name       string
		a, b, c    [2]int // answered, refused
		wait       time.Duration
		cfg        OutlierConfig
		wantEjectA bool
	}{
		// One client's bad requests, spread over the fleet: every endpoint refuses alike.
		{name: "the fleet refuses alike", a: [2]int{40, 36}, b: [2]int{40, 34}, c: [2]int{40, 35}},
		{name: "every engine refuses all", a: [2]int{40, 40}, b: [2]int{40, 40}, c: [2]int{40, 40}},
		// No evidence that the rest of the fleet answers this traffic.
		{name: "the rest answered too little", a: [2]int{40, 40}, b: [2]int{9, 0}, c: [2]int{10, 0}},
		{name: "below the share", a: [2]int{20, 16}, b: [2]int{20, 0}, c: [2]int{20, 0}},
		{name: "at the share", a: [2]int{20, 17}, b: [2]int{20, 0}, c: [2]int{20, 0}, wantEjectA: true},
		// The rest refusing half as much as a: a still stands out; more than half: it does not.
		{name: "the rest at half a's share", a: [2]int{20, 20}, b: [2]int{20, 10}, c: [2]int{20, 10}, wantEjectA: true},
		{name: "the rest above half a's share", a: [2]int{20, 20}, b: [2]int{20, 11}, c: [2]int{20, 11}},
		// Refusals fade over the window: 40 refusals 5 minutes ago weigh less than one now.
		{name: "old refusals", a: [2]int{40, 40}, wait: 5 * time.Minute},
		{name: "the rule off", a: [2]int{20, 20}, b: [2]int{20, 0}, c: [2]int{20, 0}, cfg: OutlierConfig{RefusalPercent: -1}},
		{name: "a smaller volume", a: [2]int{5, 5}, b: [2]int{5, 0}, cfg: OutlierConfig{RefusalVolume: 5}, wantEjectA: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := &stepClock{t: time.Unix(100, 0)}
			cfg := tc.cfg
			cfg.Fleet = func() int { return len(eps) }
			o := NewOutlier(cfg, clk)
			answer(o, a, tc.a[0]-1, tc.a[1]-1)
			clk.t = clk.t.Add(tc.wait)
			answer(o, b, tc.b[0], tc.b[1])
			answer(o, c, tc.c[0], tc.c[1])
			if tc.wait > 0 {
				answer(o, b, 20, 0)
				answer(o, c, 20, 0)
			}
			// a's last answer is a refusal: the rule is judged then.
			if got := o.Refused(a); got != tc.wantEjectA || o.Ejected(a, clk.t) != tc.wantEjectA {
				t.Errorf("a ejected %v, want %v", got, tc.wantEjectA)
			}
			for _, e := range []*endpoint.Endpoint{b, c} {
				if o.Ejected(e, clk.t) {
					t.Errorf("%s ejected", e.Name)
				}
			}
		})
	}

	// Never the last one standing: of two endpoints that both refuse far more than the other
	// did when each was judged, one goes at most.
	two := pool(t, "x", "y")
	o2 := NewOutlier(OutlierConfig{MaxEjectedPercent: 100, Fleet: func() int { return 2 }}, clk)
	answer(o2, two[1], 20, 0)
	answer(o2, two[0], 20, 20)
	answer(o2, two[1], 200, 200)
	if !o2.Ejected(two[0], clk.t) || o2.Ejected(two[1], clk.t) {
		t.Errorf("x ejected %v, y ejected %v: want x alone", o2.Ejected(two[0], clk.t), o2.Ejected(two[1], clk.t))
	}
}

// outcomes is a policy that ranks candidates in their order and records what Done hears.
type outcomes struct{ done []string }

func (o *outcomes) Pick(_ *policy.Request, c []*endpoint.Endpoint) ([]*endpoint.Endpoint, error) {
	return c, nil
}
func (o *outcomes) Routed(*policy.Request, *endpoint.Endpoint)                    {}
func (o *outcomes) FirstToken(*policy.Request, *endpoint.Endpoint, time.Duration) {}
func (o *outcomes) Removed(*endpoint.Endpoint)                                    {}
func (o *outcomes) Done(_ *policy.Request, ep *endpoint.Endpoint, r policy.Result) {
	o.done = append(o.done, fmt.Sprintf("%s ok=%v failed=%v", ep.Name, r.OK, r.Failed))
}

// TestRefusalsReachHealth: the lifecycle tells passive health checking of the attempts an
// engine refused, a 4xx relayed or a 404 for an API path it lacks, but not of a 404 naming a
// model it does not serve (that endpoint is left out for the model already); and tells the
// policy which failed attempts were the engine's doing.
func TestRefusalsReachHealth(t *testing.T) {
	clk := &stepClock{t: time.Unix(100, 0)}
	eps := pool(t, "a", "b")
	a, b := eps[0], eps[1]
	pol := &outcomes{}
	o := NewOutlier(OutlierConfig{RefusalVolume: 3, MaxEjectedPercent: 100}, clk)
	lc, err := New(Config{Picker: pol, Clock: clk, Attempts: 2, Health: o})
	if err != nil {
		t.Fatal(err)
	}
	call := func(on []*endpoint.Endpoint, end func(c *Call)) {
		t.Helper()
		c, err := lc.Begin(&policy.Request{Model: "m", PromptTokens: 10}, on, "", clk.t)
		if err != nil {
			t.Fatal(err)
		}
		c.Next()
		end(c)
	}
	for range 3 {
		call([]*endpoint.Endpoint{b}, func(c *Call) { c.Finish(Outcome{OK: true, CachedTokens: -1}) })
	}
	// a answers 404 naming the model: the proxy has left a out for it, and sends the request on.
	a.NotServing("m", clk.t, time.Minute)
	for range 5 {
		call(eps, func(c *Call) {
			if !c.Fail(FailNotServed) {
				t.Fatal("a 404 not sent on")
			}
			c.Next()
			c.Finish(Outcome{OK: true, CachedTokens: -1})
		})
	}
	if o.Ejected(a, clk.t) {
		t.Fatal("a ejected for 404s naming a model it does not serve")
	}
	// Then a 404 for an API path, and 400s: three refusals of three answers, b serving all.
	clk.t = clk.t.Add(2 * time.Minute) // the model's mark is over, and what b answered faded
	for range 3 {
		call([]*endpoint.Endpoint{b}, func(c *Call) { c.Finish(Outcome{OK: true, CachedTokens: -1}) })
	}
	call(eps, func(c *Call) {
		c.Fail(FailNotServed)
		c.Next()
		c.Finish(Outcome{OK: true, CachedTokens: -1})
	})
	call(eps, func(c *Call) { c.Finish(Outcome{Failure: FailRejected, CachedTokens: -1}) })
	if o.Ejected(a, clk.t) {
		t.Fatal("a ejected after 2 refusals (volume 3)")
	}
	call(eps, func(c *Call) { c.Finish(Outcome{Failure: FailRejected, CachedTokens: -1}) })
	if !o.Ejected(a, clk.t) {
		t.Fatal("a not ejected after refusing 3 of 3 while b served 4 of 4")
	}
	// The client leaving is no failure of the engine's.
	call([]*endpoint.Endpoint{b}, func(c *Call) { c.Finish(Outcome{CachedTokens: -1}) })
	want := []string{"b ok=true failed=false", "b ok=true failed=false", "b ok=true failed=false"}
	for range 5 {
		want = append(want, "a ok=false failed=true", "b ok=true failed=false")
	}
	want = append(want, "b ok=true failed=false", "b ok=true failed=false", "b ok=true failed=false",
		"a ok=false failed=true", "b ok=true failed=false", "a ok=false failed=true", "a ok=false failed=true",
		"b ok=false failed=false")
	if diff := cmp.Diff(want, pol.done); diff != "" {
		t.Errorf("Done (-want +got):\n%s", diff)
	}
}
