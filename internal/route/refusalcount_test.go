package route

import (
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/policy"
)

// counted returns the refusals that count against ep in the refusal rule at now: its tally's
// refusals less its excess (one client's requests refused again).
func (o *Outlier) counted(ep *endpoint.Endpoint, now time.Time) float64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	s := o.st[ep]
	if s == nil {
		return 0
	}
	_, r := s.tally(now, o.cfg.RefusalWindow)
	return r - min(o.excess(now)[ep], r)
}

// TestProbeServedCountsFromThen: the reviewer's case. One client whose bad requests every
// engine refuses (a healthy fleet) sends, on each of nine prefixes cached at a, a burst of ten
// bad requests in flight at once (all go to a), then one valid request of the prefix, which
// the refusal probe sends to b, which serves it. Before, from then on every earlier refusal
// of the key at a counted in full, and the ninth prefix's one bad request ejected a (8 x 10
// refusals); now a probe served elsewhere makes the key's refusals at a count from then on
// alone, at most one more than its answers elsewhere. With a second burst in flight while
// the probe is (refused at a after b served it), each prefix adds 2 at most; nine prefixes
// are not enough. The warm-ups are long past, so that they do not count as a's answers.
func TestProbeServedCountsFromThen(t *testing.T) {
	for _, again := range []bool{false, true} {
		t.Run(fmt.Sprintf("burst in flight with the probe %v", again), func(t *testing.T) {
			r := newFleetRun(t, OutlierConfig{})
			a, b, c := r.eps[0], r.eps[1], r.eps[2]
			lc, clk := r.lc, r.clk
			begin := func(blocks []uint64, on []*endpoint.Endpoint) *Call {
				t.Helper()
				if on == nil {
					on = r.eps
				}
				req := &policy.Request{Model: "m", Tenant: "evil", Blocks: blocks, BlockTokens: 16, PromptTokens: 16*len(blocks) + 5}
				call, err := lc.Begin(req, on, "", clk.t)
				if err != nil {
					t.Fatal(err)
				}
				if call.Next() == nil {
					t.Fatal("no endpoint")
				}
				return call
			}
			serve := func(call *Call) *endpoint.Endpoint {
				clk.t = clk.t.Add(time.Millisecond)
				call.FirstToken()
				call.Finish(Outcome{OK: true, CachedTokens: -1, OutputTokens: 8})
				return call.Endpoint()
			}
			refuse := func(call *Call) *endpoint.Endpoint {
				clk.t = clk.t.Add(time.Millisecond)
				call.Finish(Outcome{Failure: FailRejected, CachedTokens: -1})
				return call.Endpoint()
			}
			const prefixes = 9
			pre := make([][]uint64, prefixes)
			for i := range pre {
				pre[i] = longPrefix(uint64(1e6*(i+1)), 50)
				serve(begin(append(slices.Clone(pre[i]), 1), []*endpoint.Endpoint{a}))
			}
			clk.t = clk.t.Add(5 * DefaultRefusalWindow)
			// Other tenants' traffic at b and c: the fleet a is compared with.
			for i := range 30 {
				ep := []*endpoint.Endpoint{b, c}[i%2]
				serve(begin([]uint64{uint64(5e8 + 2*i), uint64(5e8 + 2*i + 1)}, []*endpoint.Endpoint{ep}))
			}
			refusedAt, probedAt := map[string]int{}, map[string]int{}
			for k, p := range pre {
				var burst []*Call
				for i := range 10 {
					burst = append(burst, begin(append(slices.Clone(p), uint64(100*k+i)), nil))
				}
				for _, call := range burst {
					refusedAt[refuse(call).Name]++
				}
				probe := begin(append(slices.Clone(p), 999), nil)
				var second []*Call
				if again {
					for i := range 10 {
						second = append(second, begin(append(slices.Clone(p), uint64(100*k+50+i)), nil))
					}
				}
				probedAt[serve(probe).Name]++
				for _, call := range second {
					refusedAt[refuse(call).Name]++
				}
			}
			counted := r.o.counted(a, clk.t)
			t.Logf("bad requests refused at %v, the probes served at %v, a's refusals counted %.1f, ejections %v",
				refusedAt, probedAt, counted, r.ejections)
			if r.ejections["a"] > 0 {
				t.Fatalf("a healthy endpoint ejected by one client's bursts and probes: %v", r.ejections)
			}
			if probedAt["b"]+probedAt["c"] < prefixes-1 || refusedAt["a"] < 8*prefixes {
				t.Fatalf("the probes went to %v, the bad requests to %v: the case needs the probes served elsewhere, most bad requests at a", probedAt, refusedAt)
			}
			if counted > 2*prefixes+0.01 {
				t.Errorf("a's refusals counted %.1f, want at most 2 a prefix (%d)", counted, 2*prefixes)
			}
		})
	}
}

