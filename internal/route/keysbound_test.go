package route

import (
	"math"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/policy"
)

// FromOpenAI's MaxTokens is within [0, math.MaxInt32], its product by a list's prompts too:
// before, a max_tokens of -1 (which the parser now refuses, but Keys takes any Request) went
// into the routed event, and the peers dropped it as malformed (a drop the docs say means a
// bug or an attack), and a huge one times several prompts wrapped.
func TestKeysMaxTokensBounded(t *testing.T) {
	for _, tc := range []struct {
		max, prompts, want int
	}{
		{-1, 1, 0},
		{-1, 3, 0},
		{1000, 3, 3000},
		{math.MaxInt64 / 2, 1, math.MaxInt32},
		{math.MaxInt64 / 2, 3, math.MaxInt32},
		{1 << 30, 4, math.MaxInt32},
	} {
		req := &openai.Request{Kind: openai.KindCompletion, Model: "m", MaxTokens: tc.max}
		for range tc.prompts {
			req.Prompt.Texts = append(req.Prompt.Texts, "a prompt")
		}
		var pr policy.Request
		Keys{}.FromOpenAI(&pr, req, "")
		if pr.MaxTokens != tc.want {
			t.Errorf("max_tokens %d, %d prompts: MaxTokens %d, want %d", tc.max, tc.prompts, pr.MaxTokens, tc.want)
		}
	}

	// The routed event of a request of max_tokens -1 is one a peer takes.
	req := &openai.Request{Kind: openai.KindChat, Model: "m", MaxTokens: -1}
	var pr policy.Request
	Keys{}.FromOpenAI(&pr, req, "")
	clk := &stepClock{t: time.Unix(100, 0)}
	a := newReplica(t, 1, &outcomes{}, clk, ShareConfig{}, "x")
	b := newReplica(t, 2, &outcomes{}, clk, ShareConfig{}, "x")
	pr.Blocks, pr.BlockTokens, pr.PromptTokens = []uint64{1}, 16, 10
	c, err := a.lc.Begin(&pr, a.eps, "", clk.t)
	if err != nil {
		t.Fatal(err)
	}
	c.Next()
	c.Finish(Outcome{Failure: FailRejected, CachedTokens: -1})
	for _, d := range a.deliver(b) {
		if d != DropNone && !d.Expected() {
			t.Errorf("the peer dropped an event of a request of max_tokens -1: %q", d)
		}
	}
}
