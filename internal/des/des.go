package des

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/policy"
	"github.com/kvroute/kvroute/internal/report"
	"github.com/kvroute/kvroute/internal/route"
	"github.com/kvroute/kvroute/internal/workload"
)

// DefaultScrapeInterval is how often the simulated router refreshes its engine-metric
// snapshots unless told otherwise.
const DefaultScrapeInterval = 200 * time.Millisecond

// Engine is the part of the engine model the simulator drives (*engine.Engine implements it).
type Engine interface {
	// Submit queues a request arriving at now.
	Submit(now time.Duration, r engine.Request) error
	// Step runs one batch step starting at now; its events happen at end. ok is false when
	// the engine had nothing to do.
	Step(now time.Duration) (end time.Duration, events []engine.Event, ok bool)
	// Stats returns the engine's counters. It must change nothing: the simulator leaves out
	// the scrapes between two events, which would read the same counters (sim.idleTicks).
	Stats() engine.Stats
}

// Config describes the fleet.
type Config struct {
	// Instances is the number of engines (at least 1).
	Instances int
	// Model is the model name the requests ask for; it seeds the policy's block hashes.
	Model string
	// BlockSize is the engines' KV block size in tokens (at least 1).
	BlockSize int
	// KVCapacityTokens is each engine's KV capacity, as the router is configured with it.
	KVCapacityTokens int
	// Opaque engines tell the router neither their cached tokens nor their KV capacity (as
	// ollama): responses report no cached tokens and scrapes no cache_config_info. Records keep
	// what the engines did.
	Opaque bool
	// NoAudit runs the routers without the cache audit (route.Audit), which the live router
	// always runs: to measure what it is worth against a Blind instance.
	NoAudit bool
	// NewEngine builds engine i (0..Instances-1).
	NewEngine func(i int) (Engine, error)
	// ScrapeInterval is how often endpoint snapshots are refreshed from engine stats
	// (0: DefaultScrapeInterval).
	ScrapeInterval time.Duration
	// NetworkLatency is the one-way delay between router and engine (0 by default): a request
	// reaches its engine this long after it was routed, and the router hears of its first token
	// and its end this long after they happen.
	NetworkLatency time.Duration
	// Seed seeds the policy's random source.
	Seed uint64
	// Routers is the number of router replicas (0 or 1: one router). Each replica has its own
	// policy instance, built by the same NewPicker, and its own Endpoint objects, so the load
	// counters a policy reads (in flight, pending prefill) and everything it learns cover only
	// the requests that replica routed, as with replicas behind a load balancer. The engines'
	// scraped snapshots are the same for all: every replica scrapes the same engines.
	Routers int
	// Spread is how requests are assigned to router replicas when Routers > 1.
	Spread Spread
	// Attempts is how many endpoints one request may be sent to, as limits.max_retries + 1
	// configures the live router (0: 3, its default).
	Attempts int
	// WarmUp is the lifecycle's warm-up of an instance added during the run (route.Config.
	// WarmUp); 0: route.DefaultWarmUp, as the live router; negative: none.
	WarmUp time.Duration
	// Changes kill or add instances during the run, or make them fail (faults.go). An
	// instance that some Change adds is absent until then; a killed one stops at once: the
	// router hears of it one network latency later: the streams whose first token it had
	// relayed fail as cut, the other requests it held lost their connection before any byte
	// (route.FailLost) and go on to the next ranked endpoint once per request, as live; and
	// requests sent to it afterwards meet a refused connection and fall back to the next
	// ranked endpoint until passive ejection takes it out of the candidates.
	Changes []Change
	// FirstTokenTimeout bounds each attempt's wait for its first token, from its sending, as
	// limits.first_token_timeout does live: past it the attempt fails as a timeout (the engine
	// aborts the request) and the request goes on to the next ranked endpoint. 0:
	// DefaultFirstTokenTimeout; negative: none.
	FirstTokenTimeout time.Duration
	// StallTimeout is limits.stall_timeout: an attempt that waited this long for its first
	// token (or MaxSlowdown times its predicted TTFT, if longer) while its instance answered
	// nothing fails over as a timeout, where the policy predicts TTFTs and another endpoint is
	// left (route.Call.Stall). 0: DefaultStallTimeout; negative: none.
	StallTimeout time.Duration
	// StreamIdleTimeout bounds the silence of a stream after its first token
	// (limits.stream_idle_timeout): a hung instance's streams fail as cut past it. 0:
	// DefaultStreamIdleTimeout; negative: none.
	StreamIdleTimeout time.Duration
	// Outlier is passive ejection, as the health section configures it live; zero fields take
	// the live defaults (Consecutive: DefaultPassiveFailures). Fleet is set by Run.
	Outlier route.OutlierConfig
	// ReplicaSync shares each replica's lifecycle events with the others (sync.go); the zero
	// value shares nothing.
	ReplicaSync ReplicaSync
	// Autoscale, when set, grows the fleet during the run as a controller decides
	// (autoscale.go).
	Autoscale *Autoscale

	// everyTick has the run take every scrape, also through stretches where nothing happens
	// (sim.idleTicks): tests compare it with the skipping run.
	everyTick bool
}

// Change is an instance killed, added, failing or recovering at a moment of the run.
type Change struct {
	At       time.Duration
	Instance int
	Kind     ChangeKind
	// Tokens is, for Cut, how many tokens a stream gets before it is cut (at least 1).
	Tokens int
}

