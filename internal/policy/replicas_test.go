package policy

import (
	"math"
	"testing"
	"time"
)

// Two replicas with the same picture of an idle fleet: with their placements reaching each
// other late, the one of rank 1 takes the place one router would give a second request like
// the first, not the first's; with no delay, or alone, both take the best one. A request whose
// prefix one endpoint holds goes there whatever the rank.
func TestPrefixAware_ReplicasTakeTheirOwnPlaces(t *testing.T) {
	pick := func(n, rank int, lag time.Duration, warm bool) int {
		pa, _ := newPA(t, nil)
		pa.SetReplicas(n, rank, lag)
		eps := newEndpoints(4, 1<<20)
		if warm {
			a := req("a", 5, seq(1, 100)...)
			finish(pa, a, route(t, pa, a, eps[2:3]), 0, -1) // only endpoint 2 holds it
		}
		r := req("b", 5, append(seq(1, 100), 7)...)
		return mustPick(t, pa, r, eps)[0].ID
	}
	one := pick(1, 0, 0, false)
	if got := pick(2, 0, time.Millisecond, false); got != one {
		t.Errorf("rank 0 of 2 picked %d, want %d (one router's pick)", got, one)
	}
	if got := pick(2, 1, time.Millisecond, false); got == one {
		t.Errorf("rank 1 of 2 picked %d, rank 0's: the two herd", got)
	}
	if got := pick(2, 1, 0, false); got != one {
		t.Errorf("rank 1 with no delay picked %d, want %d (it hears of rank 0's placement first)", got, one)
	}
	if got := pick(1, 1, time.Millisecond, false); got != one {
		t.Errorf("a lone replica picked %d, want %d", got, one)
	}
	for rank := range 4 {
		if got := pick(4, rank, time.Millisecond, true); got != 2 {
			t.Errorf("rank %d of 4 sent the follow-up to %d, want 2 (holds its prefix)", rank, got)
		}
	}
}

// The peers' unseen requests are counted by the clumps of this replica's own: three placed at
// one instant and one alone count as clumps of 3, 3, 3 and 1 (averaged per placement), and a
// replayed placement is no clump of this replica's. The cost they add falls on the endpoints
// the fleet's recent requests went to.
func TestPrefixAware_UnseenPeersFollowClumps(t *testing.T) {
	pa, clk := newPA(t, nil)
	pa.SetReplicas(2, 0, 10*time.Millisecond)
	eps := newEndpoints(2, 1<<20)
	for i := range 3 {
		route(t, pa, req(string(rune('a'+i)), 5, seq(uint64(100*i), 10)...), eps[:1])
	}
	remote := req("", 5, seq(900, 10)...)
	remote.Remote = true
	clk.t = clk.t.Add(time.Second)
	pa.Routed(remote, eps[0])
	if n := pa.replicas.clumpN; n != 3 {
		t.Errorf("clump of %d after a replayed placement, want 3 (not this replica's)", n)
	}
	route(t, pa, req("d", 5, seq(500, 10)...), eps[:1]) // closes the clump of 3
	clk.t = clk.t.Add(time.Second)
	u := pa.replicas.unseen(req("e", 5, seq(700, 10)...), clk.t.UnixNano())
	if want := 1 + 2*(1-0.98*0.98*0.98); math.Abs(u.count-want) > 1e-9 {
		t.Errorf("unseen count %g, want %g (one peer; from 1, a clump of 3 counted 3 times)", u.count, want)
	}
	now := clk.t.UnixNano()
	if busy, idle := u.delay(pa.state(0), 1000, now), u.delay(pa.state(1), 1000, now); !(busy > 0 && idle == 0) {
		t.Errorf("unseen delay %g where the fleet's requests went, %g where none did; want > 0 and 0", busy, idle)
	}
	pa.SetReplicas(2, 0, 0)
	if u := pa.replicas.unseen(req("e", 5, seq(700, 10)...), now); u.peers != 0 || u.delay(pa.state(0), 1000, now) != 0 {
		t.Errorf("with no delay: %+v, want no unseen peers", u)
	}
}

