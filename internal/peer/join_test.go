package peer

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/internal/discovery/kube"
	"github.com/kvroute/kvroute/internal/metrics"
	"github.com/kvroute/kvroute/internal/testlog"
)

// stalledAddrs listens on k loopback addresses that accept connections and never answer (a
// stale address taken by something else, a frozen process), and returns them and a count of
// the connections they accepted.
func stalledAddrs(t *testing.T, k int) ([]string, *atomic.Int32) {
	t.Helper()
	var mu sync.Mutex
	var held []net.Conn
	var addrs []string
	accepted := new(atomic.Int32)
	for range k {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addrs = append(addrs, ln.Addr().String())
		t.Cleanup(func() { _ = ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				mu.Lock()
				held = append(held, c)
				mu.Unlock()
				accepted.Add(1)
			}
		}()
	}
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			_ = c.Close()
		}
	})
	return addrs, accepted
}

// TestJoinPastStalledAddrs: a live replica listed after 20 addresses that accept connections
// and never answer is joined within about one TCP timeout (2 s), and a replica stops at once
// while it joins such addresses. memberlist's Join, given them all, took 2 s for each address
// before the live one (b joined after 40.0 s), and stopping waited for it to end (c's Run
// returned after 10.0 s).
func TestJoinPastStalledAddrs(t *testing.T) {
	b := startReplica(t, "b", nil, nil)
	stalled, _ := stalledAddrs(t, 20)
	start := time.Now()
	a := startReplica(t, "a", append(stalled, b.node.GossipAddr()), nil)
	joined := false
	for deadline := start.Add(5 * time.Second); time.Now().Before(deadline) && !joined; time.Sleep(10 * time.Millisecond) {
		joined = len(a.node.alive()) == 1
	}
	if took := time.Since(start).Round(time.Millisecond); !joined {
		t.Errorf("a has not joined b %v after its start (20 stalled addresses listed first)", took)
	} else {
		t.Logf("a joined b %v after its start", took)
	}

	others, accepted := stalledAddrs(t, 5)
	c := startReplica(t, "c", others, nil)
	waitFor(t, 5*time.Second, "c joining the stalled addresses", func() bool { return accepted.Load() > 0 })
	stop := time.Now()
	c.cancel()
	c.cancel = nil
	select {
	case err := <-c.done:
		if err != nil {
			t.Errorf("c's Run: %v", err)
		}
	case <-time.After(3 * time.Second):
		t.Fatalf("c's Run has not returned 3 s after its context ended")
	}
	if d := time.Since(stop); d > time.Second {
		t.Errorf("c's Run returned %v after its context ended, want 1 s at most", d.Round(time.Millisecond))
	} else {
		t.Logf("c's Run returned %v after its context ended, joins in flight", d.Round(time.Millisecond))
	}
}

// TestJoinerBackoff: an address whose join failed waits for a back-off that doubles with each
// failure in a row, up to 10 s (joinBackoffMax); one in flight is not tried again; one joined,
// or no longer listed, is forgotten; new secrets forget every failure.
func TestJoinerBackoff(t *testing.T) {
	j := newJoiner()
	t0 := time.Unix(1000, 0)
	const a, b = "10.0.0.1:7946", "10.0.0.2:7946"
	fail := errors.New("i/o timeout")
	if !j.due(a, t0) {
		t.Fatal("an address never tried is not due")
	}
	j.begin(a)
	if j.due(a, t0.Add(time.Hour)) {
		t.Error("an address in flight is due")
	}
	now := t0
	var waits []time.Duration
	for range 7 {
		j.end(a, fail, now)
		at := now
		for !j.due(a, at) && at.Sub(now) < 2*time.Minute {
			at = at.Add(time.Second)
		}
		waits = append(waits, at.Sub(now))
		now = at
		j.begin(a)
	}
	want := []time.Duration{2 * time.Second, 4 * time.Second, 8 * time.Second, 10 * time.Second, 10 * time.Second, 10 * time.Second, 10 * time.Second}
	if diff := cmp.Diff(want, waits); diff != "" {
		t.Errorf("waits after each failure (-want +got):\n%s", diff)
	}
	j.end(a, nil, now)
	j.begin(b)
	j.end(b, fail, now)
	if !j.due(a, now) {
		t.Error("an address joined is not due at once")
	}
	if j.due(b, now) {
		t.Error("an address that just failed is due")
	}
	j.forget(func(addr string) bool { return addr != b })
	if !j.due(b, now) {
		t.Error("an address no longer listed is remembered")
	}
	j.begin(b)
	j.end(b, fail, now)
	j.begin(a) // in flight across the reset
	j.reset()
	if !j.due(b, now) || j.due(a, now) {
		t.Errorf("after new secrets: %s due %v (want true), %s in flight due %v (want false)", b, j.due(b, now), a, j.due(a, now))
	}
	j.end(a, fail, now)
	if j.due(a, now.Add(joinBackoffMin-time.Millisecond)) || !j.due(a, now.Add(joinBackoffMin)) {
		t.Error("a failure after new secrets does not wait for the first back-off")
	}
}

