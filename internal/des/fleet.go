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
