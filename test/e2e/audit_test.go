package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/simserver"
)

// TestSilentZeroHits (#16): one of two engines silently stops finding anything cached (prefix
// caching off, or cache keys unlike the router's: the no_prefix_cache fault). The router's
// cache audit must notice within 30 s (kvroute_endpoint_cache_blind 1), stop predicting hits
// there (the policy routes to it on load alone), and, once the engine finds its prefixes
// again, see again: cache_blind back to 0 and the engine's reported cached tokens back in line
// with the router's predictions.
func TestSilentZeroHits(t *testing.T) {
	fleet := startFaultFleet(t, 2)
	r, api, admin := startRouter(t, faultConfig(t, fleet.URLs(), "prefix-aware", 10*time.Second))
	waitChecked(t, r)
	bad, badURL := fleet.Instances()[0], fleet.URLs()[0]
	client := faultClient(t)
	// Eight conversations, each a long shared system prompt and a new question per request.
	systems := make([]string, 8)
	for g := range systems {
		systems[g] = strings.Repeat(fmt.Sprintf("system prompt of group %d, with its rules and examples. ", g), 40)
	}
	sent := 0
	send := func() {
		t.Helper()
		g := sent % len(systems)
		sent++
		if o := chatStream(client, api, systems[g]+fmt.Sprintf(" question %d", sent)); !o.ok() {
			t.Fatalf("request %d: status %d, done %v, err %v", sent, o.status, o.done, o.err)
		}
	}
	blindOf := func() float64 {
		return sumMetric(metricsText(t, admin), "kvroute_endpoint_cache_blind", `endpoint="`+badURL+`"`)
	}
	// until sends requests until cond holds, at most 2,000 requests or limit; it returns how
	// long that took.
	until := func(what string, limit time.Duration, cond func() bool) time.Duration {
		t.Helper()
		t0 := time.Now()
		for i := 0; !cond(); i++ {
			if i >= 2000 || time.Since(t0) > limit {
				t.Fatalf("%s: not after %d requests in %v", what, i, time.Since(t0).Round(time.Millisecond))
			}
			send()
		}
		return time.Since(t0)
	}

	for range 48 {
		send()
	}
	if b := blindOf(); b != 0 {
		t.Fatalf("cache_blind %v on a healthy engine, want 0", b)
	}
	if err := bad.SetFaults(simserver.Faults{NoPrefixCache: true}); err != nil {
		t.Fatal(err)
	}
	before := sent
	took := until("the audit noticing the engine that finds nothing cached", 30*time.Second, func() bool { return blindOf() == 1 })
	t.Logf("cache_blind after %d requests, %v", sent-before, took.Round(time.Millisecond))
	m := metricsText(t, admin)
	if n := sumMetric(m, "kvroute_endpoint_cache_blind_total", `endpoint="`+badURL+`"`); n != 1 {
		t.Errorf("kvroute_endpoint_cache_blind_total %v, want 1", n)
	}
	// While it is blind, no hit is predicted there: the predicted-cached counter stands still.
	predicted := func() float64 {
		return sumMetric(metricsText(t, admin), "kvroute_endpoint_predicted_cached_tokens_total", `endpoint="`+badURL+`"`)
	}
	p0 := predicted()
	for range 24 {
		send()
	}
	if p := predicted(); p != p0 {
		t.Errorf("predicted cached tokens on the blind endpoint grew from %v to %v, want no prediction while blind", p0, p)
	}

	if err := bad.SetFaults(simserver.Faults{}); err != nil {
		t.Fatal(err)
	}
	before = sent
	// The issue bounds the noticing at 30 s; seeing again has no time target, and on a loaded
	// machine with -race it has taken 176 requests (26 when idle), so it gets a wider bound.
	took = until("the audit seeing the engine again", 2*time.Minute, func() bool { return blindOf() == 0 })
	t.Logf("seeing again after %d requests, %v", sent-before, took.Round(time.Millisecond))
	// The prediction has recovered: over the next requests, what the engine reports it found
	// is most of what the router predicted there (and predictions are made again).
	p1, h1 := predicted(), sumMetric(metricsText(t, badURL), "vllm:prefix_cache_hits_total", "")
	for range 48 {
		send()
	}
	// The engine's own count of the prompt tokens it found cached (same token estimate).
	pred, found := predicted()-p1, sumMetric(metricsText(t, badURL), "vllm:prefix_cache_hits_total", "")-h1
	t.Logf("after recovery, on the engine that was blind: %v tokens predicted cached, %v found by the engine", pred, found)
	if pred <= 0 || found < pred/2 {
		t.Errorf("after recovery: %v tokens predicted cached, %v found; want predictions again, at least half of them found", pred, found)
	}
}
