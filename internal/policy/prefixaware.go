package policy

import (
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/prefix"
)

// prefixAware is kvroute's own policy (name "prefix-aware"): for each candidate it predicts
// the time to first token,
//
//	predicted = (overhead + (queued prefill work + this request's uncached work) / prefill_rate)
//	            x learned speed factor + running decodes x decode_cost
//
// where the uncached work is what the approximate index (prefix.Index, one LRU per endpoint
// sized like its KV cache) says the endpoint would have to compute, in tokens plus
// attention_weight per million attention pairs; and it picks the smallest, under a bounded-load
// guard: no endpoint may take a request that would put its in-flight count above
// max_load_factor x the mean (rounded up). A prefix that everyone shares therefore spills to a
// second instance once the first is loaded, and that one warms up: replication falls out of
// the cost. The queued work is what the router sent there that has not reached its first token,
// less what the oldest of those requests, whose prefill is in progress, has done since it
// started (head_progress).
//
// Three terms look past this request's own TTFT. Its uncached work counts 1 + recompute_weight
// times (work recomputed here delays everyone queued after it, and duplicates cache content),
// plus balance_weight x the cache pressure where it would land (see Pick), which spreads the
// ownership of new prefixes, and so their follow-up traffic, evenly. And it delays the requests
// that this endpoint's cache will draw while the work waits and runs: at the rate a at which
// such requests have been arriving (each counted by the fraction of its prompt the endpoint
// held, averaged over affinity_window seconds), a x work x (queued + work / 2) / prefill_rate
// more units of work. That term is what keeps a long recompute off the endpoint that holds
// busy conversations, and it is negligible for the short work of a request that follows its
// own prefix.
//
// It learns: each endpoint's speed is calibrated by the ratio of observed TTFTs to the TTFTs the
// prior model (overhead, prefill_rate) predicted for the work that was ahead of each request
// (exponentially weighted sums, so long prefills weigh most). The fleet's ratio applies to every
// endpoint whose own ratio is within learn_tolerance of it, or that has too few samples of its
// own, so that noise between identical instances does not steer traffic, and an endpoint's own
// ratio applies beyond that. An engine that reports fewer cached tokens than predicted makes the
// index forget everything of that endpoint at least as old as the missing block (the engine,
// being LRU, evicted it too); and a request's blocks become most recent again when it ends, as
// the engine's free-block LRU orders them by release (touch_done). A session key breaks
// near-ties (within session_slack) towards the endpoint that served the session last.
//
// With snapshot_load (off by default), it also counts the load that the engine's scraped
// metrics show beyond its own counts: when a router is one of several replicas, each sees only
// the requests it sent, and every replica would otherwise believe an endpoint that the others
// keep busy is idle. The engine's waiting requests beyond the ones this router has waiting
// there count as queued work (each the mean work of the requests this router sent: the load
// balancer gives every replica the same mix), and its running plus waiting requests beyond
// this router's in-flight count join the load guard and the decode term. The snapshot is up to
// a scrape interval old; a single router's own counts are exact and rarely below it.
type prefixAware struct {
	clock       Clock
	index       *prefix.Index
	maxLoad     float64
	rate0       float64 // prior prefill rate, tokens/s
	overhead0   float64 // prior fixed TTFT, seconds
	attn        float64 // token-equivalents of work per million attention pairs
	decodeCost  float64 // seconds per running decode
	sessionTol  float64 // relative slack within which the session's endpoint wins
	recompute   float64 // weight of the request's own uncached work, on top of its TTFT
	balance     float64 // weight of the cache pressure where the new blocks would go
	progress    bool    // count the head's prefill progress off the queue
	touchDone   bool    // renew a request's blocks in the index when it ends
	affTau      float64 // seconds over which affinity traffic is averaged; 0: no such term
	learn       bool
	learnWeight float64
	learnTol    float64
	fleet       speedFit // all endpoints together
	correct     bool
	fallbackCap int  // index blocks per endpoint when its KV capacity is unknown
	snapLoad    bool // count the scraped load beyond the router's own

	// The work of every request routed, summed, and their number: the mean work a request
	// that another replica sent is assumed to bring.
	workSum, workN atomic.Int64

	mu       sync.RWMutex // guards eps (the slice, not the states)
	eps      []*paState
	inflight sync.Map // *Request -> *paFlight
	sessions sessionMap
	scratch  sync.Pool // *paScratch
}

