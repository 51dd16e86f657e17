package app

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/internal/tenant"
)

// TestTenantLimitsAcrossReplicas: two syncing routers behind an even balancer (requests sent
// to each in turn) hold a tenant of requests_per_minute 10 to 10 between them, each refusing
// beyond its half (peers.tenant_limits fleet, the default); with tenant_limits replica each
// admits the whole 10, 20 in all (the behaviour before fleet shares). Once a replica stops,
// the other's share grows back to the whole limit.
func TestTenantLimitsAcrossReplicas(t *testing.T) {
	t.Setenv("KVROUTE_TEST_PEERS", peerSecret)
	t.Setenv("KVROUTE_TEST_SALT", strings.Repeat("s", 40))
	const rpm, sent = 10, 20
	eng := newFakeEngine(t)
	mk := func(name, seed, mode string) *Router {
		static := ""
		if seed != "" {
			static = fmt.Sprintf(", static: [%q]", seed)
		}
		return routerFromYAML(t, fmt.Sprintf("scrape: {disabled: true}\nhealth: {interval: 1h}\n"+
			"endpoints: [{url: %q, models: [m], engine: vllm}]\n"+
			"auth: {mode: api_key, secret_env: KVROUTE_TEST_SALT}\n"+
			"tenants: [{name: acme, api_keys: [%q], limits: {requests_per_minute: %d}}]\n"+
			"peers: {name: %s, listen: '127.0.0.1:0', gossip_listen: '127.0.0.1:0', secret_env: KVROUTE_TEST_PEERS, warm_start_timeout: 5s, batch_interval: 1ms, tenant_limits: %s%s}\n",
			eng.srv.URL, tenant.HashKey("sk-acme"), rpm, name, mode, static))
	}
	// send sends n requests to the routers in turn and counts each one's answers by status.
	send := func(rs []*Router, n int) []map[int]int {
		counts := make([]map[int]int, len(rs))
		for i := range counts {
			counts[i] = map[int]int{}
		}
		for i := range n {
			req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(chatBody))
			req.Header.Set("Authorization", "Bearer sk-acme")
			rec := httptest.NewRecorder()
			rs[i%len(rs)].Handler().ServeHTTP(rec, req)
			counts[i%len(rs)][rec.Code]++
		}
		return counts
	}
	for _, tc := range []struct {
		mode      string
		replicas  int // the divisor each gate holds once the two know each other
		perRouter int
	}{
		{"replica", 1, rpm},
		{"fleet", 2, rpm / 2},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			a := mk("a", "", tc.mode)
			ctxA, stopA := context.WithCancel(context.Background())
			doneA := make(chan error, 1)
			go func() { doneA <- a.Run(ctxA) }()
			t.Cleanup(func() {
				stopA()
				if err := <-doneA; err != nil {
					t.Errorf("a's Run: %v", err)
				}
			})
			waitUntil(t, "a's gossip address", func() bool { return a.peers.node.GossipAddr() != "" })
			b := mk("b", a.peers.node.GossipAddr(), tc.mode)
			runRouter(t, b)
			for _, r := range []*Router{a, b} {
				waitUntil(t, "each replica knowing the other", func() bool {
					return testutil.ToFloat64(r.peers.node.Metrics().Members) == 1 && r.Gate().Replicas() == tc.replicas
				})
			}
			counts := send([]*Router{a, b}, sent)
			t.Logf("tenant_limits %s: %d requests, %d a minute, alternately to two replicas: a %v, b %v (status: count)",
				tc.mode, sent, rpm, counts[0], counts[1])
			// A request comes back to a bucket every 60/share s: at most one more within the
			// run, on a machine slow enough to take that long.
			for i, c := range counts {
				if ok := c[http.StatusOK]; ok < tc.perRouter || ok > tc.perRouter+1 || ok+c[http.StatusTooManyRequests] != sent/2 {
					t.Errorf("router %d answered %v; want %d (or one more) 200 and the rest 429", i, c, tc.perRouter)
				}
			}
			if tc.mode != "fleet" {
				return
			}
			// a leaves: b alone enforces the whole limit again (its bucket keeps its level:
			// empty, it stays empty, at the whole limit's pace).
			stopA()
			if err := <-doneA; err != nil {
				t.Errorf("a's Run: %v", err)
			}
			doneA <- nil // for the cleanup
			waitUntil(t, "b's share growing back to the whole limit", func() bool { return b.Gate().Replicas() == 1 })
			req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(chatBody))
			req.Header.Set("Authorization", "Bearer sk-acme")
			rec := httptest.NewRecorder()
			b.Handler().ServeHTTP(rec, req)
			if got := rec.Header().Get("x-ratelimit-limit-requests"); got != fmt.Sprint(rpm) {
				t.Errorf("b alone: x-ratelimit-limit-requests %q, want %d", got, rpm)
			}
		})
	}
}
