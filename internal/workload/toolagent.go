package workload

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"
)

// ToolAgentBlockTokens is the block size of the tool-agent workload: the Mooncake traces' 512
// tokens, so that, as in them, a prefix is shared only in whole 512-token blocks.
const ToolAgentBlockTokens = 512

// The tool-agent generator times a session's next turn after an estimate of how long the
// previous answer took: its prompt at estPrefill tokens per second plus its output at estTPOT
// per token (the multi-turn generator's defaults), plus the tool's own time.
const (
	estPrefill = 10000.0
	estTPOT    = 20 * time.Millisecond
)

// maxSessionTokens ends a session whose prompt would outgrow a 128k context window.
const maxSessionTokens = 128 << 10

// buildToolAgent builds the tool-agent workload. Its defaults reproduce the published figures
// of the Mooncake toolagent trace (FAST'25, Table 1 of the paper and the trace release): 23,608
// requests over about 59 minutes, mean input 8,596 and mean output 182 tokens, 512-token hash
// blocks, a cache ratio (the hit rate of one infinite prefix cache) of about 59 %. Those figures
// constrain the shape: 59 % of 8,596 is about 5,070 cached tokens per request, and a prompt that
// carries its session's history grows with every turn, so sessions must be short (the history
// would otherwise push the ratio far higher) and most of the reuse is the agents' tool prompts.
// Sessions start as a Poisson process over duration=; each belongs to an agent drawn with Zipf
// popularity, so a few tool prompts are hot (everyone's traffic) and many are warm.
func buildToolAgent(p *params, seed uint64) ([]Request, error) {
	agents := p.int("agents", 1)
	popularity := p.nonNegative("popularity")
	tools, task, result, output := p.int("tools", 1), p.int("task", 1), p.int("result", 1), p.int("output", 1)
	turns := p.positive("turns")
	toolTime, duration := p.duration("tool-time"), p.duration("duration")
	n := limit(p, 23608, maxRequests)
	if turns < 1 {
		p.errs = append(p.errs, fmt.Errorf("key turns: %g, want at least 1 (turns per session)", turns))
	}
	if p.values["rate"] != strconv.FormatFloat(DefaultRate, 'g', -1, 64) {
		p.errs = append(p.errs, errors.New("key rate: tool-agent starts its sessions over duration=, give that instead"))
	}
	if duration <= 0 {
		p.errs = append(p.errs, errors.New("key duration: 0, want the span over which sessions start, such as 59m"))
	}
	if err := p.err(); err != nil {
		return nil, err
	}
	rng := newRand(seed, "tool-agent")
	toolLen := make([]int, agents)
	for a := range toolLen {
		toolLen[a] = lognormal(rng, tools, 0.3)
	}
	agent := zipfDraw(rng, agents, popularity)
	more := (turns - 1) / turns // chance of one more turn: mean turns in all
	sessionRate := float64(n) / turns / duration.Seconds()
	reqs := make([]Request, 0, n)
	var total int64
	var start float64 // seconds
	for s := 0; len(reqs) < n; s++ {
		if s > 0 {
			start += rng.ExpFloat64() / sessionRate
		}
		a := agent()
		segs := []part{
			{partKey(seed, "tool-agent/tools", a, 0), toolLen[a]},
			{partKey(seed, "tool-agent/task", s, 0), lognormal(rng, task, 0.8)},
		}
		at := time.Duration(math.Round(start * float64(time.Second)))
		for k := 0; len(reqs) < n; k++ {
			if k > 0 {
				segs = append(segs, part{partKey(seed, "tool-agent/result", s, k), lognormal(rng, result, 1)})
			}
			blocks, tokens := promptBlocks(segs, ToolAgentBlockTokens)
			if k > 0 && tokens > maxSessionTokens {
				break
			}
			if total += int64(tokens); total > maxWorkloadTokens {
				return nil, fmt.Errorf("keys n, tools, task, result, turns: more than %d prompt tokens in all", int64(maxWorkloadTokens))
			}
			out := lognormal(rng, output, 0.8)
			reqs = append(reqs, Request{
				Arrival: at, Session: fmt.Sprintf("agent-%d/session-%d", a, s),
				Blocks: blocks, BlockTokens: ToolAgentBlockTokens, PromptTokens: tokens, OutputTokens: out,
			})
			if rng.Float64() >= more {
				break
			}
			service := time.Duration(float64(tokens)/estPrefill*float64(time.Second)) + time.Duration(out)*estTPOT
			at += service + time.Duration(rng.ExpFloat64()*float64(toolTime))
			segs = append(segs, part{partKey(seed, "tool-agent/answer", s, k), out})
		}
	}
	slices.SortStableFunc(reqs, func(a, b Request) int { return cmp.Compare(a.Arrival, b.Arrival) })
	return reqs, nil
}
