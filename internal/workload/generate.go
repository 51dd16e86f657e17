package workload

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/kvroute/kvroute/internal/prefix"
	"github.com/kvroute/kvroute/internal/suggest"
)

// GeneratedBlockTokens is the block size of generated workloads: small, so that aligning a
// shared prefix to blocks wastes little, and equal to vLLM's block size on CUDA.
const GeneratedBlockTokens = 16

// DefaultRate is the Poisson arrival rate, in requests per second, of generated workloads when
// the spec gives no rate= (for multi-turn: conversations started per second).
const DefaultRate = 10.0

// param is one key a generator accepts, with its default and meaning.
type param struct {
	key, def, doc string
}

// generator is one named synthetic workload.
type generator struct {
	name, doc string
	params    []param
	build     func(p *params, seed uint64) ([]Request, error)
}

// commonParams are the keys every generator accepts.
func commonParams() []param {
	return []param{
		{"n", "0", "number of requests (0: the generator's default)"},
		{"rate", strconv.FormatFloat(DefaultRate, 'g', -1, 64), "Poisson arrival rate per second (multi-turn: conversations started per second)"},
	}
}

func generators() []generator {
	return []generator{
		{
			name: "shared-prefix",
			doc:  "SGLang generated-shared-prefix: groups of prompts sharing a system prompt, each with its own question; shuffled unless ordered=true",
			params: []param{
				{"groups", "64", "number of system prompts"},
				{"prompts", "16", "prompts per group (n at most groups*prompts)"},
				{"system", "2048", "system prompt tokens"},
				{"question", "128", "question tokens"},
				{"output", "256", "output tokens"},
				{"ordered", "false", "true: send group by group instead of shuffled"},
				{"zipf", "0", "0: every group gets prompts= prompts; above 0: each of n= prompts (default groups*prompts) draws its group with Zipf popularity of this exponent"},
			},
			build: buildSharedPrefix,
		},
		{
			name: "multi-turn",
			doc: "vLLM multi-turn benchmark: conversations whose prompt is the previous prompt + answer + a new user turn; " +
				"conversations start at rate=, each next turn arrives after an estimate of the previous one's service time plus think=",
			params: []param{
				{"conversations", "24", "number of conversations"},
				{"min-turns", "12", "fewest turns in a conversation"},
				{"max-turns", "18", "most turns in a conversation"},
				{"common", "500", "tokens of the prefix shared by all conversations"},
				{"prefix-mean", "1000", "mean tokens of each conversation's own prefix (lognormal, median 0.85 x mean)"},
				{"prefix-max", "5000", "cap on a conversation's own prefix"},
				{"min-user", "120", "fewest tokens in a user turn"},
				{"max-user", "160", "most tokens in a user turn"},
				{"min-output", "80", "fewest output tokens"},
				{"max-output", "120", "most output tokens"},
				{"think", "1s", "user think time between an answer and the next turn"},
				{"prefill", "10000", "prefill tokens per second assumed to estimate when an answer ends"},
				{"tpot", "20ms", "time per output token assumed to estimate when an answer ends"},
			},
			build: buildMultiTurn,
		},
		{
			name: "prefix-repetition",
			doc:  "vLLM prefix_repetition: n prompts, each one of a few shared prefixes plus its own suffix; shuffled",
			params: []param{
				{"prefixes", "10", "number of distinct prefixes"},
				{"prefix", "256", "prefix tokens"},
				{"suffix", "256", "suffix tokens"},
				{"output", "128", "output tokens"},
			},
			build: buildPrefixRepetition,
		},
		{
			name: "tool-agent",
			doc: "shaped after the Mooncake toolagent trace: agents with long tool prompts shared by all their sessions, " +
				"short sessions whose turns append the answer and a tool result; 512-token blocks",
			params: []param{
				{"agents", "32", "number of agents, each with its own tool prompt"},
				{"popularity", "1", "Zipf exponent of the agents' popularity (0: all equally popular)"},
				{"tools", "3700", "mean tokens of an agent's tool prompt (lognormal)"},
				{"task", "4450", "mean tokens of a session's task, after the tool prompt (lognormal)"},
				{"result", "1100", "mean tokens of a tool result, appended to each later turn (lognormal)"},
				{"output", "182", "mean output tokens (lognormal)"},
				{"turns", "1.6", "mean turns per session (1 + geometric)"},
				{"tool-time", "2s", "mean time a tool takes before the next turn (exponential)"},
				{"duration", "59m", "span over which sessions start"},
			},
			build: buildToolAgent,
		},
		{
			name: "unique",
			doc:  "no shared prefixes: every prompt its own content, lengths lognormal; Poisson arrivals",
			params: []param{
				{"input", "2048", "mean prompt tokens"},
				{"output", "256", "mean output tokens"},
				{"spread", "0.8", "sigma of the lognormal lengths (0: all equal)"},
			},
			build: buildUnique,
		},
	}
}

