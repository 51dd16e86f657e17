package endpoint

import (
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
