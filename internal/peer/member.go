package peer

import (
	"bufio"
	"context"
	"errors"
	"io"
	"log"
	"log/slog"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvroute/kvroute/internal/config"
)

// meta is what a replica tells the others about itself through memberlist. A replica reads
// the fields it knows and skips the others (msgpack's default), so fields can be added: an
// older build reads a newer one's metadata as before, and a newer one reads an older one's
// without a policy or hashing (policy.go).
type meta struct {
	Major int    `msgpack:"v"`
	Feed  int    `msgpack:"feed"` // the event stream server's port, at the member's address
	Inc   uint64 `msgpack:"inc"`
	// Policy and PolicyFP are the routing policy's name and the fingerprint of its effective
	// parameters (Node.SetPolicy); left out before SetPolicy, as in older builds' metadata.
	Policy   string `msgpack:"pol,omitempty"`
	PolicyFP string `msgpack:"pfp,omitempty"`
	// HashingFP is the fingerprint of its hashing of prompts into blocks (Node.SetHashing);
	// left out before SetHashing, as in older builds' metadata.
	HashingFP string `msgpack:"hfp,omitempty"`
}

// delegate is memberlist's view of the node: its metadata, and membership changes (which only
// wake the manager: memberlist calls these with its locks held).
type delegate struct{ n *Node }

func (d delegate) NodeMeta(limit int) []byte {
	mt := meta{Major: Major, Feed: d.n.ln.Addr().(*net.TCPAddr).Port, Inc: d.n.cfg.Incarnation}
	pol := d.n.ownPolicy()
	mt.Policy, mt.PolicyFP = pol.name, pol.fp
	mt.HashingFP = d.n.ownHashing().fp
	b, _ := msgpack.Marshal(mt)
	if len(b) > limit {
		// Never the case with SetPolicy's and SetHashing's bounds; without its policy and
		// hashing the replica is still a peer, where without metadata it would not be.
		mt.Policy, mt.PolicyFP, mt.HashingFP = "", "", ""
		b, _ = msgpack.Marshal(mt)
	}
	if len(b) > limit {
		return nil
	}
	return b
}
func (d delegate) NotifyMsg([]byte)                           {}
func (d delegate) GetBroadcasts(overhead, limit int) [][]byte { return nil }
func (d delegate) LocalState(join bool) []byte                { return nil }
func (d delegate) MergeRemoteState(buf []byte, join bool)     {}
func (d delegate) NotifyJoin(m *memberlist.Node)              { d.n.members.set(m); d.n.changed() }
func (d delegate) NotifyLeave(m *memberlist.Node)             { d.n.members.drop(m); d.n.changed() }
func (d delegate) NotifyUpdate(m *memberlist.Node)            { d.n.members.set(m); d.n.changed() }

// members is memberlist's view of the live members, copied as it changes. The nodes that
// Memberlist.Members returns are memberlist's own, which it writes under its lock when a
// member's state, address or metadata changes: reading them from here races (the race detector
// caught it when a restarted replica took its name back at another address). The event
// callbacks run under that lock, so they can copy.
type members struct {
	mu     sync.Mutex
	byName map[string]member
}

// member is one live member: its gossip address and metadata.
type member struct {
	gossip string
	meta   []byte
}

func (ms *members) set(m *memberlist.Node) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if ms.byName == nil {
		ms.byName = map[string]member{}
	}
	ms.byName[m.Name] = member{gossip: net.JoinHostPort(m.Addr.String(), strconv.Itoa(int(m.Port))), meta: slices.Clone(m.Meta)}
}

func (ms *members) drop(m *memberlist.Node) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	delete(ms.byName, m.Name)
}

// each calls f for every live member but the one named self.
func (ms *members) each(self string, f func(name string, m member)) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	for name, m := range ms.byName {
		if name != self {
			f(name, m)
		}
	}
}

// NotifyConflict hears of a member named like another at a different address. About a peer's
// name it needs nothing here; about this replica's, a peer still places it at the other
// address: the rejoin loop is woken to announce this replica (Node.reclaimName).
func (d delegate) NotifyConflict(existing, other *memberlist.Node) {
	if existing.Name != d.n.cfg.Name {
		return
	}
	d.n.claim.Store(&nameClaim{addr: net.JoinHostPort(other.Addr.String(), strconv.Itoa(int(other.Port))), at: time.Now()})
	select {
	case d.n.clock.rejoin <- struct{}{}:
	default:
	}
}

