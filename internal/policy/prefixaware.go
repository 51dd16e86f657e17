package policy

import (
	"io"
	"maps"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/prefix"
)

// prefixAware is kvroute's own policy (name "prefix-aware"): it predicts each candidate's
// time to first token from the prefill work queued there plus this request's uncached work
// (what the approximate index, one LRU per endpoint sized like its KV cache, says the endpoint
// lacks), at the endpoint's measured prefill speed, and picks the smallest under a bounded-load
// guard. Its eight parameters, what each means, how its default was chosen and what it does to
// the scorecard are in docs/policy.md; everything else it derives from what it measures.
//
//	cost = (speed x (overhead + (queued + new x (1 + cache_weight x (1/2 + pressure))
//	                             + affinity x uncached x (queued + uncached/2) / rate
//	                             + shared) / rate)
//	        + decodes x decode_cost) x attempts per answer
//
// queued is the work routed there and not yet at its first token, less what the head of the
// queue has done since it started; uncached counts attention_weight token-equivalents per
// million attention pairs; new is uncached less what of the fleet's common prefix the
// endpoint lacks; pressure (0..1) is how fast the endpoint's cache filled per second in the
// fleet, or how fresh what it would evict; affinity is the rate of requests its cache draws,
// averaged over affinity_window; shared is the work of this request's first chunk that an
// engine with chunked prefill computes in the last step of the request at the tail of the
// queue, delaying that one's first token (step_tokens tokens a step; see stepTail); speed is
// the ratio of observed to predicted TTFTs, the
// fleet's unless an endpoint's own differs by more than learnTolerance; attempts per answer is
// 1 + the attempts there that failed by the engine's doing / those that succeeded, fading over
// affinity_window (attemptsPerAnswer): an engine that fails fast keeps no queue and no cache,
// and would otherwise rank cheapest. An endpoint takes a
// request only while it holds at most max_load_factor x its share of the requests in flight,
// this one counted (shares in proportion to speed, of a fleet capacity in which an endpoint
// that joined later counts by its time in the fleet over the oldest's, up to affinity_window,
// so that every share is larger while it is new); the others are ranked after it,
// except a conversation's home with no request waiting for its first token that has been less
// busy than the candidates' mean (over about the last affinity window), or where as many
// requests in flight as it is over its bound have shorter prompts, cheaper to move (the bound
// sheds those first). An engine that reports fewer cached tokens than predicted makes the
// index forget what the engine evicted; a request's blocks become most recent again when it
// ends. With one router a request may be
// held before the pick (Defer) until the last step of the queue it would join has started
// (stepHold).
type prefixAware struct {
	clock       Clock
	index       *prefix.Index
	maxLoad     float64
	attn        float64 // token-equivalents of work per million attention pairs
	decodeCost  float64 // seconds per running decode
	cacheWeight float64 // weight of new cache content: of the request's own uncached work
	affTau      float64 // seconds over which affinity traffic is averaged; 0: no such term
	stepTokens  int64   // tokens per step under chunked prefill of endpoints without their own (stepOf); 0: no shared-step term
	fallbackCap int     // index blocks per endpoint when its KV capacity is unknown

	// Mechanisms that are always on; tests turn them off to see each one alone.
	progress  bool // count the head's prefill progress off the queue
	touchDone bool // renew a request's blocks in the index when it ends
	learn     bool // calibrate each endpoint's speed from observed TTFTs
	correct   bool // forget what the engine reports it no longer holds

	fleet    speedFit   // all endpoints together
	pooled   ttftRatio  // every endpoint's scraped TTFTs and the router's predictions (scrapedttft.go)
	replicas paReplicas // the other router replicas placing alongside this one (replicas.go)

	// eps is each endpoint's state, by slot: the endpoint's name in the index too.
	eps      *epTable[*paState]
	inflight sync.Map  // *Request -> *paFlight
	scratch  sync.Pool // *paScratch
}

// The prior TTFT model and how the router calibrates it. They are not parameters: the prior
// stands only until an endpoint has learnMin TTFTs of its own (the fleet's calibration stands
// in before that), and the rest are statistics, not properties of a fleet.
const (
	// prefillRate and overhead are the prior model: TTFT = overhead + work / prefillRate,
	// about a 70B model on 8 GPUs; what the router learns is the ratio of observed to prior.
	prefillRate = 10000.0 // tokens per second
	overhead    = 0.02    // seconds
	// learnWeight is the weight of one TTFT in an endpoint's calibration (an exponential
	// average over about its last 50 requests, or its last affinity_window where that holds
	// fewer: speedFit); the fleet's averages four times as many requests, whenever they came.
	learnWeight = 0.02
	// learnMin is the TTFTs an endpoint needs before its own calibration counts (within about
	// an affinity_window: speedFit).
	learnMin = 5
	// learnTolerance: an endpoint's own calibration replaces the fleet's only when it differs
	// by more than this, so that noise between like instances does not steer traffic while a
	// mixed fleet's H100 (half an H200's speed) or a degraded instance is seen for what it is.
	learnTolerance = 0.25
	// maxSpeedFactor bounds the calibration both ways (an endpoint 20 times slower or faster
	// than the prior), and what one TTFT may say.
	maxSpeedFactor = 20.0
)

// paState is what the policy tracks per endpoint.
type paState struct {
	slot     int          // the endpoint's slot (epTable): its name in the index; -1: none
	gone     atomic.Bool  // the endpoint was removed: its late calls leave the index alone
	kvTokens atomic.Int64 // KV capacity last given to the index
	pending  atomic.Int64 // uncached prefill work routed and not yet at first token
	waiting  atomic.Int64 // requests routed and not yet at first token
	speed    speedFit
	blind    atomic.Bool  // ranked on load alone (policy.CacheBlind): its engine's hits stay far below the index's
	joined   atomic.Int64 // unix nanoseconds of its first Pick as a candidate: its time in the fleet starts

	// The head of the queue: the oldest request routed here and not yet at first token, whose
	// prefill is in progress (the engine is FCFS). headSince is when it started: when it was
	// routed to an idle endpoint, or when the request before it reached its first token.
	headWork  atomic.Int64
	headSince atomic.Int64 // unix nanoseconds
	// due is when the head's first token is predicted, unix nanoseconds, while the head is an
	// answer that comes whole (settle); 0 otherwise.
	due atomic.Int64
	// scraped is the engine's last scrape whose TTFTs the calibration read (readScrape).
	scraped atomic.Pointer[endpoint.Snapshot]

	mu     sync.Mutex  // guards queue, live, stream, align, base and window
	window ttftWindow  // first tokens since the last scrape read (scrapedttft.go)
	queue  []*paFlight // routed and not yet at first token, in routing order
	live   []*paFlight // routed and not done, in routing order (shorterInFlight)
	// The queue as an engine with chunked prefill steps through it (stepTail): its uncached
	// tokens as one stream since it was last empty, each request's ending at its end; steps of
	// step tokens each from align on (a request routed while the tail's last step ran starts
	// the next one); base is where the head's own progress starts.
	stream, align, base int64
	step                int64 // the endpoint's step budget in router tokens (stepOf), as of the last enqueue

	// Affinity traffic: requests routed here weighted by the fraction of their prompt it held,
	// per second over the affinity window.
	affinity decayed

	// Work and requests routed here by any replica, per second over placedWindow, while
	// there are replicas whose placements arrive late (replicas.go).
	placedWork, placedN decayed

	// heldUntil is when the last request held for this endpoint (stepHold) is placed, unix
	// nanoseconds: a request that would go here meanwhile waits until after it.
	heldUntil atomic.Int64

	// busy is when the endpoint has had a request routed here and not done: its busy time
	// as the router sees it (the load bound's rule for a conversation's home).
	busy busyClock

	// caps learns the endpoint's capacity while it is unknown (capacity.go); nil until then.
	caps atomic.Pointer[capState]

	// fails and answers are this router's attempts here that failed by the engine's doing and
	// those that succeeded, each fading over the affinity window (failTau): the attempts an
	// answer takes here (attemptsPerAnswer) multiply the endpoint's cost.
	fails, answers decayed
}

