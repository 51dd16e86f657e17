package des

import (
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/route"
)

// Faults, as the live router meets them (issue #12), through the same lifecycle: an instance
// that fails fast (answers 500 at once, before any byte reached the client: a failure that
// counts, and the request goes on to the next ranked endpoint once, route.FailStatus being
// RetryableOnce, as live), one that hangs (accepts requests and answers nothing: the
// first-token timeout fails each attempt over to the next ranked endpoint, and its streams in
// progress end at the stream idle timeout), one that cuts every stream after K tokens (a
// failure after the first byte: not retried; an answer that comes whole is cut before any
// byte of it, a lost connection, retried once as a 500 is), one blind to
// every cached prefix (it serves, and reports no cached tokens: the cache audit's silent zero
// hit), and the way back. Passive ejection (route.Outlier, with the live defaults) decides how
// long each of the failing ones keeps drawing requests; the cache audit (route.Audit), how
// long the blind one is sent prompts for the prefixes the index believes it holds.

// The live router's defaults (limits.first_token_timeout, limits.stream_idle_timeout,
// health.passive_failures), which the simulator takes when Config leaves them at zero
// (experiment's TestFaultDefaultsAreLive checks each against the router's).
const (
	DefaultFirstTokenTimeout = 2 * time.Minute
	// DefaultStallTimeout is limits.stall_timeout's default.
	DefaultStallTimeout      = 10 * time.Second
	DefaultStreamIdleTimeout = time.Minute
	DefaultPassiveFailures   = 3
	// ResponseTimeout is limits.response_timeout's default, which bounds the wait for an
	// answer that comes whole (workload.Request.Whole) in place of the first-token timeout.
	ResponseTimeout = 10 * time.Minute
)

// instState is what goes wrong with one instance.
type instState struct {
	// life counts the instance's restarts: events of an earlier life are dropped.
	life    int32
	failing bool // answers 500 at once
	hung    bool // accepts and answers nothing
	hungAt  time.Duration
	// frozen holds the events of a step that ended while the instance hung; frozenStep says
	// there is one (they are heard when it recovers).
	frozen     []engine.Event
	frozenStep bool
	cutAfter   int   // cuts streams after this many tokens (0: never)
	blind      bool  // finds nothing cached: each request gets a cache salt of its own
	steps      int32 // engine steps ended, for counting a stream's tokens
	// ttftSum and ttftN are the engine's TTFT histogram's sum (seconds, from each request's
	// arrival at the engine) and count, as its scrape reports them.
	ttftSum, ttftN float64
}

// firstStep values besides a step number.
const (
	noFirstToken int32 = -1 // no first token yet
	streamOver   int32 = -2 // finished or cut: nothing more to cut
)

// aborter is an engine that can drop a request (*engine.Engine is one): the router closed its
// connection after a timeout, or the instance cut it.
type aborter interface {
	Abort(now time.Duration, id string) bool
}

// initFaults fills the defaults of the timeouts and the per-instance and per-request fault state.
func (s *sim) initFaults() {
	if s.cfg.FirstTokenTimeout == 0 {
		s.cfg.FirstTokenTimeout = DefaultFirstTokenTimeout
	}
	if s.cfg.StreamIdleTimeout == 0 {
		s.cfg.StreamIdleTimeout = DefaultStreamIdleTimeout
	}
	s.inst = make([]instState, s.cfg.Instances)
	// Counting streams' tokens costs a little per engine event: only when something cuts.
	if slices.ContainsFunc(s.cfg.Changes, func(c Change) bool { return c.Kind == Cut }) {
		s.firstStep = make([]int32, len(s.w.reqs))
		for i := range s.firstStep {
			s.firstStep[i] = noFirstToken
		}
	}
}

