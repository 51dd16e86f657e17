package route

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/policy"
)

// fleetRun drives a Lifecycle with prefix-aware over three endpoints a, b and c on a step
// clock: each request is served, or refused when refuse says so for its endpoint.
type fleetRun struct {
	t      *testing.T
	clk    *stepClock
	eps    []*endpoint.Endpoint
	o      *Outlier
	lc     *Lifecycle
	refuse func(ep *endpoint.Endpoint, bad bool) bool
	// ejections by the refusal rule, by endpoint name
	ejections map[string]int
}

func newFleetRun(t *testing.T, cfg OutlierConfig) *fleetRun {
	t.Helper()
	return newFleetRunWith(t, cfg, "prefix-aware")
}

// newFleetRunWith is newFleetRun with the policy named.
func newFleetRunWith(t *testing.T, cfg OutlierConfig, policyName string) *fleetRun {
	t.Helper()
	r := &fleetRun{t: t, clk: &stepClock{t: time.Unix(100, 0)}, eps: pool(t, "a", "b", "c"), ejections: map[string]int{}}
	p, err := policy.New(policyName, nil, policy.Env{Rand: rand.New(rand.NewPCG(1, 2)), Clock: r.clk})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Fleet = func() int { return len(r.eps) }
	cfg.OnRefusals = func(ep *endpoint.Endpoint, _ time.Duration, _, _ float64) { r.ejections[ep.Name]++ }
	r.o = NewOutlier(cfg, r.clk)
	if r.lc, err = New(Config{Picker: p, Clock: r.clk, Health: r.o}); err != nil {
		t.Fatal(err)
	}
	r.refuse = func(*endpoint.Endpoint, bool) bool { return false }
	return r
}

// send routes a request of blocks from tenant over on (nil: every endpoint), bad or not, and
// returns the endpoint it went to and whether it was served.
func (r *fleetRun) send(blocks []uint64, tenant string, on []*endpoint.Endpoint, bad bool) (*endpoint.Endpoint, bool) {
	r.t.Helper()
	if on == nil {
		on = r.eps
	}
	req := &policy.Request{Model: "m", Tenant: tenant, Blocks: blocks, BlockTokens: 16, PromptTokens: 16*len(blocks) + 5}
	c, err := r.lc.Begin(req, on, "", r.clk.t)
	if err != nil {
		r.t.Fatal(err)
	}
	ep := c.Next()
	if ep == nil {
		r.t.Fatal("no endpoint")
	}
	r.clk.t = r.clk.t.Add(5 * time.Millisecond)
	if r.refuse(ep, bad) {
		c.Finish(Outcome{Failure: FailRejected, CachedTokens: -1})
		return ep, false
	}
	c.FirstToken()
	r.clk.t = r.clk.t.Add(20 * time.Millisecond)
	c.Finish(Outcome{OK: true, CachedTokens: -1, OutputTokens: 8})
	return ep, true
}

// longPrefix returns n blocks from base on: a long shared prompt (a system prompt).
func longPrefix(base uint64, n int) []uint64 {
	p := make([]uint64, n)
	for i := range p {
		p[i] = base + uint64(i)
	}
	return p
}

