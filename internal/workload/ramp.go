package workload

import (
	"math"
	"time"
)

// Ramp returns a copy of reqs re-timed so that the arrival rate changes linearly over the run,
// from `from` times the workload's mean rate at the first arrival to `to` times it at the last,
// the requests keeping their order: a workload whose traffic grows (or falls) for autoscaling
// experiments. The span becomes 2 / (from + to) times as long, so that the mean rate stays.
// The copy shares the Blocks slices with reqs. from and to must be finite and above 0; equal
// ones change nothing.
func Ramp(reqs []Request, from, to float64) []Request {
	out := append([]Request(nil), reqs...)
	if len(out) == 0 || !(from > 0) || !(to > 0) || math.IsInf(from, 0) || math.IsInf(to, 0) || from == to {
		return out
	}
	lo := out[0].Arrival
	for i := range out {
		lo = min(lo, out[i].Arrival)
	}
	var span time.Duration
	for i := range out {
		span = max(span, out[i].Arrival-lo)
	}
	if span <= 0 {
		return out
	}
	// Old time t runs m(u) times as fast as new time u, m rising linearly from `from` to `to`
	// over the new span T: t(u) = from*u + (to-from)*u^2/(2T), with t(T) = span. Solving for u
	// gives each arrival's new time.
	s := span.Seconds()
	T := 2 * s / (from + to)
	k := (to - from) / (2 * T)
	for i := range out {
		t := (out[i].Arrival - lo).Seconds()
		u := 2 * t / (from + math.Sqrt(from*from+4*k*t)) // the root of k u^2 + from u - t, stable
		out[i].Arrival = lo + time.Duration(math.Round(u*float64(time.Second)))
	}
	return out
}