// WorkloadNames returns the names Generate accepts, sorted.
func WorkloadNames() []string {
	var names []string
	for _, g := range generators() {
		names = append(names, g.name)
	}
	sort.Strings(names)
	return names
}

// WorkloadHelp describes each generator and its keys with their defaults, one line each.
func WorkloadHelp() string {
	var b strings.Builder
	for _, g := range generators() {
		fmt.Fprintf(&b, "%s: %s\n", g.name, g.doc)
		for _, p := range append(slices.Clone(g.params), commonParams()...) {
			fmt.Fprintf(&b, "  %s=%s\t%s\n", p.key, p.def, p.doc)
		}
	}
	return b.String()
}

// Generate builds the workload a spec names: "name" or "name:key=value,key=value" (see
// WorkloadNames and WorkloadHelp). Every generator takes n= (the number of requests; 0 is the
// generator's default) and rate= (Poisson arrivals per second, DefaultRate when absent; the
// multi-turn generator starts conversations at that rate and times each later turn at an
// estimate of when the previous answer ends plus a think time: an estimate, since the replay
// sends each turn at its arrival whatever the fleet really did; the tool-agent generator starts
// its sessions over duration= instead). Blocks are GeneratedBlockTokens tokens
// (ToolAgentBlockTokens for tool-agent), ids are chained content hashes, and the result, in arrival
// order with IDs 0, 1, ..., depends only on spec and seed. An unknown name or key, or a bad
// value, is an error that lists what is valid.
func Generate(spec string, seed uint64) ([]Request, error) {
	name, rest, _ := strings.Cut(strings.TrimSpace(spec), ":")
	var gen *generator
	gens := generators()
	for i := range gens {
		if gens[i].name == name {
			gen = &gens[i]
		}
	}
	if gen == nil {
		return nil, fmt.Errorf("workload %q: unknown name, %swant one of %s", name, didYouMean(name, WorkloadNames()), strings.Join(WorkloadNames(), ", "))
	}
	p, err := parseParams(gen, rest)
	if err != nil {
		return nil, fmt.Errorf("workload %s: %w", name, err)
	}
	reqs, err := gen.build(p, seed)
	if err == nil {
		err = p.err()
	}
	if err != nil {
		return nil, fmt.Errorf("workload %s: %w", name, err)
	}
	for i := range reqs {
		reqs[i].ID = i
	}
	return reqs, nil
}

// params holds a spec's values over the generator's defaults and collects bad values.
type params struct {
	values map[string]string
	errs   []error
}

func parseParams(gen *generator, s string) (*params, error) {
	p := &params{values: map[string]string{}}
	var valid []string
	for _, d := range append(slices.Clone(gen.params), commonParams()...) {
		p.values[d.key] = d.def
		valid = append(valid, d.key)
	}
	seen := map[string]bool{}
	for _, kv := range strings.Split(s, ",") {
		kv = strings.TrimSpace(kv)
		if kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if _, known := p.values[k]; !known {
			return nil, fmt.Errorf("unknown key %q, %swant one of %s", k, didYouMean(k, valid), strings.Join(valid, ", "))
		}
		if !ok || v == "" {
			return nil, fmt.Errorf("key %s: no value, write %s=VALUE", k, k)
		}
		if seen[k] {
			return nil, fmt.Errorf("key %s: given twice", k)
		}
		seen[k] = true
		p.values[k] = v
	}
	return p, nil
}

