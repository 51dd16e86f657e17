package policy

import (
	"bytes"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/internal/endpoint"
)

// TestPrefixAwareSnapshot: a replica that takes another's snapshot predicts the same hits for
// the same endpoints (by name), and picks the holder of a conversation it never saw.
func TestPrefixAwareSnapshot(t *testing.T) {
	a, _ := newPA(t, nil)
	epsA := newEndpoints(3, 1<<20)
	for i := range uint64(30) {
		r := req("r", 5, seq(100*i, 20)...)
		ep := route(t, a, r, epsA)
		a.FirstToken(r, ep, 0)
		a.Done(r, ep, Result{OK: true, CachedTokens: -1})
		ep.Finish(r.PromptTokens, true)
	}
	var snap Snapshotter = a
	var buf bytes.Buffer
	n, err := snap.WriteSnapshot(&buf, func(id int) string { return epsA[id].Name }, 0)
	if err != nil || n != 30*20 {
		t.Fatalf("wrote %d entries (%v), want %d", n, err, 30*20)
	}
	b, _ := newPA(t, nil)
	epsB := newEndpoints(3, 1<<20)
	// b numbers the same endpoints otherwise.
	epsB[0].Name, epsB[2].Name = epsA[2].Name, epsA[0].Name
	byName := map[string]int{}
	for _, e := range epsB {
		byName[e.Name] = e.ID
	}
	if got, err := b.ReadSnapshot(&buf, func(name string) *endpoint.Endpoint { return epsB[byName[name]] }, 0); err != nil || got != n {
		t.Fatalf("read %d entries (%v), want %d", got, err, n)
	}
	for i := range uint64(30) {
		r := req("r", 5, seq(100*i, 20)...)
		for k := range epsA {
			want := a.PredictCached(r, epsA[k])
			if got := b.PredictCached(r, epsB[byName[epsA[k].Name]]); got != want {
				t.Fatalf("conversation %d on %s: b predicts %d cached tokens, a %d", i, epsA[k].Name, got, want)
			}
		}
		ranked, err := b.Pick(req("r", 5, seq(100*i, 25)...), epsB)
		if err != nil {
			t.Fatal(err)
		}
		if a.PredictCached(r, epsA[0]) > 0 && ranked[0].Name != epsA[0].Name ||
			a.PredictCached(r, epsA[1]) > 0 && ranked[0].Name != epsA[1].Name {
			t.Errorf("conversation %d: b picks %s, not its holder", i, ranked[0].Name)
		}
	}
}

