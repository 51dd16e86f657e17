package peer

import (
	"fmt"
	"testing"
	"time"
)

// A sender that forges its address shows as a new host at every packet: the lines logged stay
// at maxNewHosts a minute, and the one real host that keeps failing keeps its line a minute,
// with the strangers' count said on the lines logged. Before: 100 new hosts a second for 3
// minutes made 11,390 lines (3,797 a minute), and the real host was logged twice, not three
// times, its entry dropped from a full map.
func TestHostLimiterForgedSenders(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	w := hostLimiter{now: func() time.Time { return now }}
	lines, real, others := 0, 0, 0
	stranger := 0
	for s := 0; s < 180; s++ { // 3 minutes, a tick a second
		if _, o, ok := w.due("10.0.0.1"); ok {
			lines++
			real++
			others += o
		}
		for range 100 {
			stranger++
			if _, o, ok := w.due(fmt.Sprintf("192.0.%d.%d", stranger/250, stranger%250)); ok {
				lines++
				others += o
			}
		}
		now = now.Add(time.Second)
	}
	if real != 3 {
		t.Errorf("the real host was logged %d times in 3 minutes, want 3 (once a minute)", real)
	}
	if max := 3*maxNewHosts + 3; lines > max {
		t.Errorf("%d lines in 3 minutes, want at most %d", lines, max)
	}
	if others == 0 {
		t.Errorf("no line said how many strangers' lines went unlogged")
	}
	if len(w.hosts) > maxHandshakeHosts {
		t.Errorf("%d hosts kept, bound %d", len(w.hosts), maxHandshakeHosts)
	}
}

// A host that keeps failing keeps its entry, and so its line, whatever the strangers: one
// failing before a flood of forged senders fills the map, then again every 90 s (each failure
// due its line), is logged at each failure. Before (20bfb34: every host kept, up to 4096, and
// a full map forgetting the entries logged a minute before), it was logged 5 times of 7. The
// count of the strangers' lines not logged, said on the lines logged or pending for the next,
// is exact.
func TestHostLimiterKeepsFailingHost(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	w := hostLimiter{now: func() time.Time { return now }}
	real, strangers, strangersLogged, others := 0, 0, 0, 0
	for s := 0; s < 600; s++ { // 10 minutes, a tick a second
		if s%90 == 0 {
			skipped, o, ok := w.due("10.0.0.1")
			if ok {
				real++
				others += o
			} else {
				t.Errorf("at %d s, the failing host (last seen %d s before) was not logged", s, min(s, 90))
			}
			if skipped != 0 {
				t.Errorf("at %d s, the failing host's line says %d of its lines unlogged, want 0", s, skipped)
			}
		}
		for range 100 {
			strangers++
			if _, o, ok := w.due(fmt.Sprintf("192.%d.%d.%d", strangers>>16, strangers>>8&255, strangers&255)); ok {
				strangersLogged++
				others += o
			}
		}
		now = now.Add(time.Second)
	}
	if real != 7 {
		t.Errorf("the failing host was logged %d times, want 7 (every 90 s for 10 minutes)", real)
	}
	if unlogged := strangers - strangersLogged; others+w.others != unlogged {
		t.Errorf("the lines said %d strangers' lines unlogged, %d pending: %d, want %d", others, w.others, others+w.others, unlogged)
	}
	if len(w.hosts) > maxHandshakeHosts {
		t.Errorf("%d hosts kept, bound %d", len(w.hosts), maxHandshakeHosts)
	}
}