// ChangeKind says what a Change does.
type ChangeKind uint8

const (
	// Kill stops the instance: it holds nothing and accepts nothing from then on.
	Kill ChangeKind = iota
	// Add makes the instance part of the fleet (it is absent before).
	Add
	// Fail makes the instance answer every request it is sent with a 500 at once (faults.go):
	// the request goes on to the next ranked endpoint, once per request, as live.
	Fail
	// Hang makes the instance accept requests and answer nothing, its metrics still scraped.
	Hang
	// Cut makes the instance cut every stream after Change.Tokens tokens.
	Cut
	// Recover ends the instance's fault; a killed instance restarts, with an empty cache.
	Recover
	// Blind makes the instance find nothing cached for any prompt, as an engine with prefix
	// caching off or a cache salt, tokenizer or block size other than the router's does: it
	// serves every request, and reports no cached tokens (a silent zero hit, faults.go).
	Blind
)

var changeNames = [...]string{Kill: "kill", Add: "add", Fail: "fail", Hang: "hang", Cut: "cut", Recover: "recover", Blind: "blind"}

// String returns the change's name, as ParseChange reads it.
func (k ChangeKind) String() string {
	if int(k) < len(changeNames) {
		return changeNames[k]
	}
	return "change(" + strconv.Itoa(int(k)) + ")"
}

// DefaultAttempts is how many endpoints a simulated request may be sent to: the live router's
// default (limits.max_retries 2, plus the first).
const DefaultAttempts = 3

// Spread is the rule by which the load balancer in front of the router replicas assigns a
// request to one of them.
type Spread uint8

const (
	// SpreadRoundRobin assigns requests to replicas in turn, in arrival order: what an L4 load
	// balancer does with one request per connection.
	SpreadRoundRobin Spread = iota
	// SpreadSession assigns a request by a hash of its session key, so a conversation keeps to
	// one replica; requests without a key go round-robin.
	SpreadSession
)

// String returns the spread's name, as ParseSpread reads it.
func (s Spread) String() string {
	switch s {
	case SpreadRoundRobin:
		return "round-robin"
	case SpreadSession:
		return "session"
	}
	return "spread(" + strconv.Itoa(int(s)) + ")"
}

// ParseSpread reads a spread's name: "round-robin" or "session".
func ParseSpread(name string) (Spread, error) {
	for _, s := range []Spread{SpreadRoundRobin, SpreadSession} {
		if name == s.String() {
			return s, nil
		}
	}
	return 0, fmt.Errorf("replica spread %q: want round-robin or session", name)
}

// Check returns every problem of the config, as Run would find them, without running it.
func (c *Config) Check() error { return c.check() }

func (c *Config) check() error {
	var errs []error
	if c.Instances < 1 {
		errs = append(errs, fmt.Errorf("instances: %d, want at least 1", c.Instances))
	}
	if c.BlockSize < 1 {
		errs = append(errs, fmt.Errorf("block size: %d, want at least 1", c.BlockSize))
	}
	if c.NewEngine == nil {
		errs = append(errs, errors.New("new engine: nil, want an engine constructor"))
	}
	if c.ScrapeInterval < 0 {
		errs = append(errs, fmt.Errorf("scrape interval: %v, want > 0 (or 0 for the default %v)", c.ScrapeInterval, DefaultScrapeInterval))
	}
	if c.NetworkLatency < 0 {
		errs = append(errs, fmt.Errorf("network latency: %v, want >= 0", c.NetworkLatency))
	}
	if c.Routers < 0 {
		errs = append(errs, fmt.Errorf("routers: %d, want at least 1 (or 0 for one)", c.Routers))
	}
	if c.Spread > SpreadSession {
		errs = append(errs, fmt.Errorf("spread: %v, want round-robin or session", c.Spread))
	}
	if c.Attempts < 0 {
		errs = append(errs, fmt.Errorf("attempts: %d, want at least 1 (or 0 for %d)", c.Attempts, DefaultAttempts))
	}
	if err := c.ReplicaSync.check(); err != nil {
		errs = append(errs, err)
	}
	added := map[int]bool{}
	for _, ch := range c.Changes {
		switch {
		case ch.Instance < 0 || ch.Instance >= c.Instances:
			errs = append(errs, fmt.Errorf("change %s at %v: instance %d, want 0..%d", ch.Kind, ch.At, ch.Instance, c.Instances-1))
		case ch.At < 0:
			errs = append(errs, fmt.Errorf("change %s of instance %d: at %v, want >= 0", ch.Kind, ch.Instance, ch.At))
		case ch.Kind > Blind:
			errs = append(errs, fmt.Errorf("change of instance %d: kind %d, want kill, add, fail, hang, cut, blind or recover", ch.Instance, ch.Kind))
		case ch.Kind == Cut && ch.Tokens < 1:
			errs = append(errs, fmt.Errorf("change cut of instance %d at %v: %d tokens, want at least 1", ch.Instance, ch.At, ch.Tokens))
		case ch.Kind == Add && added[ch.Instance]:
			errs = append(errs, fmt.Errorf("instance %d is added twice", ch.Instance))
		case ch.Kind == Add:
			added[ch.Instance] = true
		case ch.Kind == Recover && !c.faultBefore(ch.Instance, ch.At):
			errs = append(errs, fmt.Errorf("change recover of instance %d at %v: no kill, fail, hang, cut or blind of it by then to recover from", ch.Instance, ch.At))
		}
	}
	errs = append(errs, c.Autoscale.check(c)...)
	if len(added) == c.Instances && c.Instances > 0 {
		errs = append(errs, errors.New("changes: every instance is added later: at least one must be there from the start"))
	}
	return errors.Join(errs...)
}

