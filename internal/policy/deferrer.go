package policy

import (
	"time"

	"github.com/kvroute/kvroute/internal/endpoint"
)

// Deferrer is implemented by policies that, as one of several router replicas, would pick for
// some requests a little later than they arrive: once the sync delay has passed, what the
// peers placed at the same moment is known (docs/policy.md, "Router replicas that hear of each
// other late"). The router asks before it picks and, told to wait, picks after that long
// among the candidates it has then; the wait counts in the request's time to first token.
// The simulator asks (internal/des), the live proxy through route.Lifecycle.Hold.
type Deferrer interface {
	// Defer returns how long to hold req before picking among candidates; 0: pick now.
	Defer(req *Request, candidates []*endpoint.Endpoint) time.Duration
}
