package h1

import (
	"testing"
	"time"
)

// TestSendProgressJudge: the client's acknowledged bytes judge it where the kernel leaves its
// time fields 0 (gVisor's netstack): a client whose acknowledged bytes stay put is idle from
// the first time they were seen, one whose bytes grow is not, nor one with nothing held. The
// time fields, where they are filled, still count (the longer of the two measures).
func TestSendProgressJudge(t *testing.T) {
	const ms = int64(time.Millisecond)
	var pr sendProgress
	steps := []struct {
		at   int64 // ms
		st   sendState
		want time.Duration
	}{
		{0, sendState{queued: 10, acked: 100}, 0},                                     // first seen: nothing to compare
		{400, sendState{queued: 10, acked: 100}, 400 * time.Millisecond},              // no progress since
		{500, sendState{queued: 10, acked: 150}, 0},                                   // progress
		{700, sendState{queued: 10, acked: 150, sentMs: 900}, 900 * time.Millisecond}, // the times say longer
		{800, sendState{queued: 0, acked: 150}, 0},                                    // nothing held: all taken
		{1000, sendState{queued: 5, acked: 150}, 200 * time.Millisecond},
	}
	for i, s := range steps {
		if got := pr.judge(s.st, s.at*ms); got != s.want {
			t.Errorf("step %d (%+v at %d ms): idle %v, want %v", i, s.st, s.at, got, s.want)
		}
	}
}
