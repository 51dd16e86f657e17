package tenant

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/metrics"
	"github.com/kvroute/kvroute/internal/openai"
)

// Options are what a Gate takes besides the config. Every field has a default.
type Options struct {
	// Now tells the time for the limiters and the queue-wait metric; nil: time.Now.
	Now func() time.Time
	// Getenv reads auth.secret_env; nil: os.Getenv.
	Getenv func(string) string
	// Logger gets rejections at debug level (tenant names, never keys or prompts); nil:
	// slog.Default().
	Logger *slog.Logger
	// Poll is how often waiting requests re-check the endpoints' saturation; 0: 10ms.
	Poll time.Duration
	// PrefillRate, when set, returns an endpoint's prefill rate in tokens per second (0:
	// unknown), for overload.max_predicted_ttft: the prefill work the router has queued on an
	// endpoint, divided by this rate, is the least time to first token a new request there can
	// have. The prefix-aware policy's PrefillRate(ep.ID) fits. Nil: max_predicted_ttft is
	// not applied.
	PrefillRate func(ep *endpoint.Endpoint) float64
	// Metrics gets per-tenant counts: requests by status, refusals by reason, time waited for
	// admission, settled tokens. Counted only while authentication is on (without it there
	// are no tenants); a missing or unknown key counts as tenant metrics.Unauthenticated.
	// Nil: nothing is counted.
	Metrics *metrics.TenantMetrics
}

// Gate is the tenant front of the router: it authenticates API keys, applies each tenant's
// request, token and concurrency limits, hands the proxy the tenant's Identity (salt, models,
// endpoint labels, priority), and queues requests fairly while the fleet is saturated. The
// proxy calls it in the order a request meets it: Authenticate (the headers), Take (the
// limits, once the body is parsed and its tokens estimated), Admit (once the candidate
// endpoints are known), and the Ticket's Learn and End when the request ends; Reload with
// each new config. What it learns to settle requests (DecodeRates, each tenant's expected
// completion) lives as long as it does, across reloads. Safe for concurrent use.
type Gate struct {
	now    func() time.Time
	getenv func(string) string
	logger *slog.Logger
	rate   func(*endpoint.Endpoint) float64
	m      *metrics.TenantMetrics // nil: not counted
	q      *queue

	mu  sync.Mutex // serialises Reload
	cur atomic.Pointer[table]
	// retired holds the limiters of tenants that a reload removed while they still had
	// requests in flight or had not refilled their buckets, by name (guarded by mu): a tenant
	// added back goes on from there rather than from fresh limits. Pruned at each reload.
	retired map[string]*limiter
	// rates are the endpoints' decode rates, for the proxy's charges (DecodeRates).
	rates DecodeRates
	// replicas is how many router replicas share each tenant's limits (SetReplicas; written
	// under mu, read without it where told the same count again): each limit in force here is
	// the configured one divided by it (share).
	replicas atomic.Int32
}

// table is one config's view: whether authentication is on, and keys to tenants.
type table struct {
	auth   bool
	byKey  map[string]*tenantState // "sha256:<hex>" -> tenant
	byName map[string]*tenantState
}

// tenantState is one tenant under one config: its settings, read-only, and its limiters,
// which a reload hands on to the tenant's next state.
type tenantState struct {
	name   string
	salt   string
	prio   int
	models []string
	labels map[string]string
	allow  []string
	maxOut int // limits.max_output_tokens (0: no cap)
	// limits are the tenant's configured limits, for the whole fleet; its limiter enforces
	// this replica's share of them.
	limits config.TenantLimits
	*limiter
}

// limiter is a tenant's use of its limits, and what its answers taught the reservation.
type limiter struct {
	mu       sync.Mutex
	req, tok bucket
	maxConc  int
	// replicas is the divisor of the limits in force (setLimits): 1 for the whole limits.
	replicas int
	inFlight int
	// bodies counts the tenant's request bodies being received (TakeBody, BodyDone).
	bodies int
	// bodyWaiters are the bodies waiting for a place, first come first; bodyLimit is the bound
	// on bodies the last TakeBody found (bodyLimit), by which BodyDone lets waiters in;
	// bodyConns the connection cap it was given, for a bound that a change of max_concurrent
	// moves (setLimits).
	bodyWaiters []*bodyWaiter
	bodyLimit   int
	bodyConns   int
	// expected is the completion tokens per sequence its answers have had (learn), which its
	// requests without max_tokens reserve (reserve); 0 before any.
	expected float64
}

