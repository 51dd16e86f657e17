package workload

import (
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestWorkloadNames(t *testing.T) {
	want := []string{"multi-turn", "prefix-repetition", "shared-prefix", "tool-agent", "unique"}
	if diff := cmp.Diff(want, WorkloadNames()); diff != "" {
		t.Errorf("WorkloadNames (-want +got):\n%s", diff)
	}
	help := WorkloadHelp()
	for _, s := range []string{"shared-prefix:", "groups=64", "rate=10", "prefix-mean=1000", "think=1s", "zipf=0", "tool-agent:", "duration=59m"} {
		if !strings.Contains(help, s) {
			t.Errorf("WorkloadHelp lacks %q", s)
		}
	}
}

func TestGenerateDeterministic(t *testing.T) {
	for _, spec := range []string{"shared-prefix", "multi-turn", "prefix-repetition", "multi-turn:conversations=5,rate=2", "shared-prefix:zipf=1", "unique:n=50"} {
		a, err := Generate(spec, 7)
		if err != nil {
			t.Fatal(err)
		}
		b, err := Generate(spec, 7)
		if err != nil {
			t.Fatal(err)
		}
		if !sameRequests(a, b) {
			t.Errorf("%s: two runs with seed 7 differ", spec)
		}
		c, err := Generate(spec, 8)
		if err != nil {
			t.Fatal(err)
		}
		if sameRequests(a, c) {
			t.Errorf("%s: seeds 7 and 8 give the same workload", spec)
		}
		for i := range a {
			r := &a[i]
			if r.ID != i || r.BlockTokens != GeneratedBlockTokens || len(r.Blocks) != (r.PromptTokens+15)/16 || r.OutputTokens < 1 {
				t.Fatalf("%s: request %d malformed: %+v", spec, i, r)
			}
			if i > 0 && r.Arrival < a[i-1].Arrival {
				t.Fatalf("%s: request %d arrives before request %d", spec, i, i-1)
			}
		}
	}
}

func TestGenerateSharedPrefix(t *testing.T) {
	reqs, err := Generate("shared-prefix", 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(reqs) != 64*16 {
		t.Fatalf("%d requests, want 1024", len(reqs))
	}
	// 2048 system tokens are 128 blocks, shared within a group and only there.
	groups := map[uint64]int{}
	for i := range reqs {
		r := &reqs[i]
		if r.PromptTokens != 2048+128 || r.OutputTokens != 256 {
			t.Fatalf("request %d: %d prompt, %d output tokens, want 2176 and 256", i, r.PromptTokens, r.OutputTokens)
		}
		groups[r.Blocks[127]]++
		if r.Blocks[127] == r.Blocks[128] {
			t.Fatalf("request %d: question block equals system block", i)
		}
	}
	if len(groups) != 64 {
		t.Errorf("%d distinct system prompts, want 64", len(groups))
	}
	for id, n := range groups {
		if n != 16 {
			t.Errorf("system prompt %x used %d times, want 16", id, n)
		}
	}
	// Infinite cache: every group's first request misses its system prompt, all else hits it.
	want := float64(64*15*2048) / float64(1024*2176)
	if got := InfiniteCacheHitRate(reqs, 16); math.Abs(got-want) > 1e-12 {
		t.Errorf("infinite hit rate %v, want %v", got, want)
	}
	small, err := Generate("shared-prefix:groups=2,prompts=3,system=20,question=5,output=7,n=4,rate=1000", 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(small) != 4 || small[0].PromptTokens != 25 || len(small[0].Blocks) != 2 || small[3].OutputTokens != 7 {
		t.Errorf("small workload: %+v", small)
	}
	ordered, err := Generate("shared-prefix:groups=3,prompts=2,ordered=true", 1)
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i < len(ordered); i += 2 {
		if ordered[i].Blocks[0] != ordered[i-1].Blocks[0] {
			t.Errorf("ordered=true: requests %d and %d are not of one group", i-1, i)
		}
	}
	if small[3].Arrival > time.Second {
		t.Errorf("4 arrivals at 1000/s end at %v", small[3].Arrival)
	}
}

func TestGeneratePrefixRepetition(t *testing.T) {
	reqs, err := Generate("prefix-repetition:n=50,prefixes=5,prefix=32,suffix=20,output=3", 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(reqs) != 50 {
		t.Fatalf("%d requests, want 50", len(reqs))
	}
	prefixes := map[uint64]int{}
	for _, r := range reqs {
		if r.PromptTokens != 52 || len(r.Blocks) != 4 {
			t.Fatalf("request %d: %d tokens in %d blocks, want 52 in 4", r.ID, r.PromptTokens, len(r.Blocks))
		}
		prefixes[r.Blocks[1]]++
	}
	if diff := cmp.Diff(map[int]int{10: 5}, countValues(prefixes)); diff != "" {
		t.Errorf("uses of each prefix: (-want +got):\n%s", diff)
	}
	if all, _ := Generate("prefix-repetition", 3); len(all) != 1000 {
		t.Errorf("default n: %d, want 1000", len(all))
	}
}

func countValues(m map[uint64]int) map[int]int {
	out := map[int]int{}
	for _, v := range m {
		out[v]++
	}
	return out
}

func TestGenerateMultiTurn(t *testing.T) {
	reqs, err := Generate("multi-turn", 5)
	if err != nil {
		t.Fatal(err)
	}
	bySession := map[string][]*Request{}
	for i := range reqs {
		bySession[reqs[i].Session] = append(bySession[reqs[i].Session], &reqs[i])
	}
	if len(bySession) != 24 {
		t.Fatalf("%d conversations, want 24", len(bySession))
	}
	var common uint64
	for name, turns := range bySession {
		if len(turns) < 12 || len(turns) > 18 {
			t.Errorf("%s: %d turns, want 12 to 18", name, len(turns))
		}
		if common == 0 {
			common = turns[0].Blocks[0]
		}
		if turns[0].Blocks[0] != common {
			t.Errorf("%s: first block differs from other conversations' (common prefix of 500 tokens)", name)
		}
		for k := 1; k < len(turns); k++ {
			prev, cur := turns[k-1], turns[k]
			grow := cur.PromptTokens - prev.PromptTokens - prev.OutputTokens
			if grow < 120 || grow > 160 {
				t.Errorf("%s turn %d: new user turn of %d tokens, want 120 to 160", name, k, grow)
			}
			full := prev.PromptTokens / GeneratedBlockTokens
			if diff := cmp.Diff(prev.Blocks[:full], cur.Blocks[:full]); diff != "" {
				t.Fatalf("%s turn %d does not start with turn %d's full blocks (-prev +cur):\n%s", name, k, k-1, diff)
			}
			if wait := cur.Arrival - prev.Arrival; wait < time.Second+time.Duration(prev.OutputTokens)*20*time.Millisecond {
				t.Errorf("%s turn %d: arrives %v after the previous turn, before its estimated end plus think time", name, k, wait)
			}
		}
		if turns[0].OutputTokens < 80 || turns[0].OutputTokens > 120 {
			t.Errorf("%s: output %d, want 80 to 120", name, turns[0].OutputTokens)
		}
	}
	capped, err := Generate("multi-turn:n=10", 5)
	if err != nil {
		t.Fatal(err)
	}
	if !sameRequests(reqs[:10], capped) {
		t.Errorf("n=10 is not the first 10 requests")
	}
}

func TestGenerateErrors(t *testing.T) {
	tests := []struct{ spec, want string }{
		{"nope", `workload "nope": unknown name, want one of multi-turn, prefix-repetition, shared-prefix, tool-agent, unique`},
		{"shared-prefix:colour=red", `workload shared-prefix: unknown key "colour", want one of groups, prompts, system, question, output, ordered, zipf, n, rate`},
		// Misspelt: the nearest is offered, as the config's unknown keys are.
		{"shared-prefix:grups=3", `workload shared-prefix: unknown key "grups", did you mean "groups"? want one of groups, prompts, system, question, output, ordered, zipf, n, rate`},
		{"multi-turn:max-turn=3", `unknown key "max-turn", did you mean "max-turns"? want one of`},
		{"shared-prefx", `workload "shared-prefx": unknown name, did you mean "shared-prefix"? want one of multi-turn, prefix-repetition, shared-prefix, tool-agent, unique`},
		{"shared-prefix:zipf=-1", `key zipf: "-1", want a number of at least 0`},
		{"shared-prefix:zipf=1.1,ordered=true", "keys zipf, ordered: a Zipf draw has no group order"},
		{"shared-prefix:zipf=1,n=100000000", "keys n, system, question: up to"},
		{"tool-agent:turns=0.5", "key turns: 0.5, want at least 1"},
		{"tool-agent:rate=3", "key rate: tool-agent starts its sessions over duration="},
		{"tool-agent:duration=0s", "key duration: 0, want the span"},
		{"tool-agent:popularity=x", `key popularity: "x"`},
		{"unique:spread=-0.1", `key spread: "-0.1"`},
		{"unique:n=100000000,input=100000", "keys n, input: up to"},
		{"shared-prefix:ordered=maybe", `key ordered: "maybe", want true or false`},
		{"shared-prefix:groups", "key groups: no value"},
		{"shared-prefix:groups=2,groups=3", "key groups: given twice"},
		{"shared-prefix:groups=-1", `key groups: "-1", want an integer from 1`},
		{"shared-prefix:rate=0", `key rate: "0", want a number above 0`},
		{"shared-prefix:rate=NaN", `key rate: "NaN"`},
		{"shared-prefix:n=2000", "key n: 2000 above the 1024 requests"},
		{"shared-prefix:system=0,question=0", "keys system, question: both 0"},
		{"multi-turn:min-turns=5,max-turns=2", "key min-turns: 5 above max-turns 2"},
		{"multi-turn:think=soon", `key think: "soon", want a duration`},
		{"multi-turn:conversations=100000000", "keys conversations, max-turns: up to"},
		{"prefix-repetition:output=0", `key output: "0"`},
		{"prefix-repetition:n=1000000,prefix=100000", "keys n, prefix, suffix: up to 100256000000 prompt tokens in all, want at most 2147483648"},
		{"shared-prefix:groups=1000,prompts=1000,system=100000", "keys groups, prompts, system, question: up to"},
		{"multi-turn:conversations=10000,max-user=100000", "keys conversations, max-turns, common, prefix-max, max-user, max-output: up to"},
	}
	for _, tt := range tests {
		_, err := Generate(tt.spec, 1)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Generate(%q) error = %v, want it to contain %q", tt.spec, err, tt.want)
		}
	}
}

func FuzzGenerateSpec(f *testing.F) {
	f.Add("shared-prefix:groups=2,prompts=2,system=33,question=7")
	f.Add("multi-turn:conversations=2,min-turns=1,max-turns=3,prefix-mean=40,common=0")
	f.Add("prefix-repetition:n=5,prefixes=2,rate=1e9")
	f.Add("multi-turn:think=-1s,,=,n")
	f.Add("shared-prefix:zipf=2,n=9,groups=3")
	f.Add("tool-agent:n=20,agents=2,turns=3")
	f.Add("unique:n=7,spread=0")
	f.Fuzz(func(t *testing.T, spec string) {
		if specProduct(spec) > 1e7 {
			t.Skip("numbers too large: the workload could take minutes to build")
		}
		reqs, err := Generate(spec, 1)
		if err != nil {
			if reqs != nil {
				t.Errorf("error %v with requests", err)
			}
			return
		}
		total := 0
		for i := range reqs {
			r := &reqs[i]
			total += r.PromptTokens
			if r.PromptTokens < 1 || r.OutputTokens < 1 || r.BlockTokens < 1 || len(r.Blocks) != (r.PromptTokens+r.BlockTokens-1)/r.BlockTokens || r.Arrival < 0 {
				t.Fatalf("%q: bad request %+v", spec, r)
			}
			if total > 1<<22 {
				t.Skip("workload too large to fuzz")
			}
		}
	})
}

// specProduct multiplies the numbers written in a spec: a cheap bound on the workload's size.
func specProduct(spec string) float64 {
	product, v := 1.0, 0.0
	for i := 0; i <= len(spec); i++ {
		if i < len(spec) && spec[i] >= '0' && spec[i] <= '9' {
			v = v*10 + float64(spec[i]-'0')
			continue
		}
		product *= max(v, 1)
		v = 0
	}
	return product
}

func TestPromptOfPartialBlocks(t *testing.T) {
	a, na := promptOf([]part{{1, 20}, {0, 0}, {2, 13}})
	b, nb := promptOf([]part{{1, 20}, {2, 13}, {3, 30}})
	if na != 33 || nb != 63 || len(a) != 3 || len(b) != 4 {
		t.Fatalf("got %d tokens in %d blocks and %d in %d", na, len(a), nb, len(b))
	}
	if a[0] != b[0] || a[1] != b[1] {
		t.Errorf("equal first 32 tokens give different blocks: %x vs %x", a[:2], b[:2])
	}
	if a[2] == b[2] {
		t.Errorf("a partial block equals the full block that extends it")
	}
}

func TestSpeedupAndPoisson(t *testing.T) {
	reqs := []Request{req(0, 16, 16, 1), req(10*time.Second, 16, 16, 1), req(30*time.Second, 16, 16, 2)}
	got := Speedup(reqs, 10)
	want := []time.Duration{0, time.Second, 3 * time.Second}
	for i := range got {
		if got[i].Arrival != want[i] {
			t.Errorf("Speedup: arrival %d = %v, want %v", i, got[i].Arrival, want[i])
		}
	}
	if reqs[1].Arrival != 10*time.Second {
		t.Errorf("Speedup modified its input")
	}
	if Speedup(reqs, 0)[2].Arrival != 30*time.Second || Speedup(reqs, math.Inf(1))[2].Arrival != 30*time.Second {
		t.Errorf("Speedup by 0 or +Inf must keep the arrivals")
	}
	// 10 s / 1e-300 is far past time.Duration's range: it saturates, never wraps round.
	if diff := cmp.Diff([]time.Duration{0, math.MaxInt64, math.MaxInt64}, arrivals(Speedup(reqs, 1e-300))); diff != "" {
		t.Errorf("Speedup by 1e-300 (-want +got):\n%s", diff)
	}
	many := make([]Request, 20000)
	p := Poisson(many, 50, 9)
	if !sameRequests(p, Poisson(many, 50, 9)) {
		t.Errorf("Poisson not deterministic")
	}
	if p[0].Arrival != 0 {
		t.Errorf("first Poisson arrival %v, want 0", p[0].Arrival)
	}
	if mean := p[len(p)-1].Arrival.Seconds() / float64(len(p)-1); math.Abs(mean-0.02) > 0.001 {
		t.Errorf("mean gap %v s, want 0.02 +- 0.001", mean)
	}
	if b := Poisson(reqs, -1, 1); b[2].Arrival != 0 {
		t.Errorf("non-positive rate: arrival %v, want 0", b[2].Arrival)
	}
}

// sameRequests compares workloads field by field (cmp is too slow on them under -race).
func sameRequests(a, b []Request) bool {
	return slices.EqualFunc(a, b, func(x, y Request) bool {
		return x.ID == y.ID && x.Arrival == y.Arrival && x.Session == y.Session && x.BlockTokens == y.BlockTokens &&
			x.PromptTokens == y.PromptTokens && x.OutputTokens == y.OutputTokens && slices.Equal(x.Blocks, y.Blocks)
	})
}

// Whole marks the fraction asked for, drawn from the seed: none at 0, all at 1, about half
// at 0.5, the same ones for the same seed, and leaves the input as it was.
func TestWhole(t *testing.T) {
	reqs := make([]Request, 2000)
	count := func(rs []Request) (n int) {
		for _, r := range rs {
			if r.Whole {
				n++
			}
		}
		return n
	}
	for _, tc := range []struct {
		fraction float64
		lo, hi   int
	}{{0, 0, 0}, {1, 2000, 2000}, {0.5, 900, 1100}, {0.1, 150, 250}} {
		got := Whole(reqs, tc.fraction, 7)
		if n := count(got); n < tc.lo || n > tc.hi {
			t.Errorf("fraction %g: %d of 2000 whole, want %d to %d", tc.fraction, n, tc.lo, tc.hi)
		}
	}
	marks := func(rs []Request) []bool {
		out := make([]bool, len(rs))
		for i, r := range rs {
			out[i] = r.Whole
		}
		return out
	}
	a, b, c := marks(Whole(reqs, 0.5, 7)), marks(Whole(reqs, 0.5, 7)), marks(Whole(reqs, 0.5, 8))
	if !slices.Equal(a, b) || slices.Equal(a, c) {
		t.Error("Whole: want the same draw for the same seed and another for another seed")
	}
	if count(reqs) != 0 {
		t.Error("Whole changed its input")
	}
}

// arrivals returns the arrival of each request, in order.
func arrivals(reqs []Request) []time.Duration {
	out := make([]time.Duration, len(reqs))
	for i := range reqs {
		out[i] = reqs[i].Arrival
	}
	return out
}
