package route

import (
	"errors"
	"math"
	"sync/atomic"

	"slices"
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/policy"
)

// Config configures a Lifecycle.
type Config struct {
	// Picker is the routing policy. Required. When it implements policy.Observer it is told
	// what happens to every attempt; policy.Predictor gives each attempt's predicted cached
	// tokens.
	Picker policy.Picker
	// Clock tells the time: the wall clock in the live router, the virtual clock in the
	// simulator. Nil: the wall clock.
	Clock policy.Clock
	// Attempts is how many endpoints of the ranked list one request may be sent to: 1 plus the
	// retries. 0: 1.
	Attempts int
	// Health hears how every attempt went, for passive ejection. Nil: an Outlier with its
	// defaults on Clock.
	Health Health
	// State is what outlives one Lifecycle (a config reload builds a new one): response pins.
	// Nil: a private one.
	State *State
	// Audit, when set, compares each request's predicted cached tokens with what the engine
	// reported, and makes an endpoint blind while they disagree (silent zero hits): the
	// policy, if it implements policy.CacheBlind, then ranks it on load alone.
	Audit *Audit
	// WarmUp is how long an endpoint that joins after the lifecycle started takes to reach its
	// full share of traffic (slow start): while it warms up, a request that the policy ranks
	// it first for keeps it first only with a probability growing linearly from 0 to 1 (by a
	// hash of the request id, so runs are reproducible), else it goes second. A new, empty
	// engine then does not take every cold prefix at once. 0: no warm-up (the router's
	// default is DefaultWarmUp).
	WarmUp time.Duration
	// Share, when set, publishes every attempt's events to the other router replicas and
	// lets Apply replay theirs (remote.go). Nil: a lone router.
	Share *Share
	// StallTimeout, when positive, has each attempt watched for a stall (Call.Stall): waiting
	// for its first token for StallTimeout, or policy.MaxSlowdown times its predicted TTFT where
	// the policy predicts one (policy.TTFTPredictor) and that is longer, while its engine
	// answered nothing at all. Where the policy predicts nothing, or has no prediction yet (a
	// router that has just started), MaxSlowdown times the prompt's own prefill there stands
	// in for the prediction: its tokens not predicted cached over the endpoint's prefill rate
	// (endpoint.PrefillRate, learned from its answers here; 10,000 tokens a second before one).
	// Either only ever lengthens the wait. 0: not watched (the first-token timeout alone bounds
	// the wait).
	StallTimeout time.Duration
}

// DefaultWarmUp is the router's default warm-up of a joining endpoint (health.warm_up).
const DefaultWarmUp = 20 * time.Second

// Health is passive health checking: it hears how each attempt went, and may take endpoints
// out of the candidates for a while (Outlier is the default).
type Health interface {
	// Failed is told of an attempt on ep that failed with f, a failure that counts against
	// ep. It reports whether ep was ejected by this failure.
	Failed(ep *endpoint.Endpoint, f Failure) (ejected bool)
	// Succeeded is told of an attempt that ep answered well.
	Succeeded(ep *endpoint.Endpoint)
	// Ejected reports whether ep is out of the candidates at now.
	Ejected(ep *endpoint.Endpoint, now time.Time) bool
	// Backoff asks that ep be tried after the others until now + d (it answered 429 with
	// Retry-After d).
	Backoff(ep *endpoint.Endpoint, now time.Time, d time.Duration)
	// BackedOff reports whether ep should be tried after the others at now.
	BackedOff(ep *endpoint.Endpoint, now time.Time) bool
	// Forget drops what is known of ep (it left the pool).
	Forget(ep *endpoint.Endpoint)
}

// RefusalHealth is a Health that also hears of the attempts an engine refused (Call.refused):
// a 4xx other than 429 and other than a 404 naming a model the engine does not serve, which
// passes nothing against the endpoint by itself (the request may be at fault), but an engine
// that refuses far more than the rest of the fleet may be (Outlier implements it).
type RefusalHealth interface {
	// Refused is told of an attempt that ep refused, and reports whether ep was ejected by it.
	Refused(ep *endpoint.Endpoint) (ejected bool)
}

// KeyedRefusalHealth is a RefusalHealth that judges refusals by the requests refused: one
// client's bad requests, which every engine would refuse, are not held against the one engine
// they all went to (Outlier.Refuse). The lifecycle tells it instead of Refused.
type KeyedRefusalHealth interface {
	// Refuse is told of an attempt of req that ep refused, and returns what it made of it;
	// not of one refused by the endpoint the request is pinned to by its previous response,
	// which the lifecycle excuses (nor is RefusalHealth.Refused told of those).
	Refuse(ep *endpoint.Endpoint, req *policy.Request) Refusal
	// Served is told of an attempt of req that ep answered well, beside Health.Succeeded.
	Served(ep *endpoint.Endpoint, req *policy.Request)
	// Avoid reports whether req, ranked first for ep, should be sent first to another
	// endpoint (the next ranked) instead: ep refused requests like it of late, and whether
	// the rest of the fleet serves them is to be found out, or is known (Outlier.Avoid). It is
	// asked only where another endpoint is ranked, and req is not pinned to ep, and after
	// Avoidable said it could.
	Avoid(ep *endpoint.Endpoint, req *policy.Request, now time.Time) bool
	// Avoidable reports whether Avoid could say that req, ranked first for ep, is to be sent
	// elsewhere: false means it would not. It is asked for every request, before anything
	// else is looked at, and must be cheap (no lock, no allocation) and change nothing; nearly
	// every request is none that an endpoint refused of late.
	Avoidable(ep *endpoint.Endpoint, req *policy.Request) bool
}

// Refusal is what passive health checking made of a refused attempt (KeyedRefusalHealth).
type Refusal struct {
	// Ejected: the endpoint was ejected by it.
	Ejected bool
	// Blamed: the refusal counts against the endpoint; the policy hears of it as a failed
	// attempt (policy.Result.Failed).
	Blamed bool
	// TakeBack, when not zero, is when an earlier refusal at the endpoint was blamed on it,
	// which the requests since have shown to be the client's doing (the same requests
	// refused by another endpoint too, and served by none): the policy takes that failed
	// attempt back (policy.Result.TakeBack).
	TakeBack time.Time
}