// New builds a gate from a loaded config: the server secret is read now (auth.secret_file or
// auth.secret_env) when authentication is on.
func New(cfg *config.Config, opt Options) (*Gate, error) {
	g := &Gate{now: opt.Now, getenv: opt.Getenv, logger: opt.Logger, rate: opt.PrefillRate, m: opt.Metrics}
	g.replicas.Store(1)
	if g.now == nil {
		g.now = time.Now
	}
	if g.logger == nil {
		g.logger = slog.Default()
	}
	poll := opt.Poll
	if poll <= 0 {
		poll = 10 * time.Millisecond
	}
	g.q = newQueue(cfg.Overload.QueueSize, cfg.Overload.MaxWait.D(), poll, saturation(cfg.Overload, g.rate))
	if g.m != nil {
		g.q.counted = g.m.SetQueued // "" (no tenants) is not counted
	}
	if err := g.Reload(cfg); err != nil {
		return nil, err
	}
	return g, nil
}

// Reload applies a new config: tenants, keys, limits and overload settings. A tenant that
// keeps its name keeps what it has used of its limits, and so does one removed and added back
// while it still had requests in flight or its buckets had not refilled. On error the old
// config stays.
func (g *Gate) Reload(cfg *config.Config) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	t := &table{auth: cfg.AuthMode() == config.AuthAPIKey, byKey: map[string]*tenantState{}, byName: map[string]*tenantState{}}
	old := g.cur.Load()
	if old == nil {
		old = &table{}
	}
	now := g.now()
	if t.auth {
		secret, err := cfg.Secret(g.getenv)
		if err != nil {
			return err // it names the auth key; the caller says "tenants"
		}
		for i := range cfg.Tenants {
			ct := &cfg.Tenants[i]
			s := &tenantState{name: ct.Name, salt: Salt(secret, ct.Name), prio: ct.Priority,
				models: slices.Clone(ct.Models), labels: maps.Clone(ct.EndpointLabels),
				allow: slices.Clone(ct.AllowFields), maxOut: ct.Limits.MaxOutputTokens, limits: ct.Limits}
			prev := g.retired[ct.Name]
			if p := old.byName[ct.Name]; p != nil {
				prev = p.limiter
			}
			if prev != nil {
				s.limiter = prev
				s.mu.Lock()
				s.setLimits(now, ct.Limits, int(g.replicas.Load()))
				s.mu.Unlock()
			} else {
				s.limiter = newLimiter(ct.Limits, int(g.replicas.Load()), now)
			}
			t.byName[ct.Name] = s
			for _, k := range ct.APIKeys {
				t.byKey[k] = s
			}
		}
	}
	g.retire(old, t, now)
	g.q.configure(cfg.Overload.QueueSize, cfg.Overload.MaxWait.D(), saturation(cfg.Overload, g.rate))
	// Before the new table is in force: its new tenants are counted from their first
	// request, and removed ones lose their series (what they still have in flight is not
	// counted).
	g.m.SetTenants(slices.Collect(maps.Keys(t.byName)))
	// A tenant added back while its requests were in flight or queued is made at 0 above:
	// its gauges read its counts again.
	for name, s := range t.byName {
		s.mu.Lock()
		g.m.SetInFlight(name, s.inFlight)
		s.mu.Unlock()
	}
	g.q.recount()
	g.cur.Store(t)
	return nil
}

