package policy

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/internal/endpoint"
)

// bound reports, for each endpoint of eps, whether Explain puts it within the load bound.
func bound(pa *prefixAware, r *Request, eps []*endpoint.Endpoint) map[int]bool {
	out := map[int]bool{}
	for _, x := range pa.Explain(r, eps) {
		out[x.Endpoint.ID] = x.WithinBound
	}
	return out
}

// Four instances served for 100 s, then four more joined. A conversation's home holds 6
// requests in flight and the other old instances 4: over the bound of a fleet of eight (5 for
// 19 in flight), within that of the four it had (10). Right after the scale-up the home keeps
// the conversation; as the newcomers' time in the fleet approaches the affinity window (the
// old instances' counted up to it too), their shares count in full and the bound moves it.
// With all eight in the fleet from the start it is moved at once.
func TestPrefixAware_NewcomersShareByTimeInFleet(t *testing.T) {
	ctx := seq(1, 300)
	next := req("next", 0, append(append([]uint64{}, ctx...), seq(9000, 10)...)...)
	setup := func(pa *prefixAware, clk *fakeClock, eps []*endpoint.Endpoint, joinedLate bool) {
		t.Helper()
		first := eps
		if joinedLate {
			first = eps[:4]
		}
		mustPick(t, pa, req("hello", 0, 1), first) // the policy's first sight of these
		warmWith(t, pa, req("ctx", 0, ctx...), eps[0])
		for i := range 4 {
			for range 4 + 2*b2i(i == 0) {
				eps[i].Start(100)
			}
		}
		clk.t = clk.t.Add(100 * time.Second)
	}

	pa, clk := newPA(t, nil)
	eps := newEndpoints(8, 1<<20)
	setup(pa, clk, eps, true)
	if got := bound(pa, next, eps); !got[0] {
		t.Errorf("just after four joined: home within bound %v, want true (ranking %v)", got[0], ids(mustPick(t, pa, next, eps)))
	}
	if got := mustPick(t, pa, next, eps); got[0].ID != 0 {
		t.Errorf("just after four joined: ranking %v, want the home 0 first", ids(got))
	}
	clk.t = clk.t.Add(30 * time.Second) // newcomers: 30 s of the affinity window's 60
	if got := bound(pa, next, eps); !got[0] {
		t.Error("30 s after: home out of bound, want within (limit 7 at shares 4 + 4 x 0.5)")
	}
	clk.t = clk.t.Add(30 * time.Second) // a whole window: established, however long the others were
	if got := bound(pa, next, eps); got[0] {
		t.Error("60 s after: home within bound, want out (limit 5 of a fleet of eight)")
	}

	pb, clkB := newPA(t, nil)
	epsB := newEndpoints(8, 1<<20)
	setup(pb, clkB, epsB, false)
	if got := mustPick(t, pb, next, epsB); got[0].ID == 0 {
		t.Errorf("all eight from the start: ranking %v, want the home 0 (over the bound) not first", ids(got))
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// New content goes where the cache filled slowest per second in the fleet: an instance that
// joined 10 s ago and took 20 blocks in fills faster than one that took 40 in 100 s, though
// it holds less. Where both were there from the start, the one that holds less takes it.
func TestPrefixAware_PressureByFillPerTimeInFleet(t *testing.T) {
	for _, c := range []struct {
		name     string
		lateJoin bool
		want     []int
	}{
		{"1 joined 90 s after 0", true, []int{0, 1}},
		{"both from the start", false, []int{1, 0}},
	} {
		pa, clk := newPA(t, nil)
		eps := newEndpoints(2, 16*100) // 100 blocks each
		if c.lateJoin {
			mustPick(t, pa, req("hello", 0, 1), eps[:1])
			clk.t = clk.t.Add(90 * time.Second)
		}
		mustPick(t, pa, req("hello", 0, 2), eps)
		warmWith(t, pa, req("fill0", 0, seq(1000, 40)...), eps[0])
		warmWith(t, pa, req("fill1", 0, seq(2000, 20)...), eps[1])
		clk.t = clk.t.Add(10 * time.Second)
		if diff := cmp.Diff(c.want, ids(mustPick(t, pa, req("cold", 0, seq(9000, 20)...), eps))); diff != "" {
			t.Errorf("%s: ranking (-want +got):\n%s", c.name, diff)
		}
	}
}

// Copying the fleet's common prefix (a tool prompt three of four instances hold) to the one
// that lacks it is not charged in the ranking, only in the request's predicted TTFT: a new
// session goes to the instance whose cache filled least, although it waits there for the copy.
// Charged, the copy (200 blocks) outweighs the difference in cache pressure.
func TestPrefixAware_CommonPrefixCopyNotCharged(t *testing.T) {
	pa, _ := newPA(t, Params{"max_load_factor": "100"})
	eps := newEndpoints(4, 16*1000)
	tool := seq(1, 200)
	mustPick(t, pa, req("hello", 0, 1), eps)
	for i := range 3 {
		warmWith(t, pa, req("tool", 0, tool...), eps[i])
	}
	warmWith(t, pa, req("other", 0, seq(50000, 100)...), eps[3]) // half the others' fill
	first := req("new", 0, append(append([]uint64{}, tool...), seq(500000, 100)...)...)
	ex := pa.Explain(first, eps)
	if ex[0].Endpoint.ID != 3 {
		t.Fatalf("ranking %v, want 3 (least filled; lacks the common prefix) first", ids(mustPick(t, pa, first, eps)))
	}
	ttft := map[int]time.Duration{}
	for _, x := range ex {
		ttft[x.Endpoint.ID] = x.PredictedTTFT
	}
	if ttft[3] <= ttft[0] {
		t.Errorf("predicted TTFT on 3 %v, on 0 %v: want 3's longer (it computes the tool prompt)", ttft[3], ttft[0])
	}
}