// PeerHealth is a Health that also hears how the other router replicas' attempts went (their
// Done events, Lifecycle.Apply). Outlier implements it.
type PeerHealth interface {
	// PeerFailed is told of another replica's attempt on ep that failed with f (one that
	// counts, Failure.Counts), and reports whether ep was ejected here by it.
	PeerFailed(ep *endpoint.Endpoint, f Failure) (ejected bool)
	// PeerSucceeded is told of another replica's attempt that ep answered well.
	PeerSucceeded(ep *endpoint.Endpoint)
	// PeerEjected is told that another replica has ep ejected for rest more, for failures of
	// its engine's own doing (a warm start's snapshot), and reports whether ep was ejected
	// here by it.
	PeerEjected(ep *endpoint.Endpoint, rest time.Duration) (ejected bool)
	// Ejections returns what PeerEjected would be told of this replica's ejections at now.
	Ejections(now time.Time) []Ejection
}

// Failure says how an attempt failed. It decides whether the request may be sent to the next
// endpoint of its ranked list (only while nothing has reached the client, and only where the
// engine cannot have computed it or asked for it), and whether the failure counts against the
// endpoint (towards ejecting it).
type Failure uint8

const (
	// FailNone: not a failure.
	FailNone Failure = iota
	// FailConnect: no connection could be made; the engine never saw the request. Retried;
	// counts.
	FailConnect
	// FailUnavailable: the engine answered 503 before any response byte reached the client.
	// Retried; counts.
	FailUnavailable
	// FailBusy: the engine answered 429 before any byte: it is shedding load. Retried, the
	// engine tried after the others for its Retry-After; does not count.
	FailBusy
	// FailTimeout: no response head (or, for a stream, no first event) within the attempt's
	// timeout; nothing reached the client. Retried; counts.
	FailTimeout
	// FailLost: the request reached the engine and then its connection was lost, or the
	// engine died, before anything reached the client. Retried once per request
	// (RetryableOnce): the request may be what killed the engine. Counts, but for a request's
	// second such failure.
	FailLost
	// FailStatus: the engine answered a 5xx error other than 503. Answered 500, 502 or 504
	// before any byte reached the client, it is retried once per request (RetryableOnce), else
	// relayed. Counts, but for a request's second such failure.
	FailStatus
	// FailCut: the engine's answer ended before its end (a stream without its terminator, or
	// silent for longer than the idle timeout), after bytes reached the client. Counts.
	FailCut
	// FailRejected: the engine refused the request itself (a 4xx: it can never fit there).
	// Not retried; does not count, but is a refusal (RefusalHealth): an engine that refuses
	// far more often than the rest of the fleet is ejected (Outlier's refusal rule).
	FailRejected
	// FailCanceled: the client went away. Not retried; does not count.
	FailCanceled
	// FailNotServed: the engine answered 404 before any byte reached the client: it does not
	// serve the request's model (an engine started with another model than the config says, a
	// model being swapped) or its API path. Nothing was computed: retried; does not count.
	// One that did not name the model (an API path the engine lacks) is a refusal, as
	// FailRejected.
	FailNotServed
	// FailUnknown: the attempt failed before anything reached the client, and nothing says
	// why: a front end that retries by itself (Envoy, through ext_proc) went on to the next
	// endpoint of its list without telling why it left this one (a connection refused, a 503
	// and a 429 look alike). Not Retryable: the front end that saw it retried, not the
	// lifecycle (no kvroute_retries_total reason). Does not count, and is not told to the
	// other replicas: it may be a busy engine's 429, which counted, under load, ejected
	// engines the fleet needed. The policy hears it, as it hears a 429.
	FailUnknown
)

var failureNames = [...]string{
	FailNone:        "none",
	FailConnect:     "connect_error",
	FailUnavailable: "unavailable",
	FailBusy:        "busy",
	FailTimeout:     "timeout",
	FailLost:        "lost",
	FailStatus:      "server_error",
	FailCut:         "stream_cut",
	FailRejected:    "rejected",
	FailCanceled:    "canceled",
	FailNotServed:   "not_served",
	FailUnknown:     "unknown",
}

// String returns the failure's name, as metrics label it.
func (f Failure) String() string {
	if int(f) < len(failureNames) {
		return failureNames[f]
	}
	return "failure"
}

// Retryable reports whether a request that failed so may be sent to another endpoint, however
// often it has failed so: the engine cannot have acted on it, or gave it up unanswered.
func (f Failure) Retryable() bool {
	return f == FailConnect || f == FailUnavailable || f == FailBusy || f == FailTimeout || f == FailNotServed
}

// RetryableOnce reports whether a request that failed so may be sent to another endpoint once:
// the engine had the request and failed it (a 5xx, a lost connection), which an engine that
// is broken does to every request and a request that breaks engines (a query of death) does
// to every engine. Call.Fail allows one retry for these failures together per request, so
// that a dead engine that still passes its health checks costs no request, while a query of
// death reaches two engines at most, and its second failure does not count against the
// second: two engines that failed one request point at the request.
func (f Failure) RetryableOnce() bool { return f == FailLost || f == FailStatus }

// Counts reports whether the failure counts against the endpoint, towards ejecting it.
func (f Failure) Counts() bool {
	switch f {
	case FailConnect, FailUnavailable, FailTimeout, FailLost, FailStatus, FailCut:
		return true
	}
	return false
}

// tokenScaleWeight is the weight of one request in an endpoint's learned token scale: about the
// last 20 requests count.
const tokenScaleWeight = 0.05

// ErrNoCandidate is returned by Begin when the policy ranks no endpoint.
var ErrNoCandidate = policy.ErrNoCandidate

// Lifecycle runs requests through the policy. It is safe for concurrent use; each Call is
// driven by one goroutine at a time.
type Lifecycle struct {
	picker    policy.Picker
	observer  policy.Observer
	predictor policy.Predictor
	clock     policy.Clock
	attempts  int
	health    Health
	peers     PeerHealth         // health as PeerHealth (nil if it is not): the other replicas' outcomes
	refusals  RefusalHealth      // health as RefusalHealth (nil if it is not): refused attempts
	keyed     KeyedRefusalHealth // health as KeyedRefusalHealth (nil if it is not): refused attempts by request
	state     *State
	warmup    time.Duration
	audit     *Audit
	blinder   policy.CacheBlind
	share     *Share
	// replicated is the policy as policy.Replicated (nil if it is not), and replicasHeard the
	// Share's SetReplicas it last passed on.
	replicated    policy.Replicated
	replicasHeard atomic.Pointer[replicaSet]
	deferrer      policy.Deferrer       // the policy as policy.Deferrer (nil if it is not): Hold
	ttfts         policy.TTFTPredictor  // the policy as policy.TTFTPredictor, nil if it is not or stalls are not watched (stall 0)
	stall         time.Duration         // Config.StallTimeout
	flights       policy.FlightObserver // the observer as policy.FlightObserver (nil if it is not): remote attempts
}

