package route

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/policy"
)

// EventKind says what happened in a lifecycle, as router replicas share it.
type EventKind uint8

const (
	// EventRouted: an attempt was sent to an endpoint (the request's routing facts).
	EventRouted EventKind = 1 + iota
	// EventFirstToken: the attempt's first token arrived (TTFT).
	EventFirstToken
	// EventDone: the attempt ended (its outcome).
	EventDone
	// EventRemoved: an endpoint left the pool.
	EventRemoved
	// EventStalled: the origin's stall watch found an endpoint's engine stalled, or the origin
	// let a probe through to it while stalled (endpoint.Stalling).
	EventStalled
	// EventBackoff: an endpoint's engine answered the origin 429, asking for Rest of rest
	// (Retry-After): it is tried after the others for that long.
	EventBackoff
	// EventEjected: the origin has an endpoint ejected for Rest more, for failures of its
	// engine's own doing (Outlier.Ejections); a warm start's snapshot carries it.
	EventEjected
)

// maxBackoff bounds the rest a peer's backoff event may ask for, as the proxy bounds an
// engine's Retry-After.
const maxBackoff = time.Minute

var eventNames = [...]string{EventRouted: "routed", EventFirstToken: "first_token", EventDone: "done", EventRemoved: "removed", EventStalled: "stalled", EventBackoff: "backoff", EventEjected: "ejected"}

// String returns the kind's name.
func (k EventKind) String() string {
	if int(k) < len(eventNames) && eventNames[k] != "" {
		return eventNames[k]
	}
	return "unknown"
}

// Event is one thing that happened to an attempt in a lifecycle, or to the pool, as another
// router replica replays it (Lifecycle.Apply). It carries what a policy learns from: a
// receiving replica rebuilds the policy.Request and makes the same endpoint counter and
// policy.Observer calls that the origin made, so that every policy learns the fleet's traffic,
// a little late, without code of its own for it.
type Event struct {
	Kind EventKind
	// Origin is the replica where it happened (its ShareConfig.Self); 0 in an event a
	// lifecycle publishes, which the transport fills in.
	Origin uint64
	// ID names the attempt within its origin (never reused there).
	ID uint64
	// Endpoint is the endpoint's name (its base URL): IDs differ between replicas, names do
	// not. Routed, Removed, Stalled, Backoff and Ejected only.
	Endpoint string
	// Stalled: how long the engine had been silent (nothing heard from it, by the origin)
	// when the event happened. A duration, not a time: replicas' clocks differ.
	Silent time.Duration
	// Backoff: the rest the engine asked for, from when the event happened; Ejected: the rest
	// of the ejection.
	Rest time.Duration

	// Routed: the request as the policy saw it.
	Model, Tenant, SessionKey            string
	Blocks                               []uint64
	BlockTokens, PromptTokens, MaxTokens int
	Whole                                bool // the answer comes whole (policy.Request.Whole)

	// FirstToken and Done: the time from the request's arrival to its first token, less the
	// time its earlier attempts took (the attempt's own TTFT; 0: none).
	TTFT time.Duration

	// Done: the outcome, in the policy's token units. PromptTokens is the engine's count when
	// it reported one. Predicted is the cached tokens the origin's policy predicted for the
	// attempt (-1: none): a receiver learns an eviction only where the origin saw one.
	OK bool
	// Failure is how the attempt failed, when it did and counts against the endpoint
	// (Failure.Counts); FailNone otherwise, and from a replica of wire version 2.2 or older.
	Failure                    Failure
	CachedTokens, OutputTokens int
	Duration                   time.Duration
	Predicted                  int
}

// Sync is told of each event of the lifecycles that share a Share, to send to the other
// replicas. Publish is called on the request path: it must not block (queue, and drop when
// full), and it must copy what it keeps, as ev and its Blocks belong to the caller.
type Sync interface {
	Publish(ev *Event)
}

// ShareConfig configures a Share. Self is required.
type ShareConfig struct {
	// Self names this replica in the events it publishes (nonzero, and different for every
	// replica and every restart of one: the transport derives it from its name and
	// incarnation).
	Self uint64
	// Out is told of every local event; nil: nothing is published.
	Out Sync
	// Endpoint finds the local endpoint of a remote event's name; nil, or nil returned: the
	// event is dropped (DropUnknownEndpoint, or DropEndpointLeft for a removed event).
	Endpoint func(name string) *endpoint.Endpoint
	// MaxRemote bounds the remote attempts in flight; beyond it new ones are dropped
	// (DropFull). 0: DefaultMaxRemote.
	MaxRemote int
	// TTL is how long a remote attempt may stay in flight without its end arriving (its
	// replica died mid-request, or the end was lost): it is then ended as failed. 0:
	// DefaultRemoteTTL.
	TTL time.Duration
	// Clock tells the time for TTL; nil: the wall clock.
	Clock policy.Clock
	// OnPeerStall, when set, is told of each stall a peer's event opened here (the engine
	// silent for silent at the peer), for the log: this replica's own watch did not find it.
	OnPeerStall func(ep *endpoint.Endpoint, silent time.Duration)
}

