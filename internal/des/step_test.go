package des

import (
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/policy"
	"github.com/kvroute/kvroute/internal/workload"
)

// stepRecorder ranks the candidates as given and records the step budget each one is
// configured with.
type stepRecorder struct {
	mu    sync.Mutex
	steps map[int]int
}

func (p *stepRecorder) Pick(_ *policy.Request, c []*endpoint.Endpoint) ([]*endpoint.Endpoint, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, e := range c {
		p.steps[e.ID] = e.StepTokens
	}
	return c, nil
}

// Each simulated endpoint is configured with its own engine's step budget (its profile's
// MaxBatchedTokens, or the engine config's override): a mixed fleet is stepped by each
// engine's own. An engine that does not say leaves it unset (the policy's step_tokens).
func TestRun_EndpointStepTokensFromEngine(t *testing.T) {
	small := smallProfile() // 64 tokens a step
	big := small
	big.Name, big.MaxBatchedTokens = "big", 256
	cfg := ProfileFleet(small, 4)
	cfg.NewEngine = func(i int) (Engine, error) {
		switch i {
		case 0:
			return engine.New(engine.Config{Profile: small})
		case 1:
			return engine.New(engine.Config{Profile: big})
		case 2:
			return engine.New(engine.Config{Profile: small, MaxBatchedTokens: 16})
		}
		return newToy(small.BlockSize, small.KVTokens()), nil
	}
	rec := &stepRecorder{steps: map[int]int{}}
	reqs := []workload.Request{req(0, 0, 20, 2, 1, 2, 3, 4, 5)}
	run(t, cfg, reqs, func(policy.Env) (policy.Picker, error) { return rec, nil })
	if diff := cmp.Diff(map[int]int{0: 64, 1: 256, 2: 16, 3: 0}, rec.steps); diff != "" {
		t.Errorf("endpoints' step_tokens (-want +got):\n%s", diff)
	}
}