// paState is what the policy tracks per endpoint.
type paState struct {
	kvTokens atomic.Int64 // KV capacity last given to the index
	pending  atomic.Int64 // uncached prefill work routed and not yet at first token
	waiting  atomic.Int64 // requests routed and not yet at first token
	speed    speedFit

	// The head of the queue: the oldest request routed here and not yet at first token, whose
	// prefill is in progress (the engine is FCFS). headSince is when it started: when it was
	// routed to an idle endpoint, or when the request before it reached its first token.
	headWork  atomic.Int64
	headSince atomic.Int64 // unix nanoseconds

	mu    sync.Mutex  // guards queue and the affinity sum's updates
	queue []*paFlight // routed and not yet at first token, in routing order

	// Affinity traffic: requests routed here weighted by the fraction of their prompt it held,
	// as an exponentially decayed sum (float64 bits) as of affAt (unix nanoseconds).
	affSum atomic.Uint64
	affAt  atomic.Int64
}

// addAffinity records a request that found fraction v of its prompt here, at now.
func (s *paState) addAffinity(v float64, now int64, tau float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sum := math.Float64frombits(s.affSum.Load())
	if at := s.affAt.Load(); at != 0 && now > at {
		sum *= math.Exp(-float64(now-at) / 1e9 / tau)
	}
	s.affSum.Store(math.Float64bits(sum + v))
	s.affAt.Store(now)
}

// affinityRate is the rate, per second, at which requests bound to this endpoint by its cache
// arrive (each counted by the fraction of its prompt it found here).
func (s *paState) affinityRate(now int64, tau float64) float64 {
	sum := math.Float64frombits(s.affSum.Load())
	if at := s.affAt.Load(); at != 0 && now > at {
		sum *= math.Exp(-float64(now-at) / 1e9 / tau)
	}
	return sum / tau
}

// enqueue appends f to the queue; f becomes the head, starting now, if the queue was empty.
func (s *paState) enqueue(f *paFlight, now int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.queue = append(s.queue, f)
	if len(s.queue) == 1 {
		s.headWork.Store(f.work)
		s.headSince.Store(now)
	}
}

// dequeue takes f off the queue (its first token came, or it failed); if f was the head, the
// next request becomes the head, starting now.
func (s *paState) dequeue(f *paFlight, now int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := slices.Index(s.queue, f)
	if k < 0 {
		return
	}
	s.queue = slices.Delete(s.queue, k, k+1)
	if k > 0 {
		return
	}
	if len(s.queue) == 0 {
		s.headWork.Store(0)
		return
	}
	s.headWork.Store(s.queue[0].work)
	s.headSince.Store(now)
}

// speedFit calibrates the prior TTFT model: factor = observed / predicted TTFT, as
// exponentially weighted sums.
type speedFit struct {
	factor  atomic.Uint64 // float64 bits; 1 until learned
	learned atomic.Bool   // enough samples to say

	mu                 sync.Mutex
	n, observed, prior float64
}

func (f *speedFit) init() { f.factor.Store(math.Float64bits(1)) }

func (f *speedFit) get() float64 { return math.Float64frombits(f.factor.Load()) }