// faultBefore reports whether some change kills instance inst or makes it fail, hang, cut
// streams or go blind at or before at.
func (c *Config) faultBefore(inst int, at time.Duration) bool {
	for _, ch := range c.Changes {
		if ch.Instance == inst && ch.At <= at && ch.Kind != Add && ch.Kind != Recover {
			return true
		}
	}
	return false
}

// Epoch is the wall-clock instant that virtual time 0 stands for, in snapshots and in the
// clock given to policies.
func Epoch() time.Time { return time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC) }

// Workload is a workload prepared for simulation: each request's engine block keys and the
// policy.Request a router would build for it, computed once and shared, read-only, by every
// run (runs may go on in parallel).
type Workload struct {
	reqs  []workload.Request
	keys  [][]uint64
	preqs []policy.Request
	order []int // request indices by arrival, ties by position
}

// Prepare builds the per-request data for model and an engine block size of blockSize tokens.
func Prepare(reqs []workload.Request, model string, blockSize int) *Workload {
	w := &Workload{
		reqs:  reqs,
		keys:  make([][]uint64, len(reqs)),
		preqs: make([]policy.Request, len(reqs)),
		order: make([]int, len(reqs)),
	}
	total := 0
	for i := range reqs {
		if blockSize > 0 {
			total += reqs[i].PromptTokens / blockSize
		}
	}
	// Two flat backing arrays instead of two slices per request.
	keyBuf := make([]uint64, 0, total)
	hashBuf := make([]uint64, 0, total)
	kb := route.Keys{BlockTokens: blockSize}
	for i := range reqs {
		r := &reqs[i]
		start := len(keyBuf)
		keyBuf = workload.Keys(keyBuf, r, blockSize)
		keys := keyBuf[start:len(keyBuf):len(keyBuf)]
		hashBuf = kb.FromContent(hashBuf, model, "", keys)
		w.keys[i] = keys
		w.preqs[i] = policy.Request{
			ID:           strconv.Itoa(i),
			Model:        model,
			SessionKey:   r.Session,
			Blocks:       hashBuf[start:len(hashBuf):len(hashBuf)],
			BlockTokens:  blockSize,
			PromptTokens: r.PromptTokens,
			MaxTokens:    r.OutputTokens,
			Whole:        r.Whole,
		}
		w.order[i] = i
	}
	slices.SortStableFunc(w.order, func(a, b int) int {
		return cmp.Compare(reqs[a].Arrival, reqs[b].Arrival)
	})
	return w
}

// Len is the number of requests.
func (w *Workload) Len() int { return len(w.reqs) }

// Result is the outcome of one run.
type Result struct {
	// Records holds one record per request, in the workload's order. Record.ID is the
	// request's index.
	Records []report.Record
	// Busy is each engine's total step time.
	Busy []time.Duration
	// Stats are the engines' final counters.
	Stats []engine.Stats
	// Events is the number of simulation events processed.
	Events int
	// Routed is, per router replica, the number of requests it was given (picked for).
	Routed []int
	// Scaled is the instances an autoscaler added (Config.Autoscale), in order.
	Scaled []Scaled
	// Stalls is the attempts given up as stalled (Config.StallTimeout).
	Stalls int
	// Audit is the cache audit's verdicts, in order: each time a router found an instance's
	// reported hits far below its predictions (blind), or agreeing again.
	Audit []AuditChange

	// skipped is the scrapes left out as changing nothing (sim.idleTicks); they count in
	// Events all the same.
	skipped int
}

// AuditChange is one verdict of a router's cache audit (route.AuditConfig.OnChange).
type AuditChange struct {
	At       time.Duration
	Router   int
	Instance int
	Blind    bool // found blind; false: agreeing again
}

// Preemptions sums the engines' preemption counts.
func (r *Result) Preemptions() int64 {
	var n int64
	for i := range r.Stats {
		n += r.Stats[i].Preemptions
	}
	return n
}

// NewPicker builds the policy under test with the environment the simulator gives it. With
// several router replicas it is called once per replica, in replica order.
type NewPicker func(env policy.Env) (policy.Picker, error)

// Named returns a NewPicker for a registered policy.
func Named(name string, p policy.Params) NewPicker {
	return func(env policy.Env) (policy.Picker, error) { return policy.New(name, p, env) }
}

