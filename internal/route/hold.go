package route

import (
	"time"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/policy"
)

// Hold is how long a replica waits before it picks for req (policy.Deferrer): as one of
// several router replicas that hear of each other a sync delay late, the policy may place a
// large request once it has heard what the peers placed at the same moment (docs/policy.md,
// "Router replicas that hear of each other late"); with one router, prefix-aware may hold a
// request until the last step of the queue it would join has started (docs/policy.md,
// `shared`). 0 for a policy that holds nothing, for a request pinned to an earlier response (pin, previous_response_id: it goes
// where that response is, whatever the peers did) and when no candidate is admitted. The
// caller waits (until its context ends) and then calls Begin, which picks among the
// candidates as they are then; the wait counts in the request's time to first token, as it
// does in the simulator, which asks the policy the same.
func (lc *Lifecycle) Hold(req *policy.Request, candidates []*endpoint.Endpoint, pin string) time.Duration {
	if lc.deferrer == nil || pin != "" {
		return 0
	}
	lc.share.tellReplicas(lc)
	candidates = lc.admitted(candidates, lc.clock.Now())
	if len(candidates) == 0 {
		return 0
	}
	return lc.deferrer.Defer(req, candidates)
}
