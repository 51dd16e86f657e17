package scrape

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/endpoint"
)

// DefaultMaxMetricsBytes bounds one scraped metrics page.
const DefaultMaxMetricsBytes = 8 << 20

// Options tune the Prober. Zero values take the config package's defaults.
type Options struct {
	HealthInterval     time.Duration
	UnhealthyInterval  time.Duration // how often an endpoint whose last check failed is checked
	HealthTimeout      time.Duration
	HealthyThreshold   int // consecutive successes that make an unhealthy endpoint healthy
	UnhealthyThreshold int // consecutive failures that make a healthy endpoint unhealthy
	ScrapeInterval     time.Duration
	ScrapeTimeout      time.Duration
	ScrapeDisabled     bool
	MaxMetricsBytes    int64
	// Now stamps snapshots (time.Now when nil).
	Now func() time.Time
}

// OptionsFrom takes the health and scrape sections of a loaded config.
func OptionsFrom(c *config.Config) Options {
	return Options{
		HealthInterval:     c.Health.Interval.D(),
		UnhealthyInterval:  c.Health.UnhealthyInterval.D(),
		HealthTimeout:      c.Health.Timeout.D(),
		HealthyThreshold:   c.Health.HealthyThreshold,
		UnhealthyThreshold: c.Health.UnhealthyThreshold,
		ScrapeInterval:     c.Scrape.Interval.D(),
		ScrapeTimeout:      c.Scrape.Timeout.D(),
		ScrapeDisabled:     c.Scrape.Disabled,
	}
}

func (o Options) withDefaults() Options {
	def := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&o.HealthInterval, 5*time.Second)
	def(&o.UnhealthyInterval, min(time.Second, o.HealthInterval))
	def(&o.HealthTimeout, 2*time.Second)
	def(&o.ScrapeInterval, time.Second)
	def(&o.ScrapeTimeout, time.Second)
	for _, p := range []struct {
		v *int
		d int
	}{{&o.HealthyThreshold, 1}, {&o.UnhealthyThreshold, 2}} {
		if *p.v < 1 {
			*p.v = p.d
		}
	}
	if o.MaxMetricsBytes <= 0 {
		o.MaxMetricsBytes = DefaultMaxMetricsBytes
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return o
}

// HealthPath is the health check path of an engine kind: /health for vLLM, SGLang, TGI and
// llama.cpp (which answers 503 while loading the model), /api/version for ollama (which has no
// /health), /v1/models for a generic OpenAI server.
func HealthPath(engine string) string {
	switch engine {
	case "openai", "":
		return "/v1/models"
	case "ollama":
		return "/api/version"
	}
	return "/health"
}

// ReportsCachedTokens reports whether an engine kind's answers can be trusted to say how many
// prompt tokens it took from its prefix cache, when they say it at all. ollama cannot: its
// chat and completions usage has no prompt_tokens_details, and its Responses API always says
// cached_tokens 0 (measured: 0 while reusing ~1,520 of 1,561 prompt tokens), so its reports are
// treated as unknown rather than as misses (a miss makes the router forget what it knew).
func ReportsCachedTokens(kind string) bool { return kind != "ollama" }

// InstanceHeader is the response header in which a kvroute router names its process (every
// answer of its API listener carries it; proxy.Handler.Instance): an endpoint that answers
// with the prober's own Instance is the prober's router itself.
const InstanceHeader = "X-Kvroute-Instance"

// Auto is the engine kind that asks the prober to detect the kind on first contact.
const Auto = "auto"

// Status is what the prober knows of one endpoint, for /debug/endpoints.
type Status struct {
	Healthy             bool      `json:"healthy"`
	LastCheck           time.Time `json:"last_check,omitzero"` // absent until the first check
	LastCheckError      string    `json:"last_check_error,omitempty"`
	ConsecutiveFailures int       `json:"consecutive_failures"`
	LastScrape          time.Time `json:"last_scrape,omitzero"` // absent until the first scrape
	LastScrapeError     string    `json:"last_scrape_error,omitempty"`
	// Detected is what probing the endpoint found its engine to be: for an endpoint configured
	// as auto, the kind in force; for one of a named kind whose health check answered 4xx, the
	// kind it looks like instead (the check's error says so too).
	Detected *Detection `json:"detected,omitempty"`
	// StepReport is what the engine last answered when asked for its step budget under
	// chunked prefill (SGLang's chunked_prefill_size, an ollama model's num_batch), or why
	// that answer was not taken; absent where the engine was not asked.
	StepReport string `json:"step_report,omitempty"`
}