// Run simulates the workload on the fleet with the policy that newPicker builds, labelling the
// records with policyName. It returns when every request has completed or failed, or with
// ctx's error when ctx is cancelled.
func Run(ctx context.Context, cfg Config, w *Workload, policyName string, newPicker NewPicker) (*Result, error) {
	if err := cfg.check(); err != nil {
		return nil, fmt.Errorf("fleet config: %w", err)
	}
	if cfg.ScrapeInterval == 0 {
		cfg.ScrapeInterval = DefaultScrapeInterval
	}
	if cfg.Attempts == 0 {
		cfg.Attempts = DefaultAttempts
	}
	s := &sim{cfg: cfg, w: w, policyName: policyName}
	s.clock.epoch = Epoch()
	s.routers = make([]router, max(cfg.Routers, 1))
	for k := range s.routers {
		// Replica 0's stream is the one a single router has always had; the others get
		// streams of their own.
		env := policy.Env{Rand: rand.New(rand.NewPCG(cfg.Seed, 0x6b76726f757465+uint64(k))), Clock: &s.clock}
		pk, err := newPicker(env)
		if err != nil {
			return nil, err
		}
		r := &s.routers[k]
		oc := cfg.Outlier
		oc.Fleet = s.fleetSize
		if oc.Consecutive == 0 {
			oc.Consecutive = DefaultPassiveFailures
		}
		health := route.NewOutlier(oc, &s.clock)
		warm := cfg.WarmUp
		if warm == 0 {
			warm = route.DefaultWarmUp
		}
		// The cache audit, as the live router runs it: an engine whose reported hits stay far
		// below the index's predictions is routed on load alone.
		var audit *route.Audit
		if !cfg.NoAudit {
			audit = route.NewAudit(route.AuditConfig{OnChange: func(ep *endpoint.Endpoint, blind bool, _, _ float64) {
				s.audit = append(s.audit, AuditChange{At: s.clock.now, Router: k, Instance: ep.ID, Blind: blind})
			}})
		}
		r.lc, err = route.New(route.Config{Picker: pk, Clock: &s.clock, Attempts: cfg.Attempts, Health: health, WarmUp: max(warm, 0),
			Share: s.share(k), Audit: audit, StallTimeout: cfg.stallTimeout()})
		if err != nil {
			return nil, err
		}
		r.deferrer, _ = pk.(policy.Deferrer)
		r.eps = make([]*endpoint.Endpoint, cfg.Instances)
		r.cands = make([]*endpoint.Endpoint, 0, cfg.Instances)
	}
	s.engines = make([]Engine, cfg.Instances)
	s.stepping = make([]bool, cfg.Instances)
	s.present = make([]bool, cfg.Instances)
	s.dead = make([]bool, cfg.Instances)
	s.held = make([]map[int32]struct{}, cfg.Instances)
	for i := range s.present {
		s.present[i] = true
	}
	for _, ch := range cfg.Changes {
		if ch.Kind == Add {
			s.present[ch.Instance] = false
		}
	}
	for i := range s.engines {
		e, err := cfg.NewEngine(i)
		if err != nil {
			return nil, fmt.Errorf("engine %d: %w", i, err)
		}
		s.engines[i] = e
		s.held[i] = map[int32]struct{}{}
		for k := range s.routers {
			s.routers[k].eps[i] = &endpoint.Endpoint{
				ID:               i,
				Name:             "sim-" + strconv.Itoa(i),
				Models:           []string{cfg.Model},
				Engine:           "vllm",
				KVCapacityTokens: cfg.KVCapacityTokens,
				StepTokens:       stepTokens(e),
			}
		}
	}
	s.initFaults()
	s.startAutoscale()
	if err := s.loop(ctx); err != nil {
		return nil, err
	}
	return s.result(), nil
}

// virtualClock is the policy's clock: Epoch plus the simulation's current time.
type virtualClock struct {
	epoch time.Time
	now   time.Duration
}

func (c *virtualClock) Now() time.Time { return c.epoch.Add(c.now) }

// Event kinds, in the order they are handled at the same instant: engines finish their steps
// and the router hears of it, then instances are killed or added, then metrics are scraped,
// then new requests are routed and submitted, and only then does each engine start its next
// step, so that every request that arrives at an instant joins the step that starts at it.
const (
	evStepEnd uint8 = iota
	evObserve       // router learns of engine events (with network latency)
	evRefused       // router learns that a request could not be delivered (with network latency)
	evLost          // router learns that its request's instance died (with network latency)
	evFailed        // router learns that its request was answered 500 (with network latency)
	evCut           // router learns that its request's stream was cut (with network latency)
	evTimeout       // an attempt's first-token timeout
	evStall         // an attempt's stall watch is due (route.StallWatch)
	evIdle          // a stream's idle timeout, on a hung instance
	evSync          // a router replica hears of another's event (ReplicaSync.Delay later)
	evChange        // an instance is killed, added, fails or recovers
	evControl       // the autoscaler looks (autoscale.go)
	evScrape
	evArrival
	evDeferred // a request a replica's policy held (policy.Deferrer) is routed
	evSubmit   // request reaches its engine (with network latency)
	evKick     // engine starts its next step
)

type event struct {
	at   time.Duration
	kind uint8
	inst int32
	req  int32
	n    int32 // evTimeout, evStall, evIdle: the attempt; evStepEnd: the instance's life
	seq  uint64
	evs  []engine.Event
}

func (a *event) less(b *event) bool {
	if a.at != b.at {
		return a.at < b.at
	}
	if a.kind != b.kind {
		return a.kind < b.kind
	}
	return a.seq < b.seq
}

// reqState is what the simulated router remembers of one request in flight.
type reqState struct {
	call   *route.Call
	stall  route.StallWatch // the attempt in progress's
	router int32            // the replica that routed it
	inst   int32            // the instance of the attempt in progress, -1 when none
	done   bool
	// submitted is when the attempt in progress reached its engine.
	submitted time.Duration
}

