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

// TestPrefixAwareInheritIndexSizes: given other index sizes, the new picker copies the index
// into one of its own: an endpoint whose capacity is known keeps all it held and its capacity
// (also one that holds nothing yet), one whose capacity is unknown is held to the new
// index_blocks (its most recent blocks), and the old picker's index is left as it was.
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
	p := Params{"index_blocks": "8"}
	b, err := New("prefix-aware", p, Env{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	in, ok := b.(Inheritor).Inherit(a, nil, p)
	if !ok || !in.IndexCopied || in.IndexEntries != 20+8 || in.Endpoints != 3 {
		t.Fatalf("Inherit: %+v, %v; want the index copied, 20 + 8 entries, 3 endpoints", in, ok)
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
	if got := a.(*prefixAware).PredictCached(y, eps[1]); got != 20*16 {
		t.Errorf("the old picker's index changed: y %d cached tokens, want %d", got, 20*16)
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