// Defaults of ShareConfig.
const (
	DefaultMaxRemote = 100_000
	DefaultRemoteTTL = 5 * time.Minute
)

// Drop says why Apply did not apply an event (DropNone: it did). Some drops are the ordinary
// consequence of how replicas share events (a replica that starts, a stream that starts
// afresh, a peer declared gone, an endpoint that leaves): late news of what this replica has
// settled already, harmless (Drop.Expected). The others say that something was lost, that the
// replicas' pools differ, or that a peer sent what no lifecycle makes.
type Drop uint8

const (
	// DropNone: applied.
	DropNone Drop = iota
	// DropDuplicate: applied already (the same event twice: a snapshot and a stream that
	// overlap, a replay, an end that came before its start). Expected.
	DropDuplicate
	// DropUnknown: a first token or end of an attempt this replica has no trace of: never
	// started here, never ended here, not listed by a hello of its origin's stream, its routed
	// event not refused here. Its routed event was lost (or it ended in the instant between
	// a stream's start and its hello's list of attempts): not expected.
	DropUnknown
	// DropUnknownEndpoint: the event, or the routed event of its attempt, names an endpoint
	// not in this replica's pool (the replicas' pools differ: a few at a change of the pool,
	// while discovery reaches every replica; steadily, their configs or discovery differ).
	DropUnknownEndpoint
	// DropFull: MaxRemote attempts were in flight already when the attempt's routed event
	// came (the event is that one, or a later one of the attempt).
	DropFull
	// DropInvalid: an event no lifecycle makes (no kind, no endpoint, negative counts), or a
	// later event of an attempt whose routed event was one.
	DropInvalid
	// DropSelf: an event of this replica's own, coming back.
	DropSelf
	// DropEndedHere: a first token, end or replayed routed event of an attempt that this
	// replica ended itself, outcome unknown, before it heard its end: its origin was declared
	// gone or restarted (ForgetOrigin), the hello of a stream that started afresh did not list
	// it (Reconcile), or its TTL ran out (Expire). Nothing was lost: the attempt is settled
	// here (counted in Expired). Expected.
	DropEndedHere
	// DropBeforeStream: a first token or end of an attempt that started at its origin before
	// this replica's stream from it began, as the stream's hello said (Reconcile): this
	// replica started, or the stream started afresh (its origin back from a gap longer than
	// its log keeps, or in another incarnation: a follower keeps a peer's resume point for
	// 30 s after letting it go). Its routed event went out before the stream
	// existed; a warm start's snapshot brings it, or the attempt was not counted here.
	// Expected.
	DropBeforeStream
	// DropEndpointLeft: a removed event for an endpoint this replica's pool does not hold: it
	// left here as well (or never was here), and there is nothing to forget. Expected.
	DropEndpointLeft

	numDrops = iota
)

var dropNames = [numDrops]string{
	DropNone: "none", DropDuplicate: "duplicate", DropUnknown: "unknown_request",
	DropUnknownEndpoint: "unknown_endpoint", DropFull: "full", DropInvalid: "invalid", DropSelf: "self",
	DropEndedHere: "ended_here", DropBeforeStream: "before_stream", DropEndpointLeft: "endpoint_left",
}

// String returns the reason's name, as metrics label it.
func (d Drop) String() string {
	if int(d) < len(dropNames) {
		return dropNames[d]
	}
	return "drop"
}

// Expected reports whether d is the ordinary consequence of how replicas share events (a
// duplicate, news of an attempt settled here already or begun before the stream, an
// endpoint that left here too), which asks nothing of an operator, rather than a loss, pools
// that differ, or an event no lifecycle makes.
func (d Drop) Expected() bool {
	switch d {
	case DropDuplicate, DropEndedHere, DropBeforeStream, DropEndpointLeft:
		return true
	}
	return false
}

// DropReasons returns the names of every Drop but DropNone, as metrics label them.
func DropReasons() []string { return append([]string(nil), dropNames[DropNone+1:]...) }

