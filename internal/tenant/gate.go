package tenant

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
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
	"github.com/kvroute/kvroute/internal/prefix"
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
// endpoint labels, priority, Settle), and queues requests fairly while the fleet is
// saturated. To use one: wrap the API handler with Middleware, call Admit once the candidate
// endpoints of a request are known (proxy.Handler's Admit hook), and call Reload with each new
// config. Safe for concurrent use.
type Gate struct {
	now    func() time.Time
	getenv func(string) string
	logger *slog.Logger
	rate   func(*endpoint.Endpoint) float64
	m      *metrics.TenantMetrics // nil: not counted
	q      *queue

	mu  sync.Mutex // serialises Reload
	cur atomic.Pointer[table]
}

// table is one config's view: keys to tenants and the settings of the middleware.
type table struct {
	auth    bool
	maxBody int64
	byKey   map[string]*tenantState // "sha256:<hex>" -> tenant
	byName  map[string]*tenantState
}

// tenantState is one tenant under one config: its settings, read-only, and its limiters,
// which a reload hands on to the tenant's next state.
type tenantState struct {
	name   string
	salt   string
	prio   int
	models []string
	labels map[string]string
	*limiter
}

// limiter is a tenant's use of its limits.
type limiter struct {
	mu       sync.Mutex
	req, tok bucket
	maxConc  int
	inFlight int
}

// New builds a gate from a loaded config: the server secret is read now (auth.secret_file or
// auth.secret_env) when authentication is on.
func New(cfg *config.Config, opt Options) (*Gate, error) {
	g := &Gate{now: opt.Now, getenv: opt.Getenv, logger: opt.Logger, rate: opt.PrefillRate, m: opt.Metrics}
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
	if err := g.Reload(cfg); err != nil {
		return nil, err
	}
	return g, nil
}

// Reload applies a new config: tenants, keys, limits and overload settings. A tenant that
// keeps its name keeps what it has used of its limits. On error the old config stays.
func (g *Gate) Reload(cfg *config.Config) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	t := &table{auth: cfg.AuthMode() == config.AuthAPIKey, maxBody: cfg.Limits.MaxBodyBytes,
		byKey: map[string]*tenantState{}, byName: map[string]*tenantState{}}
	if t.maxBody <= 0 {
		t.maxBody = config.DefaultMaxBodyBytes
	}
	if t.auth {
		secret, err := cfg.Secret(g.getenv)
		if err != nil {
			return fmt.Errorf("tenants: %w", err)
		}
		old := g.cur.Load()
		if old == nil {
			old = &table{}
		}
		now := g.now()
		for i := range cfg.Tenants {
			ct := &cfg.Tenants[i]
			s := &tenantState{name: ct.Name, salt: Salt(secret, ct.Name), prio: ct.Priority,
				models: slices.Clone(ct.Models), labels: maps.Clone(ct.EndpointLabels)}
			if prev := old.byName[ct.Name]; prev != nil {
				s.limiter = prev.limiter
				s.mu.Lock()
				s.req.setLimit(now, ct.Limits.RequestsPerMinute)
				s.tok.setLimit(now, ct.Limits.TokensPerMinute)
				s.maxConc = ct.Limits.MaxConcurrent
				s.mu.Unlock()
			} else {
				s.limiter = &limiter{req: newBucket(ct.Limits.RequestsPerMinute, now),
					tok: newBucket(ct.Limits.TokensPerMinute, now), maxConc: ct.Limits.MaxConcurrent}
			}
			t.byName[ct.Name] = s
			for _, k := range ct.APIKeys {
				t.byKey[k] = s
			}
		}
	}
	g.q.configure(cfg.Overload.QueueSize, cfg.Overload.MaxWait.D(), saturation(cfg.Overload, g.rate))
	// Before the new table is in force: its new tenants are counted from their first
	// request, and removed ones lose their series (what they still have in flight is not
	// counted).
	g.m.SetTenants(slices.Collect(maps.Keys(t.byName)))
	g.cur.Store(t)
	return nil
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

