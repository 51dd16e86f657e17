package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/internal/endpoint"
)

var descLearnedKV = prometheus.NewDesc("kvroute_endpoint_learned_kv_capacity_tokens",
	"The KV-cache capacity, in the engine's tokens, that the router learned from the endpoint's hits and misses because none is configured (kv_tokens) or scraped; the endpoint's index is sized by it. Absent while none is learned.",
	[]string{"endpoint"}, nil)

// WatchLearnedCapacity sets the function that gives an endpoint's learned KV capacity in the
// engine's tokens (0: none learned), read at scrape time for
// kvroute_endpoint_learned_kv_capacity_tokens.
func (m *Metrics) WatchLearnedCapacity(f func(*endpoint.Endpoint) int) { m.learnedKV.Store(&f) }
