package app

import (
	"context"
	crand "crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/pprof"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/client-go/dynamic"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/discovery"
	"github.com/kvroute/kvroute/internal/discovery/inferencepool"
	"github.com/kvroute/kvroute/internal/discovery/kube"
	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/h1"
	"github.com/kvroute/kvroute/internal/metrics"
	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/policy"
	"github.com/kvroute/kvroute/internal/prefix"
	"github.com/kvroute/kvroute/internal/proxy"
	"github.com/kvroute/kvroute/internal/route"
	"github.com/kvroute/kvroute/internal/scrape"
	"github.com/kvroute/kvroute/internal/tenant"
	"github.com/kvroute/kvroute/internal/version"
)

// Router is a whole router built from a config: the endpoint pool (static endpoints plus the
// discovery file), the health prober and metrics scraper, the policy, the API handler and the
// admin handler. `kvroute serve` and `kvroute demo` both build one:
//
//	r, err := app.NewRouter(cfg, logger)
//	go r.Run(ctx)                       // discovery, health checks, scraping
//	api, admin := r.Handler(), r.AdminHandler()
//	...
//	r.Reload(newCfg)                    // on SIGHUP or file change
//
// or simply r.Serve(ctx, apiListener, adminListener), which does all of it and drains on ctx's
// end. Set the hook fields before the first call to Handler or Run.
type Router struct {
	// Middleware wraps the API handler, first element outermost.
	Middleware []func(http.Handler) http.Handler
	// Admit and Saturated are copied into every Handler (see Handler). Admit nil: the tenant
	// gate's admission queue (overload section).
	Admit     func(ctx context.Context, id *tenant.Identity, candidates []*endpoint.Endpoint) (release func(), err error)
	Saturated func(candidates []*endpoint.Endpoint) bool
	// KubeClient, when set, is what the discovery.kubernetes sources and peers.kubernetes talk
	// to instead of the clients their kubeconfig (or the in-cluster account) gave (tests use a
	// fake).
	KubeClient kube.Client
	// PoolClient, when set, is what the discovery.inference_pool source reads InferencePools
	// with (and KubeClient its pods); tests use fakes.
	PoolClient dynamic.Interface
	// Beside, when set, is what else Serve serves the router's traffic with (serve: the Envoy
	// ext_proc endpoint picker, ServeExtProc), run until the context it is given ends, which
	// Serve ends as its own shutdown starts: both drain side by side, and discovery, health
	// checks, scraping and peers stop only once both have drained (each drain has its own
	// delay: ext_proc waits out server.drain_delay when its gRPC readiness was asked, the API
	// when /readyz was). An error it returns before then shuts Serve down, as a server's does;
	// Serve returns its error when it has none of its own.
	Beside func(ctx context.Context) error

	logger    *slog.Logger // NewRouter's, its level the one in force (logs)
	accessLog *slog.Logger // the API handler's: logger's, with the access line under log.access
	logs      *logControl  // log level and access log, changed at reload and at /debug/loglevel
	logInner  slog.Handler // what both write to (routerLoggers)
	reg       *prometheus.Registry
	metrics   *metrics.Metrics
	pool      *endpoint.Pool
	prober    *scrape.Prober
	state     *route.State   // response pins, across reloads
	outlier   *route.Outlier // passive ejection, across reloads
	audit     *route.Audit   // predicted against reported cached tokens, across reloads
	transport *h1.Transport  // to the endpoints; its Fallback also carries health checks and scrapes
	gate      *tenant.Gate   // authentication, per-tenant limits and salts, admission
	peers     *peers         // replica sync (peers.go); nil for a lone router

	// checkFailed is how each endpoint's last health check failed (*endpoint.Endpoint ->
	// scrape.CheckFailure), while it is the last: for the 503 that says why a model's
	// endpoints are all out (proxy.Handler.CheckFailure).
	checkFailed sync.Map

	mu         sync.Mutex // serialises Reload and discovery updates
	cfg        *config.Config
	secret     [sha256.Size]byte // digest of the tenants' salt secret in force (reload.go)
	picker     policy.Picker
	policyKey  string
	discovered [][]endpoint.Spec // per source: [0] the discovery file, each discovery.dns name, each discovery.kubernetes entry, the inference pool
	dns        []*discovery.DNSSource
	kube       []*kube.Source
	infpool    *inferencepool.Source // discovery.inference_pool (inferencepool.go), the last source
	h          atomic.Pointer[proxy.Handler]
	api        http.Handler
	apiOnce    sync.Once
	// unready: /readyz said that every available endpoint is ejected, and says so until one can
	// take a request again (ready).
	unready atomic.Bool
	// draining: Serve's ctx ended; /readyz answers 503 from then on. readyAsked: /readyz has
	// been asked since the start (someone follows it: Serve's drain delay is for them).
	draining   atomic.Bool
	readyAsked atomic.Bool
	// stopWait, when set, replaces the const stopWait (tests).
	stopWait time.Duration
}

