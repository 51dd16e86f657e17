package peer

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/h1"
	"github.com/kvroute/kvroute/internal/metrics"
	"github.com/kvroute/kvroute/internal/policy"
	"github.com/kvroute/kvroute/internal/prefix"
	"github.com/kvroute/kvroute/internal/route"
)

// Config configures a Node. Listen, Gossip and Secret are required.
type Config struct {
	// Name names this replica among its peers; it must be unique. "": the host name and the
	// gossip port.
	Name string
	// Incarnation tells this run of the replica from earlier ones; 0: the start time.
	Incarnation uint64
	// Listen is the address of the event stream server (HTTP, cleartext without ServerTLS),
	// host:port.
	Listen string
	// Gossip is memberlist's address (TCP and UDP), host:port.
	Gossip string
	// Advertise is the host or IP peers reach this replica at; "": memberlist's choice (the
	// gossip address, or a private address when that is unspecified). A host name is resolved
	// once, when Run starts, to an address of the gossip listener's family (advertise.go).
	Advertise string
	// Sources find the peers to join.
	Sources []Source
	// Secret is the shared secret, at least 32 bytes; message MACs and gossip encryption use
	// keys derived from it.
	Secret []byte
	// Accept is a second secret accepted from peers but never used to send (a rotation's
	// other secret: docs/replicas.md, "Rotating the secret"); nil: none. SetSecrets changes
	// both while the node runs.
	Accept []byte
	// ServerTLS and ClientTLS, when set, carry the event streams and snapshots over TLS
	// (MutualTLS makes both); nil: cleartext.
	ServerTLS, ClientTLS *tls.Config
	// BatchInterval is how long events wait to be sent together; 0: DefaultBatchInterval.
	BatchInterval time.Duration
	// MaxMessageBytes bounds a message either way; 0: DefaultMaxMessageBytes.
	MaxMessageBytes int
	// Queue is the batches queued per peer before its stream is cut; 0: DefaultQueue.
	Queue int
	// WarmStartTimeout bounds the wait for a peer's snapshot at start; 0:
	// DefaultWarmStartTimeout.
	WarmStartTimeout time.Duration
	// SnapshotMaxBytes bounds a snapshot; 0: DefaultSnapshotMaxBytes.
	SnapshotMaxBytes int64
	// RejoinInterval is how often the sources are asked again and the peers found joined
	// (this heals partitions); 0: DefaultRejoinInterval.
	RejoinInterval time.Duration
	// FaultInjection serves POST /debug/peers/isolate (tests: cut this replica off from its
	// peers and back).
	FaultInjection bool
	// Logger; nil: slog.Default().
	Logger *slog.Logger
	// Metrics; nil: collectors nobody scrapes.
	Metrics *metrics.Peers
	// Replicas, when set, is told how many replicas are alive, this one included (kvroute_peers
	// plus one), at each membership check: each change of the members and each tick of the
	// node's clock, so it hears the same count again. It runs on the manager's goroutine:
	// it must return quickly. Nil: nobody is told.
	Replicas func(n int)
	// beat and silence replace heartbeat and streamSilence (tests); 0: those.
	beat, silence time.Duration
	// idle replaces streamServerIdle (tests); 0: that.
	idle time.Duration
	// transport, when set, wraps memberlist's transport (tests: hold a state exchange).
	transport func(memberlist.Transport) memberlist.Transport
	// duplicate replaces duplicateNameAfter (tests); 0: that.
	duplicate time.Duration
	// mismatchGrace replaces mismatchGrace (tests); 0: that.
	mismatchGrace time.Duration
	// resolveWait replaces advertiseWait (tests); 0: that.
	resolveWait time.Duration
	// lookup replaces the system resolver for peers.advertise (tests, which ask no DNS server);
	// nil: net.DefaultResolver.
	lookup lookupFunc
}

// Defaults of Config.
const (
	DefaultBatchInterval    = 10 * time.Millisecond
	DefaultMaxMessageBytes  = 4 << 20
	DefaultQueue            = 1024
	DefaultWarmStartTimeout = 10 * time.Second
	DefaultSnapshotMaxBytes = 64 << 20
	DefaultRejoinInterval   = 10 * time.Second
)