// busyClock integrates the time an endpoint has at least one request in flight, each second
// weighted by e^(-age/tau) (tau: the affinity window), or in full without a window.
type busyClock struct {
	mu     sync.Mutex
	active int
	since  int64   // unix nanoseconds of the last change
	busy   float64 // weighted busy seconds before since, as of since
}

// add counts d more requests in flight (-1: one done) at now.
func (b *busyClock) add(d int, now int64, tau float64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.busy = b.upTo(now, tau)
	b.since = now
	b.active = max(b.active+d, 0)
}

// upTo is the weighted busy seconds as of now. The caller holds mu.
func (b *busyClock) upTo(now int64, tau float64) float64 {
	dt := float64(now-b.since) / 1e9
	if b.since == 0 || dt <= 0 {
		return b.busy
	}
	if tau <= 0 {
		return b.busy + dt*float64(min(b.active, 1))
	}
	k := math.Exp(-dt / tau)
	return b.busy*k + tau*(1-k)*float64(min(b.active, 1))
}

// busyFraction is s's busy time over its time in the fleet, both weighted alike: over about the
// last affinity window, or its whole time in the fleet with none.
func (pa *prefixAware) busyFraction(s *paState, now int64) float64 {
	s.busy.mu.Lock()
	busy := s.busy.upTo(now, pa.affTau)
	s.busy.mu.Unlock()
	t := float64(max(now-s.joined.Load(), 1)) / 1e9
	if pa.affTau > 0 {
		t = pa.affTau * (1 - math.Exp(-t/pa.affTau))
	}
	return busy / t
}

// enqueue appends f to the queue and to the requests in flight (live); f becomes the head,
// starting now, if the queue was empty.
// Its tokens start a step of their own when the last step of the queue's tail has started by
// the head's progress at speed. step is the endpoint's step budget now (stepOf): the queue is
// never empty when it is read (stepTail), so it is always the one of a recent enqueue.
func (s *paState) enqueue(f *paFlight, now int64, speed float64, step int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.step = step
	f.alignBefore = s.align
	if start, _, at, ok := s.stepTail(now, speed); ok && at >= start {
		s.align = s.stream
	}
	s.queue = append(s.queue, f)
	s.live = append(s.live, f)
	if len(s.queue) == 1 {
		s.headWork.Store(f.work)
		s.headSince.Store(now)
		s.stream, s.align, s.base = 0, 0, 0
		s.dueHead(speed)
	}
	s.stream += f.tokens
	f.end = s.stream
}

// dueHead sets due for the queue's head, which started at headSince, at speed. The caller holds
// mu.
func (s *paState) dueHead(speed float64) {
	if len(s.queue) == 0 || !s.queue[0].whole {
		s.due.Store(0)
		return
	}
	s.due.Store(s.headEnds(speed))
}

// headEnds is when the head's prefill ends by the queue model at speed (queued counts its
// progress alike), unix nanoseconds. The caller holds mu; the queue is not empty.
func (s *paState) headEnds(speed float64) int64 {
	return s.headSince.Load() + int64(priorTTFT(s.queue[0].work)*speed*1e9)
}

// priorTTFT is the prior model's TTFT, in seconds, of a request with work queued ahead of it
// and its own: what every calibration divides by.
func priorTTFT(work int64) float64 { return overhead + float64(work)/prefillRate }

// settle takes off s's queue the answers that come whole (not streamed) whose first token is
// due by now: the router never sees it, so it is taken to come when the queue model, at speed,
// says the head's prefill ends, and the next request starts then. Until settle, such a request
// would wait in the queue for its whole answer, and its prefill count against the endpoint for
// as long as its decode lasts.
func (s *paState) settle(now int64, speed float64) {
	if d := s.due.Load(); d == 0 || d > now {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(s.queue) > 0 && s.queue[0].whole {
		f := s.queue[0]
		at := s.headEnds(speed)
		if at > now {
			s.due.Store(at)
			return
		}
		s.settled(f)
		s.dequeueLocked(f, at, speed)
	}
}

// settleAhead takes off the queue the answers that come whole ahead of f, whose first token
// came now: the engine computes its queue in order, so theirs came before. The caller holds mu.
func (s *paState) settleAhead(f *paFlight, now int64, speed float64) {
	for len(s.queue) > 0 && s.queue[0] != f && s.queue[0].whole {
		g := s.queue[0]
		s.settled(g)
		s.dequeueLocked(g, now, speed)
	}
}

// settled counts g's first token, unless its end counted it first.
func (s *paState) settled(g *paFlight) {
	if g.first.CompareAndSwap(false, true) {
		s.pending.Add(-g.work)
		s.waiting.Add(-1)
		s.firstOf(g, true)
	}
}

// shorterInFlight is how many requests routed to s and not done have prompts shorter than
// tokens: sessions that a move would recompute less of than one with tokens of context.
func (s *paState) shorterInFlight(tokens int) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var n int64
	for _, f := range s.live {
		if f.prompt < tokens {
			n++
		}
	}
	return n
}

// dequeueLocked takes f off the queue (its first token came, or it failed); if f was the head,
// the next request becomes the head, starting now (its due time at speed: settle). The caller
// holds mu.
func (s *paState) dequeueLocked(f *paFlight, now int64, speed float64) {
	k := slices.Index(s.queue, f)
	if k < 0 {
		return
	}
	s.queue = slices.Delete(s.queue, k, k+1)
	if k > 0 {
		if k == len(s.queue) {
			// The tail: the stream is as before it was appended (Completed relies on it).
			s.stream, s.align = f.end-f.tokens, f.alignBefore
			return
		}
		// It failed before its first token: the requests after it move up by its tokens.
		for _, g := range s.queue[k:] {
			g.end -= f.tokens
		}
		s.stream -= f.tokens
		if s.align >= f.end {
			s.align -= f.tokens
		} else {
			s.align = min(s.align, f.end-f.tokens)
		}
		return
	}
	if len(s.queue) == 0 {
		s.headWork.Store(0)
		s.due.Store(0)
		return
	}
	s.headWork.Store(s.queue[0].work)
	s.headSince.Store(now)
	s.dueHead(speed)
	// Its first token came at the end of the step that held its last tokens, which computed
	// the next request's up to the step's end.
	s.base = f.end
	if s.step > 0 && f.end > s.align {
		s.base = min(s.align+(f.end-s.align+s.step-1)/s.step*s.step, s.stream)
	}
}

