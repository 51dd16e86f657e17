package proxy

import (
	"sync"
	"time"
)

// decodeRates learns how fast each endpoint's engine generates a sequence, in tokens per second,
// from its complete answers (call.learnRate): the completion tokens each sequence got over the
// time from the pick to the answer's end. That time includes the queue and the prefill, so the
// rate is below the engine's decode speed, by as much as the estimate it serves (call.generated)
// counts them in its own time. Nothing else the router keeps says it: the policies predict time
// to first token, the scraped counters sum prompt and generated tokens over the whole engine.
// Recent answers weigh most (decodeWeight); the endpoint's rate is used once it has
// minDecodeSamples answers, else the fleet's, else defaultDecodeRate. Safe for concurrent use;
// the zero value is ready.
type decodeRates struct {
	mu    sync.Mutex
	byEP  map[string]*decodeSum // by endpoint name, at most maxDecodeEndpoints
	fleet decodeSum
}

// decodeSum is one endpoint's (or the fleet's) decayed sums of tokens and seconds.
type decodeSum struct {
	tokens, seconds float64
	n               int // answers learnt from, up to minDecodeSamples
}

const (
	// decodeWeight is the weight of one answer in a rate: about the last 20 count.
	decodeWeight = 0.05
	// minDecodeSamples is how many answers make an endpoint's rate (or the fleet's) trusted.
	minDecodeSamples = 3
	// minDecodeTokens is the fewest tokens a sequence must have generated for its answer to be
	// learnt from: a short answer's time is mostly its prefill and queue, which says little of
	// the decode speed a long answer, the one worth estimating, runs at.
	minDecodeTokens = 16
	// defaultDecodeRate is the rate, tokens per second and sequence, before any answer was
	// learnt from: the low end of what engines serve a sequence in a busy batch (tens of tokens
	// a second for a 70B model, over a hundred for an 8B one), so that an estimate made cold
	// charges less rather than more than was generated.
	defaultDecodeRate = 20.0
	// maxDecodeEndpoints bounds the endpoints known: past it (endpoints discovered and gone by
	// the thousand) the table starts again.
	maxDecodeEndpoints = 4096
)

// learn folds one answer into ep's rate and the fleet's: tokens generated per sequence in d.
func (r *decodeRates) learn(ep string, tokens float64, d time.Duration) {
	if tokens < minDecodeTokens || d <= 0 {
		return
	}
	secs := d.Seconds()
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
	s.n = min(s.n+1, minDecodeSamples)
}

// rate returns the decode rate of ep, in tokens per second and sequence, and where it comes
// from: "endpoint", "fleet" or "default".
func (r *decodeRates) rate(ep string) (float64, string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if s := r.byEP[ep]; s != nil && s.n >= minDecodeSamples {
		return s.tokens / s.seconds, "endpoint"
	}
	if r.fleet.n >= minDecodeSamples {
		return r.fleet.tokens / r.fleet.seconds, "fleet"
	}
	return defaultDecodeRate, "default"
}