// New builds a Lifecycle.
func New(cfg Config) (*Lifecycle, error) {
	if cfg.Picker == nil {
		return nil, errors.New("route: a Lifecycle needs a Picker")
	}
	lc := &Lifecycle{picker: cfg.Picker, clock: cfg.Clock, attempts: max(cfg.Attempts, 1), health: cfg.Health, state: cfg.State, warmup: cfg.WarmUp,
		share: cfg.Share}
	lc.audit = cfg.Audit
	if lc.audit != nil {
		lc.blinder, _ = cfg.Picker.(policy.CacheBlind)
		if lc.blinder != nil {
			for _, ep := range lc.audit.blindOnes() { // a policy rebuilt on reload
				lc.blinder.SetCacheBlind(ep, true)
			}
		}
	}
	lc.observer, _ = cfg.Picker.(policy.Observer)
	lc.flights, _ = cfg.Picker.(policy.FlightObserver)
	lc.predictor, _ = cfg.Picker.(policy.Predictor)
	lc.replicated, _ = cfg.Picker.(policy.Replicated)
	lc.deferrer, _ = cfg.Picker.(policy.Deferrer)
	if cfg.StallTimeout > 0 {
		lc.ttfts, _ = cfg.Picker.(policy.TTFTPredictor)
		lc.stall = cfg.StallTimeout
	}
	if lc.clock == nil {
		lc.clock = policy.WallClock{}
	}
	if lc.state == nil {
		lc.state = NewState(0)
	}
	if lc.health == nil {
		lc.health = NewOutlier(OutlierConfig{}, lc.clock)
	}
	lc.peers, _ = lc.health.(PeerHealth)
	lc.refusals, _ = lc.health.(RefusalHealth)
	lc.keyed, _ = lc.health.(KeyedRefusalHealth)
	return lc, nil
}

// Picker returns the policy.
func (lc *Lifecycle) Picker() policy.Picker { return lc.picker }

// Attempts is how many endpoints one request may be sent to.
func (lc *Lifecycle) Attempts() int { return lc.attempts }

// Now returns the lifecycle's time.
func (lc *Lifecycle) Now() time.Time { return lc.clock.Now() }

// Removed tells the policy and passive health checking that ep left the pool.
func (lc *Lifecycle) Removed(ep *endpoint.Endpoint) {
	if lc.observer != nil {
		lc.observer.Removed(ep)
	}
	lc.health.Forget(ep)
	lc.audit.Forget(ep)
	lc.share.removed(ep)
}

// Ejections returns the endpoints ejected here for failures of their engines' own doing, and
// the rest of each ejection, for a replica that starts (PeerHealth.Ejections; none when
// passive health checking does not hear the other replicas).
func (lc *Lifecycle) Ejections() []Ejection {
	if lc.peers == nil {
		return nil
	}
	return lc.peers.Ejections(lc.clock.Now())
}

// Audit returns the cache-report audit, nil when there is none.
func (lc *Lifecycle) Audit() *Audit { return lc.audit }

// Health returns passive health checking.
func (lc *Lifecycle) Health() Health { return lc.health }

// Begin starts a request that arrived at arrival: the policy ranks candidates (available
// endpoints serving the request's model, in a stable order), and the endpoint that created the
// response named pin (previous_response_id; "" for none), if it is a candidate, goes first.
// req is kept and must not change until the Call has finished. The returned Call has no
// attempt yet: call Next.
func (lc *Lifecycle) Begin(req *policy.Request, candidates []*endpoint.Endpoint, pin string, arrival time.Time) (*Call, error) {
	c := &Call{lc: lc, Req: req, Arrival: arrival, predicted: -1, rawPredicted: -1}
	now := lc.clock.Now()
	candidates = lc.admitted(candidates, now)
	if len(candidates) == 0 {
		return c, ErrNoCandidate
	}
	lc.share.tellReplicas(lc)
	ranked, err := lc.picker.Pick(req, candidates)
	if err == nil && len(ranked) == 0 {
		err = ErrNoCandidate
	}
	if err != nil {
		return c, err
	}
	pick, first := ranked[0], ranked[0]
	pinned := ""
	if pin != "" {
		pinned = lc.state.pins.get(pin)
		ranked = pinFirst(ranked, candidates, pinned)
		first = c.movedBy(ranked, first, MovedPin)
		c.pinned = pinned
	}
	ranked = lc.backoffLast(ranked, now)
	first = c.movedBy(ranked, first, MovedBackoff)
	ranked = lc.warmUp(req, ranked, candidates, now)
	first = c.movedBy(ranked, first, MovedWarmUp)
	ranked = lc.probeBlind(req, ranked, now)
	first = c.movedBy(ranked, first, MovedCacheProbe)
	ranked = lc.avoidRefusing(req, ranked, pinned, now)
	if c.movedBy(ranked, first, MovedRefused) == pick {
		c.moved = "" // moved away and back
	}
	// The whole ranking is kept: an endpoint ejected or gone since the pick is passed over
	// without using up an attempt, and the next one takes its place (cut at the pick to the
	// attempts, a request with max_retries: 1 whose second endpoint was ejected meanwhile gave
	// up with 504 while healthy endpoints were left). Attempts bound the endpoints tried.
	c.ranked = ranked
	return c, nil
}

// avoidRefusing moves the first endpoint of ranked after it that is neither backed off (429)
// nor stalling to first place where the first is to be avoided for req
// (KeyedRefusalHealth.Avoid): it refused requests like it, and whether the rest of the fleet
// serves them is to be found out, or is known. The avoided one goes second. Not an endpoint the
// request is pinned to (pinned: its name), which alone holds the previous response the request
// names; and not where no other endpoint may take the request now (Avoid is not asked: a probe
// it counts as made would tell nothing). Stalling is read without claiming the stall probe
// that endpoint.Stalling grants (backoffLast has given it to this request, or it is not due).
//
// Avoidable is asked first: it rules out nearly every request at the cost of a few atomic
// loads, before the ranking is scanned for a stand-in and Avoid takes the refusals' lock.
func (lc *Lifecycle) avoidRefusing(req *policy.Request, ranked []*endpoint.Endpoint, pinned string, now time.Time) []*endpoint.Endpoint {
	if lc.keyed == nil || len(ranked) < 2 || pinned != "" && ranked[0].Name == pinned || !lc.keyed.Avoidable(ranked[0], req) {
		return ranked
	}
	i := 1 + slices.IndexFunc(ranked[1:], func(e *endpoint.Endpoint) bool {
		return e.StalledSince() == 0 && !lc.health.BackedOff(e, now)
	})
	if i == 0 || !lc.keyed.Avoid(ranked[0], req, now) {
		return ranked
	}
	out := make([]*endpoint.Endpoint, 0, len(ranked))
	out = append(append(append(out, ranked[i]), ranked[:i]...), ranked[i+1:]...)
	return out
}