// Share is what the lifecycles of one router replica share with the other replicas: the
// attempts in flight here (local ones, published through Out) and there (remote ones, applied
// by Lifecycle.Apply). It outlives a Lifecycle (a config reload builds a new one on the same
// Share). Remote attempts are bounded in number (MaxRemote) and in time (TTL), and applying
// is idempotent: duplicates, replays and an end that overtakes its start change nothing.
// Safe for concurrent use.
type Share struct {
	cfg    ShareConfig
	next   atomic.Uint64 // last local attempt id
	events sync.Pool     // *Event to publish: Publish copies what it keeps

	mu      sync.Mutex
	local   *Call // the local attempts in flight, a list through their Calls (most recent first)
	nlocal  int
	flights map[flightKey]*flight // the remote attempts in flight
	remote  int                   // len(flights)
	expiry  []expiryEntry         // remote flights in the order they started (deadlines rise)
	ended   endedSet              // recently ended remote attempts: their late events change nothing
	// notes are recent remote attempts not in flight here for a reason other than their end
	// applied here, with the Drop their late events get: DropEndedHere (ended here, outcome
	// unknown; in ended too), DropBeforeStream (listed by a hello, never started here), or
	// the reason their routed event was refused. Written off the request path only.
	notes noteSet
	// seen is each origin's highest attempt ID that the Share put in flights or ended; of an
	// origin it lacks there is nothing in either (unless seenFull). A Routed above it is new
	// without a look in ended, whose generations are large maps: two cache misses on the path
	// of every remote request, where an origin's IDs mostly arrive in rising order.
	seen     map[uint64]uint64
	seenFull bool // seen reached maxOrigins: an origin it lacks may be anywhere

	applied, expired atomic.Int64
	coalesced        atomic.Int64 // attempts ApplyBatch replayed whole (batch.go)
	requests         sync.Pool    // *policy.Request for a policy.Completer
	dropped          [numDrops]atomic.Int64

	replicas atomic.Pointer[replicaSet] // the last SetReplicas; nil before one
}

// replicaSet is one SetReplicas: a lifecycle passes each one to its policy once.
type replicaSet struct {
	n, rank int
	lag     time.Duration
}

type flightKey struct{ origin, id uint64 }

// flight is one remote attempt in flight.
type flight struct {
	req      *policy.Request // &rebuilt
	rebuilt  policy.Request  // the request rebuilt from the event (one allocation with the flight)
	ep       *endpoint.Endpoint
	obs      policy.Observer       // the observer told of Routed, told of the rest
	fo       policy.FlightObserver // obs as one, or nil: then told with fl
	fl       policy.Flight
	first    bool
	ttft     time.Duration
	deadline time.Time
}

// localFlight is what the Share keeps of a local attempt in flight, in its Call: the Share
// lists them (for a peer's hello and a new replica's snapshot) through their Calls, where a
// map would cost an entry, an allocation and a hash per attempt on the request path.
type localFlight struct {
	prev, next *Call // the Share's list, under its lock
	first      bool
	ttft       time.Duration
}

type expiryEntry struct {
	key      flightKey
	deadline time.Time
}

// NewShare builds an empty Share.
func NewShare(cfg ShareConfig) *Share {
	if cfg.MaxRemote <= 0 {
		cfg.MaxRemote = DefaultMaxRemote
	}
	if cfg.TTL <= 0 {
		cfg.TTL = DefaultRemoteTTL
	}
	if cfg.Clock == nil {
		cfg.Clock = policy.WallClock{}
	}
	return &Share{cfg: cfg, flights: map[flightKey]*flight{}, ended: endedSet{max: cfg.MaxRemote},
		notes: noteSet{max: cfg.MaxRemote}, seen: map[uint64]uint64{}}
}

// Self is the origin this replica's events carry.
func (s *Share) Self() uint64 { return s.cfg.Self }

// SetReplicas records that n router replicas (this one included) share their events, this
// one of rank rank among them (0 to n-1, a different one each: the members ordered by name),
// each hearing of the others' up to lag late. Every lifecycle on this Share passes it to its
// policy (policy.Replicated) before its next request, a lifecycle rebuilt on reload too. The
// transport calls it when its membership changes: a policy that knows its peers place
// requests it hears of late can avoid sending its share of a burst where theirs go.
func (s *Share) SetReplicas(n, rank int, lag time.Duration) {
	if old := s.replicas.Load(); old != nil && *old == (replicaSet{n: n, rank: rank, lag: lag}) {
		return // the transport says it again on every membership check: the policy hears changes
	}
	s.replicas.Store(&replicaSet{n: n, rank: rank, lag: lag})
}

// Replicas is the last SetReplicas (1, 0, 0 before any).
func (s *Share) Replicas() (n, rank int, lag time.Duration) {
	rs := s.replicas.Load()
	if rs == nil {
		return 1, 0, 0
	}
	return rs.n, rs.rank, rs.lag
}

// tellReplicas passes the latest SetReplicas to lc's policy if it has not heard it yet.
func (s *Share) tellReplicas(lc *Lifecycle) {
	if s == nil || lc.replicated == nil {
		return
	}
	rs := s.replicas.Load()
	if rs == nil || lc.replicasHeard.Swap(rs) == rs {
		return
	}
	lc.replicated.SetReplicas(rs.n, rs.rank, rs.lag)
}

