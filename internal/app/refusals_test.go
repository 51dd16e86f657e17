package app

import (
	"log/slog"
	"strings"
	"testing"
	"time"

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