// TestBrokenEngineStickyKeys: the reviewer's case. An engine breaks (restarted with a shorter
// max_model_len, or without its chat template) and refuses every request, while prefix
// affinity keeps sending it the same five applications' system prompts that it held: each
// key's refusals after its first counted once (one client's bad requests?), so the refusal
// rule never reached its volume, no other endpoint ever served those keys to tell otherwise,
// and those clients got 400 for good. Now, a key refused twice at an endpoint that serves it
// not tries another endpoint once (a probe); served there, the refusals count in full and the
// key keeps away from the refusing engine. So within the refusal window a stops receiving
// those keys (each key is refused there twice, then served by b or c).
func TestBrokenEngineStickyKeys(t *testing.T) {
	r := newFleetRun(t, OutlierConfig{})
	a, b, c := r.eps[0], r.eps[1], r.eps[2]
	apps := make([][]uint64, 5)
	for i := range apps {
		apps[i] = longPrefix(uint64(1e6*(i+1)), 300) // 4,800 tokens each
	}
	// Healthy: the five system prompts are cached on a, served there.
	for i, app := range apps {
		if ep, ok := r.send(append(slices.Clone(app), uint64(i)), "", []*endpoint.Endpoint{a}, false); ep != a || !ok {
			t.Fatal("warm-up not served on a")
		}
	}
	// a breaks: it refuses everything from now on.
	r.refuse = func(ep *endpoint.Endpoint, _ bool) bool { return ep == a }
	sticky := map[string]int{}
	refusedAfter := 0 // sticky requests refused at a after the first 10 s
	start := r.clk.t
	for i := range 600 { // one window: 5 requests every 500 ms, one per application
		r.clk.t = r.clk.t.Add(100 * time.Millisecond)
		// Other traffic (unique prompts) that b and c serve: the fleet to compare a with.
		r.send([]uint64{uint64(5e8 + 2*i), uint64(5e8 + 2*i + 1)}, "", []*endpoint.Endpoint{b, c}, false)
		app := i % 5
		ep, ok := r.send(append(slices.Clone(apps[app]), uint64(7e8+i)), "", nil, false)
		sticky[ep.Name]++
		if !ok && r.clk.t.Sub(start) > 10*time.Second {
			refusedAfter++
		}
	}
	t.Logf("sticky requests per endpoint %v, refused at a after 10 s: %d, ejections %v", sticky, refusedAfter, r.ejections)
	if refusedAfter > 0 {
		t.Errorf("%d of the five applications' requests still refused at a after 10 s (per endpoint %v)", refusedAfter, sticky)
	}
	if sticky["a"] > 2*len(apps)+5 {
		t.Errorf("a received %d of the sticky requests, want about 2 per key before they leave it", sticky["a"])
	}
	if r.ejections["b"]+r.ejections["c"] > 0 {
		t.Errorf("b or c ejected: %v", r.ejections)
	}
}

// TestFloodKeepsGoodTraffic: one client floods bad requests on a prefix cached at a (refused
// everywhere) while good requests of unique prompts come one at a time, every 500 ms, for two
// minutes. The flood's first refusal at a was blamed (told to the policy as a failed attempt:
// nothing else was known yet), and a cost more than b and c for a minute or two: the good
// traffic kept away from it. Now the probe's refusal at b shows the key to be the client's,
// and a's next refusal takes the first back: the good traffic is shared as without the flood.
func TestFloodKeepsGoodTraffic(t *testing.T) {
	var elapsed time.Duration
	run := func(withBad bool) (good, bad map[string]int) {
		r := newFleetRun(t, OutlierConfig{})
		defer func(start time.Time) { elapsed = r.clk.t.Sub(start) }(r.clk.t)
		r.refuse = func(_ *endpoint.Endpoint, bad bool) bool { return bad }
		prefix := longPrefix(1e6, 300)
		r.send(append(slices.Clone(prefix), 1), "", []*endpoint.Endpoint{r.eps[0]}, false) // cached on a
		good, bad = map[string]int{}, map[string]int{}
		for i := range 1200 { // 120 s
			r.clk.t = r.clk.t.Add(100 * time.Millisecond)
			if withBad {
				ep, _ := r.send(append(slices.Clone(prefix), uint64(1e8+i)), "bad", nil, true)
				bad[ep.Name]++
			}
			if i%5 == 0 {
				ep, ok := r.send([]uint64{uint64(1e7 + 2*i), uint64(1e7 + 2*i + 1)}, "", nil, false)
				if !ok {
					t.Fatal("a good request refused")
				}
				good[ep.Name]++
			}
		}
		return good, bad
	}
	alone, _ := run(false)
	good, bad := run(true)
	t.Logf("good requests per endpoint: without the flood %v; with it %v (the flood %v)", alone, good, bad)
	for _, name := range []string{"a", "b", "c"} {
		if d := good[name] - alone[name]; d < -1 || d > 1 {
			t.Errorf("%s served %d good requests with the flood, %d without it", name, good[name], alone[name])
		}
	}
	if probes := 1 + int(elapsed/DefaultRefusalWindow); bad["a"] < 1200-probes {
		t.Errorf("the flood went to %v in %v: want a but for one probe a window", bad, elapsed)
	}
}