// didYouMean is `did you mean "near"? ` for the one of names nearest to a misspelt name
// (suggest.Nearest, as the config's unknown keys are said), or "".
func didYouMean(name string, names []string) string {
	if near := suggest.Nearest(name, names); near != "" {
		return fmt.Sprintf("did you mean %q? ", near)
	}
	return ""
}

func (p *params) err() error { return errors.Join(p.errs...) }

// int returns key's value as an integer of at least lo.
func (p *params) int(key string, lo int) int {
	v, err := strconv.Atoi(p.values[key])
	if err != nil || v < lo || v > maxTokens {
		p.errs = append(p.errs, fmt.Errorf("key %s: %q, want an integer from %d to %d", key, p.values[key], lo, maxTokens))
		return lo
	}
	return v
}

// positive returns key's value as a finite number above 0.
func (p *params) positive(key string) float64 {
	v, err := strconv.ParseFloat(p.values[key], 64)
	if err != nil || !(v > 0) || math.IsInf(v, 0) {
		p.errs = append(p.errs, fmt.Errorf("key %s: %q, want a number above 0", key, p.values[key]))
		return 1
	}
	return v
}

// nonNegative returns key's value as a finite number of at least 0.
func (p *params) nonNegative(key string) float64 {
	v, err := strconv.ParseFloat(p.values[key], 64)
	if err != nil || !(v >= 0) || math.IsInf(v, 0) {
		p.errs = append(p.errs, fmt.Errorf("key %s: %q, want a number of at least 0", key, p.values[key]))
		return 0
	}
	return v
}

// bool returns key's value as true or false.
func (p *params) bool(key string) bool {
	v, err := strconv.ParseBool(p.values[key])
	if err != nil {
		p.errs = append(p.errs, fmt.Errorf("key %s: %q, want true or false", key, p.values[key]))
	}
	return v
}

// duration returns key's value as a Go duration of at least 0 ("1s", "250ms").
func (p *params) duration(key string) time.Duration {
	v, err := time.ParseDuration(p.values[key])
	if err != nil || v < 0 {
		p.errs = append(p.errs, fmt.Errorf("key %s: %q, want a duration >= 0 such as 1s or 250ms", key, p.values[key]))
		return 0
	}
	return v
}

// span returns a [lo, hi] pair of keys, checking lo <= hi.
func (p *params) span(loKey, hiKey string, least int) (int, int) {
	lo, hi := p.int(loKey, least), p.int(hiKey, least)
	if lo > hi {
		p.errs = append(p.errs, fmt.Errorf("key %s: %d above %s %d", loKey, lo, hiKey, hi))
	}
	return lo, max(lo, hi)
}

// part is a run of prompt tokens with one content identity (a system prompt, a question).
type part struct {
	key    uint64
	tokens int
}

// partKey names a part's content from the seed and its role and indices.
func partKey(seed uint64, role string, a, b int) uint64 {
	var buf [24]byte
	binary.LittleEndian.PutUint64(buf[:8], seed)
	binary.LittleEndian.PutUint64(buf[8:16], uint64(a))
	binary.LittleEndian.PutUint64(buf[16:], uint64(b))
	d := xxhash.New()
	_, _ = d.WriteString(role)
	_, _ = d.Write(buf[:])
	return d.Sum64()
}

// promptOf turns parts into a request's blocks and prompt length: each block of
// GeneratedBlockTokens tokens (the last may be partial) hashes the pieces of the parts it
// covers, chained with the previous block's id, so equal token prefixes give equal leading ids
// and a partial block differs from the full one that later extends it.
func promptOf(segs []part) ([]uint64, int) { return promptBlocks(segs, GeneratedBlockTokens) }

