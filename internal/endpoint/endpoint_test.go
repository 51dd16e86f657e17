package endpoint

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// TestProgressed: an engine's last answer is the latest of what the router saw (Progressed, at
// most one write per progressGrain) and of the scraped snapshots whose Work grew.
func TestProgressed(t *testing.T) {
	e := &Endpoint{}
	t0 := time.Unix(100, 0)
	at := func(d time.Duration) int64 { return t0.Add(d).UnixNano() }
	e.Progressed(at(0))
	e.Progressed(at(5 * time.Millisecond)) // within the grain: not written
	if got := e.LastProgress(); got != at(0) {
		t.Errorf("last progress %v, want t0", time.Unix(0, got))
	}
	e.SetSnapshot(&Snapshot{At: t0.Add(time.Second), Work: 100}) // the first: nothing to compare
	e.SetSnapshot(&Snapshot{At: t0.Add(2 * time.Second), Work: 100})
	if got := e.LastProgress(); got != at(0) {
		t.Errorf("after snapshots with no new work: last progress %v, want t0", time.Unix(0, got))
	}
	e.SetSnapshot(&Snapshot{At: t0.Add(3 * time.Second), Work: 150})
	if got := e.LastProgress(); got != at(3*time.Second) {
		t.Errorf("after a snapshot with more work: last progress %v, want t0+3s", time.Unix(0, got))
	}
	e.Progressed(at(time.Second)) // older than what is known: kept
	if got := e.LastProgress(); got != at(3*time.Second) {
		t.Errorf("after an older answer: last progress %v, want t0+3s", time.Unix(0, got))
	}
}

func TestStalledDuring(t *testing.T) {
	e := &Endpoint{}
	t0 := time.Unix(100, 0)
	at := func(d time.Duration) int64 { return t0.Add(d).UnixNano() }
	s := time.Second
	if e.StalledDuring(at(0), at(time.Hour)) {
		t.Fatal("never stalled, yet StalledDuring")
	}
	e.Progressed(at(0))
	e.Stalled(at(0), at(10*s))   // a watch found it silent since t0, 10 s in
	e.Stalled(at(5*s), at(15*s)) // a second watch of the same stall: the first's start stands
	for _, c := range []struct {
		from, to time.Duration
		want     bool
	}{
		{-2 * s, -s, false}, // answered before the stall
		{-s, 20 * s, true},  // waiting through it, still going on
		{15 * s, 16 * s, true},
	} {
		if got := e.StalledDuring(at(c.from), at(c.to)); got != c.want {
			t.Errorf("during the stall: StalledDuring(t0%+v, t0%+v) = %v, want %v", c.from, c.to, got, c.want)
		}
	}
	e.Progressed(at(20 * s)) // it answers again: the stall was t0 to t0+20s
	for _, c := range []struct {
		from, to time.Duration
		want     bool
	}{
		{-2 * s, -s, false},
		{-s, 20 * s, true}, // held through it, answered as it ended
		{19 * s, 21 * s, true},
		{10 * s, 12 * s, true},
		{20 * s, 21 * s, false}, // sent when it answered again
		{21 * s, 22 * s, false},
	} {
		if got := e.StalledDuring(at(c.from), at(c.to)); got != c.want {
			t.Errorf("after the stall: StalledDuring(t0%+v, t0%+v) = %v, want %v", c.from, c.to, got, c.want)
		}
	}
	e.Progressed(at(30 * s)) // answers with no stall open change nothing
	if !e.StalledDuring(at(19*s), at(31*s)) || e.StalledDuring(at(25*s), at(31*s)) {
		t.Error("an answer after the stall ended moved it")
	}
	e.Stalled(at(40*s), at(45*s))
	e.Progressed(at(50 * s))
	if e.StalledDuring(at(19*s), at(21*s)) || !e.StalledDuring(at(45*s), at(52*s)) {
		t.Error("a second stall did not replace the first")
	}
}

