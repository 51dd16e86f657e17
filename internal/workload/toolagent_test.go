package workload

import (
	"math"
	"slices"
	"testing"
	"time"
)

func TestGenerateToolAgentMatchesMooncake(t *testing.T) {
	// The published figures of the Mooncake toolagent trace that the defaults reproduce.
	reqs, err := Generate("tool-agent", 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(reqs) != 23608 {
		t.Fatalf("%d requests, want 23608", len(reqs))
	}
	var in, out float64
	for i := range reqs {
		r := &reqs[i]
		in += float64(r.PromptTokens)
		out += float64(r.OutputTokens)
		if r.BlockTokens != 512 || len(r.Blocks) != (r.PromptTokens+511)/512 {
			t.Fatalf("request %d: %d tokens in %d blocks of %d, want blocks of 512", i, r.PromptTokens, len(r.Blocks), r.BlockTokens)
		}
	}
	n := float64(len(reqs))
	if mean := in / n; math.Abs(mean-8596) > 0.03*8596 {
		t.Errorf("mean input %.0f tokens, want 8596 +- 3%%", mean)
	}
	if mean := out / n; math.Abs(mean-182) > 0.05*182 {
		t.Errorf("mean output %.0f tokens, want 182 +- 5%%", mean)
	}
	if got := InfiniteCacheHitRate(reqs, 512); math.Abs(got-0.59) > 0.02 {
		t.Errorf("cache ratio (infinite cache, 512-token blocks) %.3f, want 0.59 +- 0.02", got)
	}
	if d := reqs[len(reqs)-1].Arrival; d < 55*time.Minute || d > 65*time.Minute {
		t.Errorf("span %v, want about 59 minutes", d)
	}
}

func TestGenerateToolAgentSessions(t *testing.T) {
	reqs, err := Generate("tool-agent:n=3000,agents=4,turns=3", 2)
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := Generate("tool-agent:n=3000,agents=4,turns=3", 2); !sameRequests(reqs, again) {
		t.Errorf("two runs with seed 2 differ")
	}
	if other, _ := Generate("tool-agent:n=3000,agents=4,turns=3", 3); sameRequests(reqs, other) {
		t.Errorf("seeds 2 and 3 give the same workload")
	}
	bySession := map[string][]*Request{}
	var order []string
	tools := map[uint64]bool{} // an agent's tool prompt: its first block
	for i := range reqs {
		r := &reqs[i]
		if i > 0 && r.Arrival < reqs[i-1].Arrival {
			t.Fatalf("request %d arrives before request %d", i, i-1)
		}
		if bySession[r.Session] == nil {
			order = append(order, r.Session)
		}
		bySession[r.Session] = append(bySession[r.Session], r)
		tools[r.Blocks[0]] = true
	}
	if len(tools) > 4 {
		t.Errorf("%d distinct first blocks, want at most 4 (one tool prompt per agent)", len(tools))
	}
	turns := 0
	for _, s := range order {
		ts := bySession[s]
		turns += len(ts)
		for k := 1; k < len(ts); k++ {
			prev, cur := ts[k-1], ts[k]
			full := prev.PromptTokens / 512
			if !slices.Equal(prev.Blocks[:full], cur.Blocks[:full]) {
				t.Fatalf("%s turn %d does not start with turn %d's full blocks", s, k, k-1)
			}
			if cur.PromptTokens <= prev.PromptTokens+prev.OutputTokens {
				t.Errorf("%s turn %d: %d tokens, no tool result after the previous %d + %d", s, k, cur.PromptTokens, prev.PromptTokens, prev.OutputTokens)
			}
			if cur.Arrival <= prev.Arrival {
				t.Errorf("%s turn %d arrives at %v, not after turn %d at %v", s, k, cur.Arrival, k-1, prev.Arrival)
			}
		}
	}
	if mean := float64(turns) / float64(len(order)); math.Abs(mean-3) > 0.3 {
		t.Errorf("mean turns per session %.2f, want 3 +- 0.3", mean)
	}
}

func TestGenerateSharedPrefixZipf(t *testing.T) {
	reqs, err := Generate("shared-prefix:zipf=1.1", 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(reqs) != 1024 {
		t.Fatalf("%d requests, want the default 64 x 16", len(reqs))
	}
	uses := map[uint64]int{}
	questions := map[uint64]bool{}
	for i := range reqs {
		r := &reqs[i]
		uses[r.Blocks[127]]++ // the system prompt's last block
		if questions[r.Blocks[135]] {
			t.Fatalf("request %d repeats another's question", i)
		}
		questions[r.Blocks[135]] = true
	}
	counts := make([]int, 0, len(uses))
	for _, n := range uses {
		counts = append(counts, n)
	}
	slices.Sort(counts)
	slices.Reverse(counts)
	// The most popular group draws 1/H(64, 1.1) of the traffic: about 24 % (248 of 1024).
	var h float64
	for k := 1; k <= 64; k++ {
		h += math.Pow(float64(k), -1.1)
	}
	if want := 1024 / h; math.Abs(float64(counts[0])-want) > 4*math.Sqrt(want) {
		t.Errorf("most popular group has %d prompts, want about %.0f", counts[0], want)
	}
	if counts[0] < 5*counts[min(9, len(counts)-1)] {
		t.Errorf("group sizes %v: the first is not five times the tenth", counts[:10])
	}
}

func TestGenerateUnique(t *testing.T) {
	reqs, err := Generate("unique:n=1500", 4)
	if err != nil {
		t.Fatal(err)
	}
	var in float64
	for i := range reqs {
		in += float64(reqs[i].PromptTokens)
	}
	if mean := in / float64(len(reqs)); math.Abs(mean-2048) > 0.07*2048 {
		t.Errorf("mean input %.0f, want 2048 +- 7%%", mean)
	}
	if got := InfiniteCacheHitRate(reqs, 16); got != 0 {
		t.Errorf("infinite-cache hit rate %v, want 0: nothing is shared", got)
	}
	same, err := Generate("unique:n=5,spread=0,input=100,output=9", 4)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range same {
		if r.PromptTokens != 100 || r.OutputTokens != 9 {
			t.Errorf("spread=0: %d in, %d out, want 100 and 9", r.PromptTokens, r.OutputTokens)
		}
	}
}