// stepTail is where, in the queue's stream, the last step that holds its tail starts, how
// many tokens that step holds, and where the head's prefill is by its progress at speed; ok is
// false when the queue is empty, there is no step budget, or the tail's last step is full.
// An engine with chunked prefill (vLLM's max_num_batched_tokens, SGLang's
// chunked_prefill_size) fills each step's budget from its queue in order: a request that
// arrives before that step starts fills it, and every request whose last tokens it holds
// gets its first token that much later. s.mu is held.
func (s *paState) stepTail(now int64, speed float64) (start, fill, at int64, ok bool) {
	if len(s.queue) == 0 || s.step <= 0 {
		return 0, 0, 0, false
	}
	start = s.align + (s.stream-1-s.align)/s.step*s.step
	fill = s.stream - start
	head := s.queue[0]
	at = max(head.end-head.tokens, s.base)
	if head.work > 0 {
		elapsed := float64(now-s.headSince.Load()) / 1e9
		done := min(max((elapsed/speed-overhead)*prefillRate, 0), float64(head.work))
		at += int64(done * float64(head.tokens) / float64(head.work))
	}
	return start, fill, at, fill < s.step
}

// speedFit calibrates the prior TTFT model: factor = observed / predicted TTFT, as
// exponentially weighted sums over the last samples. With a horizon, the calibration lapses
// (staleAt) when no sample has come for as long as the samples' weight would take to fade
// under learnMin at that horizon (horizon x ln(weight / learnMin): about 2.3 horizons for a
// calibration of 50 samples); from then on its weight against what stands in for it (the
// fleet's) fades as e^(-t/horizon), geometrically, and the next sample starts from what the
// faded calibration says with the weight of learnMin samples: an endpoint that takes no
// requests yields no TTFTs, so what it showed last would otherwise stand for ever. While
// samples come, at any rate above that, nothing changes. Without the lapse, a transient stall
// (an engine hung for 20 s, whose held requests then report TTFTs of 10 to 20 s) kept an
// engine out of the fleet's traffic for as long as the router ran: calibrated 20 times
// slower, it was never chosen again, so it never showed that it had recovered. A lapse that
// dropped the calibration at once (December 2026) brought such an engine back in a burst:
// replicas that do not sync, each of which sees the others' load on an engine only as its
// slowness, paid for it (docs/policy.md, "A stall is not a speed").
//
// With a horizon, the samples also age with time at that horizon, not only by the samples that
// came after them: the calibration says what the engine did over about the last horizon, or
// its last 1/weight samples where those came sooner. Counted by samples alone, an endpoint
// that a burst calibrated slow, and that was chosen since only now and then (one request in
// ten seconds, where the others took a hundred), kept the burst's figure for as many of those
// rare samples as it took to outweigh it: minutes. The lapse above is the same ageing seen
// from the last sample: the weight falls under learnMin horizon x ln(weight / learnMin) after
// it.
type speedFit struct {
	factor  atomic.Uint64 // float64 bits; 1 until learned
	learned atomic.Bool   // enough samples to say
	staleAt atomic.Int64  // unix ns after which, with no sample since, the calibration has lapsed
	horizon atomic.Int64  // ns, the last add's

	mu                 sync.Mutex
	n, observed, prior float64
	last               int64 // unix ns of the last sample: with a horizon, the sums age from it
}

func (f *speedFit) init() {
	f.factor.Store(math.Float64bits(1))
	f.staleAt.Store(math.MaxInt64)
}

func (f *speedFit) get() float64 { return math.Float64frombits(f.factor.Load()) }

// own is the calibration at now, if there is one, and the weight it has against what stands
// in for it: 1 until it lapses, then fading as e^(-t/horizon) with the time t since.
func (f *speedFit) own(now int64) (factor, weight float64, ok bool) {
	if !f.learned.Load() {
		return 0, 0, false
	}
	if at := f.staleAt.Load(); now >= at {
		return f.get(), math.Exp(-float64(now-at) / float64(f.horizon.Load())), true
	}
	return f.get(), 1, true
}

// faded is own at weight w against stand, geometrically.
func faded(own, stand, w float64) float64 {
	if w >= 1 {
		return own
	}
	return math.Exp(w*math.Log(own) + (1-w)*math.Log(stand))
}

// add records one request at now: predicted by the prior model, observed ttft, both in
// seconds. horizon (seconds; 0: never) sets when a calibration without samples lapses; a
// lapsed one goes on from its faded figure against stand (what stands in for it), with the
// weight of learnMin samples.
func (f *speedFit) add(predicted, observed, weight float64, now int64, horizon, stand float64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	keep := 1 - weight
	if horizon > 0 && f.last != 0 && now > f.last {
		// The samples age with time too, at the horizon: what the lapse assumes of them.
		d := math.Exp(-float64(now-f.last) / (horizon * 1e9))
		f.n, f.observed, f.prior = f.n*d, f.observed*d, f.prior*d
	}
	f.last = now
	if horizon > 0 && f.learned.Load() && now >= f.staleAt.Load() {
		// Lapsed: what it says now (faded towards stand) with the weight of learnMin samples.
		own, w, _ := f.own(now)
		avg := f.prior / f.n
		f.n, f.prior = learnMin, learnMin*avg
		f.observed = faded(own, stand, w) * f.prior
	}
	f.n = f.n*keep + 1
	// One sample counts as at most maxSpeedFactor times its prediction, the most the factor
	// may say: a request held by a stalled engine (20 s against 50 ms predicted) would
	// otherwise outweigh hundreds of others, in the endpoint's calibration and in the fleet's.
	observed = min(observed, predicted*maxSpeedFactor)
	f.observed = f.observed*keep + observed
	f.prior = f.prior*keep + predicted
	if f.n < learnMin || f.prior <= 0 {
		return // too few samples to say
	}
	f.factor.Store(math.Float64bits(min(max(f.observed/f.prior, 1/maxSpeedFactor), maxSpeedFactor)))
	if horizon > 0 {
		f.horizon.Store(int64(horizon * 1e9))
		f.staleAt.Store(now + int64(horizon*math.Log(f.n/learnMin)*1e9))
	}
	f.learned.Store(true)
}

// paFlight is one routed request until it is done.
type paFlight struct {
	ep          int               // the endpoint's ID
	s           *paState          // its state when the request was routed
	work        int64             // this request's uncached work
	tokens      int64             // its uncached tokens
	end         int64             // where its tokens end in ep's queue stream (paState.stepTail)
	alignBefore int64             // the stream's step alignment before it was appended
	ahead       int64             // work queued on ep before it, plus its own
	predicted   int               // blocks the index said ep held
	runs        []prefix.StampRun // index stamps of those blocks, for the correction
	first       atomic.Bool       // first token seen (or settled), or done
	whole       bool              // the answer comes whole: its first token is predicted (settle)
	probe       capProbe          // evidence of ep's capacity when it is unknown (capacity.go)
	mark        uint64            // ep's index mark after Routed's insert (done's Reinsert)
	prompt      int               // the request's prompt tokens: the context a move of its session recomputes
}