type epState struct {
	succ, fail int
	modelsAt   time.Time // when the endpoint's models were last asked
	checked    bool      // the first check decides alone
	// hint, when set, tells why the health check of a named kind fails (the endpoint looks
	// like another kind); it is found once per failure streak and kept for the streak.
	hint string
	// stepAsked is whether the engine's step budget was asked since the last failed check,
	// of an engine of kind stepKind (learnStep).
	stepAsked bool
	stepKind  string
	// scrapeFails counts the scrapes failed in a row. A streak is said once as a warning
	// (scrapeWarned, at scrapeWarnedAt; scrapeHint is what the endpoint looks like when the
	// page had none of its kind's families), once more if it lasts scrapeWarnAgain
	// (scrapeRewarned), and its end once at info.
	scrapeFails    int
	scrapeWarned   bool
	scrapeRewarned bool
	scrapeWarnedAt time.Time
	scrapeHint     string
	// modelsMissing is the configured models the engine's list lacked when last said (a
	// warning), "" when it listed them all: each change is said once.
	modelsMissing string
	// itself: the endpoint was found to be the prober's own router since its last check that
	// passed (said once).
	itself bool
	status Status
}

// Prober health-checks and scrapes the pool's endpoints. Its goroutines start in Run, never in
// New, and stop when Run's context ends. Check and Scrape are safe for concurrent use. Passive
// health (ejection after failures while proxying) is the request lifecycle's (route.Outlier).
type Prober struct {
	// OnModels, when set, is called with the models the engine of an endpoint whose config
	// names none lists, after each reading of its list that gave some (changed or not: the
	// first call may come before the endpoint's other series exist, and the next repairs
	// it). It is a field, not an option, so that SetOptions on reload keeps it; set it before
	// Run.
	OnModels func(ep *endpoint.Endpoint, models []string)
	// OnPassed, when set, is called after each health check of an endpoint that passed (its
	// outcome recorded first), with when its request was sent (Options.Now): a passive
	// ejection begun before then may end (route.Outlier.HealthPassed). Set it before Run.
	OnPassed func(ep *endpoint.Endpoint, sent time.Time)
	// OnFailed, when set, is called after each health check of an endpoint that failed (its
	// outcome recorded first; not one stopped by the caller, nor one that found the router
	// itself), with when it was sent and how it failed (why): a check that passes after one
	// that failed shows an engine that restarted or recovered, and one that failed by a 503
	// or a refused connection, not by a timeout, an engine not ready rather than overloaded
	// (route.Outlier.HealthFailed). Set it before Run.
	OnFailed func(ep *endpoint.Endpoint, sent time.Time, why CheckFailure)
	// Instance is the id of the router this prober serves (proxy.Handler.Instance), set before
	// Run: an endpoint whose health check or model listing answers with it in InstanceHeader
	// is the router itself (its discovery lists its own address), and fails its checks at once
	// (Check). Empty: not looked for.
	Instance string

	pool   *endpoint.Pool
	client *http.Client
	log    *slog.Logger
	opt    atomic.Pointer[Options]
	// epoch is the phase of every loop's ticks (see every).
	epoch time.Time

	mu    sync.Mutex
	state map[*endpoint.Endpoint]*epState
}

