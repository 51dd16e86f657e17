package workload

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/kvroute/kvroute/internal/prefix"
)

// Percentiles summarises a length distribution in tokens. A percentile p is the value of rank
// floor(p*(n-1)) in ascending order (numpy's "lower" method), so it is always a seen value.
type Percentiles struct {
	P50  int     `json:"p50"`
	P90  int     `json:"p90"`
	P99  int     `json:"p99"`
	Max  int     `json:"max"`
	Mean float64 `json:"mean"`
}

func percentiles(v []int) Percentiles {
	if len(v) == 0 {
		return Percentiles{}
	}
	s := slices.Clone(v)
	slices.Sort(s)
	at := func(p float64) int { return s[int(p*float64(len(s)-1))] }
	var sum int64
	for _, x := range s {
		sum += int64(x)
	}
	return Percentiles{P50: at(0.5), P90: at(0.9), P99: at(0.99), Max: s[len(s)-1], Mean: float64(sum) / float64(len(s))}
}

// Repeat is the share of requests whose first Blocks workload blocks an earlier request already sent.
type Repeat struct {
	Blocks int     `json:"blocks"`
	Share  float64 `json:"share"`
}

// RepeatBlocks are the prefix lengths, in workload blocks, that Stats.Repeats reports.
func RepeatBlocks() []int { return []int{1, 2, 4, 8} }

// AnalyzeOptions says how to measure the cache bounds.
type AnalyzeOptions struct {
	// BlockSize is the engine's KV block size in tokens (vLLM: 16); at least 1.
	BlockSize int
	// CapacityTokens is the fleet's pooled KV capacity in tokens (instances x per-instance
	// tokens), the size of the LRU bound; 0 skips it.
	CapacityTokens int
	// Instances, when above 0 with CapacityTokens, adds the hit rate of random placement over
	// that many instances of CapacityTokens/Instances tokens each, drawn from Seed.
	Instances int
	Seed      uint64
}

// Stats is what `kvroute analyze` reports about a workload.
type Stats struct {
	Requests    int           `json:"requests"`
	Duration    time.Duration `json:"duration_ns"` // first to last arrival
	Rate        float64       `json:"rate_per_s"`  // requests per second over Duration; 0 when Duration is 0
	Prompt      Percentiles   `json:"prompt_tokens"`
	Output      Percentiles   `json:"output_tokens"`
	PromptTotal int64         `json:"prompt_tokens_total"`
	BlockTokens int           `json:"block_tokens"` // the workload's block size; 0 when requests differ
	// DistinctBlocks counts distinct prefixes-up-to-a-block (workload blocks at their position).
	DistinctBlocks int `json:"distinct_blocks"`
	// WorkingSetTokens is the tokens those blocks hold: what a cache needs to keep every prefix.
	WorkingSetTokens int64 `json:"working_set_tokens"`
	// CommonBlocks is the number of leading workload blocks every request shares (a system prompt).
	CommonBlocks int `json:"common_blocks"`
	// Repeats gives, for each of RepeatBlocks, the share of requests repeating that many blocks.
	Repeats []Repeat `json:"repeats"`
	// RepeatBeyondCommon is the share of requests that repeat more than CommonBlocks blocks: the
	// reuse that placement decides (a prefix every request shares is cached everywhere anyway).
	RepeatBeyondCommon float64 `json:"repeat_beyond_common"`
	// CommonHitShare is the share of prompt tokens any cache serves from that common prefix
	// alone, wherever requests go (whole engine blocks, every request but the first).
	CommonHitShare float64 `json:"common_hit_share"`
	BlockSize      int     `json:"engine_block_size"`
	CapacityTokens int     `json:"capacity_tokens"`
	// InfiniteHitRate and LRUHitRate are InfiniteCacheHitRate and LRUHitRate (pooled capacity).
	InfiniteHitRate float64 `json:"infinite_hit_rate"`
	LRUHitRate      float64 `json:"lru_hit_rate"`
	// Instances and RandomHitRate: RandomPlacementHitRate over Instances caches sharing the
	// capacity; 0 when AnalyzeOptions.Instances is 0.
	Instances     int     `json:"instances"`
	RandomHitRate float64 `json:"random_placement_hit_rate"`
	// Findings says what these figures show about placement (how many points of hit rate it
	// can add at most), without judging one policy against another.
	Findings string `json:"findings"`
	// Verdict is what the statistics alone decide about prefix-aware routing: that it cannot
	// pay off through the cache where no prefix is repeated or there is one instance; elsewhere,
	// that it takes a simulation (kvroute analyze runs one when given the fleet).
	Verdict string `json:"verdict"`
}