// fault starts or ends a fault on an instance.
func (s *sim) fault(ch Change) error {
	inst := ch.Instance
	st := &s.inst[inst]
	switch ch.Kind {
	case Fail:
		st.failing = true
	case Cut:
		st.cutAfter = ch.Tokens
	case Blind:
		st.blind = true
	case Hang:
		if st.hung {
			return nil
		}
		st.hung, st.hungAt = true, s.clock.now
		// The streams it was sending go silent: each ends at the idle timeout.
		for _, i := range slices.Sorted(maps.Keys(s.held[inst])) {
			if c := s.state[i].call; c != nil && !c.FirstTokenAt().IsZero() { // nil: done
				s.watchIdle(int(i), inst)
			}
		}
	case Recover:
		if s.dead[inst] {
			// A restart: a new engine, nothing cached.
			e, err := s.cfg.NewEngine(inst)
			if err != nil {
				return err
			}
			s.engines[inst] = e
			s.dead[inst] = false
			s.stepping[inst] = false
			*st = instState{life: st.life, steps: st.steps}
			return nil
		}
		st.failing, st.cutAfter, st.blind = false, 0, false
		if !st.hung {
			return nil
		}
		st.hung = false
		switch {
		case st.frozenStep:
			// The step that ended while it hung is heard now, and the engine goes on.
			st.frozenStep = false
			s.push(event{at: s.clock.now, kind: evStepEnd, inst: int32(inst), evs: slices.Clone(st.frozen), n: st.life})
			st.frozen = st.frozen[:0]
		case !s.stepping[inst]:
			s.stepping[inst] = true
			s.push(event{at: s.clock.now, kind: evKick, inst: int32(inst), n: st.life})
		}
	}
	return nil
}

// stepEnded notes a step's end on inst: it reports true when the instance hangs (the events
// are kept for its recovery and nothing is heard); otherwise it counts the step and each
// stream's first token and end, for cutting streams.
func (s *sim) stepEnded(inst int, evs []engine.Event) (hung bool) {
	st := &s.inst[inst]
	if st.hung {
		st.frozen = append(st.frozen[:0], evs...)
		st.frozenStep = true
		return true
	}
	st.steps++
	if s.firstStep == nil {
		return false
	}
	for k := range evs {
		i, err := strconv.Atoi(evs[k].ReqID)
		if err != nil || i < 0 || i >= len(s.firstStep) {
			continue
		}
		switch evs[k].Kind {
		case engine.EventFirstToken:
			if s.firstStep[i] == noFirstToken {
				s.firstStep[i] = st.steps
			}
		case engine.EventFinished:
			s.firstStep[i] = streamOver
		}
	}
	return false
}

// cutStreams cuts, on an instance that cuts streams after K tokens, every stream that has had
// K: one token per step after the first (a stream preempted meanwhile is cut a little late).
// The engine drops it; the router hears of it one network latency later.
func (s *sim) cutStreams(inst int) {
	st := &s.inst[inst]
	if st.cutAfter == 0 || s.firstStep == nil {
		return
	}
	var cut []int32
	for i := range s.held[inst] {
		if f := s.firstStep[i]; f >= 0 && int(st.steps-f)+1 >= st.cutAfter {
			cut = append(cut, i)
		}
	}
	slices.Sort(cut) // the map's order is random; the run must not be
	for _, i := range cut {
		s.firstStep[i] = streamOver
		s.drop(inst, int(i))
		s.push(event{at: s.clock.now + s.cfg.NetworkLatency, kind: evCut, inst: int32(inst), req: i})
	}
}

// drop takes request i off instance inst: the engine aborts it (its connection closed).
func (s *sim) drop(inst, i int) {
	delete(s.held[inst], int32(i))
	if a, ok := s.engines[inst].(aborter); ok && !s.dead[inst] {
		a.Abort(s.clock.now, s.w.preqs[i].ID)
	}
}

// cut is the router hearing that inst closed request i's connection after K tokens. A stream
// has had its first token by then, which went to the client: the attempt ends cut, and the
// request with it. An answer that comes whole had sent nothing (kvroute sim's cut_after
// closes the connection before the answer's head): live, that is a connection lost before any
// byte, which the lifecycle may send to the next ranked endpoint once.
func (s *sim) cut(i, inst int) {
	if s.w.preqs[i].Whole {
		s.failAttempt(i, inst, route.FailLost, s.name(inst)+" closed the connection before its answer")
		return
	}
	s.endAttempt(i, inst, route.FailCut, s.name(inst)+" cut the stream")
}

// lost is the router hearing that inst died holding request i. A stream whose first token it
// had relayed is cut, as live (the client has bytes of it: a stream cut, which counts against
// the instance, whatever failed before it); anything else lost its connection before any byte
// (route.FailLost), which the lifecycle may send to the next ranked endpoint once.
func (s *sim) lost(i, inst int) {
	msg := s.name(inst) + " died with the request"
	if st := &s.state[i]; !st.done && int(st.inst) == inst && !st.call.FirstTokenAt().IsZero() {
		s.endAttempt(i, inst, route.FailCut, msg)
		return
	}
	s.failAttempt(i, inst, route.FailLost, msg)
}