// paScratch is what one scoring needs, by candidate position: never by endpoint ID, which
// grows with every endpoint the pool has ever had.
type paScratch struct {
	ids    []int // the candidates' slots (epTable), -1 for one that left
	runs   []int32
	tails  []int64
	fill   []float64
	scored []paScore
	states []*paState
	costs  []float64 // spread's running costs
	held   []int32   // commonRun's runs of the candidates
	common int32     // blocks of the request at least half the candidates hold (commonRun)
}

type paScore struct {
	i          int
	eligible   bool
	cost, ttft float64 // ttft: this request's own predicted TTFT, seconds
	own, speed float64 // the request's work there and the endpoint's calibrated speed
}

// removedPrefixAware names the parameters prefix-aware once took, and what took their
// place (docs/policy.md).
var removedPrefixAware = map[string]string{
	"prefill_rate":     "each endpoint's prefill speed is learned from its observed TTFTs",
	"overhead":         "each endpoint's speed is learned from its observed TTFTs",
	"learn":            "learning from observed TTFTs is always on",
	"learn_weight":     "learning from observed TTFTs is always on, with a fixed horizon",
	"learn_tolerance":  "learning from observed TTFTs is always on, with a fixed tolerance",
	"correct":          "forgetting what the engines' cached_tokens disprove is always on",
	"head_progress":    "counting the queue head's progress is always on",
	"touch_done":       "refreshing the index when a request ends is always on",
	"recompute_weight": "it and balance_weight are one parameter, cache_weight",
	"balance_weight":   "it and recompute_weight are one parameter, cache_weight",
	"session_slack":    "the session tie-break is gone (no measured effect)",
	"sessions":         "the session tie-break is gone (no measured effect)",
	"snapshot_load":    "replicas share their routing state instead (peers:)",
}

func newPrefixAware(env Env, p Params) (Picker, error) { return newPrefixAwareFrom(env, env.params(p)) }

func newPrefixAwareFrom(env Env, r *paramReader) (Picker, error) {
	pa := &prefixAware{
		clock:       env.Clock,
		maxLoad:     r.Float("max_load_factor", 2),
		attn:        r.Float("attention_weight", 25),
		decodeCost:  r.Float("decode_cost", 0.0005),
		cacheWeight: r.Float("cache_weight", 6),
		affTau:      r.Float("affinity_window", 60),
		stepTokens:  int64(r.Int("step_tokens", 8192)),
		fallbackCap: r.Int("index_blocks", 65536),
		progress:    true,
		touchDone:   true,
		learn:       true,
		correct:     true,
	}
	maxEntries := r.Int("max_index_entries", 16<<20)
	for _, key := range slices.Sorted(maps.Keys(removedPrefixAware)) {
		r.Gone(key, removedPrefixAware[key])
	}
	r.Require(pa.maxLoad >= 1, "max_load_factor=%g must be at least 1 (2 lets an endpoint take twice its share of the requests in flight)", pa.maxLoad)
	r.Require(pa.attn >= 0, "attention_weight=%g must not be negative (token-equivalents per million attention pairs)", pa.attn)
	r.Require(pa.decodeCost >= 0, "decode_cost=%g must not be negative (seconds per running decode)", pa.decodeCost)
	r.Require(pa.cacheWeight >= 0, "cache_weight=%g must not be negative", pa.cacheWeight)
	r.Require(pa.affTau >= 0, "affinity_window=%g must not be negative (seconds; 0 turns the term off)", pa.affTau)
	r.Require(pa.stepTokens >= 0, "step_tokens=%d must not be negative (an engine's tokens per step under chunked prefill; 0 turns the term off)", pa.stepTokens)
	r.Require(pa.fallbackCap > 0, "index_blocks=%d must be positive", pa.fallbackCap)
	r.Require(maxEntries >= 0, "max_index_entries=%d must not be negative (0: no cap)", maxEntries)
	if err := r.Check(); err != nil {
		return nil, err
	}
	if pa.clock == nil {
		pa.clock = WallClock{}
	}
	pa.index = prefix.NewIndex(prefix.IndexConfig{DefaultCapacity: pa.fallbackCap, MaxEntries: maxEntries})
	pa.eps = newEPTable(pa.clock, func(slot int, reused bool) *paState {
		if reused {
			pa.index.Remove(slot) // what a late call wrote there after the last one left
		}
		return pa.newState(slot)
	})
	pa.fleet.init()
	return pa, nil
}

// newState is a new endpoint's state, in slot (-1: none, for an endpoint that left).
func (pa *prefixAware) newState(slot int) *paState {
	s := &paState{slot: slot, step: pa.stepTokens}
	s.speed.init()
	return s
}

// stateOf returns ep's state, creating it, or nil when ep left the pool and its state is gone:
// a request that ends on an endpoint after it left brings nothing of it back.
func (pa *prefixAware) stateOf(ep *endpoint.Endpoint) *paState {
	_, s, ok := pa.eps.get(ep)
	if !ok {
		return nil
	}
	return s
}

// find returns endpoint id's state, nil when the policy has none.
func (pa *prefixAware) find(id int) *paState {
	_, s, _ := pa.eps.find(id)
	return s
}

// sizeIndex gives the index ep's KV capacity when it is known or learned and has changed.
func (pa *prefixAware) sizeIndex(ep *endpoint.Endpoint, s *paState, blockTokens int) {
	kv := pa.kvTokens(ep, s)
	if kv <= 0 || blockTokens <= 0 || s.slot < 0 || s.kvTokens.Load() == kv {
		return
	}
	s.kvTokens.Store(kv)
	pa.index.SetCapacity(s.slot, int(kv)/blockTokens)
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
	return int64(pa.prefill(int64(cached), max(uncached(req, cached), 1)))
}

// prefill is the work, in token-equivalents, of computing u tokens that follow cached ones:
// the tokens, and the attention pairs each forms with the context before it.
func (pa *prefixAware) prefill(cached, u int64) float64 {
	pairs := float64(u)*float64(cached) + float64(u)*float64(u+1)/2
	return float64(u) + pa.attn*pairs/1e6
}

// uncached is how many of req's prompt tokens (at least one) are not among cached.
func uncached(req *Request, cached int) int64 { return int64(max(req.PromptTokens, 1) - cached) }

// getScratch returns scratch for the candidates c, their slots and states filled in (a
// candidate that left without a state gets a state of its own for this scoring, and slot -1).
func (pa *prefixAware) getScratch(c []*endpoint.Endpoint) *paScratch {
	n := len(c)
	sc, _ := pa.scratch.Get().(*paScratch)
	if sc == nil {
		sc = &paScratch{}
	}
	sc.ids, sc.states = sized(sc.ids, n), sized(sc.states, n)
	pa.eps.gather(c, sc.ids, sc.states)
	for i, s := range sc.states {
		if s == nil {
			sc.states[i] = pa.newState(-1)
		}
	}
	sc.runs, sc.tails, sc.fill = sized(sc.runs, n), sized(sc.tails, n), sized(sc.fill, n)
	sc.scored = sized(sc.scored, n)
	return sc
}