// NewRouter builds a router from a loaded (defaulted and validated) config. It starts no
// goroutine: call Run (or Serve).
func NewRouter(cfg *config.Config, logger *slog.Logger) (*Router, error) {
	if logger == nil {
		logger = slog.Default()
	}
	// Every part of the router logs at the level in force (log.level, /debug/loglevel).
	logger, accessLog, logs, inner := routerLoggers(logger, cfg)
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	r := &Router{
		logger:    logger,
		accessLog: accessLog,
		logs:      logs,
		logInner:  inner,
		reg:       reg,
		metrics:   metrics.New(reg),
		pool:      endpoint.NewPool(),
		state:     route.NewState(0),
		transport: h1.New(proxy.DefaultTransport()),
	}
	r.outlier = route.NewOutlier(r.outlierConfig(cfg), nil)
	r.audit = route.NewAudit(route.AuditConfig{OnChange: func(ep *endpoint.Endpoint, blind bool, found, predicted float64) {
		r.metrics.EndpointCacheBlind(ep.Name, blind)
		if blind {
			r.logger.Warn("the engine reports far fewer cached tokens than predicted: routing to it on load alone until they agree (check its cache salt, tokenizer, block size and prefix caching)",
				"endpoint", ep.Name, "found_share", found/predicted)
		} else {
			r.logger.Info("the engine's cached tokens agree with the predictions again", "endpoint", ep.Name, "found_share", found/predicted)
		}
	}})
	dialer := &net.Dialer{Timeout: cfg.Limits.ConnectTimeout.D(), KeepAlive: 30 * time.Second}
	r.transport.Dialer = dialer
	r.transport.Fallback.DialContext = dialer.DialContext
	r.prober = scrape.New(r.pool, proberClient(r.transport.Fallback), scrape.OptionsFrom(cfg), logger)
	// This process's id, in every answer of its API listener and in the requests it sends on:
	// the prober finds the router itself among the endpoints by it, and each Handler's loop
	// guard a request that came back (one id for the process: Handlers are rebuilt on reload).
	r.prober.Instance = proxy.NewInstanceID()
	// The models an engine lists, where the config names none, label its requests: their
	// series are made at 0 as a configured model's are. A round of an endpoint replaced or
	// gone meanwhile tells nothing.
	r.prober.OnModels = func(ep *endpoint.Endpoint, models []string) {
		if r.pool.ByName(ep.Name) == ep {
			r.metrics.EndpointServes(ep.Name, models)
		}
	}
	// A health check that passes ends a passive ejection begun before it was sent
	// (route.Outlier.HealthPassed): an engine that restarted is back within a health interval,
	// not after health.ejection_time. Both stamp times with the wall clock.
	r.prober.OnPassed = func(ep *endpoint.Endpoint, sent time.Time) {
		r.checkFailed.Delete(ep)
		r.outlier.HealthPassed(ep, sent)
	}
	// A failed one lets a later pass end an ejection whose failures mix a restart's (refused
	// connections, cut streams) with 503s or timeouts (a model loading): the check saw it. How
	// it failed goes with it: one for 503s alone takes a 5xx or a refused connection, not a
	// timeout (an overloaded engine's /health).
	r.prober.OnFailed = func(ep *endpoint.Endpoint, sent time.Time, why scrape.CheckFailure) {
		r.checkFailed.Store(ep, why)
		r.outlier.HealthFailed(ep, sent, route.CheckFailure(why))
	}
	r.metrics.WatchEndpoints(r.pool.All)
	r.metrics.WatchPrefillRate(r.prefillRate)
	r.metrics.WatchLearnedCapacity(r.learnedKVTokens)
	r.watchAutoscale(metrics.NewAutoscale(reg, cfg.Autoscale.Window.D()))
	r.metrics.WatchIndex(func() (int, int64) {
		if h := r.h.Load(); h != nil {
			if s, ok := h.Lifecycle.Picker().(policy.IndexSizer); ok {
				return s.IndexSize()
			}
		}
		return 0, 0
	})
	gate, err := tenant.New(cfg, tenant.Options{Logger: logger, PrefillRate: r.prefillRate, Metrics: r.metrics.Tenant})
	if err != nil {
		return nil, fmt.Errorf("tenants: %w", err)
	}
	r.gate = gate
	r.dns = discovery.DNSFromConfig(cfg, logger)
	if r.kube, err = kube.FromConfig(cfg, version.UserAgent(), logger); err != nil {
		return nil, err
	}
	self := selfExcluder(cfg)
	for _, d := range r.dns {
		d.Exclude = self
	}
	for _, k := range r.kube {
		k.Exclude = self
	}
	r.discovered = make([][]endpoint.Spec, 1+len(r.dns)+len(r.kube))
	if err := r.addInferencePool(cfg, self); err != nil {
		return nil, err
	}
	if src := discovery.FromConfig(cfg, logger); src != nil {
		r.metrics.DiscoverySource(r.sourceName(0))
		specs, err := src.Load()
		if err != nil {
			return nil, err
		}
		r.discovered[0] = specs
		r.metrics.DiscoveredEndpoints.WithLabelValues(r.sourceName(0)).Set(float64(len(specs)))
	}
	// A name that does not resolve yet is no reason not to start: Run tries again. The names
	// are resolved together, so that several that hang delay the start by one lookup's bound.
	for i, d := range r.dns {
		r.metrics.DiscoverySource(r.sourceName(1 + i))
		d.OnError = func(error) { r.metrics.DiscoveryErrors.WithLabelValues(r.sourceName(1 + i)).Inc() }
	}
	sets, errs := discovery.ResolveAll(context.Background(), r.dns)
	for i, d := range r.dns {
		specs, err := sets[i], errs[i]
		if err != nil {
			d.OnError(err)
			logger.Warn("DNS discovery failed at start, trying again every interval", "name", d.Config.Name, "err", err)
			continue
		}
		r.discovered[1+i] = specs
		r.metrics.DiscoveredEndpoints.WithLabelValues(r.sourceName(1 + i)).Set(float64(len(specs)))
	}
	if r.peers, err = r.newPeers(cfg); err != nil {
		return nil, err
	}
	if err := r.apply(cfg); err != nil {
		return nil, err
	}
	return r, nil
}

// Reload applies a new config to the running router without dropping requests in flight:
// endpoints are diffed (kept ones keep their counters and their place in the policy's index,
// removed ones drain), the policy is rebuilt only when its name or parameters changed (given
// other parameters, a policy that can keeps what it learned: policy.Inheritor), and
// normalisation, limits, health and scrape settings, log.level and log.access take effect for
// new requests (log.level ends a level set at /debug/loglevel). A config that cannot be applied
// is rejected whole and the old one stays. The settings that change only on restart
// (keepRestartOnly: listen, admin_listen, discovery, extproc, server's but endpoint_header,
// peers' but its secrets, pprof, log.format, autoscale.window and pod_deletion_cost) stay as
// they are in the config in force (Config), at this reload and the next ones, and each reload
// whose file differs from them says so. Tenants added, removed or
// given other keys are logged by name, and a new salt secret once it is in force.
func (r *Router) Reload(cfg *config.Config) error {
	old := r.Config()
	file := cfg
	if old != nil {
		cfg = keepRestartOnly(old, file)
	}
	r.mu.Lock()
	secret := r.secret
	r.mu.Unlock()
	err := r.apply(cfg)
	if err != nil {
		r.metrics.ConfigReload(false)
		r.logger.Error("config rejected, keeping the old one", "err", err)
		return err
	}
	r.metrics.ConfigReload(true)
	r.logs.reloaded(r.logger, cfg)
	if old != nil {
		if file.Listen != old.Listen || file.AdminListen != old.AdminListen {
			r.logger.Warn("listen and admin_listen change only on restart: the listeners stay where they are",
				"listen", file.Listen, "listen_in_force", old.Listen, "admin_listen", file.AdminListen, "admin_listen_in_force", old.AdminListen)
		}
		// The other restart-only settings: what the file says against what is in force.
		if old.Discovery.File != file.Discovery.File || old.Discovery.PollInterval != file.Discovery.PollInterval {
			r.logger.Warn("discovery.file and discovery.poll_interval change only on restart",
				"file", file.Discovery.File, "file_in_force", old.Discovery.File)
		}
		if !reflect.DeepEqual(old.Discovery.DNS, file.Discovery.DNS) {
			r.logger.Warn("discovery.dns changes only on restart")
		}
		if !reflect.DeepEqual(old.Discovery.Kubernetes, file.Discovery.Kubernetes) {
			r.logger.Warn("discovery.kubernetes changes only on restart")
		}
		if !reflect.DeepEqual(old.Discovery.InferencePool, file.Discovery.InferencePool) {
			r.logger.Warn("discovery.inference_pool changes only on restart")
		}
		if old.ExtProc != file.ExtProc {
			r.logger.Warn("extproc changes only on restart", "listen", file.ExtProc.Listen, "listen_in_force", old.ExtProc.Listen)
		}
		r.peers.reloaded(r, old, file, cfg)
		if keys := serverChanges(old.Server, file.Server); len(keys) > 0 {
			r.logger.Warn("server settings change only on restart, endpoint_header excepted (renewed certificate files are read without one): those in force stay",
				"keys", keys)
		}
		if keys := otherRestartChanges(old, file); len(keys) > 0 {
			r.logger.Warn("pprof, log.format, autoscale.window and autoscale.pod_deletion_cost change only on restart: those in force stay", "keys", keys)
		}
		logTenantChanges(r.logger, old, cfg)
		r.mu.Lock()
		now := r.secret
		r.mu.Unlock()
		logSecretChange(r.logger, secret, now, cfg)
	}
	r.logger.Info("config applied", "endpoints", r.pool.Len(), "policy", cfg.Policy.Name)
	return nil
}

