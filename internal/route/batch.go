package route

import (
	"time"

	"github.com/kvroute/kvroute/internal/policy"
)

// ApplyBatch applies a message's events in order, as Apply does one by one, and tells dropped
// (if not nil) why of each it did not apply. The clock is read, and the attempts whose TTL ran
// out are ended, once for the whole batch rather than once per event: a peer's stream applies
// its events batch by batch. It keeps the events' Blocks.
//
// A request whose Routed, FirstToken and Done follow each other in the batch (with a fast
// engine, most of them: the whole request takes less than a batch interval) is replayed as
// one: never in flight here, its endpoint's counters (which would go up and down again) not
// moved, and told to a policy that can take it whole (policy.Completer) in one call, which for
// prefix-aware is one index insert instead of two. It leaves the replica as the three events
// applied one by one would: the same drops, counts and ended attempts, and the same policy
// state as far as the policy can observe it (TestApplyBatchCoalesced).
func (lc *Lifecycle) ApplyBatch(evs []Event, dropped func(Drop)) {
	s := lc.share
	if s == nil {
		for range evs {
			if dropped != nil {
				dropped(DropInvalid)
			}
		}
		return
	}
	now := s.cfg.Clock.Now()
	s.expire(now)
	for i := 0; i < len(evs); i++ {
		if i+2 < len(evs) && s.completed(lc, evs[i:i+3], now) {
			i += 2
			continue
		}
		if d := s.count(s.apply(lc, &evs[i], now)); d != DropNone && dropped != nil {
			dropped(d)
		}
	}
}

// completed replays evs, when they are one attempt's Routed, FirstToken and Done, that
// Apply would each apply (none dropped), as one; it reports whether it did. Otherwise it
// changes nothing.
func (s *Share) completed(lc *Lifecycle, evs []Event, now time.Time) bool {
	r, ft, d := &evs[0], &evs[1], &evs[2]
	if r.Kind != EventRouted || ft.Kind != EventFirstToken || d.Kind != EventDone ||
		ft.Origin != r.Origin || d.Origin != r.Origin || ft.ID != r.ID || d.ID != r.ID {
		return false
	}
	for i := range evs {
		if evs[i].Origin == s.cfg.Self || malformed(&evs[i]) {
			return false
		}
	}
	if unplaceable(r) {
		return false
	}
	ep := s.endpoint(r.Endpoint)
	if ep == nil {
		return false
	}
	key := flightKey{r.Origin, r.ID}
	s.mu.Lock()
	if !s.fresh(key) && (s.flights[key] != nil || s.ended.has(key)) || s.remote >= s.cfg.MaxRemote {
		s.mu.Unlock()
		return false // a duplicate or a full table: Apply says which
	}
	// Ended, as Done leaves it: a replay of any of its events is a duplicate.
	s.ended.add(key)
	s.mark(key)
	s.mu.Unlock()
	s.applied.Add(3)
	s.coalesced.Add(1)
	if d.OK {
		ep.Progressed(now.UnixNano())
	}
	lc.peerOutcome(ep, d)
	lc.peerAudit(ep, d, now)
	obs := lc.observer
	if obs == nil {
		return true
	}
	prompt := r.PromptTokens
	if d.PromptTokens > 0 {
		prompt = d.PromptTokens
	}
	res := policy.Result{OK: d.OK, CachedTokens: remoteCached(d), PromptTokens: prompt,
		OutputTokens: d.OutputTokens, TTFT: d.TTFT, Duration: d.Duration}
	if res.TTFT == 0 {
		res.TTFT = ft.TTFT // as finish gives Done the first token's
	}
	if c, ok := obs.(policy.Completer); ok {
		req := s.request()
		*req = rebuild(r)
		done := c.Completed(req, ep, ft.TTFT, res)
		*req = policy.Request{}
		s.requests.Put(req)
		if done {
			return true
		}
	}
	// The three calls, as Apply makes them, counters included (the policy may read them); the
	// policy may keep the request it was given.
	req := new(policy.Request)
	*req = rebuild(r)
	ep.Start(req.PromptTokens)
	obs.Routed(req, ep)
	ep.FirstToken(req.PromptTokens)
	obs.FirstToken(req, ep, ft.TTFT)
	ep.Finish(req.PromptTokens, true)
	obs.Done(req, ep, res)
	return true
}

// rebuild is the request a remote attempt's Routed describes, as its policy saw it.
func rebuild(r *Event) policy.Request {
	return policy.Request{
		Model: r.Model, Tenant: r.Tenant, SessionKey: r.SessionKey, Blocks: r.Blocks,
		BlockTokens: r.BlockTokens, PromptTokens: r.PromptTokens, MaxTokens: r.MaxTokens, Whole: r.Whole,
		Remote: true,
	}
}

// request returns a policy.Request from the Share's pool, for a policy.Completer (which keeps
// none).
func (s *Share) request() *policy.Request {
	if r, _ := s.requests.Get().(*policy.Request); r != nil {
		return r
	}
	return new(policy.Request)
}