// NotifyMerge sees a peer's whole member list when this replica exchanges state with it on
// joining or announcing (Node.announce). A peer that still places this replica's name at
// another address, alive or suspected, is a claim as NotifyConflict's is. Without it the claim
// was heard only while peers sent the previous run as alive: once they suspected it, nothing
// renewed the claim, and the announcements could stop (nameClaimFresh) just before the peers
// saw the previous run dead, leaving them without this run until their next periodic state
// exchange, 30 s or more later (TestRestartAtNewAddress failed so about one run in six).
func (d delegate) NotifyMerge(peers []*memberlist.Node) error {
	self := d.n.GossipAddr()
	for _, p := range peers {
		if p.Name != d.n.cfg.Name || p.State != memberlist.StateAlive && p.State != memberlist.StateSuspect {
			continue
		}
		if addr := net.JoinHostPort(p.Addr.String(), strconv.Itoa(int(p.Port))); addr != self && self != "" {
			d.n.claim.Store(&nameClaim{addr: addr, at: time.Now()})
		}
	}
	return nil
}

// changed wakes the manager.
func (n *Node) changed() {
	select {
	case n.notify <- struct{}{}:
	default:
	}
}

// startMembers creates the memberlist: SWIM failure detection with LAN timings, gossip
// encrypted and authenticated (AES-GCM) under a key derived from the shared secret.
func (n *Node) startMembers(ctx context.Context) (*memberlist.Memberlist, error) {
	host, port, err := net.SplitHostPort(n.cfg.Gossip)
	if err != nil {
		return nil, err
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return nil, err
	}
	c := memberlist.DefaultLANConfig()
	c.Name = n.cfg.Name
	c.BindAddr, c.BindPort = host, p
	if host == "" {
		c.BindAddr = "0.0.0.0"
	}
	wait := or(n.cfg.resolveWait, advertiseWait)
	lookup := n.cfg.lookup
	if lookup == nil {
		lookup = net.DefaultResolver.LookupNetIP
	}
	adv, resolved, err := resolveAdvertise(ctx, lookup, net.InterfaceAddrs, n.cfg.Advertise, c.BindAddr, wait, advertiseRetry,
		func(err error) {
			n.log.Info("peers.advertise does not resolve yet: asking again each second", "host", n.cfg.Advertise,
				"for", wait.String(), "err", err)
		}, n.log.Warn)
	if err != nil {
		return nil, err
	}
	if adv == "" && config.AdvertisesUnspecified(host) {
		return nil, unspecifiedError(n.cfg.Gossip)
	}
	if resolved {
		n.log.Info("peers.advertise resolved: this replica advertises its address", "host", n.cfg.Advertise, "ip", adv)
	}
	c.AdvertiseAddr = adv
	c.Keyring = n.keyring
	// Gossip messages are pings, acks and a few members' states: too small for compression to
	// save anything, and memberlist allocates an LZW writer (tens of kB) for every message
	// it compresses. A replica still reads the compressed messages of one that compresses.
	c.EnableCompression = false
	c.TCPTimeout = 2 * time.Second
	// A replica restarted at another address under its name (a crash, then a new pod or
	// container of the same name) takes its name back as soon as its previous run is seen dead,
	// not only when that run left (Node.reclaimName).
	c.DeadNodeReclaimTime = time.Nanosecond
	// Gossip once a second, not every 200 ms (the LAN default): failure detection rests on the
	// probes (ProbeInterval 1 s, unchanged), and news (a suspicion, a death, a join) also rides
	// on every probe and ack, so that among a few replicas it spreads at least once a second
	// either way. An idle replica wakes four times a second less (docs/sync-cost.md, "At
	// `049e509`"). A graceful leave would reach the peers with the next gossip or probe, up
	// to a second after, and memberlist's Leave waits for more: Node.leave hands it to them.
	c.GossipInterval = time.Second
	c.Delegate = delegate{n}
	c.Events = delegate{n}
	c.Conflict = delegate{n}
	c.Merge = delegate{n}
	c.Logger = nil
	c.LogOutput = &logWriter{log: n.log, self: n.cfg.Name, stopping: n.stopping,
		undecryptable: func() { n.m.Dropped.WithLabelValues("unauthenticated").Inc() }}
	nt, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{BindAddrs: []string{c.BindAddr}, BindPort: p,
		Logger: log.New(c.LogOutput, "", 0)})
	if err != nil {
		return nil, err
	}
	// With port 0 the transport picked one: memberlist advertises it.
	c.BindPort = nt.GetAutoBindPort()
	c.AdvertisePort = c.BindPort
	st := newStreamTransport(nt)
	n.transport = st
	c.Transport = st
	if n.cfg.FaultInjection {
		c.Transport = newFaultTransport(st, &n.isolated)
	}
	if n.cfg.transport != nil {
		c.Transport = n.cfg.transport(c.Transport)
	}
	ml, err := memberlist.Create(c)
	if err != nil {
		_ = st.Shutdown() // memberlist leaves it bound (an advertise address it cannot parse)
		return nil, err
	}
	self := ml.LocalNode()
	addr := net.JoinHostPort(self.Addr.String(), strconv.Itoa(int(self.Port)))
	n.self.Store(&addr)
	return ml, nil
}

