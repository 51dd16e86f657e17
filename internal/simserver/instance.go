package simserver

import (
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/kvevents"
	"github.com/kvroute/kvroute/internal/prefix"
	"github.com/prometheus/client_golang/prometheus"
)

// Instance is one simulated vLLM server: an engine, its driver goroutine, an HTTP handler,
// a Prometheus registry and, optionally, a KV-event publisher.
type Instance struct {
	opts    Options
	eng     *engine.Engine // owned by the driver goroutine after New
	cfg     engine.Config
	start   time.Time // model time 0, on the real (monotonic) clock that paces the engine
	created time.Time // Options.Now at start, for timestamps clients see
	log     *slog.Logger
	reg     *prometheus.Registry
	met     *metrics
	pub     *kvevents.Publisher
	handler http.Handler

	cmds    chan command
	closing chan struct{}  // closed by Close: handlers and the driver stop
	stopped chan struct{}  // closed when the driver has returned
	reqs    sync.WaitGroup // in-flight API handlers
	enterMu sync.Mutex
	closed  bool // guarded by enterMu: no handler may enter
	once    sync.Once

	stats  atomic.Pointer[engine.Stats] // the driver's last snapshot
	faults atomic.Pointer[Faults]
	// faultsSet is closed (and replaced) by each SetFaults: hung requests look again.
	faultsSet atomic.Pointer[chan struct{}]
	// crashes counts the crashes a drop_all request caused; crashed is closed (and replaced)
	// by each: requests that began before a crash are dropped.
	crashes atomic.Uint64
	crashed atomic.Pointer[chan struct{}]
	nextID  atomic.Uint64
	kvSent  atomic.Int64 // KV-event batches handed to the publisher
	maxLag  atomic.Int64 // the most the engine's clock fell behind the wall clock, wall ns
	// firstWriteDelay sums, over streams, the wall time from a first token's model time to its
	// write: how late the handlers are (benchmarks read it).
	firstWriteDelay, firstWrites atomic.Int64
	// onFirst, when set, is called by a stream's handler after it wrote the first token, with
	// the request id and the engine model's TTFT of that request (model time, queueing
	// included): benchmarks compare it with the TTFT their client saw.
	onFirst atomic.Pointer[func(requestID string, modelTTFT time.Duration)]

	bufs sync.Pool // stream write buffers of streamBufSize

	// blocks holds, with KV events on, the text of every full prompt block of the requests in
	// the engine, by block hash: BlockStored events carry the token ids of the blocks they
	// name. Driver only.
	blocks map[uint64]blockText

	randMu sync.Mutex
	rand   *rand.Rand
}

type cmdKind int

const (
	cmdSubmit cmdKind = iota + 1
	cmdAbort
)

type command struct {
	kind cmdKind
	job  *job
}

// job is one request inside the driver, with the state its handler reads.
type job struct {
	req     engine.Request
	arrival time.Duration // model time
	predict time.Duration // unloaded TTFT of the prompt with no cache, for queue-time estimates

	mu       sync.Mutex
	notify   chan struct{} // capacity 1: something changed
	produced int           // output tokens so far
	cached   int
	firstAt  time.Duration // model time of the first token, -1 until then
	doneAt   time.Duration
	done     bool
	err      error // submit refused
	lastAt   time.Duration
	finish   string // finish_reason when it completes: "length" or "stop"
	stream   bool   // wake the handler for new tokens, not only the first and the last

	dirty  bool      // driver only: in the driver's list of streams with tokens not yet signalled
	wakeAt time.Time // driver only: the earliest wall time of the next wake-up for tokens

	// With KV events on: the canonical prompt text and the hash of each of its full blocks.
	text   []byte
	hashes []uint64
}

// blockText is one block's text and the number of requests in the engine that hold it.
type blockText struct {
	text []byte
	refs int
}

func (j *job) signal() {
	select {
	case j.notify <- struct{}{}:
	default:
	}
}

// New builds an instance and starts its driver goroutine (and KV-event publisher when
// Options.KVEvents is set). Close stops them. A bad option is an OptionError (in the error
// returned), as errors.As finds it.
func New(opts Options) (*Instance, error) {
	in, err := newInstance(opts)
	if err != nil {
		return nil, fmt.Errorf("simserver: %w", err)
	}
	return in, nil
}

