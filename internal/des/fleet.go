package des

import (
	"github.com/kvroute/kvroute/internal/engine"
)

// ProfileFleet returns the Config of a fleet of n engines of profile p (engine.New with p's
// sizes), serving a model named after the profile, with the default scrape interval and no
// network latency.
func ProfileFleet(p engine.Profile, n int) Config {
	return Config{
		Instances:        n,
		Model:            p.Name,
		BlockSize:        p.BlockSize,
		KVCapacityTokens: p.KVTokens(),
		NewEngine: func(int) (Engine, error) {
			e, err := engine.New(engine.Config{Profile: p})
			if err != nil {
				return nil, err
			}
			return e, nil
		},
		ScrapeInterval: DefaultScrapeInterval,
	}
}

// stepTokens is the step budget a simulated endpoint is configured with (endpoints[].step_tokens):
// the tokens its engine computes in one step (engine.Config's MaxBatchedTokens, its profile's
// unless overridden), in the engine's tokens as a live endpoint's is, so that each engine of a
// mixed fleet is stepped by its own; 0 (the policy's step_tokens) for an engine that does not say.
func stepTokens(e Engine) int {
	if c, ok := e.(interface{ Config() engine.Config }); ok {
		return max(c.Config().MaxBatchedTokens, 0)
	}
	return 0
}