// add records one request: predicted by the prior model, observed ttft, both in seconds.
func (f *speedFit) add(predicted, observed, weight float64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	keep := 1 - weight
	f.n = f.n*keep + 1
	f.observed = f.observed*keep + observed
	f.prior = f.prior*keep + predicted
	if f.n < 5 || f.prior <= 0 {
		return // too few samples to say
	}
	f.factor.Store(math.Float64bits(min(max(f.observed/f.prior, 0.05), 20)))
	f.learned.Store(true)
}

// paFlight is one routed request until it is done.
type paFlight struct {
	ep        int
	work      int64       // this request's uncached work
	ahead     int64       // work queued on ep before it, plus its own
	predicted int         // blocks the index said ep held
	stamps    []int64     // index stamps of those blocks, for the correction
	first     atomic.Bool // first token seen, or done
}

type paScratch struct {
	runs   []int32
	tails  []int64
	fill   []float64
	scored []paScore
	states []*paState
	extra  []paUnseen
}

// paUnseen is the load on an endpoint that its scraped metrics show beyond the router's own
// counts.
type paUnseen struct {
	inFlight, waiting int64
	work              float64
}

type paScore struct {
	i        int
	eligible bool
	cost     float64
}

func newPrefixAware(env Env, p Params) (Picker, error) {
	r := readParams(p)
	pa := &prefixAware{
		clock:       env.Clock,
		maxLoad:     r.Float("max_load_factor", 2),
		rate0:       r.Float("prefill_rate", 10000),
		overhead0:   r.Float("overhead", 0.02),
		attn:        r.Float("attention_weight", 25),
		decodeCost:  r.Float("decode_cost", 0.0005),
		sessionTol:  r.Float("session_slack", 0.1),
		recompute:   r.Float("recompute_weight", 3),
		balance:     r.Float("balance_weight", 6),
		progress:    r.Bool("head_progress", true),
		touchDone:   r.Bool("touch_done", true),
		affTau:      r.Float("affinity_window", 60),
		learn:       r.Bool("learn", true),
		learnWeight: r.Float("learn_weight", 0.02),
		learnTol:    r.Float("learn_tolerance", 0.25),
		correct:     r.Bool("correct", true),
		fallbackCap: r.Int("index_blocks", 65536),
		snapLoad:    r.Bool("snapshot_load", false),
	}
	maxEntries := r.Int("max_index_entries", 16<<20)
	sessions := r.Int("sessions", 65536)
	r.Require(pa.maxLoad >= 1, "max_load_factor=%g must be at least 1 (2 lets an endpoint take twice the mean load)", pa.maxLoad)
	r.Require(pa.rate0 > 0, "prefill_rate=%g must be positive (tokens per second)", pa.rate0)
	r.Require(pa.overhead0 >= 0, "overhead=%g must not be negative (seconds)", pa.overhead0)
	r.Require(pa.attn >= 0, "attention_weight=%g must not be negative", pa.attn)
	r.Require(pa.decodeCost >= 0, "decode_cost=%g must not be negative (seconds)", pa.decodeCost)
	r.Require(pa.balance >= 0, "balance_weight=%g must not be negative", pa.balance)
	r.Require(pa.recompute >= 0, "recompute_weight=%g must not be negative", pa.recompute)
	r.Require(pa.affTau >= 0, "affinity_window=%g must not be negative (seconds; 0 turns the term off)", pa.affTau)
	r.Require(pa.sessionTol >= 0, "session_slack=%g must not be negative", pa.sessionTol)
	r.Require(pa.learnWeight > 0 && pa.learnWeight < 1, "learn_weight=%g must be in (0, 1)", pa.learnWeight)
	r.Require(pa.learnTol >= 0, "learn_tolerance=%g must not be negative", pa.learnTol)
	r.Require(pa.fallbackCap > 0, "index_blocks=%d must be positive", pa.fallbackCap)
	r.Require(maxEntries >= 0, "max_index_entries=%d must not be negative (0: no cap)", maxEntries)
	r.Require(sessions > 0, "sessions=%d must be positive", sessions)
	if err := r.Check(); err != nil {
		return nil, err
	}
	if pa.clock == nil {
		pa.clock = WallClock{}
	}
	pa.index = prefix.NewIndex(prefix.IndexConfig{DefaultCapacity: pa.fallbackCap, MaxEntries: maxEntries})
	pa.sessions.max = sessions
	pa.fleet.init()
	return pa, nil
}

