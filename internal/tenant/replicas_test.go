package tenant

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/openai"
)

func TestShare(t *testing.T) {
	for _, tc := range []struct{ limit, n, want int }{
		{60, 1, 60},
		{60, 3, 20},
		{60, 2, 30},
		{40, 3, 14}, // rounded up
		{5, 2, 3},
		{1, 3, 1}, // at least 1
		{2, 8, 1},
		{0, 3, 0}, // unlimited stays unlimited
		{60, 0, 60},
	} {
		if got := share(tc.limit, tc.n); got != tc.want {
			t.Errorf("share(%d, %d) = %d, want %d", tc.limit, tc.n, got, tc.want)
		}
	}
}

// burst takes requests for id until one is refused (at most max), ending each at once, and
// returns how many were admitted and the refusal.
func burst(t *testing.T, g *Gate, id *Identity, max int) (int, *openai.Error) {
	t.Helper()
	for i := range max {
		tk, oe := g.Take(id, Demand{}, http.Header{})
		if oe != nil {
			return i, oe
		}
		tk.End(http.StatusOK, 0, 0)
	}
	return max, nil
}

func authenticate(t *testing.T, g *Gate, key string) *Identity {
	t.Helper()
	id, oe := g.Authenticate(http.Header{"Authorization": {"Bearer " + key}})
	if oe != nil {
		t.Fatal(oe)
	}
	return id
}

// TestSetReplicas: a gate told there are n replicas enforces each limit / n (rounded up): 60
// requests a minute admit a burst of 20 among 3, then 30 among 2, the level of the bucket kept
// as a fraction; a reload applies the share to the new limits; each change is logged once.
func TestSetReplicas(t *testing.T) {
	var logs bytes.Buffer
	g, clk := newTestGate(t, `tenants:
  - {name: a, api_keys: ["`+HashKey("k")+`"], limits: {requests_per_minute: 60}}
  - {name: b, api_keys: ["`+HashKey("kb")+`"], limits: {requests_per_minute: 60}}
`, slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo})))
	id := authenticate(t, g, "k")
	if g.Replicas() != 1 {
		t.Fatalf("a new gate shares among %d replicas, want 1", g.Replicas())
	}
	g.SetReplicas(3)
	g.SetReplicas(3) // told again at each membership check: nothing changes, nothing logged
	n, oe := burst(t, g, id, 100)
	if n != 20 || oe == nil || *oe.Code != "rate_limit_exceeded" {
		t.Fatalf("among 3 replicas: %d admitted, then %v; want 20, then rate_limit_exceeded", n, oe)
	}
	if !strings.Contains(oe.Message, "limit 20 (this replica's share of the tenant's 60 among 3 router replicas)") {
		t.Errorf("refusal %q does not say the share", oe.Message)
	}
	clk.Add(time.Minute) // full again: 20 of 20
	g.SetReplicas(2)
	if n, _ := burst(t, g, id, 100); n != 30 {
		t.Errorf("among 2 replicas: %d admitted, want 30", n)
	}
	// Half refilled (15 of 30), then alone: half of 60.
	clk.Add(30 * time.Second)
	g.SetReplicas(1)
	if n, _ := burst(t, g, id, 100); n != 30 {
		t.Errorf("alone, from half a bucket: %d admitted, want 30", n)
	}
	// A reload keeps the share: 90 a minute among 3 is 30 here.
	g.SetReplicas(3)
	if err := g.Reload(testConfig(t, "tenants: [{name: a, api_keys: [\""+HashKey("k")+"\"], limits: {requests_per_minute: 90}}]\n")); err != nil {
		t.Fatal(err)
	}
	clk.Add(time.Minute)
	h := http.Header{}
	tk, oe := g.Take(authenticate(t, g, "k"), Demand{}, h)
	if oe != nil {
		t.Fatal(oe)
	}
	tk.End(http.StatusOK, 0, 0)
	if got := h.Get("x-ratelimit-limit-requests"); got != "30" {
		t.Errorf("after a reload to 90 among 3: x-ratelimit-limit-requests %q, want 30", got)
	}
	// Four changes (3, 2, 1, 3), one line each whatever the number of tenants.
	if got := strings.Count(logs.String(), "this replica enforces its share"); got != 4 {
		t.Errorf("%d share lines, want 4:\n%s", got, logs.String())
	}
	if !strings.Contains(logs.String(), "replicas=3 was=1") {
		t.Errorf("the first change is not logged with its replica counts:\n%s", logs.String())
	}
}

// TestSetReplicasConcurrency: max_concurrent is shared as well (5 among 2: 3 here), and the
// bound on the tenant's bodies being received follows it (twice the share: 6, not 10).
func TestSetReplicasConcurrency(t *testing.T) {
	g, _ := newTestGate(t, "tenants: [{name: a, api_keys: [\""+HashKey("k")+"\"], limits: {max_concurrent: 5}}]\n", nil)
	id := authenticate(t, g, "k")
	g.SetReplicas(2)
	var held []*Ticket
	for range 3 {
		tk, oe := g.Take(id, Demand{}, http.Header{})
		if oe != nil {
			t.Fatalf("request %d: %v", len(held)+1, oe)
		}
		held = append(held, tk)
	}
	_, oe := g.Take(id, Demand{}, http.Header{})
	if oe == nil || *oe.Code != "concurrency_limit_exceeded" || !strings.Contains(oe.Message, "the limit is 3 at a time (this replica's share of the tenant's 5 among 2") {
		t.Errorf("a fourth in flight among 2 replicas: %v; want concurrency_limit_exceeded at 3", oe)
	}
	for _, tk := range held {
		tk.End(http.StatusOK, 0, 0)
	}
	ctx := context.Background()
	for i := range 6 {
		if oe := g.TakeBody(ctx, id, 0, http.Header{}); oe != nil {
			t.Fatalf("body %d: %v", i+1, oe)
		}
	}
	// The seventh would wait for a place: a client already gone shows it without waiting.
	gone, cancel := context.WithCancel(ctx)
	cancel()
	if oe := g.TakeBody(gone, id, 0, http.Header{}); oe == nil || oe.Status != 499 {
		t.Errorf("a seventh body among 2 replicas: %v; want it to wait (twice the share of 3)", oe)
	}
}

// TestSetReplicasPromptAgainstWholeLimit: a prompt over this replica's share of
// tokens_per_minute but within the tenant's limit runs (reserving the share), where one over the
// limit is refused as never fitting.
func TestSetReplicasPromptAgainstWholeLimit(t *testing.T) {
	g, _ := newTestGate(t, "tenants: [{name: a, api_keys: [\""+HashKey("k")+"\"], limits: {tokens_per_minute: 1000}}]\n", nil)
	id := authenticate(t, g, "k")
	g.SetReplicas(4) // 250 here
	tk, oe := g.Take(id, Demand{Prompt: 600}, http.Header{})
	if oe != nil {
		t.Fatalf("a prompt of 600 tokens, limit 1000 among 4: %v; want it admitted", oe)
	}
	tk.End(http.StatusOK, 600, 0)
	_, oe = g.Take(id, Demand{Prompt: 1200}, http.Header{})
	if oe == nil || *oe.Code != "request_too_large" || !strings.Contains(oe.Message, "the limit of 1000 tokens per minute") {
		t.Errorf("a prompt of 1200 tokens, limit 1000: %v; want request_too_large naming 1000", oe)
	}
}