// GossipAddr is the address peers join this replica at (after Run has started).
func (n *Node) GossipAddr() string {
	if a := n.self.Load(); a != nil {
		return *a
	}
	return ""
}

// alive returns the peers memberlist knows alive (suspects among them, until declared dead), of
// this major version, itself left out.
func (n *Node) alive() []peerInfo {
	ml := n.ml.Load()
	if ml == nil {
		return nil
	}
	var out []peerInfo
	n.members.each(n.cfg.Name, func(name string, m member) {
		var mt meta
		if err := msgpack.Unmarshal(m.meta, &mt); err != nil || mt.Major != Major || mt.Feed <= 0 {
			return
		}
		host, _, _ := net.SplitHostPort(m.gossip)
		out = append(out, peerInfo{name: name, inc: mt.Inc, feed: net.JoinHostPort(host, strconv.Itoa(mt.Feed))})
	})
	slices.SortFunc(out, func(a, b peerInfo) int { return strings.Compare(a.name, b.name) })
	return out
}

// manage keeps one follower per peer alive: a new peer is followed, one that left (or
// restarted) is let go and its attempts in flight here are ended; and it compares the peers'
// policies with this replica's (checkPolicies). It checks at each change of the members or
// of this replica's policy, and at each tick of the node's clock (in case a change was missed).
func (n *Node) manage(ctx context.Context) {
	for {
		n.reconcileFollows(ctx)
		n.checkPolicies()
		select {
		case <-ctx.Done():
			n.mu.Lock()
			for _, f := range n.follows {
				f.cancel()
				<-f.done
			}
			n.mu.Unlock()
			return
		case <-n.notify:
		}
	}
}

