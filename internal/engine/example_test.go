package engine_test

import (
	"fmt"

	"time"

	"github.com/kvroute/kvroute/internal/engine"
)

// The caller owns the clock: submit, then step until idle, each step starting where the last
// one ended. The second request finds the first one's prefix in the cache.
func Example() {
	p, err := engine.LookupProfile("llama3-70b-h200-tp8")
	if err != nil {
		panic(err)
	}
	e, err := engine.New(engine.Config{Profile: p})
	if err != nil {
		panic(err)
	}
	keys := make([]uint64, 512) // 8192 tokens in 16-token blocks
	for i := range keys {
		keys[i] = uint64(i)
	}
	for _, id := range []string{"first", "second"} {
		if err := e.Submit(0, engine.Request{ID: id, PromptTokens: 8192, OutputTokens: 1, BlockKeys: keys}); err != nil {
			panic(err)
		}
	}
	var now time.Duration
	for {
		end, events, ok := e.Step(now)
		if !ok {
			break
		}
		for _, ev := range events {
			if ev.Kind == engine.EventFirstToken {
				fmt.Printf("%s: first token at %v, %d tokens cached\n", ev.ReqID, ev.At.Round(1e6), ev.CachedTokens)
			}
		}
		now = end
	}
	// Output:
	// first: first token at 310ms, 0 tokens cached
	// second: first token at 323ms, 8176 tokens cached
}
