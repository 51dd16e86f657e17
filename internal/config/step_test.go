package config

import (
	"strings"
	"testing"
)

// endpoints[].step_tokens: a budget is kept as given, 0 is unset, and a negative one is
// refused with the field and the fix named, wherever endpoint keys are read (the config's
// endpoints, a discovery template, a discovery file).
func TestParse_StepTokens(t *testing.T) {
	c, err := Parse([]byte(`
endpoints:
  - url: http://127.0.0.1:8001
    engine: sglang
    step_tokens: 16384
  - url: http://127.0.0.1:8002
    engine: vllm
`))
	if err != nil {
		t.Fatal(err)
	}
	if got := []int{c.Endpoints[0].StepTokens, c.Endpoints[1].StepTokens}; got[0] != 16384 || got[1] != 0 {
		t.Errorf("step_tokens = %v, want [16384 0]", got)
	}

	_, err = Parse([]byte(`
endpoints:
  - url: http://127.0.0.1:8001
    step_tokens: -1
discovery:
  dns:
    - name: vllm.example
      port: 8000
      endpoint: {engine: vllm, step_tokens: -8192}
`))
	if err == nil {
		t.Fatal("want an error for negative step_tokens")
	}
	msg := err.Error()
	for _, want := range []string{
		"endpoints[0].step_tokens: -1 is negative: give the engine's tokens per step under chunked prefill (vLLM max_num_batched_tokens), or 0 for its engine's default or the policy's step_tokens",
		"discovery.dns[0].endpoint.step_tokens: -8192 is negative",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("error lacks %q; got:\n%s", want, msg)
		}
	}

	eps, err := ParseEndpoints([]byte("- url: http://10.0.0.1:8000\n  engine: tgi\n  step_tokens: 4096\n"))
	if err != nil || len(eps) != 1 || eps[0].StepTokens != 4096 {
		t.Errorf("discovery file: %+v, %v; want step_tokens 4096", eps, err)
	}
	_, err = ParseEndpoints([]byte("- url: http://10.0.0.1:8000\n  step_tokens: -2\n"))
	if err == nil || !strings.Contains(err.Error(), "endpoints[0].step_tokens: -2 is negative") {
		t.Errorf("discovery file: err = %v, want the negative step_tokens named", err)
	}
	_, err = ParseEndpoints([]byte("- url: http://10.0.0.1:8000\n  step_tokens: lots\n"))
	if err == nil || !strings.Contains(err.Error(), `[0].step_tokens: got the text "lots", want a whole number`) {
		t.Errorf("discovery file: err = %v, want the type error named", err)
	}
}
