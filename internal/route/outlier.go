package route

import (
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/policy"
)

// OutlierConfig configures passive ejection. The zero value takes every default.
type OutlierConfig struct {
	// Consecutive failures that count against an endpoint (connection errors, 5xx, timeouts,
	// lost requests, cut streams) eject it. 0: DefaultConsecutive.
	Consecutive int
	// BaseEjection is how long a first ejection lasts; the n-th in a row lasts n times as
	// long, up to MaxEjection. 0: DefaultBaseEjection and DefaultMaxEjection.
	BaseEjection, MaxEjection time.Duration
	// MaxEjectedPercent bounds the share of the fleet ejected at once (at least one endpoint
	// may be; never the last one standing). 0: DefaultMaxEjectedPercent.
	MaxEjectedPercent int
	// The refusal rule: an endpoint that refused (RefusalHealth) at least RefusalPercent % of
	// the attempts it answered (its successes and refusals) over about the last RefusalWindow,
	// at least RefusalVolume of them, while the rest of the fleet, answering at least
	// RefusalVolume in that time, refused at most half as large a share, is ejected as after
	// consecutive failures. 0: DefaultRefusalPercent, DefaultRefusalVolume,
	// DefaultRefusalWindow; a negative RefusalPercent turns the rule off.
	RefusalPercent, RefusalVolume int
	RefusalWindow                 time.Duration
	// Fleet returns how many endpoints the fleet has, for MaxEjectedPercent; nil: the number
	// this Outlier has heard of.
	Fleet func() int
	// OnEject, when set, is told of each ejection, its length, and whether the other router
	// replicas decided it (byFleet): the fleet's count reached the threshold with failures
	// they saw (PeerFailed) where this replica's own count had not, or a peer told this
	// replica, as it started, of its ejection in progress (PeerEjected); byFleet false: this
	// replica's own consecutive failures. OnReadmit is told of each endpoint taken back: by
	// the first request that finds its ejection over (byCheck false), or by an active health
	// check that passed before then (byCheck true, HealthPassed).
	OnEject   func(ep *endpoint.Endpoint, d time.Duration, byFleet bool)
	OnReadmit func(ep *endpoint.Endpoint, byCheck bool)
	// OnRefusals, when set, is told of each ejection by the refusal rule instead of OnEject,
	// with the share of its answers the endpoint refused and the share the rest of the fleet
	// refused; nil: OnEject is told (byFleet false).
	OnRefusals func(ep *endpoint.Endpoint, d time.Duration, refused, fleetRefused float64)
}

// Defaults of OutlierConfig.
const (
	DefaultConsecutive       = 5
	DefaultBaseEjection      = 30 * time.Second
	DefaultMaxEjection       = 5 * time.Minute
	DefaultMaxEjectedPercent = 50
	// The refusal rule's defaults. 85 % is Envoy's failure_percentage_threshold. 20 answers,
	// where Envoy asks 50 or 100 requests, because a refusal is not retried: each one is a
	// client's error; and the rest of the fleet refusing at most half as much is what tells an
	// engine's refusals from one client's bad requests, which the whole fleet refuses alike.
	// A minute, the policy's horizon for rates, so that an engine at a few requests a minute
	// still shows.
	DefaultRefusalPercent = 85
	DefaultRefusalVolume  = 20
	DefaultRefusalWindow  = time.Minute
)

// Outlier is passive health checking in the manner of Envoy's outlier detection: consecutive
// failures that count against an endpoint eject it from the candidates for an interval that
// grows with each ejection in a row (and shrinks again while it behaves), while a bounded share
// of the fleet may be ejected at once. An endpoint whose health check answers while its API
// hangs or fails fast is ejected all the same; active health checks (unhealthy endpoints) are
// a separate verdict. Refusals (a 4xx) count against nothing by themselves, the request may
// be at fault; an endpoint that refuses most of what it answers while the rest of the fleet
// does not (OutlierConfig's refusal rule, Envoy's failure-percentage detection measured
// against the fleet's) is ejected all the same: an engine without a chat template, or started
// with a shorter context than the others. Readmission is lazy, on the clock the lifecycle
// runs on (the wall clock live, the virtual clock in the simulator): no timer, no goroutine;
// or earlier, when an active health check passes (HealthPassed). Safe for concurrent use.
type Outlier struct {
	cfg   OutlierConfig
	clock policy.Clock

	mu      sync.Mutex
	st      map[*endpoint.Endpoint]*outlierState
	ejected atomic.Int32 // endpoints whose ejection may still run: a fast path for none
	// counting is how many endpoints have a fleet count above 0: PeerSucceeded's fast path.
	counting atomic.Int32
	// backoffEnd is the latest end of any backoff (unix nanoseconds): a fast path for none.
	backoffEnd atomic.Int64
	// keys are the request keys (RefusalKey) refused of late, with what each endpoint answered
	// and refused of each since (the refusal rule's judge of one client's bad requests); at
	// most maxRefusalKeys, the stalest going first, and none untouched for keyExpiry refusal
	// windows (expire, due at sweepAt). tracked is len(keys), and filter has bit
	// key%filterBits set for each of them (and perhaps for keys gone since, until it is
	// rebuilt): Served's and Avoid's fast paths, read without o.mu.
	keys    map[uint64]*refusedKey
	tracked atomic.Int32
	filter  [filterBits / 64]atomic.Uint64
	sweepAt time.Time
}

// filterBits is the size of Outlier.filter: with maxRefusalKeys followed, a request whose key
// is not followed finds its bit set about once in 16.
const filterBits = 4096

// keyExpiry is how many refusal windows a key may go untouched (neither refused nor served)
// before it is forgotten: its tallies have faded to e^-2 (13.5 %) of what they were, and what
// they still discount moves to the endpoints' forgiven tallies (forgive), which fade as the
// endpoints' own do. A key then no longer outranks fresh ones at the bound (dropKey), nor
// keeps Served and Avoid off their fast paths.
const keyExpiry = 2

// probeAfter is how many refusals of one key (fading) an endpoint that served none of it must
// have made before the key's next request tries another endpoint first (Avoid).
const probeAfter = 2

// refusedKey is what the endpoints answered and refused of one request key since it was first
// refused, each tally fading over the refusal window.
type refusedKey struct {
	touched time.Time
	eps     []keyTally
	// probed is when a request of the key was last sent first to another endpoint than one
	// that refused it, to learn whether the rest of the fleet serves it (Avoid); zero: never.
	probed time.Time
}

type keyTally struct {
	ep                *endpoint.Endpoint
	answered, refused float64
	// excused is how many of refused count against the endpoint neither as refusals nor as
	// answers (excessAt): each refusal is judged once, as it comes (countKey), and excused or
	// not for good, but for the first one taken back (blamedAt). The rest (counted) is what
	// the key adds to the refusal rule at the endpoint.
	excused float64
	at      time.Time
	// blamedAt is when the endpoint's first refusal of the key was blamed on it (and told to
	// the policy as a failed attempt) while no endpoint served the key; zero when none was, or
	// it was taken back: once another endpoint refuses the key too, and none serves it, the
	// key is the client's, and the endpoint's next refusal of it takes that one back.
	blamedAt time.Time
}