// sized returns s with length n, reusing its array when it is large enough (what was in it
// stays: the caller writes every element it reads).
func sized[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

// Pick ranks candidates by predicted TTFT, the ones within the load bound first.
func (pa *prefixAware) Pick(req *Request, c []*endpoint.Endpoint) ([]*endpoint.Endpoint, error) {
	n := len(c)
	if n == 0 {
		return nil, ErrNoCandidate
	}
	sc := pa.score(req, c)
	defer pa.scratch.Put(sc)
	out := make([]*endpoint.Endpoint, n)
	for k, s := range sc.scored {
		out[k] = c[s.i]
	}
	return out, nil
}

// Explain returns what Pick weighs for each candidate, in Pick's order.
func (pa *prefixAware) Explain(req *Request, c []*endpoint.Endpoint) []Explanation {
	if len(c) == 0 {
		return nil
	}
	sc := pa.score(req, c)
	defer pa.scratch.Put(sc)
	out := make([]Explanation, len(c))
	for k, s := range sc.scored {
		e := c[s.i]
		out[k] = Explanation{
			Endpoint:      e,
			CachedTokens:  cachedTokens(req, int(sc.runs[s.i])),
			PredictedTTFT: time.Duration(s.ttft * float64(time.Second)),
			Cost:          s.cost,
			WithinBound:   s.eligible,
			CacheBlind:    sc.states[s.i].blind.Load(),
		}
	}
	return out
}

// score computes every candidate's cost and ranks them in sc.scored: within the load bound
// first, then by cost, then in candidate order. The caller puts sc back in the pool.
func (pa *prefixAware) score(req *Request, c []*endpoint.Endpoint) *paScratch {
	n := len(c)
	sc := pa.getScratch(c)
	states := sc.states
	now := pa.clock.Now().UnixNano()
	for i, e := range c {
		states[i].joined.CompareAndSwap(0, now)
		pa.sizeIndex(e, states[i], req.BlockTokens)
		pa.readScrape(states[i], e, now)
	}
	total := 0
	for _, e := range c {
		total += e.InFlight()
	}
	pa.index.MatchAmong(sc.runs, sc.ids, req.Blocks)
	// Cache pressure: where this request's new blocks would go, in 0..1. An endpoint with room
	// scores up to 0.5 by its fill per second in the fleet relative to the candidate that filled
	// fastest; a full one from 0.5 for the one whose oldest entry is oldest (what it evicts is
	// least useful) up to 1 for the youngest. Steering new content by it spreads the ownership
	// of prefixes, and so the follow-up traffic they attract, evenly (as SGLang's "smallest
	// tree" rule does for unmatched prompts). Per second in the fleet: an instance that joined
	// late has had less time to take content in, not less traffic to draw; where all joined
	// together it ranks as the fill does.
	var oldest int64
	var fullest float64
	if pa.cacheWeight > 0 {
		pa.index.FillAmong(sc.fill, sc.tails, sc.ids)
		for i := range c {
			sc.fill[i] /= inFleet(states[i], now, math.Inf(1))
			if t := sc.tails[i]; t != 0 {
				oldest = max(oldest, now-t)
			}
			fullest = max(fullest, sc.fill[i])
		}
	}
	sc.common = pa.commonRun(sc, c, states)
	// Bounded load: at most ceil(factor x its share) in flight after this request, each
	// endpoint's share of the fleet's requests in proportion to its calibrated speed, so that a
	// slower instance, which holds each request longer, is not pushed out of its own prefixes.
	// An endpoint that joined later counts in the fleet's capacity (capSum) by its time in the
	// fleet over the oldest candidate's, each counted up to the affinity window, which makes
	// every endpoint's share larger while it is new, its own included: its sessions come to it as
	// new ones start, and growing the fleet should not by itself push running sessions off the
	// instances that hold them (each such move recomputes a whole context); after a window
	// (the policy's horizon for rates) it counts in full, however long the others have been
	// in the fleet.
	fleet := pa.fleet.get()
	unseen := pa.replicas.unseen(req, now)
	var capSum, eldest float64
	for i := range c {
		eldest = max(eldest, inFleet(states[i], now, pa.affTau))
	}
	for i := range c {
		capSum += inFleet(states[i], now, pa.affTau) / eldest / pa.speedOf(states[i], fleet, now)
	}
	meanBusy := -1.0 // the candidates' mean busy fraction, once a home over the bound needs it
	for i, e := range c {
		s := states[i]
		speed := pa.speedOf(s, fleet, now)
		s.settle(now, speed)
		// The epsilon keeps an equal share (all speeds alike: 1/n) from rounding up a whole
		// request when factor x (total+1) / n is a whole number.
		limit := math.Ceil(pa.maxLoad*float64(total+1)/speed/capSum - 1e-9)
		if s.blind.Load() {
			sc.runs[i] = 0 // what the index says it holds is not what it serves
		}
		cached := cachedTokens(req, int(sc.runs[i]))
		own := float64(pa.work(req, cached))
		// New content costs the fleet beyond this request's own wait: it delays whatever is
		// queued after it and displaces cached content, the more so where the cache is under
		// pressure.
		weight := 1 + pa.cacheWeight/2
		if pa.cacheWeight > 0 {
			p := 0.0
			if fullest > 0 {
				p = sc.fill[i] / fullest / 2
			}
			if t := sc.tails[i]; t != 0 && oldest > 0 {
				p = 1 - float64(now-t)/float64(oldest)/2
			}
			weight += pa.cacheWeight * p
		}
		q := pa.queued(s, now, fleet)
		// What fetches the prefix the fleet has in common (a tool or system prompt that an
		// instance which joined or evicted it lacks) is not charged: the request waits for it
		// (its predicted TTFT counts it), but the copy is made once and the fleet gains a
		// holder of content most of it holds already, where every later request that starts
		// with it can go. Charged, one cold copy would keep a newcomer out of all such traffic.
		fresh := own
		if sc.common > sc.runs[i] {
			fresh = float64(pa.work(req, cachedTokens(req, int(sc.common))))
		}
		w := q + weight*fresh + unseen.delay(s, own, now) + pa.shared(s, req, cached, now, speed)
		if pa.affTau > 0 {
			// The requests this endpoint's cache will draw while this work is queued and done
			// wait for it: q + own/2 on average for each, at the affinity rate.
			w += s.affinity.get(now, pa.affTau) * own * (q + own/2) * speed / prefillRate
		}
		inFlight := int64(e.InFlight())
		decoding := max(inFlight-s.waiting.Load(), 0)
		ttft := (overhead+(q+own)/prefillRate)*speed + float64(decoding)*pa.decodeCost
		// Each failed attempt has to be made again: an endpoint whose engine fails requests
		// costs the attempts an answer takes there. One that fails fast never builds the queue
		// or the cache that make a working one look busier, and would otherwise rank cheapest.
		cost := ((overhead+w/prefillRate)*speed + float64(decoding)*pa.decodeCost) * pa.attemptsPerAnswer(s, now)
		// An endpoint within its bound takes one more: at the handful of requests in flight of
		// a quiet fleet, the bound is not to send a conversation away from its cache.
		eligible := float64(inFlight) <= limit
		// A conversation's home (it holds more of the request than the fleet's common prefix)
		// over the bound keeps the request while no request waits there for its first token
		// and it has been less busy than the candidates' mean, each over about the last
		// affinity window: the request waits for nothing there, moved it recomputes its whole
		// context, and shedding it would not even the fleet's busy time (docs/policy.md). With
		// no busy time seen yet (all alike) the bound decides. A home busier than the mean
		// keeps it too while as many of the requests in flight there as it is over the bound
		// have shorter prompts: the bound sheds the sessions that are cheapest to move, as
		// their next requests come, not the longest one because it came first.
		if !eligible && sc.runs[i] > sc.common && s.waiting.Load() == 0 {
			if meanBusy < 0 {
				sum := 0.0
				for _, o := range states {
					sum += pa.busyFraction(o, now)
				}
				meanBusy = sum / float64(n)
			}
			eligible = pa.busyFraction(s, now) < meanBusy ||
				s.shorterInFlight(req.PromptTokens) >= inFlight-int64(limit)
		}
		sc.scored[i] = paScore{i: i, eligible: eligible, cost: cost, ttft: ttft, own: own, speed: speed}
	}
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
	if unseen.peers > 0 {
		spread(sc, unseen.peers+1, unseen.rank)
	}
	return sc
}

// inFleet is how long, in seconds, the policy has known endpoint s at now (a nanosecond at
// least), counted up to horizon seconds; with no horizon (0), 1 for every endpoint.
func inFleet(s *paState, now int64, horizon float64) float64 {
	if horizon <= 0 {
		return 1
	}
	return min(float64(max(now-s.joined.Load(), 1))/1e9, horizon)
}

// commonRun is how many leading blocks of the request at least half the candidates, and at
// least two, hold (cache-blind ones counted as holding nothing): the prefix the fleet has in
// common, such as a tool or system prompt, as opposed to one conversation's own context,
// which its home alone holds. A conversation that moved once is held by two, which in a fleet
// of four is half: its second move is charged as its own wait only (docs/policy.md).
func (pa *prefixAware) commonRun(sc *paScratch, c []*endpoint.Endpoint, states []*paState) int32 {
	k := max(2, (len(c)+1)/2)
	if k > len(c) {
		return 0
	}
	held := sc.held[:0]
	for i := range c {
		r := sc.runs[i]
		if states[i].blind.Load() {
			r = 0
		}
		held = append(held, r)
	}
	sc.held = held
	slices.Sort(held)
	return held[len(held)-k]
}

// Routed records the request on ep: its work is queued there, and ep is about to hold its
// blocks. A request routed to an endpoint that has left and been forgotten (the router tries
// its first choice whatever became of it since the pick) is not tracked.
func (pa *prefixAware) Routed(req *Request, ep *endpoint.Endpoint) {
	if f := pa.routed(req, ep); f != nil {
		pa.inflight.Store(req, f)
	}
}

// routed is Routed; it returns the request's flight, nil when ep left the pool and is forgotten.
func (pa *prefixAware) routed(req *Request, ep *endpoint.Endpoint) *paFlight {
	s := pa.stateOf(ep)
	if s == nil {
		pa.replicas.held.Delete(req)
		return nil
	}
	pa.sizeIndex(ep, s, req.BlockTokens)
	f := &paFlight{ep: ep.ID, s: s, prompt: req.PromptTokens, whole: req.Whole}
	f.predicted, f.runs = pa.index.MatchRuns(s.slot, req.Blocks, nil)
	f.work = pa.work(req, cachedTokens(req, f.predicted))
	f.tokens = uncached(req, cachedTokens(req, f.predicted))
	now := pa.clock.Now().UnixNano()
	fleet := pa.fleet.get()
	speed := pa.speedOf(s, fleet, now)
	s.settle(now, speed)
	f.ahead = int64(pa.queued(s, now, fleet)) + f.work
	s.pending.Add(f.work)
	s.waiting.Add(1)
	s.busy.add(1, now, pa.affTau)
	s.enqueue(f, now, speed, pa.stepOf(ep))
	if pa.affTau > 0 && req.PromptTokens > 0 {
		s.affinity.add(float64(cachedTokens(req, f.predicted))/float64(req.PromptTokens), now, pa.affTau)
	}
	pa.replicas.routed(s, req, f.work, now)
	pa.probe(req, ep, s, f, now)
	f.mark = pa.index.InsertMark(s.slot, req.Blocks, now)
	return f
}

// FirstToken takes the request's work off ep's queue and learns from its TTFT.
func (pa *prefixAware) FirstToken(req *Request, ep *endpoint.Endpoint, ttft time.Duration) {
	if v, ok := pa.inflight.Load(req); ok {
		pa.firstToken(v.(*paFlight), ep, ttft)
	}
}

func (pa *prefixAware) firstToken(f *paFlight, ep *endpoint.Endpoint, ttft time.Duration) {
	if f.ep != ep.ID || !f.first.CompareAndSwap(false, true) {
		return
	}
	s := f.s
	s.pending.Add(-f.work)
	s.waiting.Add(-1)
	now := pa.clock.Now().UnixNano()
	speed := pa.speedOf(s, pa.fleet.get(), now)
	s.mu.Lock()
	s.settleAhead(f, now, speed)
	s.dequeueLocked(f, now, speed)
	s.firstOf(f, false)
	s.mu.Unlock()
	f.probe.sawQueue(s)
	pa.learnTTFT(s, ep, f.ahead, f.work, ttft, now)
}

// learnTTFT calibrates s's speed, and the fleet's, from a request's TTFT with ahead of work
// before it, first token at now on ep. An endpoint's own calibration fades over
// affinity_window, the horizon of the policy's other measures of an endpoint (the fleet's does
// not: it is what stands in). A TTFT whose wait overlapped a stall that a stall watch found
// (limits.stall_timeout; endpoint.StalledDuring) teaches nothing: the requests an engine held
// through a stall report the stall, and taken for speed they kept a recovered engine out of
// the traffic for minutes (docs/policy.md, "A stall is not a speed").
//
// The request's TTFT is its wait for the work queued ahead of it and its own (ahead), and the
// ratio of the two says how fast the endpoint went meanwhile; the endpoint's calibration
// counts that ratio with the weight of the request's own work (own), not of its whole wait.
// The work queued ahead is that of the requests before it, whose own TTFTs count it: weighted
// by its whole wait, each unit of work in a queue was counted once for every request behind
// it, and the TTFTs of a deep queue (a burst, an engine at its slowest) outweighed, dozens of
// times over, the short ones the engine showed after it, on an empty queue: an endpoint a burst
// calibrated four times slower takes a request only when the others' queues are deep, and its
// rare TTFTs, each predicted short, moved it from 2,471 to 2,733 tokens/s in ten minutes
// against the others' 9,600 (TestStarvedEndpointRecovers). The fleet's calibration keeps the whole wait's weight: it
// stands in for all of the endpoints and is never starved, and weighted the other way S1's hit
// rate fell (0.3461 to 0.3439).
func (pa *prefixAware) learnTTFT(s *paState, ep *endpoint.Endpoint, ahead, own int64, ttft time.Duration, now int64) {
	if !pa.learn || ttft <= 0 || ep.StalledDuring(now-int64(ttft), now) {
		return
	}
	predicted, observed := priorTTFT(ahead), ttft.Seconds()
	mine := priorTTFT(own)
	s.speed.add(mine, mine*min(observed/predicted, maxSpeedFactor), learnWeight, now, pa.affTau, pa.fleet.get())
	pa.fleet.add(predicted, observed, learnWeight/4, now, 0, 0)
}

// shared is the work by which placing req on s delays the first token of the request at the
// tail of s's queue: when the tail's last step has not started and has room, req's first
// chunk fills it (up to s's step budget less what the step holds), and the tail's first token
// comes with that fuller step. The request placed pays nothing for it (its own tokens are
// computed as early either way), so the queue, which charges each request the work ahead of
// it, leaves this delay charged to nobody. cached is what s holds of req.
func (pa *prefixAware) shared(s *paState, req *Request, cached int, now int64, speed float64) float64 {
	if pa.stepTokens <= 0 {
		return 0
	}
	s.mu.Lock()
	start, fill, at, ok := s.stepTail(now, speed)
	step := s.step
	s.mu.Unlock()
	if !ok || at >= start {
		return 0 // no queue, a full last step, or it has started: req starts a step of its own
	}
	return pa.prefill(int64(cached), min(uncached(req, cached), step-fill))
}

// holdFrac is how far into the tail's last step a request held for it (stepHold) is placed,
// as a fraction of the step's tokens. A hold that ends before the step starts costs nothing
// (the request fills the step as it would have unheld); one that ends after the step has ended
// costs the request a step. The time is predicted, so the hold aims early in the step rather
// than at its middle: of 0, 0.1, 0.25, 0.5 and 0.75, none lost a scorecard cell and 0.25 met
// the most (docs/results.md, the scorecard, round 11).
const holdFrac = 0.25

// stepHold is how long to hold req before placing it (Defer) with one router: while the
// candidate it would be placed on has a last step at the tail of its queue that has not
// started and has room, and the head's prefill is no further from that step than the tokens
// it holds, until holdFrac of that step by the endpoint's calibrated speed. Placed then, req
// starts a step of its own, and the tail's first token does not wait for req's first chunk
// (shared). The horizon bounds how far the predicted time reaches, so that the hold ends
// within the step it waits for. A request that would go where a held one will be placed waits
// until just after it: a hold never puts a request behind one that came after it there.
// Nothing is held before the fleet's speed is calibrated, or without a step budget.
func (pa *prefixAware) stepHold(req *Request, c []*endpoint.Endpoint) time.Duration {
	if pa.stepTokens <= 0 || len(c) == 0 || !pa.fleet.learned.Load() {
		return 0
	}
	now := pa.clock.Now().UnixNano()
	fleet := pa.fleet.get()
	// Most requests find no candidate with such a step or a held request: they are placed
	// without ranking the candidates twice.
	found := false
	pa.eps.each(c, func(_ int, s *paState) bool {
		found = s.heldUntil.Load() > now || s.holdFor(now, pa.speedOf(s, fleet, now)) > 0
		return !found
	})
	if !found {
		return 0
	}
	sc := pa.score(req, c)
	defer pa.scratch.Put(sc)
	best := sc.scored[0]
	s := sc.states[best.i]
	d := time.Duration(s.holdFor(now, best.speed) / prefillRate * best.speed * 1e9)
	if until := s.heldUntil.Load(); until > now {
		d = max(d, time.Duration(until-now+1))
	}
	if d > 0 {
		for {
			until := s.heldUntil.Load()
			if until >= now+int64(d) || s.heldUntil.CompareAndSwap(until, now+int64(d)) {
				break
			}
		}
	}
	return d
}

// holdFor is the prefill work, at the prior rate, until holdFrac of the last step at the tail of
// s's queue when a request is to be held for it (stepHold), else 0.
func (s *paState) holdFor(now int64, speed float64) float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	start, fill, at, ok := s.stepTail(now, speed)
	if !ok || at >= start || start-at > fill {
		return 0
	}
	var tokens, work int64
	for _, f := range s.queue {
		tokens += f.tokens
		work += f.work
	}
	if tokens <= 0 {
		return 0
	}
	return (float64(start-at) + holdFrac*float64(fill)) * float64(work) / float64(tokens)
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
	done := (elapsed/pa.speedOf(s, fleet, now) - overhead) * prefillRate
	return w - min(max(done, 0), float64(head))
}