// Node is one router replica's side of the sync: it publishes the lifecycle's events
// (Publish, as route.Sync), follows every peer's, serves snapshots and takes one at start.
//
//	n, _ := peer.New(cfg)
//	share := route.NewShare(route.ShareConfig{Self: n.Origin(), Out: n, ...})
//	n.Attach(share, lifecycle, endpoints)
//	go n.Run(ctx)          // ready (n.Ready) once warm, or after WarmStartTimeout
type Node struct {
	cfg  Config
	keys atomic.Pointer[keySet] // the secrets' keys in force (SetSecrets swaps them)
	// rekeyed is closed, and replaced, when SetSecrets changes the keys: the feeds served
	// under a key no longer accepted end.
	rekeyed  atomic.Pointer[chan struct{}]
	keyring  *memberlist.Keyring
	secretMu sync.Mutex // serialises SetSecrets
	origin   uint64
	log      *slog.Logger
	m        *metrics.Peers
	hub      *hub
	in, out  traffic
	ln       net.Listener
	client   *http.Client
	// secretWarned is when joining peers last failed for want of the secret (logged once a
	// minute); only the rejoin loop touches it.
	secretWarned time.Time
	// claim is the latest news that a peer places this replica's name at another address
	// (memberlist's conflict callback stores it); claims is the rejoin loop's account of them.
	claim  atomic.Pointer[nameClaim]
	claims claimRun
	// joins are the joins in flight and the addresses that failed (join.go); sourceFailing
	// says, per source, whether its last answer was a failure (only the rejoin loop touches it).
	joins         *joiner
	sourceFailing []bool
	// exchanges are the state exchanges in flight that handState and joinRound started and
	// stopped waiting for; Run waits for them once memberlist's shutdown has ended them.
	exchanges sync.WaitGroup
	// transport is memberlist's, whose shutdown ends the streams both ways; Run waits for
	// memberlist's handlers of the inbound ones (streamTransport.waitHandlers). Set by
	// startMembers, read by Run only.
	transport *streamTransport

	share     atomic.Pointer[route.Share]
	lifecycle func() *route.Lifecycle
	endpoints func() []*endpoint.Endpoint

	ml       atomic.Pointer[memberlist.Memberlist]
	members  members                // memberlist's live members, copied
	self     atomic.Pointer[string] // our gossip address, host:port, once memberlist runs
	isolated atomic.Bool
	ready    atomic.Bool
	readyCh  chan struct{}
	notify   chan struct{}
	stopping chan struct{}

	mu      sync.Mutex
	follows map[string]*following // by peer name
	// kept are the points at which the streams of peers let go left off, by peer name, for
	// when they come back (follow.go, keptResume).
	kept map[string]keptResume

	// policy is the routing policy this replica advertises (SetPolicy), hashing its hashing
	// of prompts (SetHashing); readvertise asks Run to gossip them; policies and hashings are
	// the peers' as last compared with them (the manager's), and Metrics' PolicyMismatch and
	// HashingMismatch count those that differ.
	policy      atomic.Pointer[policyID]
	hashing     atomic.Pointer[policyID]
	readvertise chan struct{}
	policies    policyWatch
	hashings    policyWatch
	// advertised counts the advertisements begun (advertise); a join that saw it change
	// advertises again (joinRound).
	advertised atomic.Uint64

	// beat and silence are heartbeat and streamSilence (tests shorten them).
	beat, silence time.Duration
	clock         *clock
}

