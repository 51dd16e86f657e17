package workload_test

import (
	"fmt"
	"strings"

	"github.com/kvroute/kvroute/internal/workload"
)

func ExampleGenerate() {
	reqs, err := workload.Generate("shared-prefix:groups=2,prompts=3,system=64,question=16,rate=5", 1)
	if err != nil {
		fmt.Println(err)
		return
	}
	r := &reqs[0]
	fmt.Println(len(reqs), "requests of", r.PromptTokens, "tokens in", len(r.Blocks), "blocks")
	fmt.Println("engine block keys of 16 tokens:", len(workload.Keys(nil, r, 16)))
	fmt.Println("prompt bytes:", len(workload.Render(r)))
	fmt.Printf("unbounded cache hit rate: %.3f\n", workload.InfiniteCacheHitRate(reqs, 16))
	// Output:
	// 6 requests of 80 tokens in 5 blocks
	// engine block keys of 16 tokens: 5
	// prompt bytes: 320
	// unbounded cache hit rate: 0.533
}

func ExampleReadMooncake() {
	trace := `{"timestamp": 0, "input_length": 700, "output_length": 20, "hash_ids": [0, 1]}
{"timestamp": 250, "input_length": 1200, "output_length": 30, "hash_ids": [0, 1, 2]}
`
	reqs, err := workload.ReadMooncake(strings.NewReader(trace))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(len(reqs), reqs[1].Arrival, reqs[1].BlockTokens)
	_, err = workload.ReadMooncake(strings.NewReader(`{"timestamp": 0, "input_length": 700, "output_length": 20}`))
	fmt.Println(err)
	// Output:
	// 2 250ms 512
	// line 1: field hash_ids: missing (the prompt's 512-token block ids)
}