// ShareStats counts what a Share did.
type ShareStats struct {
	// Applied remote events; Dropped ones by reason (index: Drop); Expired remote attempts
	// ended by their TTL or their origin's departure.
	Applied, Expired int64
	Dropped          [numDrops]int64
	// Coalesced counts the remote attempts whose three events (of Applied) were replayed as
	// one (ApplyBatch).
	Coalesced int64
	// Local and Remote attempts in flight now.
	Local, Remote int
}

// Stats returns the counts so far.
func (s *Share) Stats() ShareStats {
	st := ShareStats{Applied: s.applied.Load(), Expired: s.expired.Load(), Coalesced: s.coalesced.Load()}
	for i := range s.dropped {
		st.Dropped[i] = s.dropped[i].Load()
	}
	s.mu.Lock()
	st.Remote = s.remote
	st.Local = s.nlocal
	s.mu.Unlock()
	return st
}

// The hooks the Call calls where its events happen (route.go); each is a no-op on a nil Share.

func (s *Share) routed(c *Call) {
	if s == nil {
		return
	}
	c.shared = s.next.Add(1)
	l := &c.local
	s.mu.Lock()
	l.first, l.ttft = false, 0
	l.prev, l.next = nil, s.local
	if s.local != nil {
		s.local.local.prev = c
	}
	s.local = c
	s.nlocal++
	s.mu.Unlock()
	if s.cfg.Out == nil {
		return
	}
	r := c.Req
	s.publish(Event{
		Kind: EventRouted, ID: c.shared, Endpoint: c.ep.Name,
		Model: r.Model, Tenant: r.Tenant, SessionKey: r.SessionKey, Blocks: r.Blocks,
		BlockTokens: r.BlockTokens, PromptTokens: r.PromptTokens, MaxTokens: r.MaxTokens, Whole: r.Whole,
	})
}

// publish hands ev to Out in an Event of the pool: an *Event given to an interface's method
// would be allocated for each of a request's three events (and one in every Call would make
// every request larger, with a Share or without).
func (s *Share) publish(ev Event) {
	p, _ := s.events.Get().(*Event)
	if p == nil {
		p = new(Event)
	}
	*p = ev
	s.cfg.Out.Publish(p)
	*p = Event{} // nothing of the request kept
	s.events.Put(p)
}

func (s *Share) firstToken(c *Call) {
	if s == nil || c.shared == 0 {
		return
	}
	ttft := c.attemptTTFT() // what the other replicas learn from, as this one does
	s.mu.Lock()
	c.local.first, c.local.ttft = true, ttft
	s.mu.Unlock()
	if s.cfg.Out != nil {
		s.publish(Event{Kind: EventFirstToken, ID: c.shared, TTFT: ttft})
	}
}

func (s *Share) done(c *Call, res policy.Result, f Failure) {
	if s == nil || c.shared == 0 {
		return
	}
	l := &c.local
	s.mu.Lock()
	if l.prev != nil {
		l.prev.local.next = l.next
	} else {
		s.local = l.next
	}
	if l.next != nil {
		l.next.local.prev = l.prev
	}
	l.prev, l.next = nil, nil
	s.nlocal--
	s.mu.Unlock()
	id := c.shared
	c.shared = 0
	if !f.Counts() {
		f = FailNone // what the receivers' health checking need not hear
	}
	if s.cfg.Out != nil {
		s.publish(Event{
			Kind: EventDone, ID: id, OK: res.OK, Failure: f, CachedTokens: res.CachedTokens, PromptTokens: res.PromptTokens,
			OutputTokens: res.OutputTokens, TTFT: res.TTFT, Duration: res.Duration, Predicted: c.rawPredicted,
		})
	}
}

// backoff tells the other replicas that ep's engine asked for d of rest (429).
func (s *Share) backoff(ep *endpoint.Endpoint, d time.Duration) {
	if s == nil || s.cfg.Out == nil {
		return
	}
	s.publish(Event{Kind: EventBackoff, Endpoint: ep.Name, Rest: d})
}

func (s *Share) removed(ep *endpoint.Endpoint) {
	if s == nil || s.cfg.Out == nil {
		return
	}
	s.publish(Event{Kind: EventRemoved, Endpoint: ep.Name})
}

// stalled tells the other replicas that ep's engine is stalled, silent since from, at now
// (unix nanoseconds): a stall watch here found it, or a probe goes to it (endpoint.PeerStalled).
func (s *Share) stalled(ep *endpoint.Endpoint, from, now int64) {
	if s == nil || s.cfg.Out == nil || from <= 0 {
		return
	}
	s.publish(Event{Kind: EventStalled, Endpoint: ep.Name, Silent: time.Duration(max(now-from, 0))})
}