// New checks cfg and binds the event stream listener. It starts nothing: call Attach, then Run.
func New(cfg Config) (*Node, error) {
	var errs []error
	if err := checkSecrets(cfg.Secret, cfg.Accept); err != nil {
		errs = append(errs, err)
	}
	_, gport, err := net.SplitHostPort(cfg.Gossip)
	if err != nil {
		errs = append(errs, fmt.Errorf("peers.gossip_listen %q: %w", cfg.Gossip, err))
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if cfg.Name == "" {
		host, _ := os.Hostname()
		cfg.Name = net.JoinHostPort(host, gport)
	}
	if cfg.Incarnation == 0 {
		cfg.Incarnation = uint64(time.Now().UnixNano())
	}
	cfg.BatchInterval = or(cfg.BatchInterval, DefaultBatchInterval)
	cfg.MaxMessageBytes = or(cfg.MaxMessageBytes, DefaultMaxMessageBytes)
	cfg.Queue = or(cfg.Queue, DefaultQueue)
	cfg.WarmStartTimeout = or(cfg.WarmStartTimeout, DefaultWarmStartTimeout)
	cfg.SnapshotMaxBytes = or(cfg.SnapshotMaxBytes, DefaultSnapshotMaxBytes)
	cfg.RejoinInterval = or(cfg.RejoinInterval, DefaultRejoinInterval)
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Metrics == nil {
		cfg.Metrics = metrics.NewPeers(prometheus.NewRegistry())
	}
	// Every reason the lifecycle drops an event for has its series from the start, at 0.
	for _, r := range route.DropReasons() {
		cfg.Metrics.Dropped.WithLabelValues(r)
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("peers.listen: %w", err)
	}
	// The streams' reads and writes are raw system calls (h1.WrapConn): a batch read or
	// written on a replica whose processors are idle between requests does not wake the
	// runtime's sysmon. TLS goes over the wrapped connection.
	ln = h1.WrapListener(ln)
	if cfg.ServerTLS != nil {
		ln = tls.NewListener(ln, cfg.ServerTLS)
	}
	n := &Node{cfg: cfg, log: cfg.Logger.With("replica", cfg.Name), m: cfg.Metrics, ln: ln,
		origin: origin(cfg.Name, cfg.Incarnation), readyCh: make(chan struct{}),
		notify: make(chan struct{}, 1), stopping: make(chan struct{}), follows: map[string]*following{},
		kept: map[string]keptResume{},
		beat: or(cfg.beat, heartbeat), silence: or(cfg.silence, streamSilence),
		joins: newJoiner(), sourceFailing: make([]bool, len(cfg.Sources)),
		readvertise: make(chan struct{}, 1),
		policies:    policyWatch{about: policySubject, grace: or(cfg.mismatchGrace, mismatchGrace)},
		hashings:    policyWatch{about: hashingSubject, grace: or(cfg.mismatchGrace, mismatchGrace)}}
	n.clock = newClock(n.beat, n.silence)
	n.keys.Store(newKeySet(cfg.Secret, cfg.Accept))
	rekeyed := make(chan struct{})
	n.rekeyed.Store(&rekeyed)
	if n.keyring, err = n.keys.Load().keyring(); err != nil {
		_ = ln.Close()
		return nil, fmt.Errorf("peers: %w", err)
	}
	n.in, n.out = newTraffic(cfg.Metrics, "in"), newTraffic(cfg.Metrics, "out")
	// The batch is flushed at a quarter of the largest message, so that one event more never
	// makes a message too large to send.
	n.hub = newHub(cfg.MaxMessageBytes/4, cfg.Queue, cfg.BatchInterval, cfg.Metrics)
	// HTTP/1.1: a stream's messages go straight from the handler to the socket and from the
	// socket to the reader, where HTTP/2 adds a goroutine hop and flow-control frames to each
	// (measured: 4 to 5 % of a replica's CPU at 1,000 requests/s). The server speaks both.
	var protos http.Protocols
	protos.SetHTTP1(true)
	dialer := &net.Dialer{Timeout: 2 * time.Second}
	n.client = &http.Client{Transport: &http.Transport{
		Protocols: &protos,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := dialer.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return h1.WrapConn(c), nil // raw reads and writes, as the listener's (above)
		},
		TLSClientConfig: cfg.ClientTLS,
	}}
	return n, nil
}

// traffic is one direction's counters, their labels resolved once rather than per message.
type traffic struct {
	messages, bytes, events prometheus.Counter
}

func newTraffic(m *metrics.Peers, direction string) traffic {
	return traffic{m.Messages.WithLabelValues(direction), m.Bytes.WithLabelValues(direction), m.Events.WithLabelValues(direction)}
}

