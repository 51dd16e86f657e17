package endpoint

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

// An endpoint's own step budget: the configured one, else its engine kind's default (the
// detected kind for auto), else none, which leaves the policy's value in force.
func TestEndpoint_StepBudget(t *testing.T) {
	type budget struct {
		Tokens int
		Source string
	}
	for _, tc := range []struct {
		name     string
		ep       *Endpoint
		detected string
		want     budget
	}{
		{"configured wins over the engine's default", &Endpoint{Engine: "ollama", StepTokens: 2048}, "", budget{2048, StepConfigured}},
		{"configured on vllm", &Endpoint{Engine: "vllm", StepTokens: 16384}, "", budget{16384, StepConfigured}},
		{"ollama's num_batch", &Endpoint{Engine: "ollama"}, "", budget{512, StepEngineDefault}},
		{"llama.cpp's n_batch", &Endpoint{Engine: "llamacpp"}, "", budget{2048, StepEngineDefault}},
		{"vllm: none of its own", &Endpoint{Engine: "vllm"}, "", budget{0, ""}},
		{"sglang: none of its own", &Endpoint{Engine: "sglang"}, "", budget{0, ""}},
		{"tgi: none of its own", &Endpoint{Engine: "tgi"}, "", budget{0, ""}},
		{"openai: none of its own", &Endpoint{Engine: "openai"}, "", budget{0, ""}},
		{"auto before detection", &Endpoint{Engine: "auto"}, "", budget{0, ""}},
		{"auto detected as ollama", &Endpoint{Engine: "auto"}, "ollama", budget{512, StepEngineDefault}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.detected != "" {
				tc.ep.SetKind(tc.detected)
			}
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