// warmUp moves a warming-up endpoint from first place to second for the share of requests it
// may not take yet (Config.WarmUp).
func (lc *Lifecycle) warmUp(req *policy.Request, ranked, candidates []*endpoint.Endpoint, now time.Time) []*endpoint.Endpoint {
	if lc.warmup <= 0 {
		return ranked
	}
	n := now.UnixNano()
	lc.state.started.CompareAndSwap(0, n)
	started := lc.state.started.Load()
	for _, e := range candidates {
		if e.FirstSeen() == 0 {
			at := n
			if n-started < int64(time.Second) {
				at = started // there from the start: not new
			}
			e.MarkSeen(at)
		}
	}
	if len(ranked) < 2 {
		return ranked
	}
	first := ranked[0]
	seen := first.FirstSeen()
	if seen == started || n-seen >= int64(lc.warmup) {
		return ranked
	}
	share := float64(n-seen) / float64(lc.warmup)
	if float64(xxhash.Sum64String(req.ID)%1024)/1024 < share {
		return ranked
	}
	out := slices.Clone(ranked)
	out[0], out[1] = out[1], out[0]
	return out
}

// probeBlind moves a cache-blind endpoint that is due a probe to first place when the index
// says it holds some of the prompt (Audit.probe, AuditConfig.ProbeEvery; by a request whose
// pick is predicted to hit, once in costlyProbeEvery): the request tells the audit whether the
// engine finds its prefixes again. With n router replicas sharing their
// events, each probes n times less often: every audit hears every probe's answer (peerAudit),
// so the fleet probes as often as one router would.
func (lc *Lifecycle) probeBlind(req *policy.Request, ranked []*endpoint.Endpoint, now time.Time) []*endpoint.Endpoint {
	if lc.audit == nil || lc.predictor == nil || lc.audit.nblind.Load() == 0 {
		return ranked
	}
	n := 1
	if lc.share != nil {
		n, _, _ = lc.share.Replicas()
	}
	i := lc.audit.probe(ranked, func(ep *endpoint.Endpoint) int { return lc.predictor.PredictCached(req, ep) }, now, n)
	if i <= 0 {
		return ranked
	}
	out := make([]*endpoint.Endpoint, 0, len(ranked))
	out = append(append(append(out, ranked[i]), ranked[:i]...), ranked[i+1:]...)
	return out
}

// admitted returns the candidates that passive health checking has not ejected: candidates
// itself when none is (the usual case, no copy).
func (lc *Lifecycle) admitted(candidates []*endpoint.Endpoint, now time.Time) []*endpoint.Endpoint {
	for i, e := range candidates {
		if !lc.health.Ejected(e, now) {
			continue
		}
		out := slices.Clone(candidates[:i])
		for _, e := range candidates[i+1:] {
			if !lc.health.Ejected(e, now) {
				out = append(out, e)
			}
		}
		return out
	}
	return candidates
}

// backoffLast moves the endpoints that asked to be left alone (429), and those a stall watch
// found stalled that have not answered since (endpoint.Stalling: one request every
// stallProbeEvery may still go first to find out whether it works again), after the others,
// keeping the order within each group.
func (lc *Lifecycle) backoffLast(ranked []*endpoint.Endpoint, now time.Time) []*endpoint.Endpoint {
	var out, after []*endpoint.Endpoint
	for i, e := range ranked {
		stalling, probing := e.Stalling(now.UnixNano(), int64(stallProbeEvery))
		if probing {
			// The other replicas hold their probes for an interval: this one finds out.
			lc.share.stalled(e, e.StalledSince(), now.UnixNano())
		}
		if stalling || lc.health.BackedOff(e, now) {
			if out == nil {
				out = append(make([]*endpoint.Endpoint, 0, len(ranked)), ranked[:i]...)
			}
			after = append(after, e)
		} else if out != nil {
			out = append(out, e)
		}
	}
	if out == nil {
		return ranked
	}
	return append(out, after...)
}

// stallProbeEvery is how often an endpoint found stalled, and silent since, may take a request
// ahead of the others: health.ejection_time's default. A still-stalled engine costs one request
// held for a stall watch's span (which then goes elsewhere) per probe.
const stallProbeEvery = 30 * time.Second

// pinFirst moves the endpoint named name to the front of ranked (adding it from candidates
// when the policy left it out).
func pinFirst(ranked, candidates []*endpoint.Endpoint, name string) []*endpoint.Endpoint {
	if name == "" {
		return ranked
	}
	at := func(e *endpoint.Endpoint) bool { return e.Name == name }
	i := slices.IndexFunc(ranked, at)
	switch {
	case i == 0:
		return ranked
	case i < 0:
		j := slices.IndexFunc(candidates, at)
		if j < 0 {
			return ranked // it left the pool or is unavailable: the engine will say the id is unknown
		}
		return append([]*endpoint.Endpoint{candidates[j]}, ranked...)
	}
	out := make([]*endpoint.Endpoint, 0, len(ranked))
	out = append(out, ranked[i])
	out = append(out, ranked[:i]...)
	return append(out, ranked[i+1:]...)
}

// Call is one request from its pick to its end.
type Call struct {
	lc *Lifecycle
	// Req is the request as the policy sees it.
	Req *policy.Request
	// Arrival is when the request arrived; TTFT counts from it.
	Arrival time.Time

	ranked    []*endpoint.Endpoint
	next      int
	ep        *endpoint.Endpoint // the attempt in progress, or the last one
	open      bool               // an attempt is in progress
	attempts  int
	timeouts  int   // attempts that failed by timing out
	once      int   // attempts that failed so that they are retried once per request (Failure.RetryableOnce)
	sentAt    int64 // unix nanoseconds (the lifecycle's clock) the attempt in progress was sent
	lastFail  Failure
	predicted int // the policy's predicted cached tokens on ep, -1 unknown (0 when ep is blind)
	// rawPredicted is the policy's prediction whatever the audit says, for the audit itself.
	rawPredicted int
	firstAt      time.Time
	failAt       time.Time // when the last failed attempt failed (the attempt in progress was sent); zero when none did
	finished     bool
	ok           bool
	stall        StallWatch // the attempt in progress's

	shared uint64      // the attempt's ID in the Share (remote.go), 0 when none
	local  localFlight // the attempt in the Share's list of local ones (remote.go)
	moved  string      // why the first endpoint is not the policy's pick ("" when it is)
	// pinned is the name of the endpoint that made the previous response the request names
	// (its pin), "" when none is known: a refusal there is excused (closeAttempt), not one at
	// another endpoint.
	pinned string
}