func or[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// Name is this replica's name among its peers.
func (n *Node) Name() string { return n.cfg.Name }

// Metrics returns the node's collectors.
func (n *Node) Metrics() *metrics.Peers { return n.m }

// Origin is the route.Event origin of this replica's events (route.ShareConfig.Self).
func (n *Node) Origin() uint64 { return n.origin }

// Addr is the event stream server's address.
func (n *Node) Addr() net.Addr { return n.ln.Addr() }

// Publish sends a local lifecycle event to the peers (route.Sync): encoded at once into the
// pending batch, never blocking.
func (n *Node) Publish(ev *route.Event) { n.hub.publish(ev) }

// Attach gives the node the share its lifecycles use, the lifecycle in force (a reload may
// replace it) and the endpoints (for the snapshot's names). Call it before Run.
func (n *Node) Attach(share *route.Share, lifecycle func() *route.Lifecycle, endpoints func() []*endpoint.Endpoint) {
	n.share.Store(share)
	n.lifecycle = lifecycle
	n.endpoints = endpoints
	n.m.WatchRemote(func() (int, int64) {
		st := share.Stats()
		return st.Remote, st.Expired
	})
	lag := newLagWatch()
	n.m.WatchPeers(func() map[string]time.Time {
		members := n.alive()
		n.mu.Lock()
		follows := maps.Clone(n.follows)
		n.mu.Unlock()
		return lag.heard(time.Now(), follows, members)
	})
}

// lagKept is how long after it was last heard a peer that is neither followed nor a member
// any more (declared dead, gone) keeps its kvroute_peer_sync_lag_seconds series: long enough
// for the lag's alert (> 30 s for 5 min) to fire, bounded so that the peers of a rolling
// restart, each with a new name, go.
const lagKept = 10 * time.Minute

// lagWatch tells when each peer was last heard, for kvroute_peer_sync_lag_seconds. The
// followers alone would not do: a peer stops being followed as soon as this replica is cut off
// from it, or it is declared dead, and its series would end at a lag of a few seconds, never
// above the alert's 30. So a peer's lag is reported, growing, while it is followed, while
// memberlist knows it (alive or suspect: from when it was first seen, if never heard), and for
// lagKept after it was last heard.
type lagWatch struct {
	mu   sync.Mutex
	seen map[string]lagSeen
}

// lagSeen is a peer as lagWatch last saw it: its follower (whose last heard time stays once
// it is let go), or, for a member never followed, when it was first seen.
type lagSeen struct {
	f     *following
	since time.Time
}

func newLagWatch() *lagWatch { return &lagWatch{seen: map[string]lagSeen{}} }

// heard returns when each peer to report was last heard, given the followers and members now.
func (w *lagWatch) heard(now time.Time, follows map[string]*following, members []peerInfo) map[string]time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	for name, f := range follows {
		w.seen[name] = lagSeen{f: f}
	}
	member := make(map[string]bool, len(members))
	for _, p := range members {
		member[p.name] = true
		if _, ok := w.seen[p.name]; !ok {
			w.seen[p.name] = lagSeen{since: now}
		}
	}
	out := make(map[string]time.Time, len(w.seen))
	for name, s := range w.seen {
		at := s.since
		if s.f != nil {
			at = time.Unix(0, s.f.heard.Load())
		}
		if follows[name] == nil && !member[name] && now.Sub(at) > lagKept {
			delete(w.seen, name)
			continue
		}
		out[name] = at
	}
	return out
}

// Ready reports whether the warm start is over (a snapshot taken, or the wait given up).
func (n *Node) Ready() bool { return n.ready.Load() }

// WaitReady returns a channel closed when the node is ready.
func (n *Node) WaitReady() <-chan struct{} { return n.readyCh }

// Run joins the peers, serves and follows event streams, and takes a snapshot before it
// reports ready, until ctx ends; then it leaves the group and stops.
func (n *Node) Run(ctx context.Context) error {
	if n.share.Load() == nil || n.lifecycle == nil {
		return errors.New("peer: Run before Attach")
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+pathFeed, n.serveFeed)
	mux.HandleFunc("GET "+pathSnapshot, n.serveSnapshot)
	var protos http.Protocols
	protos.SetHTTP1(true)
	protos.SetUnencryptedHTTP2(true)
	srv := &http.Server{Handler: mux, Protocols: &protos, ReadHeaderTimeout: 5 * time.Second,
		IdleTimeout: or(n.cfg.idle, streamServerIdle),
		ErrorLog:    newServerLog(n.log, n.m.Dropped, time.Now).errorLog()}
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := srv.Serve(n.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			n.log.Error("peer stream server stopped", "err", err)
		}
	})
	ml, err := n.startMembers(ctx)
	if err != nil {
		close(n.stopping)
		_ = srv.Close()
		wg.Wait()
		return err
	}
	n.ml.Store(ml)
	wg.Go(func() { n.manage(ctx) })
	wg.Go(func() { n.rejoin(ctx) })
	wg.Go(func() { n.tick(ctx) })
	wg.Go(func() { n.warmStart(ctx) })
	wg.Go(func() { n.advertise(ctx, ml) })
	<-ctx.Done()
	close(n.stopping)
	// Every step of the stop is bounded: the leave by leaveWait, memberlist's shutdown by
	// shutdownWait, and the goroutines each by its own (a stream's or snapshot's request and a
	// join round end with ctx, a policy's advertisement waits updateWait at most). The state
	// exchanges still in flight, both ways (with a peer frozen or cut off, or one that stalled
	// sending), end with memberlist's shutdown, which closes their connections
	// (streamTransport); they are waited for last, when nothing can start another.
	begin := time.Now()
	told, peers := n.leave(ml)
	leaveTook := time.Since(begin)
	shut := n.shutdownMembers(ml)
	_ = srv.Close()
	wg.Wait()
	n.waitExchanges(shut)
	n.log.Info("left the peers", "peers", peers, "told", told, "leave", leaveTook.Round(time.Millisecond).String(),
		"took", time.Since(begin).Round(time.Millisecond).String())
	return nil
}