func (n *Node) reconcileFollows(ctx context.Context) {
	peers := n.alive()
	n.m.Members.Set(float64(len(peers)))
	if n.cfg.Replicas != nil {
		n.cfg.Replicas(len(peers) + 1)
	}
	// The policy places its share of a burst by its rank among the replicas (names sorted), and
	// expects its peers' placements up to a batch interval late (policy.Replicated). A replica cut
	// off from its peers still has them routing beside it, so they are counted while alive.
	rank := 0
	for _, p := range peers {
		if p.name < n.cfg.Name {
			rank++
		}
	}
	if sh := n.share.Load(); sh != nil {
		sh.SetReplicas(len(peers)+1, rank, n.cfg.BatchInterval)
	}
	want := map[string]peerInfo{}
	if !n.isolated.Load() {
		for _, p := range peers {
			want[p.name] = p
		}
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	now := time.Now()
	for name, f := range n.follows {
		if p, ok := want[name]; ok && p == f.p {
			continue
		}
		f.cancel()
		<-f.done
		delete(n.follows, name)
		n.keepResume(f)
		if k := n.share.Load().ForgetOrigin(f.p.origin()); k > 0 {
			n.log.Info("peer gone: its requests in flight are ended here", "peer", name, "requests", k)
		}
	}
	n.pruneKept(now)
	for name, p := range want {
		if _, ok := n.follows[name]; ok {
			continue
		}
		fctx, cancel := context.WithCancel(ctx)
		f := &following{p: p, cancel: cancel, done: make(chan struct{})}
		f.heard.Store(now.UnixNano())
		resumes := n.takeResume(f)
		n.follows[name] = f
		go func() {
			defer close(f.done)
			n.follow(fctx, f)
		}()
		n.log.Info("following a peer", "peer", name, "at", p.feed, "resumes", resumes)
	}
}

// rejoin asks the sources for peers and joins the ones memberlist does not know alive: at
// start every second until one answers, then every RejoinInterval, which heals a partition
// after which each side had declared the other dead.
func (n *Node) rejoin(ctx context.Context) {
	for {
		wait := n.cfg.RejoinInterval
		switch {
		case n.isolated.Load():
		case n.reclaimName(ctx):
			wait = time.Second
		case len(n.cfg.Sources) > 0:
			if n.joinSources(ctx) == 0 && len(n.alive()) == 0 {
				wait = time.Second
			}
		}
		n.waitRejoin(ctx, wait)
		if ctx.Err() != nil {
			return
		}
	}
}

// joinSources joins the addresses the sources give that are not alive members already, and
// returns how many it joined.
func (n *Node) joinSources(ctx context.Context) int {
	alive := map[string]bool{n.GossipAddr(): true}
	n.members.each(n.cfg.Name, func(_ string, m member) { alive[m.gossip] = true })
	listed, complete := n.sourceAddrs(ctx)
	var addrs []string
	want := map[string]bool{}
	for _, a := range listed {
		if !alive[a] {
			addrs = append(addrs, a)
			want[a] = true
		}
	}
	// The failures of an address no source lists any more are forgotten (unless a source
	// failed: it may list it again), and so are a member's.
	n.joins.forget(func(a string) bool { return want[a] || !complete && !alive[a] })
	if len(addrs) == 0 {
		return 0
	}
	k, errs := n.joinRound(ctx, addrs)
	if err := errors.Join(errs...); err != nil && strings.Contains(strings.ToLower(err.Error()), "decrypt") && time.Since(n.secretWarned) > time.Minute {
		// A replica whose secret differs hears no peer at all: say why, once a minute.
		n.secretWarned = time.Now()
		n.log.Warn("joining peers: "+secretHint, "addrs", addrs, "joined", k, "err", err)
	}
	return k
}

// nameClaim is a peer's word that this replica's name lives at another address.
type nameClaim struct {
	addr string
	at   time.Time
}

// claimRun is the rejoin loop's account of a run of name claims.
type claimRun struct {
	since     time.Time // when the run began; zero: none runs
	announced time.Time // when this replica last announced itself against it
	warned    bool      // the duplicate name was logged
}

const (
	// nameClaimFresh ends a run of claims: while one holds, each announcement (a second
	// apart) brings it again.
	nameClaimFresh = 5 * time.Second
	// duplicateNameAfter: a claim that holds this long is another replica given the same name.
	// A crashed run is seen dead much sooner: memberlist's suspicion lasts at most 6 times its
	// 4-probe minimum (24 s with LAN timings), and the peers' probes find it gone first.
	duplicateNameAfter = 90 * time.Second
)

// reclaimName answers peers that place this replica's name at another address, and says
// whether a run of such claims is on. memberlist keeps a name at the address it knows until
// that member is dead, and a new run of a replica at a new address (restarted after a crash
// under its name, say a StatefulSet's pod on another node) announces itself once, at its join,
// when the previous run is not dead yet: the peers took it only at their next state exchange,
// 30 s or more later (9 to 58 s measured, TestRestartAtNewAddress). While the claims last it
// exchanges state with every peer once a second, so that the peers take its address as soon as
// they see the previous run dead. A claim that outlasts duplicateNameAfter is another replica
// of the same name: it is logged as the configuration error it is, and announced against at the
// rejoin pace only.
func (n *Node) reclaimName(ctx context.Context) bool {
	r := &n.claims
	now := time.Now()
	c := n.claim.Load()
	if c == nil || now.Sub(c.at) >= nameClaimFresh {
		if !r.since.IsZero() {
			n.log.Info("peers place this replica's name at its address", "after", now.Sub(r.since).Round(time.Millisecond).String())
		}
		*r = claimRun{}
		return false
	}
	if r.since.IsZero() {
		r.since = now
		n.log.Info("peers place this replica's name at another address (a previous run of it, until they see that one dead): announcing this one",
			"name", n.cfg.Name, "other", c.addr)
	}
	pace := time.Second
	if now.Sub(r.since) >= or(n.cfg.duplicate, duplicateNameAfter) {
		if !r.warned {
			r.warned = true
			n.log.Error("another replica answers to this replica's name: give each replica its own peers.name",
				"name", n.cfg.Name, "other", c.addr, "for", now.Sub(r.since).Round(time.Second).String())
		}
		pace = n.cfg.RejoinInterval
	}
	if now.Sub(r.announced) < pace-pace/10 {
		return pace == time.Second
	}
	r.announced = now
	n.announce(ctx)
	return pace == time.Second
}

// announce exchanges state with every peer memberlist knows alive and every address the
// sources give: each takes this replica's state, this one theirs.
func (n *Node) announce(ctx context.Context) {
	self := n.GossipAddr()
	var addrs []string
	add := func(a string) {
		if a != self && !slices.Contains(addrs, a) {
			addrs = append(addrs, a)
		}
	}
	n.members.each(n.cfg.Name, func(_ string, m member) { add(m.gossip) })
	listed, _ := n.sourceAddrs(ctx)
	for _, a := range listed {
		add(a)
	}
	if len(addrs) == 0 {
		return
	}
	if _, errs := n.joinRound(ctx, addrs); len(errs) > 0 {
		n.log.Debug("announcing this replica to its peers", "addrs", addrs, "err", errors.Join(errs...))
	}
}

func urlEscape(s string) string { return url.QueryEscape(s) }

// logWriter forwards memberlist's log lines to slog, memberlist's text under "line" (slog's
// own message key is the router's explanation; a second "msg" would hide it from the JSON
// readers that keep the last of a duplicated key, jq and Python's json among them): errors and
// warnings as warnings, the rest at debug level. Once the node is stopping, everything is at
// debug level: leaving, its probes and gossip in flight meet the sockets it is closing ("use
// of closed network connection"), which at every rolling restart read as errors. A refuted
// dead message is news, not trouble (info): the peers had this replica's name dead, as they
// have after every restart under the same name (its previous run) and after a pause long
// enough to be declared dead (SIGSTOP, a long GC, a starved CPU, which other lines show); it
// says it is alive. So is a refuted alive message (refutedAliveMsg): the peers still had the
// previous run alive. And so is a refuted suspicion that memberlist says came from this
// replica itself (refutedSuspectMsg): it read the suspicion in a peer's state on joining or
// exchanging state with it, which is where a restarted replica finds its previous run
// suspected. A suspicion from a peer (its probes of this replica failed: lost packets, a
// pause) stays a warning. An error or warning about gossip that no key here decrypts (a
// replica given another secret) is said as such (secretHint), at most once a minute per remote
// host and within the bounds on all hosts (secretLimit: hostLimiter) with the count of those
// not logged since; memberlist's debug lines about it (each failed join) stay at debug level,
// the rejoin loop's "joining peers" warning saying what to fix once a minute.
type logWriter struct {
	log *slog.Logger
	// self is this replica's name (Config.Name): memberlist's "from" in a suspicion it read in
	// a peer's state.
	self     string
	stopping <-chan struct{}
	// undecryptable, when set, is told of each gossip message that no key could decrypt: one
	// sealed with another secret (counted as unauthenticated).
	undecryptable func()
	// secretLimit bounds the warnings of undecryptable gossip to one per remote host per
	// minute: a replica given another secret retries its joins, probes and state exchanges
	// about once a second, and each failure was a WARN.
	secretLimit hostLimiter
}

// secretHint is said with gossip that could not be decrypted: the usual cause.
const secretHint = "gossip that this replica's peers secret cannot decrypt: does every replica have the same peers.secret_file or secret_env?"

func (w *logWriter) Write(p []byte) (int, error) {
	stopping := false
	select {
	case <-w.stopping:
		stopping = true
	default:
	}
	sc := bufio.NewScanner(strings.NewReader(string(p)))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case !stopping && strings.Contains(strings.ToLower(line), "decrypt"):
			if w.undecryptable != nil {
				w.undecryptable()
			}
			if !strings.Contains(line, "[ERR]") && !strings.Contains(line, "[WARN]") {
				w.log.Debug("memberlist: "+secretHint, "line", line)
				break
			}
			remote := remoteOf(line)
			host, _, err := net.SplitHostPort(remote)
			if err != nil {
				host = remote
			}
			if skipped, others, ok := w.secretLimit.due(host); ok {
				w.log.Warn(secretHint, withOthers([]any{"remote", remote, "undecryptable_unlogged", skipped, "line", line}, others)...)
			} else {
				w.log.Debug("memberlist: "+secretHint, "line", line)
			}
		case !stopping && strings.Contains(line, "Refuting a dead message"):
			w.log.Info("memberlist: peers had this replica dead (its previous run, or a pause); it says it is alive", "line", line)
		case !stopping && strings.Contains(line, "Refuting an alive message"):
			w.log.Info(refutedAliveMsg, refutedAlive(line)...)
		case !stopping && w.self != "" && strings.HasSuffix(strings.TrimRight(line, " \r"), "Refuting a suspect message (from: "+w.self+")"):
			w.log.Info(refutedSuspectMsg, "line", line)
		case !stopping && (strings.Contains(line, "[ERR]") || strings.Contains(line, "[WARN]")):
			w.log.Warn("memberlist", "line", line)
		default:
			w.log.Debug("memberlist", "line", line)
		}
	}
	return len(p), nil
}