// Why a request's first endpoint is not the one the policy ranked first (Call.Moved).
const (
	// MovedPin: the request is pinned to the endpoint that holds its previous response.
	MovedPin = "pin"
	// MovedBackoff: the policy's pick asked to be left alone (a 429) or was found stalled.
	MovedBackoff = "backoff"
	// MovedWarmUp: the pick joined the fleet recently and takes a growing share of requests.
	MovedWarmUp = "warm_up"
	// MovedCacheProbe: the request probes an endpoint whose cache reports disagree with the
	// index (route.Audit), to learn whether it finds its prefixes again.
	MovedCacheProbe = "cache_probe"
	// MovedRefused: the pick refused requests of this one's key (its prompt's first block and
	// its tenant) of late and served none: the request tries the next ranked endpoint, to learn
	// whether the rest of the fleet serves them (once a refusal window), or because it does
	// (KeyedRefusalHealth.Avoid).
	MovedRefused = "refused"
)

// movedBy records why when ranked no longer starts with first, and returns its first.
func (c *Call) movedBy(ranked []*endpoint.Endpoint, first *endpoint.Endpoint, why string) *endpoint.Endpoint {
	if ranked[0] != first {
		c.moved = why
	}
	return ranked[0]
}

// Moved says why the request's first endpoint is not the one its policy ranked first
// (MovedPin, MovedBackoff, MovedWarmUp, MovedCacheProbe, MovedRefused: the last step that
// changed the first), "" when it is.
func (c *Call) Moved() string { return c.moved }

// Ranked returns the first Attempts endpoints of the ranking as it was at the pick, in order:
// the list a front end that retries by itself (Envoy, through ext_proc) is given, and MoveTo's
// scope. Next goes on past them to the rest of the ranking (Ranking) where some of them are
// passed over as unusable.
func (c *Call) Ranked() []*endpoint.Endpoint { return c.ranked[:min(len(c.ranked), c.lc.attempts)] }

// Ranking returns every candidate as the pick ranked them, in order: the endpoints Next may
// go to, at most Attempts of them.
func (c *Call) Ranking() []*endpoint.Endpoint { return c.ranked }

// Next starts the next attempt and returns its endpoint, or nil when no endpoint is left, the
// attempts (Lifecycle.Attempts) are used up, or the call has finished. Endpoints that became
// unusable since the pick (ejected, unavailable) are passed over without using up an attempt:
// the next ranked one takes the place. The request is counted on the endpoint (in flight,
// pending prefill), the policy predicts its cached tokens there and is told it was routed.
func (c *Call) Next() *endpoint.Endpoint {
	if c.finished || c.open || c.attempts >= c.lc.attempts {
		return nil
	}
	for c.next < len(c.ranked) {
		ep := c.ranked[c.next]
		c.next++
		if c.attempts > 0 && !c.lc.usable(ep, c.lc.clock.Now()) {
			continue // ejected or removed since the pick; the first choice is tried regardless
		}
		c.start(ep)
		return ep
	}
	return nil
}

// left reports whether Next may start another attempt at now: an attempt is left, and a
// usable endpoint after the call's position.
func (c *Call) left(now time.Time) bool {
	return c.attempts < c.lc.attempts &&
		slices.ContainsFunc(c.ranked[c.next:], func(o *endpoint.Endpoint) bool { return c.lc.usable(o, now) })
}

// start opens an attempt on ep, the call's ranked[next-1]: the request counted on the endpoint,
// the policy's prediction there and its Routed, the stall watch, the other replicas' routed
// event.
func (c *Call) start(ep *endpoint.Endpoint) {
	c.ep, c.open = ep, true
	c.attempts++
	c.sentAt = c.lc.clock.Now().UnixNano()
	c.predicted, c.rawPredicted = -1, -1
	if p := c.lc.predictor; p != nil {
		c.rawPredicted = p.PredictCached(c.Req, ep)
		c.predicted = c.rawPredicted
		if c.lc.audit.Blind(ep) {
			c.predicted = 0 // what the router expects there now: nothing
		}
	}
	ep.Start(c.Req.PromptTokens)
	if o := c.lc.observer; o != nil {
		o.Routed(c.Req, ep)
	}
	c.watchStall(ep)
	c.lc.share.routed(c)
}

// MoveTo moves the call to ep, an endpoint of Ranked after the one of the attempt in progress
// (or of the last attempt), for a front end that went down the ranking by itself (Envoy, given
// the list, retried on its own) and got its answer from ep. passed says how each
// endpoint the call goes past fared, the attempt in progress's included: that attempt is closed
// as Fail closes it with passed's failure; for each endpoint after it, a failure other than
// FailNone is an attempt made and failed (the request counted there and settled at once, the
// policy told it was routed and done, health and the other replicas told as for an attempt
// that Fail closed), and FailNone no attempt at all (nothing told to anyone, nothing counted
// there: the front end skipped it untried). A nil passed passes every endpoint with FailNone.
// Then an attempt is opened on ep, as Next opens one, whatever ep's state now: ejected or
// unavailable since the pick, Next would pass it over, but the request went there and the
// answer is ep's. No retry budget is asked (Fail's): the front end made the attempts.
//
// MoveTo reports false, and changes nothing, when the call has finished, its attempt in
// progress had its first token (the answer has begun: no front end goes elsewhere then), or
// ep is not in Ranked after the call's position.
func (c *Call) MoveTo(ep *endpoint.Endpoint, passed func(*endpoint.Endpoint) Failure) bool {
	if c.finished || !c.firstAt.IsZero() {
		return false
	}
	to := -1
	if r := c.Ranked(); c.next < len(r) {
		to = slices.Index(r[c.next:], ep)
	}
	if to < 0 {
		return false
	}
	to += c.next
	fate := func(e *endpoint.Endpoint) Failure {
		if passed == nil {
			return FailNone
		}
		return passed(e)
	}
	if c.open {
		c.Fail(fate(c.ep))
	}
	for c.next < to {
		e := c.ranked[c.next]
		c.next++ // as Next leaves it: past the endpoint of the attempt it opens
		if f := fate(e); f != FailNone {
			c.start(e)
			c.Fail(f)
		}
	}
	c.next++
	c.start(ep)
	return true
}

