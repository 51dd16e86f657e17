package peer

import (
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvroute/kvroute/internal/metrics"
	"github.com/kvroute/kvroute/internal/testlog"
)

// Fingerprints of the tests: the router's are hashes; here any text will do.
var (
	polA = policyID{name: "prefix-aware", fp: "aaaa"}
	polB = policyID{name: "prefix-aware", fp: "bbbb"}
	polC = policyID{name: "cache-aware", fp: "cccc"}
)

// TestPolicyWatch: step by step, a difference is logged once per peer and per change of
// either side, its end once; a peer or a replica that advertises no policy differs from none.
func TestPolicyWatch(t *testing.T) {
	var logs testlog.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	var w policyWatch
	differs, agrees := "routes by another policy", "routes by the same policy"
	step := func(what string, own policyID, peers map[string]policyID, wantDiffer, wantDiffersLogged, wantAgreesLogged int) {
		t.Helper()
		before := logs.String()
		got := w.check(own, peers, log)
		added := strings.TrimPrefix(logs.String(), before)
		if got != wantDiffer || strings.Count(added, differs) != wantDiffersLogged || strings.Count(added, agrees) != wantAgreesLogged {
			t.Errorf("%s: %d differ (want %d), logged:\n%s\nwant %d differences and %d agreements logged",
				what, got, wantDiffer, added, wantDiffersLogged, wantAgreesLogged)
		}
	}
	step("b differs", polA, map[string]policyID{"b": polB, "c": polA}, 1, 1, 0)
	if got := logs.String(); !strings.Contains(got, "peer=b") || !strings.Contains(got, "peer_fingerprint=bbbb") ||
		!strings.Contains(got, "fix=\"the peer:") || !strings.Contains(got, "compare their configs' `policy:`") {
		t.Errorf("the line does not name the peer, its fingerprint, the side to fix and the hint:\n%s", got)
	}
	step("nothing changed", polA, map[string]policyID{"b": polB, "c": polA}, 1, 0, 0)
	step("b changes again, still differing", polA, map[string]policyID{"b": polC, "c": polA}, 1, 1, 0)
	step("an older build joins", polA, map[string]policyID{"b": polC, "c": polA, "old": {}}, 1, 0, 0)
	// d joins with b's policy: it is news, and so is b's, whose side to fix is now unclear.
	before := logs.String()
	step("d joins, as b", polA, map[string]policyID{"b": polC, "c": polA, "d": polC, "old": {}}, 2, 2, 0)
	if added := strings.TrimPrefix(logs.String(), before); strings.Count(added, "fix=\"either:") != 2 {
		t.Errorf("want no side to fix with two replicas on each side:\n%s", added)
	}
	step("b agrees", polA, map[string]policyID{"b": polA, "c": polA, "d": polC, "old": {}}, 1, 1, 1) // d's side to fix is clear again
	step("d leaves", polA, map[string]policyID{"b": polA, "c": polA, "old": {}}, 0, 0, 0)
	step("still agreeing", polA, map[string]policyID{"b": polA, "c": polA, "old": {}}, 0, 0, 0)
	// This replica reloads to another policy: both peers differ, and it is the one to fix.
	before = logs.String()
	step("this replica changes", polB, map[string]policyID{"b": polA, "c": polA, "old": {}}, 2, 2, 0)
	if added := strings.TrimPrefix(logs.String(), before); strings.Count(added, "fix=\"this replica:") != 2 {
		t.Errorf("want this replica named the side to fix:\n%s", added)
	}
	step("b leaves", polB, map[string]policyID{"c": polA, "old": {}}, 1, 1, 0) // c's side to fix: unclear
	step("b is back, differing", polB, map[string]policyID{"b": polA, "c": polA, "old": {}}, 2, 2, 0)
	step("this replica stops advertising", policyID{}, map[string]policyID{"b": polA, "c": polA, "old": {}}, 0, 0, 0)

	got, k := w.status()
	yes := true
	want := []PeerPolicy{{Name: "b", Policy: "prefix-aware", Fingerprint: "aaaa"}, {Name: "c", Policy: "prefix-aware", Fingerprint: "aaaa"}, {Name: "old"}}
	if diff := cmp.Diff(want, got); diff != "" || k != 0 {
		t.Errorf("status (-want +got):\n%s\n%d differ", diff, k)
	}
	w.check(polA, map[string]policyID{"b": polA, "c": polB, "old": {}}, log)
	got, k = w.status()
	no := false
	want = []PeerPolicy{{Name: "b", Policy: "prefix-aware", Fingerprint: "aaaa", Matches: &yes},
		{Name: "c", Policy: "prefix-aware", Fingerprint: "bbbb", Matches: &no}, {Name: "old"}}
	if diff := cmp.Diff(want, got); diff != "" || k != 1 {
		t.Errorf("status (-want +got):\n%s\n%d differ, want 1", diff, k)
	}
}

