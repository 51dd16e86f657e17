package des

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/policy"
	"github.com/kvroute/kvroute/internal/workload"
)

// countPicker wraps a registered policy and counts, for one replica, what it is told.
type countPicker struct {
	policy.Picker
	obs                   policy.Observer
	picks, routed, firsts int
	done                  int
	ids                   []string // requests picked for, in order
	sessions              map[string]bool
}

func (c *countPicker) Pick(r *policy.Request, eps []*endpoint.Endpoint) ([]*endpoint.Endpoint, error) {
	c.picks++
	c.ids = append(c.ids, r.ID)
	if r.SessionKey != "" {
		c.sessions[r.SessionKey] = true
	}
	return c.Picker.Pick(r, eps)
}

func (c *countPicker) Routed(r *policy.Request, ep *endpoint.Endpoint) {
	c.routed++
	c.obs.Routed(r, ep)
}

func (c *countPicker) FirstToken(r *policy.Request, ep *endpoint.Endpoint, ttft time.Duration) {
	c.firsts++
	c.obs.FirstToken(r, ep, ttft)
}

func (c *countPicker) Done(r *policy.Request, ep *endpoint.Endpoint, res policy.Result) {
	c.done++
	c.obs.Done(r, ep, res)
}

func (c *countPicker) Removed(ep *endpoint.Endpoint) { c.obs.Removed(ep) }

// counting returns a NewPicker that builds prefix-aware for each replica, wrapped in a
// countPicker appended to *out.
func counting(out *[]*countPicker) NewPicker {
	return func(env policy.Env) (policy.Picker, error) {
		p, err := policy.New("prefix-aware", nil, env)
		if err != nil {
			return nil, err
		}
		c := &countPicker{Picker: p, obs: p.(policy.Observer), sessions: map[string]bool{}}
		*out = append(*out, c)
		return c, nil
	}
}

func TestOneRouterIsTheDefault(t *testing.T) {
	// Routers 0 and 1 are the same single router: same records, same random stream.
	reqs := randomWorkload(200)
	for _, name := range []string{"prefix-aware", "random", "least-request"} {
		cfg := toyConfig(3)
		cfg.Seed = 5
		a := run(t, cfg, reqs, Named(name, nil))
		cfg.Routers = 1
		b := run(t, cfg, reqs, Named(name, nil))
		if diff := cmp.Diff(a.Records, b.Records); diff != "" {
			t.Errorf("%s: routers 0 and 1 differ (-0 +1):\n%s", name, diff)
		}
		if diff := cmp.Diff([]int{200}, b.Routed); diff != "" {
			t.Errorf("%s: routed per replica (-want +got):\n%s", name, diff)
		}
	}
}

func TestRoundRobinSpread(t *testing.T) {
	// Two replicas, round-robin: each policy instance is asked about every other request in
	// arrival order, and hears Routed, FirstToken and Done for exactly those.
	const n = 300
	cfg := toyConfig(3)
	cfg.Routers = 2
	var pickers []*countPicker
	res := run(t, cfg, randomWorkload(n), counting(&pickers))
	if len(pickers) != 2 {
		t.Fatalf("%d policy instances built, want 2", len(pickers))
	}
	if diff := cmp.Diff([]int{n / 2, n / 2}, res.Routed); diff != "" {
		t.Errorf("routed per replica (-want +got):\n%s", diff)
	}
	for k, p := range pickers {
		got := [4]int{p.picks, p.routed, p.firsts, p.done}
		if want := [4]int{n / 2, n / 2, n / 2, n / 2}; got != want {
			t.Errorf("replica %d: picks, routed, first tokens, done = %v, want %v", k, got, want)
		}
		// randomWorkload's arrivals are in ID order.
		for j, id := range p.ids {
			if want := strconv.Itoa(2*j + k); id != want {
				t.Errorf("replica %d: pick %d was request %s, want %s", k, j, id, want)
				break
			}
		}
	}
	for _, r := range res.Records {
		if r.Err != "" {
			t.Errorf("request %s failed: %s", r.ID, r.Err)
		}
	}
}