// state returns endpoint id's state, creating it.
func (pa *prefixAware) state(id int) *paState {
	pa.mu.RLock()
	if id < len(pa.eps) && pa.eps[id] != nil {
		s := pa.eps[id]
		pa.mu.RUnlock()
		return s
	}
	pa.mu.RUnlock()
	pa.mu.Lock()
	defer pa.mu.Unlock()
	for id >= len(pa.eps) {
		pa.eps = append(pa.eps, nil)
	}
	if pa.eps[id] == nil {
		s := &paState{}
		s.speed.init()
		pa.eps[id] = s
	}
	return pa.eps[id]
}

// sizeIndex gives the index ep's KV capacity when it is known and has changed.
func (pa *prefixAware) sizeIndex(ep *endpoint.Endpoint, s *paState, blockTokens int) {
	kv := int64(ep.RouterKVTokens())
	if kv <= 0 || blockTokens <= 0 || s.kvTokens.Load() == kv {
		return
	}
	s.kvTokens.Store(kv)
	pa.index.SetCapacity(ep.ID, int(kv)/blockTokens)
}

// cachedTokens is how many prompt tokens a run of blocks saves, capped like the engine caps a
// hit (the last prompt token is always computed).
func cachedTokens(req *Request, blocks int) int {
	bt := req.BlockTokens
	if bt <= 0 {
		return 0
	}
	c := blocks * bt
	if limit := (req.PromptTokens - 1) / bt * bt; c > limit {
		c = max(limit, 0)
	}
	return c
}

// work is the prefill work, in token-equivalents, of computing the uncached part of a prompt:
// its tokens plus the attention pairs they form with the whole context.
func (pa *prefixAware) work(req *Request, cached int) int64 {
	n := max(req.PromptTokens, 1)
	u := max(n-cached, 1)
	pairs := float64(u)*float64(cached) + float64(u)*float64(u+1)/2
	return int64(float64(u) + pa.attn*pairs/1e6)
}

func (pa *prefixAware) getScratch(n, maxID int) *paScratch {
	sc, _ := pa.scratch.Get().(*paScratch)
	if sc == nil {
		sc = &paScratch{}
	}
	if cap(sc.runs) < maxID+1 {
		sc.runs = make([]int32, maxID+1)
	}
	sc.runs = sc.runs[:maxID+1]
	if cap(sc.tails) < maxID+1 {
		sc.tails = make([]int64, maxID+1)
	}
	sc.tails = sc.tails[:maxID+1]
	if cap(sc.fill) < maxID+1 {
		sc.fill = make([]float64, maxID+1)
	}
	sc.fill = sc.fill[:maxID+1]
	if cap(sc.scored) < n {
		sc.scored = make([]paScore, n)
	}
	sc.scored = sc.scored[:n]
	if cap(sc.states) < n {
		sc.states = make([]*paState, n)
	}
	sc.states = sc.states[:n]
	if cap(sc.extra) < n {
		sc.extra = make([]paUnseen, n)
	}
	sc.extra = sc.extra[:n]
	return sc
}

