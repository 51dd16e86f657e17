package scorecard

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/kvroute/kvroute/internal/des"
	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/workload"
)

// Loads are the offered loads every scenario runs at: the prefill work of its prompts without
// any cache hit, over the fleet's prefill capacity.
var Loads = []float64{0.5, 0.7, 0.9}

// A quick run (Options.Quick) runs every scenario once, at QuickLoad, on at most
// QuickRequests requests: the Mooncake trace's and tool-agent's cells are cut to their first
// arrivals (of 12,031 and 23,608 requests, 37 s and 90 s of simulation at load 0.7 on this
// machine, most of a full seed's time), the others are whole (249 to 2,000 requests). Fewer
// is rougher: caches start cold, which weighs more the shorter the run (the trace's first
// 2,000 or 3,000 requests gave prefix-aware 0.95 and 0.97 of the hit-rate bound, where 4,000
// and the whole trace give 0.98 or more). QuickDuration is about how long a quick run takes
// on 2 idle cores.
const (
	QuickLoad     = 0.7
	QuickRequests = 4000
	QuickDuration = 20 * time.Second
)

// Scenario is one row of the matrix: a workload on a fleet. At each load it is a cell.
type Scenario struct {
	// Name names it in reports.
	Name string
	// Workload is a workload.Generate spec; empty for the Mooncake conversation trace.
	Workload string
	// Fleet lists the instances, in groups.
	Fleet []Group
	// Start is how many instances (the first ones) serve from the start; the others are added
	// at half the arrivals' span. 0: all from the start.
	Start int
	// NoSharing marks a workload without shared prefixes: there the subject policy must match
	// least-request rather than win on hits.
	NoSharing bool
	// Note says why the scenario is in the matrix and what it was derived from.
	Note string
}

// Group is a number of instances of one engine profile, optionally slowed down.
type Group struct {
	Count   int
	Profile string
	// Slowdown multiplies every step time of these instances (0 or 1: as the profile says);
	// their KV capacity is the profile's.
	Slowdown float64
}

// Trace reports whether the scenario replays the Mooncake conversation trace.
func (s *Scenario) Trace() bool { return s.Workload == "" }

// FleetName describes the fleet, as "4 x llama3-70b-h200-tp8 + 4 x llama3-70b-h100-tp4".
func (s *Scenario) FleetName() string {
	parts := make([]string, len(s.Fleet))
	for i, g := range s.Fleet {
		parts[i] = fmt.Sprintf("%d x %s", g.Count, g.Profile)
		if g.Slowdown > 1 {
			parts[i] += fmt.Sprintf(" at 1/%g speed", g.Slowdown)
		}
	}
	name := strings.Join(parts, " + ")
	if s.Start > 0 {
		name = fmt.Sprintf("%s, %d of them from the start, the others added at half time", name, s.Start)
	}
	return name
}

const (
	h200 = "llama3-70b-h200-tp8"
	h100 = "llama3-70b-h100-tp4"
	// sessionsWorkload is the multi-turn shape of the fleet scenarios: S3's conversations,
	// four times as many, so that 8 instances hold a dozen each and placement is not lumpy.
	sessionsWorkload = "multi-turn:conversations=96"
)