// New returns a prober of pool's endpoints using client (http.DefaultClient when nil) and log
// (discarded when nil).
func New(pool *endpoint.Pool, client *http.Client, opt Options, log *slog.Logger) *Prober {
	if client == nil {
		client = http.DefaultClient
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	p := &Prober{pool: pool, client: client, log: log, epoch: time.Now(), state: map[*endpoint.Endpoint]*epState{}}
	p.SetOptions(opt)
	return p
}

// SetOptions replaces the options (on config reload); loops pick them up at their next tick.
func (p *Prober) SetOptions(opt Options) {
	o := opt.withDefaults()
	p.opt.Store(&o)
}

func (p *Prober) options() Options { return *p.opt.Load() }

// st returns ep's state, creating it for an endpoint still in the pool; for one that has left
// (a loop finishing its last round) it returns a throwaway, so the map does not grow again.
func (p *Prober) st(ep *endpoint.Endpoint) *epState {
	s := p.state[ep]
	if s == nil {
		if _, ok := p.pool.Spec(ep); !ok {
			return &epState{}
		}
		s = &epState{status: Status{Healthy: ep.Healthy()}}
		p.state[ep] = s
	}
	return s
}

// Run probes every endpoint in the pool, following the pool's changes, until ctx ends. Each
// endpoint gets a health loop and, when its engine's metrics are known, a scrape loop; both do
// their first round at once.
func (p *Prober) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	running := map[*endpoint.Endpoint]context.CancelFunc{}
	defer func() {
		for _, cancel := range running {
			cancel()
		}
		wg.Wait()
	}()
	for {
		changed := p.pool.Changed()
		current := map[*endpoint.Endpoint]bool{}
		for _, ep := range p.pool.All() {
			current[ep] = true
			if running[ep] != nil {
				continue
			}
			epCtx, cancel := context.WithCancel(ctx)
			running[ep] = cancel
			spec, _ := p.pool.Spec(ep)
			wg.Go(func() {
				p.every(epCtx, func(o Options) time.Duration { return p.healthInterval(ep, o) }, func() { _ = p.Check(epCtx, ep) })
			})
			// An auto endpoint gets a scrape loop too: it scrapes once its kind is known to
			// have metrics.
			if spec.MetricsPath != "" && (Supported(ep.Engine) || ep.Engine == Auto) {
				wg.Go(func() {
					p.every(epCtx, func(o Options) time.Duration { return o.ScrapeInterval }, func() {
						if !p.options().ScrapeDisabled && Supported(ep.Kind()) {
							_ = p.Scrape(epCtx, ep)
						}
					})
				})
			}
		}
		for ep, cancel := range running {
			if !current[ep] {
				cancel()
				delete(running, ep)
				p.mu.Lock()
				delete(p.state, ep)
				p.mu.Unlock()
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		}
	}
}

// healthInterval is the wait between ep's health checks: UnhealthyInterval while its last
// check failed (out of rotation, or on its way out), HealthInterval otherwise and for an
// endpoint that is the router itself (each check is an access line of its own). Both are on the
// grid of every's ticks.
func (p *Prober) healthInterval(ep *endpoint.Endpoint, o Options) time.Duration {
	p.mu.Lock()
	s := p.state[ep]
	failing := s != nil && s.fail > 0 && !s.itself // the router itself is not coming up: no haste
	p.mu.Unlock()
	if failing {
		return o.UnhealthyInterval
	}
	return o.HealthInterval
}

// every runs f at once and then on the ticks of interval(options) until ctx ends.
//
// Every loop of the prober ticks on the same grid, the multiples of its interval since the
// prober's epoch: the scrapes of all endpoints come due together, and the health checks with
// every fifth of them at the defaults (1 s and 5 s), so that an idle router wakes once per
// second for all of them instead of once per endpoint and loop (measured with four engines:
// docs/operations.md, "Scraping"). Another router's epoch is another phase, so replicas in
// front of the same engines do not scrape them at the same instant. A round that overruns
// its interval skips the ticks it missed rather than running back to back.
func (p *Prober) every(ctx context.Context, interval func(Options) time.Duration, f func()) {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			f()
			t.Reset(untilTick(time.Since(p.epoch), interval(p.options())))
		}
	}
}

// untilTick is the wait from elapsed (since the epoch) to the next multiple of interval that
// is at least half an interval away: a loop that starts just before a tick (an endpoint added
// then) does its first round at once and its second at the tick after.
func untilTick(elapsed, interval time.Duration) time.Duration {
	next := (elapsed/interval + 1) * interval
	if next-elapsed < interval/2 {
		next += interval
	}
	return next - elapsed
}