// Pick ranks candidates by predicted TTFT, the ones within the load bound first.
func (pa *prefixAware) Pick(req *Request, c []*endpoint.Endpoint) ([]*endpoint.Endpoint, error) {
	n := len(c)
	if n == 0 {
		return nil, ErrNoCandidate
	}
	maxID := 0
	for _, e := range c {
		maxID = max(maxID, e.ID)
	}
	sc := pa.getScratch(n, maxID)
	defer pa.scratch.Put(sc)
	states := sc.states
	pa.mu.RLock()
	for i, e := range c {
		states[i] = nil
		if e.ID < len(pa.eps) {
			states[i] = pa.eps[e.ID]
		}
	}
	pa.mu.RUnlock()
	for i, e := range c {
		if states[i] == nil {
			states[i] = pa.state(e.ID)
		}
		pa.sizeIndex(e, states[i], req.BlockTokens)
	}
	total := 0
	for i, e := range c {
		sc.extra[i] = pa.unseen(e, states[i])
		total += e.InFlight() + int(sc.extra[i].inFlight)
	}
	pa.index.Match(sc.runs, req.Blocks)
	now := pa.clock.Now().UnixNano()
	// Cache pressure: where this request's new blocks would go, in 0..1. An endpoint with room
	// scores up to 0.5 by its fill relative to the fullest candidate; a full one from 0.5 for the
	// one whose oldest entry is oldest (what it evicts is least useful) up to 1 for the youngest.
	// Steering new content by it spreads the ownership of prefixes, and so the follow-up traffic
	// they attract, evenly (as SGLang's "smallest tree" rule does for unmatched prompts).
	var oldest int64
	var fullest float64
	if pa.balance > 0 {
		pa.index.Fill(sc.fill, sc.tails)
		for _, e := range c {
			if t := sc.tails[e.ID]; t != 0 {
				oldest = max(oldest, now-t)
			}
			fullest = max(fullest, sc.fill[e.ID])
		}
	}

	// Bounded load: at most ceil(factor x mean) in flight after this request.
	limit := math.Ceil(pa.maxLoad * float64(total+1) / float64(n))
	fleet := pa.fleet.get()
	for i, e := range c {
		s := states[i]
		cached := cachedTokens(req, int(sc.runs[e.ID]))
		own := float64(pa.work(req, cached))
		weight := 1 + pa.recompute
		if pa.balance > 0 {
			p := 0.0
			if fullest > 0 {
				p = sc.fill[e.ID] / fullest / 2
			}
			if t := sc.tails[e.ID]; t != 0 && oldest > 0 {
				p = 1 - float64(now-t)/float64(oldest)/2
			}
			weight += pa.balance * p
		}
		x := sc.extra[i]
		q := pa.queued(s, now, fleet) + x.work
		w := q + own*weight
		if pa.affTau > 0 {
			// The requests this endpoint's cache will draw while this work is queued and done
			// wait for it: q + own/2 on average for each, at the affinity rate.
			w += s.affinityRate(now, pa.affTau) * own * (q + own/2) * pa.speedOf(s, fleet) / pa.rate0
		}
		inFlight := int64(e.InFlight()) + x.inFlight
		decoding := max(inFlight-s.waiting.Load()-x.waiting, 0)
		cost := (pa.overhead0+w/pa.rate0)*pa.speedOf(s, fleet) + float64(decoding)*pa.decodeCost
		sc.scored[i] = paScore{i: i, eligible: float64(inFlight+1) <= limit, cost: cost}
	}
	// Ineligible candidates after eligible ones, then by cost, then in candidate order.
	slices.SortFunc(sc.scored, func(a, b paScore) int {
		if a.eligible != b.eligible {
			if a.eligible {
				return -1
			}
			return 1
		}
		if a.cost != b.cost {
			if a.cost < b.cost {
				return -1
			}
			return 1
		}
		return a.i - b.i
	})
	// Session affinity breaks near-ties: the session's endpoint, if eligible and within
	// session_slack of the best, goes first.
	if req.SessionKey != "" {
		if id, ok := pa.sessions.get(req.SessionKey); ok {
			best := sc.scored[0]
			for k := 1; k < n; k++ {
				s := sc.scored[k]
				if c[s.i].ID == id && s.eligible == best.eligible && s.cost <= best.cost*(1+pa.sessionTol) {
					copy(sc.scored[1:k+1], sc.scored[:k])
					sc.scored[0] = s
					break
				}
			}
		}
	}
	out := make([]*endpoint.Endpoint, n)
	for k, s := range sc.scored {
		out[k] = c[s.i]
	}
	return out, nil
}