// promptBlocks is promptOf with blocks of blockTokens tokens.
func promptBlocks(segs []part, blockTokens int) ([]uint64, int) {
	total := 0
	for _, s := range segs {
		total += s.tokens
	}
	blocks := make([]uint64, 0, (total+blockTokens-1)/blockTokens)
	var id uint64
	d := xxhash.New()
	var buf [24]byte
	si, off := 0, 0 // current part and offset inside it
	for start := 0; start < total; start += blockTokens {
		d.Reset()
		for need := min(blockTokens, total-start); need > 0; {
			for segs[si].tokens == off {
				si, off = si+1, 0
			}
			n := min(need, segs[si].tokens-off)
			binary.LittleEndian.PutUint64(buf[:8], segs[si].key)
			binary.LittleEndian.PutUint64(buf[8:16], uint64(off))
			binary.LittleEndian.PutUint64(buf[16:], uint64(n))
			_, _ = d.Write(buf[:])
			off += n
			need -= n
		}
		id = prefix.Next(id, d.Sum64())
		blocks = append(blocks, id)
	}
	return blocks, total
}

func newRand(seed uint64, stream string) *rand.Rand {
	return rand.New(rand.NewPCG(seed, xxhash.Sum64String(stream)))
}

// maxRequests and maxWorkloadTokens bound a generated workload (about 1 GiB of block ids).
const (
	maxRequests       = 1 << 24
	maxWorkloadTokens = 1 << 31
)

// capTokens records an error when a workload would hold more prompt tokens than we generate.
func (p *params) capTokens(tokens int64, keys string) {
	if tokens > maxWorkloadTokens {
		p.errs = append(p.errs, fmt.Errorf("keys %s: up to %d prompt tokens in all, want at most %d", keys, tokens, int64(maxWorkloadTokens)))
	}
}

// limit applies n to a count: 0 keeps def; above max is an error.
func limit(p *params, def, most int) int {
	n := p.int("n", 0)
	if n == 0 {
		return def
	}
	if n > most {
		p.errs = append(p.errs, fmt.Errorf("key n: %d above the %d requests this workload has; raise its size keys", n, most))
		return most
	}
	return n
}

func buildSharedPrefix(p *params, seed uint64) ([]Request, error) {
	groups, prompts := p.int("groups", 1), p.int("prompts", 1)
	system, question, output := p.int("system", 0), p.int("question", 0), p.int("output", 1)
	rate, ordered, zipf := p.positive("rate"), p.bool("ordered"), p.nonNegative("zipf")
	if system+question < 1 {
		p.errs = append(p.errs, errors.New("keys system, question: both 0, want a prompt of at least 1 token"))
	}
	if zipf > 0 && ordered {
		p.errs = append(p.errs, errors.New("keys zipf, ordered: a Zipf draw has no group order, give one of them"))
	}
	if groups*prompts > maxRequests {
		p.errs = append(p.errs, fmt.Errorf("keys groups, prompts: %d requests, want at most %d", groups*prompts, maxRequests))
	} else if zipf == 0 {
		p.capTokens(int64(groups)*int64(prompts)*int64(system+question), "groups, prompts, system, question")
	}
	if err := p.err(); err != nil {
		return nil, err
	}
	prompt := func(g, q int) Request {
		blocks, tokens := promptOf([]part{
			{partKey(seed, "shared-prefix/system", g, 0), system},
			{partKey(seed, "shared-prefix/question", g, q), question},
		})
		return Request{Blocks: blocks, BlockTokens: GeneratedBlockTokens, PromptTokens: tokens, OutputTokens: output}
	}
	if zipf > 0 {
		// Each prompt draws its group: a few groups take most of the traffic, as SGLang's
		// benchmark does with a Zipf group popularity.
		n := limit(p, groups*prompts, maxRequests)
		p.capTokens(int64(n)*int64(system+question), "n, system, question")
		if err := p.err(); err != nil {
			return nil, err
		}
		draw := zipfDraw(newRand(seed, "shared-prefix/zipf"), groups, zipf)
		uses := make([]int, groups)
		reqs := make([]Request, 0, n)
		for range n {
			g := draw()
			reqs = append(reqs, prompt(g, uses[g]))
			uses[g]++
		}
		return Poisson(reqs, rate, seed), nil
	}
	n := limit(p, groups*prompts, groups*prompts)
	reqs := make([]Request, 0, groups*prompts)
	for g := 0; g < groups; g++ {
		for q := 0; q < prompts; q++ {
			reqs = append(reqs, prompt(g, q))
		}
	}
	if !ordered {
		rng := newRand(seed, "shared-prefix/shuffle")
		rng.Shuffle(len(reqs), func(i, j int) { reqs[i], reqs[j] = reqs[j], reqs[i] })
	}
	return Poisson(reqs[:n], rate, seed), nil
}