// Check runs one health check of ep and applies the thresholds. It returns the check's error.
//
// An endpoint configured as auto is first asked what it is (Detect); until an answer decides,
// the check fails. When the health check of an endpoint answers 4xx (the engine has no such
// path: the quick start's vllm in front of ollama), the endpoint is probed once per failure
// streak: an auto endpoint takes the kind found (an engine restarted as another), one of a
// named kind keeps failing, with an error and a warning that say which kind it looks like.
//
// After a check that passed (its outcome recorded first), OnPassed is told, an endpoint whose
// config names no model is asked which it serves (listModels), and an engine that reports its
// step budget is asked for it on first contact and after a failed check (learnStep).
//
// An endpoint that answers any of these requests as the prober's own router (its Instance in
// InstanceHeader) is the router itself: the check fails, and the endpoint leaves rotation at
// once, whatever the thresholds (itself).
func (p *Prober) Check(ctx context.Context, ep *endpoint.Endpoint) error {
	o := p.options()
	var self atomic.Bool // set by do when an answer is the router's own
	if p.Instance != "" {
		ctx = context.WithValue(ctx, selfKey{}, &self)
	}
	if ep.Kind() == Auto {
		sent := o.Now()
		if err := p.detect(ctx, ep); err != nil {
			if self.Load() {
				return p.itself(ep, o)
			}
			if ctx.Err() != nil {
				return err // stopped by the caller, not failed
			}
			err = fmt.Errorf("detect the engine kind: %w", err)
			p.record(ep, err, o)
			if p.OnFailed != nil {
				p.OnFailed(ep, sent, checkFailure(err))
			}
			return err
		}
	}
	spec, _ := p.pool.Spec(ep)
	path := spec.HealthPath
	if path == "" {
		path = HealthPath(ep.Kind())
	}
	sent := o.Now()
	hctx, cancel := context.WithTimeout(ctx, o.HealthTimeout)
	err := p.get(hctx, ep.Name+path, 64<<10, nil)
	cancel()
	if self.Load() {
		return p.itself(ep, o)
	}
	if err != nil && ctx.Err() != nil {
		return err // stopped by the caller (shutdown, the endpoint left), not failed: not recorded
	}
	if err != nil && spec.HealthPath == "" && clientError(err) {
		err = p.mismatch(ctx, ep, err)
	}
	p.record(ep, err, o)
	if err != nil && p.OnFailed != nil {
		p.OnFailed(ep, sent, checkFailure(err))
	}
	if err == nil {
		if p.OnPassed != nil {
			p.OnPassed(ep, sent)
		}
		p.listModels(ctx, ep, o)
		p.learnStep(ctx, ep, o)
	}
	return err
}

// CheckFailure is how a health check failed (Prober.OnFailed). route.CheckFailure has the same
// fields, for route.Outlier.HealthFailed.
type CheckFailure struct {
	// Status is the HTTP status the check was answered with; 0: none.
	Status int
	// Timeout: no answer came within health.timeout (the connection made or not).
	Timeout bool
	// Refused: no connection could be made, and not for want of time: nothing listens at the
	// address (connection refused), or it does not resolve.
	Refused bool
}

// checkFailure says how a check failed with err. A failed detection of an auto endpoint's
// kind tells neither status nor cause (its error names what each probe got).
func checkFailure(err error) CheckFailure {
	var f CheckFailure
	var se *statusError
	if errors.As(err, &se) {
		f.Status = se.code
	}
	var ne net.Error
	f.Timeout = errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
	var op *net.OpError
	f.Refused = !f.Timeout && errors.As(err, &op) && op.Op == "dial"
	return f
}

// selfKey carries Check's flag, in its context, to do: an answer came from the prober's own
// router.
type selfKey struct{}

// errItself is what an answer from the prober's own router fails with.
var errItself = errors.New("this endpoint is this router itself (a routing loop: the discovery lists the router's own address)")

