package peer

import (
	"fmt"
	"testing"
	"time"
)

// A replica that begins failing during a flood of forged senders gets its line too, from its
// second failure on, and the lines stay bounded whatever addresses are forged. Before: the
// places for new hosts were taken in the first second of each minute, and a replica failing
// every second from 10 s on, its attempt in the middle of each second's forged packets, was
// never logged in 3 minutes (its lines only counted under other_hosts_unlogged); and a sender
// cycling over 1,000 forged addresses had each one logged kept and logged again every minute,
// 10 more each minute: 60 lines in the third minute, 555 a minute in the sixth 10 minutes.
// Such a sender can take every line there is for the real replica's (a forged address that
// repeats looks like a replica that keeps failing): its lines are counted, not logged. Every
// line is either logged or counted once.
func TestHostLimiterReplicaFailingDuringFlood(t *testing.T) {
	for _, tc := range []struct {
		name    string
		forged  func(i int) string // the address of forged packet i
		minutes int
		// realLines is how many times the replica is to be logged; -1: not judged.
		realLines int
	}{
		{"each address once", func(i int) string { return fmt.Sprintf("192.%d.%d.%d", i/62500, i/250%250, i%250) }, 3, 3},
		{"1000 addresses in turn", func(i int) string { return fmt.Sprintf("192.0.%d.%d", i%1000/250, i%250) }, 30, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			now := time.Unix(1_000_000, 0)
			w := hostLimiter{now: func() time.Time { return now }}
			calls, lines, real, counted := 0, 0, 0, 0
			minuteLines, maxMinuteLines := 0, 0
			due := func(host string) bool {
				calls++
				skipped, others, ok := w.due(host)
				if ok {
					lines++
					minuteLines++
					counted += 1 + skipped + others
				}
				return ok
			}
			forged := 0
			for s := 0; s < 60*tc.minutes; s++ { // a tick a second
				for i := range 100 {
					if i == 50 && s >= 10 && due("10.0.0.1") {
						real++
					}
					due(tc.forged(forged))
					forged++
				}
				now = now.Add(time.Second)
				if s%60 == 59 {
					maxMinuteLines, minuteLines = max(maxMinuteLines, minuteLines), 0
				}
			}
			if tc.realLines >= 0 && real != tc.realLines {
				t.Errorf("the replica failing from 10 s on was logged %d times in %d minutes, want %d (once a minute from its second failure)", real, tc.minutes, tc.realLines)
			}
			if maxMinuteLines > maxHostLines {
				t.Errorf("%d lines in a minute, want at most %d", maxMinuteLines, maxHostLines)
			}
			// What the lines said plus what is still to be said (the per-host skips and the
			// strangers' count) is every call.
			pending := w.others
			for _, h := range w.hosts {
				pending += h.skipped
			}
			if counted+pending != calls {
				t.Errorf("lines said %d and %d are pending: %d, want every one of the %d lines", counted, pending, counted+pending, calls)
			}
			if n := len(w.unlogged) + len(w.unloggedOld); n > maxHandshakeHosts {
				t.Errorf("%d unlogged hosts kept, bound %d", n, maxHandshakeHosts)
			}
		})
	}
}
