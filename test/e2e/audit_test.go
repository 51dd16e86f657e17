package e2e

import (
	"fmt"
	"strings"
	"sync"
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
//
// The client sends its requests in rounds of 4 at once, so that load tells the two engines
// apart at every round. One request at a time, how many reached the engine depended on timing
// (whether the router had closed the previous request, what the last scrape said): half when
// idle, but on a loaded machine once not enough for the audit to see it again in 1275 requests
// and 2 minutes; with a 20 ms pause put after each request, 16 of 202 reached it and the audit
// did not notice it within 20 s. The blind engine's probe (724c53d) covers the seeing again,
// but not the 48 requests after it: one at a time, under load, none of them reached the
// engine once in 6 runs ("0 tokens predicted cached, 0 found"). In rounds of 4, with the
// 20 ms pause, 12 to 14 of 32 to 36 reached it and it was seen again within 1.3 s.
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
	// send sends one round: a request of each of `round` conversations at once.
	const round = 4
	sent := 0
	send := func() {
		t.Helper()
		failed := make(chan string, round)
		var wg sync.WaitGroup
		for range round {
			g := sent % len(systems)
			sent++
			n := sent
			wg.Go(func() {
				if o := chatStream(client, api, systems[g]+fmt.Sprintf(" question %d", n)); !o.ok() {
					failed <- fmt.Sprintf("request %d: status %d, done %v, err %v", n, o.status, o.done, o.err)
				}
			})
		}
		wg.Wait()
		close(failed)
		for f := range failed {
			t.Fatal(f)
		}
	}
	blindOf := func() float64 {
		return sumMetric(metricsText(t, admin), "kvroute_endpoint_cache_blind", `endpoint="`+badURL+`"`)
	}
	// answeredByBad is how many requests the engine made blind answered.
	answeredByBad := func() float64 {
		return sumMetric(metricsText(t, admin), "kvroute_requests_total", `endpoint="`+badURL+`"`)
	}
	// until sends rounds until cond holds, at most 2,000 requests or limit; it returns how
	// long that took.
	until := func(what string, limit time.Duration, cond func() bool) time.Duration {
		t.Helper()
		t0, sent0, bad0 := time.Now(), sent, answeredByBad()
		for !cond() {
			if sent-sent0 >= 2000 || time.Since(t0) > limit {
				t.Fatalf("%s: not after %d requests (%v of them to that engine) in %v", what, sent-sent0, answeredByBad()-bad0, time.Since(t0).Round(time.Millisecond))
			}
			send()
		}
		t.Logf("%s: %v of %d requests to that engine", what, answeredByBad()-bad0, sent-sent0)
		return time.Since(t0)
	}

	for range 48 / round {
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
	for range 24 / round {
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
	// Under load the next requests may all go elsewhere (the load bound), so up to five
	// rounds of 48 are sent until one of them is predicted to hit there.
	p1, h1 := predicted(), sumMetric(metricsText(t, badURL), "vllm:prefix_cache_hits_total", "")
	var pred, found float64
	for tries := 0; tries < 5 && pred <= 0; tries++ {
		for range 48 / round {
			send()
		}
		// The engine's own count of the prompt tokens it found cached (same token estimate).
		pred, found = predicted()-p1, sumMetric(metricsText(t, badURL), "vllm:prefix_cache_hits_total", "")-h1
	}
	t.Logf("after recovery, on the engine that was blind: %v tokens predicted cached, %v found by the engine", pred, found)
	if pred <= 0 || found < pred/2 {
		t.Errorf("after recovery: %v tokens predicted cached, %v found; want predictions again, at least half of them found", pred, found)
	}
}