// speedOf is the calibration factor used for endpoint s at now: the fleet's, unless s's own
// (not lapsed) differs from it by more than learnTolerance.
func (pa *prefixAware) speedOf(s *paState, fleet float64, now int64) float64 {
	own, w, ok := s.speed.own(now)
	if !ok {
		return fleet // its own default (1) is no measurement, the fleet's is
	}
	own = faded(own, fleet, w)
	if math.Abs(own/fleet-1) <= learnTolerance {
		return fleet
	}
	return own
}

// PrefillRate is the calibrated prefill rate of endpoint id, in tokens per second: the
// fleet's for an endpoint the policy has not seen (asking makes no state).
func (pa *prefixAware) PrefillRate(id int) float64 {
	fleet := pa.fleet.get()
	if s := pa.find(id); s != nil {
		return prefillRate / pa.speedOf(s, fleet, pa.clock.Now().UnixNano())
	}
	return prefillRate / fleet
}

// Done ends the request's bookkeeping and corrects the index when the engine had less cached
// than the index predicted.
func (pa *prefixAware) Done(req *Request, ep *endpoint.Endpoint, res Result) {
	if v, ok := pa.inflight.LoadAndDelete(req); ok {
		pa.done(v.(*paFlight), req, ep, res)
	}
}

func (pa *prefixAware) done(f *paFlight, req *Request, ep *endpoint.Endpoint, res Result) {
	if f.ep != ep.ID {
		return
	}
	s := f.s
	pa.countAttempt(s, req, res)
	s.busy.add(-1, pa.clock.Now().UnixNano(), pa.affTau)
	s.mu.Lock()
	if k := slices.Index(s.live, f); k >= 0 {
		s.live = slices.Delete(s.live, k, k+1)
	}
	s.mu.Unlock()
	if f.first.CompareAndSwap(false, true) {
		s.pending.Add(-f.work)
		s.waiting.Add(-1)
		now := pa.clock.Now().UnixNano()
		s.mu.Lock()
		s.dequeueLocked(f, now, pa.speedOf(s, pa.fleet.get(), now))
		if res.OK {
			s.firstOf(f, f.whole) // its first token came before its end
		}
		s.mu.Unlock()
		if !res.OK && !s.gone.Load() {
			// It failed before its first token: the engine most likely never computed it, so
			// the blocks Routed added are not there.
			pa.index.Drop(s.slot, req.Blocks[min(f.predicted, len(req.Blocks)):])
		}
		if !res.OK {
			return
		}
	}
	if s.gone.Load() {
		// ep was removed while the request ran: the index forgot it, and its slot may serve
		// another endpoint before long.
		return
	}
	pa.learnCapacity(req, ep, f, res)
	if pa.correct && res.CachedTokens >= 0 && req.BlockTokens > 0 {
		got := res.CachedTokens / req.BlockTokens
		want := cachedTokens(req, f.predicted) / req.BlockTokens
		if stamp, ok := prefix.StampAt(f.runs, got, f.predicted); got < want && ok {
			pa.index.Forget(s.slot, stamp)
		}
	}
	if pa.touchDone && res.OK {
		// Nothing changed on ep since Routed's insert: the blocks are still its most recent.
		pa.index.Reinsert(s.slot, req.Blocks, pa.clock.Now().UnixNano(), f.mark)
	}
}