// endAttempt ends request i's attempt on inst with a failure after which it is not sent again
// (a stream cut after bytes reached the client): the lifecycle tells passive health checking.
func (s *sim) endAttempt(i, inst int, f route.Failure, msg string) {
	st := &s.state[i]
	if st.done || int(st.inst) != inst {
		return
	}
	st.call.Finish(route.Outcome{CachedTokens: -1, Failure: f})
	s.finishFailed(i, msg)
}

// timeout is an attempt's first-token timeout: unless its first token came, the engine drops
// the request and it goes on to the next ranked endpoint.
func (s *sim) timeout(e event) {
	i, inst := int(e.req), int(e.inst)
	if !s.awaitsFirstToken(e) {
		return
	}
	s.drop(inst, i)
	if s.w.preqs[i].Whole {
		s.failAttempt(i, inst, route.FailTimeout, "no answer from "+s.name(inst)+" within "+ResponseTimeout.String())
		return
	}
	s.failAttempt(i, inst, route.FailTimeout, "no first token from "+s.name(inst)+" within "+s.cfg.FirstTokenTimeout.String())
}

// awaitsFirstToken reports whether the attempt e names (its request, instance and number) is
// still in progress without its first token.
func (s *sim) awaitsFirstToken(e event) bool {
	st := &s.state[e.req]
	return !st.done && st.inst == e.inst && int32(st.call.Attempts()) == e.n && st.call.FirstTokenAt().IsZero()
}

// stalled is an attempt's stall watch: unless its first token came, or its instance
// answered something in the watch's span (then it looks again later), the engine drops the
// request and it goes on to the next ranked endpoint, as after a timeout.
func (s *sim) stalled(e event) {
	i, inst := int(e.req), int(e.inst)
	st := &s.state[i]
	if !s.awaitsFirstToken(e) {
		return
	}
	stalled, wait := st.stall.Due(s.clock.Now().UnixNano())
	if !stalled {
		s.push(event{at: s.clock.now + wait, kind: evStall, inst: e.inst, req: e.req, n: e.n})
		return
	}
	s.stalls++
	s.drop(inst, i)
	s.failAttempt(i, inst, route.FailTimeout, s.name(inst)+" stalled: no first token, nothing from it for "+st.stall.After().String())
}

// watchIdle starts the idle timeout of request i's stream on inst, which hangs.
func (s *sim) watchIdle(i, inst int) {
	if s.cfg.StreamIdleTimeout > 0 {
		s.push(event{at: s.clock.now + s.cfg.StreamIdleTimeout, kind: evIdle, inst: int32(inst), req: int32(i), n: int32(s.state[i].call.Attempts())})
	}
}

// idleWatch starts request i's idle timeout when its first token is heard from an instance
// that hangs by then.
func (s *sim) idleWatch(i int) {
	if inst := s.state[i].inst; inst >= 0 && s.inst[inst].hung {
		s.watchIdle(i, int(inst))
	}
}

// idle is a stream's idle timeout: if its instance has hung since before the timer started,
// the stream ends as cut.
func (s *sim) idle(e event) {
	i, inst := int(e.req), int(e.inst)
	st := &s.state[i]
	is := &s.inst[inst]
	if st.done || int(st.inst) != inst || int32(st.call.Attempts()) != e.n || !is.hung || is.hungAt > e.at-s.cfg.StreamIdleTimeout {
		return
	}
	s.drop(inst, i)
	s.endAttempt(i, inst, route.FailCut, s.name(inst)+" sent nothing for "+s.cfg.StreamIdleTimeout.String()+" (the stream idle timeout)")
}

// stallTimeout is the lifecycle's route.Config.StallTimeout for c: DefaultStallTimeout when
// unset, 0 (none) when negative or not shorter than the first-token timeout.
func (c *Config) stallTimeout() time.Duration {
	d := c.StallTimeout
	if d == 0 {
		d = DefaultStallTimeout
	}
	ft := c.FirstTokenTimeout
	if ft == 0 {
		ft = DefaultFirstTokenTimeout
	}
	if d < 0 || ft > 0 && d >= ft {
		return 0
	}
	return d
}

// blindSalt is the cache salt a blind instance's engine gives request id: one no other request
// has, so that nothing it computes is ever found again (kvroute sim's no_prefix_cache fault
// does the same). What it computed while blind stays cached under those salts, useless, until
// evicted: an engine whose salt or tokenizer is put right does not find it either.
func blindSalt(id string) string { return "\x00blind " + id }