const (
	// leaveWait bounds the wait for the live peers to take this replica's leave at stop: a
	// peer frozen, or cut off, is told by memberlist's gossip meanwhile, or sees this replica
	// fail. It is half of serve's stop budget for discovery, checks, scrapes and peers (2 s).
	leaveWait = time.Second
	// shutdownWait bounds the wait for memberlist to close its sockets and stop its
	// listeners, and then the wait for the state exchanges it ended.
	shutdownWait = time.Second
)

// leave tells the live peers that this replica leaves, and returns how many took it, of how
// many, once each has or leaveWait has passed. memberlist's Leave marks this replica left and
// queues the news for gossip, then waits until the queue has sent it its retransmit limit: 4
// sends among up to 9 members, on gossip rounds (a second apart here, at most one send to
// each peer a round), pings and acks. With one peer that is never within a second, and Leave
// ran to its timeout at every stop (1.0 s); with two, half of the time. Here Leave only marks
// and queues (its wait is cut to nothing), and each live peer is handed the news at once
// (handState), which it takes as the leave it is, as from gossip.
func (n *Node) leave(ml *memberlist.Memberlist) (told, peers int) {
	addrs := n.peerAddrs()
	// With peers alive, Leave says its wait timed out: the news is queued all the same.
	_ = ml.Leave(time.Nanosecond)
	return n.handState(context.Background(), ml, addrs, leaveWait, "telling the peers this replica leaves")
}

// peerAddrs returns the gossip addresses of the live peers.
func (n *Node) peerAddrs() []string {
	var addrs []string
	n.members.each(n.cfg.Name, func(_ string, m member) { addrs = append(addrs, m.gossip) })
	return addrs
}

