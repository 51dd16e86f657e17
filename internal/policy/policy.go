// Package policy holds the routing decision: the Request a policy sees, the Picker and
// Observer contracts, and one file per policy. A policy is pure code that sees exactly what a
// live router sees, so the same object runs inside `kvroute serve` and `kvroute simulate`.
// It imports neither net/http nor Prometheus.
package policy

import (
	"errors"
	"math/rand/v2"
	"time"

	"github.com/kvroute/kvroute/internal/endpoint"
)

// Request is what a policy knows of one request. It is built once per request.
type Request struct {
	ID         string
	Model      string
	Tenant     string
	SessionKey string // prompt_cache_key, X-Session-ID, user, or "" when none
	// Blocks are the chained 64-bit hashes of the prompt's full blocks (package prefix), seeded
	// with the model and the tenant's salt: equal leading hashes mean an equal prompt prefix.
	Blocks []uint64
	// BlockTokens is the number of tokens each block stands for.
	BlockTokens  int
	PromptTokens int
	MaxTokens    int // 0 when the client did not say
	// Whole is true when the answer comes whole (not streamed): the router sees no first token,
	// only the end, and a policy that tracks prefills in progress predicts when it came.
	Whole bool
	// Remote is true for a request another router replica routed, which this one replays
	// (route.Share): this replica did not place it.
	Remote bool
}

// Picker ranks the candidates for a request, best first. Candidates are the available endpoints
// serving the request's model, in a stable order (by ID); there is at least one. The returned
// slice holds each candidate at most once; it may be shorter than candidates (the proxy falls
// back along it) but not empty unless err is set. Pick must be safe for concurrent use and must
// not keep or modify candidates.
type Picker interface {
	Pick(req *Request, candidates []*endpoint.Endpoint) ([]*endpoint.Endpoint, error)
}

// Observer is implemented by policies that learn from what happens to the requests they routed.
// The caller calls Routed once the request is sent to ep, FirstToken when its first token arrives,
// Done exactly once at the end (success or not), and Removed when an endpoint leaves the pool.
type Observer interface {
	Routed(req *Request, ep *endpoint.Endpoint)
	FirstToken(req *Request, ep *endpoint.Endpoint, ttft time.Duration)
	Done(req *Request, ep *endpoint.Endpoint, res Result)
	Removed(ep *endpoint.Endpoint)
}

// Result is the outcome of a routed request as the router observed it.
type Result struct {
	OK bool
	// Failed is true when the engine refused the attempt (a 4xx) or failed it in a way passive
	// health does not count; a failure it counts (a 5xx, a lost connection, no answer in time,
	// no connection) is health's to judge, and not told here, nor is a refusal that health
	// holds against the request rather than the engine (the same requests refused there of
	// late, and served nowhere else: one client's bad requests, route.Outlier.Refuse).
	// OK and Failed both false: the client left, or health judges the failure.
	Failed bool
	// TakeBack, when not zero, is when an earlier attempt at this endpoint was told failed
	// (Failed) that the requests since have shown to be the client's doing (the same requests
	// refused by another engine too, and served by none, route.Refusal): a policy that counts
	// failed attempts takes that one back.
	TakeBack time.Time
	// CachedTokens is usage.prompt_tokens_details.cached_tokens as the engine reported it, or -1
	// when the engine did not report it.
	CachedTokens int
	PromptTokens int // as reported by the engine, or the router's estimate when not reported
	OutputTokens int
	TTFT         time.Duration // 0 when no first token was seen
	Duration     time.Duration
}

// Clock tells the time: the wall clock in the live router, the virtual clock in the simulator.
type Clock interface{ Now() time.Time }

// WallClock is the real clock.
type WallClock struct{}

// Now returns time.Now().
func (WallClock) Now() time.Time { return time.Now() }

// Env is what a policy is given at construction: its randomness and its clock. Policies never
// use a global rand or time.Now directly, so that a simulation replays bit for bit.
type Env struct {
	Rand  *rand.Rand
	Clock Clock
	// defaults, when not nil, collects the default of each parameter the policy reads and
	// finds absent (Defaults).
	defaults map[string]any
}

// params returns a reader of p for a policy built in env.
func (env Env) params(p Params) *paramReader {
	r := readParams(p)
	r.defaults = env.defaults
	return r
}

// ErrNoCandidate is returned by Pick when no candidate can take the request.
var ErrNoCandidate = errors.New("no candidate endpoint")

// Predictor is implemented by policies that keep a picture of each endpoint's cache: the
// router records the predicted hit beside the engine-reported one, so the index's accuracy is
// visible in metrics.
type Predictor interface {
	// PredictCached returns the prompt tokens of req that the policy believes ep holds.
	PredictCached(req *Request, ep *endpoint.Endpoint) int
}

// TTFTPredictor is implemented by policies that predict how long a request waits for its
// first token where they send it: the router gives up early on an attempt whose engine
// answers nothing for far longer than that (route.Call.Stall).
type TTFTPredictor interface {
	// PredictTTFT returns the wait for req's first token on ep, where it was just routed
	// (after Routed), as predicted when it was routed; 0 when the policy has no prediction.
	PredictTTFT(req *Request, ep *endpoint.Endpoint) time.Duration
}

// MaxSlowdown is how many times its predicted TTFT a first token may take on an engine that
// works: the bound of prefix-aware's calibration, beyond which an engine is not slow but
// stalled.
const MaxSlowdown = maxSpeedFactor

// IndexSizer is implemented by policies that keep an index, for the router's metrics.
type IndexSizer interface {
	IndexSize() (entries int, bytes int64)
}

// Explainer is implemented by policies that can say why they rank candidates as they do: what
// a /debug/explain endpoint or an access-log field would show for one request.
type Explainer interface {
	// Explain returns one Explanation per candidate, best first, as Pick would rank them now.
	// It changes nothing.
	Explain(req *Request, candidates []*endpoint.Endpoint) []Explanation
}

// Explanation is what a policy weighed for one candidate.
type Explanation struct {
	Endpoint *endpoint.Endpoint
	// CachedTokens is the prompt tokens the policy believes the endpoint holds.
	CachedTokens int
	// PredictedTTFT is the time to first token the policy predicts there.
	PredictedTTFT time.Duration
	// Cost is what the policy minimises (for prefix-aware: the predicted TTFT plus what the
	// choice costs later requests, in seconds).
	Cost float64
	// WithinBound is false when the endpoint is past the policy's load bound.
	WithinBound bool
	// CacheBlind is true while the endpoint is ranked on load alone (policy.CacheBlind):
	// CachedTokens is then 0 whatever the policy's index holds.
	CacheBlind bool
}

// CacheBlind is implemented by policies that can rank an endpoint on load alone, ignoring what
// they believe its cache holds: the router calls it while an endpoint's engine reports far fewer
// cached tokens than predicted (a silent zero hit), and again when its reports agree. The
// policy keeps learning (its index stays up to date), it only stops steering by it.
type CacheBlind interface {
	SetCacheBlind(ep *endpoint.Endpoint, blind bool)
}

// Replicated is implemented by policies that place requests differently when they are one of
// several router replicas: the router tells them how many replicas there are (itself
// included), which one of them it is (its rank, 0 to n-1, a different one each) and how late
// each hears of the others' placements, and again whenever any of it changes.
type Replicated interface {
	SetReplicas(n, rank int, lag time.Duration)
}
