package route

import (
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/policy"
)

// blindScript is a script that records what the lifecycle tells it of blindness, and predicts
// 64 cached tokens everywhere.
type blindScript struct {
	script
	blind map[string]bool
}

func (b *blindScript) SetCacheBlind(ep *endpoint.Endpoint, blind bool)       { b.blind[ep.Name] = blind }
func (b *blindScript) PredictCached(*policy.Request, *endpoint.Endpoint) int { return 64 }

// TestAuditSilentZeroHits: an endpoint whose engine keeps reporting no cached tokens where the
// policy predicted many goes blind (the policy told, predictions reported as 0), and sees again
// once its reports agree.
func TestAuditSilentZeroHits(t *testing.T) {
	clk := &stepClock{t: time.Unix(100, 0)}
	b := &blindScript{script: script{order: []string{"a"}}, blind: map[string]bool{}}
	var changes []bool
	audit := NewAudit(AuditConfig{OnChange: func(_ *endpoint.Endpoint, blind bool, _, _ float64) { changes = append(changes, blind) }})
	lc, err := New(Config{Picker: b, Clock: clk, Audit: audit})
	if err != nil {
		t.Fatal(err)
	}
	eps := pool(t, "a")
	serve := func(cached int) int {
		c, _ := lc.Begin(&policy.Request{PromptTokens: 100}, eps, "", clk.t)
		c.Next()
		p := c.Predicted()
		c.Finish(Outcome{OK: true, CachedTokens: cached})
		clk.t = clk.t.Add(time.Second)
		return p
	}
	for i := range 9 {
		if serve(0); audit.Blind(eps[0]) {
			t.Fatalf("blind after %d requests: want a verdict only after 10", i+1)
		}
	}
	serve(0)
	if !audit.Blind(eps[0]) || !b.blind["a"] {
		t.Fatalf("10 requests predicted 64 and found 0: blind %v, policy told %v", audit.Blind(eps[0]), b.blind)
	}
	if p := serve(0); p != 0 {
		t.Errorf("prediction on a blind endpoint = %d, want 0", p)
	}
	// The engine finds what was predicted again: back within a few requests.
	n := 0
	for ; audit.Blind(eps[0]) && n < 40; n++ {
		serve(64)
	}
	if audit.Blind(eps[0]) || b.blind["a"] || n > 20 {
		t.Errorf("after %d agreeing requests: blind %v, policy told %v", n, audit.Blind(eps[0]), b.blind)
	}
	if len(changes) != 2 || !changes[0] || changes[1] {
		t.Errorf("changes %v, want blind then not", changes)
	}
	if st := audit.Status(eps[0]); st.Blind || st.FoundShare <= 0.5 {
		t.Errorf("status %+v", st)
	}
	// Unreported cached tokens (-1) teach nothing.
	before := audit.Status(eps[0])
	serve(-1)
	if after := audit.Status(eps[0]); after != before {
		t.Errorf("an unreported count changed the audit: %+v -> %+v", before, after)
	}
}
