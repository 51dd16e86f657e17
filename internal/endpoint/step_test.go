package endpoint

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

// An endpoint's own step budget: the configured one, else what the engine reported, else its
// engine kind's default (the detected kind for auto), else none, which leaves the policy's
// value in force.
func TestEndpoint_StepBudget(t *testing.T) {
	type budget struct {
		Tokens int
		Source string
	}
	for _, tc := range []struct {
		name     string
		ep       *Endpoint
		detected string
		reported int
		want     budget
	}{
		{"configured wins over the engine's default", &Endpoint{Engine: "ollama", StepTokens: 2048}, "", 0, budget{2048, StepConfigured}},
		{"configured on vllm", &Endpoint{Engine: "vllm", StepTokens: 16384}, "", 0, budget{16384, StepConfigured}},
		{"ollama's num_batch", &Endpoint{Engine: "ollama"}, "", 0, budget{512, StepEngineDefault}},
		{"llama.cpp's n_batch", &Endpoint{Engine: "llamacpp"}, "", 0, budget{2048, StepEngineDefault}},
		{"vllm: none of its own", &Endpoint{Engine: "vllm"}, "", 0, budget{0, ""}},
		{"sglang: none of its own", &Endpoint{Engine: "sglang"}, "", 0, budget{0, ""}},
		{"tgi: none of its own", &Endpoint{Engine: "tgi"}, "", 0, budget{0, ""}},
		{"openai: none of its own", &Endpoint{Engine: "openai"}, "", 0, budget{0, ""}},
		{"auto before detection", &Endpoint{Engine: "auto"}, "", 0, budget{0, ""}},
		{"auto detected as ollama", &Endpoint{Engine: "auto"}, "ollama", 0, budget{512, StepEngineDefault}},
		{"configured wins over reported", &Endpoint{Engine: "sglang", StepTokens: 4096}, "", 8192, budget{4096, StepConfigured}},
		{"reported on sglang", &Endpoint{Engine: "sglang"}, "", 16384, budget{16384, StepReported}},
		{"reported wins over the engine's default", &Endpoint{Engine: "ollama"}, "", 1024, budget{1024, StepReported}},
		{"reported on auto before detection", &Endpoint{Engine: "auto"}, "", 2048, budget{2048, StepReported}},
		{"none reported: the engine's default", &Endpoint{Engine: "llamacpp"}, "", -5, budget{2048, StepEngineDefault}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.detected != "" {
				tc.ep.SetKind(tc.detected)
			}
			tc.ep.SetReportedStepTokens(tc.reported)
			var got budget
			got.Tokens, got.Source = tc.ep.StepBudget()
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("StepBudget (-want +got):\n%s", diff)
			}
		})
	}
}

// A spec whose step budget changes makes a new endpoint, like any other changed key, and the
// endpoint carries the spec's budget.
func TestPool_StepTokensFromSpec(t *testing.T) {
	p := NewPool()
	if _, err := p.Update([]Spec{{Name: "http://a", Engine: "vllm", StepTokens: 4096}}); err != nil {
		t.Fatal(err)
	}
	a := p.ByName("http://a")
	if n, src := a.StepBudget(); n != 4096 || src != StepConfigured {
		t.Errorf("StepBudget = %d, %q; want 4096, %q", n, src, StepConfigured)
	}
	d, err := p.Update([]Spec{{Name: "http://a", Engine: "vllm", StepTokens: 16384}})
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Added) != 1 || len(d.Removed) != 1 || len(d.Kept) != 0 {
		t.Fatalf("diff: %d added, %d removed, %d kept; want 1, 1, 0", len(d.Added), len(d.Removed), len(d.Kept))
	}
	if got := p.ByName("http://a").StepTokens; got != 16384 {
		t.Errorf("new endpoint's StepTokens = %d, want 16384", got)
	}
}

// SetReportedStepTokens returns what it replaced, so that a caller logs a change once; 0 clears.
func TestEndpoint_SetReportedStepTokens(t *testing.T) {
	e := &Endpoint{Engine: "sglang"}
	var olds []int
	for _, n := range []int{8192, 8192, 4096, 0} {
		olds = append(olds, e.SetReportedStepTokens(n))
	}
	if diff := cmp.Diff([]int{0, 8192, 8192, 4096}, olds); diff != "" {
		t.Errorf("replaced values (-want +got):\n%s", diff)
	}
	if n, src := e.StepBudget(); n != 0 || src != "" {
		t.Errorf("after clearing, StepBudget = %d, %q; want 0, \"\"", n, src)
	}
}