// remoteOf returns the remote address a memberlist line names ("from=ADDR", its last word
// of that form), "" where it names none.
func remoteOf(line string) string {
	i := strings.LastIndex(line, "from=")
	if i < 0 {
		return ""
	}
	addr, _, _ := strings.Cut(line[i+len("from="):], " ")
	return addr
}

// streamTransport is memberlist's network transport whose streams end when it shuts down,
// both ways. Outgoing: the state exchanges (a join's, the leave's and a policy's handed to
// each peer, the periodic ones) and the TCP pings. Inbound: the peers' state exchanges and TCP
// pings, each of which memberlist handles in a goroutine of its own. memberlist's transport
// leaves a stream to its TCP timeout (2 s here), and its Shutdown closes only the listeners:
// a peer that takes the connection and never answers (frozen: its kernel accepts for it) or
// never takes it (cut off) held an outgoing stream, and one that sent part of a message and
// stalled held an inbound one, with the goroutine that waits on it, for up to 2 s after the
// node had stopped. Once Shutdown has begun, a dial in progress ends and none begins, and an
// inbound stream accepted is closed at once; waitHandlers then waits for memberlist's handlers
// of the inbound streams to have ended.
type streamTransport struct {
	*memberlist.NetTransport
	ctx    context.Context // ends at Shutdown
	cancel context.CancelFunc
	mu     sync.Mutex
	open   map[*streamConn]struct{} // the streams not closed, both ways; nil once shut down
	// streams hands memberlist the inbound streams, kept in open; handlers counts those whose
	// handler has not closed them (every handler does as it ends).
	streams  chan net.Conn
	handlers sync.WaitGroup
	done     chan struct{} // closed once Shutdown has shut memberlist's transport down
}