// TestRefusalsCountWithinServedElsewhere: a key refused at a and served by b counts at a from
// when b served it, not before, and at most 1 + b's answers of it (fading): b serving it once
// lets one more refusal count, three more answers three more.
func TestRefusalsCountWithinServedElsewhere(t *testing.T) {
	clk, eps, o, serve := refusalFleet(t)
	a, b, c := eps[0], eps[1], eps[2]
	for i := range 20 {
		serve(b, keyed(uint64(1000+i), ""))
		serve(c, keyed(uint64(2000+i), ""))
	}
	key := keyed(7, "t1")
	refuse := func(n int) (blamed int) {
		for range n {
			clk.t = clk.t.Add(10 * time.Millisecond)
			v := o.Refuse(a, key)
			if v.Ejected {
				t.Fatal("a ejected for one key's refusals")
			}
			if v.Blamed {
				blamed++
			}
		}
		return blamed
	}
	near := func(got, want float64) bool { return math.Abs(got-want) < 0.1 }
	if n := refuse(10); n != 1 {
		t.Errorf("%d of 10 refusals blamed, no one serving the key: want the first", n)
	}
	serve(b, key)
	if n := refuse(5); n != 1 {
		t.Errorf("%d of 5 refusals blamed after b served the key once: want 1 (1 + 1 in all)", n)
	}
	if got := o.counted(a, clk.t); !near(got, 2) {
		t.Errorf("a's refusals counted %.2f, want 2: the 9 excused before b served the key stay excused", got)
	}
	for range 3 {
		serve(b, key)
	}
	if n := refuse(5); n != 3 {
		t.Errorf("%d of 5 refusals blamed after b served the key 4 times: want 3 (1 + 4 in all)", n)
	}
	if got := o.counted(a, clk.t); !near(got, 5) {
		t.Errorf("a's refusals counted %.2f, want 5", got)
	}
	// The bound fades with b's answers: 1.5 windows on, 4 x e^-1.5 = 0.89 of them are left,
	// and 5 x e^-1.5 = 1.12 of a's counted refusals: one more counts (to the nearest), not 4.
	clk.t = clk.t.Add(DefaultRefusalWindow * 3 / 2)
	if n := refuse(5); n != 1 {
		t.Errorf("%d refusals blamed with b's answers faded to %.2f, want 1", n, 4*math.Exp(-1.5))
	}
}

// TestRefusalEjectionNeedsTwoKeys: an endpoint refusing one key that another serves is not
// ejected for it alone, however many of its refusals count: a broken engine refuses everyone's
// requests, and one key is one client's. A refusal of a second key that counts ejects it.
func TestRefusalEjectionNeedsTwoKeys(t *testing.T) {
	clk, eps, o, serve := refusalFleet(t)
	a, b, c := eps[0], eps[1], eps[2]
	for i := range 20 {
		serve(c, keyed(uint64(2000+i), ""))
	}
	key := keyed(7, "t1")
	o.Refuse(a, key) // followed from its first refusal
	for range 40 {
		serve(b, key)
	}
	for i := range 30 {
		clk.t = clk.t.Add(10 * time.Millisecond)
		if v := o.Refuse(a, key); v.Ejected || !v.Blamed {
			t.Fatalf("a's refusal %d of a key b served 40 times: %+v, want blamed, not ejected", i+1, v)
		}
	}
	if got := o.counted(a, clk.t); got < 30.9 {
		t.Fatalf("a's refusals counted %.1f, want 31", got)
	}
	if v := o.Refuse(a, keyed(9, "t2")); !v.Blamed || !v.Ejected {
		t.Errorf("a's refusal of a second key: %+v, want blamed and a ejected", v)
	}
}

