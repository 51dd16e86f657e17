// Package des simulates a fleet in virtual time: N engine models, one routing policy and a
// workload, driven by a discrete-event loop, producing one report.Record per request.
//
// The policy sees only what a live router would see: the load counters the router keeps on each
// endpoint.Endpoint (maintained here exactly as the proxy maintains them), what its Observer
// methods are told, and engine metrics as snapshots taken every scrape interval, with their age.
// It never sees an engine's queue or cache contents directly.
//
// Nothing here sleeps or starts goroutines: a run is a pure function of its inputs, so the same
// workload, policy and seed give the same records bit for bit.
package des