// itself fails ep's check: the endpoint is the prober's own router (a routing loop, or one
// waiting to happen: each request sent there would come back, and the proxy's loop guard
// answers it 508). It leaves rotation at once, not after unhealthy_threshold checks, and that
// is said once, until a check of it passes (the address serves another process).
func (p *Prober) itself(ep *endpoint.Endpoint, o Options) error {
	p.mu.Lock()
	s := p.st(ep)
	said := s.itself
	s.itself = true
	p.mu.Unlock()
	ep.SetHealthy(false) // before record, whose own warning would say it a second time
	p.record(ep, errItself, o)
	if !said {
		p.log.Warn("the endpoint is this router itself: it is left out (a routing loop: the discovery lists the router's own address; narrow the selector, Service or DNS name so that it matches the engines only)",
			"endpoint", ep.Name, "instance", p.Instance)
	}
	return errItself
}

// modelsEvery is how often an endpoint's models are asked again.
const modelsEvery = 30 * time.Second

// listModels asks an endpoint which models it serves (GET /v1/models), on first contact and
// then at most every modelsEvery. For an endpoint whose config names no model, the router then
// routes only those to it, resolves "name" and "name:latest" alike, and lists them in its own
// /v1/models; a failure keeps what was known. For one whose config names its models, the list
// is only compared (checkModels): routing follows the config, and an engine's 404 naming the
// model (the proxy's) is what leaves the endpoint out for it.
func (p *Prober) listModels(ctx context.Context, ep *endpoint.Endpoint, o Options) {
	p.mu.Lock()
	s := p.st(ep)
	due := o.Now().Sub(s.modelsAt) >= modelsEvery
	if due {
		s.modelsAt = o.Now()
	}
	p.mu.Unlock()
	if !due {
		return
	}
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	mctx, cancel := context.WithTimeout(ctx, o.HealthTimeout)
	defer cancel()
	err := p.get(mctx, ep.Name+"/v1/models", 1<<20, jsonInto(&list, func() bool { return list.Data != nil }))
	if err != nil {
		p.log.Debug("listing the endpoint's models failed", "endpoint", ep.Name, "err", err)
		return
	}
	ids := make([]string, 0, len(list.Data))
	for _, m := range list.Data {
		if m.ID != "" && len(m.ID) <= 256 {
			ids = append(ids, m.ID)
		}
	}
	if len(ep.Models) > 0 {
		p.checkModels(ep, ids)
		return
	}
	if len(ids) > 0 {
		ep.SetServedModels(ids)
		if p.OnModels != nil {
			p.OnModels(ep, ids)
		}
	}
}

// checkModels compares the models ep's config names with those its engine lists (listed), and
// warns once for each change of the configured models it lacks: an engine started with
// another model (or another name for it) than endpoints[].models (serve's --model) says. An empty list says
// nothing (an engine still loading, a server that lists none), and so does llama.cpp's.
func (p *Prober) checkModels(ep *endpoint.Endpoint, listed []string) {
	if len(listed) == 0 || ep.Kind() == "llamacpp" {
		return // llama.cpp run with one model answers under any name, and lists its file's
	}
	var missing []string
	for _, m := range ep.Models {
		if !slices.ContainsFunc(listed, func(l string) bool { return endpoint.SameModel(l, m) }) {
			missing = append(missing, m)
		}
	}
	key := strings.Join(missing, "\x00")
	p.mu.Lock()
	s := p.st(ep)
	changed := s.modelsMissing != key
	s.modelsMissing = key
	p.mu.Unlock()
	switch {
	case !changed:
	case len(missing) > 0:
		if len(listed) > 8 {
			listed = append(listed[:8:8], fmt.Sprintf("... (%d in all)", len(listed)))
		}
		p.log.Warn("the engine does not list a model that endpoints[].models (--model) names: requests for it will get the engine's 404 there; check endpoints[].models (--model) or the engine's served model name",
			"endpoint", ep.Name, "missing", missing, "engine_lists", listed)
	default:
		p.log.Info("the engine lists every model that endpoints[].models (--model) names", "endpoint", ep.Name)
	}
}

// detect finds ep's engine kind and makes it the kind in force. After checks that failed (the
// engine was down, or not yet up, when the router started: their streak was said as a
// warning, record), the line says how many.
func (p *Prober) detect(ctx context.Context, ep *endpoint.Endpoint) error {
	d, err := p.Detect(ctx, ep.Name)
	if err != nil {
		return err
	}
	p.mu.Lock()
	failed := p.st(ep).fail
	p.mu.Unlock()
	var after []any
	if failed > 0 {
		after = []any{"after_failed_checks", failed}
	}
	p.adopt(ep, d, "", slog.LevelInfo, "engine kind detected", after...)
	return nil
}