// Routed records the request on ep: its work is queued there, and ep is about to hold its blocks.
func (pa *prefixAware) Routed(req *Request, ep *endpoint.Endpoint) {
	s := pa.state(ep.ID)
	pa.sizeIndex(ep, s, req.BlockTokens)
	f := &paFlight{ep: ep.ID}
	f.predicted, f.stamps = pa.index.MatchOne(ep.ID, req.Blocks, nil)
	f.work = pa.work(req, cachedTokens(req, f.predicted))
	now := pa.clock.Now().UnixNano()
	f.ahead = int64(pa.queued(s, now, pa.fleet.get())) + f.work
	if pa.snapLoad {
		// Computed before this request is counted, as Pick saw it.
		f.ahead += int64(pa.unseen(ep, s).work)
		pa.workSum.Add(f.work)
		pa.workN.Add(1)
	}
	s.pending.Add(f.work)
	s.waiting.Add(1)
	s.enqueue(f, now)
	if pa.affTau > 0 && req.PromptTokens > 0 {
		s.addAffinity(float64(cachedTokens(req, f.predicted))/float64(req.PromptTokens), now, pa.affTau)
	}
	pa.inflight.Store(req, f)
	pa.index.Insert(ep.ID, req.Blocks, now)
	if req.SessionKey != "" {
		pa.sessions.put(req.SessionKey, ep.ID)
	}
}

// FirstToken takes the request's work off ep's queue and learns from its TTFT.
func (pa *prefixAware) FirstToken(req *Request, ep *endpoint.Endpoint, ttft time.Duration) {
	v, ok := pa.inflight.Load(req)
	if !ok {
		return
	}
	f := v.(*paFlight)
	if f.ep != ep.ID || !f.first.CompareAndSwap(false, true) {
		return
	}
	s := pa.state(ep.ID)
	s.pending.Add(-f.work)
	s.waiting.Add(-1)
	s.dequeue(f, pa.clock.Now().UnixNano())
	if pa.learn && ttft > 0 {
		predicted := pa.overhead0 + float64(f.ahead)/pa.rate0
		s.speed.add(predicted, ttft.Seconds(), pa.learnWeight)
		pa.fleet.add(predicted, ttft.Seconds(), pa.learnWeight/4)
	}
}

// unseen is the load that ep's last scraped metrics show beyond this router's own counts (zero
// without snapshot_load): requests running or waiting there that it did not send, the waiting
// ones among them, and their estimated prefill work.
func (pa *prefixAware) unseen(ep *endpoint.Endpoint, s *paState) paUnseen {
	if !pa.snapLoad {
		return paUnseen{}
	}
	sn := ep.Snapshot()
	if sn == nil {
		return paUnseen{}
	}
	var u paUnseen
	u.waiting = max(int64(sn.Waiting)-s.waiting.Load(), 0)
	u.inFlight = max(int64(sn.Running+sn.Waiting)-int64(ep.InFlight()), 0)
	if n := pa.workN.Load(); n > 0 {
		u.work = float64(u.waiting) * float64(pa.workSum.Load()) / float64(n)
	}
	return u
}

// queued is the prefill work still ahead on endpoint s at now: everything routed there and not
// yet at its first token, less what the head of the queue has done since it started (at the
// calibrated rate, never more than its own work). Without that, a long prefill would count in
// full until its last chunk, and a request whose prefix s holds would leave for a shorter
// queue, and recompute there, while s is about to be free.
func (pa *prefixAware) queued(s *paState, now int64, fleet float64) float64 {
	w := float64(s.pending.Load())
	if !pa.progress {
		return w
	}
	head := s.headWork.Load()
	if head <= 0 {
		return w
	}
	elapsed := float64(now-s.headSince.Load()) / 1e9
	done := (elapsed/pa.speedOf(s, fleet) - pa.overhead0) * pa.rate0
	return w - min(max(done, 0), float64(head))
}