// TestRefusalProbe: a key refused twice at an endpoint that serves none of it is sent once a
// refusal window to another endpoint (Avoid). Refused there too, it is the client's: that
// refusal is blamed on neither, counts for neither, and the first endpoint's next refusal
// takes its first back (Refusal.TakeBack). Served there, its refusals at the first count from
// then on, within one more than the answers elsewhere, and the key keeps away from it. An
// endpoint that serves the key too is not avoided for it.
func TestRefusalProbe(t *testing.T) {
	clk := &stepClock{t: time.Unix(100, 0)}
	eps := pool(t, "a", "b", "c")
	a, b, c := eps[0], eps[1], eps[2]
	o := NewOutlier(OutlierConfig{Fleet: func() int { return len(eps) }}, clk)
	serve := func(ep *endpoint.Endpoint, req *policy.Request) {
		o.Succeeded(ep)
		o.Served(ep, req)
	}
	for i := range 20 {
		serve(b, keyed(uint64(1000+i), ""))
		serve(c, keyed(uint64(2000+i), ""))
	}
	step := func() { clk.t = clk.t.Add(100 * time.Millisecond) }

	// One client's bad requests, refused at a.
	bad := keyed(7, "t1")
	firstAt := clk.t
	if v := o.Refuse(a, bad); !v.Blamed || !v.TakeBack.IsZero() {
		t.Fatalf("the first refusal: %+v, want blamed", v)
	}
	step()
	if o.Avoid(a, bad, clk.t) {
		t.Error("a avoided for a key it refused once")
	}
	if v := o.Refuse(a, bad); v.Blamed {
		t.Error("the second refusal of a key blamed")
	}
	step()
	if !o.Avoid(a, bad, clk.t) {
		t.Fatal("a not avoided for a key it refused twice and served not")
	}
	if o.Avoid(a, bad, clk.t) || o.Avoid(b, bad, clk.t) {
		t.Error("a second probe in the window, or b avoided for a key it never refused")
	}
	// The probe: b refuses it too.
	if v := o.Refuse(b, bad); v.Blamed || v.Ejected {
		t.Errorf("the probe's refusal at b: %+v, want not blamed", v)
	}
	o.mu.Lock()
	ex := o.excess(clk.t)
	o.mu.Unlock()
	if ex[b] < 0.99 {
		t.Errorf("b's excess %.2f: the probe's refusal must count for nothing", ex[b])
	}
	step()
	if v := o.Refuse(a, bad); v.Blamed || !v.TakeBack.Equal(firstAt) {
		t.Errorf("a's refusal after the probe's: %+v, want not blamed, the first (%v) taken back", v, firstAt)
	}
	if v := o.Refuse(a, bad); !v.TakeBack.IsZero() {
		t.Error("the first refusal taken back twice")
	}
	for i := range 200 {
		step()
		if o.Avoid(a, bad, clk.t) {
			t.Fatalf("a avoided at %d: b refused the key too, and the window is not over", i)
		}
		if v := o.Refuse(a, bad); v.Blamed || v.Ejected {
			t.Fatalf("the flood's refusal %d at a: %+v", i, v)
		}
		if i%10 == 0 {
			serve(b, keyed(uint64(3000+i), ""))
			serve(c, keyed(uint64(4000+i), ""))
		}
	}
	clk.t = clk.t.Add(DefaultRefusalWindow)
	if !o.Avoid(a, bad, clk.t) {
		t.Error("no probe a window on")
	}

	// A key a refuses 20 times and b serves: a refuses what the others serve.
	clk.t = clk.t.Add(time.Hour)
	o = NewOutlier(OutlierConfig{Fleet: func() int { return len(eps) }}, clk)
	for i := range 20 {
		serve(b, keyed(uint64(1000+i), ""))
		serve(c, keyed(uint64(2000+i), ""))
	}
	long := keyed(9, "t1")
	for i := range 20 {
		step()
		if v := o.Refuse(a, long); v.Ejected || v.Blamed != (i == 0) {
			t.Fatalf("refusal %d at a: %+v", i+1, v)
		}
	}
	if !o.Avoid(a, long, clk.t) {
		t.Fatal("no probe")
	}
	serve(b, long)
	for range 3 {
		if !o.Avoid(a, long, clk.t) {
			t.Fatal("the key not kept from a, which refuses what b serves")
		}
	}
	// Its refusals count from b's answer on, not before (the 19 excused stay excused), within
	// 1 + b's answers: the 21st counts, the first and it alone. Before, all 21 counted and a
	// was ejected: one client could have a healthy engine ejected so.
	if v := o.Refuse(a, long); !v.Blamed || v.Ejected {
		t.Errorf("a's refusal of a key b serves, its 21st: %+v; want blamed, a not ejected (2 of 21 count)", v)
	}
	if v := o.Refuse(a, long); v.Blamed || v.Ejected {
		t.Errorf("a's 22nd refusal of a key b served once: %+v; want neither (1 + 1 count)", v)
	}

	// A key that a serves too (a system prompt, some of its requests too long) is not avoided.
	clk.t = clk.t.Add(time.Hour)
	o = NewOutlier(OutlierConfig{Fleet: func() int { return len(eps) }}, clk)
	mixed := keyed(11, "t1")
	for range 3 {
		o.Refuse(c, mixed)
		serve(c, mixed)
		serve(c, mixed)
	}
	if o.Avoid(c, mixed, clk.t) {
		t.Error("c avoided for a key it serves")
	}
}