// adopt records a detection in ep's status with a hint for its health-check errors (for an
// auto endpoint, the hint is empty and the kind found becomes the kind in force), and logs it
// with attrs added.
func (p *Prober) adopt(ep *endpoint.Endpoint, d Detection, hint string, level slog.Level, msg string, attrs ...any) {
	if ep.Engine == Auto {
		ep.SetKind(d.Kind)
	}
	p.mu.Lock()
	s := p.st(ep)
	s.hint = hint
	s.status.Detected = &d
	p.mu.Unlock()
	p.log.Log(context.Background(), level, msg, append([]any{"endpoint", ep.Name, "configured", ep.Engine, "engine", d.Kind, "evidence", d.Evidence}, attrs...)...)
}

// mismatch handles a health check that answered 4xx: it probes the endpoint at the start of a
// failure streak and returns the check's error, with what the endpoint looks like when that
// is another kind.
func (p *Prober) mismatch(ctx context.Context, ep *endpoint.Endpoint, checkErr error) error {
	p.mu.Lock()
	s := p.st(ep)
	first, hint := s.fail == 0, s.hint
	p.mu.Unlock()
	if !first {
		if hint != "" {
			return fmt.Errorf("%w (%s)", checkErr, hint)
		}
		return checkErr
	}
	d, err := p.Detect(ctx, ep.Name)
	if err != nil || d.Kind == ep.Kind() {
		return checkErr
	}
	if ep.Engine == Auto {
		// The kind changed under us: take the new one; the next check uses its health path.
		p.adopt(ep, d, "", slog.LevelWarn, "engine kind changed")
		return checkErr
	}
	hint = kindHint(d, ep.Engine)
	p.adopt(ep, d, hint, slog.LevelWarn, "endpoint's engine kind looks wrong")
	return fmt.Errorf("%w (%s)", checkErr, hint)
}

// kindHint says that an endpoint configured as kind configured looks like d's kind, and the fix.
func kindHint(d Detection, configured string) string {
	return fmt.Sprintf("the endpoint looks like %s, not %s: %s; set engine: %s (--engine %s), or auto, for it", d.Kind, configured, d.Evidence, d.Kind, d.Kind)
}

// record applies one check's outcome to ep's streaks and health.
func (p *Prober) record(ep *endpoint.Endpoint, err error, o Options) {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.st(ep)
	s.status.LastCheck = o.Now()
	// A new endpoint starts healthy (but one whose cache salt waits for its kind); its first
	// check decides at once, so that one that is down at start leaves rotation without waiting
	// for unhealthy_threshold checks.
	first := !s.checked
	s.checked = true
	if err == nil {
		s.succ++
		s.fail = 0
		s.hint = ""
		s.itself = false
		s.status.LastCheckError = ""
		if !ep.Healthy() && (first || s.succ >= o.HealthyThreshold) {
			ep.SetHealthy(true)
			p.log.Info("endpoint healthy", "endpoint", ep.Name)
		}
	} else {
		s.fail++
		s.succ = 0
		s.stepAsked = false // the engine may come back restarted with another budget
		s.status.LastCheckError = err.Error()
		// The first check decides alone, whatever unhealthy_threshold says: its line says so
		// (first_check), or its consecutive_failures 1 would read as a threshold ignored.
		var firstCheck []any
		if first {
			firstCheck = []any{"first_check", true}
		}
		switch {
		case ep.Healthy() && (first || s.fail >= o.UnhealthyThreshold):
			ep.SetHealthy(false)
			p.log.Warn("endpoint unhealthy", append([]any{"endpoint", ep.Name, "consecutive_failures", s.fail, "err", err}, firstCheck...)...)
		case first && !errors.Is(err, errItself):
			// An endpoint that starts out of rotation (engine auto whose cache salt waits for
			// the kind: endpoint.Spec.CacheSaltAuto) has no change of health to say when its
			// first check fails; without this line an engine that is down, or an address that
			// is wrong, would show only in /debug/endpoints. The router itself says so in
			// itself.
			ep.SetHealthy(false) // no change, but the first check is recorded: requests waiting for it get their 503 (endpoint.FirstCheck)
			p.log.Warn("endpoint unhealthy", append([]any{"endpoint", ep.Name, "consecutive_failures", s.fail, "err", err}, firstCheck...)...)
		case ep.Healthy():
			// Below unhealthy_threshold the endpoint stays in rotation: a failed check (an
			// engine restarting, an answer late) is no warning until the streak takes it out.
			p.log.Info("endpoint health check failed: still in rotation below unhealthy_threshold", "endpoint", ep.Name,
				"consecutive_failures", s.fail, "unhealthy_threshold", o.UnhealthyThreshold, "err", err)
		}
	}
	s.status.Healthy = ep.Healthy()
	s.status.ConsecutiveFailures = s.fail
}