// release lets go of what the router kept for a request that is done, which nothing reads
// again: kept to the end of a run, every call and its ranked endpoints stayed on the heap for
// the collector to scan at each cycle (0.4 GB of kvroute plan's 3 GB peak at a million
// requests).
func (st *reqState) release() { st.call, st.stall = nil, route.StallWatch{} }

// router is one router replica: its lifecycle (its policy instance) and its own Endpoint
// objects, whose load counters only its own requests move (the snapshots on them are shared).
type router struct {
	lc       *route.Lifecycle
	deferrer policy.Deferrer // the policy, if it holds requests (policy.Deferrer)
	eps      []*endpoint.Endpoint
	cands    []*endpoint.Endpoint // scratch: this request's candidates
	routed   int
}

type sim struct {
	cfg        Config
	stalls     int // attempts given up as stalled
	audit      []AuditChange
	w          *Workload
	policyName string
	clock      virtualClock
	routers    []router
	arrivals   int // requests arrived so far, for the round-robin spread
	engines    []Engine
	stepping   []bool // a step or a kick is pending for the engine
	present    []bool // the instance is part of the fleet (not yet added: false)
	dead       []bool // the instance was killed
	held       []map[int32]struct{}
	queue      eventQueue
	seq        uint64
	next       int // next arrival, index into w.order
	records    []report.Record
	state      []reqState
	events     int
	sync       syncState
	// sameInstant counts consecutive zero-length steps.
	sameInstant int
	// inst is each instance's fault state; firstStep, per request, the engine step of its
	// first token (faults.go).
	inst      []instState
	firstStep []int32
	// asked is how many instances the autoscaler has asked for (they are 0 .. asked-1), and
	// scaled what it added (autoscale.go).
	asked  int
	scaled []Scaled
	// skipped counts the scrapes idleTicks found could change nothing and left out.
	skipped int
}

// maxStepsPerInstant bounds the zero-length engine steps in a row before a run gives up.
const maxStepsPerInstant = 10_000_000

func (s *sim) push(e event) {
	e.seq = s.seq
	s.seq++
	s.queue.push(e)
}

func (s *sim) loop(ctx context.Context) error {
	n := len(s.w.reqs)
	s.records = make([]report.Record, n)
	s.state = make([]reqState, n)
	for i := range s.records {
		r := &s.w.reqs[i]
		s.records[i] = report.Record{
			ID: s.w.preqs[i].ID, Policy: s.policyName, EndpointID: -1,
			Arrival: r.Arrival, PromptTokens: r.PromptTokens, OutputTokens: r.OutputTokens,
		}
		s.state[i].inst = -1
	}
	if n > 0 {
		s.pushArrival()
		s.push(event{at: 0, kind: evScrape})
		for k, ch := range s.cfg.Changes {
			s.push(event{at: ch.At, kind: evChange, req: int32(k)})
		}
	}
	for s.queue.len() > 0 {
		if s.events&0xfff == 0 {
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("simulation stopped at %v of virtual time: %w", s.clock.now, err)
			}
		}
		s.events++
		e := s.queue.pop()
		s.clock.now = e.at
		switch e.kind {
		case evArrival:
			s.arrive(int(e.req))
			s.pushArrival()
		case evDeferred:
			s.place(int(e.req), int(e.inst))
		case evSubmit:
			s.submit(int(e.inst), int(e.req))
		case evKick:
			if e.n != s.inst[e.inst].life {
				continue // for the instance before it was killed
			}
			if err := s.kick(int(e.inst)); err != nil {
				return err
			}
		case evStepEnd:
			if s.dead[e.inst] || e.n != s.inst[e.inst].life {
				continue // killed during the step: nothing it computed is heard of
			}
			if s.stepEnded(int(e.inst), e.evs) {
				continue // hung: the events wait for the recovery
			}
			if s.cfg.NetworkLatency == 0 {
				s.observe(int(e.inst), e.evs)
			} else if len(e.evs) > 0 {
				// The engine reuses its event slice at its next step, which starts before the
				// router hears of these.
				s.push(event{at: e.at + s.cfg.NetworkLatency, kind: evObserve, inst: e.inst, evs: slices.Clone(e.evs)})
			}
			s.cutStreams(int(e.inst))
			s.push(event{at: e.at, kind: evKick, inst: e.inst, n: e.n})
		case evObserve:
			s.observe(int(e.inst), e.evs)
		case evRefused:
			s.failAttempt(int(e.req), int(e.inst), route.FailConnect, "connection refused by "+s.name(int(e.inst)))
		case evLost:
			s.lost(int(e.req), int(e.inst))
		case evSync:
			s.deliver(e.req)
		case evFailed:
			// A 500 before any byte reached the client: live, the lifecycle sends the request to
			// the next ranked endpoint once (route.Failure.RetryableOnce), as here.
			s.failAttempt(int(e.req), int(e.inst), route.FailStatus, s.name(int(e.inst))+" answered 500")
		case evCut:
			s.cut(int(e.req), int(e.inst))
		case evTimeout:
			s.timeout(e)
		case evStall:
			s.stalled(e)
		case evIdle:
			s.idle(e)
		case evChange:
			if err := s.change(s.cfg.Changes[e.req]); err != nil {
				return fmt.Errorf("%s of instance %d at %v: %w", s.cfg.Changes[e.req].Kind, s.cfg.Changes[e.req].Instance, e.at, err)
			}
		case evControl:
			s.control()
		case evScrape:
			s.scrape()
			// Keep scraping while anything else is going to happen.
			if s.queue.len() > 0 {
				s.push(event{at: e.at + s.idleTicks(e.at)*s.cfg.ScrapeInterval, kind: evScrape})
			}
		}
	}
	// A request the engines never finished is failed, never lost.
	for i := range s.records {
		if !s.state[i].done {
			s.finishFailed(i, "not finished when the simulation ended")
		}
	}
	return nil
}