// handState hands this replica's state (its own entry: alive or left, its incarnation and
// metadata) to each of addrs by a state exchange, memberlist's push-pull, which Join makes,
// all at once; each peer takes it as it would from gossip. It returns how many took it, of how
// many, once each has, wait has passed or ctx has ended; what says what is handed in the debug
// lines.
func (n *Node) handState(ctx context.Context, ml *memberlist.Memberlist, addrs []string, wait time.Duration, what string) (told, peers int) {
	if len(addrs) == 0 {
		return 0, 0
	}
	// Room for every answer: a state exchange that ends after the wait never blocks. One
	// still in flight then ends within memberlist's TCP timeout (2 s), or at its shutdown if
	// the node stops first (Run waits for it: n.exchanges), and changes nothing anyone reads.
	results := make(chan error, len(addrs))
	for _, a := range addrs {
		n.exchanges.Go(func() {
			_, err := ml.Join([]string{a})
			results <- err
		})
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for range addrs {
		select {
		case err := <-results:
			if err != nil {
				n.log.Debug(what, "err", err)
				continue
			}
			told++
		case <-timer.C:
			n.log.Debug(what+": not all answered", "told", told, "peers", len(addrs), "waited", wait.String())
			return told, len(addrs)
		case <-ctx.Done():
			return told, len(addrs)
		}
	}
	return told, len(addrs)
}

// shutdownMembers shuts memberlist down, waiting shutdownWait at most, and says whether it
// did: a transport that never stops (the fault-injection one once did:
// TestFaultTransportShutdown) must not hold the stop.
func (n *Node) shutdownMembers(ml *memberlist.Memberlist) bool {
	done := make(chan struct{})
	go func() {
		_ = ml.Shutdown()
		close(done)
	}()
	select {
	case <-done:
		return true
	case <-time.After(shutdownWait):
		n.log.Warn("memberlist did not shut down: stopping without it", "waited", shutdownWait.String())
		return false
	}
}

// waitExchanges waits for the state exchanges still in flight at stop, shutdownWait at most
// in all: those this replica started and, once memberlist has shut down (shut), memberlist's
// handlers of the peers'. memberlist's shutdown has closed their connections and ends their
// dials: each has failed, or is about to (a transport that did not shut down is the
// exception, logged).
func (n *Node) waitExchanges(shut bool) {
	deadline := time.Now().Add(shutdownWait)
	done := make(chan struct{})
	go func() {
		n.exchanges.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(shutdownWait):
		n.log.Warn("state exchanges with peers still in flight: stopping without them", "waited", shutdownWait.String())
		return
	}
	if shut && n.transport != nil && !n.transport.waitHandlers(time.Until(deadline)) {
		n.log.Warn("peers' state exchanges with this replica still in flight: stopping without them", "waited", shutdownWait.String())
	}
}

// streamServerIdle closes a connection to the stream server that carries no request (HTTP/1)
// or no stream (HTTP/2) for that long: a peer's feed is a stream open for as long as it
// follows, so only connections that were refused, or never asked anything, are closed, and
// clients without the secret cannot hold connections (and their file descriptors) open.
const streamServerIdle = 30 * time.Second

// snapshotHeadWait bounds the wait for one peer's answer to a snapshot request: a quarter of
// the warm start, at least half a second, so that a peer that never answers leaves time for
// the others.
func (n *Node) snapshotHeadWait() time.Duration {
	return max(n.cfg.WarmStartTimeout/4, 500*time.Millisecond)
}

// warmStart takes a snapshot from a peer, trying those alive until one answers or the
// timeout passes, then reports ready whatever happened.
func (n *Node) warmStart(ctx context.Context) {
	defer func() {
		n.ready.Store(true)
		close(n.readyCh)
	}()
	if len(n.cfg.Sources) == 0 {
		n.m.WarmStarts.WithLabelValues("off").Inc()
		return
	}
	start := time.Now()
	deadline := start.Add(n.cfg.WarmStartTimeout)
	tried := false
	for time.Now().Before(deadline) {
		for _, p := range n.alive() {
			tried = true
			sctx, cancel := context.WithDeadline(ctx, deadline)
			res, err := n.fetchSnapshot(sctx, p)
			cancel()
			if err != nil {
				n.log.Warn("snapshot from a peer failed", "from", p.name, "err", err)
				continue
			}
			n.m.WarmStarts.WithLabelValues("ok").Inc()
			n.m.SnapshotTaken(res.taken)
			n.log.Info("warm start: took a peer's snapshot", "from", p.name, "index_entries", res.entries,
				"in_flight", res.flights, "stale_events", res.stale, "bytes", res.bytes, "took", time.Since(start).Round(time.Millisecond).String())
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
	if tried {
		n.m.WarmStarts.WithLabelValues("failed").Inc()
		n.log.Warn("warm start: no peer's snapshot could be taken; ready with an empty index", "waited", n.cfg.WarmStartTimeout.String())
		return
	}
	n.m.WarmStarts.WithLabelValues("none").Inc()
	n.log.Warn("warm start: no peer found; ready with an empty index", "waited", n.cfg.WarmStartTimeout.String())
}

// writeIndex writes the policy's snapshot, if it keeps one, bounded by SnapshotMaxBytes.
func (n *Node) writeIndex(w io.Writer) (int, error) {
	sn, ok := n.lifecycle().Picker().(policy.Snapshotter)
	if !ok {
		return 0, nil
	}
	names := map[int]string{}
	for _, e := range n.endpoints() {
		names[e.ID] = e.Name
	}
	return sn.WriteSnapshot(w, func(id int) string { return names[id] }, n.maxSnapshotEntries())
}

// readIndex takes a policy snapshot into the policy in force. The endpoints are those of the
// pool as the read starts; one that leaves while it runs is marked so (endpoint.Draining)
// before the policy forgets it, and the policy takes nothing more of it.
func (n *Node) readIndex(r io.Reader) (int, error) {
	sn, ok := n.lifecycle().Picker().(policy.Snapshotter)
	if !ok {
		return 0, nil
	}
	byName := map[string]*endpoint.Endpoint{}
	for _, e := range n.endpoints() {
		byName[e.Name] = e
	}
	return sn.ReadSnapshot(r, func(name string) *endpoint.Endpoint { return byName[name] }, n.maxSnapshotEntries())
}

func (n *Node) maxSnapshotEntries() int {
	return int(max(n.cfg.SnapshotMaxBytes/prefix.SnapshotEntryBytes, 1))
}

// signRequest is the signature of a peer request: what it asks (path), who asks (from, inc),
// its nonce and time, and whom (to).
func signRequest(key []byte, path, from string, inc uint64, nonce []byte, ts int64, to string) string {
	mac := hmac.New(sha256.New, key)
	fmt.Fprintf(mac, "%s\n%s\n%d\n%x\n%d\n%s", path, from, inc, nonce, ts, to)
	return hex.EncodeToString(mac.Sum(nil))
}

// Request parameters and header of the peer API.
const (
	authHeader   = "X-Kvroute-Peer-Signature"
	resumeHeader = "X-Kvroute-Peer-Resume-Signature"
	maxSkew      = time.Minute
)

// newRequest builds a request for path to peer p, signed with key (this replica's signing
// key, which the answer's messages are then signed with).
func (n *Node) newRequest(ctx context.Context, p peerInfo, path string, key []byte) (*http.Request, [nonceSize]byte, error) {
	var nonce [nonceSize]byte
	_, _ = rand.Read(nonce[:])
	ts := time.Now().Unix()
	u := fmt.Sprintf("%s://%s%s?from=%s&inc=%d&nonce=%x&ts=%d", n.scheme(), p.feed, path, urlEscape(n.cfg.Name), n.cfg.Incarnation, nonce, ts)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, nonce, err
	}
	req.Header.Set(authHeader, signRequest(key, path, n.cfg.Name, n.cfg.Incarnation, nonce[:], ts, p.name))
	return req, nonce, nil
}

// askResume adds to a feed request the point of the peer's run (inc) after which this replica
// asks for the feed's batches: after, the last one it applied. It is signed apart, over the
// request's own signature (and so its nonce, time, sender and receiver): a replica of minor 3
// or older verifies the request as before and ignores it.
func askResume(req *http.Request, key []byte, inc, after uint64) {
	q := req.URL.Query()
	q.Set("resume_inc", strconv.FormatUint(inc, 10))
	q.Set("resume_after", strconv.FormatUint(after, 10))
	req.URL.RawQuery = q.Encode()
	req.Header.Set(resumeHeader, signResume(key, req.Header.Get(authHeader), inc, after))
}

// signResume is the signature of a feed request's resume point, bound to the request's
// signature sig.
func signResume(key []byte, sig string, inc, after uint64) string {
	mac := hmac.New(sha256.New, key)
	fmt.Fprintf(mac, "resume\n%s\n%d\n%d", sig, inc, after)
	return hex.EncodeToString(mac.Sum(nil))
}

// resumePoint reads the resume point of a feed request verified under key: ok is false when
// it asks none; an error when its parameters are malformed or their signature does not
// verify (the request is then refused whole).
func resumePoint(r *http.Request, key []byte) (inc, after uint64, ok bool, err error) {
	q := r.URL.Query()
	if !q.Has("resume_inc") && !q.Has("resume_after") && r.Header.Get(resumeHeader) == "" {
		return 0, 0, false, nil
	}
	inc, err1 := strconv.ParseUint(q.Get("resume_inc"), 10, 64)
	after, err2 := strconv.ParseUint(q.Get("resume_after"), 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, 0, false, fmt.Errorf("malformed resume point (%v)", err)
	}
	if !hmac.Equal([]byte(signResume(key, r.Header.Get(authHeader), inc, after)), []byte(r.Header.Get(resumeHeader))) {
		return 0, 0, false, errors.New("bad resume signature")
	}
	return inc, after, true, nil
}

// verifyRequest checks a peer request's signature and age, and returns its nonce and the key
// it was signed with (one of those accepted).
func (n *Node) verifyRequest(r *http.Request, path string, now time.Time) (nonce [nonceSize]byte, key []byte, err error) {
	q := r.URL.Query()
	from := q.Get("from")
	inc, err1 := strconv.ParseUint(q.Get("inc"), 10, 64)
	ts, err2 := strconv.ParseInt(q.Get("ts"), 10, 64)
	raw, err3 := hex.DecodeString(q.Get("nonce"))
	if err := errors.Join(err1, err2, err3); err != nil || len(raw) != nonceSize || from == "" {
		return nonce, nil, fmt.Errorf("malformed request (%v)", err)
	}
	if d := now.Sub(time.Unix(ts, 0)); d > maxSkew || d < -maxSkew {
		return nonce, nil, fmt.Errorf("request time %d is %v away", ts, d)
	}
	got := []byte(r.Header.Get(authHeader))
	for _, k := range n.keys.Load().accept {
		if hmac.Equal([]byte(signRequest(k, path, from, inc, raw, ts, n.cfg.Name)), got) {
			copy(nonce[:], raw)
			return nonce, k, nil
		}
	}
	return nonce, nil, errors.New("bad signature")
}

// AdminRoutes adds GET /debug/peers (members, streams, in-flight counts, as JSON) and, with
// FaultInjection, POST /debug/peers/isolate?on=true|false to mux.
func (n *Node) AdminRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /debug/peers", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(n.Status())
	})
	if !n.cfg.FaultInjection {
		return
	}
	mux.HandleFunc("POST /debug/peers/isolate", func(w http.ResponseWriter, r *http.Request) {
		on, err := strconv.ParseBool(r.URL.Query().Get("on"))
		if err != nil {
			http.Error(w, "want on=true or on=false", http.StatusBadRequest)
			return
		}
		n.Isolate(on)
		_, _ = fmt.Fprintf(w, "isolated=%v\n", on)
	})
}

