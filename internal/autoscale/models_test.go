package autoscale

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/kvroute/kvroute/internal/endpoint"
)

// TestSaturation_ServedModels: an endpoint without configured models counts for the models its
// engine lists, as the proxy routes them (a README quick start: `--endpoint URL`, no --model),
// under "" only until its engine has listed them; a list that changes moves its load to the new
// models, and nothing stays under the old ones or under "".
func TestSaturation_ServedModels(t *testing.T) {
	s := NewSaturation(time.Minute)
	listed := &endpoint.Endpoint{ID: 0, Name: "listed"}                                         // no models configured
	configured := &endpoint.Endpoint{ID: 1, Name: "configured", Models: []string{"llama3-70b"}} // the same model, configured
	eps := []*endpoint.Endpoint{listed, configured}
	for k := range 5 {
		at := time.Duration(k) * 15 * time.Second
		scraped(listed, at, 3000*at.Seconds(), 0)
		scraped(configured, at, 1000*at.Seconds(), 0)
		s.Sample(t0.Add(at), eps)
	}
	rate := func(*endpoint.Endpoint) float64 { return 10000 }
	models := func(fs []Figures) []string {
		var out []string
		for _, f := range fs {
			out = append(out, f.Model)
		}
		return out
	}
	// Before the engine has listed its models: they are unknown, under "".
	if diff := cmp.Diff([]string{"", "llama3-70b"}, models(s.Figures(eps, rate))); diff != "" {
		t.Errorf("models not listed yet (-want +got):\n%s", diff)
	}
	listed.SetServedModels([]string{"llama3-70b"})
	want := []Figures{{Model: "llama3-70b", Engines: 2, Reporting: 2, Counted: 2, Demand: 4000, Rate: 10000, Prefill: 0.4, Load: 0.4, Saturation: 0.2}}
	if diff := cmp.Diff(want, s.Figures(eps, rate), cmpopts.EquateApprox(1e-9, 1e-9)); diff != "" {
		t.Errorf("engine lists llama3-70b (-want +got):\n%s", diff)
	}
	// The engine restarted with other models: the load follows them.
	listed.SetServedModels([]string{"qwen", "llama3-8b"})
	want = []Figures{
		{Model: "llama3-70b", Engines: 1, Reporting: 1, Counted: 1, Demand: 1000, Rate: 10000, Prefill: 0.1, Load: 0.1, Saturation: 0.1},
		{Model: "llama3-8b", Engines: 1, Reporting: 1, Counted: 1, Demand: 3000, Rate: 10000, Prefill: 0.3, Load: 0.3, Saturation: 0.3},
		{Model: "qwen", Engines: 1, Reporting: 1, Counted: 1, Demand: 3000, Rate: 10000, Prefill: 0.3, Load: 0.3, Saturation: 0.3},
	}
	if diff := cmp.Diff(want, s.Figures(eps, rate), cmpopts.EquateApprox(1e-9, 1e-9)); diff != "" {
		t.Errorf("engine lists other models (-want +got):\n%s", diff)
	}
	// A configured list wins over the engine's, as it does for routing.
	listed.Models = []string{"llama3-70b"}
	if diff := cmp.Diff([]string{"llama3-70b"}, models(s.Figures(eps, rate))); diff != "" {
		t.Errorf("configured models (-want +got):\n%s", diff)
	}
}

// TestSaturation_FiguresBy: models that share a label make one Figures, in which an endpoint
// serving several of them counts once; the endpoints whose models are unknown go under
// label("").
func TestSaturation_FiguresBy(t *testing.T) {
	s := NewSaturation(time.Minute)
	many := &endpoint.Endpoint{ID: 0, Name: "many"}
	many.SetServedModels([]string{"a", "x1", "x2", "x3"})
	one := &endpoint.Endpoint{ID: 1, Name: "one", Models: []string{"x2"}}
	unknown := &endpoint.Endpoint{ID: 2, Name: "unknown"}
	eps := []*endpoint.Endpoint{many, one, unknown}
	for k := range 5 {
		at := time.Duration(k) * 15 * time.Second
		scraped(many, at, 2000*at.Seconds(), 0)
		scraped(one, at, 1000*at.Seconds(), 0)
		scraped(unknown, at, 500*at.Seconds(), 0)
		s.Sample(t0.Add(at), eps)
	}
	// "a" keeps its own label; the x models, like the unknown ones, share "rest".
	label := func(m string) string {
		if m == "a" {
			return m
		}
		return "rest"
	}
	want := []Figures{
		{Model: "a", Engines: 1, Reporting: 1, Counted: 1, Demand: 2000, Rate: 10000, Prefill: 0.2, Load: 0.2, Saturation: 0.2},
		{Model: "rest", Engines: 3, Reporting: 3, Counted: 3, Demand: 3500, Rate: 10000, Prefill: 0.35, Load: 0.35, Saturation: 0.35 / 3},
	}
	got := s.FiguresBy(eps, func(*endpoint.Endpoint) float64 { return 10000 }, label)
	if diff := cmp.Diff(want, got, cmpopts.EquateApprox(1e-9, 1e-9)); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	// The engine's list is left as it was.
	if diff := cmp.Diff([]string{"a", "x1", "x2", "x3"}, many.ServedModels()); diff != "" {
		t.Errorf("served models changed (-want +got):\n%s", diff)
	}
}