func newStreamTransport(nt *memberlist.NetTransport) *streamTransport {
	ctx, cancel := context.WithCancel(context.Background())
	t := &streamTransport{NetTransport: nt, ctx: ctx, cancel: cancel, open: map[*streamConn]struct{}{},
		streams: make(chan net.Conn), done: make(chan struct{})}
	go t.forward()
	return t
}

// forward hands memberlist the inbound streams, each kept to be closed at Shutdown. It reads
// until memberlist's transport has shut down: its listeners hand each connection over without
// a timeout, and its Shutdown waits for them.
func (t *streamTransport) forward() {
	for {
		var c net.Conn
		select {
		case c = <-t.NetTransport.StreamCh():
		case <-t.done:
			return
		}
		t.mu.Lock()
		if t.open == nil {
			t.mu.Unlock()
			_ = c.Close()
			continue
		}
		sc := &streamConn{Conn: c, t: t, inbound: true}
		t.open[sc] = struct{}{}
		t.handlers.Add(1)
		t.mu.Unlock()
		select {
		case t.streams <- sc:
		case <-t.done:
			_ = sc.Close()
			return
		}
	}
}

// StreamCh is memberlist's transport's channel of inbound streams, each kept to be closed at
// Shutdown.
func (t *streamTransport) StreamCh() <-chan net.Conn { return t.streams }