// newInstance is New with errors that do not name the package (StartFleet names it once, with
// the instance's number).
func newInstance(opts Options) (*Instance, error) {
	opts = opts.withDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	prof, err := engine.LookupProfile(opts.Profile)
	if err != nil {
		return nil, profileError(opts.Profile)
	}
	eng, err := engine.New(engine.Config{
		Profile: prof, BlockSize: opts.BlockSize, NumBlocks: opts.KVBlocks,
		TokenEvents: true, KVEvents: opts.KVEvents != "",
	})
	if err != nil {
		return nil, err
	}
	in := &Instance{
		opts:    opts,
		eng:     eng,
		cfg:     eng.Config(),
		start:   time.Now(),
		created: opts.Now(),
		log:     opts.Logger.With("instance", opts.Name),
		reg:     prometheus.NewRegistry(),
		cmds:    make(chan command, 1024),
		closing: make(chan struct{}),
		stopped: make(chan struct{}),
		rand:    rand.New(rand.NewPCG(opts.Seed, 0x5eed)),
	}
	if opts.KVEvents != "" {
		in.blocks = map[uint64]blockText{}
	}
	f := opts.Faults
	in.faults.Store(&f)
	set, crashed := make(chan struct{}), make(chan struct{})
	in.faultsSet.Store(&set)
	in.crashed.Store(&crashed)
	st := eng.Stats()
	in.stats.Store(&st)
	in.met = newMetrics(in.reg, in)
	if opts.KVEvents != "" {
		topic := opts.KVTopic
		if topic == "" {
			topic = "kv@" + opts.Name + "@" + opts.Model
		}
		in.pub, err = kvevents.NewPublisher(kvevents.PublisherOptions{
			Endpoint: opts.KVEvents, ReplayEndpoint: opts.KVEventsReplay, Topic: topic, Logger: in.log,
		})
		if err != nil {
			return nil, err
		}
	}
	in.handler = in.routes()
	go in.drive()
	return in, nil
}

// Handler returns the instance's HTTP API: /v1/chat/completions, /v1/completions, /v1/models,
// /health, /metrics and, with Options.Admin, /admin/faults.
func (in *Instance) Handler() http.Handler { return in.handler }

// Model returns the served model name.
func (in *Instance) Model() string { return in.opts.Model }

// Config returns the engine configuration (sizes filled from the profile).
func (in *Instance) Config() engine.Config { return in.cfg }

// KVEventsAddr returns the KV-event PUB and replay addresses ("" when not enabled).
func (in *Instance) KVEventsAddr() (pub, replay string) {
	if in.pub == nil {
		return "", ""
	}
	return in.pub.Addr(), in.pub.ReplayAddr()
}

// Stats returns the engine's counters as of its last step.
func (in *Instance) Stats() engine.Stats { return *in.stats.Load() }

// Predict returns the engine model's time to first token, in model time, of a lone request of
// promptTokens tokens of which cachedTokens are in the prefix cache, on an idle instance.
func (in *Instance) Predict(promptTokens, cachedTokens int) time.Duration {
	return in.eng.UnloadedTTFT(promptTokens, cachedTokens) // reads only the immutable config
}

// MaxLag returns the most the engine's model clock has fallen behind the wall clock at the
// end of a step (wall time): how far this machine failed to keep up with the time scale.
func (in *Instance) MaxLag() time.Duration { return time.Duration(in.maxLag.Load()) }

// Faults returns the current fault state.
func (in *Instance) Faults() Faults { return *in.faults.Load() }

// SetFaults replaces the fault state.
func (in *Instance) SetFaults(f Faults) error {
	if err := f.Validate(); err != nil {
		return fmt.Errorf("simserver: faults: %w", err)
	}
	in.faults.Store(&f)
	set := make(chan struct{})
	close(*in.faultsSet.Swap(&set))
	return nil
}

// Close stops the instance: in-flight requests end at once (streams are cut), the driver and
// the KV-event publisher stop. It waits for every goroutine the instance started and returns
// nil; calling it again does nothing.
func (in *Instance) Close() error {
	var err error
	in.once.Do(func() {
		in.enterMu.Lock()
		in.closed = true
		in.enterMu.Unlock()
		close(in.closing)
		in.reqs.Wait()
		<-in.stopped
		if in.pub != nil {
			err = in.pub.Close()
		}
	})
	return err
}

// modelNow converts a wall time to model time since the instance started.
func (in *Instance) modelAt(t time.Time) time.Duration {
	d := t.Sub(in.start)
	if d < 0 {
		return 0
	}
	return time.Duration(float64(d) / in.opts.TimeScale)
}

// wallAt converts a model time to the wall time it happens at.
func (in *Instance) wallAt(m time.Duration) time.Time {
	return in.start.Add(time.Duration(float64(m) * in.opts.TimeScale))
}

// send hands a command to the driver; it fails once the instance is closing.
func (in *Instance) send(c command) error {
	select {
	case in.cmds <- c:
		return nil
	case <-in.closing:
		return errClosed
	}
}

var errClosed = errors.New("simserver: instance closed")

func (in *Instance) draw() float64 {
	in.randMu.Lock()
	defer in.randMu.Unlock()
	return in.rand.Float64()
}

