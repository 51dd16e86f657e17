// Package experiment runs kvroute's experiments for the verbs that compare policies: a fleet in
// virtual time, one simulation per policy (Simulate); the fewest instances that meet a TTFT SLO,
// by bisection over simulated fleet sizes (Plan); a workload replayed against a live endpoint
// (Bench); and simulated engines behind a real router, one policy after the other (Demo).
//
// Each function takes the options of its verb, checks them, runs and returns what the verb
// prints. The options mirror the verbs' flags one to one, so an error names the flag the user
// typed (--instances, --workload); a problem with the options is a *UsageError, which the
// command answers with exit status 2.
package experiment