// A request larger than the fleet's recent mean is held until its turn: one slot of n sync
// delays for each doubling of its work over the mean, the first included, and within it the
// delay of its replica's rank, never as long as its own prefill; a smaller one, a lone
// replica or a delay of 0 holds nothing.
func TestPrefixAware_DefersLargeRequests(t *testing.T) {
	hold := func(n, rank int, lag time.Duration, blocks uint64) time.Duration {
		pa, clk := newPA(t, nil)
		pa.SetReplicas(n, rank, lag)
		remote := &Request{Remote: true}
		for range 10 {
			pa.replicas.routed(pa.state(0), remote, 1000, clk.t.UnixNano()) // the mean: 1000
		}
		return pa.Defer(req("x", 0, seq(1, blocks)...), newEndpoints(2, 1<<20))
	}
	ms := time.Millisecond
	for _, c := range []struct {
		n, rank int
		lag     time.Duration
		blocks  uint64 // 16 tokens each: work 16 x blocks, and its attention
		want    time.Duration
	}{
		{2, 0, ms, 50, 0},                 // work 808 (800 tokens, 8 of attention): below the mean
		{2, 0, ms, 70, ms},                // 1,135: above it, short of twice: the first slot
		{2, 1, ms, 70, 2 * ms},            // rank 1 after rank 0
		{4, 3, ms, 70, 4 * ms},            // rank 3 of 4 after ranks 0 to 2
		{4, 0, ms, 1000, 17 * ms},         // 19,200: four doublings and more, four slots of 4 first
		{4, 2, ms, 1000, 19 * ms},         // the same, rank 2
		{2, 0, 500 * ms, 1000, 1500 * ms}, // its prefill takes 1.92 s: three delays fit
		{2, 1, 2 * time.Second, 1000, 0},  // none fits
		{1, 0, ms, 1000, 0},               // alone
		{2, 1, 0, 1000, 0},                // no delay
	} {
		if got := hold(c.n, c.rank, c.lag, c.blocks); got != c.want {
			t.Errorf("%d replicas, rank %d, %v late, %d blocks: held %v, want %v", c.n, c.rank, c.lag, c.blocks, got, c.want)
		}
	}
}

// A request held to its turn is placed as one router would place it, with no unseen peers
// counted and no rank's place taken apart from them (rank 1 of 2 takes the first place, where
// the same request unheld takes the second); once placed, or a minute past a turn it never
// took (its client left), it is forgotten.
func TestPrefixAware_HeldRequestPlacesAsAlone(t *testing.T) {
	eps := newEndpoints(4, 1<<20)
	lone, _ := newPA(t, nil)
	one := mustPick(t, lone, req("x", 0, seq(1, 1000)...), eps)[0].ID

	pa, clk := newPA(t, nil)
	pa.SetReplicas(2, 1, time.Millisecond)
	remote := &Request{Remote: true}
	for range 10 {
		pa.replicas.routed(pa.state(0), remote, 1000, clk.t.UnixNano()) // the mean: 1000
	}
	x, y := req("x", 0, seq(1, 1000)...), req("y", 0, seq(1, 1000)...)
	if d := pa.Defer(x, eps); d != 10*time.Millisecond {
		t.Fatalf("held %v, want 10ms (four doublings over the mean: the fifth slot of 2, rank 1)", d)
	}
	now := clk.t.UnixNano()
	if u := pa.replicas.unseen(x, now); u.peers != 0 {
		t.Errorf("held request: %+v, want no unseen peers", u)
	}
	if u := pa.replicas.unseen(y, now); u.peers != 1 {
		t.Errorf("the same request unheld: %+v, want one peer", u)
	}
	if got := mustPick(t, pa, y, eps)[0].ID; got == one {
		t.Errorf("unheld, rank 1 picked %d, one router's pick: want the second place", got)
	}
	if got := route(t, pa, x, eps).ID; got != one {
		t.Errorf("held, rank 1 picked %d, want %d (one router's pick)", got, one)
	}
	if u := pa.replicas.unseen(x, now); u.peers != 1 {
		t.Errorf("placed, the request is still held: %+v", u)
	}

	z, w := req("z", 0, seq(5000, 1000)...), req("w", 0, seq(9000, 1000)...)
	if pa.Defer(z, eps) == 0 {
		t.Fatal("z not held")
	}
	clk.t = clk.t.Add(2 * time.Minute)
	if pa.Defer(w, eps) == 0 {
		t.Fatal("w not held")
	}
	if _, ok := pa.replicas.held.Load(z); ok {
		t.Error("z, never placed, is still held two minutes after its turn")
	}
	if _, ok := pa.replicas.held.Load(w); !ok {
		t.Error("w, just held, was forgotten")
	}
}