// Fail ends the attempt in progress, which failed with f before anything reached the client,
// and reports whether the request may be sent to the next endpoint (call Next): always after a
// Retryable failure, once per request after a RetryableOnce one, and only while an attempt and
// a usable endpoint are left (Next passes over the others). When it may not, finish the call
// with Finish. The failure is told to passive health
// checking when it counts against the endpoint: not a request's second RetryableOnce failure
// (the request is then the likelier cause), and a client that left (FailCanceled) only when
// the engine had been stalled for as long as a stall watch waits (stalledWhenLeft), which
// counts as a timeout.
func (c *Call) Fail(f Failure) (retry bool) {
	if !c.open {
		return false
	}
	c.lastFail = f
	if f == FailTimeout {
		c.timeouts++
	}
	c.failAt = c.lc.clock.Now()
	if f == FailTimeout && c.firstAt.IsZero() && !c.Req.Whole {
		c.stall.timedOut(c.failAt.UnixNano(), c.lc.stall)
	}
	retry, told, counts := f.Retryable(), f, f.Counts()
	switch {
	case f.RetryableOnce():
		c.once++
		retry, counts = c.once == 1, c.once == 1
	case f == FailCanceled && c.stalledWhenLeft(c.failAt):
		told, counts = FailTimeout, true
	}
	c.closeAttempt(policy.Result{OK: false, CachedTokens: -1, PromptTokens: c.Req.PromptTokens,
		Duration: c.failAt.Sub(c.Arrival)}, told, counts)
	// A request whose first token came may have reached the client (the simulator fails a
	// stream its instance died under here): it is never sent again.
	return retry && c.firstAt.IsZero() && c.left(c.failAt)
}

// stalledWhenLeft reports whether the attempt in progress, whose client left at now before its
// first token, was held by a stalled engine: sent a stall watch's span ago or more (watched or
// not: the last attempt is not), and nothing from the engine in that span (for an answer that
// comes whole, its token counters, counted at every step, scraped unchanged in the span's
// second half: StallWatch.DueScraped). The engine is then marked stalled, as by a watch. An
// engine that hangs would otherwise hide behind clients that give up before its timeouts:
// their attempts count against nothing, and it is never ejected.
func (c *Call) stalledWhenLeft(now time.Time) bool {
	if c.lc.stall <= 0 || !c.firstAt.IsZero() {
		return false
	}
	if c.Req.Whole {
		if s := c.ep.Snapshot(); s == nil || !s.Stepwise {
			return false // a long generation there looks like a stall
		}
	}
	w := c.stall
	if w.after <= 0 {
		w = StallWatch{ep: c.ep, share: c.lc.share, sent: c.sentAt, after: c.stallSpan(c.ep)}
	}
	stalled, _ := w.due(now.UnixNano(), c.Req.Whole)
	return stalled
}

// Backoff records that the endpoint of the attempt in progress asked for d of rest (429 with
// Retry-After): later requests try it after the others until then, here and, told by a backoff
// event, at the other replicas (once per rest: not again while the engine is backed off here
// already, as the requests that were on their way to it meet its 429s). Call it before Fail.
func (c *Call) Backoff(d time.Duration) {
	if !c.open || d <= 0 {
		return
	}
	now := c.lc.clock.Now()
	told := c.lc.health.BackedOff(c.ep, now)
	c.lc.health.Backoff(c.ep, now, d)
	if !told {
		c.lc.share.backoff(c.ep, d)
	}
}

// closeAttempt settles the endpoint's counters, tells the policy the attempt is done (failed by
// the engine's doing unless it succeeded, f is the client's leaving, or f is a refusal that
// health checking does not hold against the engine) and tells passive health checking how it
// went: a success (res.OK), failure f, which counts against the endpoint when counts says so
// (the other replicas hear it as it counts here), or a refusal (refused).
func (c *Call) closeAttempt(res policy.Result, f Failure, counts bool) {
	c.open = false
	first := !c.firstAt.IsZero()
	c.ep.Finish(c.Req.PromptTokens, first)
	refused := !counts && c.refused(f)
	// A refusal is heard first: whether it counts against the engine is the policy's news too.
	// One client's bad requests all sent where their prefix is cached, which any engine would
	// refuse, once made that engine cost twice its cost or more (prefix-aware), and the good
	// traffic left it for the engines that never saw those requests.
	//
	// A refusal of a pinned request at the endpoint it is pinned to is excused: neither the
	// refusal rule nor the policy hears of it. Such a request goes first to the one endpoint
	// that holds its previous response, which the keep-away never moves it from
	// (avoidRefusing), and another lacks that response: the rule's comparison with the fleet
	// (the same requests refused there too, or served) is never made for it. One client that
	// pinned its bad requests to a healthy engine, with valid requests of the same prefixes
	// served elsewhere letting more of them count, had it ejected with one response id and
	// two prefixes, and each counted refusal, told to the policy as a failure, sent other
	// tenants' new prompts elsewhere (78 of 90 at that engine without it, 0 with). A broken
	// engine is found by its other traffic. At another endpoint (the pinned one ejected or
	// left out), the request is judged as an unpinned one: the keyed rule compares it with
	// the fleet, which refuses it alike when the previous response is what is missing.
	blamed := true
	switch {
	case !refused:
	case c.pinned != "" && c.ep.Name == c.pinned:
		blamed = false
	case c.lc.keyed != nil:
		v := c.lc.keyed.Refuse(c.ep, c.Req)
		blamed, res.TakeBack = v.Blamed, v.TakeBack
	case c.lc.refusals != nil:
		c.lc.refusals.Refused(c.ep)
	}
	// A failure that counts (a 5xx, a lost connection, a timeout) is passive health's to judge:
	// three in a row eject the endpoint and the alert says so. Told to the policy too, it kept
	// the endpoint away before the third, and a dead engine was ejected minutes later, one
	// failure at a time. The policy is told of what health does not count: refusals (those
	// held against the engine), a 429.
	res.Failed = !res.OK && f != FailNone && f != FailCanceled && !counts && blamed
	if o := c.lc.observer; o != nil {
		o.Done(c.Req, c.ep, res)
	}
	if !counts {
		f = FailNone // for the Share: nothing to count (its events carry counting failures only)
	}
	c.lc.share.done(c, res, f)
	switch {
	case counts:
		c.lc.health.Failed(c.ep, f)
	case res.OK:
		c.lc.health.Succeeded(c.ep)
		if c.lc.keyed != nil {
			c.lc.keyed.Served(c.ep, c.Req)
		}
	}
}

// refused reports whether an attempt that failed with f was refused by its engine: a 4xx other
// than 429 (FailRejected), or a 404 that did not name the request's model (an API path the
// engine lacks). A 404 that named it has left the endpoint out for that model already
// (endpoint.Refuses), and says nothing of its other traffic.
func (c *Call) refused(f Failure) bool {
	switch f {
	case FailRejected:
		return true
	case FailNotServed:
		return !c.ep.Refuses(c.Req.Model, c.lc.clock.Now())
	}
	return false
}

