// Package endpoint holds what the router knows about one inference instance: its address,
// models and labels, its health, the load the router itself has put on it (atomics, updated by
// whoever forwards requests: the live proxy or the discrete-event simulator), and the last
// snapshot of the engine's own metrics with its age.
//
// It imports neither net/http nor Prometheus: the same Endpoint type stands for a real vLLM
// server in `kvroute serve` and for a modelled engine in `kvroute simulate`.
package endpoint

import (
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Endpoint is one inference instance. Fields set at construction are read-only afterwards;
// the load counters and the snapshot are safe for concurrent use.
type Endpoint struct {
	// ID names the endpoint for the router's lifetime (assigned by Pool, never reused): a
	// removed endpoint's late events cannot be taken for another's. IDs grow with every
	// endpoint the pool has ever had (a rollout, a pod's new address, a changed spec: each a
	// new one), so per-endpoint state must go when the endpoint leaves (Draining,
	// policy.Observer's Removed), not sit in a slice indexed by ID.
	ID int
	// Name is the endpoint's address (a base URL in the live router, "sim-3" in the simulator).
	Name string
	// Models served; empty means any model.
	Models []string
	// Labels select dedicated pools (tenant endpoint_labels).
	Labels map[string]string
	// Engine is the configured engine kind: vllm, sglang, tgi, llamacpp, ollama, openai, or
	// auto (detected on first contact; Kind says what was found).
	Engine string
	// KVCapacityTokens is the configured KV capacity in tokens (0: unknown; a scraped
	// cache_config_info in Snapshot takes precedence).
	KVCapacityTokens int
	// StepTokens is the configured step budget in the engine's tokens: what it computes in
	// one step under chunked prefill (0: unset; StepBudget says what stands in).
	StepTokens int
	// FirstTokenTimeout and ResponseTimeout, when set, replace the router's attempt timeouts
	// for this endpoint (a slow pool, long prompts).
	FirstTokenTimeout, ResponseTimeout time.Duration

	tokenScale   atomic.Uint64            // float64 bits: engine tokens per router-estimated token; 0: 1
	reportedStep atomic.Int64             // the step budget the engine reports, its tokens; 0: none
	prefillRate  atomic.Uint64            // float64 bits: PrefillRate, router tokens per second; 0: not learned
	prefillMu    sync.Mutex               // held by LearnPrefill: prefillRate's writes, prefillAt
	prefillAt    int64                    // unix nanoseconds prefillRate was last learned
	firstSeen    atomic.Int64             // unix nanoseconds the router's lifecycle first saw it; 0: not yet
	served       atomic.Pointer[[]string] // models the engine lists, sorted; nil: not asked
	// notServed maps the models the engine said it does not serve (a 404 naming the model) to
	// when that stops counting (unix nanoseconds); nil: none. Replaced whole, never changed.
	notServed      atomic.Pointer[map[string]int64]
	inFlight       atomic.Int64 // requests forwarded and not finished
	pendingPrefill atomic.Int64 // prompt tokens forwarded that have not reached first token
	progress       atomic.Int64 // unix nanoseconds the engine last answered anything (Progressed); 0: never
	stallOpen      atomic.Int64 // unix ns a stall found by a watch began (Stalled), until the engine answers; 0: none
	stallProbe     atomic.Int64 // unix ns the open stall was found, or last let a request through (Stalling)
	stallFrom      atomic.Int64 // the last stall that ended: from (unix ns) ...
	stallTo        atomic.Int64 // ... to, when the engine answered again
	unhealthy      atomic.Bool
	draining       atomic.Bool
	snap           atomic.Pointer[Snapshot]
	detected       atomic.Pointer[string] // the kind found on first contact, for Engine auto

	// firstCheck, for an endpoint that starts out of rotation until its first health check
	// (Pool's newEndpoint), is closed when that check is recorded (SetHealthy); nil for one
	// that starts healthy. checked says it is closed.
	firstCheck chan struct{}
	checked    atomic.Bool
}

// Snapshot is the engine's own view of itself, scraped from its metrics endpoint (or, in the
// simulator, sampled every scrape interval). At tells its age.
type Snapshot struct {
	At            time.Time `json:"at"`
	Running       int       `json:"running"`        // requests in the running batch
	Waiting       int       `json:"waiting"`        // requests queued in the engine
	KVUsage       float64   `json:"kv_usage"`       // 0..1
	BlockSize     int       `json:"block_size"`     // tokens per KV block (cache_config_info), 0 if unknown
	NumGPUBlocks  int       `json:"num_gpu_blocks"` // KV blocks (cache_config_info), 0 if unknown
	PrefixQueries float64   `json:"prefix_queries"` // cumulative prefix-cache queries, tokens (vLLM), 0 if unknown
	PrefixHits    float64   `json:"prefix_hits"`    // cumulative prefix-cache hits, tokens (vLLM), 0 if unknown
	// Work is the cumulative prompt and generated tokens the engine computed (vLLM, SGLang
	// and llama.cpp count them), and llama.cpp's decode calls, 0 if unknown: when it grows, the
	// engine works, whoever its requests came from.
	Work float64 `json:"work"`
	// Stepwise says that Work grows at every step the engine computes (vLLM counts its tokens
	// so; llama.cpp counts its tokens when a request ends, but its decode calls at every step),
	// not only when requests end (SGLang): then an unchanged Work means an engine that computes
	// nothing, even while it generates a long non-streamed answer.
	Stepwise bool `json:"stepwise"`
	// TTFTSum and TTFTCount are the engine's cumulative times to first token, in seconds, and
	// the first tokens they add up (its TTFT histogram's sum and count: vLLM, SGLang), 0 if
	// unknown: the first tokens of every request, streamed or not, whoever sent it.
	TTFTSum   float64 `json:"ttft_sum"`
	TTFTCount float64 `json:"ttft_count"`
}

// KVTokens is the endpoint's KV capacity in tokens: from the scraped cache_config_info when
// known, else the configured value, else 0.
func (e *Endpoint) KVTokens() int {
	if s := e.snap.Load(); s != nil && s.BlockSize > 0 && s.NumGPUBlocks > 0 {
		return s.BlockSize * s.NumGPUBlocks
	}
	return e.KVCapacityTokens
}

// Kind is the engine kind in force: the one detected on first contact when the endpoint was
// configured as auto (SetKind), else the configured Engine ("auto" until detection succeeds).
func (e *Endpoint) Kind() string {
	if k := e.detected.Load(); k != nil {
		return *k
	}
	return e.Engine
}

// SetKind records the engine kind detected on first contact.
func (e *Endpoint) SetKind(kind string) { e.detected.Store(&kind) }

// TokenScale is how many of the engine's tokens one token of the router's estimate (4 bytes
// of canonical text) stands for, as learned from the prompt tokens the engine reports: 1 until
// learned. Engine-reported token counts divided by it are in the router's units.
func (e *Endpoint) TokenScale() float64 {
	if b := e.tokenScale.Load(); b != 0 {
		return math.Float64frombits(b)
	}
	return 1
}

// LearnTokenScale folds one request into TokenScale: the engine counted engineTokens where the
// router estimated estimate, weighed by weight (0..1) against what was learned before. The
// scale stays within [1/4, 4].
func (e *Endpoint) LearnTokenScale(engineTokens, estimate int, weight float64) {
	if engineTokens <= 0 || estimate <= 0 {
		return
	}
	ratio := min(max(float64(engineTokens)/float64(estimate), 0.25), 4)
	for {
		old := e.tokenScale.Load()
		next := ratio
		if old != 0 {
			next = math.Float64frombits(old)*(1-weight) + ratio*weight
		}
		if e.tokenScale.CompareAndSwap(old, math.Float64bits(next)) {
			return
		}
	}
}

// PrefillRate is the fastest prefill the engine has shown of late, in the router's tokens per
// second (LearnPrefill), 0 before it has shown one. It is what a router whose policy predicts no
// TTFT knows of how long a long prompt takes there (route.Call.Stall).
func (e *Endpoint) PrefillRate() float64 { return math.Float64frombits(e.prefillRate.Load()) }

// LearnPrefill folds into PrefillRate one request that reached its first token ttft after it
// was sent, at now (unix nanoseconds), with tokens of its prompt (the router's) to compute: the
// prompt less what the engine reported cached. What tokens over ttft gives is at most the
// engine's own rate, for its TTFT also holds its wait in the queue, the network's time and the
// steps shared with other requests, so the fastest seen is the closest: PrefillRate keeps the
// larger of the request's rate and the rate before, faded by half for every prefillFade since
// it was learned, so that one request whose cached tokens were reported short does not speak
// for the engine for good (the fading is counted when the next request is learned: an engine
// that serves nothing keeps its rate meanwhile).
func (e *Endpoint) LearnPrefill(tokens int, ttft time.Duration, now int64) {
	if tokens <= 0 || ttft <= 0 {
		return
	}
	rate := float64(tokens) / ttft.Seconds()
	e.prefillMu.Lock()
	defer e.prefillMu.Unlock()
	faded := e.PrefillRate()
	if since := now - e.prefillAt; since > 0 {
		faded *= math.Exp2(-float64(since) / float64(prefillFade))
	}
	e.prefillRate.Store(math.Float64bits(max(rate, faded)))
	e.prefillAt = max(e.prefillAt, now)
}

// prefillFade is how long a prefill rate takes to count half (LearnPrefill).
const prefillFade = int64(time.Hour)

// Where an endpoint's step budget comes from (StepBudget; a policy's own value is the fourth).
const (
	StepConfigured    = "configured"     // endpoints[].step_tokens (or a pod's kvroute.io/step-tokens)
	StepReported      = "reported"       // what the engine says of itself (SetReportedStepTokens)
	StepEngineDefault = "engine default" // EngineStepTokens of its kind
)

// ReportedStepTokens is the step budget the engine reported of itself, in its tokens (SGLang's
// chunked_prefill_size, an ollama model's num_batch), 0 when it reported none or was not asked.
func (e *Endpoint) ReportedStepTokens() int { return int(e.reportedStep.Load()) }

// SetReportedStepTokens records the step budget the engine reports (0: it reports none, as
// after a restart with chunked prefill off). It returns the value it replaced.
func (e *Endpoint) SetReportedStepTokens(n int) (old int) {
	return int(e.reportedStep.Swap(int64(max(n, 0))))
}

// EngineStepTokens is the step budget, in the engine's tokens, that an engine of kind computes
// under chunked prefill when it is not told otherwise, where that default is documented and
// has stayed the same; 0 where it depends on the hardware, the model or the version (vllm,
// sglang, tgi) or the kind is unknown (openai, auto): the policy's value stands in there.
// docs/policy.md ("Each endpoint's step budget") gives the sources.
func EngineStepTokens(kind string) int {
	switch kind {
	case "ollama":
		return 512 // num_batch (api.DefaultOptions), shared by the sequences of one step
	case "llamacpp":
		return 2048 // llama-server --batch-size (n_batch), the logical batch of one decode
	}
	return 0
}

// StepBudget is the endpoint's own step budget in the engine's tokens and where it comes
// from: the configured StepTokens, else what the engine reported of itself
// (ReportedStepTokens), else its engine kind's default (EngineStepTokens of Kind, so an auto
// endpoint gets its detected kind's); 0 and "" when it has none of its own.
func (e *Endpoint) StepBudget() (tokens int, source string) {
	if e.StepTokens > 0 {
		return e.StepTokens, StepConfigured
	}
	if n := e.ReportedStepTokens(); n > 0 {
		return n, StepReported
	}
	if n := EngineStepTokens(e.Kind()); n > 0 {
		return n, StepEngineDefault
	}
	return 0, ""
}

// RouterKVTokens is the KV capacity in the router's token units (KVTokens over TokenScale):
// what an index of the engine's cache, kept in router blocks, may hold.
func (e *Endpoint) RouterKVTokens() int { return int(float64(e.KVTokens()) / e.TokenScale()) }

// FirstSeen is when (unix nanoseconds, on the lifecycle's clock) the router first saw the
// endpoint among its candidates, 0 before; MarkSeen records it once.
func (e *Endpoint) FirstSeen() int64 { return e.firstSeen.Load() }

// MarkSeen records when the endpoint was first seen; later calls change nothing.
func (e *Endpoint) MarkSeen(unixNano int64) { e.firstSeen.CompareAndSwap(0, unixNano) }

// Available reports whether new requests may be sent to the endpoint.
func (e *Endpoint) Available() bool { return !e.unhealthy.Load() && !e.draining.Load() }

// SetHealthy records the outcome of health checking. The first call ends the wait for the
// first check of an endpoint that started out of rotation (FirstCheck), whatever it says.
func (e *Endpoint) SetHealthy(ok bool) {
	e.unhealthy.Store(!ok)
	if e.firstCheck != nil && e.checked.CompareAndSwap(false, true) {
		close(e.firstCheck)
	}
}

// FirstCheck returns a channel that is closed once the endpoint's first health check is
// recorded (SetHealthy), for an endpoint that is out of rotation until then (an engine auto
// endpoint whose cache salt waits for its kind: Spec.CacheSaltAuto); nil when there is none
// to wait for: the endpoint started healthy, or its first check is done. A request that finds
// no other endpoint may wait on it rather than be refused because the router just started.
func (e *Endpoint) FirstCheck() <-chan struct{} {
	if e.firstCheck == nil || e.checked.Load() {
		return nil
	}
	return e.firstCheck
}

// Healthy reports the last health state.
func (e *Endpoint) Healthy() bool { return !e.unhealthy.Load() }

// SetDraining marks an endpoint that is being removed: it takes no new requests.
func (e *Endpoint) SetDraining(d bool) { e.draining.Store(d) }

// Draining reports whether the endpoint left the pool (SetDraining). Its requests in flight
// go on, and end after the router has forgotten it (policy.Observer's Removed): what they
// report must not bring its state back, or every endpoint that ever drained would leave some.
func (e *Endpoint) Draining() bool { return e.draining.Load() }

// Serves reports whether the endpoint serves model (an endpoint with no model list serves all).
func (e *Endpoint) Serves(model string) bool {
	if ns := e.notServed.Load(); ns != nil {
		if until, ok := (*ns)[model]; ok && time.Now().UnixNano() < until {
			return false
		}
	}
	list := e.Models
	if len(list) == 0 {
		if s := e.served.Load(); s != nil {
			list = *s // what the engine says it serves, when the config does not say
		} else {
			return true
		}
	}
	for _, m := range list {
		if SameModel(m, model) {
			return true
		}
	}
	return false
}

// NotServing records that the engine answered that it does not serve model (a 404 naming it)
// at now: the endpoint is not a candidate for it until now+d, so that requests for it stop
// paying a refused attempt each, and is tried again then (a model swapped back, a config put
// right). It reports whether this is news (the model was not marked already): the caller says
// so once.
func (e *Endpoint) NotServing(model string, now time.Time, d time.Duration) bool {
	for {
		old := e.notServed.Load()
		m := map[string]int64{}
		news := true
		if old != nil {
			for k, until := range *old {
				if until > now.UnixNano() {
					m[k] = until
				}
			}
			_, had := m[model]
			news = !had
		}
		if len(m) >= maxNotServed && news {
			return false // bounded: a client naming models at random cannot grow it
		}
		m[model] = now.Add(d).UnixNano()
		if e.notServed.CompareAndSwap(old, &m) {
			return news
		}
	}
}

// Refuses reports whether the engine answered that it does not serve model (NotServing) and
// that still counts at now: Serves is false for it whatever the models say.
func (e *Endpoint) Refuses(model string, now time.Time) bool {
	if ns := e.notServed.Load(); ns != nil {
		until, ok := (*ns)[model]
		return ok && now.UnixNano() < until
	}
	return false
}

// maxNotServed bounds the models an endpoint is marked as not serving at once.
const maxNotServed = 64

// SameModel reports whether two model names name the same model: equal, or equal but for the
// default tag ":latest" that ollama adds ("tiny" and "tiny:latest").
func SameModel(a, b string) bool {
	if a == b {
		return true
	}
	if len(a) > len(b) {
		a, b = b, a
	}
	return len(b) == len(a)+len(":latest") && b[:len(a)] == a && b[len(a):] == ":latest"
}

// SetServedModels records the models the engine lists (GET /v1/models). An endpoint whose
// config names no model then serves those (not any model), and /v1/models includes them.
func (e *Endpoint) SetServedModels(models []string) {
	m := slices.Clone(models)
	slices.Sort(m)
	if old := e.served.Load(); old != nil && slices.Equal(*old, m) {
		return
	}
	e.served.Store(&m)
}

// ServedModels returns what SetServedModels recorded, nil when the engine was never asked.
func (e *Endpoint) ServedModels() []string {
	if s := e.served.Load(); s != nil {
		return *s
	}
	return nil
}

// Start records that a request with promptTokens prompt tokens was forwarded.
func (e *Endpoint) Start(promptTokens int) {
	e.inFlight.Add(1)
	e.pendingPrefill.Add(int64(promptTokens))
}

// FirstToken records that a request forwarded with promptTokens reached its first token.
func (e *Endpoint) FirstToken(promptTokens int) { e.pendingPrefill.Add(-int64(promptTokens)) }

// Finish records the end of a request. If it never reached a first token, firstTokenSeen is
// false and its prompt tokens leave the pending-prefill count too.
func (e *Endpoint) Finish(promptTokens int, firstTokenSeen bool) {
	e.inFlight.Add(-1)
	if !firstTokenSeen {
		e.pendingPrefill.Add(-int64(promptTokens))
	}
}

// Progressed records that the engine answered something at now (unix nanoseconds, the
// router's clock): a first token, a stream's event, a complete answer, seen by this router or
// a peer replica. A stalled engine is one that holds requests and answers nothing (see
// route.Call.Stall). Calls within progressGrain of the last recorded one are not recorded, so
// that the many streams of a busy engine do not all write one shared word per token.
func (e *Endpoint) Progressed(now int64) {
	if now-e.progress.Load() >= progressGrain {
		e.progress.Store(now)
		if from := e.stallOpen.Load(); from != 0 && now > from && e.stallOpen.CompareAndSwap(from, 0) {
			e.stallTo.Store(0) // StalledDuring reads from, to: never a new from with an old to
			e.stallFrom.Store(from)
			e.stallTo.Store(now)
		}
	}
}

// Stalled records that a stall watch found the engine stalled at now (route.StallWatch.Due):
// silent since from (unix nanoseconds, its last answer), holding a request. The stall lasts
// until the engine answers again (Progressed). It reports whether this opened the stall (false:
// one was open already).
func (e *Endpoint) Stalled(from, now int64) bool {
	if e.stallOpen.CompareAndSwap(0, max(from, 1)) {
		e.stallProbe.Store(now)
		return true
	}
	return false
}

// PeerStalled records what a peer replica told of the engine at now (unix nanoseconds, this
// router's clock): its stall watch found the engine stalled, or it let a probe through to the
// stalled engine (Stalling), the engine silent since from. Unless this router heard the engine
// answer after from (itself or from another peer), the engine is stalled here too, as by
// Stalled, and its next probe here comes a probe interval after now + hold: the peer's probe
// finds out for the fleet, and with hold longer than the peers' events take to arrive, the
// peer's next probe reaches this router before its own is due, so that the replicas together
// send a stalled engine one probe per interval rather than one each, however many requests
// arrive at the moment the interval ends. It reports whether it applied, and whether that
// opened the stall here (none was open).
func (e *Endpoint) PeerStalled(from, now, hold int64) (applied, opened bool) {
	from = max(from, 1)
	if e.progress.Load() > from {
		return false, false
	}
	opened = e.stallOpen.CompareAndSwap(0, from)
	e.stallProbe.Store(now + hold)
	if e.progress.Load() > from {
		// It answered meanwhile, and Progressed may have looked before the stall opened.
		e.stallOpen.CompareAndSwap(from, 0)
		return false, false
	}
	return true, opened
}

// StalledSince is when the engine last answered before a stall watch found it stalled, unix
// nanoseconds; 0 when no stall is open (it answered since, or never stalled).
func (e *Endpoint) StalledSince() int64 { return e.stallOpen.Load() }

// Stalling reports whether, at now, requests should go to the engine only when no other can
// take them: a stall watch (this router's or a peer's: PeerStalled) found it stalled and it has
// not answered since. Once every probe (nanoseconds) it reports false to one caller, with
// probing true, whose request may then find out that the engine works again (an engine that
// recovers with nothing left to answer would otherwise never be tried).
func (e *Endpoint) Stalling(now, probe int64) (stalling, probing bool) {
	if e.stallOpen.Load() == 0 {
		return false, false
	}
	last := e.stallProbe.Load()
	if now-last < probe || !e.stallProbe.CompareAndSwap(last, now) {
		return true, false
	}
	return false, true
}

// StalledDuring reports whether [from, to] (unix nanoseconds) overlaps the engine's last stall,
// or one still going on: a first token that waited through a stall says how long the engine
// was stalled, not how fast it is.
func (e *Endpoint) StalledDuring(from, to int64) bool {
	if open := e.stallOpen.Load(); open != 0 && open < to {
		return true
	}
	end := e.stallTo.Load()
	return end != 0 && from < end && e.stallFrom.Load() < to
}

// progressGrain is how stale LastProgress may be: far below any stall worth the name.
const progressGrain = int64(10 * time.Millisecond)

// LastProgress is when the engine last answered anything (Progressed), unix nanoseconds; 0 when
// it never has.
func (e *Endpoint) LastProgress() int64 { return e.progress.Load() }

// InFlight is the number of requests forwarded to the endpoint and not finished.
func (e *Endpoint) InFlight() int { return int(e.inFlight.Load()) }

// PendingPrefill is the prompt tokens forwarded that have not reached first token.
func (e *Endpoint) PendingPrefill() int { return int(e.pendingPrefill.Load()) }

// SetSnapshot stores a freshly scraped snapshot. A snapshot whose Work grew since the last is
// progress (Progressed) as of its time: the engine answered someone, perhaps another router's
// or client's request that this router does not see.
func (e *Endpoint) SetSnapshot(s *Snapshot) {
	if old := e.snap.Swap(s); old != nil && s != nil && s.Work > old.Work {
		e.Progressed(s.At.UnixNano())
	}
}

// Snapshot returns the last scraped snapshot, or nil.
func (e *Endpoint) Snapshot() *Snapshot { return e.snap.Load() }
