package report

import (
	"encoding/json"
	"math"
	"slices"
	"time"
)

// Record is what happened to one request. Times are offsets from the start of the run (virtual
// time in the simulator, wall time since the first request in a live benchmark).
type Record struct {
	ID         string
	Policy     string
	EndpointID int    // -1 when the request was never routed
	Endpoint   string // endpoint name, "" when never routed
	Arrival    time.Duration
	// FirstToken is when the first output token arrived; 0 when none arrived.
	FirstToken time.Duration
	// Finish is when the request ended, successfully or not.
	Finish       time.Duration
	PromptTokens int
	// CachedTokens is the prompt tokens the engine found in its prefix cache.
	CachedTokens int
	// CachedUnknown says the engine reported no cached tokens for this request (ollama, TGI,
	// an OpenAI server without prompt_tokens_details): CachedTokens is then 0 and means
	// nothing.
	CachedUnknown bool
	OutputTokens  int
	// Predicted says whether the policy predicted the cached tokens (policy.Predictor);
	// PredictedCachedTokens is then its prediction at routing time.
	Predicted             bool
	PredictedCachedTokens int
	// Attempts is how many endpoints the request was sent to (more than 1 after a fallback).
	Attempts int
	// MovedBy says why the request's first endpoint was not the policy's pick
	// (route.Call.Moved), "" when it was.
	MovedBy string
	// Err is empty on success, else why the request failed.
	Err string
}

// OK reports whether the request completed.
func (r *Record) OK() bool { return r.Err == "" }

// TTFT is the time to first token, 0 when no first token arrived.
func (r *Record) TTFT() time.Duration {
	if r.FirstToken == 0 {
		return 0
	}
	return r.FirstToken - r.Arrival
}

// E2E is the end-to-end latency.
func (r *Record) E2E() time.Duration { return r.Finish - r.Arrival }

// TPOT is the mean time per output token after the first; ok is false when the request produced
// fewer than two tokens.
func (r *Record) TPOT() (time.Duration, bool) {
	if r.OutputTokens < 2 {
		return 0, false
	}
	return (r.E2E() - r.TTFT()) / time.Duration(r.OutputTokens-1), true
}

// Latency summarises a distribution of latencies, in milliseconds.
type Latency struct {
	Mean float64 `json:"mean"`
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
}

// Result is one policy's figures.
type Result struct {
	Policy    string `json:"policy"`
	Completed int    `json:"completed"`
	Failed    int    `json:"failed"`
	// HitRate is cached over prompt tokens of the completed requests whose engine reported
	// cached tokens.
	HitRate float64 `json:"hit_rate"`
	// HitRateUnknown says no completed request had its cached tokens reported, or none
	// completed: HitRate is then 0 and means nothing (JSON: "hit_rate": null; tables: unknown).
	HitRateUnknown bool    `json:"-"`
	TTFT           Latency `json:"ttft_ms"`
	TPOT           Latency `json:"tpot_ms"`
	E2E            Latency `json:"e2e_ms"`
	// ThroughputTokensPerS is output tokens of completed requests per second between the first
	// arrival and the last finish.
	ThroughputTokensPerS float64 `json:"throughput_tokens_per_s"`
	// LoadImbalance is max / mean of the per-instance busy time (1 is perfectly even; 0 when no
	// instance was busy).
	LoadImbalance float64 `json:"load_imbalance"`
	// PredictedHitRate is the policy's predicted cached tokens over prompt tokens, for the
	// completed requests it made a prediction for (absent when it made none).
	PredictedHitRate *float64 `json:"predicted_hit_rate,omitempty"`
	// InstanceBusyFraction is each instance's busy time over the run's span.
	InstanceBusyFraction []float64 `json:"instance_busy_fraction"`
	// InstanceRequests is the number of requests routed to each instance.
	InstanceRequests []int `json:"instance_requests"`
	// Preemptions counts engine preemptions, when the source knows them.
	Preemptions int64 `json:"preemptions"`
	// Stalls counts the attempts the router gave up as stalled (limits.stall_timeout), when
	// the source knows them.
	Stalls int `json:"stalls,omitempty"`
	// CacheAudit is the router's cache-audit verdicts, in order, when the source knows them
	// and there were any.
	CacheAudit  []AuditVerdict `json:"cache_audit,omitempty"`
	WallSeconds float64        `json:"wall_seconds"`
}