// drive is the driver goroutine: it owns the engine.
func (in *Instance) drive() {
	defer close(in.stopped)
	var (
		now     time.Duration // the engine's clock
		pending []*job        // arrived, waiting for the next step that starts after arrival
		active  = map[string]*job{}
		timer   = time.NewTimer(time.Hour)
		dirty   []*job // streams with new tokens since their last wake-up
		gone    []*job // finished in this step: untracked once its KV events are out
	)
	// flush wakes the streams that have new tokens and whose last wake-up is StreamInterval
	// old (all of them when force is set): each writes its pending tokens in one go and no
	// stream needs a timer of its own. Every stream keeps the phase of its first token, so the
	// wake-ups spread over the interval instead of coming in one burst that would queue the
	// drivers behind hundreds of writers.
	flush := func(force bool) {
		if len(dirty) == 0 {
			return
		}
		t := time.Now()
		keep := dirty[:0]
		for _, j := range dirty {
			if !force && t.Before(j.wakeAt) {
				keep = append(keep, j)
				continue
			}
			j.dirty = false
			j.wakeAt = t.Add(in.opts.StreamInterval)
			j.signal()
		}
		clear(dirty[len(keep):])
		dirty = keep
	}
	timer.Stop()
	defer timer.Stop()
	defer func() {
		// Wake every handler still waiting: the instance is closing.
		for _, j := range active {
			j.mu.Lock()
			j.err = errClosed
			j.mu.Unlock()
			j.signal()
		}
	}()

	handle := func(c command) {
		switch c.kind {
		case cmdSubmit:
			// Keep pending ordered by arrival: handlers stamp arrivals before they queue.
			pending = append(pending, c.job)
			for i := len(pending) - 1; i > 0 && pending[i].arrival < pending[i-1].arrival; i-- {
				pending[i], pending[i-1] = pending[i-1], pending[i]
			}
		case cmdAbort:
			id := c.job.req.ID
			for i, j := range pending {
				if j == c.job {
					pending = append(pending[:i], pending[i+1:]...)
					break
				}
			}
			if _, ok := active[id]; ok {
				delete(active, id)
				in.eng.Abort(now, id)
				in.met.finished("abort")
				in.publishKV()
				in.untrack(c.job)
			}
		}
	}
	admit := func() {
		n := 0
		for _, j := range pending {
			if j.arrival > now {
				break
			}
			n++
			if err := in.eng.Submit(now, j.req); err != nil {
				j.mu.Lock()
				j.err = err
				j.mu.Unlock()
				j.signal()
				continue
			}
			active[j.req.ID] = j
			in.track(j)
		}
		pending = append(pending[:0], pending[n:]...)
	}

	for {
		// Take every command already queued, without blocking.
	drain:
		for {
			select {
			case c := <-in.cmds:
				handle(c)
			case <-in.closing:
				return
			default:
				break drain
			}
		}
		admit()
		end, events, ok := in.eng.Step(now)
		if !ok {
			flush(true)
			in.snapshot()
			if len(pending) > 0 {
				// Idle until the next arrival (the arrival is already in the past in wall time).
				now = max(now, pending[0].arrival)
				continue
			}
			select {
			case c := <-in.cmds:
				handle(c)
				if len(pending) > 0 {
					now = max(now, pending[0].arrival)
				}
			case <-in.closing:
				return
			}
			continue
		}
		f := in.faults.Load()
		if s := f.slow(); s != 1 {
			end = now + time.Duration(float64(end-now)*s)
		}
		// Sleep until the step's end in wall time, queueing what arrives meanwhile. Go's timers
		// wake up to a millisecond late in an idle process (the runtime sleeps in whole
		// milliseconds), which at time-scale 0.1 is 10 ms of model time. When the step gives a
		// first token, the timer covers all but the last preciseSleep and a precise sleep of
		// the thread the rest; other steps' tokens wait for the next stream write anyway, and
		// a precise sleep on every step would cost a thread hand-off each.
		wake := in.wallAt(end)
		precise := time.Duration(0)
		if hasFirstToken(events) {
			precise = preciseSleep
		}
		if d := time.Until(wake) - precise; d > 0 {
			timer.Reset(d)
		wait:
			for {
				select {
				case c := <-in.cmds:
					handle(c)
				case <-timer.C:
					break wait
				case <-in.closing:
					return
				}
			}
		}
		if precise > 0 {
			sleepUntil(wake)
		}
		if lag := time.Since(in.wallAt(end)); lag > time.Duration(in.maxLag.Load()) {
			in.maxLag.Store(int64(lag))
		}
		now = end
		dirty, gone = in.deliver(events, end, active, dirty, gone[:0])
		flush(false)
		in.publishKV()
		for i, j := range gone {
			in.untrack(j)
			gone[i] = nil
		}
		in.snapshot()
	}
}