// headerKey carries the response headers into Admit, which has no ResponseWriter: the
// proxy writes Admit's refusal on the same writer and keeps headers already set.
type headerKey struct{}

// Middleware authenticates the request, applies the tenant's limits, and passes it on with
// the tenant's Identity in its context. Every response carries OpenAI's x-ratelimit-*
// headers for the limits the tenant has. Refusals are OpenAI error bodies: 401 for a missing
// or unknown key, 429 with Retry-After and retry-after-ms over a limit (x-should-retry: false
// when the request can never fit). With Options.Metrics, every authenticated or refused
// request is counted by tenant and status.
func (g *Gate) Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := context.WithValue(r.Context(), headerKey{}, w.Header())
		t := g.cur.Load()
		if !t.auth {
			next.ServeHTTP(w, r.WithContext(ctx))
			return
		}
		key, err := KeyFromHeader(r.Header)
		if err != nil {
			g.refuseKeys(w, r, err)
			return
		}
		if key == "" {
			g.unauthorized(w, r, "missing_api_key",
				"no API key: send it as 'Authorization: Bearer <key>' or in the api-key header")
			return
		}
		s := t.byKey[HashKey(key)] // a lookup by digest: timing tells nothing about the key
		if s == nil {
			g.unauthorized(w, r, "invalid_api_key", "incorrect API key provided")
			return
		}
		s.mu.Lock()
		countTokens := !s.tok.unlimited()
		s.mu.Unlock()
		est := 0
		if countTokens && r.Method == http.MethodPost {
			var parsed *openai.Parsed
			if est, parsed = estimate(r, t.maxBody); parsed != nil {
				ctx = openai.WithParsed(ctx, parsed) // the proxy reads and parses it no more
			}
		}
		if !g.take(w, r, s, est) {
			return
		}
		var once sync.Once
		id := &Identity{
			Name: s.name, Salt: s.salt, Priority: s.prio, Models: s.models, EndpointLabels: s.labels,
			Settle: func(prompt, completion int) {
				once.Do(func() {
					s.mu.Lock()
					s.tok.adjust(g.now(), float64(est-prompt-completion))
					s.mu.Unlock()
					g.m.Tokens(s.name, prompt, completion)
				})
			},
		}
		defer func() {
			s.mu.Lock()
			s.inFlight--
			s.mu.Unlock()
		}()
		out := r.WithContext(WithIdentity(ctx, id))
		out.Header = r.Header.Clone() // the key is ours: engines never see it
		out.Header.Del("Authorization")
		out.Header.Del("Api-Key")
		if g.m == nil {
			next.ServeHTTP(w, out)
			return
		}
		sw := &statusWriter{ResponseWriter: w}
		defer func() {
			code := sw.status
			if code == 0 {
				code = http.StatusOK
			}
			if ctx.Err() != nil {
				code = 499 // the client went away before the end of the answer, as the proxy counts it
			}
			g.m.Request(s.name, code)
		}()
		next.ServeHTTP(sw, out)
	})
}