func (r *Router) apply(cfg *config.Config) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	var errs []error
	params, err := cfg.Policy.PolicyParams()
	if err != nil {
		errs = append(errs, fmt.Errorf("policy.params: %w", err))
	}
	key := cfg.Policy.Name + "\x00" + fmt.Sprint(params)
	picker := r.picker
	if err == nil && (picker == nil || key != r.policyKey) {
		picker, err = policy.New(cfg.Policy.Name, params, policy.Env{Rand: newRand(), Clock: policy.WallClock{}})
		if err != nil {
			errs = append(errs, fmt.Errorf("policy: %w", err))
		}
	}
	rules := make([]prefix.Rule, 0, len(cfg.Normalize.Rules))
	for _, ru := range cfg.Normalize.Rules {
		rules = append(rules, prefix.Rule{Pattern: ru.Pattern, Replace: ru.Replace})
	}
	norm, err := prefix.NewNormalizer(prefix.NormalizeOptions{Rules: rules})
	if err != nil {
		errs = append(errs, fmt.Errorf("normalize.rules: %w", err))
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	// Read here as well as by the gate: a file changed between the two reads is a change the
	// next reload (the watcher's) tells.
	secret := secretSum(cfg)
	if r.cfg != nil { // NewRouter built the gate from this config already
		if _, _, err := r.peers.readSecrets(cfg); err != nil {
			return err
		}
		if err := r.gate.Reload(cfg); err != nil {
			return fmt.Errorf("tenants: %w", err)
		}
	}
	removed, err := r.updatePoolLocked(discovery.Specs(cfg.Endpoints))
	if err != nil {
		return err
	}
	if picker != r.picker && r.picker != nil {
		// Before the new picker hears of anything (the endpoints removed, below): it takes
		// over what the old one learned, where it can.
		r.policyChangedLocked(r.picker, picker, r.cfg, cfg, params)
	}
	r.picker, r.policyKey, r.cfg, r.secret = picker, key, cfg, secret
	r.prober.SetOptions(scrape.OptionsFrom(cfg))
	r.outlier.Configure(r.outlierConfig(cfg))
	lc, err := route.New(route.Config{
		Picker:   picker,
		Attempts: 1 + cfg.Limits.Retries(),
		Health:   r.outlier,
		State:    r.state,
		Share:    r.peers.shared(),
		WarmUp:   cfg.Health.WarmUpTime(),
		Audit:    r.audit,
		// (0 when it is not shorter than the first-token timeout: as the attempt's own timer
		// would fire first, there is nothing to watch)
		StallTimeout: stallTimeout(cfg.Limits),
	})
	if err != nil {
		return err
	}
	for _, ep := range removed {
		lc.Removed(ep)
	}
	h := &proxy.Handler{
		// The API server's connection cap, which bounds a tenant's bodies being received (the
		// built-in server's own is also found through the request; net/http's only so).
		MaxConnections: resolveLimits(cfg, openFileLimit(), goMemoryLimit()).maxConns,
		Pool:           r.pool,
		Lifecycle:      lc,
		Keys:           route.Keys{BlockTokens: cfg.Prefix.BlockTokens, Normalizer: norm, Chains: prefix.NewChains(chainBlocks)},
		Gate:           r.gate,
		Admit:          r.Admit,
		Saturated:      r.Saturated,
		Metrics:        r.metrics,
		Logger:         r.accessLog,
		Transport:      r.transport,
		MaxBodyBytes:   cfg.Limits.MaxBodyBytes,
		Rewrite:        cfg.Normalize.Rewrite,
		EndpointHeader: cfg.Server.EndpointHeader,
		Instance:       r.prober.Instance,
		CheckFailure:   r.checkFailure,
		// A request in the router's first moments waits for an endpoint's first check at
		// most as long as one check may take.
		FirstCheckWait: cfg.Health.Timeout.D(),
		Timeouts: proxy.Timeouts{
			FirstToken: cfg.Limits.FirstTokenTimeout.D(),
			Response:   cfg.Limits.ResponseTimeout.D(),
			StreamIdle: cfg.Limits.StreamIdleTimeout.D(),
		},
	}
	r.h.Store(h)
	// The peers compare it with theirs (docs/replicas.md, "One policy on every replica").
	r.peers.advertisePolicy(cfg, params)
	return nil
}

// updatePoolLocked sets the pool to static + discovered endpoints, tells the metrics which
// endpoints came and left, and returns those that left, for the lifecycle in force to forget
// (route.Lifecycle.Removed: the policy, passive health checking, the audit and the other
// replicas; kept, an ejection of an endpoint long gone would count against
// max_ejected_percent for good). The caller holds r.mu.
func (r *Router) updatePoolLocked(static []endpoint.Spec) ([]*endpoint.Endpoint, error) {
	// A discovered endpoint that is also static keeps the static spec.
	diff, err := r.pool.Update(discovery.Merge(append([][]endpoint.Spec{static}, r.discovered...)...))
	if err != nil {
		return nil, fmt.Errorf("endpoints: %w", err)
	}
	for _, ep := range diff.Added {
		r.metrics.EndpointAdded(ep.Name, ep.Models)
	}
	var forget []string
	for _, ep := range diff.Removed {
		r.checkFailed.Delete(ep)
		if r.pool.ByName(ep.Name) == nil {
			forget = append(forget, ep.Name)
		}
	}
	r.metrics.ForgetEndpoints(forget)
	if len(diff.Added)+len(diff.Removed) > 0 {
		r.logger.Info("endpoints changed", "added", names(diff.Added), "removed", names(diff.Removed))
	}
	return diff.Removed, nil
}

func names(eps []*endpoint.Endpoint) []string {
	out := make([]string, len(eps))
	for i, e := range eps {
		out[i] = e.Name
	}
	return out
}

func newRand() *rand.Rand {
	var b [16]byte
	_, _ = crand.Read(b[:])
	return rand.New(rand.NewPCG(binary.LittleEndian.Uint64(b[:8]), binary.LittleEndian.Uint64(b[8:])))
}