func hasFirstToken(events []engine.Event) bool {
	for i := range events {
		if events[i].Kind == engine.EventFirstToken {
			return true
		}
	}
	return false
}

func (in *Instance) snapshot() {
	st := in.eng.Stats()
	in.stats.Store(&st)
}

// deliver hands one step's events to their handlers and records the request metrics. A first
// token or the end wakes the handler at once; other tokens of a stream add its job to dirty
// (returned), whose handlers the driver wakes once per StreamInterval. Finished jobs are
// appended to gone (returned).
func (in *Instance) deliver(events []engine.Event, at time.Duration, active map[string]*job, dirty, gone []*job) ([]*job, []*job) {
	for i := range events {
		ev := &events[i]
		j, ok := active[ev.ReqID]
		if !ok {
			continue // aborted during the step
		}
		j.mu.Lock()
		switch ev.Kind {
		case engine.EventFirstToken:
			j.firstAt, j.lastAt = at, at
			j.wakeAt = time.Now().Add(in.opts.StreamInterval)
			j.cached = ev.CachedTokens
			j.produced = max(j.produced, ev.OutputTokens, 1)
			in.met.ttft.Observe((at - j.arrival).Seconds())
		case engine.EventToken:
			in.met.itl.Observe((at - j.lastAt).Seconds())
			j.lastAt = at
			j.produced = max(j.produced, ev.OutputTokens)
		case engine.EventFinished:
			j.produced = max(j.produced, ev.OutputTokens)
			j.done, j.doneAt = true, at
			delete(active, ev.ReqID)
			gone = append(gone, j)
		case engine.EventPreempted:
			// The request recomputes its prompt; tokens already streamed stay streamed.
		}
		j.mu.Unlock()
		if ev.Kind == engine.EventFinished {
			in.met.requestDone(j)
		}
		switch {
		case ev.Kind != engine.EventToken:
			j.signal()
		case j.stream && in.opts.StreamInterval <= 0:
			j.signal()
		case j.stream && !j.dirty:
			j.dirty = true
			dirty = append(dirty, j)
		}
	}
	return dirty, gone
}

// track records the text of j's blocks for the BlockStored events of the engine (KV events on).
func (in *Instance) track(j *job) {
	if in.blocks == nil {
		return
	}
	size := prefix.BlockBytes(in.cfg.BlockSize)
	for i, h := range j.hashes {
		b := in.blocks[h]
		if b.refs == 0 {
			b.text = j.text[i*size : (i+1)*size]
		}
		b.refs++
		in.blocks[h] = b
	}
}

// untrack forgets what track recorded for j once j has left the engine.
func (in *Instance) untrack(j *job) {
	if in.blocks == nil {
		return
	}
	for _, h := range j.hashes {
		b := in.blocks[h]
		if b.refs <= 1 {
			delete(in.blocks, h)
			continue
		}
		b.refs--
		in.blocks[h] = b
	}
}

// tokenIDs returns the token ids of the blocks hashes (BlockSize of them a block), or an empty
// slice when a block's text is not known.
func (in *Instance) tokenIDs(hashes []uint64) []int64 {
	bs := in.cfg.BlockSize
	ids := make([]int64, 0, len(hashes)*bs)
	for _, h := range hashes {
		b, ok := in.blocks[h]
		if !ok {
			return ids[:0]
		}
		ids = TokenIDs(ids, b.text, bs)
	}
	return ids
}

func (in *Instance) publishKV() {
	if in.pub == nil {
		return
	}
	kv := in.eng.DrainKVEvents()
	if len(kv) == 0 {
		return
	}
	b := kvevents.Batch{TS: float64(in.opts.Now().UnixNano()) / 1e9, DPRank: -1, Events: make([]kvevents.Event, 0, len(kv))}
	for _, e := range kv {
		ev := kvevents.Event{BlockHashes: e.Hashes, BlockSize: e.BlockSize, LoraID: -1, Medium: "GPU"}
		switch e.Kind {
		case engine.KVBlockStored:
			ev.Kind = kvevents.BlockStored
			ev.ParentHash, ev.HasParent = e.Parent, e.Parent != 0
			ev.TokenIDs = in.tokenIDs(e.Hashes)
			if ev.BlockSize == 0 {
				ev.BlockSize = in.cfg.BlockSize
			}
		case engine.KVBlockRemoved:
			ev.Kind = kvevents.BlockRemoved
		case engine.KVAllBlocksCleared:
			ev = kvevents.Event{Kind: kvevents.AllBlocksCleared, LoraID: -1}
		default:
			continue
		}
		b.Events = append(b.Events, ev)
	}
	in.pub.Publish(b)
	in.kvSent.Add(1)
}