func TestStalling(t *testing.T) {
	e := &Endpoint{}
	t0 := time.Unix(100, 0)
	at := func(d time.Duration) int64 { return t0.Add(d).UnixNano() }
	s := time.Second
	probe := int64(30 * s)
	if st, pr := e.Stalling(at(0), probe); st || pr {
		t.Fatal("never stalled, yet Stalling")
	}
	e.Progressed(at(0))
	e.Stalled(at(0), at(10*s))
	for _, c := range []struct {
		now  time.Duration
		want bool
	}{
		{10 * s, true},
		{39 * s, true},
		{40 * s, false}, // a probe may go
		{40 * s, true},  // one
		{41 * s, true},
		{70 * s, false}, // the next probe
		{71 * s, true},
	} {
		got, probing := e.Stalling(at(c.now), probe)
		if got != c.want || probing == c.want {
			t.Errorf("Stalling at t0+%v = %v, %v, want %v, %v", c.now, got, probing, c.want, !c.want)
		}
	}
	e.Progressed(at(75 * s))
	if st, pr := e.Stalling(at(76*s), probe); st || pr {
		t.Error("stalling after it answered again")
	}
	e.Stalled(at(75*s), at(90*s)) // a new stall: its first probe 30 s after it was found
	if st, _ := e.Stalling(at(110*s), probe); !st {
		t.Error("a second stall's probes are not counted from its finding")
	}
	if _, pr := e.Stalling(at(120*s), probe); !pr {
		t.Error("a second stall's probes are not counted from its finding")
	}
}

// A peer's finding stalls the engine here unless it answered here since; a peer's probe holds
// this router's next one for an interval.
func TestPeerStalled(t *testing.T) {
	t0 := time.Unix(100, 0)
	at := func(d time.Duration) int64 { return t0.Add(d).UnixNano() }
	s := time.Second
	probe := int64(30 * s)

	e := &Endpoint{}
	e.Progressed(at(0))
	if ok, opened := e.PeerStalled(at(0), at(10*s), 0); !ok || !opened || e.StalledSince() != at(0) {
		t.Fatalf("a peer's finding not applied: stalled since %d", e.StalledSince())
	}
	if st, _ := e.Stalling(at(20*s), probe); !st {
		t.Error("not stalling after a peer found it stalled")
	}
	if !e.StalledDuring(at(5*s), at(12*s)) {
		t.Error("a wait through the peer's stall not seen as one")
	}
	// A peer's probe at 35 s, held a second more: no probe here until 66 s.
	if ok, opened := e.PeerStalled(at(0), at(35*s), int64(s)); !ok || opened {
		t.Errorf("a peer's probe of an open stall: applied %v, opened %v; want applied, not opened", ok, opened)
	}
	if _, pr := e.Stalling(at(40*s), probe); pr {
		t.Error("probing here 5 s after a peer's probe")
	}
	if _, pr := e.Stalling(at(65*s), probe); pr {
		t.Error("probing here before the hold after the peer's probe")
	}
	if _, pr := e.Stalling(at(66*s), probe); !pr {
		t.Error("no probe here an interval and the hold after the peer's")
	}
	// It answers: the stall ends, and an older finding (a peer that has not heard yet) does
	// not open it again.
	e.Progressed(at(67 * s))
	if ok, _ := e.PeerStalled(at(0), at(67*s), 0); ok || e.StalledSince() != 0 {
		t.Error("a peer's stale finding stalled an engine that answered since")
	}
	if st, _ := e.Stalling(at(68*s), probe); st {
		t.Error("stalling after it answered")
	}

	// An engine this router never heard from: the peer's silence stands.
	f := &Endpoint{}
	if ok, _ := f.PeerStalled(at(-10*s), at(0), 0); !ok || f.StalledSince() != at(-10*s) {
		t.Errorf("a peer's finding on an engine never heard from: stalled since %d", f.StalledSince())
	}
}

// TestSnapshotJSON: a snapshot reads in /debug/endpoints as the rest of it does, snake_case.
func TestSnapshotJSON(t *testing.T) {
	b, err := json.Marshal(Snapshot{})
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	for k := range m {
		if strings.ToLower(k) != k {
			t.Errorf("snapshot key %q is not snake_case", k)
		}
	}
	if _, ok := m["kv_usage"]; !ok || len(m) != 12 {
		t.Errorf("snapshot keys %v: want kv_usage among 12", m)
	}
}