// FirstToken records that the request's first token arrived now. Only the first call counts.
func (c *Call) FirstToken() {
	if !c.open || !c.firstAt.IsZero() {
		return
	}
	c.firstAt = c.lc.clock.Now()
	c.ep.FirstToken(c.Req.PromptTokens)
	c.ep.Progressed(c.firstAt.UnixNano())
	if o := c.lc.observer; o != nil {
		o.FirstToken(c.Req, c.ep, c.attemptTTFT())
	}
	c.lc.share.firstToken(c)
}

// Outcome is how a request ended, as the router saw it.
type Outcome struct {
	// OK is true when the response was complete.
	OK bool
	// CachedTokens is what the engine reported as served from its prefix cache, or -1 when it
	// did not say.
	CachedTokens int
	// PromptTokens is what the engine reported, or 0 when it did not say (the router's
	// estimate is used).
	PromptTokens int
	// OutputTokens is what the engine reported (0 when it did not say).
	OutputTokens int
	// ResponseID, when set on a complete response, is remembered so that a later request
	// naming it (previous_response_id) goes to the same endpoint.
	ResponseID string
	// Failure, when OK is false, says how the attempt failed (FailNone when the endpoint is
	// not to blame: the client went away, say). It is told to passive health checking.
	Failure Failure
}

// Finish ends the call. The attempt in progress, if any, is settled with o: the endpoint's
// counters, the policy's Done (with the TTFT and the engine's usage, which it learns from).
// Finish is idempotent; the first call counts.
func (c *Call) Finish(o Outcome) {
	if c.finished {
		return
	}
	c.finished, c.ok = true, o.OK
	if !c.open {
		return
	}
	// The engine counts its own tokens: learn how they compare with the router's estimate, and
	// tell the policy in the router's units, the ones its predictions are made in.
	if o.PromptTokens > 0 {
		c.ep.LearnTokenScale(o.PromptTokens, c.Req.PromptTokens, tokenScaleWeight)
	}
	scale := c.ep.TokenScale()
	prompt := c.Req.PromptTokens
	if o.PromptTokens > 0 {
		prompt = int(math.Round(float64(o.PromptTokens) / scale))
	}
	cached := o.CachedTokens
	if cached > 0 {
		cached = min(int(math.Round(float64(cached)/scale)), prompt)
	}
	now := c.lc.clock.Now()
	if o.OK {
		c.ep.Progressed(now.UnixNano())
		// The engine's prefill rate, for the stall watch of policies that predict no TTFT: only
		// where it said what it had cached, else a prompt it mostly had would pass for a fast one.
		if !c.firstAt.IsZero() && o.CachedTokens >= 0 {
			c.ep.LearnPrefill(prompt-max(cached, 0), time.Duration(c.firstAt.UnixNano()-c.sentAt), now.UnixNano())
		}
	}
	f := o.Failure
	if !o.OK && f == FailNone {
		f = FailCanceled // not the endpoint's doing: nothing to tell health checking
	}
	if o.OK {
		f = FailNone
	}
	c.closeAttempt(policy.Result{
		OK: o.OK, CachedTokens: cached, PromptTokens: prompt, OutputTokens: o.OutputTokens,
		TTFT: c.attemptTTFT(), Duration: now.Sub(c.Arrival),
	}, f, f.Counts())
	if o.OK && o.ResponseID != "" {
		c.lc.state.pins.put(o.ResponseID, c.ep.Name)
	}
	if o.OK {
		if changed, blind := c.lc.audit.Observe(c.ep, c.rawPredicted, cached, now); changed && c.lc.blinder != nil {
			c.lc.blinder.SetCacheBlind(c.ep, blind)
		}
	}
}

// StallWatch watches one attempt for a stall: its engine holds it, has answered nothing at
// all (no first token, stream event or complete answer, for any request: endpoint.Progressed)
// for as long as would make the attempt's own wait MaxSlowdown times its predicted TTFT (or its
// prompt's prefill, without a prediction), and at least the lifecycle's StallTimeout. An
// engine that works answers something; one that queues the attempt behind others answers
// them, so a long queue is not a stall. Its methods are safe to call from any goroutine (a
// timer's).
type StallWatch struct {
	ep    *endpoint.Endpoint
	share *Share        // told of a stall found (nil: none)
	sent  int64         // unix nanoseconds (the lifecycle's clock) the attempt was sent
	after time.Duration // 0: not watched
}

// After is the wait for the first token after which the attempt may be stalled (check Due
// then); 0 when it is not watched.
func (w StallWatch) After() time.Duration { return w.after }

// Due reports whether, at now (unix nanoseconds, the lifecycle's clock), the attempt has
// stalled: sent After ago or more and nothing from its engine in the last After. When it has
// not, wait is how long until it could have (check again then). When it has, the endpoint is
// marked stalled from its last answer until its next (endpoint.Stalled): it goes after the
// others meanwhile (backoffLast), and the TTFTs of the requests it held then are not taken for
// its speed (policy.prefixAware's learnTTFT).
func (w StallWatch) Due(now int64) (stalled bool, wait time.Duration) { return w.due(now, false) }

// DueScraped is Due for an attempt whose answer shows nothing before it is complete (a
// non-streamed request): its engine's silence can be told from its own work only by the token
// counters scraped from it (endpoint.Snapshot's Work), so the attempt is stalled only if a
// snapshot with them was taken in the second half of the silent span. Without one (scraping
// failed or lags) it is not, and wait says when to look again.
func (w StallWatch) DueScraped(now int64) (stalled bool, wait time.Duration) { return w.due(now, true) }

func (w StallWatch) due(now int64, scraped bool) (stalled bool, wait time.Duration) {
	last := w.ep.LastProgress()
	from := max(w.sent, last)
	left := time.Duration(from + int64(w.after) - now)
	if left > 0 {
		return false, left
	}
	if scraped {
		if s := w.ep.Snapshot(); s == nil || s.Work <= 0 || s.At.UnixNano() < from+int64(w.after/2) {
			return false, w.after / 10
		}
	}
	w.found(last, now)
	return true, 0
}

// found marks the endpoint stalled at now, silent since last (its last answer; 0: never heard,
// so since the attempt was sent), and tells the other replicas if that opened the stall.
func (w StallWatch) found(last, now int64) {
	if last == 0 {
		last = w.sent
	}
	if w.ep.Stalled(last, now) {
		w.share.stalled(w.ep, last, now)
	}
}

// timedOut is told that the watched attempt, a stream, waited out its first-token timeout at
// now without its first token. If its engine answered nothing at all since the attempt was
// sent, at least floor (StallTimeout) ago, that is a stall found, as by Due: an attempt whose
// span (MaxSlowdown times a long prediction: a long prompt, a long queue) outlasts the timeout
// is never given up by its watch, and an engine whose traffic is all such attempts would
// otherwise never be found stalled, here or at the peers.
func (w StallWatch) timedOut(now int64, floor time.Duration) {
	if w.after <= 0 || now-w.sent < int64(floor) {
		return
	}
	if last := w.ep.LastProgress(); last <= w.sent { // else it answered meanwhile: slow, not stalled
		w.found(last, now)
	}
}