// idleTicks returns how many scrape intervals after the scrape at now the next scrape that can
// matter comes: 1 unless nothing happens for several intervals, as in a gap between the
// arrivals of a sparse trace, which would take a scrape every interval, hours of them, to
// cross.
//
// Only events change what a scrape reads (the engines change in Submit and Step alone, and
// Stats only reads them), so every scrape between two events takes the same snapshot but for
// its time; storing one with the same Work as the last moves nothing but its time
// (endpoint.SetSnapshot), and no policy, timer or audit looks at a snapshot but in an event.
// So of the scrapes before the next event, only the last matters: the next event then finds
// the snapshot it would have found, with the same time. The event and sequence counters move
// as if the skipped scrapes had happened, so the same events come out in the same order and
// Result.Events is the same.
func (s *sim) idleTicks(now time.Duration) time.Duration {
	if s.cfg.everyTick {
		return 1
	}
	// The scrapes due strictly before the next event are now+k*interval, k = 1..n. One due at
	// the event's very instant is left alone: it comes before or after the event as their
	// kinds say, as before.
	n := (s.queue.peek().at - now - 1) / s.cfg.ScrapeInterval
	if n < 2 {
		return 1
	}
	s.events += int(n - 1)
	s.seq += uint64(n - 1)
	s.skipped += int(n - 1)
	return n
}

func (s *sim) name(inst int) string { return s.routers[0].eps[inst].Name }

// fleetSize is the number of instances in the fleet (as a router's pool has them: the dead
// ones too, until it learns otherwise).
func (s *sim) fleetSize() int {
	n := 0
	for _, p := range s.present {
		if p {
			n++
		}
	}
	return n
}

func (s *sim) pushArrival() {
	if s.next >= len(s.w.order) {
		return
	}
	i := s.w.order[s.next]
	s.next++
	s.push(event{at: s.w.reqs[i].Arrival, kind: evArrival, req: int32(i)})
}

// spread picks the router replica for request i, the n-th to arrive (from 0).
func (s *sim) spread(i, n int) int {
	k := len(s.routers)
	if k == 1 {
		return 0
	}
	if s.cfg.Spread == SpreadSession {
		if key := s.w.preqs[i].SessionKey; key != "" {
			// FNV-1a: a fixed hash, so the assignment is the same in every run.
			h := uint64(14695981039346656037)
			for j := 0; j < len(key); j++ {
				h ^= uint64(key[j])
				h *= 1099511628211
			}
			return int(h % uint64(k))
		}
	}
	return n % k
}

// arrive routes request i: the replica's candidates are the instances that are part of the
// fleet and that it has not ejected.
func (s *sim) arrive(i int) {
	rt := s.spread(i, s.arrivals)
	s.arrivals++
	if r := &s.routers[rt]; r.deferrer != nil {
		if d := r.deferrer.Defer(&s.w.preqs[i], s.candidates(r)); d > 0 {
			s.push(event{at: s.clock.now + d, kind: evDeferred, req: int32(i), inst: int32(rt)})
			return
		}
	}
	s.place(i, rt)
}

// candidates are the instances that are part of the fleet and that replica r has not ejected.
func (s *sim) candidates(r *router) []*endpoint.Endpoint {
	r.cands = r.cands[:0]
	for id, ep := range r.eps {
		if s.present[id] && ep.Available() {
			r.cands = append(r.cands, ep)
		}
	}
	return r.cands
}

// place routes request i through replica rt.
func (s *sim) place(i, rt int) {
	st := &s.state[i]
	st.router = int32(rt)
	r := &s.routers[rt]
	r.routed++
	s.candidates(r)
	c, err := r.lc.Begin(&s.w.preqs[i], r.cands, "", s.clock.Now())
	st.call = c
	if err != nil {
		s.finishFailed(i, "pick: "+err.Error())
		return
	}
	s.send(i)
}

// send starts request i's next attempt, or fails it when no endpoint is left.
func (s *sim) send(i int) {
	st := &s.state[i]
	ep := st.call.Next()
	if ep == nil {
		s.finishFailed(i, "no endpoint left to try")
		return
	}
	st.inst = int32(ep.ID)
	rec := &s.records[i]
	rec.EndpointID, rec.Endpoint, rec.Attempts, rec.MovedBy = ep.ID, ep.Name, st.call.Attempts(), st.call.Moved()
	if p := st.call.Predicted(); p >= 0 {
		rec.Predicted, rec.PredictedCachedTokens = true, p
	}
	// An answer that comes whole waits for limits.response_timeout instead, and has no stall
	// watch here: the live one reads an engine's scraped counters, which this leaves out.
	whole := s.w.preqs[i].Whole
	timeout := s.cfg.FirstTokenTimeout
	if whole {
		timeout = ResponseTimeout
	}
	if timeout > 0 {
		s.push(event{at: s.clock.now + timeout, kind: evTimeout, inst: int32(ep.ID), req: int32(i), n: int32(st.call.Attempts())})
	}
	st.stall = st.call.Stall()
	if a := st.stall.After(); a > 0 && !whole && (s.cfg.FirstTokenTimeout <= 0 || a < s.cfg.FirstTokenTimeout) {
		s.push(event{at: s.clock.now + a, kind: evStall, inst: int32(ep.ID), req: int32(i), n: int32(st.call.Attempts())})
	}
	if s.cfg.NetworkLatency == 0 {
		s.submit(ep.ID, i)
		return
	}
	s.push(event{at: s.clock.now + s.cfg.NetworkLatency, kind: evSubmit, inst: int32(ep.ID), req: int32(i)})
}

