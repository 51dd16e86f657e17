package metrics

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestPeersScrapeTime: the per-peer lag, the remote requests and the snapshot age are read
// when scraped; a peer no longer followed has no series.
func TestPeersScrapeTime(t *testing.T) {
	reg := prometheus.NewRegistry()
	p := NewPeers(reg)
	now := time.Unix(1000, 0)
	p.now = func() int64 { return now.UnixNano() }
	heard := map[string]time.Time{"r2": now.Add(-3 * time.Second), "r3": now}
	p.WatchPeers(func() map[string]time.Time { return heard })
	p.WatchRemote(func() (int, int64) { return 7, 2 })
	p.SnapshotTaken(now.Add(-90 * time.Second).UnixNano())
	want := `
# HELP kvroute_peer_sync_lag_seconds Time since anything (events or a heartbeat, sent every second) was heard from each peer: it grows on while a peer is cut off or declared dead, until 10 minutes after it was last heard.
# TYPE kvroute_peer_sync_lag_seconds gauge
kvroute_peer_sync_lag_seconds{peer="r2"} 3
kvroute_peer_sync_lag_seconds{peer="r3"} 0
# HELP kvroute_peer_remote_requests Requests other replicas routed that are in flight now, as this replica counts them.
# TYPE kvroute_peer_remote_requests gauge
kvroute_peer_remote_requests 7
# HELP kvroute_peer_remote_expired_total Requests of other replicas ended here without their end: their replica left, or peers.request_ttl ran out.
# TYPE kvroute_peer_remote_expired_total counter
kvroute_peer_remote_expired_total 2
# HELP kvroute_peer_snapshot_age_seconds Age of the snapshot this replica started from (0 when it started cold).
# TYPE kvroute_peer_snapshot_age_seconds gauge
kvroute_peer_snapshot_age_seconds 90
`
	names := []string{"kvroute_peer_sync_lag_seconds", "kvroute_peer_remote_requests", "kvroute_peer_remote_expired_total", "kvroute_peer_snapshot_age_seconds"}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), names...); err != nil {
		t.Error(err)
	}
	delete(heard, "r2")
	if n := testutil.CollectAndCount((*peerLag)(p)); n != 1 {
		t.Errorf("%d lag series after r2 left, want 1", n)
	}
	// Every drop reason has its series from the start, so that increase() sees the first.
	if n := testutil.CollectAndCount(p.Dropped); n != len(DropReasons()) {
		t.Errorf("%d drop series, want %d", n, len(DropReasons()))
	}
}