// Status returns what the prober knows of ep.
func (p *Prober) Status(ep *endpoint.Endpoint) Status {
	p.mu.Lock()
	defer p.mu.Unlock()
	if s := p.state[ep]; s != nil {
		st := s.status
		st.Healthy = ep.Healthy()
		return st
	}
	return Status{Healthy: ep.Healthy()}
}

// Scrape fetches ep's metrics once and stores the snapshot (stamped with the scrape time). On
// error the previous snapshot stays, and its age tells how stale it is.
func (p *Prober) Scrape(ctx context.Context, ep *endpoint.Endpoint) error {
	o := p.options()
	spec, _ := p.pool.Spec(ep)
	if spec.MetricsPath == "" {
		return fmt.Errorf("scrape %s: no metrics path", ep.Name)
	}
	sctx, cancel := context.WithTimeout(ctx, o.ScrapeTimeout)
	defer cancel()
	var snap *endpoint.Snapshot
	err := p.get(sctx, ep.Name+spec.MetricsPath, o.MaxMetricsBytes, func(r io.Reader) error {
		var err error
		snap, err = Parse(ep.Kind(), r, o.Now())
		return err
	})
	if err != nil {
		if ctx.Err() != nil {
			// The caller stopped it (the router shuts down, the endpoint left): no failure of
			// the endpoint's, nothing to warn about or count in its streak.
			return err
		}
		return p.scrapeFailed(ctx, ep, err, o) // its probes have their own timeouts, not what is left of the scrape's
	}
	p.mu.Lock()
	s := p.st(ep)
	s.status.LastScrape = o.Now()
	s.status.LastScrapeError = ""
	fails, warned := s.scrapeFails, s.scrapeWarned
	s.scrapeFails, s.scrapeWarned, s.scrapeRewarned, s.scrapeHint = 0, false, false, ""
	p.mu.Unlock()
	if warned {
		p.log.Info("the endpoint's metrics are scraped again", "endpoint", ep.Name, "failed_scrapes", fails)
	}
	ep.SetSnapshot(snap)
	return nil
}

// scrapeWarnAgain is how long a streak of failed scrapes lasts before it is said once more.
const scrapeWarnAgain = time.Minute