// decay returns the factor t's tallies have faded by at now, with time constant w.
func (t *keyTally) decay(now time.Time, w time.Duration) float64 {
	if dt := now.Sub(t.at); dt > 0 {
		return math.Exp(-float64(dt) / float64(w))
	}
	return 1
}

// excessAt returns the refusals of t's key at its endpoint at now that count neither as
// refusals nor as answers (excused, fading).
func (t *keyTally) excessAt(now time.Time, w time.Duration) float64 {
	if t.excused == 0 {
		return 0
	}
	return t.excused * t.decay(now, w)
}

// countedAt returns the refusals of t's key at its endpoint at now that count against it
// (fading).
func (t *keyTally) countedAt(now time.Time, w time.Duration) float64 {
	return max(t.refused-t.excused, 0) * t.decay(now, w)
}

// fade returns t's tallies at now, fading with time constant w.
func (t *keyTally) fade(now time.Time, w time.Duration) (answered, refused float64) {
	k := t.decay(now, w)
	return t.answered * k, t.refused * k
}

// maxRefusalKeys bounds the request keys an Outlier follows. One client's bad requests are one
// key; an engine that refuses everything makes many, each refused once or answered elsewhere.
// Past the bound the stalest key with no excused refusal (repeated) goes first: its loss
// costs the rule nothing (its next refusal is blamed, as a first one is). Only when every key
// followed holds excused refusals does one go that may hold a client's flood (the stalest),
// and then each endpoint keeps its excess as forgiven (outlierState), so that the rule still
// discounts it: however many keys come and go, one client's refusals never count in full.
const maxRefusalKeys = 256

// answeredElsewhere is how many answers of a key (fading) other endpoints must have given
// for its refusals at one that refuses it to count again, from then on and up to one more than
// those answers (countKey): about one in the last RefusalWindow x ln 2.
const answeredElsewhere = 0.5

type outlierState struct {
	fails int // consecutive failures here
	// fleet counts consecutive failures of the engine's own doing (sharedFailure) here and at
	// the other router replicas (PeerFailed), with no success at either in between. With no
	// peers it never passes fails.
	fleet   int
	times   int       // ejections in a row, for the interval's multiplier
	until   time.Time // ejected until
	since   time.Time // when the last ejection ended (for the multiplier's decay)
	out     bool      // ejected, not yet readmitted
	backoff time.Time // tried after the others until then (429)
	// engine: the ejection under way was for failures of the engine's own doing
	// (sharedFailure), which a new replica is told of (Ejections); not for failures to connect,
	// which may be this replica's path alone.
	engine bool
	// ejectedAt is when the ejection under way began; checkEnds: which active health checks
	// sent after then end it (HealthPassed). Any that passes, for failures that all say the
	// engine could not be reached or died (endsBy); one that passes after one that failed
	// (checkFailed), for such failures mixed with answers (a 5xx, a 503, a timeout): a restart
	// the checks saw; for 503s alone, one that passes where the first check that told anything
	// since the run of failures that led to the ejection began failed saying the engine was not
	// ready or down (checkNotReady before checkPassed): an engine still loading when it was
	// ejected, then loaded. None for other answers alone (a 5xx, a timeout, with or without
	// 503s) or refusals, which an engine gives while its health check passes; nor for an
	// ejection a peer told of (PeerEjected); nor one that came while checkBack held.
	ejectedAt time.Time
	checkEnds checkEnd
	// runAt is when the failures counted here or by the fleet (fails, fleet) began, one of the
	// counts going from 0 to 1 while both were 0; zero while both are 0.
	runAt time.Time
	// checksFrom is when the run of failures that the active health checks are judged against
	// began: for the ejection under way, the run that led to it (runAt as it was; its own
	// start where no failure was counted: a peer's word, the refusal rule); with none, the run
	// under way (runAt), which may lead to one; zero: neither. A check that failed, sent during
	// that run, saw the engine down or loading in the same episode, though it was sent before
	// the ejection began (the run's last failures came after it): an engine restarting fails
	// its checks from its first failure on (HealthFailed).
	checksFrom time.Time
	// checkFailed, checkNotReady and checkPassed are when the earliest active health checks
	// sent since checksFrom were sent that failed (for any reason), that failed saying the
	// engine was not ready or down (CheckFailure.saysNotReady), and that passed; zero: none.
	// Heard in any order, each keeps the earliest.
	checkFailed, checkNotReady, checkPassed time.Time
	// checkBack: a health check ended the endpoint's last ejection, and the attempts here have
	// not succeeded Consecutive times in a row since (okRun counts them). Ejected again so, the
	// engine fails where its health check passes (one that loses the connections of some of
	// its requests or cuts their streams behind a live /health, or dies at each request and
	// restarts): the check is no
	// judge of it, and that ejection runs its time, as do the next ones until the engine has
	// served so. One success was not enough: an engine losing the connections of half its
	// requests cleared it nearly every time (13.6 failed attempts a minute, against 2.7
	// without the checks; now 4.3).
	checkBack bool
	okRun     int
	// answered and refused count the attempts here that succeeded or were refused, fading over
	// the refusal window, as of tallied (the refusal rule).
	answered, refused float64
	tallied           time.Time
	// forgiven is the excess (Outlier.excess) of the keys dropped to make room for others
	// (dropKey), fading over the refusal window as of forgivenAt: one client's refusals again,
	// which still count neither as refusals nor as answers.
	forgiven   float64
	forgivenAt time.Time
	// kinds and fleetKinds are the kinds of the failures counted in fails and in fleet (bit
	// 1<<Failure each), since each count began: which passing health checks can judge the
	// ejection they make (endsBy).
	kinds, fleetKinds uint16
}

// tally returns s's answers and refusals at now, fading with time constant w.
func (s *outlierState) tally(now time.Time, w time.Duration) (answered, refused float64) {
	if dt := now.Sub(s.tallied); dt > 0 && s.answered > 0 {
		k := math.Exp(-float64(dt) / float64(w))
		return s.answered * k, s.refused * k
	}
	return s.answered, s.refused
}

// count adds an answer at now to s's tally, refused or not.
func (s *outlierState) count(now time.Time, w time.Duration, refused bool) {
	s.answered, s.refused = s.tally(now, w)
	s.tallied = now
	s.answered++
	if refused {
		s.refused++
	}
}

