package metrics

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Sync lag: 100 µs (replicas on one host) to 10 s (a stalled stream), neighbours at most 2.5x
// apart.
var lagBuckets = decades(0.0001, 10, 1, 2.5, 5)

// Peers are the collectors of router replica sync (internal/peer): membership, the event
// streams between replicas, what was refused and why, and the warm start.
type Peers struct {
	// Members is the replicas this one knows alive, itself left out (kvroute_peers).
	Members prometheus.Gauge
	// Streams is the event streams this replica receives now, one per peer when all is well.
	Streams prometheus.Gauge
	// Messages, Bytes and Events count what went out to and came in from peers, by direction
	// (in, out). Bytes are on the wire (frames with their MACs), before HTTP/2 framing.
	Messages *prometheus.CounterVec // direction
	Bytes    *prometheus.CounterVec // direction
	Events   *prometheus.CounterVec // direction
	// Dropped counts messages and events refused or not sent, by reason: forged,
	// unauthenticated, replayed, truncated, oversized, malformed, version, queue_full, and
	// what the lifecycle did not apply: late news it needs nothing from (duplicate, ended_here,
	// before_stream, endpoint_left) and what it refused (unknown_request, unknown_endpoint,
	// full, invalid, self); docs/replicas.md says what each means.
	Dropped *prometheus.CounterVec // reason
	// Lag is the time from an event at a peer to its replay here (the oldest event of each
	// message; clocks of different hosts add their offset). kvroute_peer_sync_lag_seconds, by
	// peer, is the time since anything was heard from each peer (heartbeats every second),
	// followed or cut off: what alerting watches.
	Lag prometheus.Histogram
	// WarmStarts counts warm starts by result: ok (a peer's snapshot was taken), none (no
	// peer answered before peers.warm_start_timeout: started cold), failed (every snapshot
	// tried failed), off (no peers configured).
	WarmStarts *prometheus.CounterVec // result
	// Resumes counts the feed requests of peers that asked to resume their stream where the
	// last one broke, by result: resumed (the batches they missed were resent), no_history
	// (the log no longer held the point: too old, or no peer had subscribed for a while),
	// other_run (a point in an earlier run of this replica). A refused one starts afresh.
	Resumes *prometheus.CounterVec // result
	// Resent counts the batches resent to peers that resumed.
	Resent prometheus.Counter
	// SourceErrors counts the times a peer source failed to give addresses, by source kind
	// (dns: the name did not resolve; kubernetes: the EndpointSlices could not be listed;
	// other). The replica keeps the members it has, and asks again at the next rejoin.
	SourceErrors *prometheus.CounterVec // source
	// Expired counts remote requests ended without their end: their replica left, or the TTL
	// ran out.
	Expired prometheus.CounterFunc
	// Remote is the requests other replicas routed that are in flight now, as this one
	// counts them.
	Remote prometheus.GaugeFunc
	// PolicyMismatch is the peers whose routing policy or parameters differ from this
	// replica's, by the fingerprint each advertises (kvroute_peers_policy_mismatch); peers of
	// older builds advertise none and are not counted.
	PolicyMismatch prometheus.Gauge
	// HashingMismatch is the peers that hash prompts into blocks otherwise than this replica
	// (block size, normalisation, where cache salts come from), by the fingerprint each
	// advertises (kvroute_peers_hashing_mismatch): the index entries one makes can miss the
	// other's requests. Peers of older builds advertise none and are not counted.
	HashingMismatch prometheus.Gauge

	snapshotAt atomic.Int64 // unix nanoseconds when the warm-start snapshot was taken; 0: none
	now        func() int64
	remote     atomic.Pointer[func() (inFlight int, expired int64)]
	heard      atomic.Pointer[func() map[string]time.Time]
	syncLag    *prometheus.Desc
}