// TestPrefixAwareInherit: a picker given other parameters (a reload that changes cache_weight)
// takes over what the one in force learned: it predicts the same hits and picks each
// conversation's holder, calibrates every endpoint and the fleet as before, counts the
// failures and the work queued there, and the request the old picker routed before the
// reload still releases its queue when it ends.
func TestPrefixAwareInherit(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	build := func(p Params) *prefixAware {
		pk, err := New("prefix-aware", p, Env{Clock: clk})
		if err != nil {
			t.Fatal(err)
		}
		return pk.(*prefixAware)
	}
	a := build(nil)
	eps := newEndpoints(3, 1<<20)
	for i := range uint64(30) {
		r := req("r", 5, seq(100*i, 20)...)
		ep := eps[i%3]
		ep.Start(r.PromptTokens)
		a.Routed(r, ep)
		clk.t = clk.t.Add(50 * time.Millisecond)
		// ep-2 answers three times as slowly as the others: a calibration of its own.
		ttft := 60 * time.Millisecond
		if ep == eps[2] {
			ttft *= 3
		}
		finish(a, r, ep, ttft, -1)
	}
	// A refusal at ep-1, and a request routed to ep-0 that has not reached its first token.
	refused := req("refused", 5, seq(90_000, 4)...)
	eps[1].Start(refused.PromptTokens)
	a.Routed(refused, eps[1])
	eps[1].Finish(refused.PromptTokens, false)
	a.Done(refused, eps[1], Result{Failed: true, CachedTokens: -1})
	inFlight := req("in-flight", 5, seq(80_000, 40)...)
	eps[0].Start(inFlight.PromptTokens)
	a.Routed(inFlight, eps[0])

	now := clk.t.UnixNano()
	var rates, tries []float64
	for _, e := range eps {
		rates = append(rates, a.PrefillRate(e.ID))
		tries = append(tries, a.attemptsPerAnswer(a.find(e.ID), now))
	}
	fleetRate := a.PrefillRate(99) // an endpoint not seen: the fleet's calibration
	if fleetRate == prefillRate || rates[2] == rates[0] || tries[1] <= 1 {
		t.Fatalf("fixture: rates %v (fleet %v), attempts per answer %v: want calibrated, ep-2 apart, ep-1 refusing", rates, fleetRate, tries)
	}
	entries, _ := a.IndexSize()
	queued := a.queued(a.find(0), now, a.fleet.get())

	b := build(Params{"cache_weight": "4"})
	var inh Inheritor = b
	in, ok := inh.Inherit(a, nil, Params{"cache_weight": "4"})
	want := Inherited{IndexEntries: entries, Endpoints: 3, Calibrated: 3, FleetCalibrated: true}
	if diff := cmp.Diff(want, in); !ok || diff != "" {
		t.Fatalf("Inherit: ok %v, (-want +got):\n%s", ok, diff)
	}
	for i, e := range eps {
		if got := b.PrefillRate(e.ID); got != rates[i] {
			t.Errorf("%s: prefill rate %v after, %v before", e.Name, got, rates[i])
		}
		if got := b.attemptsPerAnswer(b.find(e.ID), now); got != tries[i] {
			t.Errorf("%s: attempts per answer %v after, %v before", e.Name, got, tries[i])
		}
	}
	if got := b.PrefillRate(99); got != fleetRate {
		t.Errorf("the fleet's prefill rate %v after, %v before", got, fleetRate)
	}
	if got := b.queued(b.find(0), now, b.fleet.get()); got != queued || got <= 0 {
		t.Errorf("work queued on ep-0: %v after, %v before", got, queued)
	}
	for i := range uint64(30) {
		r := req("r", 5, seq(100*i, 20)...)
		holder := -1
		for k, e := range eps {
			got, want := b.PredictCached(r, e), a.PredictCached(r, e)
			if got != want {
				t.Fatalf("conversation %d on %s: %d cached tokens predicted after, %d before", i, e.Name, got, want)
			}
			if want > 0 {
				holder = k
			}
		}
		ranked, err := b.Pick(req("r", 5, seq(100*i, 25)...), eps)
		if err != nil {
			t.Fatal(err)
		}
		if holder < 0 || ranked[0] != eps[holder] {
			t.Errorf("conversation %d: picks %s, its holder is %d", i, ranked[0].Name, holder)
		}
	}
	// The request routed before ends through the old picker (its lifecycle): the queue both
	// share is empty again.
	clk.t = clk.t.Add(50 * time.Millisecond)
	finish(a, inFlight, eps[0], 50*time.Millisecond, -1)
	if s := b.find(0); s.pending.Load() != 0 || s.waiting.Load() != 0 {
		t.Errorf("ep-0 after the old picker's request ended: %d work, %d requests queued; want none", s.pending.Load(), s.waiting.Load())
	}
	// The new picker goes on learning into the same index.
	r := req("new", 5, seq(70_000, 10)...)
	ep := route(t, b, r, eps)
	finish(b, r, ep, 60*time.Millisecond, -1)
	if got := b.PredictCached(r, ep); got != 160 {
		t.Errorf("a conversation routed after: %d cached tokens predicted, want 160", got)
	}

	if _, ok := b.Inherit(&roundRobin{}, nil, nil); ok {
		t.Error("Inherit took a round-robin's state")
	}
}