// AuditVerdict is one change of a router's verdict on an instance's cache reports: blind when
// the engine's reported cached tokens stayed far below the predictions (a silent zero hit),
// not when they agree again.
type AuditVerdict struct {
	AtSeconds float64 `json:"at_s"`
	Router    int     `json:"router"`
	Instance  int     `json:"instance"`
	Blind     bool    `json:"blind"`
}

// Scenario describes what was run.
type Scenario struct {
	Workload  string  `json:"workload"`
	Requests  int     `json:"requests"`
	Instances int     `json:"instances"`
	Profile   string  `json:"profile"`
	Speedup   float64 `json:"speedup"`
	// Pacing, when set, is what set the arrivals instead of Speedup, as the header says it:
	// "rate 10 req/s, Poisson arrivals" or "closed loop, 8 in flight" (kvroute bench --rate,
	// --concurrency). Speedup is then 1, the workload's own times being replaced, not scaled.
	Pacing string `json:"pacing,omitempty"`
	Seed   int64  `json:"seed"`
	// Load is the offered prefill work (no cache hits) over the fleet's prefill capacity.
	Load float64 `json:"load"`
	// BlockSize is the engines' KV block size in tokens (0: unknown).
	BlockSize int `json:"block_size,omitempty"`
	// ScrapeIntervalMS is how often the router saw fresh engine metrics.
	ScrapeIntervalMS float64 `json:"scrape_interval_ms"`
	// NonStreamed is the fraction of requests whose clients asked for the answer whole.
	NonStreamed float64 `json:"non_streamed,omitempty"`
}

// Bounds are hit rates no policy can beat on the workload.
type Bounds struct {
	// InfiniteCacheHitRate is the token-weighted prefix hit rate of one unbounded cache.
	InfiniteCacheHitRate float64 `json:"infinite_cache_hit_rate"`
	// PooledLRUHitRate is the same for one LRU cache holding the whole fleet's KV capacity.
	PooledLRUHitRate float64 `json:"pooled_lru_hit_rate"`
	// PooledLRUUnknown says the fleet's KV capacity is not known (a live benchmark of any
	// target): PooledLRUHitRate means nothing (JSON: null; tables: unknown).
	PooledLRUUnknown bool `json:"-"`
}

// MarshalJSON writes an unknown hit rate as null.
func (r Result) MarshalJSON() ([]byte, error) {
	type plain Result // without the methods, so that Marshal does not recurse
	return json.Marshal(struct {
		plain
		HitRate *float64 `json:"hit_rate"`
	}{plain(r), knownOrNil(r.HitRate, r.HitRateUnknown)})
}