// TestAvoidInBegin: the lifecycle sends a request first to its second ranked endpoint where
// health asks (Moved says so), but not a request pinned to the first (its previous response is
// there alone), and not where no other endpoint is ranked.
func TestAvoidInBegin(t *testing.T) {
	clk := &stepClock{t: time.Unix(100, 0)}
	eps := pool(t, "a", "b")
	a := eps[0]
	o := NewOutlier(OutlierConfig{}, clk)
	lc, err := New(Config{Picker: &script{order: []string{"a", "b"}}, Clock: clk, Health: o})
	if err != nil {
		t.Fatal(err)
	}
	req := keyed(7, "t1")
	begin := func(pin string, on []*endpoint.Endpoint) *Call {
		t.Helper()
		c, err := lc.Begin(req, on, pin, clk.t)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	// A response of the key's, pinned to a.
	c := begin("", eps)
	c.Next()
	c.Finish(Outcome{OK: true, CachedTokens: -1, ResponseID: "resp_1"})
	for range 2 {
		c := begin("", eps)
		if ep := c.Next(); ep != a {
			t.Fatalf("went to %s, want a", ep.Name)
		}
		c.Finish(Outcome{Failure: FailRejected, CachedTokens: -1})
	}
	if c := begin("resp_1", eps); c.Ranked()[0] != a || c.Moved() != "" {
		t.Errorf("a request pinned to a ranked %s first, moved %q", c.Ranked()[0].Name, c.Moved())
	}
	if c := begin("", eps[:1]); c.Ranked()[0] != a {
		t.Error("a request with a alone ranked elsewhere")
	}
	c = begin("", eps)
	if c.Ranked()[0] != eps[1] || c.Moved() != MovedRefused {
		t.Errorf("the probe ranked %s first, moved %q; want b, %q", c.Ranked()[0].Name, c.Moved(), MovedRefused)
	}
}

// TestRefusalKeysExpire: a key untouched for keyExpiry refusal windows is forgotten. Before,
// keys were forgotten only to make room: an hour-old flood of many clients' repeated refusals
// outranked a fresh flood's key at the bound (the stalest key without repeated refusals goes
// first), which then went at the next other key, and the fresh flood's second refusal was
// blamed (counted, and told to the policy), as was every other one. What an expired key
// still discounted stays discounted (moved to the endpoint's forgiven tally), and an ejection
// starts that tally again as it starts the endpoint's own: readmitted, an endpoint is judged
// on what it answers then.
func TestRefusalKeysExpire(t *testing.T) {
	clk, eps, o, serve := refusalFleet(t)
	a, b, c := eps[0], eps[1], eps[2]
	fleet := func(base int) {
		for i := range 20 {
			serve(b, keyed(uint64(base+i), ""))
			serve(c, keyed(uint64(base+1000+i), ""))
		}
	}
	fleet(1000)
	for i := range maxRefusalKeys { // many clients, each refused twice at b
		clk.t = clk.t.Add(10 * time.Millisecond)
		serve(b, keyed(uint64(100000+i), ""))
		for range 2 {
			o.Refuse(b, keyed(uint64(900000+i), "other"))
		}
	}
	// An hour on: a fresh flood at a, among other clients' odd bad requests at c.
	clk.t = clk.t.Add(time.Hour)
	fleet(5000)
	bad := keyed(7, "t1")
	if v := o.Refuse(a, bad); !v.Blamed {
		t.Fatal("the flood's first refusal not blamed")
	}
	for i := range 10 {
		clk.t = clk.t.Add(10 * time.Millisecond)
		o.Refuse(c, keyed(uint64(800000+i), "odd"))
	}
	if v := o.Refuse(a, bad); v.Blamed {
		t.Error("the flood's second refusal blamed: its key was forgotten for hour-old ones")
	}
	o.mu.Lock()
	n := len(o.keys)
	o.mu.Unlock()
	if n != 11 {
		t.Errorf("%d keys followed, want 11 (the flood's and the odd ones)", n)
	}

	// The flood goes on for 10 s, then stops; 2.5 windows on, its key is gone, but what it
	// discounted at a still is: 15 other refusals, each blamed, do not eject a.
	for range 100 {
		clk.t = clk.t.Add(100 * time.Millisecond)
		o.Refuse(a, bad)
	}
	clk.t = clk.t.Add(5 * DefaultRefusalWindow / 2)
	fleet(6000)
	for i := range 15 {
		if v := o.Refuse(a, keyed(uint64(700000+i), "")); v.Ejected || !v.Blamed {
			t.Fatalf("a's refusal %d of a fresh key, the flood's key expired: %+v", i+1, v)
		}
	}
	o.mu.Lock()
	_, followed := o.keys[RefusalKey(bad)]
	o.mu.Unlock()
	if followed {
		t.Error("the flood's key still followed 2.5 windows after it was last seen")
	}
	// Ejected (consecutive failures) and readmitted, a is judged on what it answers then: an
	// engine refusing every request is ejected at its 20th refusal.
	for range DefaultConsecutive {
		o.Failed(a, FailStatus)
	}
	clk.t = clk.t.Add(DefaultBaseEjection)
	if !o.Ejected(a, clk.t.Add(-time.Second)) || o.Ejected(a, clk.t) {
		t.Fatal("a not ejected for its failures, or not readmitted")
	}
	fleet(7000)
	for i := range 20 {
		if v := o.Refuse(a, keyed(uint64(600000+i), "")); v.Ejected != (i == 19) {
			t.Fatalf("refusal %d since a's readmission: ejected %v", i+1, v.Ejected)
		}
	}

	// With no key left, Served and Avoid take no lock: the filter is empty again.
	clk.t = clk.t.Add(time.Hour)
	o.Refuse(a, nil) // a refusal without a key sweeps
	if o.tracked.Load() != 0 {
		t.Errorf("%d keys followed an hour after the last", o.tracked.Load())
	}
	for i := range o.filter {
		if o.filter[i].Load() != 0 {
			t.Fatalf("filter word %d not cleared", i)
		}
	}
}
