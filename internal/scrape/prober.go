package scrape

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
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
	HealthTimeout      time.Duration
	HealthyThreshold   int // consecutive successes that make an unhealthy endpoint healthy
	UnhealthyThreshold int // consecutive failures that make a healthy endpoint unhealthy
	PassiveFailures    int // consecutive proxy connection errors that eject an endpoint
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
		HealthTimeout:      c.Health.Timeout.D(),
		HealthyThreshold:   c.Health.HealthyThreshold,
		UnhealthyThreshold: c.Health.UnhealthyThreshold,
		PassiveFailures:    c.Health.PassiveFailures,
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
	def(&o.HealthTimeout, 2*time.Second)
	def(&o.ScrapeInterval, time.Second)
	def(&o.ScrapeTimeout, time.Second)
	for _, p := range []struct {
		v *int
		d int
	}{{&o.HealthyThreshold, 1}, {&o.UnhealthyThreshold, 2}, {&o.PassiveFailures, 3}} {
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
// llama.cpp (which answers 503 while loading the model), /v1/models for a generic OpenAI server.
func HealthPath(engine string) string {
	if engine == "openai" || engine == "" {
		return "/v1/models"
	}
	return "/health"
}

// Status is what the prober knows of one endpoint, for /debug/endpoints.
type Status struct {
	Healthy             bool      `json:"healthy"`
	LastCheck           time.Time `json:"last_check"`
	LastCheckError      string    `json:"last_check_error,omitempty"`
	ConsecutiveFailures int       `json:"consecutive_failures"`
	PassiveFailures     int       `json:"passive_failures"`
	LastScrape          time.Time `json:"last_scrape"`
	LastScrapeError     string    `json:"last_scrape_error,omitempty"`
}

type epState struct {
	succ, fail, passive int
	checked             bool // the first check decides alone
	status              Status
}

// Prober health-checks and scrapes the pool's endpoints. Its goroutines start in Run, never in
// New, and stop when Run's context ends. Check, Scrape, ReportFailure and ReportSuccess are safe
// for concurrent use.
type Prober struct {
	// OnHealthChange, when set before Run, is told each time the prober puts an endpoint out
	// of rotation (a failed check, or passive ejection) or back into it (a passing check). It
	// is called with the prober's lock held: it must not call the prober.
	OnHealthChange func(ep *endpoint.Endpoint, healthy bool)

	pool   *endpoint.Pool
	client *http.Client
	log    *slog.Logger
	opt    atomic.Pointer[Options]

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
	p := &Prober{pool: pool, client: client, log: log, state: map[*endpoint.Endpoint]*epState{}}
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
				p.every(epCtx, func(o Options) time.Duration { return o.HealthInterval }, func() { _ = p.Check(epCtx, ep) })
			})
			if spec.MetricsPath != "" && Supported(ep.Engine) {
				wg.Go(func() {
					p.every(epCtx, func(o Options) time.Duration { return o.ScrapeInterval }, func() {
						if !p.options().ScrapeDisabled {
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

// every runs f at once and then every interval(options) until ctx ends.
func (p *Prober) every(ctx context.Context, interval func(Options) time.Duration, f func()) {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			f()
			t.Reset(interval(p.options()))
		}
	}
}

// Check runs one health check of ep and applies the thresholds. It returns the check's error.
func (p *Prober) Check(ctx context.Context, ep *endpoint.Endpoint) error {
	o := p.options()
	spec, _ := p.pool.Spec(ep)
	path := spec.HealthPath
	if path == "" {
		path = HealthPath(ep.Engine)
	}
	ctx, cancel := context.WithTimeout(ctx, o.HealthTimeout)
	defer cancel()
	err := p.get(ctx, ep.Name+path, 64<<10, nil)
	p.record(ep, err, o)
	return err
}

// record applies one check's outcome to ep's streaks and health.
func (p *Prober) record(ep *endpoint.Endpoint, err error, o Options) {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.st(ep)
	s.status.LastCheck = o.Now()
	// A new endpoint starts healthy; its first check decides at once, so that one that is down
	// at start leaves rotation without waiting for unhealthy_threshold checks.
	first := !s.checked
	s.checked = true
	if err == nil {
		s.succ++
		s.fail = 0
		s.status.LastCheckError = ""
		if !ep.Healthy() && (first || s.succ >= o.HealthyThreshold) {
			ep.SetHealthy(true)
			s.passive = 0
			p.log.Info("endpoint healthy", "endpoint", ep.Name)
			p.changed(ep, true)
		}
	} else {
		s.fail++
		s.succ = 0
		s.status.LastCheckError = err.Error()
		if ep.Healthy() && (first || s.fail >= o.UnhealthyThreshold) {
			ep.SetHealthy(false)
			p.log.Warn("endpoint unhealthy", "endpoint", ep.Name, "consecutive_failures", s.fail, "err", err)
			p.changed(ep, false)
		}
	}
	s.status.Healthy = ep.Healthy()
	s.status.ConsecutiveFailures = s.fail
}

// ReportFailure records a connection error met while proxying to ep. After PassiveFailures of
// them in a row the endpoint is marked unhealthy until active checks pass again.
func (p *Prober) ReportFailure(ep *endpoint.Endpoint) {
	o := p.options()
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.st(ep)
	s.passive++
	s.status.PassiveFailures = s.passive
	if ep.Healthy() && s.passive >= o.PassiveFailures {
		ep.SetHealthy(false)
		s.succ = 0
		s.status.Healthy = false
		p.log.Warn("endpoint ejected after connection errors", "endpoint", ep.Name, "consecutive_errors", s.passive)
		p.changed(ep, false)
	}
}

func (p *Prober) changed(ep *endpoint.Endpoint, healthy bool) {
	if p.OnHealthChange != nil {
		p.OnHealthChange(ep, healthy)
	}
}

// ReportSuccess records a successful exchange with ep while proxying: it resets the count of
// consecutive connection errors.
func (p *Prober) ReportSuccess(ep *endpoint.Endpoint) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if s := p.state[ep]; s != nil {
		s.passive = 0
		s.status.PassiveFailures = 0
	}
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
	ctx, cancel := context.WithTimeout(ctx, o.ScrapeTimeout)
	defer cancel()
	var snap *endpoint.Snapshot
	err := p.get(ctx, ep.Name+spec.MetricsPath, o.MaxMetricsBytes, func(r io.Reader) error {
		var err error
		snap, err = Parse(ep.Engine, r, o.Now())
		return err
	})
	p.mu.Lock()
	s := p.st(ep)
	s.status.LastScrape = o.Now()
	if err != nil {
		s.status.LastScrapeError = err.Error()
	} else {
		s.status.LastScrapeError = ""
	}
	p.mu.Unlock()
	if err != nil {
		p.log.Debug("scrape failed", "endpoint", ep.Name, "err", err)
		return err
	}
	ep.SetSnapshot(snap)
	return nil
}

var errTooLarge = errors.New("response too large")

// get fetches url and hands at most limit bytes of a 2xx body to read (nil: discard it).
func (p *Prober) get(ctx context.Context, url string, limit int64, read func(io.Reader) error) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("get %s: %w", url, err)
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4;q=1,*/*;q=0.1")
	resp, err := p.client.Do(req)
	if err != nil {
		return err // a *url.Error: it names the method and the URL already
	}
	defer resp.Body.Close()
	body := io.LimitReader(resp.Body, limit+1)
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		msg, _ := io.ReadAll(io.LimitReader(body, 200))
		return fmt.Errorf("get %s: status %d: %s", url, resp.StatusCode, strings.TrimSpace(string(msg)))
	}
	if read == nil {
		_, _ = io.Copy(io.Discard, body)
		return nil
	}
	lr := &countingReader{r: body}
	if err := read(lr); err != nil {
		if lr.n > limit {
			return fmt.Errorf("get %s: %w (over %d bytes)", url, errTooLarge, limit)
		}
		return fmt.Errorf("get %s: %w", url, err)
	}
	if lr.n > limit {
		return fmt.Errorf("get %s: %w (over %d bytes)", url, errTooLarge, limit)
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