// NewOutlier returns an Outlier with cfg (zero fields take the defaults) on clock (nil: the
// wall clock).
func NewOutlier(cfg OutlierConfig, clock policy.Clock) *Outlier {
	if cfg.Consecutive <= 0 {
		cfg.Consecutive = DefaultConsecutive
	}
	if cfg.BaseEjection <= 0 {
		cfg.BaseEjection = DefaultBaseEjection
	}
	if cfg.MaxEjection <= 0 {
		cfg.MaxEjection = max(DefaultMaxEjection, cfg.BaseEjection)
	}
	if cfg.MaxEjectedPercent <= 0 {
		cfg.MaxEjectedPercent = DefaultMaxEjectedPercent
	}
	if cfg.RefusalPercent == 0 {
		cfg.RefusalPercent = DefaultRefusalPercent
	}
	if cfg.RefusalVolume <= 0 {
		cfg.RefusalVolume = DefaultRefusalVolume
	}
	if cfg.RefusalWindow <= 0 {
		cfg.RefusalWindow = DefaultRefusalWindow
	}
	if clock == nil {
		clock = policy.WallClock{}
	}
	return &Outlier{cfg: cfg, clock: clock, st: map[*endpoint.Endpoint]*outlierState{}, keys: map[uint64]*refusedKey{}}
}

// Configure replaces the configuration (on a config reload); ejections under way keep their
// end. Zero fields take the defaults.
func (o *Outlier) Configure(cfg OutlierConfig) {
	n := NewOutlier(cfg, o.clock)
	o.mu.Lock()
	o.cfg = n.cfg
	o.mu.Unlock()
}

// state returns ep's state, creating it, or nil for an endpoint that left the pool
// (endpoint.Draining) and has none: its requests that end after Forget must not bring it
// back, each such state kept for good with the endpoint it names. The caller holds o.mu.
func (o *Outlier) state(ep *endpoint.Endpoint) *outlierState {
	s := o.st[ep]
	if s == nil && !ep.Draining() {
		s = &outlierState{}
		o.st[ep] = s
	}
	return s
}

// Failed counts a failure against ep and ejects it at the threshold, if the fleet can spare it.
func (o *Outlier) Failed(ep *endpoint.Endpoint, f Failure) bool {
	o.mu.Lock()
	s := o.state(ep)
	if s == nil {
		o.mu.Unlock()
		return false
	}
	s.failing(o.clock.Now())
	s.fails, s.okRun = s.fails+1, 0
	s.kinds |= 1 << f
	if sharedFailure(f) {
		o.setFleet(s, s.fleet+1)
		s.fleetKinds |= 1 << f
	}
	return o.judge(ep, s)
}

// PeerFailed counts a failure that another router replica saw on ep (its Done event): a
// failure of the engine's own doing (sharedFailure) counts towards the fleet's consecutive
// failures, so that an engine failing for every replica is ejected everywhere after as many
// failures as one router would need, not after that many at each. A connection failure may
// be the path from that replica alone, and counts only where it happened.
func (o *Outlier) PeerFailed(ep *endpoint.Endpoint, f Failure) bool {
	if !sharedFailure(f) {
		return false
	}
	o.mu.Lock()
	s := o.state(ep)
	if s == nil {
		o.mu.Unlock()
		return false
	}
	s.failing(o.clock.Now())
	o.setFleet(s, s.fleet+1)
	s.fleetKinds |= 1 << f
	return o.judge(ep, s)
}

// PeerSucceeded resets the fleet's consecutive failures of ep: another replica's attempt on
// it went well. This replica's own count stays: it may be this replica's path that fails.
func (o *Outlier) PeerSucceeded(ep *endpoint.Endpoint) {
	if o.counting.Load() == 0 {
		return
	}
	o.mu.Lock()
	if s := o.st[ep]; s != nil {
		o.setFleet(s, 0)
		s.settled()
	}
	o.mu.Unlock()
}

// Ejection is an endpoint ejected for failures of its engine's own doing, and the rest of its
// ejection.
type Ejection struct {
	Endpoint *endpoint.Endpoint
	Rest     time.Duration
}