// submit hands request i to engine inst, or has the router hear that it could not.
func (s *sim) submit(inst, i int) {
	if st := &s.state[i]; st.done || int(st.inst) != inst {
		return // the attempt ended on its way (timed out)
	}
	if s.dead[inst] {
		// The connection is refused; the router hears of it a round trip after it sent.
		s.push(event{at: s.clock.now + s.cfg.NetworkLatency, kind: evRefused, inst: int32(inst), req: int32(i)})
		return
	}
	if s.inst[inst].failing {
		s.push(event{at: s.clock.now + s.cfg.NetworkLatency, kind: evFailed, inst: int32(inst), req: int32(i)})
		return
	}
	r := &s.w.reqs[i]
	er := engine.Request{
		ID:           s.w.preqs[i].ID,
		PromptTokens: r.PromptTokens,
		OutputTokens: r.OutputTokens,
		BlockKeys:    s.w.keys[i],
	}
	if s.inst[inst].blind {
		er.Salt = blindSalt(er.ID)
	}
	err := s.engines[inst].Submit(s.clock.now, er)
	if err != nil {
		// The router hears of the rejection one network delay later.
		s.clock.now += s.cfg.NetworkLatency
		s.failAttempt(i, inst, route.FailRejected, "engine: "+err.Error())
		s.clock.now -= s.cfg.NetworkLatency
		return
	}
	s.state[i].submitted = s.clock.now
	s.held[inst][int32(i)] = struct{}{}
	if !s.stepping[inst] {
		s.stepping[inst] = true
		s.push(event{at: s.clock.now, kind: evKick, inst: int32(inst), n: s.inst[inst].life})
	}
}

// failAttempt ends request i's attempt on inst with failure f: the lifecycle says whether it
// goes on to the next ranked endpoint.
func (s *sim) failAttempt(i, inst int, f route.Failure, msg string) {
	st := &s.state[i]
	if st.done || int(st.inst) != inst {
		return
	}
	st.inst = -1
	if st.call.Fail(f) {
		// The lifecycle sends again only what showed the client nothing, but an answer that
		// comes whole may have had its first token from the engine that failed it: the record
		// and the cut counter take the next attempt's.
		s.records[i].FirstToken = 0
		if s.firstStep != nil {
			s.firstStep[i] = noFirstToken
		}
		s.send(i)
		return
	}
	s.finishFailed(i, msg)
}

// finishFailed records request i as failed now.
func (s *sim) finishFailed(i int, msg string) {
	st := &s.state[i]
	if st.call != nil {
		st.call.Finish(route.Outcome{CachedTokens: -1})
	}
	rec := &s.records[i]
	rec.Finish = max(s.clock.now, rec.Arrival)
	rec.CachedTokens = 0
	rec.Err = msg
	st.done = true
	st.inst = -1
	st.release()
}

// change kills or adds an instance, or starts or ends a fault.
func (s *sim) change(ch Change) error {
	inst := ch.Instance
	switch ch.Kind {
	case Add:
		s.present[inst] = true
		return nil
	case Fail, Hang, Cut, Blind, Recover:
		return s.fault(ch)
	case Kill:
	default:
		return fmt.Errorf("unknown change %s", ch.Kind)
	}
	if s.dead[inst] {
		return nil
	}
	s.dead[inst] = true
	// What it held is lost; each request's router hears of it one network latency later.
	lost := slices.Sorted(maps.Keys(s.held[inst]))
	clear(s.held[inst])
	s.stepping[inst] = false // a step in progress ends unheard (its life is over)
	s.inst[inst].life++
	for _, i := range lost {
		s.push(event{at: s.clock.now + s.cfg.NetworkLatency, kind: evLost, inst: int32(inst), req: i})
	}
	return nil
}

// kick starts engine inst's next step, if it has anything to do.
func (s *sim) kick(inst int) error {
	if s.dead[inst] || s.inst[inst].hung {
		s.stepping[inst] = false
		return nil
	}
	now := s.clock.now
	end, evs, ok := s.engines[inst].Step(now)
	if !ok {
		s.stepping[inst] = false
		return nil
	}
	if end < now {
		return fmt.Errorf("engine %d: step at %v ended before it began, at %v", inst, now, end)
	}
	// A step may take no time (the "instant" profile), but an engine that never lets time pass
	// would hang the simulation.
	if end == now {
		s.sameInstant++
		if s.sameInstant > maxStepsPerInstant {
			return fmt.Errorf("engine %d: more than %d steps at %v without time passing", inst, maxStepsPerInstant, now)
		}
	} else {
		s.sameInstant = 0
	}
	s.stepping[inst] = true
	s.push(event{at: end, kind: evStepEnd, inst: int32(inst), evs: evs, n: s.inst[inst].life})
	return nil
}