// TestPrefixAwareInheritIndexSizes: given other index sizes, the new picker shares the index,
// resized to its sizes: an endpoint whose capacity is known keeps all it held and its capacity
// (also one that holds nothing yet), one whose capacity is unknown is held to the new
// index_blocks (its most recent blocks). What the old picker learns after, from a request it
// routed before (a failure before the first token: the blocks it added are dropped), is in
// the index the new one reads. Before, the index was copied into the new picker's, and that
// drop went to the old one's: the new picker went on predicting blocks the engine never
// computed.
func TestPrefixAwareInheritIndexSizes(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	a, err := New("prefix-aware", nil, Env{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	eps := newEndpoints(3, 1<<20)
	eps[1].KVCapacityTokens = 0                                             // unknown: the index's default, index_blocks
	eps[2].KVCapacityTokens = 1 << 18                                       // 16,384 blocks, and nothing held
	if _, err := a.Pick(req("sizes", 5, seq(900, 2)...), eps); err != nil { // sizes the index
		t.Fatal(err)
	}
	x, y := req("x", 5, seq(100, 20)...), req("y", 5, seq(200, 20)...)
	for i, r := range []*Request{x, y} {
		eps[i].Start(r.PromptTokens)
		a.(*prefixAware).Routed(r, eps[i])
		clk.t = clk.t.Add(time.Millisecond)
		finish(a.(*prefixAware), r, eps[i], 30*time.Millisecond, -1)
	}
	// Routed before the reload, it fails after it, before its first token.
	z := req("z", 5, seq(300, 6)...)
	eps[0].Start(z.PromptTokens)
	a.(*prefixAware).Routed(z, eps[0])
	p := Params{"index_blocks": "8"}
	b, err := New("prefix-aware", p, Env{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	in, ok := b.(Inheritor).Inherit(a, nil, p)
	want := Inherited{IndexEntries: 20 + 6 + 8, IndexResized: true, IndexEvicted: 12, Endpoints: 3, Calibrated: 0, FleetCalibrated: false}
	if diff := cmp.Diff(want, in); !ok || diff != "" {
		t.Fatalf("Inherit: ok %v (-want +got):\n%s", ok, diff)
	}
	pb := b.(*prefixAware)
	for i, want := range []int{1 << 16, 8, 1 << 14} {
		slot, _, _ := pb.eps.find(eps[i].ID)
		if got := pb.index.Capacity(slot); got != want {
			t.Errorf("%s: index capacity %d blocks after, want %d", eps[i].Name, got, want)
		}
	}
	if got := pb.PredictCached(x, eps[0]); got != 20*16 {
		t.Errorf("x on the endpoint of known capacity: %d cached tokens predicted, want %d", got, 20*16)
	}
	if got := pb.PredictCached(y, eps[1]); got != 8*16 {
		t.Errorf("y on the endpoint of unknown capacity: %d cached tokens predicted, want %d (index_blocks 8)", got, 8*16)
	}
	if got := pb.PredictCached(z, eps[0]); got != 6*16 {
		t.Fatalf("z, in flight: %d cached tokens predicted, want %d", got, 6*16)
	}
	eps[0].Finish(z.PromptTokens, false)
	a.(*prefixAware).Done(z, eps[0], Result{Failed: true, CachedTokens: -1})
	if got := pb.PredictCached(z, eps[0]); got != 0 {
		t.Errorf("z failed before its first token, after the reload: the new picker predicts %d cached tokens, want 0", got)
	}
}

// TestPrefixAwareInheritRoutesOn: while a reload that changes the index's sizes is taken over
// (Inherit), the picker in force routes on, and every request it routed, before, meanwhile
// and until the new picker takes its place, is in the index the new one reads. Before, the
// index was copied while the old picker routed on into its own: what it routed during the
// copy was lost (2,589 of 2,590 requests at a million entries).
func TestPrefixAwareInheritRoutesOn(t *testing.T) {
	const neps, chains, blocks = 4, 2500, 10 // 100,000 entries
	a, _ := newPA(t, nil)
	a.clock = WallClock{}
	eps := newEndpoints(neps, 1<<20)
	for i := range chains * neps {
		r := req("fill", 5, seq(uint64(1_000_000+blocks*i), blocks)...)
		ep := eps[i%neps]
		a.Routed(r, ep)
		a.Done(r, ep, Result{OK: true, CachedTokens: -1})
	}
	if n, _ := a.IndexSize(); n != chains*neps*blocks {
		t.Fatalf("fixture: %d entries, want %d", n, chains*neps*blocks)
	}
	type routed struct {
		r  *Request
		ep *endpoint.Endpoint
	}
	var done []routed
	first, inherited, stopped := make(chan struct{}), make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		for i := 0; i < 1_000_000; i++ {
			select {
			case <-inherited:
				return
			default:
			}
			r := req("new", 5, seq(uint64(100_000_000+8*i), 8)...)
			ranked, err := a.Pick(r, eps)
			if err != nil {
				t.Error(err)
				return
			}
			ep := ranked[0]
			ep.Start(r.PromptTokens)
			a.Routed(r, ep)
			ep.FirstToken(r.PromptTokens)
			a.FirstToken(r, ep, time.Millisecond)
			ep.Finish(r.PromptTokens, true)
			a.Done(r, ep, Result{OK: true, CachedTokens: -1})
			done = append(done, routed{r, ep})
			if i == 0 {
				close(first)
			}
		}
	}()
	select {
	case <-first:
	case <-stopped:
		t.Fatal("the router stopped before its first request")
	case <-time.After(10 * time.Second):
		t.Fatal("no request routed in 10 s")
	}
	// A cap of 3/4 of what is held: the endpoints' oldest entries go, none of the new ones.
	p := Params{"max_index_entries": "75000"}
	b, _ := newPA(t, p)
	b.clock = WallClock{}
	in, ok := b.Inherit(a, nil, p)
	close(inherited)
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("the router did not stop in 10 s")
	}
	if !ok || !in.IndexResized || in.IndexEvicted < 25_000 {
		t.Fatalf("Inherit: %+v, %v; want the index resized and 25,000 entries or more evicted", in, ok)
	}
	lost := 0
	for _, d := range done {
		if b.PredictCached(d.r, d.ep) != 8*16 {
			lost++
		}
	}
	if lost > 0 {
		t.Errorf("%d of the %d requests routed by the picker in force are not in the new picker's index", lost, len(done))
	}
	t.Logf("%d requests routed by the picker in force while the test ran", len(done))
	if n, _ := b.IndexSize(); n != 75_000 {
		t.Errorf("%d entries after, want the cap, 75,000", n)
	}
}

// TestBaselinesInherit: cache-aware, overlap-cost and scorer-weighted given other parameters
// keep their index (shared, resized where its size changed) instead of starting empty: a
// conversation goes on to its holder, and overlap-cost's request in flight, routed before,
// takes its active blocks off when it ends.
func TestBaselinesInherit(t *testing.T) {
	for _, c := range []struct {
		name        string
		other, size Params // a parameter of another kind, and the index's size (one block each)
		blockBytes  int    // what a block is in the size parameter
	}{
		{"cache-aware", Params{"cache_threshold": "0.2"}, Params{"max_tree_size": "64"}, 64},
		{"overlap-cost", Params{"overlap_score_weight": "2"}, Params{"index_blocks": "1"}, 1},
		{"scorer-weighted", Params{"queue_weight": "1"}, Params{"lru_blocks": "1"}, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			clk := &fakeClock{t: time.Unix(1000, 0)}
			a := mustNew(t, c.name, nil, Env{Clock: clk})
			eps := newEndpoints(3, 1<<20)
			convs := []*Request{req("c0", 5, seq(100, 20)...), req("c1", 5, seq(200, 20)...), req("c2", 5, seq(300, 20)...)}
			for i, r := range convs {
				a.(Observer).Routed(r, eps[i])
				a.(Observer).Done(r, eps[i], Result{OK: true, CachedTokens: -1})
			}
			inFlight := req("in-flight", 5, seq(900, 4)...)
			a.(Observer).Routed(inFlight, eps[0])
			entries, _ := a.(IndexSizer).IndexSize()

			b := mustNew(t, c.name, c.other, Env{Clock: clk})
			inh, ok := b.(Inheritor)
			if !ok {
				t.Fatalf("%s is no Inheritor: a reload that changes a parameter starts it empty", c.name)
			}
			in, ok := inh.Inherit(a, nil, c.other)
			if diff := cmp.Diff(Inherited{IndexEntries: entries, Endpoints: 3}, in); !ok || diff != "" {
				t.Fatalf("Inherit: ok %v (-want +got):\n%s", ok, diff)
			}
			for i := range convs {
				if got := pick(t, b, req("next", 5, seq(100*uint64(i+1), 24)...), eps)[0]; got != i {
					t.Errorf("conversation %d goes to %d after, want its holder", i, got)
				}
			}
			if oc, ok := b.(*overlapCost); ok {
				a.(Observer).Done(inFlight, eps[0], Result{OK: true, CachedTokens: -1})
				if _, st, _ := oc.eps.find(eps[0].ID); st.active.Load() != 0 {
					t.Errorf("ep-0's active blocks %d after the request routed before ended, want 0", st.active.Load())
				}
			}

			small := mustNew(t, c.name, c.size, Env{Clock: clk})
			in, ok = small.(Inheritor).Inherit(b, nil, c.size)
			if want := (Inherited{IndexEntries: 3, IndexResized: true, IndexEvicted: entries - 3, Endpoints: 3}); !ok || !cmp.Equal(want, in) {
				t.Errorf("Inherit into one block an endpoint: %+v, %v; want %+v", in, ok, want)
			}
			if _, ok := small.(Inheritor).Inherit(&roundRobin{}, nil, nil); ok {
				t.Error("Inherit took a round-robin's state")
			}
		})
	}
}

// TestSnapshotEndpointLeaves: an endpoint that leaves the pool while a peer's snapshot is read
// (the pool marks it draining, then the router tells the policy it was Removed) is not added
// back by the entries that name it after that: it keeps no slot, no state and no entries. Its
// entries read before it left went with its Removed. Before, the table added it back by ID
// and it kept a slot and its entries for good.
func TestSnapshotEndpointLeaves(t *testing.T) {
	a, _ := newPA(t, nil)
	epsA := newEndpoints(3, 1<<20)
	for i := range uint64(30) {
		r := req("r", 5, seq(100*i, 20)...)
		ep := route(t, a, r, epsA)
		a.FirstToken(r, ep, 0)
		a.Done(r, ep, Result{OK: true, CachedTokens: -1})
		ep.Finish(r.PromptTokens, true)
	}
	var buf bytes.Buffer
	if _, err := a.WriteSnapshot(&buf, func(id int) string { return epsA[id].Name }, 0); err != nil {
		t.Fatal(err)
	}
	b, clk := newPA(t, nil)
	epsB := newEndpoints(3, 1<<20)
	byName := map[string]*endpoint.Endpoint{}
	for _, e := range epsB {
		byName[e.Name] = e
	}
	if _, err := b.Pick(req("x", 5, seq(9000, 3)...), epsB); err != nil { // b knows all three
		t.Fatal(err)
	}
	left := epsB[2]
	lookups := 0
	n, err := b.ReadSnapshot(&buf, func(name string) *endpoint.Endpoint {
		if lookups++; lookups == 1 { // ep-2 leaves as the read starts: marked, then Removed
			left.SetDraining(true)
			b.Removed(left)
		}
		return byName[name] // the pool as it was when the read started
	}, 0)
	if err != nil || n == 0 {
		t.Fatalf("read %d entries (%v)", n, err)
	}
	clk.t = clk.t.Add(time.Hour)
	if known, slots := b.eps.len(); known != 2 || slots != 3 {
		t.Errorf("the table knows %d endpoints in %d slots, want 2 in 3", known, slots)
	}
	if _, _, ok := b.eps.find(left.ID); ok {
		t.Errorf("%s left the pool during the read and has a slot again", left.Name)
	}
	held := 0
	for i := range uint64(30) {
		if b.PredictCached(req("r", 5, seq(100*i, 20)...), left) > 0 {
			held++
		}
	}
	if held != 0 {
		t.Errorf("%s is predicted to hold %d of 30 conversations after it left", left.Name, held)
	}
	// The two that stay took their entries.
	for _, e := range epsB[:2] {
		got := 0
		for i := range uint64(30) {
			if b.PredictCached(req("r", 5, seq(100*i, 20)...), e) > 0 {
				got++
			}
		}
		if got == 0 {
			t.Errorf("%s took none of its entries", e.Name)
		}
	}
}
