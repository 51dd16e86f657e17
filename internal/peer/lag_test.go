package peer

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/internal/metrics"
	"github.com/kvroute/kvroute/internal/metrics/metricstest"
)

// TestSyncLagOfPeerCutOff: a peer this replica is cut off from is no longer followed, yet its
// kvroute_peer_sync_lag_seconds keeps growing past the stream watchdog, while memberlist
// still knows it and after it is declared dead, so that the lag's alert (> 30 s) can see it.
func TestSyncLagOfPeerCutOff(t *testing.T) {
	const beat, silence = 50 * time.Millisecond, 300 * time.Millisecond
	fast := func(c *Config) { c.FaultInjection, c.beat, c.silence = true, beat, silence }
	reg := prometheus.NewRegistry()
	a := startReplica(t, "a", nil, fast)
	b := startReplica(t, "b", []string{a.node.GossipAddr()}, func(c *Config) {
		fast(c)
		c.Metrics = metrics.NewPeers(reg)
	})
	lag := func() (float64, bool) {
		v, ok := metricstest.Values(t, reg, "kvroute_peer_sync_lag_seconds")["kvroute_peer_sync_lag_seconds{peer=a}"]
		return v, ok
	}
	waitFor(t, 10*time.Second, "b following a and hearing it", func() bool {
		v, ok := lag()
		return isFollowing(b, "a")() && ok && v < silence.Seconds()
	})
	b.node.Isolate(true)
	waitFor(t, 5*time.Second, "b letting a go", isFollowing(b))
	last := 0.0
	waitFor(t, 10*time.Second, "a's lag past the watchdog", func() bool {
		v, ok := lag()
		if !ok {
			t.Fatalf("a's lag ended at %v s once a was no longer followed", last)
		}
		last = v
		return v > 3*silence.Seconds()
	})
	waitFor(t, 30*time.Second, "b declaring a dead", func() bool { return len(b.node.alive()) == 0 })
	if v, ok := lag(); !ok || v <= last {
		t.Errorf("a declared dead: its lag %v s (there: %v), want above %v s", v, ok, last)
	}
}

// TestLagWatch, step by step: a peer's lag is reported while it is followed, while it is a
// member, and for lagKept after it was last heard; a member never followed, from when it was
// first seen.
func TestLagWatch(t *testing.T) {
	start := time.Unix(1_700_000_000, 0)
	w := newLagWatch()
	fa := &following{p: peerInfo{name: "a"}}
	fa.heard.Store(start.UnixNano())
	members := []peerInfo{{name: "a"}, {name: "b"}}
	step := func(what string, now time.Time, follows map[string]*following, members []peerInfo, want map[string]time.Time) {
		t.Helper()
		if diff := cmp.Diff(want, w.heard(now, follows, members)); diff != "" {
			t.Errorf("%s: last heard (-want +got):\n%s", what, diff)
		}
	}
	step("a followed, b a member not followed yet", start, map[string]*following{"a": fa}, members,
		map[string]time.Time{"a": start, "b": start})
	step("a let go, still a member", start.Add(time.Minute), nil, members,
		map[string]time.Time{"a": start, "b": start})
	step("a and b dead", start.Add(lagKept), nil, nil,
		map[string]time.Time{"a": start, "b": start})
	step("lagKept after they were last heard", start.Add(lagKept+time.Second), nil, nil, map[string]time.Time{})
}