func TestReplicaCountersAreSeparate(t *testing.T) {
	// One engine, two replicas, scrapes every 100 ms. Request 0 (replica 0) runs from 10 ms for
	// 200+ ms. Request 1 at 50 ms (replica 1): its replica has nothing in flight on sim-0,
	// though the engine is busy. Request 2 at 150 ms (replica 0): one in flight, and the 100 ms
	// snapshot shows request 0 running. Request 3 at 160 ms (replica 1): none in flight of its
	// own (request 1 is done), the same snapshot.
	cfg := toyConfig(1)
	cfg.ScrapeInterval = ms(100)
	cfg.Routers = 2
	reqs := []workload.Request{req(0, ms(10), 4, 200, 1), req(1, ms(50), 4, 1, 2), req(2, ms(150), 4, 1, 3), req(3, ms(160), 4, 1, 4)}
	var spies []*spyPicker
	res := run(t, cfg, reqs, func(env policy.Env) (policy.Picker, error) {
		s := &spyPicker{clock: env.Clock}
		spies = append(spies, s)
		return s, nil
	})
	type view struct {
		Now, At           time.Duration
		Running, InFlight int
	}
	ep := Epoch()
	var got [][]view
	for _, s := range spies {
		var v []view
		for _, x := range s.seen {
			v = append(v, view{x.now.Sub(ep), x.snap.At.Sub(ep), x.snap.Running, x.inFlight})
		}
		got = append(got, v)
	}
	want := [][]view{
		{{ms(10), 0, 0, 0}, {ms(150), ms(100), 1, 1}},
		{{ms(50), 0, 0, 0}, {ms(160), ms(100), 1, 0}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("what each replica saw (-want +got):\n%s", diff)
	}
	// Each replica hears only of its own requests: 0 and 2, 1 and 3.
	for k, s := range spies {
		heard := map[string]bool{}
		for _, c := range s.calls {
			heard[strings.Fields(c)[1]] = true
		}
		want := map[string]bool{strconv.Itoa(k): true, strconv.Itoa(k + 2): true}
		if diff := cmp.Diff(want, heard); diff != "" {
			t.Errorf("replica %d: requests its observer heard of (-want +got):\n%s", k, diff)
		}
	}
	for _, r := range res.Records {
		if r.Err != "" || r.EndpointID != 0 {
			t.Errorf("request %s: endpoint %d err %q, want sim-0 and no error", r.ID, r.EndpointID, r.Err)
		}
	}
}

func TestSessionSpread(t *testing.T) {
	// Three replicas by session: each session's requests all reach one replica; requests
	// without a session go round-robin.
	const n = 240
	reqs := randomWorkload(n)
	for i := range reqs {
		if i%4 != 3 {
			reqs[i].Session = "s" + strconv.Itoa(i%11)
		}
	}
	cfg := toyConfig(3)
	cfg.Routers = 3
	cfg.Spread = SpreadSession
	var pickers []*countPicker
	res := run(t, cfg, reqs, counting(&pickers))
	owner := map[string]int{}
	total := 0
	for k, p := range pickers {
		total += p.picks
		for s := range p.sessions {
			if o, ok := owner[s]; ok {
				t.Errorf("session %s reached replicas %d and %d", s, o, k)
			}
			owner[s] = k
		}
	}
	if total != n || len(owner) != 11 {
		t.Errorf("%d picks, %d sessions seen, want %d and 11", total, len(owner), n)
	}
	used := 0
	for _, c := range res.Routed {
		if c > 0 {
			used++
		}
	}
	if used < 2 {
		t.Errorf("routed per replica %v: 11 sessions on fewer than 2 of 3 replicas", res.Routed)
	}
}

func TestRoutersConfigErrors(t *testing.T) {
	w := Prepare(randomWorkload(3), "toy", 4)
	cfg := toyConfig(1)
	cfg.Routers = -1
	if _, err := Run(context.Background(), cfg, w, "p", Named("round-robin", nil)); err == nil || !strings.Contains(err.Error(), "routers") {
		t.Errorf("-1 routers: err %v, want one naming routers", err)
	}
	if _, err := ParseSpread("sticky"); err == nil || !strings.Contains(err.Error(), "session") {
		t.Errorf("ParseSpread(sticky): err %v, want one listing the valid names", err)
	}
	for _, s := range []Spread{SpreadRoundRobin, SpreadSession} {
		if got, err := ParseSpread(s.String()); err != nil || got != s {
			t.Errorf("ParseSpread(%q) = %v, %v", s.String(), got, err)
		}
	}
}

// deferPicker wraps a registered policy and holds the requests in hold (policy.Deferrer),
// noting when each is picked for.
type deferPicker struct {
	policy.Picker
	clock  policy.Clock
	hold   map[string]time.Duration
	picked map[string]time.Time
}

func (d *deferPicker) Defer(r *policy.Request, eps []*endpoint.Endpoint) time.Duration {
	return d.hold[r.ID]
}

func (d *deferPicker) Pick(r *policy.Request, eps []*endpoint.Endpoint) ([]*endpoint.Endpoint, error) {
	d.picked[r.ID] = d.clock.Now()
	return d.Picker.Pick(r, eps)
}

// A request a replica's policy holds is picked for that much later, by the same replica, and
// the hold counts in its time to first token; the others are picked for as they arrive.
func TestReplicaHoldsWhatItsPolicyDefers(t *testing.T) {
	reqs := randomWorkload(40)
	cfg := toyConfig(3)
	cfg.Routers = 2
	var pickers []*deferPicker
	np := func(env policy.Env) (policy.Picker, error) {
		p, err := policy.New("least-request", nil, env)
		if err != nil {
			return nil, err
		}
		d := &deferPicker{Picker: p, clock: env.Clock, hold: map[string]time.Duration{"7": 5 * time.Millisecond}, picked: map[string]time.Time{}}
		pickers = append(pickers, d)
		return d, nil
	}
	res := run(t, cfg, reqs, np)
	for i, r := range res.Records {
		if r.FirstToken <= 0 {
			t.Fatalf("request %s: no first token (%s)", r.ID, r.Err)
		}
		d := pickers[i%2] // round-robin: request i arrives i-th
		at, ok := d.picked[r.ID]
		if !ok {
			t.Fatalf("request %s: not picked for by replica %d", r.ID, i%2)
		}
		want := Epoch().Add(r.Arrival)
		if r.ID == "7" {
			want = want.Add(5 * time.Millisecond)
			if r.FirstToken-r.Arrival < 5*time.Millisecond {
				t.Errorf("request 7: TTFT %v, want the 5ms hold counted", r.FirstToken-r.Arrival)
			}
		}
		if !at.Equal(want) {
			t.Errorf("request %s: picked for at %v, want %v", r.ID, at.Sub(Epoch()), want.Sub(Epoch()))
		}
	}
}
