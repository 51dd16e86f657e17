// Package loadgen is the live client side of `kvroute bench`: it sends a workload to any
// OpenAI-compatible endpoint on a schedule (trace time, Poisson arrivals already laid out by the
// caller, or a closed loop of N workers), streams every response, and records per request the
// scheduled and actual send times, time to first token, inter-token latencies, end-to-end time,
// token counts from usage, and an error class.
//
// Pacing is one scheduler goroutine working from absolute deadlines, so that lateness never
// accumulates; the number of requests in flight is capped so that an overloaded target cannot
// make the generator spawn goroutines without bound.
package loadgen