// UnmarshalJSON reads what MarshalJSON writes: null is an unknown hit rate.
func (r *Result) UnmarshalJSON(b []byte) error {
	type plain Result
	var v struct {
		plain
		HitRate *float64 `json:"hit_rate"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*r = Result(v.plain)
	r.HitRate, r.HitRateUnknown = valueOrUnknown(v.HitRate)
	return nil
}

// MarshalJSON writes an unknown pooled LRU bound as null.
func (b Bounds) MarshalJSON() ([]byte, error) {
	type plain Bounds
	return json.Marshal(struct {
		plain
		PooledLRUHitRate *float64 `json:"pooled_lru_hit_rate"`
	}{plain(b), knownOrNil(b.PooledLRUHitRate, b.PooledLRUUnknown)})
}

// UnmarshalJSON reads what MarshalJSON writes: null is an unknown bound.
func (b *Bounds) UnmarshalJSON(data []byte) error {
	type plain Bounds
	var v struct {
		plain
		PooledLRUHitRate *float64 `json:"pooled_lru_hit_rate"`
	}
	if err := json.Unmarshal(data, &v); err != nil {
		return err
	}
	*b = Bounds(v.plain)
	b.PooledLRUHitRate, b.PooledLRUUnknown = valueOrUnknown(v.PooledLRUHitRate)
	return nil
}

func knownOrNil(v float64, unknown bool) *float64 {
	if unknown {
		return nil
	}
	return &v
}

func valueOrUnknown(p *float64) (float64, bool) {
	if p == nil {
		return 0, true
	}
	return *p, false
}

// Summary is a whole comparison: the scenario, the bounds and one Result per policy, in the
// order the policies were given.
type Summary struct {
	Scenario Scenario `json:"scenario"`
	Bounds   Bounds   `json:"bounds"`
	Results  []Result `json:"results"`
}

// Summarize computes a policy's Result from its records and the busy time of each instance
// (nil when unknown: the imbalance then uses the per-instance request counts). Instances are
// numbered by Record.EndpointID; len(busy) or the largest EndpointID+1 sets their number.
// WallSeconds is left for the caller.
func Summarize(policy string, recs []Record, busy []time.Duration) Result {
	res := Result{Policy: policy}
	n := len(busy)
	for i := range recs {
		if id := recs[i].EndpointID; id >= n {
			n = id + 1
		}
	}
	res.InstanceRequests = make([]int, n)
	var (
		ttft, tpot, e2e []float64
		prompt, cached  int64 // of the completed requests with cached tokens reported
		outTokens       int64
		predPrompt      int64
		predCached      int64
		predicted       bool
		reported        bool
		first, last     time.Duration
	)
	for i := range recs {
		r := &recs[i]
		if i == 0 || r.Arrival < first {
			first = r.Arrival
		}
		if r.Finish > last {
			last = r.Finish
		}
		if r.EndpointID >= 0 {
			res.InstanceRequests[r.EndpointID]++
		}
		if !r.OK() {
			res.Failed++
			continue
		}
		res.Completed++
		if !r.CachedUnknown {
			prompt += int64(r.PromptTokens)
			cached += int64(r.CachedTokens)
			reported = true
		}
		outTokens += int64(r.OutputTokens)
		if r.Predicted {
			predicted = true
			predPrompt += int64(r.PromptTokens)
			predCached += int64(r.PredictedCachedTokens)
		}
		ttft = append(ttft, ms(r.TTFT()))
		e2e = append(e2e, ms(r.E2E()))
		if d, ok := r.TPOT(); ok {
			tpot = append(tpot, ms(d))
		}
	}
	if prompt > 0 {
		res.HitRate = float64(cached) / float64(prompt)
	}
	res.HitRateUnknown = !reported // none completed, or none had its cached tokens reported
	if predicted && predPrompt > 0 {
		h := float64(predCached) / float64(predPrompt)
		res.PredictedHitRate = &h
	}
	res.TTFT = Summarise(ttft)
	res.TPOT = Summarise(tpot)
	res.E2E = Summarise(e2e)
	span := last - first
	if span > 0 {
		res.ThroughputTokensPerS = float64(outTokens) / span.Seconds()
	}
	if busy != nil {
		loads := make([]float64, len(busy))
		res.InstanceBusyFraction = make([]float64, len(busy))
		for i, b := range busy {
			loads[i] = b.Seconds()
			if span > 0 {
				res.InstanceBusyFraction[i] = b.Seconds() / span.Seconds()
			}
		}
		res.LoadImbalance = Imbalance(loads)
	} else {
		loads := make([]float64, n)
		for i, c := range res.InstanceRequests {
			loads[i] = float64(c)
		}
		res.LoadImbalance = Imbalance(loads)
	}
	return res
}

// Summarise returns the mean and the 50th, 90th and 99th percentiles of xs (all 0 when xs is
// empty). It sorts xs in place.
func Summarise(xs []float64) Latency {
	if len(xs) == 0 {
		return Latency{}
	}
	slices.Sort(xs)
	var sum float64
	for _, x := range xs {
		sum += x
	}
	return Latency{
		Mean: sum / float64(len(xs)),
		P50:  Percentile(xs, 50),
		P90:  Percentile(xs, 90),
		P99:  Percentile(xs, 99),
	}
}

// Percentile returns the p-th percentile (0..100) of sorted, interpolating linearly between the
// two nearest ranks (the "linear" method of NumPy and R type 7). It returns 0 for an empty slice.
func Percentile(sorted []float64, p float64) float64 {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	if p <= 0 {
		return sorted[0]
	}
	if p >= 100 {
		return sorted[n-1]
	}
	pos := p / 100 * float64(n-1)
	lo := int(math.Floor(pos))
	if lo >= n-1 {
		return sorted[n-1]
	}
	frac := pos - float64(lo)
	return sorted[lo] + frac*(sorted[lo+1]-sorted[lo])
}

// Imbalance returns max / mean of loads: 1 when perfectly even, len(loads) when one instance
// did everything, and 0 when loads is empty or all zero.
func Imbalance(loads []float64) float64 {
	if len(loads) == 0 {
		return 0
	}
	var sum, hi float64
	for _, l := range loads {
		sum += l
		hi = max(hi, l)
	}
	if sum <= 0 {
		return 0
	}
	return hi / (sum / float64(len(loads)))
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