// zipfDraw returns a function that draws one of n items, item k (from 0) with probability
// proportional to 1/(k+1)^s.
func zipfDraw(rng *rand.Rand, n int, s float64) func() int {
	cdf := make([]float64, n)
	var total float64
	for k := range cdf {
		total += math.Pow(float64(k+1), -s)
		cdf[k] = total
	}
	return func() int {
		u := rng.Float64() * total
		return min(sort.SearchFloat64s(cdf, u), n-1)
	}
}

// buildUnique builds prompts that share nothing, not even a first block.
func buildUnique(p *params, seed uint64) ([]Request, error) {
	input, output := p.int("input", 1), p.int("output", 1)
	spread, rate := p.nonNegative("spread"), p.positive("rate")
	n := limit(p, 2000, maxRequests)
	p.capTokens(int64(n)*int64(input)*lognormalCap, "n, input")
	if err := p.err(); err != nil {
		return nil, err
	}
	rng := newRand(seed, "unique")
	reqs := make([]Request, 0, n)
	for i := range n {
		blocks, tokens := promptOf([]part{{partKey(seed, "unique/prompt", i, 0), lognormal(rng, input, spread)}})
		reqs = append(reqs, Request{Blocks: blocks, BlockTokens: GeneratedBlockTokens, PromptTokens: tokens, OutputTokens: lognormal(rng, output, spread)})
	}
	return Poisson(reqs, rate, seed), nil
}

// lognormalCap bounds a lognormal draw, as a multiple of its mean: a few very long prompts are
// realistic, one of a hundred times the mean is not.
const lognormalCap = 8

// lognormal draws a length with the given mean and sigma (0: always the mean), at least 1 and
// at most lognormalCap x mean.
func lognormal(rng *rand.Rand, mean int, sigma float64) int {
	if sigma == 0 {
		return mean
	}
	mu := math.Log(float64(mean)) - sigma*sigma/2
	v := math.Round(math.Exp(mu + sigma*rng.NormFloat64()))
	return int(min(max(v, 1), float64(mean)*lognormalCap))
}

func buildPrefixRepetition(p *params, seed uint64) ([]Request, error) {
	prefixes, prefixLen, suffix, output := p.int("prefixes", 1), p.int("prefix", 0), p.int("suffix", 0), p.int("output", 1)
	rate := p.positive("rate")
	if prefixLen+suffix < 1 {
		p.errs = append(p.errs, errors.New("keys prefix, suffix: both 0, want a prompt of at least 1 token"))
	}
	n := limit(p, 1000, maxRequests)
	p.capTokens(int64(n)*int64(prefixLen+suffix), "n, prefix, suffix")
	if err := p.err(); err != nil {
		return nil, err
	}
	reqs := make([]Request, 0, n)
	for i := 0; i < n; i++ {
		blocks, tokens := promptOf([]part{
			{partKey(seed, "prefix-repetition/prefix", i%prefixes, 0), prefixLen},
			{partKey(seed, "prefix-repetition/suffix", i, 0), suffix},
		})
		reqs = append(reqs, Request{Blocks: blocks, BlockTokens: GeneratedBlockTokens, PromptTokens: tokens, OutputTokens: output})
	}
	rng := newRand(seed, "prefix-repetition/shuffle")
	rng.Shuffle(len(reqs), func(i, j int) { reqs[i], reqs[j] = reqs[j], reqs[i] })
	return Poisson(reqs, rate, seed), nil
}