// Matrix returns the scenarios, in report order.
func Matrix() []Scenario {
	return []Scenario{
		{
			Name:     "inference-perf 150x5",
			Workload: "shared-prefix:groups=150,prompts=5,system=6000,question=1200,output=1000",
			Fleet:    []Group{{Count: 8, Profile: h100}},
			Note:     "inference-perf shared_prefix, the llm-d capacity shape: 150 system prompts of 6000 tokens, 5 questions of 1200 each, 1000 out",
		},
		{
			Name:     "inference-perf 83x3",
			Workload: "shared-prefix:groups=83,prompts=3,system=8000,question=1000,output=1000",
			Fleet:    []Group{{Count: 4, Profile: h100}},
			Note:     "inference-perf shared_prefix on a small fleet: 83 system prompts of 8000 tokens, 3 questions of 1000 each",
		},
		{
			Name:     "sglang gsp",
			Workload: "shared-prefix",
			Fleet:    []Group{{Count: 8, Profile: h200}},
			Note:     "SGLang generated-shared-prefix defaults: 64 groups x 16 prompts, 2048-token system prompt, 128-token question, 256 out",
		},
		{
			Name:     "sglang gsp zipf",
			Workload: "shared-prefix:zipf=1.1",
			Fleet:    []Group{{Count: 8, Profile: h200}},
			Note:     "the same with Zipf group popularity (exponent 1.1): a few system prompts take most of the traffic",
		},
		{
			Name:  "mooncake conversation",
			Fleet: []Group{{Count: 8, Profile: h200}},
			Note:  "the Mooncake conversation trace (Kimi production traffic, 12,031 requests, one hour): S1",
		},
		{
			Name:     "tool-agent",
			Workload: "tool-agent",
			Fleet:    []Group{{Count: 8, Profile: h200}},
			Note:     "shaped after the Mooncake toolagent trace: 23,608 requests, mean input 8,596 tokens, cache ratio 0.59, 512-token blocks",
		},
		{
			Name:     "agentic scale-up",
			Workload: "multi-turn:conversations=96,rate=0.5,min-turns=8,max-turns=24,common=3000,prefix-mean=2000,prefix-max=8000,min-user=100,max-user=1000,min-output=50,max-output=200,think=500ms",
			Fleet:    []Group{{Count: 8, Profile: h200}},
			Start:    4,
			Note:     "agent sessions (a 3000-token shared tool prompt, tool results of 100-1000 tokens a turn) while the fleet scales from 4 to 8 instances at half time",
		},
		{
			Name:     "mixed fleet",
			Workload: sessionsWorkload,
			Fleet:    []Group{{Count: 4, Profile: h200}, {Count: 4, Profile: h100}},
			Note:     "mixed hardware: an H100 TP4 instance has a fifth of an H200 TP8's KV and half its speed",
		},
		{
			Name:     "one slow instance",
			Workload: sessionsWorkload,
			Fleet:    []Group{{Count: 1, Profile: h200, Slowdown: 2}, {Count: 7, Profile: h200}},
			Note:     "one instance at half speed (a degraded GPU, a noisy neighbour); the router is not told",
		},
		{
			Name:      "no sharing",
			Workload:  "unique",
			Fleet:     []Group{{Count: 8, Profile: h200}},
			NoSharing: true,
			Note:      "2,000 prompts that share nothing (lognormal lengths, mean 2048 in, 256 out): prefix-aware must not lose to least-request",
		},
	}
}

// profiles returns the profile of each instance, in instance order.
func (s *Scenario) profiles() ([]engine.Profile, error) {
	var out []engine.Profile
	var errs []error
	for _, g := range s.Fleet {
		p, err := engine.LookupProfile(g.Profile)
		if err != nil {
			errs = append(errs, fmt.Errorf("scenario %s: %w", s.Name, err))
			continue
		}
		if g.Slowdown > 1 {
			p = slowed(p, g.Slowdown)
		}
		for range g.Count {
			out = append(out, p)
		}
	}
	if len(out) == 0 && len(errs) == 0 {
		errs = append(errs, fmt.Errorf("scenario %s: no instances", s.Name))
	}
	return out, errors.Join(errs...)
}

// slowed returns p with every step-time term multiplied by k: the same model on hardware k
// times slower, with the same KV capacity.
func slowed(p engine.Profile, k float64) engine.Profile {
	mul := func(d time.Duration) time.Duration { return time.Duration(float64(d) * k) }
	p.Name = fmt.Sprintf("%s-slow%g", p.Name, k)
	p.StepOverhead = mul(p.StepOverhead)
	p.PrefillPerToken = mul(p.PrefillPerToken)
	p.AttentionPerMPairs = mul(p.AttentionPerMPairs)
	p.DecodePerSeq = mul(p.DecodePerSeq)
	p.DecodePerCtxToken = mul(p.DecodePerCtxToken)
	return p
}