// TestProbeSkipsUnusable: the refusal probe goes to the first endpoint ranked after the
// avoided one that is neither backed off (429) nor stalling, whatever its place; with none,
// there is no probe, and the key's next request, once one is usable, probes.
func TestProbeSkipsUnusable(t *testing.T) {
	clk := &stepClock{t: time.Unix(100, 0)}
	eps := pool(t, "a", "b", "c")
	a, b, c := eps[0], eps[1], eps[2]
	o := NewOutlier(OutlierConfig{}, clk)
	lc, err := New(Config{Picker: &script{order: []string{"a", "b", "c"}}, Clock: clk, Health: o})
	if err != nil {
		t.Fatal(err)
	}
	req := keyed(7, "t1")
	first := func(on []*endpoint.Endpoint) (string, string) {
		t.Helper()
		c, err := lc.Begin(req, on, "", clk.t)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range c.Ranking() {
			names = append(names, e.Name)
		}
		return fmt.Sprint(names), c.Moved()
	}
	o.Refuse(a, req)
	o.Refuse(a, req)
	// Two endpoints, b backed off: no probe.
	o.Backoff(b, clk.t, 5*time.Second)
	if got, moved := first(eps[:2]); got != "[a b]" || moved != "" {
		t.Errorf("b backed off: ranked %s, moved %q; want [a b], not moved", got, moved)
	}
	// b backed off, c stalling: no probe.
	c.Stalled(clk.t.Add(-time.Minute).UnixNano(), clk.t.UnixNano())
	if got, moved := first(eps); got != "[a b c]" || moved != "" {
		t.Errorf("b backed off, c stalling: ranked %s, moved %q; want [a b c], not moved", got, moved)
	}
	// b's backoff over: the probe, not used up by the requests before, goes to b.
	clk.t = clk.t.Add(6 * time.Second)
	if got, moved := first(eps); got != "[b a c]" || moved != MovedRefused {
		t.Errorf("b usable: ranked %s, moved %q; want [b a c], %q", got, moved, MovedRefused)
	}

	// b stalling, its stall probe due (backoffLast leaves it second): the probe goes to c.
	clk.t = clk.t.Add(time.Hour)
	c.Progressed(clk.t.UnixNano())
	b.Stalled(clk.t.Add(-time.Minute).UnixNano(), clk.t.UnixNano())
	clk.t = clk.t.Add(stallProbeEvery + time.Second)
	o.Refuse(a, req)
	o.Refuse(a, req)
	if got, moved := first(eps); got != "[c a b]" || moved != MovedRefused {
		t.Errorf("b stalling: ranked %s, moved %q; want [c a b], %q", got, moved, MovedRefused)
	}
}

// TestDropKeyFilter: at the bound each new key refused drops another, and the filter is
// updated in the same pass over the keys: it stays exactly the bits of the keys followed,
// a bit shared by a dropped key and a kept one staying set.
func TestDropKeyFilter(t *testing.T) {
	clk := &stepClock{t: time.Unix(100, 0)}
	eps := pool(t, "a", "b")
	o := NewOutlier(OutlierConfig{RefusalPercent: -1}, clk)
	for i := range 3 * maxRefusalKeys {
		clk.t = clk.t.Add(time.Millisecond)
		// Pairs of keys 4096 apart share a filter bit; every third key is refused twice,
		// so that both kinds of key are dropped.
		k := keyed(uint64(1e6+filterBits*(i%2)+i/2), "")
		o.Refuse(eps[i%2], k)
		if i%3 == 0 {
			o.Refuse(eps[i%2], k)
		}
		o.mu.Lock()
		var want [filterBits / 64]uint64
		for key := range o.keys {
			want[key/64%(filterBits/64)] |= 1 << (key % 64)
		}
		n := len(o.keys)
		for w := range want {
			if got := o.filter[w].Load(); got != want[w] {
				o.mu.Unlock()
				t.Fatalf("after key %d: filter word %d %#x, want %#x", i, w, got, want[w])
			}
		}
		o.mu.Unlock()
		if n > maxRefusalKeys {
			t.Fatalf("%d keys followed", n)
		}
	}
}

// BenchmarkOutlierRefuseNewKey is a refusal of a key not followed with maxRefusalKeys
// followed: the bound drops one (dropKey), under the Outlier's lock. The refusal rule is off,
// which leaves the keys' part alone.
func BenchmarkOutlierRefuseNewKey(b *testing.B) {
	p := endpoint.NewPool()
	if _, err := p.Update([]endpoint.Spec{{Name: "a"}, {Name: "b"}, {Name: "c"}}); err != nil {
		b.Fatal(err)
	}
	eps := p.All()
	clk := &stepClock{t: time.Unix(100, 0)}
	o := NewOutlier(OutlierConfig{RefusalPercent: -1}, clk)
	for i := range maxRefusalKeys {
		for range 2 {
			o.Refuse(eps[i%3], keyed(uint64(1e6+i), "flood"))
		}
	}
	reqs := make([]*policy.Request, 4096)
	for i := range reqs {
		reqs[i] = keyed(uint64(1e8+2*i), "")
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		o.Refuse(eps[i%3], reqs[i%len(reqs)])
		i++
	}
}