// buildMultiTurn builds conversations turn by turn. A turn's arrival is an estimate: the
// previous turn's arrival plus its unloaded service time (prompt/prefill + output*tpot) plus
// the think time. The simulator sends each turn at its arrival whether or not the previous
// answer has really ended, so under load turns may overlap; that keeps replays open-loop.
func buildMultiTurn(p *params, seed uint64) ([]Request, error) {
	convs := p.int("conversations", 1)
	minTurns, maxTurns := p.span("min-turns", "max-turns", 1)
	common := p.int("common", 0)
	prefixMean, prefixMax := p.int("prefix-mean", 1), p.int("prefix-max", 1)
	minUser, maxUser := p.span("min-user", "max-user", 1)
	minOut, maxOut := p.span("min-output", "max-output", 1)
	think, tpot := p.duration("think"), p.duration("tpot")
	prefill, rate := p.positive("prefill"), p.positive("rate")
	if convs*maxTurns > maxRequests {
		p.errs = append(p.errs, fmt.Errorf("keys conversations, max-turns: up to %d requests, want at most %d", convs*maxTurns, maxRequests))
	} else {
		// The longest conversation's last prompt bounds every prompt.
		longest := int64(common+prefixMax) + int64(maxTurns)*int64(maxUser+maxOut)
		p.capTokens(int64(convs)*int64(maxTurns)*longest, "conversations, max-turns, common, prefix-max, max-user, max-output")
	}
	n := p.int("n", 0)
	if err := p.err(); err != nil {
		return nil, err
	}
	rng := newRand(seed, "multi-turn")
	// Lognormal with the given mean and a median of 0.85 x mean: mu = ln(0.85 mean),
	// sigma^2 = 2 (ln mean - mu).
	mu := math.Log(0.85 * float64(prefixMean))
	sigma := math.Sqrt(2 * (math.Log(float64(prefixMean)) - mu))
	var reqs []Request
	var start float64 // seconds
	for c := 0; c < convs; c++ {
		if c > 0 {
			start += rng.ExpFloat64() / rate
		}
		own := int(math.Round(math.Exp(mu + sigma*rng.NormFloat64())))
		own = min(max(own, 1), prefixMax)
		turns := minTurns + rng.IntN(maxTurns-minTurns+1)
		segs := []part{
			{partKey(seed, "multi-turn/common", 0, 0), common},
			{partKey(seed, "multi-turn/conversation", c, 0), own},
		}
		at := time.Duration(math.Round(start * float64(time.Second)))
		for k := 0; k < turns; k++ {
			segs = append(segs, part{partKey(seed, "multi-turn/user", c, k), minUser + rng.IntN(maxUser-minUser+1)})
			out := minOut + rng.IntN(maxOut-minOut+1)
			blocks, tokens := promptOf(segs)
			reqs = append(reqs, Request{
				Arrival: at, Session: fmt.Sprintf("conversation-%d", c),
				Blocks: blocks, BlockTokens: GeneratedBlockTokens, PromptTokens: tokens, OutputTokens: out,
			})
			service := time.Duration(float64(tokens)/prefill*float64(time.Second)) + time.Duration(out)*tpot
			at += service + think
			segs = append(segs, part{partKey(seed, "multi-turn/answer", c, k), out})
		}
	}
	slices.SortStableFunc(reqs, func(a, b Request) int { return cmp.Compare(a.Arrival, b.Arrival) })
	if n > 0 && n < len(reqs) {
		reqs = reqs[:n]
	}
	return reqs, nil
}
