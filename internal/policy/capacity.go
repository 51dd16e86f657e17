package policy

import (
	"math"
	"sync"
	"sync/atomic"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/prefix"
)

// CapacityLearner is implemented by policies that learn the KV capacity of endpoints whose
// capacity is neither configured (kv_tokens) nor scraped: LearnedKVTokens returns endpoint id's
// learned capacity in the router's token units, 0 while none is learned. It stands only while
// the endpoint's capacity is unknown: a configured or scraped one always wins.
type CapacityLearner interface {
	LearnedKVTokens(id int) int
}

// capState learns the cache capacity of an endpoint whose capacity the router is not
// told (ollama, an `engine: openai` endpoint without kv_tokens): its index would otherwise
// assume the fallback (index_blocks), far more than such an engine keeps, and predict hits
// that the engine has long evicted. Every request that the index predicted a hit for is
// evidence: how deep in the endpoint's LRU its prefix was (prefix.Index.Depth), and whether
// the engine had it, from its cached-token report where it is trusted, else from the TTFT
// against the policy's own speed model (ttftEvidence). prefix.CapacityEstimate turns the
// evidence into a capacity, and the index is sized by it (sizeIndex) until a configured or
// scraped capacity replaces it. It is kept in the endpoint's state (paState.caps), and goes
// with it.
type capState struct {
	mu      sync.Mutex // guards est and floor
	est     prefix.CapacityEstimate
	floor   int          // blocks of the longest prompt seen: the least an engine must keep
	learned atomic.Int64 // router tokens, 0 while none
	index   atomic.Int64 // router tokens the index is sized by: learned with its headroom
}

// capProbe is what one request routed to an endpoint of unknown capacity can teach: set at
// Routed, before its blocks are inserted, and judged at Done.
type capProbe struct {
	depth      int     // blocks the LRU had to hold for the predicted prefix; 0: nothing to learn
	warm, cold float64 // prior-model TTFT, seconds, with the predicted prefix cached and without
	busy       atomic.Bool
}

// Thresholds of the TTFT evidence, on the log scale between the warm (0) and the cold (1)
// prediction: at most capHitAt is a hit, at least capMissAt a miss, between them nothing.
const (
	capHitAt  = 0.35
	capMissAt = 0.65
	// capMinRatio: predictions closer than this factor cannot tell a hit from noise.
	capMinRatio = 1.5
)

// ttftEvidence says what a TTFT tells of a predicted hit: +1 a hit, -1 a miss, 0 nothing (the
// warm and cold predictions are too close, or the TTFT lies between them).
func ttftEvidence(ttft, warm, cold float64) int {
	if ttft <= 0 || warm <= 0 || cold < warm*capMinRatio {
		return 0
	}
	x := math.Log(ttft/warm) / math.Log(cold/warm)
	switch {
	case x <= capHitAt:
		return 1
	case x >= capMissAt:
		return -1
	}
	return 0
}

// unknownCapacity reports whether ep's capacity must be learned: neither configured nor scraped.
func unknownCapacity(ep *endpoint.Endpoint) bool { return ep.RouterKVTokens() <= 0 }

// probe prepares f's evidence on ep, before the request's blocks go into the index: how deep
// its predicted prefix lies, and its TTFT warm and cold. busy marks a request that was not
// alone on ep, whose TTFT says little.
func (pa *prefixAware) probe(req *Request, ep *endpoint.Endpoint, s *paState, f *paFlight, now int64) {
	if f.predicted <= 0 || !unknownCapacity(ep) {
		return
	}
	stamp, ok := prefix.StampAt(f.runs, f.predicted-1, f.predicted)
	if !ok {
		return
	}
	f.probe.depth = pa.index.Depth(s.slot, stamp, pa.fallbackCap)
	speed := pa.speedOf(s, pa.fleet.get(), now)
	f.probe.warm = priorTTFT(f.work) * speed
	f.probe.cold = priorTTFT(pa.work(req, 0)) * speed
	// Prefill queued ahead of it makes its TTFT say little; so does one routed after it while
	// it prefills (sawQueue). A concurrent decode slows it less than the margins allow for.
	f.probe.busy.Store(f.ahead > f.work)
	s.capState().raiseFloor(len(req.Blocks))
}

