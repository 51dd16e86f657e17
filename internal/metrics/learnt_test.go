package metrics

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/internal/metrics/metricstest"
)

// ttftModels is the models that have a TTFT series in reg, sorted.
func ttftModels(t *testing.T, reg prometheus.Gatherer) []string {
	t.Helper()
	var out []string
	for k := range metricstest.Values(t, reg, "kvroute_ttft_seconds") {
		if m, ok := strings.CutPrefix(k, "kvroute_ttft_seconds_count{model="); ok {
			out = append(out, strings.TrimSuffix(m, "}"))
		}
	}
	slices.Sort(out)
	return out
}

// requestModels is the models that have request series of endpoint ep at 0 for every status.
func requestModels(t *testing.T, reg prometheus.Gatherer, ep string) []string {
	t.Helper()
	count := map[string]int{}
	for k, v := range metricstest.Values(t, reg, "kvroute_requests_total") {
		model, rest, _ := strings.Cut(strings.TrimPrefix(k, "kvroute_requests_total{endpoint="+ep+",model="), ",")
		if strings.HasPrefix(k, "kvroute_requests_total{endpoint="+ep+",") && strings.HasPrefix(rest, "status=") && v == 0 {
			count[model]++
		}
	}
	var out []string
	for model, n := range count {
		if n == len(endpointStatuses) {
			out = append(out, model)
		}
	}
	slices.Sort(out)
	return out
}

// TestLearntModelSeries, step by step: the models an engine lists get their series at 0 on
// the endpoints that may serve them, and lose them when no engine lists them any more.
func TestLearntModelSeries(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m := New(reg)
	m.EndpointAdded("a", []string{"m1"})
	m.EndpointAdded("c", nil)
	m.EndpointAdded("d", nil)
	check := func(step string, models []string, byEndpoint map[string][]string) {
		t.Helper()
		if diff := cmp.Diff(models, ttftModels(t, reg)); diff != "" {
			t.Errorf("%s: TTFT series by model (-want +got):\n%s", step, diff)
		}
		for ep, want := range byEndpoint {
			if diff := cmp.Diff(want, requestModels(t, reg, ep)); diff != "" {
				t.Errorf("%s: request series of %s by model (-want +got):\n%s", step, ep, diff)
			}
		}
	}
	check("before any engine answered", []string{"m1", "other"}, map[string][]string{"c": {"m1", "other"}, "d": {"m1", "other"}})

	// c's engine lists x (and m1, which a configures). d has not answered: it takes any model.
	m.EndpointServes("c", []string{"x", "m1", "x"})
	check("c lists x", []string{"m1", "other", "x"}, map[string][]string{"a": {"m1"}, "c": {"m1", "other", "x"}, "d": {"m1", "other", "x"}})
	if _, ok := seriesOf(t, reg)["kvroute_requests_total{endpoint=none,model=x,status=503}"]; !ok {
		t.Error("c lists x: the router's 503s for x have no series")
	}

	// d's engine lists y only: d loses x, c (which answered without y) does not get y.
	m.EndpointServes("d", []string{"y"})
	check("d lists y", []string{"m1", "other", "x", "y"}, map[string][]string{"c": {"m1", "other", "x"}, "d": {"m1", "other", "y"}})

	// A configured endpoint's list, and an endpoint not in the pool, decide nothing.
	m.EndpointServes("a", []string{"z"})
	m.EndpointServes("gone", []string{"z"})
	check("a and gone list z", []string{"m1", "other", "x", "y"}, map[string][]string{"a": {"m1"}})

	// c leaves: x goes with it (no engine lists it), y stays.
	m.ForgetEndpoint("c")
	check("c left", []string{"m1", "other", "y"}, map[string][]string{"d": {"m1", "other", "y"}})
	for k := range seriesOf(t, reg) {
		if strings.Contains(k, "model=x") {
			t.Errorf("c left: %s is still there", k)
		}
	}

	// d's engine stops listing y: y goes.
	m.EndpointServes("d", []string{"w"})
	check("d lists w", []string{"m1", "other", "w"}, map[string][]string{"d": {"m1", "other", "w"}})

	// d re-added with a model list: what its engine listed goes.
	m.EndpointAdded("d", []string{"m1"})
	check("d configured", []string{"m1"}, map[string][]string{"d": {"m1"}})
	lint(t, reg)
}

// TestLearntModelsBounded: engines listing 10,000 models make labels for MaxLearntModels of
// them in all, MaxLearntPerEngine each, without crowding out another engine's one model;
// ModelLabel counts the rest as other.
func TestLearntModelsBounded(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg)
	m.EndpointAdded("a", []string{"configured"})
	m.EndpointAdded("small", nil)
	var bigs []string
	for b := range MaxLearntModels/MaxLearntPerEngine + 1 { // one engine too many
		name := fmt.Sprintf("big%d", b)
		bigs = append(bigs, name)
		m.EndpointAdded(name, nil)
		many := make([]string, 10_000)
		for i := range many {
			many[i] = fmt.Sprintf("m%d-%05d", b, i)
		}
		m.EndpointServes(name, many)
		if b == 0 {
			m.EndpointServes("small", []string{"tiny:latest"})
		}
	}
	if n, want := len(ttftModels(t, reg)), 1+1+MaxLearntModels; n != want {
		t.Errorf("%d models with series, want %d (configured, other and MaxLearntModels learnt)", n, want)
	}
	for _, b := range bigs {
		if n, max := len(requestModels(t, reg, b)), 1+1+MaxLearntPerEngine; n > max {
			t.Errorf("%s: request series for %d models, want at most %d", b, n, max)
		}
	}
	if diff := cmp.Diff([]string{"configured", "other", "tiny:latest"}, requestModels(t, reg, "small")); diff != "" {
		t.Errorf("small: request series by model (-want +got):\n%s", diff)
	}
	for model, want := range map[string]string{
		"configured":  "configured",
		"m0-00000":    "m0-00000",
		"m0-00016":    OtherModel, // past the engine's share
		"m4-00000":    OtherModel, // past the bound: the last engine got none
		"tiny:latest": "tiny:latest",
		"tiny":        "tiny:latest", // one model, one label
		"nobody":      OtherModel,
	} {
		if got := m.ModelLabel(model); got != want {
			t.Errorf("ModelLabel(%q) = %q, want %q", model, got, want)
		}
	}
	// small leaves: its place goes to the first model of the engine that got none.
	m.ForgetEndpoint("small")
	if n, want := len(ttftModels(t, reg)), 1+1+MaxLearntModels; n != want {
		t.Errorf("small left: %d models with series, want %d", n, want)
	}
	for model, want := range map[string]string{"tiny": OtherModel, "m4-00000": "m4-00000", "m4-00001": OtherModel} {
		if got := m.ModelLabel(model); got != want {
			t.Errorf("small left: ModelLabel(%q) = %q, want %q", model, got, want)
		}
	}
}