// Apply replays an event of another replica (ev.Origin) on this lifecycle: Routed starts a
// remote attempt (the endpoint's in-flight and pending-prefill counts, the policy's Routed with
// the rebuilt request), FirstToken and Done continue it as the origin's did, Removed tells
// the policy that the endpoint left (another replica saw it go first), and Stalled marks the
// endpoint stalled as the origin found it (endpoint.PeerStalled). It keeps ev.Blocks. It
// never blocks on anything but the Share's lock, and reports why it dropped the event, if it
// did.
func (lc *Lifecycle) Apply(ev *Event) Drop {
	s := lc.share
	if s == nil {
		return DropInvalid
	}
	now := s.cfg.Clock.Now()
	s.expire(now)
	return s.count(s.apply(lc, ev, now))
}

// count counts what apply did with an event, and returns d.
func (s *Share) count(d Drop) Drop {
	if d == DropNone {
		s.applied.Add(1)
	} else {
		s.dropped[d].Add(1)
	}
	return d
}

// apply applies ev at now; the caller has expired what ran out by now.
func (s *Share) apply(lc *Lifecycle, ev *Event, now time.Time) Drop {
	if ev.Origin == s.cfg.Self {
		return DropSelf
	}
	key := flightKey{ev.Origin, ev.ID}
	if malformed(ev) {
		if ev.Kind == EventRouted && ev.Origin != 0 {
			// Noted, as start notes a routed event it cannot place: the attempt's first token
			// and end are then invalid too, not unknown_request (a lost event).
			return s.refuse(key, DropInvalid)
		}
		return DropInvalid
	}
	switch ev.Kind {
	case EventRouted:
		return s.start(lc, key, ev, now)
	case EventFirstToken:
		s.mu.Lock()
		f := s.flights[key]
		if f == nil {
			defer s.mu.Unlock()
			return s.unknownLocked(key, false)
		}
		if f.first {
			s.mu.Unlock()
			return DropDuplicate
		}
		f.first, f.ttft = true, ev.TTFT
		s.mu.Unlock()
		f.ep.FirstToken(f.req.PromptTokens)
		f.ep.Progressed(now.UnixNano())
		f.firstToken(ev.TTFT)
		return DropNone
	case EventDone:
		s.mu.Lock()
		f := s.flights[key]
		if f == nil {
			// Remembered, so that a Routed arriving after it (a snapshot taken before the end)
			// starts nothing.
			defer s.mu.Unlock()
			return s.unknownLocked(key, true)
		}
		s.endLocked(key)
		s.mu.Unlock()
		if ev.OK {
			f.ep.Progressed(now.UnixNano())
		}
		lc.peerOutcome(f.ep, ev)
		prompt := f.req.PromptTokens
		if ev.PromptTokens > 0 {
			prompt = ev.PromptTokens
		}
		s.finish(f, policy.Result{OK: ev.OK, CachedTokens: remoteCached(ev), PromptTokens: prompt,
			OutputTokens: ev.OutputTokens, TTFT: ev.TTFT, Duration: ev.Duration})
		lc.peerAudit(f.ep, ev, now)
		return DropNone
	case EventRemoved, EventBackoff, EventEjected, EventStalled:
		ep := s.endpoint(ev.Endpoint)
		switch {
		case ev.Endpoint == "":
			return DropInvalid // not endpoint_left, which asks nothing of an operator
		case ep == nil && ev.Kind == EventRemoved:
			return DropEndpointLeft
		case ep == nil:
			return DropUnknownEndpoint
		}
		s.applyEndpoint(lc, ep, ev, now)
		return DropNone
	}
	return DropInvalid
}

// applyEndpoint applies ev, an event about the endpoint ep rather than an attempt, at now.
func (s *Share) applyEndpoint(lc *Lifecycle, ep *endpoint.Endpoint, ev *Event, now time.Time) {
	switch ev.Kind {
	case EventRemoved:
		if lc.observer != nil {
			lc.observer.Removed(ep)
		}
	case EventBackoff:
		lc.health.Backoff(ep, now, min(ev.Rest, maxBackoff))
	case EventEjected:
		if lc.peers != nil {
			lc.peers.PeerEjected(ep, ev.Rest)
		}
	case EventStalled:
		// Not applied when this replica heard the engine since: it is the origin that has not
		// (yet), and the engine works.
		at := now.UnixNano()
		if _, opened := ep.PeerStalled(at-int64(ev.Silent), at, int64(peerProbeHold)); opened && s.cfg.OnPeerStall != nil {
			s.cfg.OnPeerStall(ep, ev.Silent)
		}
	}
}