// speedOf is the calibration factor used for endpoint s: the fleet's, unless s's own differs
// from it by more than learn_tolerance.
func (pa *prefixAware) speedOf(s *paState, fleet float64) float64 {
	if !s.speed.learned.Load() {
		return fleet // its own default (1) is no measurement, the fleet's is
	}
	own := s.speed.get()
	if math.Abs(own/fleet-1) <= pa.learnTol {
		return fleet
	}
	return own
}

// PrefillRate is the calibrated prefill rate of endpoint id, in tokens per second.
func (pa *prefixAware) PrefillRate(id int) float64 {
	return pa.rate0 / pa.speedOf(pa.state(id), pa.fleet.get())
}

// Done ends the request's bookkeeping and corrects the index when the engine had less cached
// than the index predicted.
func (pa *prefixAware) Done(req *Request, ep *endpoint.Endpoint, res Result) {
	v, ok := pa.inflight.LoadAndDelete(req)
	if !ok {
		return
	}
	f := v.(*paFlight)
	if f.ep != ep.ID {
		return
	}
	s := pa.state(ep.ID)
	if f.first.CompareAndSwap(false, true) {
		s.pending.Add(-f.work)
		s.waiting.Add(-1)
		s.dequeue(f, pa.clock.Now().UnixNano())
		if !res.OK {
			// It failed before its first token: the engine most likely never computed it, so
			// the blocks Routed added are not there.
			pa.index.Drop(ep.ID, req.Blocks[min(f.predicted, len(req.Blocks)):])
			return
		}
	}
	if pa.correct && res.CachedTokens >= 0 && req.BlockTokens > 0 {
		got := res.CachedTokens / req.BlockTokens
		want := cachedTokens(req, f.predicted) / req.BlockTokens
		if got < want && got < len(f.stamps) {
			pa.index.Forget(ep.ID, f.stamps[got])
		}
	}
	if pa.touchDone && res.OK {
		pa.index.Insert(ep.ID, req.Blocks, pa.clock.Now().UnixNano())
	}
}

// Removed forgets everything about ep.
func (pa *prefixAware) Removed(ep *endpoint.Endpoint) {
	pa.index.Remove(ep.ID)
	pa.mu.Lock()
	if ep.ID < len(pa.eps) {
		pa.eps[ep.ID] = nil
	}
	pa.mu.Unlock()
}

// PredictCached returns the prompt tokens of req that the index believes ep holds.
func (pa *prefixAware) PredictCached(req *Request, ep *endpoint.Endpoint) int {
	n, _ := pa.index.MatchOne(ep.ID, req.Blocks, nil)
	return cachedTokens(req, n)
}

// IndexSize returns the index's (block, endpoint) entries and bytes.
func (pa *prefixAware) IndexSize() (int, int64) { return pa.index.Size() }

// sessionMap remembers the endpoint that served each session last, in two generations so that
// its memory is bounded without per-entry bookkeeping: when the young map is full it becomes
// the old one and the previous old one is dropped.
type sessionMap struct {
	mu         sync.Mutex
	max        int
	young, old map[string]int
}

func (m *sessionMap) get(key string) (int, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if id, ok := m.young[key]; ok {
		return id, true
	}
	id, ok := m.old[key]
	return id, ok
}

func (m *sessionMap) put(key string, id int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.young == nil {
		m.young = map[string]int{}
	}
	if _, ok := m.young[key]; !ok && len(m.young) >= max(m.max/2, 1) {
		m.old, m.young = m.young, map[string]int{}
	}
	m.young[key] = id
}