// failTau is the time constant, in seconds, over which an endpoint's failed attempts fade:
// the affinity window, the policy's horizon for rates, or its default where the window is 0
// (which turns the affinity term off, not this).
func (pa *prefixAware) failTau() float64 {
	if pa.affTau > 0 {
		return pa.affTau
	}
	return 60
}

// countAttempt counts how req's attempt on s ended: a success, a failure by the engine's doing,
// or neither (the client left). Only this router's own attempts count: the other replicas'
// (req.Remote) come with no failure but those that count towards ejection, and counting their
// successes alone would hide this router's failures.
func (pa *prefixAware) countAttempt(s *paState, req *Request, res Result) {
	if req.Remote || s.gone.Load() {
		return
	}
	now := pa.clock.Now().UnixNano()
	switch {
	case res.OK:
		s.answers.add(1, now, pa.failTau())
	case res.Failed:
		s.fails.add(1, now, pa.failTau())
	}
	if !res.TakeBack.IsZero() {
		takeBack(&s.fails, res.TakeBack.UnixNano(), now, pa.failTau())
	}
}

// takeBack removes from d, at now, a 1 that was added to it at time at, as much as that weighs
// now, never taking d below 0: a failed attempt that was the client's doing after all
// (Result.TakeBack). One client's bad requests that share a prefix are refused where it is
// cached, and the first was told failed (nothing else was known yet): kept, it made the
// endpoint cost more for a minute or two, twice its cost where it had few answers, and the
// good traffic kept away from it.
func takeBack(d *decayed, at, now int64, tau float64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	last := d.at.Load()
	if last == 0 {
		return
	}
	sum := decay(math.Float64frombits(d.sum.Load()), last, now, tau) - decay(1, at, now, tau)
	d.sum.Store(math.Float64bits(max(sum, 0)))
	d.at.Store(max(last, now))
}

