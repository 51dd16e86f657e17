package policy

import (
	"time"

	"github.com/kvroute/kvroute/internal/endpoint"
)

// CacheValuer is implemented by policies that keep a picture of each endpoint's cache, for
// cache-aware scale-in: a controller removes the endpoint whose cache is worth least first
// (kvroute_endpoint_cache_value_tokens, and the pod-deletion-cost writer).
type CacheValuer interface {
	// CacheValue returns the blocks of prefix that ep holds and no other endpoint does, each
	// weighted by how recently a request used it (1 for now, 1/e for CacheValueWindow ago):
	// what losing ep would cost, in blocks that the next requests for them would recompute.
	CacheValue(ep *endpoint.Endpoint) float64
}

// CacheValueWindow is the time over which a block's worth decays by e in CacheValue: a
// conversation idle for five minutes is probably over, one idle for half an hour almost
// certainly.
const CacheValueWindow = 5 * time.Minute