// peerOutcome tells passive health checking, when it hears the other replicas
// (PeerHealth), how a remote attempt on ep ended: ev is its Done.
func (lc *Lifecycle) peerOutcome(ep *endpoint.Endpoint, ev *Event) {
	switch {
	case lc.peers == nil:
	case ev.OK:
		lc.peers.PeerSucceeded(ep)
	case ev.Failure.Counts():
		lc.peers.PeerFailed(ep, ev.Failure)
	}
}

// peerAudit tells the cache-report audit what a remote attempt that ended well on ep was
// predicted to find cached and what the engine reported (ev is its Done), as Finish tells it
// of a local one: each replica hears the fleet's reports, and finds a silent zero hit as soon
// as one router would, not after as many reports of its own.
func (lc *Lifecycle) peerAudit(ep *endpoint.Endpoint, ev *Event, now time.Time) {
	if lc.audit == nil || !ev.OK {
		return
	}
	if changed, blind := lc.audit.Observe(ep, ev.Predicted, ev.CachedTokens, now); changed && lc.blinder != nil {
		lc.blinder.SetCacheBlind(ep, blind)
	}
}

// peerProbeHold is how much longer than its probe interval a replica waits to probe an engine
// after a peer's probe of it: far longer than an event takes between replicas (a batch
// interval, 10 ms by default), so that the peer that probed last, whose interval ends first,
// probes again and says so before this one's is due (endpoint.PeerStalled).
const peerProbeHold = time.Second

// malformed reports whether ev names no origin or carries a negative count or duration.
func malformed(ev *Event) bool {
	return ev.Origin == 0 || ev.PromptTokens < 0 || ev.BlockTokens < 0 || ev.MaxTokens < 0 || ev.TTFT < 0 || ev.Silent < 0 || ev.Rest < 0
}

// unplaceable reports whether a Routed ev names no endpoint, or blocks without their size.
func unplaceable(ev *Event) bool {
	return ev.Endpoint == "" || ev.BlockTokens == 0 && len(ev.Blocks) > 0
}

// unknownLocked classifies an event of an attempt not in flight here (a first token or an
// end): ended here without its end, a duplicate when its end was applied, else what its note
// says (listed by a hello, its routed event refused), else unknown; remember records it as
// ended. The caller holds s.mu.
func (s *Share) unknownLocked(key flightKey, remember bool) Drop {
	d := DropUnknown
	note, noted := s.notes.get(key)
	switch {
	case noted && note == DropEndedHere:
		d = DropEndedHere
	case s.ended.has(key):
		d = DropDuplicate
	case noted:
		d = note
	}
	if remember {
		s.ended.add(key)
		s.mark(key)
	}
	return d
}

// endedLocked says why a routed event of attempt key, neither new nor in flight, starts
// nothing: DropEndedHere or DropDuplicate when it has ended, DropNone when it has not. The
// caller holds s.mu.
func (s *Share) endedLocked(key flightKey) Drop {
	if !s.ended.has(key) {
		return DropNone
	}
	if note, _ := s.notes.get(key); note == DropEndedHere {
		return DropEndedHere
	}
	return DropDuplicate
}

// refuse notes that the routed event of attempt key was refused for d, so that its attempt's
// later events are dropped for d too rather than as unknown; it returns d.
func (s *Share) refuse(key flightKey, d Drop) Drop {
	s.mu.Lock()
	if s.flights[key] == nil && !s.ended.has(key) {
		s.notes.put(key, d)
	}
	s.mu.Unlock()
	return d
}

func (s *Share) endpoint(name string) *endpoint.Endpoint {
	if s.cfg.Endpoint == nil || name == "" {
		return nil
	}
	return s.cfg.Endpoint(name)
}

// start begins a remote attempt.
func (s *Share) start(lc *Lifecycle, key flightKey, ev *Event, now time.Time) Drop {
	if unplaceable(ev) {
		return s.refuse(key, DropInvalid)
	}
	ep := s.endpoint(ev.Endpoint)
	if ep == nil {
		return s.refuse(key, DropUnknownEndpoint)
	}
	f := &flight{
		rebuilt: rebuild(ev),
		ep:      ep, obs: lc.observer, deadline: now.Add(s.cfg.TTL),
	}
	if f.obs != nil {
		f.fo = lc.flights
	}
	f.req = &f.rebuilt
	s.mu.Lock()
	if !s.fresh(key) {
		d := s.endedLocked(key)
		if s.flights[key] != nil {
			d = DropDuplicate
		}
		if d != DropNone {
			s.mu.Unlock()
			return d
		}
	}
	if s.remote >= s.cfg.MaxRemote {
		if s.flights[key] == nil && !s.ended.has(key) {
			s.notes.put(key, DropFull)
		}
		s.mu.Unlock()
		return DropFull
	}
	s.flights[key] = f
	s.mark(key)
	s.remote++
	s.expiry = append(s.expiry, expiryEntry{key, f.deadline})
	// The expiry queue holds ended attempts until their deadline passes; when they are most
	// of it, drop them, so that it stays proportional to the attempts in flight.
	if len(s.expiry) > 1024 && len(s.expiry) > 4*s.remote {
		live := s.expiry[:0]
		for _, e := range s.expiry {
			if s.flights[e.key] != nil {
				live = append(live, e)
			}
		}
		clear(s.expiry[len(live):])
		s.expiry = live
	}
	s.mu.Unlock()
	ep.Start(f.req.PromptTokens)
	switch {
	case f.fo != nil:
		f.fl = f.fo.RoutedFlight(f.req, ep)
	case f.obs != nil:
		f.obs.Routed(f.req, ep)
	}
	return DropNone
}