// oldMeta is the metadata of the builds before the policy was advertised.
type oldMeta struct {
	Major int    `msgpack:"v"`
	Feed  int    `msgpack:"feed"`
	Inc   uint64 `msgpack:"inc"`
}

// TestMetaCompatible: a replica that advertises no policy sends the metadata of the older
// builds byte for byte, an older build reads a newer one's as before, and the largest policy
// SetPolicy advertises fits memberlist's limit with room to spare.
func TestMetaCompatible(t *testing.T) {
	old, err := msgpack.Marshal(oldMeta{Major: Major, Feed: 7947, Inc: 1 << 62})
	if err != nil {
		t.Fatal(err)
	}
	none, _ := msgpack.Marshal(meta{Major: Major, Feed: 7947, Inc: 1 << 62})
	if string(none) != string(old) {
		t.Errorf("metadata without a policy %x, the older builds' %x", none, old)
	}
	full, _ := msgpack.Marshal(meta{Major: Major, Feed: 7947, Inc: 1 << 62,
		Policy: strings.Repeat("p", maxPolicyName), PolicyFP: strings.Repeat("f", maxPolicyFingerprint)})
	var got oldMeta
	if err := msgpack.Unmarshal(full, &got); err != nil || got != (oldMeta{Major: Major, Feed: 7947, Inc: 1 << 62}) {
		t.Errorf("an older build reads %+v (%v)", got, err)
	}
	if len(full) > 256 {
		t.Errorf("metadata of %d bytes with the largest policy; memberlist takes 512 at most", len(full))
	}
	var back meta
	if err := msgpack.Unmarshal(old, &back); err != nil || back.Policy != "" || back.PolicyFP != "" || back.Feed != 7947 {
		t.Errorf("an older build's metadata read as %+v (%v)", back, err)
	}
}