// sawQueue marks the probe busy when requests wait on s after this one's first token: they
// were routed while it prefilled and shared the engine with it.
func (p *capProbe) sawQueue(s *paState) {
	if s.waiting.Load() > 0 {
		p.busy.Store(true)
	}
}

// kvTokens is the capacity the index of ep (state s) is sized by: the configured or scraped
// one, else the learned one with its headroom (0 while there is none: the fallback stands).
func (pa *prefixAware) kvTokens(ep *endpoint.Endpoint, s *paState) int64 {
	if kv := int64(ep.RouterKVTokens()); kv > 0 {
		return kv
	}
	_, index := s.caps.Load().capacities()
	return index
}

// learnCapacity judges f's evidence once the request is done (res: what the engine said).
func (pa *prefixAware) learnCapacity(req *Request, ep *endpoint.Endpoint, f *paFlight, res Result) {
	if f.probe.depth <= 0 || !res.OK || !unknownCapacity(ep) || f.s.blind.Load() {
		return // a blind endpoint's reports are wrong wholesale: they say nothing of its capacity
	}
	hit := 0
	switch {
	case res.CachedTokens >= 0: // trusted: found at least half of what was predicted
		if 2*res.CachedTokens >= cachedTokens(req, f.predicted) {
			hit = 1
		} else {
			hit = -1
		}
	case !f.probe.busy.Load() && res.TTFT > 0:
		hit = ttftEvidence(res.TTFT.Seconds(), f.probe.warm, f.probe.cold)
	}
	if hit != 0 {
		f.s.capState().observe(f.probe.depth, hit > 0, req.BlockTokens, pa.fallbackCap)
	}
}

// capState returns what s has learned of its capacity, starting it.
func (s *paState) capState() *capState {
	if c := s.caps.Load(); c != nil {
		return c
	}
	s.caps.CompareAndSwap(nil, &capState{})
	return s.caps.Load()
}

func (c *capState) raiseFloor(blocks int) {
	c.mu.Lock()
	c.floor = max(c.floor, blocks)
	c.mu.Unlock()
}

// observe records one hit or miss at depth and updates the learned capacity, kept between one
// prompt (the floor) and the fallback.
func (c *capState) observe(depth int, hit bool, blockTokens, fallback int) {
	if blockTokens <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.est.Observe(depth, hit)
	blocks, ok := c.est.Estimate()
	if !ok {
		return
	}
	blocks = min(max(blocks, c.floor, 1), fallback)
	c.learned.Store(int64(blocks * blockTokens))
	c.index.Store(int64(min(int(float64(blocks)*prefix.CapacityHeadroom), fallback) * blockTokens))
}

// capacities returns the learned capacity in router tokens, and the capacity the index is
// sized by; 0 while none (c nil: nothing learned yet).
func (c *capState) capacities() (capacity, index int64) {
	if c == nil {
		return 0, 0
	}
	return c.learned.Load(), c.index.Load()
}

// capacityBlind starts ep's learning afresh when it turns blind (policy.CacheBlind): its
// engine's reports stayed far below the predictions, which the learning had taken for a small
// cache (silent zero hits: prefix caching off, keys unlike the router's). Its index returns to
// the fallback, so that predictions are made there again and the audit can see it recover.
func (pa *prefixAware) capacityBlind(ep *endpoint.Endpoint, s *paState, blind bool) {
	if !blind {
		return
	}
	s.caps.Store(nil)
	if unknownCapacity(ep) && s.slot >= 0 {
		s.kvTokens.Store(0)
		pa.index.SetCapacity(s.slot, 0)
	}
}

// LearnedKVTokens returns endpoint id's learned KV capacity in router tokens (CapacityLearner).
func (pa *prefixAware) LearnedKVTokens(id int) int {
	s := pa.find(id)
	if s == nil {
		return 0
	}
	capacity, _ := s.caps.Load().capacities()
	return int(capacity)
}