// NewPeers builds the replica sync collectors and registers them with reg.
func NewPeers(reg prometheus.Registerer) *Peers {
	p := &Peers{
		Members: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvroute_peers", Help: "Router replicas this one knows alive (membership), itself left out.",
		}),
		Streams: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvroute_peer_streams", Help: "Event streams this replica receives from peers now.",
		}),
		Messages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_peer_messages_total", Help: "Messages sent to (out) and received from (in) peers.",
		}, []string{"direction"}),
		Bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_peer_bytes_total", Help: "Bytes of messages sent to (out) and received from (in) peers, MACs included.",
		}, []string{"direction"}),
		Events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_peer_events_total", Help: "Lifecycle events (routed, first token, done, removed) sent to each peer (out) and received (in).",
		}, []string{"direction"}),
		Dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_peer_dropped_total", Help: "Peer messages and events refused, not sent or not applied, by reason (duplicate, ended_here, before_stream and endpoint_left are harmless late news; docs/replicas.md lists every reason).",
		}, []string{"reason"}),
		Lag: prometheus.NewHistogram(histogramOpts(prometheus.HistogramOpts{
			Name: "kvroute_peer_event_lag_seconds", Help: "Time from an event at a peer to its replay here (the oldest event of each message).",
			Buckets: lagBuckets,
		})),
		syncLag: prometheus.NewDesc("kvroute_peer_sync_lag_seconds",
			"Time since anything (events or a heartbeat, sent every second) was heard from each peer: it grows on while a peer is cut off or declared dead, until 10 minutes after it was last heard.", []string{"peer"}, nil),
		WarmStarts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_peer_warm_starts_total", Help: "Warm starts by result: ok (took a peer's snapshot), none (no peer before the timeout), failed, off (no peers configured).",
		}, []string{"result"}),
		Resumes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_peer_resumes_total", Help: "Peers' requests to resume their event stream where it broke, by result: resumed, no_history (the log no longer held the point), other_run.",
		}, []string{"result"}),
		Resent: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvroute_peer_resent_batches_total", Help: "Batches of events resent to peers that resumed their stream.",
		}),
		PolicyMismatch: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvroute_peers_policy_mismatch",
			Help: "Peer replicas whose routing policy or parameters differ from this replica's (by the fingerprint each advertises; replicas of older builds advertise none and are not counted).",
		}),
		HashingMismatch: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvroute_peers_hashing_mismatch",
			Help: "Peer replicas that hash prompts into blocks otherwise than this replica (prefix.block_tokens, normalize, the tenants' salt secret), by the fingerprint each advertises: the index entries one makes can miss the other's requests. Replicas of older builds advertise none and are not counted.",
		}),
		SourceErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_peer_source_errors_total", Help: "Times a peer source failed to give addresses (a DNS name that does not resolve, EndpointSlices not listed), by source kind; the members known stay.",
		}, []string{"source"}),
		now: func() int64 { return time.Now().UnixNano() },
	}
	p.Expired = prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "kvroute_peer_remote_expired_total", Help: "Requests of other replicas ended here without their end: their replica left, or peers.request_ttl ran out.",
	}, func() float64 { _, e := p.remoteStats(); return float64(e) })
	p.Remote = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "kvroute_peer_remote_requests", Help: "Requests other replicas routed that are in flight now, as this replica counts them.",
	}, func() float64 { n, _ := p.remoteStats(); return float64(n) })
	age := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "kvroute_peer_snapshot_age_seconds", Help: "Age of the snapshot this replica started from (0 when it started cold).",
	}, func() float64 {
		at := p.snapshotAt.Load()
		if at == 0 {
			return 0
		}
		return float64(p.now()-at) / 1e9
	})
	reg.MustRegister(p.Members, p.Streams, p.Messages, p.Bytes, p.Events, p.Dropped, p.Lag, p.WarmStarts, p.Resumes, p.Resent,
		p.SourceErrors, p.Expired, p.Remote, p.PolicyMismatch, p.HashingMismatch, age, (*peerLag)(p))
	for _, d := range []string{"in", "out"} {
		p.Messages.WithLabelValues(d)
		p.Bytes.WithLabelValues(d)
		p.Events.WithLabelValues(d)
	}
	for _, r := range []string{"ok", "none", "failed", "off"} {
		p.WarmStarts.WithLabelValues(r)
	}
	for _, r := range []string{"resumed", "no_history", "other_run"} {
		p.Resumes.WithLabelValues(r)
	}
	for _, r := range DropReasons() {
		p.Dropped.WithLabelValues(r)
	}
	for _, s := range []string{"dns", "kubernetes"} {
		p.SourceErrors.WithLabelValues(s)
	}
	return p
}

// DropReasons are the reason labels of kvroute_peer_dropped_total: the wire's refusals,
// what the sender could not queue, what the lifecycle would not apply, and refused TLS
// handshakes.
func DropReasons() []string {
	return []string{"forged", "unauthenticated", "replayed", "truncated", "oversized", "malformed", "version", "queue_full",
		"duplicate", "ended_here", "before_stream", "endpoint_left", "unknown_request", "unknown_endpoint", "full", "invalid", "self",
		"tls_no_certificate", "tls_bad_certificate", "tls_handshake"}
}

// SnapshotTaken records when the snapshot this replica started from was taken (unix
// nanoseconds, the peer's clock).
func (p *Peers) SnapshotTaken(at int64) { p.snapshotAt.Store(at) }

// WatchRemote sets the function the remote request gauges read at scrape time.
func (p *Peers) WatchRemote(f func() (inFlight int, expired int64)) { p.remote.Store(&f) }

// WatchPeers sets the function that tells, at scrape time, when each peer was last heard
// from (kvroute_peer_sync_lag_seconds): every peer it returns has a series, growing
// while the peer is not heard (peer.Node reports those cut off or dead for a while too).
func (p *Peers) WatchPeers(f func() map[string]time.Time) { p.heard.Store(&f) }

// peerLag collects kvroute_peer_sync_lag_seconds.
type peerLag Peers

func (c *peerLag) Describe(ch chan<- *prometheus.Desc) { ch <- c.syncLag }

func (c *peerLag) Collect(ch chan<- prometheus.Metric) {
	f := c.heard.Load()
	if f == nil {
		return
	}
	now := time.Unix(0, c.now())
	for peer, at := range (*f)() {
		ch <- prometheus.MustNewConstMetric(c.syncLag, prometheus.GaugeValue, max(now.Sub(at).Seconds(), 0), peer)
	}
}

func (p *Peers) remoteStats() (int, int64) {
	if f := p.remote.Load(); f != nil {
		return (*f)()
	}
	return 0, 0
}