// attemptsPerAnswer is how many attempts an answer takes on s at now, as its recent attempts
// say: 1 + failed attempts / answers, both fading over failTau, counting at least one answer.
// An engine that failed every attempt of late costs as many times its cost as it failed
// attempts (fewer as they fade: after failTau x ln(failures) it costs about as a working one,
// and is tried again); one failure among many answers costs next to nothing; and where every
// endpoint fails alike (one client's bad requests spread over the fleet) the ranking stays.
// One client's bad requests that all come here (their prefix is cached here) fail once: the
// router tells the rest as neither answers nor failures (Result.Failed), and takes the first
// back once another engine refused them too (Result.TakeBack).
// 1 exactly for an endpoint that never failed.
func (pa *prefixAware) attemptsPerAnswer(s *paState, now int64) float64 {
	if s.fails.at.Load() == 0 {
		return 1
	}
	tau := pa.failTau()
	failed := decay(math.Float64frombits(s.fails.sum.Load()), s.fails.at.Load(), now, tau)
	answered := decay(math.Float64frombits(s.answers.sum.Load()), s.answers.at.Load(), now, tau)
	return 1 + failed/max(answered, 1)
}

// Removed forgets everything about ep. Its requests still in flight end without a trace.
func (pa *prefixAware) Removed(ep *endpoint.Endpoint) {
	if slot, s, ok := pa.eps.release(ep.ID); ok {
		s.gone.Store(true)
		pa.index.Remove(slot)
	}
}

// PredictCached returns the prompt tokens of req that the index believes ep holds.
func (pa *prefixAware) PredictCached(req *Request, ep *endpoint.Endpoint) int {
	s := pa.find(ep.ID)
	if s == nil {
		return 0 // never seen, or forgotten: the index holds nothing of it
	}
	return cachedTokens(req, pa.index.Holds(s.slot, req.Blocks))
}

// PredictTTFT is req's predicted wait for its first token on ep, where it was just routed:
// the work queued ahead of it and its own, at ep's calibrated speed; 0 until the fleet's speed
// is calibrated.
func (pa *prefixAware) PredictTTFT(req *Request, ep *endpoint.Endpoint) time.Duration {
	v, ok := pa.inflight.Load(req)
	if !ok {
		return 0
	}
	f := v.(*paFlight)
	if f.ep != ep.ID || !pa.fleet.learned.Load() {
		return 0 // (uncalibrated, the prior may be far too fast for this fleet: no prediction)
	}
	speed := pa.speedOf(f.s, pa.fleet.get(), pa.clock.Now().UnixNano())
	return time.Duration(priorTTFT(f.ahead) * speed * float64(time.Second))
}

// SetCacheBlind ranks ep as if it held nothing of any prompt while blind (policy.CacheBlind):
// its engine reports far fewer cached tokens than the index predicts. The index keeps
// learning, and PredictCached keeps saying what it holds, so that the router notices when the
// engine's reports agree again.
func (pa *prefixAware) SetCacheBlind(ep *endpoint.Endpoint, blind bool) {
	s := pa.stateOf(ep)
	if s == nil {
		return // the audit judged an endpoint that left
	}
	s.blind.Store(blind)
	pa.capacityBlind(ep, s, blind)
}

// IndexSize returns the index's (block, endpoint) entries and bytes.
func (pa *prefixAware) IndexSize() (int, int64) { return pa.index.Size() }

// WriteSnapshot writes the index's newest maxEntries entries (policy.Snapshotter).
func (pa *prefixAware) WriteSnapshot(w io.Writer, name func(id int) string, maxEntries int) (int, error) {
	ids := pa.eps.ids() // (the index calls back under its lock: not into the table)
	return pa.index.WriteSnapshot(w, func(slot int) string {
		if slot < len(ids) && ids[slot] >= 0 {
			return name(ids[slot])
		}
		return ""
	}, pa.clock.Now().UnixNano(), maxEntries)
}

// ReadSnapshot adds a snapshot's entries to the index (policy.Snapshotter).
// Each name's endpoint is looked up as its entries come, and added to the table as a pick would
// add it (epTable.get), which refuses, under the table's lock, one that has left the pool: one
// that leaves while the snapshot is read is released by its Removed, or never added.
func (pa *prefixAware) ReadSnapshot(r io.Reader, ep func(name string) *endpoint.Endpoint, maxEntries int) (int, error) {
	return pa.index.ReadSnapshot(r, func(name string) int {
		e := ep(name)
		if e == nil {
			return -1
		}
		slot, _, ok := pa.eps.get(e)
		if !ok {
			return -1
		}
		return slot
	}, pa.clock.Now().UnixNano(), maxEntries)
}

// CacheValue is what ep alone holds by the index, weighted by recency (policy.CacheValuer).
func (pa *prefixAware) CacheValue(ep *endpoint.Endpoint) float64 {
	s := pa.find(ep.ID)
	if s == nil {
		return 0
	}
	_, v := pa.index.Unique(s.slot, pa.clock.Now().UnixNano(), CacheValueWindow)
	return v
}