// TestPolicyMismatch: three replicas on loopback, one of them given other parameters. Each
// sees the difference within seconds, logs it once per peer (and side to fix), and counts it in
// kvroute_peers_policy_mismatch and /debug/peers; once the odd one is given the others'
// parameters (a reload), each logs the agreement and the gauge is back to 0.
func TestPolicyMismatch(t *testing.T) {
	var logsA, logsB testlog.Buffer
	reg := prometheus.NewRegistry()
	a := startReplica(t, "a", nil, func(c *Config) { logTo(&logsA)(c); c.Metrics = metrics.NewPeers(reg) })
	a.node.SetPolicy(polA.name, polA.fp) // after Run: gossiped as an update
	b := startReplica(t, "b", []string{a.node.GossipAddr()}, logTo(&logsB))
	b.node.SetPolicy(polB.name, polB.fp)
	c := startReplica(t, "c", []string{a.node.GossipAddr()}, nil)
	c.node.SetPolicy(polA.name, polA.fp)
	mismatches := func(r *replica) int { return int(testutil.ToFloat64(r.node.m.PolicyMismatch)) }
	// The gauges alone can read 1, 2 and 1 before a has c's policy (c unknown to a: b's side to
	// fix still unclear there): wait until each replica has compared every peer's.
	no, yes := false, true
	want := map[*replica][]PeerPolicy{
		a: {{Name: "b", Policy: polB.name, Fingerprint: polB.fp, Matches: &no}, {Name: "c", Policy: polA.name, Fingerprint: polA.fp, Matches: &yes}},
		b: {{Name: "a", Policy: polA.name, Fingerprint: polA.fp, Matches: &no}, {Name: "c", Policy: polA.name, Fingerprint: polA.fp, Matches: &no}},
		c: {{Name: "a", Policy: polA.name, Fingerprint: polA.fp, Matches: &yes}, {Name: "b", Policy: polB.name, Fingerprint: polB.fp, Matches: &no}},
	}
	start := time.Now()
	waitFor(t, 10*time.Second, "each replica knowing every peer's policy, and seeing b's other parameters", func() bool {
		for r, w := range want {
			if !cmp.Equal(w, r.node.Status().PeerPolicies) {
				return false
			}
		}
		return mismatches(a) == 1 && mismatches(b) == 2 && mismatches(c) == 1
	})
	t.Logf("seen within %v", time.Since(start).Round(time.Millisecond))
	if got, err := testutil.GatherAndCount(reg, "kvroute_peers_policy_mismatch"); err != nil || got != 1 ||
		testutil.ToFloat64(a.node.m.PolicyMismatch) != 1 {
		t.Errorf("a's registry: %d series (%v)", got, err)
	}
	if st := a.node.Status(); st.Policy != (PolicyStatus{Name: polA.name, Fingerprint: polA.fp, Mismatches: 1}) {
		t.Errorf("a's /debug/peers policy %+v", st.Policy)
	}
	// Each difference is logged once, and again only if the side to fix changed as replicas
	// joined (b's first look at a, before c joined, found as many replicas on each side).
	if k, final := logsA.Count("routes by another policy"), logsA.Count("peer=b policy=prefix-aware fingerprint=aaaa peer_policy=prefix-aware peer_fingerprint=bbbb fix=\"the peer:"); final != 1 || k > 2 {
		t.Errorf("a logged the difference %d times, %d of them naming b as the side to fix; want that once, and at most one line before it:\n%s", k, final, logsA.String())
	}
	for _, peer := range []string{"a", "c"} {
		if k := logsB.Count("peer=" + peer + " policy=prefix-aware fingerprint=bbbb peer_policy=prefix-aware peer_fingerprint=aaaa fix=\"this replica:"); k != 1 {
			t.Errorf("b logged the difference with %s, itself the side to fix, %d times; want once:\n%s", peer, k, logsB.String())
		}
	}
	warnedA := logsA.Count("routes by another policy")
	b.node.SetPolicy(polA.name, polA.fp)
	waitFor(t, 10*time.Second, "the gauges back to 0", func() bool {
		return mismatches(a) == 0 && mismatches(b) == 0 && mismatches(c) == 0
	})
	if k := logsA.Count("routes by the same policy"); k != 1 {
		t.Errorf("a logged the agreement %d times, want once:\n%s", k, logsA.String())
	}
	if k := logsB.Count("routes by the same policy"); k != 2 {
		t.Errorf("b logged the agreement %d times, want once per peer:\n%s", k, logsB.String())
	}
	if k := logsA.Count("routes by another policy"); k != warnedA {
		t.Errorf("a logged the difference %d times in all, %d before the agreement", k, warnedA)
	}
	if p := a.node.Status().PeerPolicies; len(p) != 2 || p[0].Matches == nil || !*p[0].Matches {
		t.Errorf("a's /debug/peers policies after the reload: %+v", p)
	}
}

// heldJoin is memberlist's transport with the first read of its first connection held until
// release is closed (5 s at most): a join that has sent this replica's state and not yet taken
// the answer.
type heldJoin struct {
	memberlist.NodeAwareTransport
	sent, release chan struct{}
	first         sync.Once
}

func (t *heldJoin) DialAddressTimeout(a memberlist.Address, d time.Duration) (net.Conn, error) {
	c, err := t.NodeAwareTransport.DialAddressTimeout(a, d)
	if err != nil {
		return c, err
	}
	held := false
	t.first.Do(func() { held = true })
	if !held {
		return c, nil
	}
	return &heldConn{Conn: c, t: t}, nil
}

type heldConn struct {
	net.Conn
	t    *heldJoin
	read sync.Once
}

