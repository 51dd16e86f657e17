// Package route is the one request lifecycle of kvroute: what happens to a request from its
// parsed body to its end, the same in the live router (internal/proxy, over HTTP) and in the
// fleet simulator (internal/des, in virtual time).
//
//	keys := route.Keys{BlockTokens: 16, Normalizer: n}
//	keys.FromOpenAI(&c.Req, parsed, salt)     // or keys.FromContent in the simulator
//	c, err := lc.Begin(req, candidates, pin)  // pick: a ranked list
//	for ep := c.Next(); ep != nil; ep = c.Next() {
//		// send to ep; on a failure before anything reached the client:
//		if !c.Fail(route.FailConnect) { break }
//	}
//	c.FirstToken()                            // when the first token arrives
//	c.Finish(route.Outcome{OK: true, CachedTokens: n, ...})
//
// A Call counts the request on its endpoint (in flight, pending prefill), tells the policy
// (policy.Observer: Routed, FirstToken, Done), asks it for a cache prediction per attempt
// (policy.Predictor), falls back along the ranked list where a failure makes that safe, tells
// passive health checking (Health) how each attempt went, and remembers which endpoint created
// which response (previous_response_id affinity). The transport is whoever drives the Call:
// the proxy's HTTP round trip or the simulator's engine submission; the clock is injected.
//
// It imports neither net/http nor Prometheus.
package route
