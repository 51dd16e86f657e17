package policy

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/kvroute/kvroute/internal/endpoint"
)

// TestEPTable_Slots: endpoints get the lowest slots free; one that leaves frees its slot, which
// the next endpoint takes only after slotQuarantine, told that it is reused; one that left
// the pool and is not known gets no slot.
func TestEPTable_Slots(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	var log [][2]int // slot, 1 when reused
	tab := newEPTable(clk, func(slot int, reused bool) int {
		r := 0
		if reused {
			r = 1
		}
		log = append(log, [2]int{slot, r})
		return 100 + slot
	})
	ep := func(id int) *endpoint.Endpoint { return &endpoint.Endpoint{ID: id, Name: "e"} }
	a, b, c := ep(5000), ep(70), ep(123456)
	for _, e := range []*endpoint.Endpoint{a, b} {
		if _, _, ok := tab.get(e); !ok {
			t.Fatalf("endpoint %d got no slot", e.ID)
		}
	}
	slots := make([]int, 3)
	vals := make([]int, 3)
	tab.gather([]*endpoint.Endpoint{b, c, a}, slots, vals)
	if diff := cmp.Diff([]int{1, 2, 0}, slots); diff != "" {
		t.Errorf("slots of b, c, a (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]int{101, 102, 100}, vals); diff != "" {
		t.Errorf("values of b, c, a (-want +got):\n%s", diff)
	}
	if slot, v, ok := tab.release(a.ID); !ok || slot != 0 || v != 100 {
		t.Errorf("release(a) = %d, %d, %v; want 0, 100, true", slot, v, ok)
	}
	if _, _, ok := tab.find(a.ID); ok {
		t.Error("a is still known after its release")
	}
	// A request that ends on a after it left brings nothing back.
	a.SetDraining(true)
	if slot, _, ok := tab.get(a); ok {
		t.Errorf("a, gone, got slot %d back", slot)
	}
	gone := ep(9)
	gone.SetDraining(true)
	tab.gather([]*endpoint.Endpoint{gone, b}, slots[:2], nil)
	if diff := cmp.Diff([]int{-1, 1}, slots[:2]); diff != "" {
		t.Errorf("slots of a gone endpoint and b (-want +got):\n%s", diff)
	}
	// Within the quarantine a new endpoint takes a new slot; after it, the freed one.
	clk.t = clk.t.Add(slotQuarantine - time.Nanosecond)
	d, e := ep(200000), ep(200001)
	if slot, _, _ := tab.get(d); slot != 3 {
		t.Errorf("d took slot %d within the quarantine, want 3", slot)
	}
	clk.t = clk.t.Add(time.Nanosecond)
	if slot, _, _ := tab.get(e); slot != 0 {
		t.Errorf("e took slot %d after the quarantine, want 0", slot)
	}
	want := [][2]int{{0, 0}, {1, 0}, {2, 0}, {3, 0}, {0, 1}}
	if diff := cmp.Diff(want, log); diff != "" {
		t.Errorf("values made (-want +got):\n%s", diff)
	}
	if known, n := tab.len(); known != 4 || n != 4 {
		t.Errorf("table knows %d endpoints in %d slots, want 4 in 4", known, n)
	}
	if diff := cmp.Diff([]int{e.ID, b.ID, c.ID, d.ID}, tab.ids()); diff != "" {
		t.Errorf("IDs by slot (-want +got):\n%s", diff)
	}
}

// TestPrefixAware_SlotReuse: what a call that looked an endpoint up before it left writes in
// its slot after is gone when a new endpoint takes the slot.
func TestPrefixAware_SlotReuse(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	pk, err := New("prefix-aware", nil, Env{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	pa := pk.(*prefixAware)
	eps := newEndpoints(3, 1<<20)
	a, b, c := eps[0], eps[1], eps[2]
	r := req("1", 5, seq(100, 8)...)
	pa.Routed(r, a)
	pa.Done(r, a, Result{OK: true, CachedTokens: -1, PromptTokens: r.PromptTokens})
	slotA, _, _ := pa.eps.find(a.ID)
	pa.Removed(a)
	pa.index.Insert(slotA, r.Blocks, clk.t.UnixNano()) // the late call
	clk.t = clk.t.Add(slotQuarantine)
	if _, err := pa.Pick(r, []*endpoint.Endpoint{b, c}); err != nil {
		t.Fatal(err)
	}
	if slot, _, _ := pa.eps.find(b.ID); slot != slotA || pa.PredictCached(r, b) != 0 {
		t.Errorf("b has slot %d and holds %d tokens of the request; want a's slot %d and 0", slot, pa.PredictCached(r, b), slotA)
	}
	if known, slots := pa.eps.len(); known != 2 || slots != 2 {
		t.Errorf("policy knows %d endpoints in %d slots, want 2 in 2", known, slots)
	}
}