// observe delivers engine inst's events to the lifecycle of the request's router replica
// (endpoint counters, the policy) and to the records.
func (s *sim) observe(inst int, evs []engine.Event) {
	for k := range evs {
		ev := &evs[k]
		i, err := strconv.Atoi(ev.ReqID)
		if err != nil || i < 0 || i >= len(s.state) {
			continue
		}
		st := &s.state[i]
		if st.done || int(st.inst) != inst {
			continue
		}
		rec := &s.records[i]
		switch ev.Kind {
		case engine.EventFirstToken:
			s.firstToken(i, ev.At)
		case engine.EventFinished:
			s.firstToken(i, ev.At) // a one-token request may report only its end
			delete(s.held[inst], int32(i))
			rec.Finish = s.clock.now
			rec.CachedTokens = ev.CachedTokens
			if ev.OutputTokens > 0 {
				rec.OutputTokens = ev.OutputTokens
			}
			st.done = true
			reported := ev.CachedTokens
			if s.cfg.Opaque {
				reported = -1
			}
			st.call.Finish(route.Outcome{OK: true, CachedTokens: reported, OutputTokens: rec.OutputTokens})
			st.release()
		}
	}
}

// firstToken records request i's first token, which its engine made at at (the router hears of
// it now).
func (s *sim) firstToken(i int, at time.Duration) {
	rec := &s.records[i]
	if rec.FirstToken != 0 {
		return
	}
	rec.FirstToken = s.clock.now
	if st := &s.state[i]; st.inst >= 0 {
		in := &s.inst[st.inst]
		in.ttftSum += (at - st.submitted).Seconds()
		in.ttftN++
	}
	if s.w.preqs[i].Whole {
		return // the router does not see it: the answer comes whole, at its end
	}
	s.state[i].call.FirstToken()
	s.idleWatch(i)
}

// scrape refreshes every endpoint's snapshot from its engine's counters. Every replica sees the
// same snapshot at the same instant: live replicas scrape on their own timers, so their
// snapshots differ by up to one interval in age, which this leaves out. A dead instance's
// scrape fails: its snapshot ages.
func (s *sim) scrape() {
	at := s.clock.Now()
	for i, e := range s.engines {
		if s.dead[i] || !s.present[i] {
			continue
		}
		st := e.Stats()
		snap := &endpoint.Snapshot{
			At:            at,
			Running:       st.Running,
			Waiting:       st.Waiting,
			BlockSize:     s.cfg.BlockSize,
			NumGPUBlocks:  st.TotalBlocks,
			PrefixQueries: float64(st.PrefixQueryTokens),
			PrefixHits:    float64(st.PrefixHitTokens),
			Work:          float64(st.PromptTokens + st.GenerationTokens),
			TTFTSum:       s.inst[i].ttftSum,
			TTFTCount:     s.inst[i].ttftN,
		}
		if st.TotalBlocks > 0 {
			snap.KVUsage = float64(st.UsedBlocks) / float64(st.TotalBlocks)
		}
		if s.cfg.Opaque {
			snap.BlockSize, snap.NumGPUBlocks = 0, 0
		}
		for k := range s.routers {
			s.routers[k].eps[i].SetSnapshot(snap)
		}
	}
}

func (s *sim) result() *Result {
	res := &Result{
		Records: s.records,
		Busy:    make([]time.Duration, len(s.engines)),
		Stats:   make([]engine.Stats, len(s.engines)),
		Events:  s.events,
		Routed:  make([]int, len(s.routers)),
		Scaled:  s.scaled,
		Stalls:  s.stalls,
		Audit:   s.audit,
		skipped: s.skipped,
	}
	for k := range s.routers {
		res.Routed[k] = s.routers[k].routed
	}
	for i, e := range s.engines {
		res.Stats[i] = e.Stats()
		res.Busy[i] = res.Stats[i].Busy
	}
	return res
}

// ParseChange reads a --kill or --add value, "N@T": instance N at T, where T is a duration of
// virtual time ("90s", "30m") or a share of span, the workload's arrival span ("50%").
func ParseChange(kind ChangeKind, spec string, span time.Duration) (Change, error) {
	inst, at, ok := strings.Cut(spec, "@")
	n, err := strconv.Atoi(strings.TrimSpace(inst))
	if !ok || err != nil || n < 0 {
		return Change{}, fmt.Errorf("--%s %q: want INSTANCE@TIME, such as 3@50%% or 3@90s", kind, spec)
	}
	at = strings.TrimSpace(at)
	ch := Change{Instance: n, Kind: kind}
	if pct, isPct := strings.CutSuffix(at, "%"); isPct {
		f, err := strconv.ParseFloat(pct, 64)
		if err != nil || f < 0 || f > 100 {
			return Change{}, fmt.Errorf("--%s %q: %q is not a share from 0%% to 100%% of the arrivals' span", kind, spec, at)
		}
		ch.At = time.Duration(f / 100 * float64(span))
		return ch, nil
	}
	d, err := time.ParseDuration(at)
	if err != nil || d < 0 {
		return Change{}, fmt.Errorf("--%s %q: %q is not a duration such as 90s or a share such as 50%%", kind, spec, at)
	}
	ch.At = d
	return ch, nil
}