// Ejections returns the endpoints ejected at now for failures of their engines' own doing,
// for a replica that starts: a failure to connect may be this replica's path alone, and an
// ejection for it is not told.
func (o *Outlier) Ejections(now time.Time) []Ejection {
	if o.ejected.Load() == 0 {
		return nil
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []Ejection
	for ep, s := range o.st {
		if s.out && s.engine && now.Before(s.until) {
			out = append(out, Ejection{ep, s.until.Sub(now)})
		}
	}
	return out
}

// PeerEjected ejects ep for rest, as another replica found it (a warm start's snapshot), if
// the fleet can spare it and it is not ejected already; it reports whether it did. A later
// ejection here lasts as a second one in a row would. No health check of this replica's ends
// it: peers tell of ejections for failures of the engine's own doing (Ejections), a 5xx or a
// hang that the engine's health check passes through.
func (o *Outlier) PeerEjected(ep *endpoint.Endpoint, rest time.Duration) bool {
	now := o.clock.Now()
	o.mu.Lock()
	s := o.state(ep)
	rest = min(rest, o.cfg.MaxEjection)
	if s == nil || s.out && now.Before(s.until) || rest <= 0 || !o.canEject(now) {
		o.mu.Unlock()
		return false
	}
	s.times = max(s.times, 1)
	return o.eject(ep, s, now, rest, true, true, endsByNone)
}

// sharedFailure reports whether f is of the engine's own doing, whoever saw it: it counts
// (Failure.Counts) and is not a failure to connect, which may be one router's path alone.
func sharedFailure(f Failure) bool { return f.Counts() && f != FailConnect }

// unreachable are the failures that say the engine could not be reached or died (a bit
// 1<<Failure each): no connection, the connection lost with the request, a stream cut. Any
// passing health check ends an ejection for these alone (endsByAny): it shows the engine
// reachable again, as after a restart, which cuts every stream in flight (streamed at 20
// requests a second, a restart of 0.57 s ejected an engine on its cut streams alone). A 5xx, a
// 503 or a timeout is an answer, or a hang, of an engine that may pass its health check all the
// while: mixed with these, only a check that passes after one failed ends the ejection
// (endsByRecovery); alone, none does, but for 503s alone (notReady, endsByReady). A cut is
// taken as a death, though it may be a stream the engine left silent for stream_idle_timeout
// or ended with an event that is no API event (Failure does not tell them apart): checkBack
// bounds what an engine that cuts streams behind a live /health costs.
const unreachable = 1<<FailConnect | 1<<FailLost | 1<<FailCut

// The kinds of failures fit outlierState's uint16 sets of them: a build error otherwise.
var _ [16 - len(failureNames)]struct{}

// checkEnd is which passing health checks end an ejection (HealthPassed), from none to any;
// a larger value ends it at least as soon.
type checkEnd uint8

const (
	// endsByNone: no check ends it, it runs its time. Answers alone (a 5xx or a timeout, with
	// or without 503s), refusals, an ejection a peer told of.
	endsByNone checkEnd = iota
	// endsByReady: a check that passes where, of the checks sent since the run of failures
	// that led to the ejection began, the first that passed or failed not ready
	// (CheckFailure.saysNotReady: a 5xx, a refused connection) failed so, and after that one:
	// the engine was still not ready when it was ejected, and became ready. A check that timed
	// out counts for nothing here. 503s alone (notReady): a llama.cpp restarted between two
	// requests, or reloading its model, answers 503 "Loading model" to requests and to its
	// health check alike, and the router sees no refused connection nor cut stream. Stricter
	// than endsByRecovery because an engine that answers 503 to some requests behind a /health
	// that fails now and then (overloaded) fails a check sooner or later in most ejections,
	// and a readmission costs Consecutive failed attempts: taken back by any check that passed
	// after one that failed, at 30 % of its requests failing it failed 18.0 attempts a minute,
	// against 9.4 with the checks ignored; with the first check having to fail, 10.6 where its
	// checks fail by a 503, and 9.4 where they time out (as an overloaded engine's /health
	// does), which says nothing (TestCheckLoadingFlap's engine, one check in four failing, 300
	// runs of 10 minutes; 10.5 when the checks did not say why they failed).
	endsByReady
	// endsByRecovery: a check that passes, sent since the ejection began, after one that
	// failed (for any reason), sent since the run of failures that led to it began: the checks
	// saw the engine down (or loading) and then up, a restart or a recovery.
	// Failures that say the engine was unreachable or died, mixed with answers: a restarted
	// engine cuts its streams, has its connections refused, then answers 503 while it loads
	// its model (llama.cpp's "Loading model") or lets requests time out. An engine that fails
	// requests behind a live /health never fails its check, and is not taken back by one.
	endsByRecovery
	// endsByAny: any check that passes, for failures that all say the engine could not be
	// reached or died (unreachable): it is reachable again.
	endsByAny
)

// endsBy returns which checks end an ejection for failures of kinds (bits 1<<Failure): any
// for unreachable ones alone (endsByAny); one after a failed one where some are unreachable
// (endsByRecovery); one after a first one that failed not ready for 503s alone (notReady,
// endsByReady); none otherwise.
func endsBy(kinds uint16) checkEnd {
	switch {
	case kinds == 0:
		return endsByNone
	case kinds&^unreachable == 0:
		return endsByAny
	case kinds&unreachable != 0:
		return endsByRecovery
	case kinds&^notReady == 0:
		return endsByReady
	}
	return endsByNone
}

// notReady is the one answer that says the engine is not ready rather than broken (a bit
// 1<<Failure): a 503 (FailUnavailable; a 429, FailBusy, does not count at all). An ejection for
// 503s alone is ended by a check that passes after the first one since their run began failed
// not ready (endsByReady); mixed with a 5xx or a timeout, by none. FailUnavailable also holds a
// router's 508 (its loop guard) and a redirect answered to an API request: an ejection for
// those is ended as a loading engine's is, by its checks alone (a first one that failed not
// ready, then one that passed).
const notReady = 1 << FailUnavailable

// setFleet sets s's fleet count, keeping o.counting (and clearing the count's kinds with it).
// The caller holds o.mu.
func (o *Outlier) setFleet(s *outlierState, n int) {
	switch {
	case s.fleet == 0 && n > 0:
		o.counting.Add(1)
	case s.fleet > 0 && n == 0:
		o.counting.Add(-1)
	}
	s.fleet = n
	if n == 0 {
		s.fleetKinds = 0
	}
}

// failing notes a failure counted against s at now, before its counts grow: where neither
// counted one (here, the fleet), a run of failures begins (runAt), and the health checks sent
// since are judged against it, unless an ejection is under way, whose own run they are
// judged against (checksFrom).
func (s *outlierState) failing(now time.Time) {
	if s.fails == 0 && s.fleet == 0 {
		s.runAt = now
		if !s.out {
			s.judgeChecksFrom(now)
		}
	}
}

// settled notes that s's counts may both be 0 again (a success here or at a peer): the run
// of failures is over, and the checks judged against it are forgotten, unless an ejection is
// under way.
func (s *outlierState) settled() {
	if s.fails == 0 && s.fleet == 0 {
		s.runAt = time.Time{}
		if !s.out {
			s.judgeChecksFrom(time.Time{})
		}
	}
}

// judgeChecksFrom has the health checks sent after t (zero: none) judged from then on,
// forgetting those heard before.
func (s *outlierState) judgeChecksFrom(t time.Time) {
	s.checksFrom, s.checkFailed, s.checkNotReady, s.checkPassed = t, time.Time{}, time.Time{}, time.Time{}
}

// readmitted marks s's ejection over at now. The checks are judged against the run of
// failures under way again (failures of attempts that ended during the ejection; none:
// nothing), those heard during the ejection forgotten.
func (s *outlierState) readmitted(now time.Time) {
	s.out, s.since = false, now
	s.judgeChecksFrom(s.runAt)
}

// judge ejects ep when either count of s has reached the threshold and the fleet can spare
// it, and reports whether it did. The caller holds o.mu; judge releases it.
func (o *Outlier) judge(ep *endpoint.Endpoint, s *outlierState) bool {
	now := o.clock.Now()
	if s.out || max(s.fails, s.fleet) < o.cfg.Consecutive || !o.canEject(now) {
		o.mu.Unlock()
		return false
	}
	s.times++
	d := min(time.Duration(s.times)*o.cfg.BaseEjection, o.cfg.MaxEjection)
	own, fleet := s.fails >= o.cfg.Consecutive, s.fleet >= o.cfg.Consecutive
	// Each count that ejected says which checks may end it; the stricter one holds.
	check := endsByAny
	if own {
		check = min(check, endsBy(s.kinds))
	}
	if fleet {
		check = min(check, endsBy(s.fleetKinds))
	}
	return o.eject(ep, s, now, d, fleet, !own, check)
}

// eject ejects ep from now for d, for failures of its engine's own doing (engine) or not, the
// fleet's count having reached the threshold rather than this replica's own (byFleet), which
// passing health checks end it (check: ejectLocked), and tells OnEject. Its tally of answers
// starts again: readmitted, it is judged on what it answers then. The caller holds o.mu;
// eject releases it, and reports true.
func (o *Outlier) eject(ep *endpoint.Endpoint, s *outlierState, now time.Time, d time.Duration, engine, byFleet bool, check checkEnd) bool {
	o.ejectLocked(ep, s, now, d, engine, check)
	onEject := o.cfg.OnEject
	o.mu.Unlock()
	if onEject != nil {
		onEject(ep, d, byFleet)
	}
	return true
}

// ejectLocked marks ep (its state s) ejected from now for d; the passing health checks that
// check says (endsBy) may end it, unless checkBack holds. The caller holds o.mu.
func (o *Outlier) ejectLocked(ep *endpoint.Endpoint, s *outlierState, now time.Time, d time.Duration, engine bool, check checkEnd) {
	if !s.out { // else an ejection over but not yet found so (Ejected): counted already
		o.ejected.Add(1)
	}
	if s.checkBack {
		check = endsByNone
	}
	// The checks heard since the run of failures that led here began are this ejection's. An
	// ejection with no failure counted (a peer's word, the refusal rule), or that comes as an
	// ejection over was not yet found so (whose checks they are), has its own from now.
	if s.out || s.runAt.IsZero() {
		s.judgeChecksFrom(now)
	}
	s.until, s.out, s.engine, s.fails, s.kinds = now.Add(d), true, engine, 0, 0
	s.ejectedAt, s.checkEnds, s.runAt = now, check, time.Time{}
	s.answered, s.refused, s.forgiven = 0, 0, 0
	for _, k := range o.keys { // its answers by key start again too
		if t := k.tally(ep); t != nil {
			t.answered, t.refused, t.excused = 0, 0, 0
		}
	}
	o.setFleet(s, 0)
}

// Refused counts an attempt that ep refused (RefusalHealth), of a request without a key: as
// RefusedRequest, the refusal counting alone.
func (o *Outlier) Refused(ep *endpoint.Endpoint) bool {
	return o.refused(ep, 0).Ejected
}

// RefusedRequest is Refuse's verdict on ep's refusal of req as two of its fields: whether ep
// was ejected by it, and whether it counts against ep.
func (o *Outlier) RefusedRequest(ep *endpoint.Endpoint, req *policy.Request) (ejected, blamed bool) {
	v := o.Refuse(ep, req)
	return v.Ejected, v.Blamed
}

// Refuse counts an attempt that ep refused, of req (KeyedRefusalHealth), and ejects ep by the
// refusal rule (OutlierConfig) if the fleet can spare it. The rest of the fleet is every other
// endpoint not ejected now, its answers pooled: one client's bad requests, spread over the
// fleet, are refused everywhere alike, and a fleet whose every engine refuses ejects none of
// them. Only this replica's own attempts count: each replica judges from its share of the
// traffic.
//
// The same requests refused again are no more evidence against the engine than once: one
// client's bad requests that share a prefix all go where it is cached (prefix-aware), and the
// rest of the fleet never sees them to refuse them. So the refusals of one request key
// (RefusalKey) count once at an endpoint, the others counting neither as refusals nor as
// answers, unless other endpoints answered that key of late: then the engine refuses what the
// others serve, and its refusals count from then on (not those before), at most one more than
// the answers elsewhere. Whether they do is found out: a key refused twice at an endpoint
// that served none of it has its next request sent first to another endpoint, once a refusal
// window (Avoid). Served there, the key keeps away from the first while its refusals there
// last; refused there too, the key is the client's: that refusal counts against neither
// endpoint, nor from then on the first one's first (Refusal.TakeBack). And the refusals that
// count must come from two keys at least (refusing): a broken engine refuses everyone's.
//
// So one client's refusals of a key count at most 1 + (the times the key was served
// elsewhere) at an endpoint, in about a refusal window: to move the rule (RefusalVolume
// refusals that count, 20 by default) at a healthy engine, a client needs about as many
// prefixes cached there, each refused there once, or a valid request of a key served by
// another engine for each refusal of it past the first that still reaches the engine
// (docs/router.md, "Refusals", measures it).
func (o *Outlier) Refuse(ep *endpoint.Endpoint, req *policy.Request) Refusal {
	return o.refused(ep, RefusalKey(req))
}

// refused is Refuse for a request of key (0: none, the refusal counts alone).
// With the rule off, the keys are still followed: whether a refusal is blamed on the engine is
// the policy's news too.
func (o *Outlier) refused(ep *endpoint.Endpoint, key uint64) Refusal {
	now := o.clock.Now()
	o.mu.Lock()
	s := o.state(ep)
	if s == nil {
		o.mu.Unlock()
		return Refusal{Blamed: true}
	}
	o.expire(now)
	v := Refusal{Blamed: true}
	if key != 0 {
		v = o.countKey(ep, key, now, true)
	}
	if o.cfg.RefusalPercent < 0 {
		o.mu.Unlock()
		return v
	}
	s.count(now, o.cfg.RefusalWindow, true)
	share, rest, ok := o.refusing(ep, s, now)
	if s.out || !ok || !o.canEject(now) {
		o.mu.Unlock()
		return v
	}
	s.times++
	d := min(time.Duration(s.times)*o.cfg.BaseEjection, o.cfg.MaxEjection)
	o.ejectLocked(ep, s, now, d, true, endsByNone)
	onRefusals, onEject := o.cfg.OnRefusals, o.cfg.OnEject
	o.mu.Unlock()
	switch {
	case onRefusals != nil:
		onRefusals(ep, d, share, rest)
	case onEject != nil:
		onEject(ep, d, false)
	}
	v.Ejected = true
	return v
}

// Served counts an answer of ep to req (KeyedRefusalHealth), beside Succeeded: where req's key
// was refused of late, an answer to it tells that the fleet serves it.
func (o *Outlier) Served(ep *endpoint.Endpoint, req *policy.Request) {
	key, ok := o.followed(req)
	if !ok {
		return
	}
	now := o.clock.Now()
	o.mu.Lock()
	defer o.mu.Unlock()
	o.expire(now)
	if o.keys[key] != nil && !ep.Draining() {
		o.countKey(ep, key, now, false)
	}
}

// Avoid reports whether req should be sent first to another endpoint than ep, its pick
// (KeyedRefusalHealth): ep refused req's key at least probeAfter times of late (fading) and
// served it not, and either another endpoint serves the key (ep refuses what the others
// serve: the key keeps away from it while ep's refusals last), or no other endpoint answered
// the key of late and none was tried for it in the last refusal window (a probe: whether the
// rest of the fleet serves it decides whether ep's refusals of it count from then on, Refuse).
// The caller has another endpoint to send req to; a probe is counted as made.
func (o *Outlier) Avoid(ep *endpoint.Endpoint, req *policy.Request, now time.Time) bool {
	key, ok := o.followed(req)
	if !ok {
		return false
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.expire(now)
	k := o.keys[key]
	if k == nil {
		return false
	}
	t := k.tally(ep)
	if t == nil {
		return false
	}
	w := o.cfg.RefusalWindow
	a, r := t.fade(now, w)
	if r < probeAfter-0.5 || a-r >= 0.5 {
		return false
	}
	served, refused := k.others(ep, now, w)
	switch {
	case served >= answeredElsewhere:
		return true
	case refused >= 0.5:
		return false // another endpoint refused it too, and none served it: the client's
	case !k.probed.IsZero() && now.Sub(k.probed) < w:
		return false
	}
	k.probed = now
	return true
}

// Avoidable reports whether Avoid could move req away from ep (KeyedRefusalHealth): whether
// req's key is followed at all (its filter bit is set), read without o.mu. ep does not narrow
// it: the filter holds the keys refused at any endpoint.
func (o *Outlier) Avoidable(_ *endpoint.Endpoint, req *policy.Request) bool {
	_, ok := o.followed(req)
	return ok
}

// followed returns req's key, and whether it may be followed (a key, its filter bit set):
// Served's and Avoid's fast path, without o.mu.
func (o *Outlier) followed(req *policy.Request) (uint64, bool) {
	if o.tracked.Load() == 0 {
		return 0, false
	}
	key := RefusalKey(req)
	if key == 0 || o.filter[key/64%(filterBits/64)].Load()&(1<<(key%64)) == 0 {
		return 0, false
	}
	return key, true
}

// RefusalKey is what names the requests that are "the same" for the refusal rule: the
// request's first prompt block (seeded with its model and its tenant's salt) and its tenant,
// which one client's requests that share a prefix share; 0, which counts each refusal alone,
// for a prompt shorter than a block (nothing keeps such requests together).
func RefusalKey(req *policy.Request) uint64 {
	if req == nil || len(req.Blocks) == 0 {
		return 0
	}
	// FNV-1a over the tenant, folded into the block's hash.
	h := uint64(14695981039346656037)
	for i := range len(req.Tenant) {
		h = (h ^ uint64(req.Tenant[i])) * 1099511628211
	}
	k := req.Blocks[0] ^ h
	if k == 0 {
		k = 1
	}
	return k
}

// tally returns ep's tally of k, nil when it has none.
func (k *refusedKey) tally(ep *endpoint.Endpoint) *keyTally {
	for i := range k.eps {
		if k.eps[i].ep == ep {
			return &k.eps[i]
		}
	}
	return nil
}

// countKey adds an answer of ep to key at now, refused or not, following key from its first
// refusal, and for a refusal returns whether it counts against ep (refusing's rule) and the
// earlier refusal to take back, if any (Refusal.TakeBack). A refusal counts when its key was
// answered elsewhere of late, as long as the key's refusals counted at ep stay within one more
// than those answers (fading); or when it is the first here of late while no other endpoint
// refused the key and none served it. Each refusal is judged once, as it comes: those excused
// stay excused when the key is served elsewhere later (before, they then all counted, and one
// client could have a healthy engine ejected by bursts of bad requests on prefixes cached
// there, each followed by one good request that a probe sent elsewhere). The caller holds
// o.mu.
func (o *Outlier) countKey(ep *endpoint.Endpoint, key uint64, now time.Time, refused bool) Refusal {
	w := o.cfg.RefusalWindow
	k := o.keys[key]
	if k == nil {
		if len(o.keys) >= maxRefusalKeys {
			o.dropKey(now)
		}
		k = &refusedKey{}
		o.keys[key] = k
		o.tracked.Store(int32(len(o.keys)))
		o.filter[key/64%(filterBits/64)].Or(1 << (key % 64))
	}
	k.touched = now
	t := k.tally(ep)
	if t == nil {
		k.eps = append(k.eps, keyTally{ep: ep, at: now})
		t = &k.eps[len(k.eps)-1]
	}
	d := t.decay(now, w)
	t.answered, t.refused, t.excused, t.at = t.answered*d, t.refused*d, t.excused*d, now
	t.answered++
	if !refused {
		return Refusal{}
	}
	var v Refusal
	served, refusedElsewhere := k.others(ep, now, w)
	first := t.refused < 0.5
	switch {
	case served >= answeredElsewhere:
		// The engine refuses what the others serve: its refusals count from now on, as many
		// as one more than the answers elsewhere.
		v.Blamed, t.blamedAt = t.refused-t.excused < served+0.5, time.Time{}
	case refusedElsewhere >= 0.5:
		// Refused elsewhere too, and served nowhere: the client's. Its first refusal here
		// (or the one blamed before, taken back) no longer counts either.
		if first {
			t.excused = t.refused
		} else if !t.blamedAt.IsZero() {
			v.TakeBack, t.blamedAt, t.excused = t.blamedAt, time.Time{}, t.refused
		}
	case first:
		v.Blamed, t.blamedAt = true, now
	}
	t.refused++
	if !v.Blamed {
		t.excused++
	}
	return v
}

// others returns the answers (fading) that endpoints other than ep gave to k at now, and their
// refusals of it.
func (k *refusedKey) others(ep *endpoint.Endpoint, now time.Time, w time.Duration) (served, refused float64) {
	for i := range k.eps {
		if k.eps[i].ep != ep {
			a, r := k.eps[i].fade(now, w)
			served += a - r
			refused += r
		}
	}
	return served, refused
}

// dropKey forgets a key to make room for another (maxRefusalKeys): the stalest with no excused
// refusal (repeated), or, where every key has some, the stalest of all, its excess moving to
// the forgiven tally of each endpoint it counted for. The filter is rebuilt in the same pass
// over the keys: at the bound each new key refused comes here, under o.mu. The caller holds
// o.mu.
func (o *Outlier) dropKey(now time.Time) {
	var stalest, single uint64
	var stalestAt, singleAt time.Time
	anyKey, anySingle := false, false
	// f has the bit of every key, shared those bits set by two keys or more: the dropped key's
	// bit goes unless another key has it too.
	var f, shared [filterBits / 64]uint64
	for key, k := range o.keys {
		i, bit := key/64%(filterBits/64), uint64(1)<<(key%64)
		shared[i] |= f[i] & bit
		f[i] |= bit
		if !anyKey || k.touched.Before(stalestAt) {
			stalest, stalestAt, anyKey = key, k.touched, true
		}
		if !k.repeated() && (!anySingle || k.touched.Before(singleAt)) {
			single, singleAt, anySingle = key, k.touched, true
		}
	}
	drop := single
	if !anySingle {
		drop = stalest
		o.forgive(o.keys[drop], now)
	}
	delete(o.keys, drop)
	o.tracked.Store(int32(len(o.keys)))
	i, bit := drop/64%(filterBits/64), uint64(1)<<(drop%64)
	f[i] &^= bit &^ shared[i]
	o.storeFilter(&f)
}

// expire forgets the keys untouched for keyExpiry refusal windows, their excess moving to the
// forgiven tally of each endpoint it counted for (as dropKey's), when a sweep is due: at most
// once a quarter window, so that the keys' bound (maxRefusalKeys) is the cost of a sweep and
// the request path's share of it is constant. The caller holds o.mu.
func (o *Outlier) expire(now time.Time) {
	if now.Before(o.sweepAt) || len(o.keys) == 0 {
		return
	}
	w := o.cfg.RefusalWindow
	o.sweepAt = now.Add(w / 4)
	n := len(o.keys)
	for key, k := range o.keys {
		if now.Sub(k.touched) > keyExpiry*w {
			o.forgive(k, now)
			delete(o.keys, key)
		}
	}
	if len(o.keys) != n {
		o.tracked.Store(int32(len(o.keys)))
		o.rebuildFilter()
	}
}

// rebuildFilter sets o.filter to the bits of the keys followed now. Each word is stored whole,
// and holds every followed key's bit before and after: a reader without o.mu never misses a
// key followed throughout. The caller holds o.mu.
func (o *Outlier) rebuildFilter() {
	var f [filterBits / 64]uint64
	for key := range o.keys {
		f[key/64%(filterBits/64)] |= 1 << (key % 64)
	}
	o.storeFilter(&f)
}

// storeFilter sets o.filter to f, each word whole. The caller holds o.mu.
func (o *Outlier) storeFilter(f *[filterBits / 64]uint64) {
	for i := range f {
		o.filter[i].Store(f[i])
	}
}

// repeated reports whether k has excess at some endpoint (excessAt), its tallies unfaded:
// false means it has none (tallies only fade).
func (k *refusedKey) repeated() bool {
	for i := range k.eps {
		if k.eps[i].excused > 0 {
			return true
		}
	}
	return false
}

// forgive adds k's excess at now (as excess counts it) to the forgiven tally of each endpoint
// it counts for, before k is dropped. The caller holds o.mu.
func (o *Outlier) forgive(k *refusedKey, now time.Time) {
	w := o.cfg.RefusalWindow
	for i := range k.eps {
		t := &k.eps[i]
		x := t.excessAt(now, w)
		if x <= 0 {
			continue
		}
		if s := o.st[t.ep]; s != nil {
			s.forgiven = s.forgivenNow(now, w) + x
			s.forgivenAt = now
		}
	}
}

// forgivenNow returns s's forgiven tally at now, fading with time constant w.
func (s *outlierState) forgivenNow(now time.Time, w time.Duration) float64 {
	if dt := now.Sub(s.forgivenAt); dt > 0 && s.forgiven > 0 {
		return s.forgiven * math.Exp(-float64(dt)/float64(w))
	}
	return s.forgiven
}

// excess returns, for each endpoint, the refusals of the keys followed that were excused there
// (excessAt, fading: countKey), with those of the keys dropped since (forgiven): one client's
// bad requests that count neither as refusals nor as answers. The caller holds o.mu.
func (o *Outlier) excess(now time.Time) map[*endpoint.Endpoint]float64 {
	w := o.cfg.RefusalWindow
	var out map[*endpoint.Endpoint]float64
	for ep, s := range o.st {
		if f := s.forgivenNow(now, w); f > 0 {
			if out == nil {
				out = map[*endpoint.Endpoint]float64{}
			}
			out[ep] = f
		}
	}
	for _, k := range o.keys {
		for i := range k.eps {
			t := &k.eps[i]
			x := t.excessAt(now, w)
			if x <= 0 {
				continue
			}
			if out == nil {
				out = map[*endpoint.Endpoint]float64{}
			}
			out[t.ep] += x
		}
	}
	return out
}

// refusing reports whether ep (its state s) meets the refusal rule at now, with the share of
// its answers it refused and the share the rest of the fleet refused, each endpoint's tally
// less its excess (one client's requests refused again). The refusals that count must not all
// be one key's (oneKey): an engine that refuses requests refuses everyone's, and one key's
// refusals that count, though bounded (countKey), are still one client's doing. The caller
// holds o.mu.
func (o *Outlier) refusing(ep *endpoint.Endpoint, s *outlierState, now time.Time) (share, rest float64, ok bool) {
	w, volume := o.cfg.RefusalWindow, float64(o.cfg.RefusalVolume)
	answered, refused := s.tally(now, w)
	if answered < volume || refused*100 < answered*float64(o.cfg.RefusalPercent) {
		return 0, 0, false
	}
	ex := o.excess(now)
	if x := min(ex[ep], refused); x > 0 {
		answered, refused = answered-x, refused-x
		if answered < volume || refused*100 < answered*float64(o.cfg.RefusalPercent) {
			return 0, 0, false
		}
	}
	var others, othersRefused float64
	for e, t := range o.st {
		if t == s || t.out && now.Before(t.until) {
			continue
		}
		a, r := t.tally(now, w)
		x := min(ex[e], r)
		others += a - x
		othersRefused += r - x
	}
	if others < volume {
		return 0, 0, false // no evidence that the fleet answers this traffic
	}
	share, rest = refused/answered, othersRefused/others
	if rest > share/2 || refused-o.oneKey(ep, now) < 0.5 {
		return 0, 0, false
	}
	return share, rest, true
}

// oneKey returns the most refusals of one key followed that count against ep at now (fading).
// The caller holds o.mu.
func (o *Outlier) oneKey(ep *endpoint.Endpoint, now time.Time) float64 {
	w := o.cfg.RefusalWindow
	most := 0.0
	for _, k := range o.keys {
		if t := k.tally(ep); t != nil {
			most = max(most, t.countedAt(now, w))
		}
	}
	return most
}

// canEject reports whether one more endpoint may be ejected. The caller holds o.mu.
func (o *Outlier) canEject(now time.Time) bool {
	n := len(o.st)
	if o.cfg.Fleet != nil {
		n = max(o.cfg.Fleet(), 1)
	}
	out := 0
	for _, s := range o.st {
		if s.out && now.Before(s.until) {
			out++
		}
	}
	limit := max(1, n*o.cfg.MaxEjectedPercent/100)
	return out < limit && out+1 < n
}

// Succeeded resets ep's consecutive failures; an endpoint that behaves for a base interval
// after an ejection has its next ejection shortened by one step.
func (o *Outlier) Succeeded(ep *endpoint.Endpoint) {
	o.mu.Lock()
	defer o.mu.Unlock()
	s := o.st[ep]
	if s == nil {
		if ep.Draining() || o.cfg.Fleet != nil && o.cfg.RefusalPercent < 0 {
			return
		}
		s = &outlierState{} // counted in the fleet, and its answers in the refusal rule's
		o.st[ep] = s
	}
	if o.cfg.RefusalPercent >= 0 {
		s.count(o.clock.Now(), o.cfg.RefusalWindow, false)
	}
	s.fails, s.kinds = 0, 0
	if s.okRun++; s.okRun >= o.cfg.Consecutive {
		s.checkBack = false
	}
	o.setFleet(s, 0)
	s.settled()
	if s.times > 0 && !s.out && o.clock.Now().Sub(s.since) >= o.cfg.BaseEjection {
		s.times--
		s.since = o.clock.Now()
	}
}

// Ejected reports whether ep is ejected at now, readmitting it when its interval is over.
func (o *Outlier) Ejected(ep *endpoint.Endpoint, now time.Time) bool {
	if o.ejected.Load() == 0 {
		return false
	}
	o.mu.Lock()
	s := o.st[ep]
	if s == nil || !s.out {
		o.mu.Unlock()
		return false
	}
	if now.Before(s.until) {
		o.mu.Unlock()
		return true
	}
	s.readmitted(now)
	o.ejected.Add(-1)
	onReadmit := o.cfg.OnReadmit
	o.mu.Unlock()
	if onReadmit != nil {
		onReadmit(ep, false)
	}
	return false
}

// HealthPassed ends ep's ejection for failures when an active health check of it that was
// sent at sent (on o's clock), after the ejection began, passed, as Envoy's outlier detection
// does by default (successful_active_health_check_uneject_host), where the failures that
// ejected it say that the engine could not be reached or died (connections refused, lost
// with their requests, streams cut: unreachable): an engine that restarted is back within a
// health interval of answering, not after the whole ejection time. Where such failures were
// mixed with answers (a 5xx, a 503, a timeout), it ends the ejection only if a check that
// failed (HealthFailed) was sent before this one and since the run of failures that led to
// the ejection began (its first failure): the checks saw the engine down or loading, then up
// (a restarted llama.cpp answers 503 "Loading model" to requests and to its health check
// alike until its model is loaded). Where the failures were 503s alone (notReady: a llama.cpp
// restarted between two requests, or reloading its model, the router seeing no refused
// connection nor cut stream), it ends the ejection only if, of the checks sent since that run
// began, the first that passed or failed saying the engine was not ready or down
// (CheckFailure.saysNotReady: not a timeout) failed so, and this one was sent after it: the
// engine was still loading when it was ejected, then loaded (endsByReady). It reports whether
// it ended one, and tells OnReadmit (byCheck).
//
// A passing check sent before the ejection began does not end it: the run's last failures
// came after it. For an ejection for 503s alone it is the run's first check all the same, if
// sent since the run began: the engine answered its check while it failed requests. A failed
// check sent during the run counts though it was sent before the ejection (HealthFailed). Nor
// does a check judge an engine that answered: one that fails some or all of its requests with
// a 5xx, a 503 or a timeout passes its health check all the while, and a check that
// readmitted it at each health interval would send it passive_failures requests to fail each
// time (with half its requests failing, 2.7 failed attempts a minute became 13.6). So an
// ejection for a 5xx or a timeout alone (503s among them or not), by the refusal rule, or told
// by a peer (PeerEjected) runs its time; one for such failures mixed with unreachable ones
// waits for a check that failed; and one for 503s alone, for a check that failed not ready
// first. Nor is one ended that came after a health check ended the last one, the engine not
// having served Consecutive attempts in a row here since (outlierState.checkBack): one that
// loses the connections of some of its requests or cuts their streams behind a live /health,
// or dies at each request and is restarted. The ejections in a row still count for the next
// one's length.
func (o *Outlier) HealthPassed(ep *endpoint.Endpoint, sent time.Time) bool {
	now := o.clock.Now()
	o.mu.Lock()
	s := o.st[ep]
	if s == nil || s.checksFrom.IsZero() || !sent.After(s.checksFrom) {
		o.mu.Unlock()
		return false // no run of failures nor ejection under way, or a check from before it
	}
	if s.checkPassed.IsZero() || sent.Before(s.checkPassed) {
		s.checkPassed = sent
	}
	// An ejection over already is Ejected's to end, as it would have ended without the check.
	if !s.out || !sent.After(s.ejectedAt) || !now.Before(s.until) {
		o.mu.Unlock()
		return false
	}
	switch s.checkEnds {
	case endsByAny:
	case endsByRecovery:
		if s.checkFailed.IsZero() || !sent.After(s.checkFailed) {
			o.mu.Unlock()
			return false
		}
	case endsByReady:
		// checkPassed is at most sent: the first check that told anything failed not ready,
		// and this one came after it.
		if s.checkNotReady.IsZero() || !s.checkPassed.After(s.checkNotReady) {
			o.mu.Unlock()
			return false
		}
	default:
		o.mu.Unlock()
		return false
	}
	s.readmitted(now)
	s.checkBack, s.okRun = true, 0
	o.ejected.Add(-1)
	onReadmit := o.cfg.OnReadmit
	o.mu.Unlock()
	if onReadmit != nil {
		onReadmit(ep, true)
	}
	return true
}

// CheckFailure is how an active health check failed (HealthFailed), as the prober saw it
// (scrape.CheckFailure has the same fields).
type CheckFailure struct {
	// Status is the HTTP status the check was answered with; 0: none.
	Status int
	// Timeout: no answer came within the check's timeout (the connection made or not).
	Timeout bool
	// Refused: no connection could be made, and not for want of time: nothing listens at the
	// address (connection refused), or it does not resolve.
	Refused bool
}

// saysNotReady reports whether f says that the engine is not ready or down: an answer 5xx
// (llama.cpp's 503 "Loading model"; vLLM and SGLang answer their /health 503 or 500 while
// they start or once their engine died) other than a gateway's timeout (504), or a connection
// refused. A timeout does not: an engine overloaded past the check's timeout (its /health
// queued behind its requests) gives it as much as one that is loading. Nor does a 4xx: the
// engine answered, and has no such path.
func (f CheckFailure) saysNotReady() bool {
	return !f.Timeout && (f.Refused || f.Status >= 500 && f.Status != 504)
}

// HealthFailed is told of an active health check of ep, sent at sent (on o's clock), that
// failed, and how (why): an engine down, or answering it 503 while it loads, or one overloaded
// past the check's timeout. Sent since the run of failures began that led to ep's ejection
// (or that is under way, and may lead to one), it lets a check that passes after it end an
// ejection for unreachable failures mixed with answers; and, failed not ready (why.saysNotReady)
// and sent before any check that passed since then, one for 503s alone (HealthPassed). It
// changes nothing else: whether ep is healthy is the checker's own verdict (its thresholds),
// apart from passive health.
func (o *Outlier) HealthFailed(ep *endpoint.Endpoint, sent time.Time, why CheckFailure) {
	o.mu.Lock()
	defer o.mu.Unlock()
	s := o.st[ep]
	if s == nil || s.checksFrom.IsZero() || !sent.After(s.checksFrom) {
		return
	}
	if s.checkFailed.IsZero() || sent.Before(s.checkFailed) {
		s.checkFailed = sent
	}
	if why.saysNotReady() && (s.checkNotReady.IsZero() || sent.Before(s.checkNotReady)) {
		s.checkNotReady = sent
	}
}

// Failures returns ep's consecutive failures that count: here since this replica's last
// success there, and the fleet's (here and at the other replicas, PeerFailed) since the last
// success anywhere.
func (o *Outlier) Failures(ep *endpoint.Endpoint) (here, fleet int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if s := o.st[ep]; s != nil {
		return s.fails, s.fleet
	}
	return 0, 0
}

// EjectedUntil returns when ep's ejection ends, zero when it is not ejected.
func (o *Outlier) EjectedUntil(ep *endpoint.Endpoint) time.Time {
	o.mu.Lock()
	defer o.mu.Unlock()
	if s := o.st[ep]; s != nil && s.out {
		return s.until
	}
	return time.Time{}
}

// Backoff has ep tried after the others until now + d.
func (o *Outlier) Backoff(ep *endpoint.Endpoint, now time.Time, d time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	s := o.state(ep)
	if s == nil {
		return
	}
	if until := now.Add(d); until.After(s.backoff) {
		s.backoff = until
		if u := until.UnixNano(); u > o.backoffEnd.Load() {
			o.backoffEnd.Store(u)
		}
	}
}

// BackedOff reports whether ep is to be tried after the others at now.
func (o *Outlier) BackedOff(ep *endpoint.Endpoint, now time.Time) bool {
	if now.UnixNano() >= o.backoffEnd.Load() {
		return false
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	s := o.st[ep]
	return s != nil && now.Before(s.backoff)
}

// Forget drops what is known of ep.
func (o *Outlier) Forget(ep *endpoint.Endpoint) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if s := o.st[ep]; s != nil {
		if s.out {
			o.ejected.Add(-1)
		}
		o.setFleet(s, 0)
	}
	delete(o.st, ep)
	for key, k := range o.keys {
		k.eps = slices.DeleteFunc(k.eps, func(t keyTally) bool { return t.ep == ep })
		if len(k.eps) == 0 {
			delete(o.keys, key)
		}
	}
	o.tracked.Store(int32(len(o.keys)))
	o.rebuildFilter()
}