// Analyze measures a workload: sizes, timing, prefix reuse and the cache bounds, what they show
// about placement, and what they decide about prefix-aware routing. A BlockSize below 1 is
// taken as 16.
func Analyze(reqs []Request, opt AnalyzeOptions) Stats {
	if opt.BlockSize < 1 {
		opt.BlockSize = 16
	}
	s := Stats{Requests: len(reqs), BlockSize: opt.BlockSize, CapacityTokens: opt.CapacityTokens}
	if len(reqs) == 0 {
		s.Findings, s.Verdict = s.findings(), s.verdict()
		return s
	}
	order := arrivalOrder(reqs)
	s.Duration = reqs[order[len(order)-1]].Arrival - reqs[order[0]].Arrival
	if s.Duration > 0 {
		s.Rate = float64(len(reqs)) / s.Duration.Seconds()
	}
	prompts, outputs := make([]int, len(reqs)), make([]int, len(reqs))
	s.BlockTokens = reqs[0].BlockTokens
	for i := range reqs {
		prompts[i], outputs[i] = reqs[i].PromptTokens, reqs[i].OutputTokens
		s.PromptTotal += int64(reqs[i].PromptTokens)
		if reqs[i].BlockTokens != s.BlockTokens {
			s.BlockTokens = 0
		}
	}
	s.Prompt, s.Output = percentiles(prompts), percentiles(outputs)

	// tokens maps each prefix-up-to-a-block (chained hash) to the most tokens a request had in it.
	tokens := map[uint64]int{}
	repeats := make([]int, len(RepeatBlocks()))
	var runs []int
	common := -1
	var first []uint64 // the first request's chained hashes, to find the common prefix
	for n, i := range order {
		r := &reqs[i]
		run, missed := 0, false
		var h uint64
		for b, id := range r.Blocks {
			h = prefix.Next(h, id)
			in := min(r.BlockTokens, r.PromptTokens-b*r.BlockTokens)
			if in <= 0 {
				break
			}
			held, ok := tokens[h]
			if !missed && ok {
				run++
			} else {
				missed = true
			}
			if !ok || in > held {
				tokens[h] = in
			}
			if n == 0 {
				first = append(first, h)
			} else if b < common && h != first[b] {
				common = b
			}
		}
		if n == 0 {
			common = len(first)
		} else {
			common = min(common, len(r.Blocks))
		}
		for k, want := range RepeatBlocks() {
			if run >= want {
				repeats[k]++
			}
		}
		runs = append(runs, run)
	}
	s.CommonBlocks = max(common, 0)
	if len(reqs) == 1 {
		s.CommonBlocks = 0 // nothing is shared with anyone
	}
	for _, t := range tokens {
		s.WorkingSetTokens += int64(t)
	}
	s.DistinctBlocks = len(tokens)
	for k, want := range RepeatBlocks() {
		s.Repeats = append(s.Repeats, Repeat{Blocks: want, Share: float64(repeats[k]) / float64(len(reqs))})
	}
	beyond := 0
	for _, run := range runs {
		if run > s.CommonBlocks {
			beyond++
		}
	}
	s.RepeatBeyondCommon = float64(beyond) / float64(len(reqs))
	if s.BlockTokens > 0 && len(reqs) > 1 {
		var commonHit int64
		for _, i := range order[1:] {
			commonHit += int64(min(s.CommonBlocks*s.BlockTokens, reqs[i].PromptTokens) / opt.BlockSize * opt.BlockSize)
		}
		s.CommonHitShare = float64(commonHit) / float64(s.PromptTotal)
	}
	s.InfiniteHitRate = InfiniteCacheHitRate(reqs, opt.BlockSize)
	if opt.CapacityTokens > 0 {
		s.LRUHitRate = LRUHitRate(reqs, opt.BlockSize, opt.CapacityTokens)
		if opt.Instances > 0 {
			s.Instances = opt.Instances
			s.RandomHitRate = RandomPlacementHitRate(reqs, opt.BlockSize, opt.Instances, opt.CapacityTokens/opt.Instances, opt.Seed)
		}
	}
	s.Findings, s.Verdict = s.findings(), s.verdict()
	return s
}