// remoteCached is the cached tokens a receiver's policy hears for a remote attempt that ended.
// The engine's report tells the origin of an eviction when it is below what the origin
// predicted. The receiver heard of the attempt later, often after it had routed the same
// prefix there itself, and so may predict more than the origin did: told the engine's
// report as it is, it would see an eviction that did not happen (and prefix-aware would forget
// much of that endpoint). So the receiver hears the report only where the origin saw an
// eviction; elsewhere, that the engine did not say (-1).
func remoteCached(ev *Event) int {
	if ev.CachedTokens >= 0 && ev.Predicted >= 0 && ev.CachedTokens < ev.Predicted {
		return ev.CachedTokens
	}
	return -1
}

// maxOrigins bounds Share.seen: a replica's restarts are origins too.
const maxOrigins = 4096

// mark records that attempt k is in flights or ended. The caller holds s.mu.
func (s *Share) mark(k flightKey) {
	n, ok := s.seen[k.origin]
	switch {
	case ok || len(s.seen) < maxOrigins:
		s.seen[k.origin] = max(n, k.id)
	default:
		s.seenFull = true
	}
}

// fresh reports whether attempt k is sure to be neither in flight nor ended. The caller holds
// s.mu.
func (s *Share) fresh(k flightKey) bool {
	n, ok := s.seen[k.origin]
	return k.id > n && (ok || !s.seenFull)
}

// endLocked takes a remote flight out of the table. The caller holds s.mu.
func (s *Share) endLocked(key flightKey) {
	delete(s.flights, key)
	s.remote--
	s.ended.add(key)
}

// endHereLocked takes a remote flight whose end has not come out of the table, noting that
// this replica ended it: its end, if it comes, is DropEndedHere. The caller holds s.mu.
func (s *Share) endHereLocked(key flightKey) {
	s.endLocked(key)
	s.notes.put(key, DropEndedHere)
}

// finish settles a remote attempt that ended: the endpoint's counters and the policy's Done.
func (s *Share) finish(f *flight, res policy.Result) {
	f.ep.Finish(f.req.PromptTokens, f.first)
	if f.obs != nil {
		if res.TTFT == 0 && f.first {
			res.TTFT = f.ttft
		}
		if f.fo != nil {
			f.fo.DoneFlight(f.fl, f.req, f.ep, res)
			f.fl = nil
		} else {
			f.obs.Done(f.req, f.ep, res)
		}
	}
}

// firstToken tells the observer of a remote attempt's first token.
func (f *flight) firstToken(ttft time.Duration) {
	switch {
	case f.fo != nil:
		f.fo.FirstTokenFlight(f.fl, f.req, f.ep, ttft)
	case f.obs != nil:
		f.obs.FirstToken(f.req, f.ep, ttft)
	}
}

// expire ends the remote attempts whose TTL has run out at now, as failed.
func (s *Share) expire(now time.Time) {
	var out []*flight
	s.mu.Lock()
	n := 0
	for ; n < len(s.expiry) && !s.expiry[n].deadline.After(now); n++ {
		k := s.expiry[n].key
		if f := s.flights[k]; f != nil && !f.deadline.After(now) {
			s.endHereLocked(k)
			out = append(out, f)
		}
	}
	if n > 0 {
		s.expiry = append(s.expiry[:0], s.expiry[n:]...)
	}
	s.mu.Unlock()
	s.failAll(out)
}

// Expire ends, as failed, the remote attempts whose end has not arrived within the TTL. Apply
// does it too; call it when no event may come for a while.
func (s *Share) Expire() { s.expire(s.cfg.Clock.Now()) }

// ForgetOrigin ends, as failed, every remote attempt of origin: that replica died or
// restarted, and the ends of its requests will never come.
func (s *Share) ForgetOrigin(origin uint64) int {
	if origin == s.cfg.Self {
		return 0
	}
	var out []*flight
	s.mu.Lock()
	for k, f := range s.flights {
		if k.origin == origin {
			s.endHereLocked(k)
			out = append(out, f)
		}
	}
	s.mu.Unlock()
	s.failAll(out)
	return len(out)
}