// statusWriter records the status of the answer for the tenant metrics.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 && code >= 200 { // 1xx are interim answers
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Flush flushes the underlying writer (SSE events go out at once).
func (w *statusWriter) Flush() {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Reasons of kvroute_tenant_rejections_total for the two rate limits, which answer the same
// error code (rate_limit_exceeded, as OpenAI does); other refusals count under their code.
const (
	ReasonRequestsPerMinute = "requests_per_minute"
	ReasonTokensPerMinute   = "tokens_per_minute"
)

// take applies the tenant's limits to one request of est prompt tokens: on success it counts
// the request in flight and returns true; else it has written the 429.
func (g *Gate) take(w http.ResponseWriter, r *http.Request, s *tenantState, est int) bool {
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
			fmt.Sprintf("too many requests in flight: the limit is %d at a time; retry when one ends", s.maxConc))
		wait = time.Second
	case !ok:
		refusal = openai.NewError(http.StatusTooManyRequests, "requests", "", "rate_limit_exceeded",
			fmt.Sprintf("rate limit reached on requests per minute: limit %d; retry in %s", int(s.req.limit), roundUp(wr)))
		wait, reason = wr, ReasonRequestsPerMinute
	default:
		if !s.tok.unlimited() && float64(est) > s.tok.limit {
			s.req.adjust(now, 1)
			refusal = openai.NewError(http.StatusTooManyRequests, "tokens", "", "request_too_large",
				fmt.Sprintf("the prompt is about %d tokens, more than the limit of %d tokens per minute: shorten it", est, int(s.tok.limit)))
			retry = false
			break
		}
		if ok, wt := s.tok.take(now, float64(est)); !ok {
			s.req.adjust(now, 1)
			refusal = openai.NewError(http.StatusTooManyRequests, "tokens", "", "rate_limit_exceeded",
				fmt.Sprintf("rate limit reached on tokens per minute: limit %d, requested about %d; retry in %s", int(s.tok.limit), est, roundUp(wt)))
			wait, reason = wt, ReasonTokensPerMinute
		}
	}
	if refusal == nil {
		s.inFlight++
	}
	rateHeaders(w.Header(), s, now)
	s.mu.Unlock()
	if refusal == nil {
		return true
	}
	h := w.Header()
	if retry {
		setRetryAfter(h, wait)
	} else {
		h.Set("x-should-retry", "false")
	}
	if reason == "" {
		reason = *refusal.Code
	}
	g.logger.LogAttrs(r.Context(), slog.LevelDebug, "tenant limit", slog.String("tenant", s.name),
		slog.String("code", *refusal.Code), slog.String("reason", reason))
	g.m.Rejection(s.name, reason)
	g.m.Request(s.name, refusal.Status)
	openai.WriteError(w, refusal)
	return false
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

func (g *Gate) unauthorized(w http.ResponseWriter, r *http.Request, code, msg string) {
	g.logger.LogAttrs(r.Context(), slog.LevelDebug, "authentication failed", slog.String("code", code),
		slog.String("remote", r.RemoteAddr), slog.String("path", r.URL.Path))
	g.m.Rejection(metrics.Unauthenticated, code)
	g.m.Request(metrics.Unauthenticated, http.StatusUnauthorized)
	w.Header().Set("WWW-Authenticate", `Bearer realm="kvroute"`)
	openai.WriteError(w, openai.NewError(http.StatusUnauthorized, openai.TypeInvalidRequest, "", code, msg))
}

// estimate reads the body (keeping it for the handler) and estimates its prompt tokens the
// way the router does; it returns the parsed body too. A body over maxBody, or one that does
// not parse, counts 0: the handler refuses it.
func estimate(r *http.Request, maxBody int64) (int, *openai.Parsed) {
	kind, ok := openai.KindForPath(r.URL.Path)
	if !ok || r.Body == nil || r.ContentLength > maxBody { // too large announced: not read here
		return 0, nil
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	rest := r.Body
	r.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(body), rest), rest}
	if err != nil || int64(len(body)) > maxBody {
		return 0, nil
	}
	req, err := openai.Parse(kind, body)
	if err != nil {
		return 0, nil
	}
	return prefix.EstimateTokensBytes(req.AppendCanonical(nil)), &openai.Parsed{Kind: kind, Body: body, Req: req}
}

// Admit holds a request while every candidate endpoint is saturated (overload settings) in a
// bounded queue served by priority and fairly across tenants, and refuses it with 503 and
// Retry-After when the queue is full or it waited overload.max_wait. id may be nil
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
		m.Rejection(name, "overloaded")
		if h, ok := ctx.Value(headerKey{}).(http.Header); ok {
			h.Set("Retry-After", "1")
			h.Set("retry-after-ms", "1000")
		}
		msg := "every endpoint that serves the request is saturated and the admission queue is full; retry shortly"
		switch {
		case errors.Is(err, errWaitedTooLong):
			msg = "every endpoint that serves the request stayed saturated for overload.max_wait; retry shortly"
		case ctx.Err() != nil:
			msg = "the client went away while the request waited for admission"
		}
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
