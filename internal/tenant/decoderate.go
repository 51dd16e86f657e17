package tenant

import (
	"math"
	"sync"
	"time"
)

// DecodeRates learns how fast each endpoint's engine generates a sequence, in tokens per second,
// from its complete answers: the completion tokens each sequence got over the time from the
// pick to the answer's end. That time includes the queue and the prefill, so the rate is below
// the engine's decode speed, by as much as the estimate it serves counts them in its own time.
// The proxy uses it to charge a non-streamed request whose answer never came (what its engine
// generated meanwhile); nothing else the router keeps says it: the policies predict time to
// first token, the scraped counters sum prompt and generated tokens over the whole engine.
// Recent answers weigh most (decodeWeight); the endpoint's rate is used once it has
// MinDecodeSamples answers, else the fleet's, else DefaultDecodeRate.
//
// A Gate holds one (Gate.DecodeRates), as it holds the tenants' limits: the proxy's handler is
// built again at each config reload, the gate is not, so what was learnt outlives a reload.
// Safe for concurrent use; the zero value is ready.
type DecodeRates struct {
	mu    sync.Mutex
	byEP  map[string]*decodeSum // by endpoint name, at most maxDecodeEndpoints
	fleet decodeSum
}

// decodeSum is one endpoint's (or the fleet's) decayed sums of tokens and seconds.
type decodeSum struct {
	tokens, seconds float64
	n               int // answers learnt from, up to MinDecodeSamples
}

const (
	// decodeWeight is the weight of one answer in a rate: about the last 20 count.
	decodeWeight = 0.05
	// MinDecodeSamples is how many answers make an endpoint's rate (or the fleet's) trusted.
	MinDecodeSamples = 3
	// minDecodeTokens is the fewest tokens a sequence must have generated for its answer to be
	// learnt from: a short answer's time is mostly its prefill and queue, which says little of
	// the decode speed a long answer, the one worth estimating, runs at.
	minDecodeTokens = 16
	// DefaultDecodeRate is the rate, tokens per second and sequence, before any answer was
	// learnt from: the low end of what engines serve a sequence in a busy batch (tens of tokens
	// a second for a 70B model, over a hundred for an 8B one), so that an estimate made cold
	// charges less rather than more than was generated.
	DefaultDecodeRate = 20.0
	// MaxDecodeRate bounds what a rate may be, tokens per second and sequence: about three
	// times the fastest any server sells a sequence today (2,000 to 3,000 tokens a second on
	// wafer-scale chips; a GPU's batch gives each of its sequences tens to hundreds). An
	// answer said to be faster is an engine's miscount (a usage of 9e18 completion tokens in
	// 3 s taught 3e18 a second, and the charge of the next request cut short overflowed):
	// learnt as this, it charges less rather than more than an engine could have generated.
	MaxDecodeRate = 1e4
	// MinDecodeRate is the least a rate may be: an answer slower than a token a second spent
	// its time queued or stalled, or was timed across a jump of the clock; taken as it is, it
	// would charge a request cut short next to nothing for the time an engine had it.
	MinDecodeRate = 1.0
	// maxDecodeEndpoints bounds the endpoints known: past it (endpoints discovered and gone by
	// the thousand) the table starts again.
	maxDecodeEndpoints = 4096
)

// Learn folds one answer into ep's rate and the fleet's: tokens generated per sequence in d.
// An answer faster than MaxDecodeRate counts as that fast.
func (r *DecodeRates) Learn(ep string, tokens float64, d time.Duration) {
	if !(tokens >= minDecodeTokens) || d <= 0 || math.IsInf(tokens, 0) {
		return
	}
	secs := d.Seconds()
	tokens = min(tokens, secs*MaxDecodeRate)
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.byEP[ep]
	if s == nil {
		if r.byEP == nil || len(r.byEP) >= maxDecodeEndpoints {
			r.byEP = map[string]*decodeSum{}
		}
		s = &decodeSum{}
		r.byEP[ep] = s
	}
	s.add(tokens, secs)
	r.fleet.add(tokens, secs)
}

func (s *decodeSum) add(tokens, secs float64) {
	if s.n == 0 {
		s.tokens, s.seconds = tokens, secs
	} else {
		s.tokens = s.tokens*(1-decodeWeight) + tokens*decodeWeight
		s.seconds = s.seconds*(1-decodeWeight) + secs*decodeWeight
	}
	s.n = min(s.n+1, MinDecodeSamples)
}

// Rate returns the decode rate of ep, in tokens per second and sequence, and where it comes
// from: "endpoint", "fleet" or "default". It is within [MinDecodeRate, MaxDecodeRate].
func (r *DecodeRates) Rate(ep string) (float64, string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if s := r.byEP[ep]; s != nil && s.n >= MinDecodeSamples {
		return s.rate(), "endpoint"
	}
	if r.fleet.n >= MinDecodeSamples {
		return r.fleet.rate(), "fleet"
	}
	return DefaultDecodeRate, "default"
}

// rate is the sum's tokens per second, within [MinDecodeRate, MaxDecodeRate].
func (s *decodeSum) rate() float64 {
	v := s.tokens / s.seconds
	if math.IsNaN(v) {
		return MinDecodeRate
	}
	return min(max(v, MinDecodeRate), MaxDecodeRate)
}

// Keep forgets the rates of the endpoints that names does not list (those a reload or a
// discovery removed), keeping the others' and the fleet's: an endpoint added back later under
// the same name may be another engine, to be learnt again.
func (r *DecodeRates) Keep(names []string) {
	keep := make(map[string]bool, len(names))
	for _, n := range names {
		keep[n] = true
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for ep := range r.byEP {
		if !keep[ep] {
			delete(r.byEP, ep)
		}
	}
}