// Isolate cuts this replica off from its peers (on) or lets it back: gossip packets and
// streams are dropped both ways, event streams end and are refused. For fault-injection
// tests (FaultInjection); the replica keeps routing on what it knows.
func (n *Node) Isolate(on bool) {
	if n.isolated.Swap(on) == on {
		return
	}
	n.log.Warn("peer fault injection", "isolated", on)
	if on {
		n.hub.breakAll()
	}
	n.changed()
}

// Status is what GET /debug/peers shows.
type Status struct {
	Name        string   `json:"name"`
	Incarnation uint64   `json:"incarnation"`
	Ready       bool     `json:"ready"`
	Isolated    bool     `json:"isolated"`
	Members     []string `json:"members"`
	// Following names the peers this replica follows; Streaming, those of them whose event
	// stream is open now (a followed peer whose stream cannot connect is missing from it).
	Following []string `json:"following"`
	Streaming []string `json:"streaming"`
	// NameClaimedAt is the other address at which peers still place this replica's name, while
	// they do: a previous run of this replica until they see it dead, or another replica
	// given the same peers.name.
	NameClaimedAt string `json:"name_claimed_at,omitempty"`
	Remote        int    `json:"remote_in_flight"`
	Local         int    `json:"local_in_flight"`
	// Applied counts the other replicas' events replayed here; Coalesced, the requests among
	// them whose routed, first token and done came together and were replayed as one.
	Applied   int64 `json:"events_applied"`
	Coalesced int64 `json:"requests_coalesced"`
	// Feed is this replica's own feed: its last batch's number, its log of recent batches
	// (for peers that resume), and the streams that resumed, the batches resent to them and
	// the resumes refused (the log no longer held the point, or it was of another run).
	Feed FeedStatus `json:"feed"`
	// Policy is the routing policy this replica advertises (SetPolicy) and how many peers
	// advertise another; Hashing, the same of its hashing of prompts (SetHashing);
	// PeerPolicies, each member's policy and hashing, and whether each matches this one's.
	Policy       PolicyStatus  `json:"policy"`
	Hashing      HashingStatus `json:"hashing"`
	PeerPolicies []PeerPolicy  `json:"peer_policies"`
}

