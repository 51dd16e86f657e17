package metrics

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/internal/endpoint"
)

// TestAutoscaleExposition: each scrape samples the engines' counters; from the second on, the
// model's demand, load and saturation are exported, and each endpoint's cache value where the
// policy gives one.
func TestAutoscaleExposition(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	a := NewAutoscale(reg, time.Minute)
	if n, err := testutil.GatherAndCount(reg); err != nil || n != 0 {
		t.Fatalf("before Watch: %d series (err %v), want none", n, err)
	}
	v := &endpoint.Endpoint{ID: 0, Name: "http://127.0.0.1:1", Models: []string{"m"}}
	w := &endpoint.Endpoint{ID: 1, Name: "http://127.0.0.1:2", Models: []string{"m"}}
	any := &endpoint.Endpoint{ID: 2, Name: "http://127.0.0.1:3"} // lists no models
	eps := []*endpoint.Endpoint{v, w, any}
	a.Watch(func() []*endpoint.Endpoint { return eps }, func(*endpoint.Endpoint) float64 { return 20000 })
	a.WatchCacheValue(func(e *endpoint.Endpoint) (float64, bool) {
		return float64(1000 * e.ID), e != any // the policy knows nothing of any
	})
	t0 := time.Unix(1000, 0)
	var clock time.Duration
	a.now = func() time.Time { return t0.Add(clock) }
	scrape := func(at time.Duration) {
		clock = at
		// v computes 8,000 tokens/s (and serves 2,000/s from its cache), w 2,000/s with
		// half its KV cache in use; any has its KV cache 30 % in use and no counters.
		v.SetSnapshot(&endpoint.Snapshot{At: t0.Add(at), PrefixQueries: 10000 * at.Seconds(), PrefixHits: 2000 * at.Seconds(), KVUsage: 0.1})
		w.SetSnapshot(&endpoint.Snapshot{At: t0.Add(at), PrefixQueries: 2000 * at.Seconds(), KVUsage: 0.5})
		any.SetSnapshot(&endpoint.Snapshot{At: t0.Add(at), KVUsage: 0.3})
	}
	scrape(0)
	if n, err := testutil.GatherAndCount(reg, "kvroute_model_load"); err != nil || n != 0 {
		t.Errorf("after one scrape: %d load series (err %v), want none (no interval measured yet)", n, err)
	}
	scrape(15 * time.Second)
	// v: prefill 8,000 / 20,000 = 0.4 > KV 0.1; w: KV 0.5 > prefill 0.1. Load 0.9 over 2.
	want := `
# HELP kvroute_endpoint_cache_value_tokens Prompt tokens of prefix the router's index says the endpoint alone holds, each weighted by how recently a request used it (1/e after 5 minutes): what removing it would cost to recompute. Scale-in removes the lowest first (pod-deletion-cost).
# TYPE kvroute_endpoint_cache_value_tokens gauge
kvroute_endpoint_cache_value_tokens{endpoint="http://127.0.0.1:1"} 0
kvroute_endpoint_cache_value_tokens{endpoint="http://127.0.0.1:2"} 1000
# HELP kvroute_model_load Engines' worth of work on the model's engines: the sum over them of the larger of their prefill utilisation (prompt tokens computed per second over their calibrated prefill rate) and their KV-cache usage, averaged over autoscale.window. Scale engines on it: replicas = load / target per engine (docs/kubernetes.md).
# TYPE kvroute_model_load gauge
kvroute_model_load{model="m"} 0.9
kvroute_model_load{model="other"} 0.3
# HELP kvroute_model_prefill_demand_tokens_per_second Prompt tokens the model's engines computed per second (prefix-cache queries less hits, scraped from the engines, so every router's and client's requests count), averaged over autoscale.window.
# TYPE kvroute_model_prefill_demand_tokens_per_second gauge
kvroute_model_prefill_demand_tokens_per_second{model="m"} 10000
# HELP kvroute_model_saturation kvroute_model_load over the model's endpoints available for new requests: the share of the fleet in use (0 to 1).
# TYPE kvroute_model_saturation gauge
kvroute_model_saturation{model="m"} 0.45
kvroute_model_saturation{model="other"} 0.3
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
	// w is drained: the fleet is one engine, which holds the load of both.
	w.SetDraining(true)
	scrape(30 * time.Second)
	if got := seriesOf(t, reg)["kvroute_model_saturation{model=m}"]; got < 0.89 || got > 0.91 {
		t.Errorf("w draining: saturation %g, want 0.9", got)
	}
}

// TestAutoscaleServedModels: endpoints without configured models (`kvroute serve --endpoint
// URL`) export their load under the models their engines list, the labels of
// kvroute_requests_total, so that a KEDA query on kvroute_model_load{model="llama3-70b"} finds
// it; under "other" only until the engines have listed them, and not after. An engine listing
// more models than the labels allow counts the rest under "other", as its requests do.
func TestAutoscaleServedModels(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m := New(reg)
	a := NewAutoscale(reg, time.Minute)
	a.WatchLabels(m.ModelLabel)
	v := &endpoint.Endpoint{ID: 0, Name: "http://127.0.0.1:1"}
	w := &endpoint.Endpoint{ID: 1, Name: "http://127.0.0.1:2"}
	eps := []*endpoint.Endpoint{v, w}
	for _, e := range eps {
		m.EndpointAdded(e.Name, nil)
	}
	a.Watch(func() []*endpoint.Endpoint { return eps }, func(*endpoint.Endpoint) float64 { return 10000 })
	t0 := time.Unix(1000, 0)
	var clock time.Duration
	a.now = func() time.Time { return t0.Add(clock) }
	// Each engine computes 2,000 prompt tokens/s: a prefill utilisation of 0.2.
	scrape := func() map[string]float64 {
		t.Helper()
		clock += 15 * time.Second
		for _, e := range eps {
			e.SetSnapshot(&endpoint.Snapshot{At: t0.Add(clock), PrefixQueries: 2000 * clock.Seconds()})
		}
		out := map[string]float64{}
		for k, x := range seriesOf(t, reg) {
			if strings.HasPrefix(k, "kvroute_model_") {
				out[k] = x
			}
		}
		return out
	}
	scrape()
	want := map[string]float64{
		"kvroute_model_load{model=other}":                             0.4,
		"kvroute_model_saturation{model=other}":                       0.2,
		"kvroute_model_prefill_demand_tokens_per_second{model=other}": 4000,
	}
	if diff := cmp.Diff(want, scrape(), cmpopts.EquateApprox(1e-9, 1e-9)); diff != "" {
		t.Errorf("models not listed yet (-want +got):\n%s", diff)
	}
	for _, e := range eps {
		e.SetServedModels([]string{"llama3-70b"})
		m.EndpointServes(e.Name, e.ServedModels())
	}
	want = map[string]float64{
		"kvroute_model_load{model=llama3-70b}":                             0.4,
		"kvroute_model_saturation{model=llama3-70b}":                       0.2,
		"kvroute_model_prefill_demand_tokens_per_second{model=llama3-70b}": 4000,
	}
	if diff := cmp.Diff(want, scrape(), cmpopts.EquateApprox(1e-9, 1e-9)); diff != "" {
		t.Errorf("engines list llama3-70b (-want +got):\n%s", diff)
	}
	// w restarts serving many models: the first MaxLearntPerEngine have labels, the rest
	// count under "other", once (w is one engine).
	var many []string
	for i := range MaxLearntPerEngine + 4 {
		many = append(many, fmt.Sprintf("z%02d", i))
	}
	w.SetServedModels(many)
	m.EndpointServes(w.Name, w.ServedModels())
	want = map[string]float64{
		"kvroute_model_load{model=llama3-70b}":                             0.2,
		"kvroute_model_saturation{model=llama3-70b}":                       0.2,
		"kvroute_model_prefill_demand_tokens_per_second{model=llama3-70b}": 2000,
		"kvroute_model_load{model=other}":                                  0.2,
		"kvroute_model_saturation{model=other}":                            0.2,
		"kvroute_model_prefill_demand_tokens_per_second{model=other}":      2000,
	}
	for _, model := range many[:MaxLearntPerEngine] {
		want["kvroute_model_load{model="+model+"}"] = 0.2
		want["kvroute_model_saturation{model="+model+"}"] = 0.2
		want["kvroute_model_prefill_demand_tokens_per_second{model="+model+"}"] = 2000
	}
	if diff := cmp.Diff(want, scrape(), cmpopts.EquateApprox(1e-9, 1e-9)); diff != "" {
		t.Errorf("w lists %d models (-want +got):\n%s", len(many), diff)
	}
	// Every model label of the load is one of the requests' (a KEDA query can take its model
	// from kvroute_requests_total).
	requests := map[string]bool{}
	for k := range seriesOf(t, reg) {
		if rest, ok := strings.CutPrefix(k, "kvroute_requests_total{"); ok {
			for _, l := range strings.Split(strings.TrimSuffix(rest, "}"), ",") {
				if model, ok := strings.CutPrefix(l, "model="); ok {
					requests[model] = true
				}
			}
		}
	}
	for k := range want {
		if model, ok := strings.CutPrefix(k, "kvroute_model_load{model="); ok && !requests[strings.TrimSuffix(model, "}")] {
			t.Errorf("%s: no kvroute_requests_total series with that model", k)
		}
	}
}
