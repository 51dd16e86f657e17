package policy

import (
	"time"

	"github.com/kvroute/kvroute/internal/endpoint"
)

// Completer is implemented by observers that can take a request's whole life in one call:
// routed to ep, its first token after ttft, and done with res, with nothing else happening to
// the policy in between. Router replicas replay the requests of the others from their events
// (route.Lifecycle.ApplyBatch); with a fast engine a request's three events often arrive
// together, and replaying them as one placement costs one index insert instead of two, and
// none of the bookkeeping of a request in flight.
//
// Completed must leave the policy as Routed, FirstToken and Done called in turn would, in
// everything the policy can observe afterwards (its picks, predictions and the state they
// read), and must not keep req. It returns false, having changed nothing, when it cannot
// (the caller then makes the three calls).
type Completer interface {
	Completed(req *Request, ep *endpoint.Endpoint, ttft time.Duration, res Result) bool
}

// Completed replays a request's Routed, FirstToken and Done at once (Completer). It takes
// only requests that succeeded and whose engine report the policy is not to check (res.
// CachedTokens < 0: a receiving replica hears the report only where the origin saw an
// eviction); the rest go through the three calls.
//
// What the three calls do, and what this does instead: Routed queues the request's work on ep
// and FirstToken takes it off again (net nothing: a request appended to the queue and removed
// before any other change leaves the queue, its head and its counters as they were; the head's
// start time changes only while the queue is empty, when nothing reads it), but for the
// answers that come whole which both take off the queue, and this as well: those due by now
// (settle) and those ahead of this one, whose first tokens came before its (settleAhead); the
// prediction,
// the affinity and placement rates, the capacity probe and the speed calibration see the same
// values as the calls would (the queue ahead of it, the index before its blocks go in, the
// requests waiting after its first token); and Routed inserts the prompt's blocks and Done
// again unless nothing changed on ep meanwhile, which prefix.Index.InsertTwice does, stamps
// included (here nothing comes between: once, unless the first insert evicted). The calls
// read the clock three times, this once: live, as if its first token and end had come at once.
func (pa *prefixAware) Completed(req *Request, ep *endpoint.Endpoint, ttft time.Duration, res Result) bool {
	if !res.OK || res.CachedTokens >= 0 || !pa.touchDone {
		return false
	}
	s := pa.stateOf(ep)
	if s == nil {
		pa.replicas.held.Delete(req) // ep left and is forgotten: the calls would do only this
		return true
	}
	pa.sizeIndex(ep, s, req.BlockTokens)
	f := paFlight{ep: ep.ID, s: s}
	if unknownCapacity(ep) {
		f.predicted, f.runs = pa.index.MatchRuns(s.slot, req.Blocks, nil) // the probe reads the stamps
	} else {
		f.predicted = pa.index.Holds(s.slot, req.Blocks)
	}
	f.work = pa.work(req, cachedTokens(req, f.predicted))
	now := pa.clock.Now().UnixNano()
	fleet := pa.fleet.get()
	speed := pa.speedOf(s, fleet, now)
	s.settle(now, speed)
	f.ahead = int64(pa.queued(s, now, fleet)) + f.work
	if pa.affTau > 0 && req.PromptTokens > 0 {
		s.affinity.add(float64(cachedTokens(req, f.predicted))/float64(req.PromptTokens), now, pa.affTau)
	}
	pa.replicas.routed(s, req, f.work, now)
	pa.probe(req, ep, s, &f, now)
	// FirstToken: the answers that come whole ahead of it had theirs before (settleAhead);
	// what waits on ep after this one was routed while it prefilled.
	s.mu.Lock()
	s.settleAhead(nil, now, speed)
	s.firstOf(&f, req.Whole)
	s.mu.Unlock()
	f.probe.sawQueue(s)
	pa.learnTTFT(s, ep, f.ahead, f.work, ttft, now)
	// Done.
	pa.learnCapacity(req, ep, &f, res)
	pa.index.InsertTwice(s.slot, req.Blocks, now)
	return true
}