func (c *heldConn) Read(p []byte) (int, error) {
	c.read.Do(func() {
		close(c.t.sent)
		select {
		case <-c.t.release:
		case <-time.After(5 * time.Second):
		}
	})
	return c.Conn.Read(p)
}

// TestPolicyUpdateDuringJoin: a replica whose policy is set while its join is in flight (its
// state sent, the answer not yet taken) has the peers know the policy at once. Its update was
// lost: the join's state predates it, and memberlist's queue of news dropped its gossip when
// the join's answer added the states of the others, the same size (advertise); the peers
// kept the replica's state of before until the state exchange, every 30 s (TestPolicyMismatch
// waited 10 s in vain about one run in 70).
func TestPolicyUpdateDuringJoin(t *testing.T) {
	a := startReplica(t, "a", nil, nil)
	a.node.SetPolicy(polA.name, polA.fp)
	b := startReplica(t, "b", []string{a.node.GossipAddr()}, nil)
	b.node.SetPolicy(polB.name, polB.fp)
	knows := func(r *replica, peer string, id policyID) bool {
		for _, p := range r.node.Status().PeerPolicies {
			if p.Name == peer {
				return p.Policy == id.name && p.Fingerprint == id.fp
			}
		}
		return false
	}
	waitFor(t, 10*time.Second, "a and b knowing each other's policy", func() bool {
		return knows(a, "b", polB) && knows(b, "a", polA)
	})
	held := &heldJoin{sent: make(chan struct{}), release: make(chan struct{})}
	c := startReplica(t, "c", []string{a.node.GossipAddr()}, func(cfg *Config) {
		cfg.transport = func(tr memberlist.Transport) memberlist.Transport {
			held.NodeAwareTransport = tr.(memberlist.NodeAwareTransport)
			return held
		}
	})
	select {
	case <-held.sent:
	case <-time.After(10 * time.Second):
		close(held.release)
		t.Fatal("c's join sent nothing within 10 s")
	}
	c.node.SetPolicy(polA.name, polA.fp)
	waitFor(t, time.Second, "c's update made", func() bool {
		c.node.members.mu.Lock()
		defer c.node.members.mu.Unlock()
		return strings.Contains(string(c.node.members.byName["c"].meta), polA.fp)
	})
	close(held.release)
	waitFor(t, 10*time.Second, "c joined", isFollowing(c, "a", "b"))
	start := time.Now()
	waitFor(t, 5*time.Second, "a and b knowing c's policy", func() bool {
		return knows(a, "c", polA) && knows(b, "c", polA)
	})
	t.Logf("known %v after c's join", time.Since(start).Round(time.Millisecond))
}

// TestPolicyOlderPeer: a peer of an older build advertises no policy: it is followed as ever,
// shown as unknown (policy_matches null), neither counted nor warned of.
func TestPolicyOlderPeer(t *testing.T) {
	var logs testlog.Buffer
	a := startReplica(t, "a", nil, logTo(&logs))
	a.node.SetPolicy(polA.name, polA.fp)
	old := startReplica(t, "old", []string{a.node.GossipAddr()}, func(c *Config) { c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil)) })
	waitFor(t, 10*time.Second, "a following the older build and listing its policy", func() bool {
		return isFollowing(a, "old")() && len(a.node.Status().PeerPolicies) == 1
	})
	if got := a.node.Status().PeerPolicies; got[0] != (PeerPolicy{Name: "old"}) {
		t.Errorf("the older build's policy in /debug/peers: %+v, want unknown", got[0])
	}
	if g := testutil.ToFloat64(a.node.m.PolicyMismatch); g != 0 {
		t.Errorf("kvroute_peers_policy_mismatch %v, want 0", g)
	}
	if strings.Contains(logs.String(), "routes by") {
		t.Errorf("a logged of the older build's policy:\n%s", logs.String())
	}
	if st := old.node.Status(); len(st.PeerPolicies) > 0 && st.PeerPolicies[0].Matches != nil || st.Policy.Mismatches != 0 {
		t.Errorf("the replica without a policy compares: %+v", st.PeerPolicies)
	}
}
