// Package des simulates a fleet in virtual time: N engine models, one routing policy (or one
// per router replica) and a workload, driven by a discrete-event loop, producing one
// report.Record per request.
//
// The policy sees only what a live router would see: the load counters the router keeps on each
// endpoint.Endpoint (maintained here exactly as the proxy maintains them), what its Observer
// methods are told, and engine metrics as snapshots taken every scrape interval, with their age.
// It never sees an engine's queue or cache contents directly.
//
// Config.Routers models router replicas behind a load balancer: each replica has its own
// policy instance and its own endpoint.Endpoint objects, and hears only of the requests it
// routed; only the scraped snapshots, which come from the engines, are common to all.
//
// Nothing here sleeps or starts goroutines: a run is a pure function of its inputs, so the same
// workload, policy and seed give the same records bit for bit.
package des