// errTransportShutDown is a dial's error once the transport has shut down.
var errTransportShutDown = errors.New("memberlist transport shut down")

// DialTimeout dials as memberlist's transport does, but ends at Shutdown.
func (t *streamTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return t.DialAddressTimeout(memberlist.Address{Addr: addr}, timeout)
}

// DialAddressTimeout dials as memberlist's transport does (TCP, within timeout), but ends at
// Shutdown, and keeps the stream to close it then.
func (t *streamTransport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	d := net.Dialer{Timeout: timeout}
	c, err := d.DialContext(t.ctx, "tcp", a.Addr)
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.open == nil {
		_ = c.Close()
		return nil, errTransportShutDown
	}
	sc := &streamConn{Conn: c, t: t}
	t.open[sc] = struct{}{}
	return sc, nil
}

// Shutdown ends the dials in progress and closes the streams both ways (their reads and
// writes fail at once), then shuts memberlist's transport down.
func (t *streamTransport) Shutdown() error {
	t.cancel()
	t.mu.Lock()
	open := t.open
	t.open = nil
	t.mu.Unlock()
	for c := range open {
		_ = c.Conn.Close()
	}
	err := t.NetTransport.Shutdown()
	close(t.done)
	return err
}

// waitHandlers waits until memberlist's handler of each inbound stream has ended (closed it),
// wait at most, and says whether they all have. Call it once Shutdown has returned: their
// streams are closed, and none is handed over after it.
func (t *streamTransport) waitHandlers(wait time.Duration) bool {
	done := make(chan struct{})
	go func() {
		t.handlers.Wait()
		close(done)
	}()
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case <-done:
		return true
	case <-timer.C:
		return false
	}
}

// streamConn is a stream of a streamTransport, outgoing or inbound.
type streamConn struct {
	net.Conn
	t       *streamTransport
	inbound bool
	closed  sync.Once
}

// Close closes the stream. An inbound stream's handler closes it as it ends (memberlist's
// handleConn, on every path): its first Close counts the handler done.
func (c *streamConn) Close() error {
	c.t.mu.Lock()
	delete(c.t.open, c)
	c.t.mu.Unlock()
	if c.inbound {
		c.closed.Do(c.t.handlers.Done)
	}
	return c.Conn.Close()
}

var _ memberlist.NodeAwareTransport = (*streamTransport)(nil)

// refutedAliveMsg says what memberlist's "Refuting an alive message" means here. The peers
// hold a state of this replica's name, at its address, that is not this run's: the previous
// run's, after a restart (kill -9, a crash, an OOM kill) quicker than the peers' failure
// detection, with its incarnation number and metadata (another run's incarnation, perhaps
// another policy). memberlist answers with this run's state at a higher number, which the peers
// take in its place, and follow this run. memberlist logs it as a warning with both metadata as
// byte lists.
const refutedAliveMsg = "memberlist: peers still had this replica's previous run (a quick restart) or other metadata of it: it announces this run's state at a higher incarnation, which replaces it"

// refutedSuspectMsg says what memberlist's "Refuting a suspect message (from: <this replica>)"
// means: memberlist names this replica as the suspicion's sender when it takes the suspicion
// from a peer's state (a join, a state exchange), as a restarted replica does of its previous
// run, which the peers suspect until they declare it dead.
const refutedSuspectMsg = "memberlist: peers suspected this replica (its previous run, after a restart under its name; or a pause), as a state exchange with them told: it says it is alive"