// fleet is a scenario's fleet at one load, ready for des.Run.
type fleet struct {
	config  des.Config
	speedup float64
	load    float64 // the offered load after the speed-up
	kv      int     // KV tokens of all instances together
}

// buildFleet makes the des fleet for scenario s at load, scaling reqs' arrivals: it returns
// the scaled copy. The offered load counts each instance's prefill capacity for the share of
// the span it serves, so that a mixed fleet's fast instances count for more and an instance
// added at half time for half.
func (s *Scenario) buildFleet(reqs []workload.Request, load float64, seed uint64) (fleet, []workload.Request, error) {
	profs, err := s.profiles()
	if err != nil {
		return fleet{}, nil, err
	}
	n := len(profs)
	present := make([]float64, n)
	for i := range present {
		present[i] = 1
		if s.Start > 0 && i >= s.Start {
			present[i] = 0.5
		}
	}
	capacity, err := capacity(reqs, profs, present)
	if err != nil {
		return fleet{}, nil, fmt.Errorf("scenario %s: %w", s.Name, err)
	}
	// capacity is in whole workloads per second of the unscaled span: at speed-up k the offered
	// load is k / (span x capacity).
	d := span(reqs)
	k := load * d.Seconds() * capacity
	scaled := workload.Speedup(reqs, k)
	bs := profs[0].BlockSize
	f := fleet{speedup: k, load: 1 / (span(scaled).Seconds() * capacity)}
	for _, p := range profs {
		if p.BlockSize != bs {
			return fleet{}, nil, fmt.Errorf("scenario %s: block sizes %d and %d differ: the router hashes one", s.Name, bs, p.BlockSize)
		}
		f.kv += p.KVTokens()
	}
	f.config = des.Config{
		Instances:        n,
		Model:            s.Fleet[0].Profile, // seeds the block hashes, as kvroute simulate does
		BlockSize:        bs,
		KVCapacityTokens: profs[0].KVTokens(), // until the first scrape says each one's
		NewEngine: func(i int) (des.Engine, error) {
			return engine.New(engine.Config{Profile: profs[i]})
		},
		ScrapeInterval: des.DefaultScrapeInterval,
		Seed:           seed,
	}
	if s.Start > 0 {
		at := span(scaled) / 2
		for i := s.Start; i < n; i++ {
			f.config.Changes = append(f.config.Changes, des.Change{At: at, Instance: i, Kind: des.Add})
		}
	}
	return f, scaled, nil
}

// capacity is how many times per second the fleet could prefill every prompt of reqs without
// a cache hit: the sum over instances of present / (the instance's time to prefill them all
// alone), present being the share of the span the instance serves.
func capacity(reqs []workload.Request, profs []engine.Profile, present []float64) (float64, error) {
	work := map[string]time.Duration{}
	var c float64
	for i, p := range profs {
		w, ok := work[p.Name]
		if !ok {
			for k := range reqs {
				w += p.UnloadedTTFT(reqs[k].PromptTokens, 0)
			}
			work[p.Name] = w
		}
		if w <= 0 {
			return 0, fmt.Errorf("profile %s has no prefill cost: no load can be set", p.Name)
		}
		c += present[i] / w.Seconds()
	}
	if span(reqs) <= 0 {
		return 0, errors.New("the arrivals do not spread over time: no load can be set")
	}
	return c, nil
}

// span is the time from the first arrival to the last.
func span(reqs []workload.Request) time.Duration {
	if len(reqs) == 0 {
		return 0
	}
	lo, hi := reqs[0].Arrival, reqs[0].Arrival
	for i := range reqs {
		lo = min(lo, reqs[i].Arrival)
		hi = max(hi, reqs[i].Arrival)
	}
	return hi - lo
}