// Reconcile ends, as failed, the remote attempts of origin that are not among live (the IDs
// that origin says are in flight there), for a replica whose events may have been lost (its
// stream broke): what it says now is the truth. Those of live it has never heard of started
// before the stream that says so: their first tokens and ends are DropBeforeStream, and
// their routed events (a warm start's snapshot) still start them.
func (s *Share) Reconcile(origin uint64, live map[uint64]bool) int {
	if origin == s.cfg.Self {
		return 0
	}
	var out []*flight
	s.mu.Lock()
	for k, f := range s.flights {
		if k.origin == origin && !live[k.id] {
			s.endHereLocked(k)
			out = append(out, f)
		}
	}
	for id := range live {
		k := flightKey{origin, id}
		if s.flights[k] != nil || s.ended.has(k) {
			continue
		}
		if _, noted := s.notes.get(k); !noted {
			s.notes.put(k, DropBeforeStream)
		}
	}
	s.mu.Unlock()
	s.failAll(out)
	return len(out)
}

// failAll ends remote attempts whose end will not come. Their outcome is unknown: the engine
// may well have computed them (a router that dies does not stop its engines' prefills). An
// attempt that failed before its first token tells a policy that the engine never computed it
// (prefix-aware then drops the blocks it added, and with them the placement of every request
// with that prefix since), so each is first given a first token of unknown time (0, which
// teaches no speed), then ended as failed: the index keeps what it had, and engine reports
// correct it if it was wrong.
func (s *Share) failAll(fs []*flight) {
	for _, f := range fs {
		s.expired.Add(1)
		if !f.first {
			f.first = true
			f.ep.FirstToken(f.req.PromptTokens)
			f.firstToken(0)
		}
		s.finish(f, policy.Result{OK: false, CachedTokens: -1, PromptTokens: f.req.PromptTokens})
	}
}

// InFlight returns the attempts in flight here, local and remote, as the events that would
// start them on another replica (Routed, then FirstToken when it came), local ones with Origin
// set to Self: what a new replica takes with a snapshot.
func (s *Share) InFlight() []Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Event, 0, s.nlocal+len(s.flights))
	for c := s.local; c != nil; c = c.local.next {
		out = appendFlight(out, flightKey{s.cfg.Self, c.shared}, c.ep, c.Req, c.local.first, c.local.ttft)
	}
	for k, f := range s.flights {
		out = appendFlight(out, k, f.ep, f.req, f.first, f.ttft)
	}
	return out
}

// appendFlight appends the events that start attempt k on another replica.
func appendFlight(out []Event, k flightKey, ep *endpoint.Endpoint, r *policy.Request, first bool, ttft time.Duration) []Event {
	out = append(out, Event{
		Kind: EventRouted, Origin: k.origin, ID: k.id, Endpoint: ep.Name,
		Model: r.Model, Tenant: r.Tenant, SessionKey: r.SessionKey, Blocks: r.Blocks,
		BlockTokens: r.BlockTokens, PromptTokens: r.PromptTokens, MaxTokens: r.MaxTokens, Whole: r.Whole,
	})
	if first {
		out = append(out, Event{Kind: EventFirstToken, Origin: k.origin, ID: k.id, TTFT: ttft})
	}
	return out
}

// LocalIDs returns the IDs of the local attempts in flight (for Reconcile on the other side).
func (s *Share) LocalIDs() []uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]uint64, 0, s.nlocal)
	for c := s.local; c != nil; c = c.local.next {
		out = append(out, c.shared)
	}
	return out
}

// endedSet remembers recently ended remote attempts, in two generations so that its memory is
// bounded without per-entry bookkeeping.
type endedSet struct {
	max        int
	young, old map[flightKey]struct{}
}

func (e *endedSet) add(k flightKey) {
	if e.young == nil {
		e.young = map[flightKey]struct{}{}
	}
	if len(e.young) >= max(e.max, 1) {
		e.old, e.young = e.young, map[flightKey]struct{}{}
	}
	e.young[k] = struct{}{}
}

func (e *endedSet) has(k flightKey) bool {
	if _, ok := e.young[k]; ok {
		return true
	}
	_, ok := e.old[k]
	return ok
}

// noteSet remembers, of recent remote attempts, the Drop their late events get, in two
// generations as endedSet.
type noteSet struct {
	max        int
	young, old map[flightKey]Drop
}

func (e *noteSet) put(k flightKey, d Drop) {
	if e.young == nil {
		e.young = map[flightKey]Drop{}
	}
	if len(e.young) >= max(e.max, 1) {
		e.old, e.young = e.young, map[flightKey]Drop{}
	}
	e.young[k] = d
}

func (e *noteSet) get(k flightKey) (Drop, bool) {
	if d, ok := e.young[k]; ok {
		return d, true
	}
	d, ok := e.old[k]
	return d, ok
}