// Status describes the node now.
func (n *Node) Status() Status {
	st := Status{Name: n.cfg.Name, Incarnation: n.cfg.Incarnation, Ready: n.Ready(), Isolated: n.isolated.Load(),
		Members: []string{}, Following: []string{}, Streaming: []string{}}
	for _, p := range n.alive() {
		st.Members = append(st.Members, p.name)
	}
	n.mu.Lock()
	for name, f := range n.follows {
		st.Following = append(st.Following, name)
		if f.connected.Load() {
			st.Streaming = append(st.Streaming, name)
		}
	}
	n.mu.Unlock()
	slices.Sort(st.Following)
	slices.Sort(st.Streaming)
	if c := n.claim.Load(); c != nil && time.Since(c.at) < nameClaimFresh {
		st.NameClaimedAt = c.addr
	}
	if sh := n.share.Load(); sh != nil {
		s := sh.Stats()
		st.Remote, st.Local, st.Applied, st.Coalesced = s.Remote, s.Local, s.Applied, s.Coalesced
	}
	st.Feed = n.hub.stats()
	own := n.ownPolicy()
	st.Policy.Name, st.Policy.Fingerprint = own.name, own.fp
	st.Hashing.Fingerprint = n.ownHashing().fp
	byName := map[string]*PeerPolicy{}
	st.Policy.Mismatches = n.policies.status(byName)
	st.Hashing.Mismatches = n.hashings.status(byName)
	st.PeerPolicies = peerPolicies(byName)
	return st
}