// TestJoinSkipsFailedAddrs: the rounds after a failed join leave its address alone until its
// back-off has passed, rather than trying every dead address at every round.
func TestJoinSkipsFailedAddrs(t *testing.T) {
	// Nothing listens there once closed: joins fail at once.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	_ = ln.Close()
	var asked atomic.Int32
	a := startReplica(t, "a", nil, func(c *Config) {
		c.Sources = []Source{countingSource{Static{dead}, &asked}}
	})
	waitFor(t, 5*time.Second, "a round that tried the dead address", func() bool {
		a.node.joins.mu.Lock()
		defer a.node.joins.mu.Unlock()
		st := a.node.joins.addrs[dead]
		return st != nil && st.fails == 1
	})
	// The rounds come every second while no peer is found: of the three after it, only the
	// one 2 s after tries it again (then 4 s after that).
	k := asked.Load()
	waitFor(t, 6*time.Second, "three more rounds", func() bool { return asked.Load() >= k+3 })
	a.node.joins.mu.Lock()
	fails := a.node.joins.addrs[dead].fails
	a.node.joins.mu.Unlock()
	if fails > 2 {
		t.Errorf("the dead address tried %d times in four rounds, want 2 at most", fails)
	}
}

// countingSource counts the rounds that ask it.
type countingSource struct {
	Source
	asked *atomic.Int32
}

func (s countingSource) Addrs(ctx context.Context) ([]string, error) {
	s.asked.Add(1)
	return s.Source.Addrs(ctx)
}

// TestSourceFailuresWarnedOnce: a DNS name that does not resolve is counted at each failure and
// logged as a warning once per run of failures; its next answer is logged. A Kubernetes source
// whose watch is starting is neither.
func TestSourceFailuresWarnedOnce(t *testing.T) {
	var logs testlog.Buffer
	var failing atomic.Bool
	failing.Store(true)
	m := metrics.NewPeers(prometheus.NewRegistry())
	n, err := New(Config{Name: "a", Listen: "127.0.0.1:0", Gossip: "127.0.0.1:0", Secret: secret, Metrics: m,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
		Sources: []Source{
			DNS{Name: "kvroute-peers.invalid", Port: 7946, Lookup: func(context.Context, string) ([]netip.Addr, error) {
				if failing.Load() {
					return nil, errors.New("lookup kvroute-peers.invalid: no such host")
				}
				return []netip.Addr{netip.MustParseAddr("10.0.0.1")}, nil
			}},
			&Kube{Watch: kube.Watch{Name: "peers:kubernetes:serving/kvroute-peers"}},
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.ln.Close() })
	ask := func() []string {
		addrs, complete := n.sourceAddrs(context.Background())
		if complete {
			t.Error("every source answered, but the Kubernetes watch never listed")
		}
		return addrs
	}
	for range 3 {
		ask()
	}
	failing.Store(false)
	if diff := cmp.Diff([]string{"10.0.0.1:7946"}, ask()); diff != "" {
		t.Errorf("addresses once the name resolves (-want +got):\n%s", diff)
	}
	failing.Store(true)
	ask()
	ask()
	if got := testutil.ToFloat64(m.SourceErrors.WithLabelValues("dns")); got != 5 {
		t.Errorf("kvroute_peer_source_errors_total{source=dns} = %v, want 5", got)
	}
	if got := testutil.ToFloat64(m.SourceErrors.WithLabelValues("kubernetes")); got != 0 {
		t.Errorf("kvroute_peer_source_errors_total{source=kubernetes} = %v while the watch starts, want 0", got)
	}
	out := logs.String()
	if k := strings.Count(out, "level=WARN"); k != 2 || strings.Count(out, "peer source failed") != 2 {
		t.Errorf("%d warnings, want one per run of failures (2):\n%s", k, out)
	}
	if !strings.Contains(out, "no such host") || !strings.Contains(out, "peer source answers again") {
		t.Errorf("logs lack the failure or the recovery:\n%s", out)
	}
	if strings.Contains(out, "kubernetes") {
		t.Errorf("the Kubernetes watch starting was logged:\n%s", out)
	}
}

// TestSourceKind: the source label of kvroute_peer_source_errors_total.
func TestSourceKind(t *testing.T) {
	for _, c := range []struct {
		s    Source
		want string
	}{
		{Static{"10.0.0.1:7946"}, "static"}, {DNS{Name: "x", Port: 1}, "dns"}, {&DNS{Name: "x", Port: 1}, "dns"},
		{&Kube{}, "kubernetes"}, {countingSource{}, "other"},
	} {
		if got := sourceKind(c.s); got != c.want {
			t.Errorf("sourceKind(%T) = %q, want %q", c.s, got, c.want)
		}
	}
}
