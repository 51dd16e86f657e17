package route

import (
	"fmt"
	"math/rand/v2"
	"slices"
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

// keyed is a request whose first prompt block is key (RefusalKey), from tenant.
func keyed(key uint64, tenant string) *policy.Request {
	return &policy.Request{Model: "m", Tenant: tenant, Blocks: []uint64{key, key + 1}, BlockTokens: 16, PromptTokens: 40}
}

// refusalFleet is the refusal rule's tests' set-up: endpoints a, b and c, a clock at 100 s, and
// passive health checking over them with its defaults (its Fleet the three); serve tells it
// that ep served req, as the lifecycle does (Succeeded, then Served).
func refusalFleet(t *testing.T) (clk *stepClock, eps []*endpoint.Endpoint, o *Outlier, serve func(ep *endpoint.Endpoint, req *policy.Request)) {
	t.Helper()
	clk = &stepClock{t: time.Unix(100, 0)}
	eps = pool(t, "a", "b", "c")
	o = NewOutlier(OutlierConfig{Fleet: func() int { return len(eps) }}, clk)
	serve = func(ep *endpoint.Endpoint, req *policy.Request) {
		o.Succeeded(ep)
		o.Served(ep, req)
	}
	return clk, eps, o, serve
}

// TestOutlierOneClientsRefusals: one client's bad requests that all go to one endpoint (the same
// prefix, which prefix-aware keeps together), refused there and seen nowhere else, count once:
// the endpoint is not ejected, and only the first refusal is blamed on it. Once another
// endpoint serves that key, the refusals count from then on (an engine refusing what the
// others serve), within one more than the answers elsewhere; those of an engine that refuses
// many keys all count.
func TestOutlierOneClientsRefusals(t *testing.T) {
	clk := &stepClock{t: time.Unix(100, 0)}
	eps := pool(t, "a", "b", "c")
	a, b, c := eps[0], eps[1], eps[2]
	o := NewOutlier(OutlierConfig{Fleet: func() int { return len(eps) }}, clk)
	serve := func(ep *endpoint.Endpoint, req *policy.Request) {
		o.Succeeded(ep)
		o.Served(ep, req)
	}
	for i := range 20 { // the good traffic: each request its own prefix
		serve(b, keyed(uint64(1000+i), ""))
		serve(c, keyed(uint64(2000+i), ""))
	}
	bad := keyed(7, "t1")
	var blamed int
	for i := range 200 {
		clk.t = clk.t.Add(100 * time.Millisecond)
		ejected, blame := o.RefusedRequest(a, bad)
		if ejected {
			t.Fatalf("a ejected at the bad client's %dth refusal", i+1)
		}
		if blame {
			blamed++
		}
		if i%10 == 0 {
			serve(b, keyed(uint64(3000+i), ""))
			serve(c, keyed(uint64(4000+i), ""))
		}
	}
	if blamed != 1 {
		t.Errorf("%d of the bad client's 200 refusals blamed on a, want the first alone", blamed)
	}
	// Another tenant's request with the same first block is another key.
	if _, blame := o.RefusedRequest(a, keyed(7, "t2")); !blame {
		t.Error("another tenant's refusal not blamed on a")
	}
	// b serves the key: a refuses what the others serve, and its refusals count from then on,
	// at most one more than b's answers of the key (here 1 + 1; before, all 200 earlier ones
	// counted too, and a was ejected): the next is blamed, the 40 after it are not, and one
	// key's refusals alone eject nothing.
	serve(b, keyed(7, "t1"))
	if _, blame := o.RefusedRequest(a, bad); !blame {
		t.Error("a's refusal of a key b serves not blamed on a")
	}
	for i := range 40 {
		if ejected, blame := o.RefusedRequest(a, bad); ejected || blame {
			t.Fatalf("a's refusal %d after b served the key: ejected %v, blamed %v; want neither", i+2, ejected, blame)
		}
	}

	// An engine that refuses every request, each its own prefix, is ejected at its 20th
	// refusal (DefaultRefusalVolume), blamed for each.
	clk.t = clk.t.Add(time.Hour)
	o = NewOutlier(OutlierConfig{Fleet: func() int { return len(eps) }}, clk)
	for i := range 20 {
		serve(b, keyed(uint64(1000+i), ""))
		serve(c, keyed(uint64(2000+i), ""))
	}
	for i := range 20 {
		ejected, blame := o.RefusedRequest(a, keyed(uint64(5000+i), ""))
		if !blame {
			t.Errorf("refusal %d of a fresh key not blamed", i+1)
		}
		if ejected != (i == 19) {
			t.Errorf("refusal %d: ejected %v", i+1, ejected)
		}
	}
	// Forgotten, a leaves no key behind.
	o.Forget(a)
	o.mu.Lock()
	for key, k := range o.keys {
		if k.tally(a) != nil {
			t.Errorf("key %d keeps a's tally after Forget", key)
		}
	}
	o.mu.Unlock()
}

// TestOneClientsRefusalsStay: the reviewer's case, in process: prefix-aware, three endpoints,
// good traffic of unique prompts, and one client whose requests share a prefix cached on one
// endpoint and are refused (400: max_tokens past the model's length) wherever they go. The
// bad client's requests stay on that endpoint (but for one probe of another, which refuses it
// too), which is not ejected, and the good traffic is shared as if the bad client were not
// there. Before, the endpoint cost twice its cost or more
// for each refusal (the policy heard each one as a failed attempt), the good traffic left it,
// and the refusal rule then ejected it (its answers all refusals, the others' none), sending
// the bad client to the other endpoints; with the rule off, the good traffic left it all the
// same.
func TestOneClientsRefusalsStay(t *testing.T) {
	run := func(withBad bool, refusalPercent int) (good, bad map[string]int, ejections int) {
		clk := &stepClock{t: time.Unix(100, 0)}
		p, err := policy.New("prefix-aware", nil, policy.Env{Rand: rand.New(rand.NewPCG(1, 2)), Clock: clk})
		if err != nil {
			t.Fatal(err)
		}
		eps := pool(t, "a", "b", "c")
		o := NewOutlier(OutlierConfig{Fleet: func() int { return len(eps) }, RefusalPercent: refusalPercent,
			OnRefusals: func(*endpoint.Endpoint, time.Duration, float64, float64) { ejections++ }}, clk)
		lc, err := New(Config{Picker: p, Clock: clk, Health: o})
		if err != nil {
			t.Fatal(err)
		}
		good, bad = map[string]int{}, map[string]int{}
		prefix := make([]uint64, 300) // a long shared prefix (4,800 tokens)
		for i := range prefix {
			prefix[i] = uint64(1e6 + i)
		}
		send := func(blocks []uint64, refuse bool) string {
			t.Helper()
			req := &policy.Request{Model: "m", Blocks: blocks, BlockTokens: 16, PromptTokens: 16*len(blocks) + 5}
			c, err := lc.Begin(req, eps, "", clk.t)
			if err != nil {
				t.Fatal(err)
			}
			ep := c.Next()
			if ep == nil {
				t.Fatal("no endpoint")
			}
			clk.t = clk.t.Add(5 * time.Millisecond)
			if refuse {
				c.Finish(Outcome{Failure: FailRejected, CachedTokens: -1})
			} else {
				c.FirstToken()
				clk.t = clk.t.Add(20 * time.Millisecond)
				c.Finish(Outcome{OK: true, CachedTokens: -1, OutputTokens: 8})
			}
			return ep.Name
		}
		warm := send(append(slices.Clone(prefix), 1), false) // the prefix cached on one endpoint
		for range 2 {
			send(append(slices.Clone(prefix), 2), false)
		}
		// 40 s: a good request every 75 ms (two workers, one each 150 ms), a bad one every 100 ms.
		for i := range 400 {
			clk.t = clk.t.Add(100 * time.Millisecond)
			for w := range 2 {
				blocks := []uint64{uint64(1e7 + 100*i + 10*w), uint64(1e7 + 100*i + 10*w + 1)}
				if i%3 != 2 { // about 2 of 3 turns (150 ms a request, each worker)
					good[send(blocks, false)]++
				}
			}
			if withBad {
				bad[send(append(slices.Clone(prefix), uint64(1e8+i)), true)]++
			}
		}
		// The bad client's endpoint is the warm one.
		// One request of the bad client probes another endpoint (Outlier.Avoid: once a refusal
		// window, longer than the run), which refuses it too: the rest stay where the prefix is.
		if bad[warm] < 400-1 && withBad {
			t.Errorf("the bad client's requests went to %v: want %s, where their prefix is cached, but for one probe", bad, warm)
		}
		return good, bad, ejections
	}
	goodAlone, _, _ := run(false, 0)
	// The refusal rule on, and off (the policy's charge alone).
	for _, percent := range []int{0, -1} {
		good, bad, ejections := run(true, percent)
		t.Logf("refusal_percent %d: good traffic alone %v; with the bad client: good %v, bad %v, %d ejections",
			percent, goodAlone, good, bad, ejections)
		if ejections != 0 {
			t.Errorf("%d ejections for the bad client's refusals", ejections)
		}

		for _, name := range []string{"a", "b", "c"} {
			if lo := goodAlone[name] * 3 / 4; good[name] < lo {
				t.Errorf("%s served %d good requests with the bad client, %d without it", name, good[name], goodAlone[name])
			}
		}
	}
}

// TestOneClientsRefusalsOutlastOtherKeys: the reviewer's case. One client's flood of one key
// at a is not held against a (TestOutlierOneClientsRefusals) however many other keys are
// refused once elsewhere in the meantime: 260 other clients' odd bad requests, each refused
// once at b or c among plenty of good traffic, while the flooding client pauses. Before, they
// pushed the flood's key out of the 256 followed (the stalest went first), and its refusals,
// still in a's own tally, counted in full at its next refusal: a was ejected, and blamed.
func TestOneClientsRefusalsOutlastOtherKeys(t *testing.T) {
	clk, eps, o, serve := refusalFleet(t)
	a, b, c := eps[0], eps[1], eps[2]
	for i := range 20 {
		serve(b, keyed(uint64(1000+i), ""))
		serve(c, keyed(uint64(2000+i), ""))
	}
	bad := keyed(7, "t1")
	for i := range 100 { // a burst of 100 over 10 s
		clk.t = clk.t.Add(100 * time.Millisecond)
		if ejected, _ := o.RefusedRequest(a, bad); ejected {
			t.Fatalf("a ejected at the flood's %dth refusal (before other keys)", i+1)
		}
	}
	for i := range 260 { // the client pauses 20 s; meanwhile 13 other refusals a second
		clk.t = clk.t.Add(20 * time.Second / 260)
		ep := b
		if i%2 == 1 {
			ep = c
		}
		for j := range 10 {
			serve(ep, keyed(uint64(100000+10*i+j), ""))
		}
		if ejected, _ := o.RefusedRequest(ep, keyed(uint64(900000+i), "other")); ejected {
			t.Fatalf("%s ejected for other clients' bad requests, refused once each", ep.Name)
		}
	}
	o.mu.Lock()
	_, followed := o.keys[RefusalKey(bad)]
	n := len(o.keys)
	o.mu.Unlock()
	if !followed || n != maxRefusalKeys {
		t.Errorf("flood's key followed %v among %d keys, want true among %d", followed, n, maxRefusalKeys)
	}
	ejected, blamed := o.RefusedRequest(a, bad)
	if ejected || blamed {
		t.Errorf("the flood's 101st refusal at a: ejected %v, blamed %v; want neither", ejected, blamed)
	}
}

// TestForgivenRefusalsOutlastKeys: where every key followed holds repeated refusals (many
// clients each refused again), the flood's key goes like any other once the stalest, but its
// excess stays with a (forgiven, fading): a is not ejected for it, nor b and c for the other
// clients' repeated refusals; and the forgiven refusals fade with the window, so that an
// engine that then refuses everything is ejected as it would be without them.
func TestForgivenRefusalsOutlastKeys(t *testing.T) {
	clk, eps, o, serve := refusalFleet(t)
	a, b, c := eps[0], eps[1], eps[2]
	for i := range 20 {
		serve(b, keyed(uint64(1000+i), ""))
		serve(c, keyed(uint64(2000+i), ""))
	}
	bad := keyed(7, "t1")
	for i := range 100 {
		clk.t = clk.t.Add(100 * time.Millisecond)
		if ejected, _ := o.RefusedRequest(a, bad); ejected {
			t.Fatalf("a ejected at the flood's %dth refusal (before other keys)", i+1)
		}
	}
	for i := range 260 { // 260 other clients, each refused twice
		clk.t = clk.t.Add(20 * time.Second / 260)
		ep := b
		if i%2 == 1 {
			ep = c
		}
		for j := range 10 {
			serve(ep, keyed(uint64(100000+10*i+j), ""))
		}
		for range 2 {
			if ejected, _ := o.RefusedRequest(ep, keyed(uint64(900000+i), "other")); ejected {
				t.Fatalf("%s ejected for other clients' bad requests, refused twice each", ep.Name)
			}
		}
	}
	o.mu.Lock()
	_, followed := o.keys[RefusalKey(bad)]
	o.mu.Unlock()
	if followed {
		t.Fatal("flood's key still followed: the case needs it dropped")
	}
	for i := range 20 {
		if ejected, _ := o.RefusedRequest(a, bad); ejected {
			t.Fatalf("a ejected at the flood's refusal %d, after its key was dropped", 101+i)
		}
	}
	// Ten windows on, what was forgiven has faded: an engine refusing every request, each its
	// own prefix, is ejected at its 20th refusal.
	clk.t = clk.t.Add(10 * DefaultRefusalWindow)
	for i := range 20 {
		serve(b, keyed(uint64(3000+i), ""))
		serve(c, keyed(uint64(4000+i), ""))
	}
	for i := range 20 {
		if ejected, _ := o.RefusedRequest(a, keyed(uint64(5000+i), "")); ejected != (i == 19) {
			t.Fatalf("refusal %d of a fresh key, the flood forgiven 10 windows ago: ejected %v", i+1, ejected)
		}
	}
}