// Stall returns the stall watch of the attempt in progress: After 0 when the lifecycle does not
// watch stalls or no other endpoint is left to try (the last attempt waits for the first-token
// timeout as before). A stalled attempt is given up with Fail(FailTimeout).
func (c *Call) Stall() StallWatch { return c.stall }

// usable reports whether a retry may go to ep at now: it is available and not ejected.
func (lc *Lifecycle) usable(ep *endpoint.Endpoint, now time.Time) bool {
	return ep.Available() && !lc.health.Ejected(ep, now)
}

// watchStall sets the stall watch of the attempt just sent to ep.
func (c *Call) watchStall(ep *endpoint.Endpoint) {
	c.stall = StallWatch{}
	if c.lc.stall <= 0 {
		return
	}
	now := time.Unix(0, c.sentAt)
	if !c.left(now) {
		return
	}
	c.stall = StallWatch{ep: ep, share: c.lc.share, sent: c.sentAt, after: c.stallSpan(ep)}
}

// stallSpan is how long the attempt on ep may wait for its first token while its engine
// answers nothing before it is stalled: StallTimeout, or where longer MaxSlowdown times the
// policy's predicted TTFT, or, where the policy predicts none, MaxSlowdown times the prompt's
// own prefill there (prefillSpan). Until December 2026 an attempt without a prediction was not
// watched at all: on a router that had just started (prefix-aware predicts nothing before its
// first five TTFTs), and always with the other policies, a hung engine held each request for
// the first-token timeout (two minutes). Then, until the prefill was allowed for, it was
// watched for StallTimeout alone: an engine computing one prompt of 102,869 tokens, ~11 s, and
// nothing else had it given up at 10 s and started again elsewhere (round-robin, simulated).
func (c *Call) stallSpan(ep *endpoint.Endpoint) time.Duration {
	span := c.lc.stall
	if c.lc.ttfts != nil {
		if p := c.lc.ttfts.PredictTTFT(c.Req, ep); p > 0 {
			return max(span, time.Duration(policy.MaxSlowdown*float64(p)))
		}
	}
	uncached := c.Req.PromptTokens - max(c.predicted, 0)
	return max(span, prefillSpan(uncached, ep.PrefillRate()))
}

// prefillSpan is MaxSlowdown times the prefill of tokens at rate (tokens per second; 0: not
// known, fallbackPrefillRate stands in), at most maxPrefillSpan.
func prefillSpan(tokens int, rate float64) time.Duration {
	if tokens <= 0 {
		return 0
	}
	if rate <= 0 {
		rate = fallbackPrefillRate
	}
	return time.Duration(min(policy.MaxSlowdown*float64(tokens)/rate, maxPrefillSpan.Seconds()) * float64(time.Second))
}

// fallbackPrefillRate is the prefill rate, in the router's tokens per second, that an endpoint
// is granted before it has shown its own (endpoint.LearnPrefill): prefix-aware's prior, 10,000
// tokens a second, one GPU's prefill of a mid-sized model. With MaxSlowdown's margin a prompt
// of up to 5,000 tokens keeps StallTimeout's 10 s, and an engine as slow as 500 tokens a
// second is not given up.
const fallbackPrefillRate = 10000.0

// maxPrefillSpan bounds prefillSpan: beyond any first-token timeout (the attempt is then
// watched by that timeout alone), within time.Duration.
const maxPrefillSpan = 24 * time.Hour

// Endpoint returns the endpoint of the attempt in progress or of the last one, or nil when no
// attempt was made.
func (c *Call) Endpoint() *endpoint.Endpoint { return c.ep }

// Attempts is the number of attempts made.
func (c *Call) Attempts() int { return c.attempts }

// LastFailure is how the last failed attempt failed (FailNone when none did).
func (c *Call) LastFailure() Failure { return c.lastFail }

// TimedOut reports whether every attempt made so far failed by timing out (the answer to the
// client is then a 504).
func (c *Call) TimedOut() bool { return c.attempts > 0 && c.timeouts == c.attempts }

// Predicted is the policy's predicted cached tokens on the current (or last) attempt's
// endpoint, or -1 when the policy makes no prediction.
func (c *Call) Predicted() int { return c.predicted }

// FirstTokenAt is when the first token arrived, zero when none did.
func (c *Call) FirstTokenAt() time.Time { return c.firstAt }

// TTFT is the time from arrival to the first token, 0 when none arrived.
func (c *Call) TTFT() time.Duration {
	if c.firstAt.IsZero() {
		return 0
	}
	return c.firstAt.Sub(c.Arrival)
}

// attemptTTFT is the TTFT the endpoint of the attempt in progress is to be judged by, 0 when no
// first token came: from the request's arrival, less the earlier attempts' time (from the
// arrival to the last failure), which the endpoint had no part in. A request given up on a
// stalled engine after 10 s and answered by another at once taught that other one a TTFT of
// 10 s, 20 times its prediction, until December 2026.
func (c *Call) attemptTTFT() time.Duration {
	if c.firstAt.IsZero() {
		return 0
	}
	if !c.failAt.IsZero() {
		return c.firstAt.Sub(c.failAt)
	}
	return c.firstAt.Sub(c.Arrival)
}

// Finished reports whether Finish was called, and ok its outcome.
func (c *Call) Finished() (finished, ok bool) { return c.finished, c.ok }

// State is what outlives one Lifecycle across config reloads: which endpoint created which
// response (for previous_response_id).
type State struct {
	pins    pinTable
	started atomic.Int64 // unix nanoseconds of the first Begin: endpoints seen then are not new
}

// NewState returns an empty State remembering up to maxPins response ids (0: 100,000).
func NewState(maxPins int) *State {
	if maxPins <= 0 {
		maxPins = 100_000
	}
	return &State{pins: pinTable{max: maxPins, m: map[string]string{}}}
}

// pinTable maps response ids to endpoint names, forgetting the oldest beyond max.
type pinTable struct {
	mu    sync.Mutex
	max   int
	m     map[string]string
	order []string
	head  int
}

func (p *pinTable) put(id, ep string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.m[id]; ok {
		p.m[id] = ep
		return
	}
	if len(p.order) < p.max {
		p.order = append(p.order, id)
	} else {
		delete(p.m, p.order[p.head])
		p.order[p.head] = id
		p.head = (p.head + 1) % p.max
	}
	p.m[id] = ep
}

func (p *pinTable) get(id string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.m[id]
}
