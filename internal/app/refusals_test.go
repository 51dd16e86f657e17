package app

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/testlog"
)

// TestRefusalEjectionSaid: an ejection by the refusal rule is logged as one, with the shares
// that decided it (not as "consecutive failures", which it was not), and counted.
func TestRefusalEjectionSaid(t *testing.T) {
	e := newFakeEngine(t)
	var logs testlog.Buffer
	r, err := NewRouter(routerConfig(t, "", e.srv.URL), slog.New(slog.NewJSONHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ep := r.pool.ByName(e.srv.URL)
	oc := r.outlierConfig(r.Config())
	if oc.OnRefusals == nil {
		t.Fatal("the router does not hear of refusal ejections")
	}
	oc.OnRefusals(ep, 30*time.Second, 0.95, 0.02)
	if s := logs.String(); !strings.Contains(s, "refuses far more of its requests") || !strings.Contains(s, `"refused":0.95`) || strings.Contains(s, "consecutive failures") {
		t.Errorf("log:\n%s", s)
	}
}

// TestRefusalRuleConfigured: the health section's refusal keys reach passive health checking.
func TestRefusalRuleConfigured(t *testing.T) {
	e := newFakeEngine(t)
	cfg := routerConfig(t, "", e.srv.URL)
	cfg.Health.RefusalPercent, cfg.Health.RefusalVolume, cfg.Health.RefusalWindow = -1, 50, config.Duration(2*time.Minute)
	r, err := NewRouter(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if oc := r.outlierConfig(cfg); oc.RefusalPercent != -1 || oc.RefusalVolume != 50 || oc.RefusalWindow != 2*time.Minute {
		t.Errorf("outlier config: refusal %d %% of %d over %v, want off, 50, 2m", oc.RefusalPercent, oc.RefusalVolume, oc.RefusalWindow)
	}
}
