package app

import (
	"math"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/policy"
)

// learnedKVTokens is the KV capacity, in the engine's tokens, that the current policy learned
// for ep (policy.CapacityLearner), 0 when none is learned or ep's capacity is configured or
// scraped (which the policy then uses instead).
func (r *Router) learnedKVTokens(ep *endpoint.Endpoint) int {
	h := r.h.Load()
	if h == nil || ep.KVTokens() > 0 {
		return 0
	}
	l, ok := h.Lifecycle.Picker().(policy.CapacityLearner)
	if !ok {
		return 0
	}
	return int(math.Round(float64(l.LearnedKVTokens(ep.ID)) * ep.TokenScale()))
}

// stepTokens is the step budget the current policy follows ep's queue by, in the engine's
// tokens, and its source (policy.StepBudgeter); ok is false when the policy follows no steps.
func (r *Router) stepTokens(ep *endpoint.Endpoint) (tokens int, source string, ok bool) {
	h := r.h.Load()
	if h == nil {
		return 0, "", false
	}
	b, ok := h.Lifecycle.Picker().(policy.StepBudgeter)
	if !ok {
		return 0, "", false
	}
	tokens, source = b.StepTokens(ep)
	return tokens, source, true
}
