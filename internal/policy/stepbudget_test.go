package policy

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/internal/endpoint"
)

// Each endpoint's queue steps by its own budget: endpoint 0's configured 4,096 tokens,
// endpoint 1's ollama default (512 engine tokens, 756 of the router's at ollama's 0.677
// engine tokens per router token), endpoint 2 the policy's 2,000. The same 4,500 tokens
// queued on each leave a different tail step, a different shared-step charge and a
// different hold.
func TestPrefixAware_StepBudgetPerEndpoint(t *testing.T) {
	pa, clk := newPAWith(t, Params{"cache_weight": "0", "affinity_window": "0", "attention_weight": "0",
		"step_tokens": "2000"}, func(pa *prefixAware) { pa.learn = false })
	for range 10 {
		pa.fleet.add(1, 1, learnWeight, 0, 0, 0) // observed as predicted: speed 1, so Defer may hold
	}
	eps := newEndpoints(3, 1<<20)
	eps[0].Engine, eps[0].StepTokens = "vllm", 4096
	eps[1].Engine = "ollama"
	eps[1].LearnTokenScale(677, 1000, 1)
	eps[2].Engine = "vllm"

	type budget struct {
		Tokens int
		Source string
	}
	var gotBudgets []budget
	for _, e := range eps {
		n, src := pa.StepTokens(e)
		gotBudgets = append(gotBudgets, budget{n, src})
	}
	wantBudgets := []budget{{4096, endpoint.StepConfigured}, {512, endpoint.StepEngineDefault}, {2000, StepPolicy}}
	if diff := cmp.Diff(wantBudgets, gotBudgets); diff != "" {
		t.Errorf("StepTokens (-want +got):\n%s", diff)
	}

	t0 := clk.t
	for i, e := range eps {
		a := req("a"+string(rune('0'+i)), 4, seq(uint64(1000*(i+1)), 281)...) // 4,500 tokens
		e.Start(a.PromptTokens)
		pa.Routed(a, e)
	}
	// 4,500 tokens: 4,096 + 404; 5 x 756 + 720; 2 x 2,000 + 500.
	type tail struct{ Step, Start, Fill int64 }
	var gotTails []tail
	for i := range eps {
		s := pa.state(i)
		s.mu.Lock()
		start, fill, _, _ := s.stepTail(t0.UnixNano(), 1)
		gotTails = append(gotTails, tail{s.step, start, fill})
		s.mu.Unlock()
	}
	if diff := cmp.Diff([]tail{{4096, 4096, 404}, {756, 3780, 720}, {2000, 4000, 500}}, gotTails); diff != "" {
		t.Errorf("tail steps (-want +got):\n%s", diff)
	}

	// A 5,000-token prompt fills what is left of each tail step: 3,692, 36 and 1,500 tokens.
	long := req("long", 8, seq(9000, 312)...)
	var gotShared []float64
	for i := range eps {
		gotShared = append(gotShared, pa.shared(pa.state(i), long, 0, t0.UnixNano(), 1))
	}
	if diff := cmp.Diff([]float64{3692, 36, 1500}, gotShared); diff != "" {
		t.Errorf("shared (-want +got):\n%s", diff)
	}

	// 0.40 s on, each head has done 3,800 tokens: endpoint 0's last step is 296 tokens away
	// (held 296 + 404/4 = 397 tokens), endpoint 1's has started (no hold), endpoint 2's is 200
	// away (held 200 + 500/4 = 325).
	clk.t = t0.Add(400 * time.Millisecond)
	var gotHolds []float64
	for i := range eps {
		gotHolds = append(gotHolds, pa.state(i).holdFor(clk.t.UnixNano(), 1))
	}
	if diff := cmp.Diff([]float64{397, 0, 325}, gotHolds); diff != "" {
		t.Errorf("holds in tokens (-want +got):\n%s", diff)
	}
}

// The budget in router tokens follows the token scale the endpoint learns: the next request
// routed there steps by the new value. The policy's step_tokens=0 turns the term off for every
// endpoint, its own budget or not.
func TestPrefixAware_StepBudgetFollowsTokenScale(t *testing.T) {
	pa, _ := newPAWith(t, Params{"cache_weight": "0", "affinity_window": "0"}, func(pa *prefixAware) { pa.learn = false })
	ep := &endpoint.Endpoint{ID: 0, Name: "ollama", Engine: "ollama", KVCapacityTokens: 1 << 20}
	route := func(id string) int64 {
		r := req(id, 0, seq(uint64(len(id))*1000, 10)...)
		pa.Routed(r, ep)
		s := pa.state(0)
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.step
	}
	if got := route("a"); got != 512 {
		t.Errorf("before a token scale is learned: step %d, want 512", got)
	}
	ep.LearnTokenScale(1000, 2000, 1) // the engine counts half the router's tokens
	if got := route("bb"); got != 1024 {
		t.Errorf("at token scale 0.5: step %d, want 1024", got)
	}

	off, _ := newPAWith(t, Params{"step_tokens": "0"}, func(pa *prefixAware) { pa.learn = false })
	own := &endpoint.Endpoint{ID: 0, Engine: "vllm", StepTokens: 4096}
	if n, src := off.StepTokens(own); n != 0 || src != StepPolicy {
		t.Errorf("step_tokens=0: StepTokens %d, %q; want 0, %q", n, src, StepPolicy)
	}
	if got := off.stepOf(own); got != 0 {
		t.Errorf("step_tokens=0: stepOf %d, want 0", got)
	}
}
