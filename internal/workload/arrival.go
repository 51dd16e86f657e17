package workload

import (
	"math"
	"math/rand/v2"
	"time"
)

// Speedup returns a copy of reqs with every arrival divided by k (k = 2 replays twice as fast).
// The copy shares the Blocks slices with reqs. A k that is not a finite number above 0 leaves
// the arrivals as they are; an arrival beyond time.Duration's range (a tiny k) saturates at
// its maximum, about 292 years, rather than wrapping round to a negative time.
func Speedup(reqs []Request, k float64) []Request {
	out := append([]Request(nil), reqs...)
	if !(k > 0) || math.IsInf(k, 0) {
		return out
	}
	for i := range out {
		// float64(math.MaxInt64) is 2^63, one past the range: converting it overflows too.
		if at := math.Round(float64(out[i].Arrival) / k); at < float64(math.MaxInt64) {
			out[i].Arrival = time.Duration(at)
		} else {
			out[i].Arrival = math.MaxInt64
		}
	}
	return out
}

// Whole returns a copy of reqs in which a fraction of the requests, drawn from seed, ask for
// their answer whole (Request.Whole): 0 none, 1 all. The copy shares the Blocks slices.
func Whole(reqs []Request, fraction float64, seed uint64) []Request {
	out := append([]Request(nil), reqs...)
	r := rand.New(rand.NewPCG(seed, 0x77686f6c65)) // "whole": a stream of its own
	for i := range out {
		out[i].Whole = r.Float64() < fraction
	}
	return out
}

// Poisson returns a copy of reqs, in the same order, re-timed as a Poisson process of rate
// requests per second: the first arrives at 0 and the gaps are exponential with mean 1/rate,
// drawn from seed. The copy shares the Blocks slices with reqs. Re-timing a multi-turn workload
// this way loses the order of turns within a conversation unless the requests are in arrival
// order. A rate that is not a finite number above 0 makes every arrival 0 (one burst).
func Poisson(reqs []Request, rate float64, seed uint64) []Request {
	out := append([]Request(nil), reqs...)
	if !(rate > 0) || math.IsInf(rate, 0) {
		for i := range out {
			out[i].Arrival = 0
		}
		return out
	}
	rng := rand.New(rand.NewPCG(seed, 0x706f6973736f6e)) // "poisson"
	var at float64                                       // seconds
	for i := range out {
		out[i].Arrival = time.Duration(math.Round(at * float64(time.Second)))
		at += rng.ExpFloat64() / rate
	}
	return out
}