// chainBlocks bounds what the router remembers of long prompts to hash their next turns
// incrementally (prefix.Chains): a million 16-token blocks, 8 MB of hashes for 64 MB of
// prompt text, some 160 conversations of 100k tokens.
const chainBlocks = 1 << 20

// prefillRate is the current policy's prefill-rate estimate for ep (tokens/s, 0 unknown), for
// the tenant gate's overload.max_predicted_ttft.
func (r *Router) prefillRate(ep *endpoint.Endpoint) float64 {
	if h := r.h.Load(); h != nil {
		if p, ok := h.Lifecycle.Picker().(interface{ PrefillRate(id int) float64 }); ok {
			return p.PrefillRate(ep.ID)
		}
	}
	return 0
}

// Logger returns the router's logger: NewRouter's, at the level in force (log.level, or the
// one set at /debug/loglevel), for whatever logs beside the router (the config watcher).
func (r *Router) Logger() *slog.Logger { return r.logger }

// Gate returns the tenant gate (authentication, limits, admission).
func (r *Router) Gate() *tenant.Gate { return r.gate }

// Config returns the config in force.
func (r *Router) Config() *config.Config {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cfg
}

// Pool returns the router's endpoint pool.
func (r *Router) Pool() *endpoint.Pool { return r.pool }

// Registry returns the registry the router's metrics are registered with.
func (r *Router) Registry() *prometheus.Registry { return r.reg }

// Metrics returns the router's collectors.
func (r *Router) Metrics() *metrics.Metrics { return r.metrics }

// Handler returns the OpenAI API handler, wrapped in Middleware. It always serves with the
// latest applied config.
func (r *Router) Handler() http.Handler {
	r.apiOnce.Do(func() {
		var h http.Handler = http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			r.h.Load().ServeHTTP(w, req)
		})
		for i := len(r.Middleware) - 1; i >= 0; i-- {
			h = r.Middleware[i](h)
		}
		r.api = h
	})
	return r.api
}

// Run discovers, health-checks and scrapes the endpoints until ctx ends. A part that stops
// for good before then (a peers listener that cannot bind, a discovery source that gives up)
// stops the others too: Run returns its error at once, so that Serve ends with it rather than
// serve on without it (a replica that could never become ready, say, with nothing in its log).
func (r *Router) Run(ctx context.Context) error {
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	errc := make(chan error, 4+len(r.dns)+2*len(r.kube)) // the prober, the peers, the file, the pool, the names, the watches, the cost writers: none may block
	wg.Go(func() { errc <- r.prober.Run(ctx) })
	wg.Go(func() { errc <- r.runInferencePool(ctx) })
	wg.Go(func() { errc <- wrapErr("peers", r.peers.run(ctx, r.KubeClient)) })
	if src := discovery.FromConfig(r.Config(), r.logger); src != nil {
		src.OnError = func(error) { r.metrics.DiscoveryErrors.WithLabelValues(r.sourceName(0)).Inc() }
		wg.Go(func() {
			errc <- src.Run(ctx, func(specs []endpoint.Spec) error { return r.setDiscovered(0, specs) })
		})
	}
	for i, d := range r.dns {
		r.mu.Lock()
		last := r.discovered[1+i]
		r.mu.Unlock()
		wg.Go(func() {
			errc <- d.Run(ctx, last, func(specs []endpoint.Spec) error { return r.setDiscovered(1+i, specs) })
		})
	}
	for i, k := range r.kube {
		j := 1 + len(r.dns) + i
		k.OnError = func(error) { r.metrics.DiscoveryErrors.WithLabelValues(r.sourceName(j)).Inc() }
		if r.KubeClient != nil {
			k.Client = r.KubeClient
		}
		wg.Go(func() { errc <- k.Run(ctx, func(specs []endpoint.Spec) error { return r.setDiscovered(j, specs) }) })
	}
	r.runDeletionCost(ctx, &wg, errc)
	go func() { wg.Wait(); close(errc) }()
	var errs []error
	for err := range errc {
		if err != nil && !errors.Is(err, context.Canceled) {
			errs = append(errs, err)
			stop()
		}
	}
	return errors.Join(errs...)
}

// wrapErr names the part of the router that err stopped (nil and cancellation as they are).
func wrapErr(what string, err error) error {
	if err == nil || errors.Is(err, context.Canceled) {
		return err
	}
	return fmt.Errorf("%s: %w", what, err)
}

// setDiscovered applies a new set from discovery source i (0: the file, then each DNS name);
// a set the pool rejects keeps the endpoints in force (the source logs the error).
func (r *Router) setDiscovered(i int, specs []endpoint.Spec) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	old := r.discovered[i]
	r.discovered[i] = specs
	removed, err := r.updatePoolLocked(discovery.Specs(r.cfg.Endpoints))
	if err != nil {
		r.discovered[i] = old
		return err
	}
	if h := r.h.Load(); h != nil { // apply stores one before any source runs
		for _, ep := range removed {
			h.Lifecycle.Removed(ep)
		}
	}
	r.metrics.DiscoveredEndpoints.WithLabelValues(r.sourceName(i)).Set(float64(len(specs)))
	return nil
}

// sourceName labels discovery source i in metrics: "file", "dns:" and the name, or
// "kubernetes:" and the namespace and the service or selector.
func (r *Router) sourceName(i int) string {
	switch {
	case i == 0:
		return "file"
	case i <= len(r.dns):
		return "dns:" + r.dns[i-1].Config.Name
	case i > len(r.dns)+len(r.kube):
		return r.infpool.Key()
	}
	return r.kube[i-1-len(r.dns)].Key()
}