// findings says what the statistics show about placement, in figures: how many requests repeat
// a prefix, what a cache of the fleet's size could serve, what random routing gets, and so how
// many points of hit rate placement can add at most; then the warnings the workload calls for.
// It judges no policy against another: TTFT also depends on the arrival rate, the load and the
// prompt lengths, which these statistics do not weigh.
func (s Stats) findings() string {
	if s.Requests == 0 {
		return "no requests"
	}
	repeat := fmt.Sprintf("%.1f%% of requests repeat a prefix", 100*s.RepeatBeyondCommon)
	if s.CommonBlocks > 0 {
		repeat += fmt.Sprintf(" longer than the %d block(s) all requests share", s.CommonBlocks)
	}
	hit, where := s.InfiniteHitRate, "an unbounded cache"
	if s.CapacityTokens > 0 {
		hit, where = s.LRUHitRate, "a cache of the fleet's pooled size"
	}
	cached := fmt.Sprintf("%s could serve %.1f%% of prompt tokens (an unbounded one %.1f%%)", where, 100*hit, 100*s.InfiniteHitRate)
	if s.CommonHitShare > 0 {
		cached += fmt.Sprintf(", %.1f%% beyond the shared prefix", 100*max(hit-s.CommonHitShare, 0))
	}
	parts := []string{repeat, cached}
	if s.Instances > 0 {
		parts = append(parts, fmt.Sprintf("routing at random over %d instances hits %.1f%%, so placement can add at most %.1f points of hit rate to it",
			s.Instances, 100*s.RandomHitRate, 100*max(hit-s.RandomHitRate, 0)))
	}
	if s.CapacityTokens > 0 && s.WorkingSetTokens > 2*int64(s.CapacityTokens) {
		parts = append(parts, fmt.Sprintf("the working set (%s tokens) is %.1fx the fleet's KV cache (%s tokens): eviction will cut hits, so capacity and eviction matter as much as placement",
			humanCount(float64(s.WorkingSetTokens)), float64(s.WorkingSetTokens)/float64(s.CapacityTokens), humanCount(float64(s.CapacityTokens))))
	}
	if s.CommonBlocks > 0 && s.Requests > 1 {
		parts = append(parts, fmt.Sprintf("every request starts with the same %d block(s): a router that keys on the first block or the first characters alone sends all traffic to one instance", s.CommonBlocks))
	}
	return strings.Join(parts, "; ")
}

// NoReuse says that no request repeats a prefix beyond the one every request shares (which
// every instance caches after its first request, wherever requests go): placement changes no
// cache hit but those of each instance's first request, so routing by prefix wins next to
// nothing.
func (s Stats) NoReuse() bool { return s.Requests > 0 && s.RepeatBeyondCommon == 0 }

// verdict is what the statistics alone decide. They decide only where placement cannot change
// a single cache hit: no prefix is repeated beyond the shared one, or there is one instance.
// Everywhere else they bound what placement can win in hit rate, not what that is worth against
// load-aware routing, so the verdict says it takes a simulation (no cut-off on the hit rates:
// one flipped the answer between two slices of the same traffic).
func (s Stats) verdict() string {
	switch {
	case s.Requests == 0:
		return "no requests: nothing to route."
	case s.NoReuse() && s.CommonBlocks == 0:
		return "prefix-aware routing will not pay off through the cache: no request repeats a prefix, so where a request goes does not change its cache hits."
	case s.NoReuse():
		return fmt.Sprintf("prefix-aware routing will not pay off through the cache: no request repeats a prefix beyond the %d block(s) all requests share, which each instance caches after its first request, so where a request goes changes no cache hit but those first ones.", s.CommonBlocks)
	case s.Instances == 1:
		return "with one instance there is nothing to place: every router sends every request to it."
	}
	return "these statistics bound the cache hits placement can win, not whether prefix-aware routing beats load-aware routing (least-request): that also depends on the arrival rate, the load and the spread of prompt lengths, which a simulation of the fleet measures."
}

// humanCount writes n with a k, M or G suffix.
func humanCount(n float64) string {
	switch {
	case n >= 1e9:
		return fmt.Sprintf("%.1fG", n/1e9)
	case n >= 1e6:
		return fmt.Sprintf("%.1fM", n/1e6)
	case n >= 1e3:
		return fmt.Sprintf("%.1fk", n/1e3)
	}
	return fmt.Sprintf("%.0f", n)
}