// refutedAlive returns the attributes of a "Refuting an alive message" line: the address
// the peers held, and the incarnations of the runs in the two metadata (held_incarnation, the
// peers'; incarnation, this run's), each where the line gives it.
//
//	[WARN] memberlist: Refuting an alive message for 'r2' (10.0.0.12:7946) meta:([133 161 118 ...] VS [133 ...]), vsn:([1 5 2 0 0 0] VS [1 5 2 0 0 0])
func refutedAlive(line string) []any {
	var attrs []any
	if i := strings.LastIndex(line, "' ("); i >= 0 {
		if addr, _, ok := strings.Cut(line[i+len("' ("):], ") meta:("); ok {
			attrs = append(attrs, "at", addr)
		}
	}
	i := strings.LastIndex(line, "meta:(")
	if i < 0 {
		return attrs
	}
	metas, _, ok := strings.Cut(line[i+len("meta:("):], ")")
	if !ok {
		return attrs
	}
	held, own, ok := strings.Cut(metas, " VS ")
	if !ok {
		return attrs
	}
	for _, m := range []struct{ key, list string }{{"held_incarnation", held}, {"incarnation", own}} {
		if mt, ok := metaOfList(m.list); ok {
			attrs = append(attrs, m.key, mt.Inc)
		}
	}
	return attrs
}

// metaOfList decodes a replica's metadata written as fmt writes a byte slice: "[133 161 ...]".
func metaOfList(list string) (meta, bool) {
	list, ok := strings.CutPrefix(list, "[")
	if !ok {
		return meta{}, false
	}
	if list, ok = strings.CutSuffix(list, "]"); !ok || list == "" {
		return meta{}, false
	}
	var b []byte
	for f := range strings.FieldsSeq(list) {
		v, err := strconv.ParseUint(f, 10, 8)
		if err != nil {
			return meta{}, false
		}
		b = append(b, byte(v))
	}
	var mt meta
	if err := msgpack.Unmarshal(b, &mt); err != nil || mt.Inc == 0 {
		return meta{}, false
	}
	return mt, true
}

// faultTransport is memberlist's transport with a switch that drops everything, both ways:
// how a test cuts a replica off from its peers while it keeps serving.
type faultTransport struct {
	inner   *streamTransport
	off     *atomic.Bool
	packets chan *memberlist.Packet
	streams chan net.Conn
	done    chan struct{}
}

func newFaultTransport(inner *streamTransport, off *atomic.Bool) *faultTransport {
	t := &faultTransport{inner: inner, off: off, packets: make(chan *memberlist.Packet), streams: make(chan net.Conn),
		done: make(chan struct{})}
	go func() {
		for {
			select {
			case p := <-inner.PacketCh():
				if t.off.Load() {
					continue
				}
				select {
				case t.packets <- p:
				case <-t.done:
					return
				}
			case <-t.done:
				return
			}
		}
	}()
	go func() {
		for {
			select {
			case c := <-inner.StreamCh():
				if t.off.Load() {
					_ = c.Close()
					continue
				}
				select {
				case t.streams <- c:
				case <-t.done:
					_ = c.Close()
					return
				}
			case <-t.done:
				return
			}
		}
	}()
	return t
}

func (t *faultTransport) FinalAdvertiseAddr(ip string, port int) (net.IP, int, error) {
	return t.inner.FinalAdvertiseAddr(ip, port)
}

func (t *faultTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	if t.off.Load() {
		return time.Now(), nil
	}
	return t.inner.WriteTo(b, addr)
}

func (t *faultTransport) PacketCh() <-chan *memberlist.Packet { return t.packets }

func (t *faultTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	if t.off.Load() {
		return nil, errIsolated
	}
	return t.inner.DialTimeout(addr, timeout)
}

func (t *faultTransport) StreamCh() <-chan net.Conn { return t.streams }

// Shutdown shuts the inner transport down, then the forwarders. The inner listeners hand each
// packet and connection over without a timeout, and wait for nothing else: stopped first, the
// forwarders left one read in that instant (peers that take this replica for alive send a few
// a second) holding a listener, and the inner Shutdown waiting for it, for good. memberlist
// reads this transport's channels until Shutdown has returned.
func (t *faultTransport) Shutdown() error {
	err := t.inner.Shutdown()
	close(t.done)
	return err
}

var errIsolated = errors.New("cut off from peers (fault injection)")

var _ io.Writer = (*logWriter)(nil)