// SetReplicas makes this gate enforce, of each tenant's limits (requests and tokens per
// minute, requests in flight), an equal share among n router replicas (share: rounded up, at
// least 1), from now on and across reloads: behind a balancer that spreads a tenant's
// requests evenly, the replicas together admit about the tenant's limits rather than n times
// them. n below 1 counts as 1 (the whole limits). Each bucket keeps the fraction of it in use
// (bucket.setLimit), so a change of n neither refills a tenant nor empties it. The replica
// sync calls it as its membership changes (peers.tenant_limits: fleet); a change is logged
// once, at INFO. The request path takes no lock for it beyond the tenant's own, and the same
// count told again takes none (the replica sync tells it at each membership check).
func (g *Gate) SetReplicas(n int) {
	n = min(max(n, 1), math.MaxInt32)
	if int(g.replicas.Load()) == n {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	was := int(g.replicas.Load())
	if n == was {
		return
	}
	g.replicas.Store(int32(n))
	now := g.now()
	t := g.cur.Load()
	for _, s := range t.byName {
		s.mu.Lock()
		s.setLimits(now, s.limits, n)
		s.mu.Unlock()
	}
	// The limiters kept for tenants a reload removed get the share when they come back
	// (Reload), and count as idle against their own limits meanwhile.
	g.logger.Info("tenant limits: this replica enforces its share of each tenant's limits among the live replicas",
		"replicas", n, "was", was, "share", fmt.Sprintf("1/%d", n), "tenants", len(t.byName))
}

// Replicas is the number of replicas each tenant's limits are shared among (SetReplicas): 1
// while this gate enforces them whole.
func (g *Gate) Replicas() int { return int(g.replicas.Load()) }

// share is this replica's share of limit among n replicas: limit / n rounded up, at least 1;
// 0 (unlimited) stays 0.
func share(limit, n int) int {
	if limit <= 0 || n <= 1 {
		return limit
	}
	return max(1, (limit+n-1)/n)
}

// newLimiter is a fresh limiter for limits shared among n replicas: full buckets, nothing in
// flight.
func newLimiter(limits config.TenantLimits, n int, now time.Time) *limiter {
	n = max(n, 1)
	return &limiter{req: newBucket(share(limits.RequestsPerMinute, n), now), tok: newBucket(share(limits.TokensPerMinute, n), now),
		maxConc: share(limits.MaxConcurrent, n), replicas: n}
}

// setLimits puts this replica's share among n replicas of limits in force, each bucket keeping
// the fraction of it in use; the bound on request bodies follows max_concurrent's share
// (bodyLimit): at once for the bodies waiting for a place, at the next body otherwise. The
// caller holds l.mu.
func (l *limiter) setLimits(now time.Time, limits config.TenantLimits, n int) {
	n = max(n, 1)
	l.req.setLimit(now, share(limits.RequestsPerMinute, n))
	l.tok.setLimit(now, share(limits.TokensPerMinute, n))
	l.maxConc = share(limits.MaxConcurrent, n)
	l.replicas = n
	if len(l.bodyWaiters) > 0 {
		// A bound raised (or lifted) lets the waiting bodies in now, not at the next body's
		// end or their wait's.
		l.bodyLimit, _ = bodyLimit(l.maxConc, l.bodyConns)
		l.admitBodies()
	}
}

// shared is what a refusal adds to a limit it names while the limits are shared among
// replicas: the configured limit and the replica count. The caller holds l.mu.
func (l *limiter) shared(configured int) string {
	if l.replicas <= 1 {
		return ""
	}
	return fmt.Sprintf(" (this replica's share of the tenant's %d among %d router replicas)", configured, l.replicas)
}

// retire keeps the limiters of the tenants that old has and t does not, and forgets those
// that no longer matter (back in t, or idle: nothing in flight, buckets full, so that fresh
// limits would be the same). The caller holds g.mu.
func (g *Gate) retire(old, t *table, now time.Time) {
	for name, s := range old.byName {
		if t.byName[name] == nil {
			if g.retired == nil {
				g.retired = map[string]*limiter{}
			}
			g.retired[name] = s.limiter
		}
	}
	for name, l := range g.retired {
		if t.byName[name] != nil || l.idle(now) {
			delete(g.retired, name)
		}
	}
}

// idle reports whether the limiter holds nothing a fresh one would not: no request in flight
// nor body being received, and both buckets full.
func (l *limiter) idle(now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.inFlight == 0 && l.bodies == 0 && l.req.full(now) && l.tok.full(now)
}

// saturation returns the overload predicate of the config: every candidate is saturated, an
// endpoint being saturated when it has more requests waiting than
// overload.max_waiting_per_endpoint, or when the prefill work already queued on it would keep
// a new request from its first token for longer than overload.max_predicted_ttft. An
// endpoint's waiting requests are the larger of what its engine last reported and the
// router's own in-flight count less the engine's running batch (which sees a burst before the
// next scrape does); without a scraped snapshot that test does not apply. Nil when both
// limits are off.
func saturation(o config.Overload, rate func(*endpoint.Endpoint) float64) func([]*endpoint.Endpoint) bool {
	maxWaiting, maxTTFT := o.MaxWaitingPerEndpoint, o.MaxPredictedTTFT.D()
	if rate == nil {
		maxTTFT = 0
	}
	if maxWaiting <= 0 && maxTTFT <= 0 {
		return nil
	}
	full := func(e *endpoint.Endpoint) bool {
		if maxWaiting > 0 && EngineWaiting(e) > maxWaiting {
			return true
		}
		if maxTTFT > 0 {
			if r := rate(e); r > 0 && time.Duration(float64(e.PendingPrefill())/r*float64(time.Second)) > maxTTFT {
				return true
			}
		}
		return false
	}
	return func(cands []*endpoint.Endpoint) bool {
		for _, e := range cands {
			if !full(e) {
				return false
			}
		}
		return len(cands) > 0
	}
}

// EngineWaiting estimates the requests waiting in e's engine (see the overload settings).
func EngineWaiting(e *endpoint.Endpoint) int {
	s := e.Snapshot()
	if s == nil {
		return 0
	}
	return max(s.Waiting, e.InFlight()-s.Running)
}

// Tenants reports whether authentication is on: every API request then has a tenant (or is
// refused).
func (g *Gate) Tenants() bool { return g.cur.Load().auth }

// Authenticate finds the tenant of a request from its headers (the API key in Authorization or
// api-key). With authentication off it returns nil, nil: there are no tenants. A missing or
// unknown key is refused with 401 (counted under metrics.Unauthenticated); the caller answers
// with the error and a WWW-Authenticate header.
func (g *Gate) Authenticate(h http.Header) (*Identity, *openai.Error) {
	return g.identify(h, true)
}

// Lookup is Authenticate for a caller outside the API (the admin port's /debug/explain): the
// same identity and the same refusals, counted nowhere and not logged.
func (g *Gate) Lookup(h http.Header) (*Identity, *openai.Error) {
	return g.identify(h, false)
}

// identify finds the tenant of a request from its headers; count says whether a refusal is
// logged and counted in the tenant metrics.
func (g *Gate) identify(h http.Header, count bool) (*Identity, *openai.Error) {
	t := g.cur.Load()
	if !t.auth {
		return nil, nil
	}
	key, err := KeyFromHeader(h)
	if err != nil {
		return nil, g.multipleKeys(err, count)
	}
	if key == "" {
		return nil, g.unauthorized("missing_api_key", noKeyMessage(h), count)
	}
	s := t.byKey[HashKey(key)] // a lookup by digest: timing tells nothing about the key
	if s == nil {
		return nil, g.unauthorized("invalid_api_key", "incorrect API key provided", count)
	}
	return &Identity{Name: s.name, Salt: s.salt, Priority: s.prio, Models: s.models, EndpointLabels: s.labels, AllowFields: s.allow, MaxOutputTokens: s.maxOut, state: s}, nil
}

// DecodeRates are the endpoints' decode rates the gate keeps for the proxy (see DecodeRates).
func (g *Gate) DecodeRates() *DecodeRates { return &g.rates }

// Ticket is one admitted request's hold on its tenant's limits: a concurrency slot and a token
// reservation, both settled by End. A nil Ticket (no tenants) does nothing.
type Ticket struct {
	g     *Gate
	s     *tenantState
	est   int // the tokens reserved
	ended atomic.Bool
}

// Take applies id's limits to one request that may cost d and sets OpenAI's x-ratelimit-*
// headers in h for the limits the tenant has. With a tokens-per-minute limit the request
// reserves its prompt's estimate and its completion's, max_tokens for each sequence (see
// limiter.reserve), at most the limit; it is admitted only when the bucket holds the whole
// reservation. On success the request holds a concurrency slot and its reservation until the
// Ticket's End. Over a limit it returns a 429 error and sets Retry-After and retry-after-ms in
// h (or x-should-retry: false when the request can never fit: a prompt over the limit). id
// nil (authentication off) takes nothing. With the tenant's max_output_tokens, a request that
// generates is held to it first: one that asks for more (or for less than 1) is refused with
// 400 (counted among the refusals; the caller counts its status with Count), and one that asks
// for none reserves the cap for each sequence, which the caller writes into its body.
func (g *Gate) Take(id *Identity, d Demand, h http.Header) (*Ticket, *openai.Error) {
	if id == nil || id.state == nil {
		return nil, nil
	}
	if s := id.state; s.maxOut > 0 && d.Seqs > 0 {
		if oe := outputCap(s.maxOut, d); oe != nil {
			g.logger.LogAttrs(context.Background(), slog.LevelDebug, "tenant limit", slog.String("tenant", s.name),
				slog.String("code", *oe.Code), slog.String("reason", ReasonMaxOutputTokens))
			g.m.Rejection(s.name, ReasonMaxOutputTokens)
			return nil, oe // counted under its status by Count, as the other 400s
		}
		if d.MaxTokens <= 0 {
			d.MaxTokens = s.maxOut // what the caller writes into the body
		}
	}
	est, err := g.take(h, id.state, d)
	if err != nil {
		return nil, err
	}
	return &Ticket{g: g, s: id.state, est: est}, nil
}

// End releases the ticket's concurrency slot, counts the request under its final HTTP status,
// and settles its token reservation against what the request is charged, prompt and completion
// tokens (the caller's reckoning of what the engines computed: 0, 0 refunds the reservation,
// for a request that reached no engine; more than it leaves a debt), which the tenant's token
// counters count too. Only the first call counts.
func (t *Ticket) End(status, prompt, completion int) {
	if t == nil || !t.ended.CompareAndSwap(false, true) {
		return
	}
	// The caller's figures come from engines' answers: whatever they say, a request costs
	// 0 to MaxInt32 tokens of each (t.est-prompt-completion in ints wrapped for a usage of
	// 9e18 tokens).
	prompt, completion = clampTokens(prompt), clampTokens(completion)
	s := t.s
	s.mu.Lock()
	s.inFlight--
	t.g.m.SetInFlight(s.name, s.inFlight)
	s.tok.adjust(t.g.now(), float64(t.est)-float64(prompt)-float64(completion))
	s.mu.Unlock()
	t.g.m.Tokens(s.name, prompt, completion)
	t.g.m.Request(s.name, status)
}

// clampTokens bounds a count of tokens to [0, math.MaxInt32].
func clampTokens(n int) int { return min(max(n, 0), math.MaxInt32) }

// Reasons of kvroute_tenant_rejections_total for the two rate limits, which answer the same
// error code (rate_limit_exceeded, as OpenAI does); other refusals count under their code.
const (
	ReasonRequestsPerMinute = "requests_per_minute"
	ReasonTokensPerMinute   = "tokens_per_minute"
)

// ReasonMaxOutputTokens is the reason of kvroute_tenant_rejections_total for a request refused
// with 400 because it asks for more completion tokens than the tenant's max_output_tokens (or
// fewer than 1, which some engines read as no bound).
const ReasonMaxOutputTokens = "max_output_tokens"

// outputCap checks a request of demand d against the tenant's cap of maxOut completion tokens
// per sequence: nil when it asks for none or for 1 to maxOut, else the 400 to answer, naming
// the field, the value and the cap.
func outputCap(maxOut int, d Demand) *openai.Error {
	field := cmp.Or(d.MaxTokensField, "max_tokens")
	switch {
	case d.MaxTokens > maxOut:
		return openai.NewError(http.StatusBadRequest, openai.TypeInvalidRequest, field, "integer_above_max_value",
			fmt.Sprintf("%s is %d, more than this API key may ask for: at most %d tokens per answer (limits.max_output_tokens); ask for %d or fewer, or leave %s out to be cut at %d",
				field, d.MaxTokens, maxOut, maxOut, field, maxOut))
	case d.MaxTokensField != "" && d.MaxTokens < 1:
		return openai.NewError(http.StatusBadRequest, openai.TypeInvalidRequest, field, "integer_below_min_value",
			fmt.Sprintf("%s is %d: ask for 1 to %d tokens per answer (this API key's limits.max_output_tokens), or leave %s out to be cut at %d",
				field, d.MaxTokens, maxOut, field, maxOut))
	}
	return nil
}

// ReasonClientGone is the reason of kvroute_tenant_rejections_total for a request whose client
// went away while it waited for admission: counted apart from the queue's refusals for
// overload ("overloaded"), which it is not.
const ReasonClientGone = "client_gone"

// take applies the tenant's limits to one request of demand d: on success it counts the
// request in flight and returns the tokens it reserved; else the 429, with its headers set in
// h.
func (g *Gate) take(h http.Header, s *tenantState, d Demand) (int, *openai.Error) {
	est := 0
	now := g.now()
	s.mu.Lock()
	var refusal *openai.Error
	var wait time.Duration
	retry := true
	reason := "" // the metric's reason: the error code, told apart where two limits share it
	switch ok, wr := s.req.take(now, 1); {
	case s.maxConc > 0 && s.inFlight >= s.maxConc:
		if ok {
			s.req.adjust(now, 1)
		}
		refusal = openai.NewError(http.StatusTooManyRequests, "requests", "", "concurrency_limit_exceeded",
			fmt.Sprintf("too many requests in flight: the limit is %d at a time%s; retry when one ends", s.maxConc, s.shared(s.limits.MaxConcurrent)))
		wait = time.Second
	case !ok:
		refusal = openai.NewError(http.StatusTooManyRequests, "requests", "", "rate_limit_exceeded",
			fmt.Sprintf("rate limit reached on requests per minute: limit %d%s; retry in %s", int(s.req.limit), s.shared(s.limits.RequestsPerMinute), roundUp(wr)))
		wait, reason = wr, ReasonRequestsPerMinute
	default:
		if s.tok.unlimited() {
			break
		}
		// Against the tenant's whole limit, not this replica's share: a prompt within the
		// limit may run, reserving the share (reserve) and settling the rest as a debt.
		if tpm := max(s.limits.TokensPerMinute, int(s.tok.limit)); float64(d.Prompt) > float64(tpm) {
			s.req.adjust(now, 1)
			refusal = openai.NewError(http.StatusTooManyRequests, "tokens", "", "request_too_large",
				fmt.Sprintf("the prompt is about %d tokens, more than the limit of %d tokens per minute: shorten it", d.Prompt, tpm))
			retry = false
			break
		}
		var completion int
		est, completion = s.reserve(d)
		if ok, wt := s.tok.take(now, float64(est)); !ok {
			s.req.adjust(now, 1)
			refusal = openai.NewError(http.StatusTooManyRequests, "tokens", "", "rate_limit_exceeded",
				fmt.Sprintf("rate limit reached on tokens per minute: limit %d%s, requested about %d (the prompt's %d and %d reserved for the completion, settled when it ends); retry in %s",
					int(s.tok.limit), s.shared(s.limits.TokensPerMinute), est, d.Prompt, completion, roundUp(wt)))
			wait, reason = wt, ReasonTokensPerMinute
		}
	}
	if refusal == nil {
		s.inFlight++
		g.m.SetInFlight(s.name, s.inFlight) // under s.mu: the gauge's sets in the counts' order
	}
	rateHeaders(h, s, now)
	s.mu.Unlock()
	if refusal == nil {
		return est, nil
	}
	if retry {
		setRetryAfter(h, wait)
	} else {
		h.Set("x-should-retry", "false")
	}
	if reason == "" {
		reason = *refusal.Code
	}
	g.logger.LogAttrs(context.Background(), slog.LevelDebug, "tenant limit", slog.String("tenant", s.name),
		slog.String("code", *refusal.Code), slog.String("reason", reason))
	g.m.Rejection(s.name, reason)
	g.m.Request(s.name, refusal.Status)
	return 0, refusal
}

// rateHeaders sets OpenAI's x-ratelimit-* headers for the limits s has. The caller holds s.mu.
func rateHeaders(h http.Header, s *tenantState, now time.Time) {
	if !s.req.unlimited() {
		n, reset := s.req.remaining(now)
		h.Set("x-ratelimit-limit-requests", strconv.Itoa(int(s.req.limit)))
		h.Set("x-ratelimit-remaining-requests", strconv.Itoa(n))
		h.Set("x-ratelimit-reset-requests", roundUp(reset).String())
	}
	if !s.tok.unlimited() {
		n, reset := s.tok.remaining(now)
		h.Set("x-ratelimit-limit-tokens", strconv.Itoa(int(s.tok.limit)))
		h.Set("x-ratelimit-remaining-tokens", strconv.Itoa(n))
		h.Set("x-ratelimit-reset-tokens", roundUp(reset).String())
	}
}

// roundUp rounds d up to the millisecond ("1.5s", "6m0s", "20ms" as OpenAI writes them).
func roundUp(d time.Duration) time.Duration {
	if r := d % time.Millisecond; r != 0 {
		d += time.Millisecond - r
	}
	return d
}

// setRetryAfter sets Retry-After (whole seconds, at least 1) and retry-after-ms.
func setRetryAfter(h http.Header, d time.Duration) {
	ms := max(int64(1), int64(math.Ceil(float64(d)/float64(time.Millisecond))))
	h.Set("Retry-After", strconv.FormatInt(max(1, (ms+999)/1000), 10))
	h.Set("retry-after-ms", strconv.FormatInt(ms, 10))
}

// unauthorized is the 401 for code; count says whether it is logged and counted.
func (g *Gate) unauthorized(code, msg string, count bool) *openai.Error {
	if count {
		g.logger.LogAttrs(context.Background(), slog.LevelDebug, "authentication failed", slog.String("code", code))
		g.m.Rejection(metrics.Unauthenticated, code)
		g.m.Request(metrics.Unauthenticated, http.StatusUnauthorized)
	}
	return openai.NewError(http.StatusUnauthorized, openai.TypeInvalidRequest, "", code, msg)
}

// Admit holds a request while every candidate endpoint is saturated (overload settings) in a
// bounded queue served by priority and fairly across tenants, and refuses it with 503 (the
// caller sets Retry-After) when the queue is full or it waited overload.max_wait. id may be nil
// (authentication off: nothing is counted in the tenant metrics). release must be called
// when the request ends.
func (g *Gate) Admit(ctx context.Context, id *Identity, candidates []*endpoint.Endpoint) (release func(), err error) {
	name, prio := "", 0
	if id != nil {
		name, prio = id.Name, id.Priority
	}
	m := g.m
	if id == nil {
		m = nil
	}
	var start time.Time
	if m != nil {
		start = g.now()
	}
	queued, err := g.q.wait(ctx, name, prio, 1, candidates)
	if err != nil {
		reason := "overloaded"
		msg := "every endpoint that serves the request is saturated and the admission queue is full; retry shortly"
		switch {
		case errors.Is(err, errWaitedTooLong):
			msg = "every endpoint that serves the request stayed saturated for overload.max_wait; retry shortly"
		case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
			// Not a refusal for overload: nobody is left to refuse (the answer goes nowhere).
			reason = ReasonClientGone
			msg = "the client went away while the request waited for admission"
		}
		m.Rejection(name, reason)
		return nil, openai.NewError(http.StatusServiceUnavailable, openai.TypeUnavailable, "", "overloaded", msg)
	}
	if m != nil {
		var waited time.Duration
		if queued {
			waited = g.now().Sub(start)
		}
		m.Waited(name, waited)
	}
	return g.q.signal, nil
}

// Waiting returns how many requests wait for admission.
func (g *Gate) Waiting() int { return g.q.len() }

// Count counts a request of id that ended without a Ticket (refused before it took its limits,
// a malformed body say) under its final HTTP status. id nil does nothing.
func (g *Gate) Count(id *Identity, status int) {
	if id != nil {
		g.m.Request(id.Name, status)
	}
}
