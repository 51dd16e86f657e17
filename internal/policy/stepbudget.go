package policy

import (
	"math"

	"github.com/kvroute/kvroute/internal/endpoint"
)

// StepBudgeter is implemented by policies that follow each endpoint's chunked-prefill steps
// (prefix-aware): StepTokens is the step budget in force for ep, in the engine's tokens, and
// where it comes from: endpoint.StepConfigured, endpoint.StepReported,
// endpoint.StepEngineDefault or StepPolicy.
// tokens is 0 when the policy's step term is off.
type StepBudgeter interface {
	StepTokens(ep *endpoint.Endpoint) (tokens int, source string)
}

// StepPolicy is StepBudgeter's source for the policy's own step_tokens.
const StepPolicy = "policy"

// StepTokens returns ep's step budget in the engine's tokens and its source (StepBudgeter).
func (pa *prefixAware) StepTokens(ep *endpoint.Endpoint) (int, string) {
	if pa.stepTokens <= 0 {
		return 0, StepPolicy
	}
	if n, src := ep.StepBudget(); n > 0 {
		return n, src
	}
	return int(pa.stepTokens), StepPolicy
}

// stepOf is ep's step budget in the router's tokens, the units of its queue (paState.step):
// its own (configured, reported by the engine, or its engine kind's default) over its token
// scale, which it learns while running (an ollama tokenizer makes 0.677 of its tokens of one of
// the router's), else the policy's step_tokens as it is given. The policy's 0 turns the term
// off for every endpoint.
func (pa *prefixAware) stepOf(ep *endpoint.Endpoint) int64 {
	if pa.stepTokens <= 0 {
		return 0
	}
	if n, _ := ep.StepBudget(); n > 0 {
		return max(int64(math.Round(float64(n)/ep.TokenScale())), 1)
	}
	return pa.stepTokens
}