// AdminHandler serves /metrics, /healthz (the process is up), /readyz (some endpoint can take
// requests: Router.ready), /debug/endpoints (JSON: each endpoint's health, load, snapshot and age),
// /debug/explain (POST an API request: how the endpoints would be ranked for it, and why),
// /debug/loglevel (GET the log level in force, PUT another: serveLogLevel), /debug/peers with
// peers and, when the config says pprof: true at start, /debug/pprof/; / and /debug/ list them
// (adminIndex).
func (r *Router) AdminHandler() http.Handler {
	mux := http.NewServeMux()
	index := r.adminIndex()
	mux.HandleFunc("GET /{$}", index)
	mux.HandleFunc("GET /debug/{$}", index)
	mux.Handle("GET /metrics", promhttp.HandlerFor(r.reg, promhttp.HandlerOpts{Registry: r.reg}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !r.readyAsked.Load() {
			r.readyAsked.Store(true)
		}
		if r.draining.Load() {
			http.Error(w, "draining: the router is shutting down", http.StatusServiceUnavailable)
			return
		}
		if !r.peers.ready() {
			http.Error(w, "warming up: taking a peer's snapshot", http.StatusServiceUnavailable)
			return
		}
		if msg, ok := r.ready(time.Now()); !ok {
			http.Error(w, msg, http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	mux.HandleFunc("GET /debug/endpoints", r.serveEndpoints)
	mux.HandleFunc("GET /debug/loglevel", r.serveLogLevel)
	mux.HandleFunc("PUT /debug/loglevel", r.serveLogLevel)
	mux.HandleFunc("POST /debug/explain", func(w http.ResponseWriter, req *http.Request) {
		r.h.Load().ServeExplain(w, req)
	})
	r.peers.admin(mux)
	if cfg := r.Config(); cfg != nil && cfg.Pprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	return mux
}

// ready reports whether a request could be routed at now, for /readyz, and else why not: some
// endpoint passes its health checks, is not draining, and is not ejected by passive health
// checking (which would leave the router nothing to answer with but 503s, while a load balancer
// kept sending it traffic that other replicas could serve).
//
// Ejections are not taken at once for a reason to leave the load balancer's rotation: when the
// first ejection of the endpoints that pass their checks ends within readyGrace, the router stays
// ready, as a balancer probing every few seconds (the chart's readinessProbe: every 5 s, out after
// 2 failures) would take it out about when it could serve again, and take it back one probe
// later: a flap that costs more than the short outage. A longer one is said (r.unready); and
// once said, it lasts until an endpoint can take a request again, not readyGrace before, which
// would bring traffic back ahead of the engines.
func (r *Router) ready(now time.Time) (msg string, ok bool) {
	var back time.Time // the first end of an ejection of an available endpoint
	avail := 0
	for _, e := range r.pool.All() {
		if !e.Available() {
			continue
		}
		avail++
		until := r.outlier.EjectedUntil(e)
		if !until.After(now) {
			r.unready.Store(false)
			return "", true
		}
		if back.IsZero() || until.Before(back) {
			back = until
		}
	}
	if avail == 0 {
		return "no available endpoint", false
	}
	wait := back.Sub(now)
	if !r.unready.Load() && wait <= readyGrace {
		return "", true
	}
	r.unready.Store(true)
	return fmt.Sprintf("no endpoint can take a request: every endpoint that passes its health checks (%d) is ejected by passive health checking (health.passive_failures); the first is back in %s",
		avail, wait.Round(time.Second)), false
}

// readyGrace is how soon the first ejected endpoint must be back for a router whose every
// available endpoint is ejected to stay ready (Router.ready).
const readyGrace = 10 * time.Second

// adminIndex answers / and /debug/ on the admin listener: a page of plain text that lists what
// the listener serves, for whoever opens its address in a browser or with curl.
func (r *Router) adminIndex() http.HandlerFunc {
	cfg := r.Config()
	lines := [][2]string{
		{"GET  /metrics", "Prometheus metrics (docs/router.md lists them)"},
		{"GET  /healthz", "200 while the process is up"},
		{"GET  /readyz", "200 while some endpoint can take requests: healthy and not ejected (and, with peers, after the warm start); 503 once shutting down"},
		{"GET  /debug/endpoints", "each endpoint's health, availability, load, scraped metrics and probe, as JSON"},
		{"POST /debug/explain", "an API request's body (as to /v1/chat/completions): how the endpoints would be ranked for it, and why"},
		{"GET  /debug/loglevel", "the log level in force"},
		{"PUT  /debug/loglevel", "a body of debug, info, warn or error: the log level until the next config reload that applies, or a restart (log.level then)"},
	}
	if r.peers != nil {
		lines = append(lines, [2]string{"GET  /debug/peers", "the peer replicas and what they share, as JSON"})
	}
	if cfg != nil && cfg.Pprof {
		lines = append(lines, [2]string{"GET  /debug/pprof/", "Go's profiles"})
	}
	var b strings.Builder
	b.WriteString("kvroute admin listener\n\n")
	for _, l := range lines {
		fmt.Fprintf(&b, "%-22s %s\n", l[0], l[1])
	}
	if cfg != nil {
		fmt.Fprintf(&b, "\nThe OpenAI API (/v1/chat/completions, /v1/completions, /v1/embeddings, /v1/responses, /v1/models) is served on the API listener, %s.\n", cfg.Listen)
	}
	page := []byte(b.String())
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write(page)
	}
}

// checkFailure is how ep's last health check failed (proxy.Handler.CheckFailure); failed
// false when it passed or none was made.
func (r *Router) checkFailure(ep *endpoint.Endpoint) (scrape.CheckFailure, bool) {
	v, ok := r.checkFailed.Load(ep)
	if !ok {
		return scrape.CheckFailure{}, false
	}
	return v.(scrape.CheckFailure), true
}

// EndpointInfo is one entry of /debug/endpoints.
type EndpointInfo struct {
	ID   int    `json:"id"`
	Name string `json:"name"`
	// Engine is the configured engine kind (endpoints[].engine), EngineKind the kind in force:
	// for auto, the one detected on first contact ("auto" until then).
	Engine     string `json:"engine"`
	EngineKind string `json:"engine_kind"`
	// Models is the configured models (endpoints[].models). ServedModels is, for an endpoint
	// without them, the models its engine lists (GET /v1/models): those it is routed and its
	// load is exported for (kvroute_model_load); absent until its engine has listed some.
	Models         []string           `json:"models"`
	ServedModels   []string           `json:"served_models,omitempty"`
	Labels         map[string]string  `json:"labels,omitempty"`
	Healthy        bool               `json:"healthy"`
	Available      bool               `json:"available"`
	InFlight       int                `json:"in_flight"`
	PendingPrefill int                `json:"pending_prefill_tokens"`
	KVTokens       int                `json:"kv_capacity_tokens"`
	Snapshot       *endpoint.Snapshot `json:"snapshot"`
	SnapshotAgeSec *float64           `json:"snapshot_age_seconds"`
	// LastAnswerAgeSec is how long ago the engine last answered anything: a first token, a
	// stream's event or a complete answer seen by this router or a peer, or more work in its
	// scraped counters (limits.stall_timeout); absent when it never has.
	LastAnswerAgeSec *float64 `json:"last_answer_age_seconds,omitempty"`
	// StalledSince, when set, is when the engine last answered before a stall watch found it
	// stalled (limits.stall_timeout); it goes after the others until it answers again, but
	// for a request every 30 s that finds out whether it does.
	StalledSince *time.Time    `json:"stalled_since,omitempty"`
	Probe        scrape.Status `json:"probe"`
	// EjectedUntil is when a passive ejection ends; absent when the endpoint is not ejected.
	EjectedUntil *time.Time `json:"ejected_until,omitempty"`
	// Failures are the consecutive failures that count towards ejecting the endpoint
	// (health.passive_failures): here, and the fleet's, those of the engine's own doing here
	// and at peer replicas, with no success at either between; both 0 after a success.
	Failures struct {
		Here  int `json:"here"`
		Fleet int `json:"fleet"`
	} `json:"consecutive_failures"`
	// CacheAudit compares the engine's reported cached tokens with the router's predictions.
	CacheAudit route.AuditStatus `json:"cache_audit"`
	// TokenScale is how many of the engine's tokens one token of the router's estimate is.
	TokenScale float64 `json:"token_scale"`
	// LearnedKVTokens is the KV capacity (engine tokens) the policy learned from the endpoint's
	// hits and misses, where none is configured or scraped; absent while none is learned.
	LearnedKVTokens int `json:"learned_kv_capacity_tokens,omitempty"`
	// CacheValueTokens is kvroute_endpoint_cache_value_tokens; absent when the policy cannot
	// tell it.
	CacheValueTokens *float64 `json:"cache_value_tokens,omitempty"`
	// StepTokens is the step budget under chunked prefill the policy follows the endpoint's
	// queue by, in the engine's tokens (0: the policy's step_tokens is 0, the term is off), and
	// StepSource where it comes from: configured (endpoints[].step_tokens), reported (by the
	// engine: probe.step_report), engine default, or policy (its step_tokens). Both absent
	// when the policy follows no steps.
	StepTokens *int   `json:"step_tokens,omitempty"`
	StepSource string `json:"step_tokens_source,omitempty"`
}

// Endpoints describes every endpoint of the pool, for /debug/endpoints.
func (r *Router) Endpoints() []EndpointInfo {
	now := time.Now()
	var out []EndpointInfo
	for _, e := range r.pool.All() {
		info := EndpointInfo{
			ID: e.ID, Name: e.Name, Engine: e.Engine, EngineKind: e.Kind(), Models: e.Models, Labels: maps.Clone(e.Labels),
			Healthy: e.Healthy(), Available: e.Available(), InFlight: e.InFlight(),
			PendingPrefill: e.PendingPrefill(), KVTokens: e.KVTokens(), Snapshot: e.Snapshot(),
			Probe: r.prober.Status(e),
		}
		if info.Models == nil {
			info.Models = []string{}
		}
		if len(e.Models) == 0 {
			info.ServedModels = e.ServedModels()
		}
		info.CacheAudit = r.audit.Status(e)
		info.TokenScale = e.TokenScale()
		info.LearnedKVTokens = r.learnedKVTokens(e)
		if v, ok := r.cacheValue(e); ok {
			info.CacheValueTokens = &v
		}
		if n, src, ok := r.stepTokens(e); ok {
			info.StepTokens, info.StepSource = &n, src
		}
		info.Failures.Here, info.Failures.Fleet = r.outlier.Failures(e)
		if until := r.outlier.EjectedUntil(e); until.After(now) {
			info.EjectedUntil = &until
			info.Available = false
		}
		if s := info.Snapshot; s != nil && !s.At.IsZero() {
			age := now.Sub(s.At).Seconds()
			info.SnapshotAgeSec = &age
		}
		if at := e.LastProgress(); at > 0 {
			age := now.Sub(time.Unix(0, at)).Seconds()
			info.LastAnswerAgeSec = &age
		}
		if from := e.StalledSince(); from > 0 {
			at := time.Unix(0, from).UTC()
			info.StalledSince = &at
		}
		out = append(out, info)
	}
	return out
}

func (r *Router) serveEndpoints(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(struct {
		Endpoints []EndpointInfo `json:"endpoints"`
	}{r.Endpoints()})
}

// Serve runs the router on the given listeners until ctx ends, then shuts down in the order a
// load balancer can follow:
//
//  1. /readyz answers 503 ("draining") at once, and every answer from then on closes its
//     connection (Connection: close), so that clients reconnect through their balancer;
//  2. the API listener keeps taking new requests for server.drain_delay, while balancers that
//     follow /readyz take the router out (only when /readyz has been asked since the start:
//     otherwise nobody follows it, and this step is skipped);
//  3. the listener closes and the requests in flight (streams included) get
//     server.shutdown_timeout to end; a request that arrives on a connection still open is
//     answered (Connection: close), the next one on the connection of an answer begun before
//     the signal too, within half a second of that answer's end (the servers' Shutdown);
//  4. those still in flight then are cut (proxy.ErrShuttingDown): one whose answer has not
//     begun gets a 503 shutting_down, a stream an SSE error event of that code; they are
//     logged as 503, and a warning says how many and which setting to raise. Connections still
//     open a second later are closed;
//  5. once Beside has drained as well, discovery, health checks, scraping and peers stop
//     (leaving the peers takes milliseconds, a second at most for a peer that does not
//     answer) while the admin listener closes, both within
//     stopWait; "stopped" then says how long the whole shutdown took.
//
// It returns nil after a clean drain (cut requests included).
func (r *Router) Serve(ctx context.Context, api, admin net.Listener) error {
	cfg := r.Config()
	mk := func(h http.Handler) *http.Server {
		return &http.Server{
			Handler:           h,
			ReadHeaderTimeout: cfg.Server.ReadHeaderTimeout.D(),
			IdleTimeout:       cfg.Server.IdleTimeout.D(),
			WriteTimeout:      cfg.Server.WriteTimeout.D(),
			ErrorLog:          slog.NewLogLogger(r.logger.Handler(), slog.LevelDebug),
		}
	}
	builtin := cfg.Server.HTTPServer != config.HTTPServerNetHTTP
	if t := cfg.Server.TLS; t.Enabled() {
		certs, err := newCertFiles(cfg.Path(t.CertFile), cfg.Path(t.KeyFile), certCheckEvery, r.logger)
		if err != nil {
			return err
		}
		api = tls.NewListener(h1.AbortStalled(api), tlsConfig(certs, !builtin))
	}
	lim := resolveLimits(cfg, openFileLimit(), goMemoryLimit())
	drain := proxy.NewDrain()
	handler := drain.Wrap(r.Handler())
	// A request answered 401 closes its connection (CloseUnauthorized): a client without a key
	// holds no idle connection for server.idle_timeout.
	netSrv := mk(handler)
	netSrv.BaseContext = drain.BaseContext // Cut ends the requests: no context of their own
	var apiSrv server = &h1.NetHTTP{Server: netSrv, BodyReadTimeout: cfg.Server.BodyReadTimeout.D(),
		BodyMinRate: cfg.Server.BodyMinRate, BodyStallTimeout: lim.bodyStall, MaxPendingBodyBytes: lim.pending,
		WriteStallTimeout: cfg.Server.WriteStallTimeout.D(), MaxConns: lim.maxConns, MaxLingering: lim.lingering,
		CloseUnauthorized: true, ErrorBody: apiErrorBody, Logger: r.logger}
	if builtin {
		apiSrv = &h1.Server{
			Handler:             handler,
			BaseContext:         drain.BaseContext,
			ReadHeaderTimeout:   cfg.Server.ReadHeaderTimeout.D(),
			IdleTimeout:         cfg.Server.IdleTimeout.D(),
			WriteTimeout:        cfg.Server.WriteTimeout.D(),
			BodyReadTimeout:     cfg.Server.BodyReadTimeout.D(),
			BodyMinRate:         cfg.Server.BodyMinRate,
			BodyStallTimeout:    lim.bodyStall,
			MaxPendingBodyBytes: lim.pending,
			WriteStallTimeout:   cfg.Server.WriteStallTimeout.D(),
			MaxConns:            lim.maxConns,
			MaxLingering:        lim.lingering,
			CloseUnauthorized:   true,
			// Only accept errors and handler panics come here: worth an error line.
			ErrorLog:  slog.NewLogLogger(r.logger.Handler(), slog.LevelError),
			ErrorBody: apiErrorBody,
			Logger:    r.logger,
		}
	}
	r.logger.Info("API server limits", "max_connections", lim.maxConns, "max_connections_from", lim.connsFrom,
		"max_pending_body_bytes", lim.pending, "body_stall_timeout", lim.bodyStall.String(), "admin_max_connections", lim.adminConns,
		"max_lingering_refusals", h1.MaxLingering(lim.maxConns, lim.lingering),
		"admin_max_lingering_refusals", h1.MaxLingering(lim.adminConns, lim.adminLingering))
	stats := newServerCollector(apiSrv.Stats, lim)
	if err := r.reg.Register(stats); err != nil {
		r.logger.Warn("the API server's connection and body metrics are not exported", "err", err)
	} else {
		defer r.reg.Unregister(stats)
	}
	// The admin listener has a cap of its own, as the API listener's (server.max_connections)
	// does not count it: a flood of admin connections takes none of the API's, nor the open
	// files kept aside for it, and a new scrape or probe closes an idle connection for room.
	adminSrv := &h1.NetHTTP{Server: mk(r.AdminHandler()), MaxConns: lim.adminConns, MaxLingering: lim.adminLingering, Logger: r.logger}
	adminStats := newAdminCollector(adminSrv.Stats, lim.adminConns)
	if err := r.reg.Register(adminStats); err != nil {
		r.logger.Warn("the admin server's connection metrics are not exported", "err", err)
	} else {
		defer r.reg.Unregister(adminStats)
	}
	runCtx, stopRun := context.WithCancel(context.WithoutCancel(ctx))
	defer stopRun()
	besideCtx, stopBeside := context.WithCancel(context.WithoutCancel(ctx))
	defer stopBeside()
	// Each sender sends at most once, into room kept for it: a late one never blocks, and the
	// channel is never closed (Run may end after Serve, past stopWait).
	errc := make(chan error, 4) // the API server, the admin server, Run, Beside
	var wg sync.WaitGroup
	runDone := make(chan struct{})
	go func() {
		defer close(runDone)
		if err := r.Run(runCtx); err != nil && runCtx.Err() == nil {
			r.logger.Error("endpoint discovery, probing or peers stopped: shutting down", "err", err)
			errc <- err
		} else if err != nil {
			r.logger.Error("endpoint discovery, probing or peers stopped", "err", err)
		}
	}()
	besideDone := make(chan struct{})
	var besideErr error // Beside's error once the shutdown began; read after besideDone
	if r.Beside != nil {
		go func() {
			defer close(besideDone)
			if err := r.Beside(besideCtx); err != nil && besideCtx.Err() == nil {
				errc <- err
			} else {
				besideErr = err
			}
		}()
	} else {
		close(besideDone)
	}
	wg.Go(func() { errc <- ignoreClosed(apiSrv.Serve(api)) })
	if admin != nil {
		wg.Go(func() { errc <- ignoreClosed(adminSrv.Serve(admin)) })
	}
	var first error
	select {
	case <-ctx.Done():
	case first = <-errc:
	}
	start := time.Now()
	r.draining.Store(true)
	apiSrv.SetKeepAlivesEnabled(false) // every answer from now on closes its connection
	stopBeside()
	if first == nil {
		first = r.drainDelay(cfg.Server.Drain(), errc)
	}
	r.drainAPI(apiSrv, drain, cfg.Server.ShutdownTimeout.D())
	select {
	case <-besideDone:
	default:
		// Its drain delay may run longer than the API's (which had none: /readyz unasked), or
		// its streams: the endpoints stay followed until it ends.
		r.logger.Info("shutting down: requests drained; waiting for the ext_proc endpoint picker's drain")
		<-besideDone
	}
	r.stop(start, stopRun, runDone, adminSrv)
	wg.Wait()
	for pending := true; pending; {
		select {
		case err := <-errc:
			if first == nil && err != nil && !errors.Is(err, context.Canceled) {
				first = err
			}
		default:
			pending = false
		}
	}
	if first == nil && besideErr != nil && !errors.Is(besideErr, context.Canceled) {
		first = besideErr
	}
	r.Close()
	r.logger.Info("stopped", "took", time.Since(start).Round(time.Millisecond).String())
	return first
}

// stopWait bounds the last step of Serve's shutdown, after the drains: discovery, health
// checks, scraping and peers stopping (the peers' leave hands this replica's state, marked
// left, to each live peer: milliseconds, at most a second for one that does not answer), and
// the admin listener closing (up to a second for answers in progress), side by side. With the
// second the cut requests get (cutGrace), that is the 3 s the Helm chart adds to a pod's
// shutdown beyond drain_delay and shutdown_timeout.
const stopWait = 2 * time.Second

// stop is Serve's last step, from start (when the shutdown began): it stops Run (stopRun; done
// closes when it has returned) and closes the admin listener, and waits at most
// r.stopWaitOr() for Run: a part that takes longer goes on stopping unwaited for, said in a
// warning, and its end is logged if the process lives to see it.
func (r *Router) stop(start time.Time, stopRun context.CancelFunc, done <-chan struct{}, admin *h1.NetHTTP) {
	r.logger.Info("shutting down: stopping discovery, health checks, scrapes and peers", "elapsed", time.Since(start).Round(time.Millisecond).String())
	began := time.Now()
	bound := r.stopWaitOr()
	deadline := time.NewTimer(bound)
	defer deadline.Stop()
	stopRun()
	actx, cancel := context.WithTimeout(context.Background(), min(time.Second, bound)) // admin answers are short
	defer cancel()
	_ = admin.Shutdown(actx)
	_ = admin.Close()
	select {
	case <-done:
	case <-deadline.C:
		r.logger.Warn("shutting down: discovery, health checks, scrapes or peers did not stop in time: not waiting for them",
			"waited", bound.String())
		go func() {
			<-done
			r.logger.Info("discovery, health checks, scrapes and peers stopped, late", "after", time.Since(began).Round(time.Millisecond).String())
		}()
	}
}

// stopWaitOr is stopWait, or the one a test set.
func (r *Router) stopWaitOr() time.Duration {
	if r.stopWait > 0 {
		return r.stopWait
	}
	return stopWait
}

// drainDelay is Serve's wait between the signal and the closing of the API listener (d,
// server.drain_delay), while /readyz says 503 and new requests are still served: skipped when
// /readyz was never asked. It ends early with the error of a server or of Run that stops
// meanwhile (returned), which leaves nothing to wait for.
func (r *Router) drainDelay(d time.Duration, errc <-chan error) error {
	switch {
	case d <= 0:
		return nil
	case !r.readyAsked.Load():
		r.logger.Info("shutting down: no drain delay, as /readyz was never asked (nothing follows it)", "drain_delay", d.String())
		return nil
	}
	r.logger.Info("shutting down: /readyz answers 503 (draining); new requests are still taken for server.drain_delay, while load balancers take the router out", "drain_delay", d.String())
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case err := <-errc:
		return err
	}
}

// cutGrace is how long the requests cut at the end of a drain get to send their last words
// (a 503, a stream's error event) before their connections are closed.
const cutGrace = time.Second

// drainAPI closes the API listener and gives the requests in flight timeout to end; then it
// cuts those still in flight (drain.Cut: each is told, and logged as 503 shutting_down), says
// so, and closes the connections still open cutGrace later. The servers' Shutdown (h1's
// Server and NetHTTP, never net/http's own, which drops a request it reads once it has
// begun) answers a request arriving on an open connection meanwhile, and keeps the
// connection of an answer begun before the signal open for half a second after it, for a
// next request sent at once: within timeout + cutGrace, as the context bounds it.
func (r *Router) drainAPI(srv server, drain *proxy.Drain, timeout time.Duration) {
	r.logger.Info("shutting down: draining requests in flight", "timeout", timeout.String(), "in_flight", drain.InFlight())
	sctx, cancel := context.WithTimeout(context.Background(), timeout+cutGrace)
	defer cancel()
	drained := make(chan error, 1)
	go func() { drained <- srv.Shutdown(sctx) }()
	t := time.NewTimer(timeout)
	defer t.Stop()
	var err error
	select {
	case err = <-drained:
	case <-t.C:
		if n := drain.Cut(); n > 0 {
			r.logger.Warn("drain timed out: requests still in flight were cut, each answered 503 shutting_down (a stream with an SSE error event); raise server.shutdown_timeout (and the pod's terminationGracePeriodSeconds) to let them finish",
				"cut", n, "shutdown_timeout", timeout.String())
		}
		err = <-drained
	}
	if err != nil {
		r.logger.Warn("drain timed out: closing the connections still open", "err", err)
		_ = srv.Close()
	}
}

// server is what serves the API listener: h1's Server or NetHTTP.
type server interface {
	Serve(net.Listener) error
	Shutdown(context.Context) error
	Close() error
	SetKeepAlivesEnabled(bool)
	Stats() h1.Stats
}

func ignoreClosed(err error) error {
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// apiErrorBody is the body of an answer the API server makes itself, before any handler (a
// connection refused at server.max_connections, a head it cannot read): an OpenAI error with
// the type and code that the proxy gives its own answers of that status, so that a client
// tells an overload it may retry from a request of its own at fault.
func apiErrorBody(status int, msg string) (contentType string, body []byte) {
	typ, code := openai.TypeInvalidRequest, ""
	switch {
	case status == http.StatusServiceUnavailable:
		typ, code = openai.TypeUnavailable, "overloaded" // as the proxy's admission and body pool
	case status == http.StatusTooManyRequests:
		typ, code = "rate_limit_error", "rate_limited" // as the proxy's admission
	case status == http.StatusRequestEntityTooLarge, status == http.StatusRequestHeaderFieldsTooLarge:
		code = "request_too_large"
	case status == http.StatusRequestTimeout:
		code = "request_timeout"
	case status >= 500:
		typ = openai.TypeServer
	}
	return "application/json", openai.NewError(status, typ, "", code, msg).Body()
}

// outlierConfig is passive ejection as the config sets it, reporting to the metrics and the log.
func (r *Router) outlierConfig(cfg *config.Config) route.OutlierConfig {
	return route.OutlierConfig{
		Consecutive:       cfg.Health.PassiveFailures,
		BaseEjection:      cfg.Health.EjectionTime.D(),
		MaxEjection:       cfg.Health.MaxEjectionTime.D(),
		MaxEjectedPercent: cfg.Health.MaxEjectedPercent,
		RefusalPercent:    cfg.Health.RefusalPercent,
		RefusalVolume:     cfg.Health.RefusalVolume,
		RefusalWindow:     cfg.Health.RefusalWindow.D(),
		// The fleet an ejection must leave standing is the endpoints that can take requests:
		// counted over every endpoint, one failing its health checks made room for the last
		// endpoint standing to be ejected, and every request then got a 503.
		Fleet: func() int {
			n := 0
			for _, e := range r.pool.All() {
				if e.Available() {
					n++
				}
			}
			return n
		},
		OnEject: func(ep *endpoint.Endpoint, d time.Duration, byFleet bool) {
			if byFleet {
				r.metrics.EndpointEjected(ep.Name, metrics.EjectPeerFailures, d)
				r.logger.Warn("endpoint ejected after consecutive failures, here and at peer replicas", "endpoint", ep.Name, "for", d.String())
				return
			}
			r.metrics.EndpointEjected(ep.Name, metrics.EjectFailures, d)
			r.logger.Warn("endpoint ejected after consecutive failures", "endpoint", ep.Name, "for", d.String())
		},
		OnRefusals: func(ep *endpoint.Endpoint, d time.Duration, refused, fleetRefused float64) {
			r.metrics.EndpointEjected(ep.Name, metrics.EjectRefusals, d)
			r.logger.Warn("endpoint ejected: it refuses far more of its requests than the rest of the fleet (a 4xx: a missing chat template, a shorter max_model_len, another model mounted?)",
				"endpoint", ep.Name, "for", d.String(), "refused", math.Round(refused*1000)/1000, "fleet_refused", math.Round(fleetRefused*1000)/1000)
		},
		OnReadmit: func(ep *endpoint.Endpoint, byCheck bool) {
			r.metrics.EndpointReadmitted(ep.Name)
			if byCheck {
				r.logger.Info("endpoint back from ejection: its health check passed", "endpoint", ep.Name)
				return
			}
			r.logger.Info("endpoint back from ejection", "endpoint", ep.Name)
		},
	}
}

// Close releases idle upstream connections. Call it after Run and the servers have stopped.
func (r *Router) Close() { r.transport.CloseIdleConnections() }

// stallTimeout is limits.stall_timeout for route.Config: 0 (not watched) when it is not
// shorter than limits.first_token_timeout.
func stallTimeout(l config.Limits) time.Duration {
	if l.StallTimeout >= l.FirstTokenTimeout {
		return 0
	}
	return l.StallTimeout.D()
}

// proberClient is the HTTP client of the engines' health checks, metrics and model lists: it
// follows no redirect, so that an engine (or whoever answers at a discovered address) cannot
// make the router fetch another URL, an internal one say, and show the start of its answer in
// /debug/endpoints; a 3xx is a failed check or scrape, saying its status.
func proberClient(rt http.RoundTripper) *http.Client {
	return &http.Client{Transport: rt, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}