// scrapeFailed records a failed scrape of ep and returns its error, with what the endpoint
// looks like where that explains it. Policies go on with the last snapshot, aging, so a streak
// of failures is said as a warning once, at its first failure while the endpoint is healthy
// (an engine that is down says so by its health checks), once more when it has lasted
// scrapeWarnAgain, and its end at info; each failure is logged at debug (so are those before
// the first health check, which says whether the engine is up at all). When the page had
// none of the families the router reads for the endpoint's kind, the endpoint is asked what it
// is (Detect), once per streak, as when a health check answers 4xx (mismatch): a named kind
// gets the hint in the warning and in every error of the streak; an auto endpoint takes the
// kind found (an engine restarted as another).
func (p *Prober) scrapeFailed(ctx context.Context, ep *endpoint.Endpoint, err error, o Options) error {
	p.mu.Lock()
	s := p.st(ep)
	s.scrapeFails++
	fails := s.scrapeFails
	first := !s.scrapeWarned && s.checked && ep.Healthy()
	again := s.scrapeWarned && !s.scrapeRewarned && o.Now().Sub(s.scrapeWarnedAt) >= scrapeWarnAgain
	if first {
		s.scrapeWarned, s.scrapeWarnedAt = true, o.Now()
	}
	if again {
		s.scrapeRewarned = true
	}
	hint, since := s.scrapeHint, s.scrapeWarnedAt
	p.mu.Unlock()

	var looks string // the kind the endpoint looks like, found now
	adopted := false // an auto endpoint took the kind found, and said so
	if first && errors.Is(err, errNoFamilies) {
		if d, derr := p.Detect(ctx, ep.Name); derr == nil && d.Kind != ep.Kind() {
			if ep.Engine == Auto {
				p.adopt(ep, d, "", slog.LevelWarn, "engine kind changed")
				adopted = true
			} else {
				hint, looks = kindHint(d, ep.Engine), d.Kind
				p.mu.Lock()
				s = p.st(ep)
				s.scrapeHint = hint
				s.status.Detected = &d
				p.mu.Unlock()
			}
		}
	}
	if hint != "" {
		err = fmt.Errorf("%w (%s)", err, hint)
	}
	p.mu.Lock()
	s = p.st(ep)
	s.status.LastScrape = o.Now()
	s.status.LastScrapeError = err.Error()
	p.mu.Unlock()

	switch {
	case looks != "":
		p.log.Warn("endpoint's engine kind looks wrong: its metrics are not read (said once while the scrapes fail; /debug/endpoints shows the last error)",
			"endpoint", ep.Name, "configured", ep.Engine, "engine", looks, "err", err)
	case first && !adopted:
		p.log.Warn("scraping the endpoint's metrics failed: policies go on with its last snapshot, aging (said once while the scrapes fail; /debug/endpoints shows the last error)",
			"endpoint", ep.Name, "err", err)
	case again:
		p.log.Warn("scraping the endpoint's metrics still fails", "endpoint", ep.Name, "failed_scrapes", fails,
			"for", o.Now().Sub(since).Round(time.Second).String(), "err", err)
	default:
		p.log.Debug("scrape failed", "endpoint", ep.Name, "err", err)
	}
	return err
}

var errTooLarge = errors.New("response too large")

// get fetches url and hands at most limit bytes of a 2xx body to read (nil: discard it).
func (p *Prober) get(ctx context.Context, url string, limit int64, read func(io.Reader) error) error {
	return p.do(ctx, http.MethodGet, url, nil, limit, read)
}

// do sends a request with body (a JSON document, when not nil) and hands at most limit bytes
// of a 2xx answer to read (nil: discard it).
func (p *Prober) do(ctx context.Context, method, url string, body []byte, limit int64, read func(io.Reader) error) error {
	var rb io.Reader
	if body != nil {
		rb = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rb)
	if err != nil {
		return fmt.Errorf("%s %s: %w", strings.ToLower(method), url, err)
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4;q=1,*/*;q=0.1")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return err // a *url.Error: it names the method and the URL already
	}
	defer resp.Body.Close()
	m := strings.ToLower(method)
	if p.Instance != "" && resp.Header.Get(InstanceHeader) == p.Instance {
		if self, ok := ctx.Value(selfKey{}).(*atomic.Bool); ok {
			self.Store(true)
		}
		return fmt.Errorf("%s %s: %w", m, url, errItself)
	}
	answer := io.LimitReader(resp.Body, limit+1)
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		msg, _ := io.ReadAll(io.LimitReader(answer, 200))
		return &statusError{method: m, url: url, code: resp.StatusCode, body: strings.TrimSpace(string(msg))}
	}
	if read == nil {
		_, _ = io.Copy(io.Discard, answer)
		return nil
	}
	lr := &countingReader{r: answer}
	if err := read(lr); err != nil {
		if lr.n > limit {
			return fmt.Errorf("%s %s: %w (over %d bytes)", m, url, errTooLarge, limit)
		}
		return fmt.Errorf("%s %s: %w", m, url, err)
	}
	if lr.n > limit {
		return fmt.Errorf("%s %s: %w (over %d bytes)", m, url, errTooLarge, limit)
	}
	return nil
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	c.n += int64(n)
	return n, err
}
