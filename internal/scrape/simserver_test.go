package scrape

import (
	"context"
	"net/http/httptest"
	"testing"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/simserver"
)

// TestProber_AgainstSimulator health-checks and scrapes the vLLM-compatible simulator, so that
// the parser and the simulator agree on names (kvroute demo depends on it).
func TestProber_AgainstSimulator(t *testing.T) {
	in, err := simserver.New(simserver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	srv := httptest.NewServer(in.Handler())
	defer srv.Close()

	pool, ep := onePool(t, endpoint.Spec{Name: srv.URL, Engine: "vllm", MetricsPath: "/metrics"})
	pr := New(pool, srv.Client(), Options{}, nil)
	if err := pr.Check(context.Background(), ep); err != nil {
		t.Fatalf("health check: %v", err)
	}
	if err := pr.Scrape(context.Background(), ep); err != nil {
		t.Fatalf("scrape: %v", err)
	}
	cfg := in.Config()
	if cfg.BlockSize == 0 || cfg.NumBlocks == 0 {
		t.Fatalf("simulator config %+v has no capacity to compare", cfg)
	}
	s := ep.Snapshot()
	if s.BlockSize != cfg.BlockSize || s.NumGPUBlocks != cfg.NumBlocks {
		t.Errorf("capacity = %d x %d, want the simulator's %d x %d", s.BlockSize, s.NumGPUBlocks, cfg.BlockSize, cfg.NumBlocks)
	}
	if s.Running != 0 || s.Waiting != 0 || s.KVUsage != 0 {
		t.Errorf("an idle simulator reports load: %+v", s)
	}
	// vLLM reports no step budget, and neither does the simulator that speaks as it.
	if n, src := ep.StepBudget(); n != 0 || src != "" || pr.Status(ep).StepReport != "" {
		t.Errorf("StepBudget = %d, %q (report %q); a vLLM reports none", n, src, pr.Status(ep).StepReport)
	}
}
