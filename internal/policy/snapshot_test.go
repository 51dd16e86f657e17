package policy

import (
	"bytes"
	"testing"
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
	if got, err := b.ReadSnapshot(&buf, func(name string) int { return byName[name] }, 0); err != nil || got != n {
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
