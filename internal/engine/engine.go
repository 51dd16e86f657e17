package engine

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/kvroute/kvroute/internal/prefix"
)

// Config configures an Engine. Zero sizes take the profile's.
type Config struct {
	Profile                                            Profile
	BlockSize, NumBlocks, MaxNumSeqs, MaxBatchedTokens int
	// TokenEvents makes Step emit an EventToken for every output token after the first (the
	// first is always an EventFirstToken), for the HTTP simulator's streams.
	TokenEvents bool
	// KVEvents records BlockStored and BlockRemoved events for DrainKVEvents.
	KVEvents bool
}

type seqState uint8

const (
	stateWaiting seqState = iota + 1
	stateRunning
	stateDone
)

// seq is one request inside the engine. seqs are recycled, keeping their slices.
type seq struct {
	id             string
	prompt, output int
	out            int // output tokens produced so far
	computed       int // tokens whose KV is in the blocks (cached hits included)
	hit            int // prefix-cache hit of the last scheduling, in tokens
	hashes         []uint64
	blocks         []int32
	cachedBlocks   int // leading blocks already offered to the prefix cache
	state          seqState
	counted        bool   // first lookup counted in the stats
	stepNo         uint64 // step that last scheduled it
	chunk          int    // tokens scheduled in that step
	decode         bool   // that step was a decode
	slot           int32  // its slot, in a slot cache
}

// tokens is the sequence length: the prompt plus the tokens generated so far.
func (s *seq) tokens() int { return s.prompt + s.out }

// isDecode says whether s has only its last sampled token left to compute.
func (s *seq) isDecode() bool { return s.out > 0 && s.computed == s.tokens()-1 }

// Engine is one simulated inference engine. It is not safe for concurrent use.
type Engine struct {
	cfg      Config
	pool     blockPool
	seqs     map[string]*seq
	running  []*seq // admission order
	waiting  []*seq // FCFS; waiting[wHead] is the front
	wHead    int
	spare    []*seq
	sched    []*seq
	hitIDs   []int32
	events   []Event
	kv       []KVEvent
	arena    []uint64
	remStart int // arena offset of the last KV event's hashes when it is a BlockRemoved, else -1
	stepNo   uint64
	noSalt   uint64 // hash seed for the empty salt
	stats    Stats
	slots    *slotCache // Profile.CacheSlots; nil for a block cache
}

// New returns an idle engine with every block free, or an error naming each bad field.
func New(cfg Config) (*Engine, error) {
	p := cfg.Profile
	if cfg.BlockSize == 0 {
		cfg.BlockSize = p.BlockSize
	}
	if cfg.NumBlocks == 0 {
		cfg.NumBlocks = p.NumBlocks
	}
	if cfg.MaxNumSeqs == 0 {
		cfg.MaxNumSeqs = p.MaxNumSeqs
	}
	if cfg.MaxBatchedTokens == 0 {
		cfg.MaxBatchedTokens = p.MaxBatchedTokens
	}
	var errs []error
	positive := func(name string, v int) {
		if v < 1 {
			errs = append(errs, fmt.Errorf("%s is %d: set a positive value in the config or the profile", name, v))
		}
	}
	positive("BlockSize", cfg.BlockSize)
	positive("NumBlocks", cfg.NumBlocks)
	positive("MaxNumSeqs", cfg.MaxNumSeqs)
	positive("MaxBatchedTokens", cfg.MaxBatchedTokens)
	if n := p.CacheSlots; n < 0 || n > 0 && (cfg.MaxNumSeqs > n || cfg.NumBlocks < n) {
		errs = append(errs, fmt.Errorf("profile %q: CacheSlots is %d with MaxNumSeqs %d and NumBlocks %d: use 0 (a block cache) or at least MaxNumSeqs slots, and at least one block per slot",
			p.Name, n, cfg.MaxNumSeqs, cfg.NumBlocks))
	}
	if cfg.NumBlocks >= math.MaxInt32 {
		errs = append(errs, fmt.Errorf("NumBlocks is %d: use fewer than %d blocks", cfg.NumBlocks, math.MaxInt32))
	}
	for _, c := range []struct {
		name string
		d    time.Duration
	}{
		{"StepOverhead", p.StepOverhead},
		{"PrefillPerToken", p.PrefillPerToken},
		{"AttentionPerMPairs", p.AttentionPerMPairs},
		{"DecodePerSeq", p.DecodePerSeq},
		{"DecodePerCtxToken", p.DecodePerCtxToken},
	} {
		if c.d < 0 {
			errs = append(errs, fmt.Errorf("profile %q: %s is %v: use a duration >= 0", p.Name, c.name, c.d))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("engine: bad config: %w", err)
	}
	e := &Engine{
		cfg:      cfg,
		pool:     newBlockPool(cfg.NumBlocks),
		seqs:     make(map[string]*seq),
		remStart: -1,
		noSalt:   prefix.Seed("", ""),
	}
	if p.CacheSlots > 0 {
		e.slots = newSlotCache(p.CacheSlots)
	}
	e.stats.TotalBlocks = cfg.NumBlocks
	return e, nil
}

// Config returns the engine's configuration with the zero sizes filled from the profile. It
// reads only what New fixed, so it may be called while another goroutine drives the engine.
func (e *Engine) Config() Config { return e.cfg }

// UnloadedTTFT is Profile.UnloadedTTFT under this engine's block size and batch budget. Like
// Config, it may be called while another goroutine drives the engine.
func (e *Engine) UnloadedTTFT(promptTokens, cachedTokens int) time.Duration {
	p := e.cfg.Profile
	p.BlockSize, p.MaxBatchedTokens = e.cfg.BlockSize, e.cfg.MaxBatchedTokens
	return p.UnloadedTTFT(promptTokens, cachedTokens)
}

// BlockHashes returns the chained hashes the engine computes for r's cacheable blocks: block i's
// hash is prefix.Next(hash of block i-1, r.BlockKeys[i]), and block 0's parent is
// prefix.Seed("", r.Salt), so the salt reaches every hash through the first. Keys beyond
// PromptTokens/BlockSize full blocks are ignored.
func (e *Engine) BlockHashes(r Request) []uint64 {
	return e.chain(nil, r)
}

func (e *Engine) chain(dst []uint64, r Request) []uint64 {
	n := min(len(r.BlockKeys), max(r.PromptTokens, 0)/e.cfg.BlockSize)
	seed := e.noSalt
	if r.Salt != "" {
		seed = prefix.Seed("", r.Salt)
	}
	return prefix.Chain(dst[:0], seed, r.BlockKeys[:n])
}

// Submit queues r at the back of the waiting queue; it is scheduled by the next Step. It fails
// for an empty or duplicate ID, PromptTokens or OutputTokens below 1, more block keys than full
// blocks, or a request that could not fit in the whole KV cache even alone.
func (e *Engine) Submit(now time.Duration, r Request) error {
	bs := e.cfg.BlockSize
	switch {
	case r.ID == "":
		return errors.New("engine: submit: request ID is empty: give every request a unique ID")
	case e.seqs[r.ID] != nil:
		return fmt.Errorf("engine: submit %q: a request with this ID is already in the engine", r.ID)
	case r.PromptTokens < 1:
		return fmt.Errorf("engine: submit %q: PromptTokens is %d: send at least 1 prompt token", r.ID, r.PromptTokens)
	case r.OutputTokens < 1:
		return fmt.Errorf("engine: submit %q: OutputTokens is %d: ask for at least 1 output token", r.ID, r.OutputTokens)
	case len(r.BlockKeys) > r.PromptTokens/bs:
		return fmt.Errorf("engine: submit %q: %d block keys for %d prompt tokens: give at most one key per full block of %d tokens (%d)",
			r.ID, len(r.BlockKeys), r.PromptTokens, bs, r.PromptTokens/bs)
	}
	// The last output token is sampled, never computed: prompt+output-1 tokens need KV.
	if need, room := ceilDiv(r.PromptTokens+r.OutputTokens-1, bs), e.SeqBlocks(); need > room {
		where := "the engine has"
		if e.slots != nil {
			where = "a cache slot holds"
		}
		return fmt.Errorf("engine: submit %q: %d prompt + %d output tokens need %d KV blocks but %s %d (%d tokens): shorten the request",
			r.ID, r.PromptTokens, r.OutputTokens, need, where, room, room*bs)
	}
	var s *seq
	if n := len(e.spare); n > 0 {
		s = e.spare[n-1]
		e.spare = e.spare[:n-1]
	} else {
		s = new(seq)
	}
	*s = seq{
		id: r.ID, prompt: r.PromptTokens, output: r.OutputTokens,
		hashes: e.chain(s.hashes, r), blocks: s.blocks[:0],
		state: stateWaiting,
	}
	e.seqs[r.ID] = s
	e.waiting = append(e.waiting, s)
	return nil
}

// Abort removes request id (the client went away), freeing its blocks (their cached prefix stays
// cached). It reports whether the request was in the engine. It emits no event.
func (e *Engine) Abort(now time.Duration, id string) bool {
	s := e.seqs[id]
	if s == nil {
		return false
	}
	switch s.state {
	case stateWaiting:
		for i := e.wHead; i < len(e.waiting); i++ {
			if e.waiting[i] == s {
				copy(e.waiting[i:], e.waiting[i+1:])
				e.waiting[len(e.waiting)-1] = nil
				e.waiting = e.waiting[:len(e.waiting)-1]
				break
			}
		}
	case stateRunning:
		e.freeBlocks(s)
		for i, r := range e.running {
			if r == s {
				copy(e.running[i:], e.running[i+1:])
				e.running[len(e.running)-1] = nil
				e.running = e.running[:len(e.running)-1]
				break
			}
		}
	}
	e.retire(s)
	return true
}

// retire forgets s and keeps it for reuse.
func (e *Engine) retire(s *seq) {
	delete(e.seqs, s.id)
	s.state = stateDone
	e.spare = append(e.spare, s)
}

// Step runs one batch step starting at now, if there is any work. It returns the step's end time
// and the events that happen at its end, or ok false (end == now, no events) when the engine is
// idle. The events slice is valid until the next call of Step.
//
// Scheduling follows vLLM V1: every running decode gets one token first (a decode that needs a
// block when none is free preempts the most recently admitted running request that this step has
// not scheduled, possibly itself); then running partial prefills get chunks, then waiting requests
// are admitted in FCFS order while the MaxBatchedTokens budget, MaxNumSeqs and free blocks allow
// (no admission in a step that preempted).
func (e *Engine) Step(now time.Duration) (end time.Duration, events []Event, ok bool) {
	e.events = e.events[:0]
	e.sched = e.sched[:0]
	if len(e.running) == 0 && e.wHead == len(e.waiting) {
		return now, nil, false
	}
	e.stepNo++
	budget := e.cfg.MaxBatchedTokens
	preempted := false

	// Decodes first.
	for _, s := range e.running {
		if budget == 0 {
			break
		}
		if s.state != stateRunning || !s.isDecode() {
			continue
		}
		if !e.grow(s, s.computed+1, &preempted, true) {
			continue
		}
		e.schedule(s, 1, true)
		budget--
	}
	// Then running partial prefills, in admission order.
	for _, s := range e.running {
		if budget == 0 {
			break
		}
		if s.state != stateRunning || s.stepNo == e.stepNo {
			continue
		}
		chunk := min(s.tokens()-s.computed, budget)
		if !e.grow(s, s.computed+chunk, &preempted, false) {
			// Nobody left to preempt: compute what the free blocks hold.
			chunk = min(chunk, (len(s.blocks)+e.pool.numFree)*e.cfg.BlockSize-s.computed)
			if chunk <= 0 || !e.grow(s, s.computed+chunk, &preempted, false) {
				continue
			}
		}
		e.schedule(s, chunk, false)
		budget -= chunk
	}
	// Then admissions.
	if !preempted {
		for budget > 0 && e.wHead < len(e.waiting) && len(e.running) < e.cfg.MaxNumSeqs {
			s := e.waiting[e.wHead]
			chunk, ok := e.admit(s, budget)
			if !ok {
				break
			}
			e.waiting[e.wHead] = nil
			e.wHead++
			s.state = stateRunning
			e.running = append(e.running, s)
			e.schedule(s, chunk, false)
			budget -= chunk
		}
		if e.wHead == len(e.waiting) {
			e.waiting, e.wHead = e.waiting[:0], 0
		} else if e.wHead > 64 && 2*e.wHead > len(e.waiting) {
			// Keep the queue from creeping through memory under a constant backlog.
			n := copy(e.waiting, e.waiting[e.wHead:])
			clear(e.waiting[n:])
			e.waiting, e.wHead = e.waiting[:n], 0
		}
	}
	if len(e.sched) == 0 && len(e.events) == 0 {
		// Unreachable while Submit rejects requests that cannot fit alone; never spin.
		return now, nil, false
	}

	// Step time.
	var prefillTokens, pairs, decodes, ctx int64
	for _, s := range e.sched {
		if s.decode {
			decodes++
			ctx += int64(s.computed + 1)
		} else {
			prefillTokens += int64(s.chunk)
			pairs += attentionPairs(s.computed, s.chunk)
		}
	}
	dt := e.cfg.Profile.stepTime(prefillTokens, pairs, decodes, ctx)
	end = now + dt
	e.stats.Busy += dt
	for i := range e.events { // preemptions happen at the end of the step, like the rest
		e.events[i].At = end
	}

	// Results.
	finished := false
	for _, s := range e.sched {
		s.computed += s.chunk
		if s.computed < s.tokens() {
			continue
		}
		s.out++
		e.stats.GenerationTokens++
		switch {
		case s.out == 1:
			e.stats.PromptTokens += int64(s.prompt)
			e.emit(EventFirstToken, s, end)
		case e.cfg.TokenEvents:
			e.emit(EventToken, s, end)
		}
		if s.out >= s.output {
			e.emit(EventFinished, s, end)
			e.stats.Finished++
			e.freeBlocks(s)
			s.state = stateDone
			finished = true
		}
	}
	if finished || preempted {
		kept := e.running[:0]
		for _, s := range e.running {
			switch s.state {
			case stateRunning:
				kept = append(kept, s)
			case stateDone:
				e.retire(s)
			}
		}
		clear(e.running[len(kept):])
		e.running = kept
	}
	return end, e.events, true
}

func (e *Engine) emit(kind EventKind, s *seq, at time.Duration) {
	e.events = append(e.events, Event{Kind: kind, ReqID: s.id, At: at, CachedTokens: s.hit, OutputTokens: s.out})
}

// grow gives s blocks for its first tokens tokens. When none are free it preempts the most
// recently admitted running request not yet scheduled in this step; when that would be s itself,
// it preempts s if selfOK (and returns false), else returns false leaving s as it was.
func (e *Engine) grow(s *seq, tokens int, preempted *bool, selfOK bool) bool {
	for {
		need := ceilDiv(tokens, e.cfg.BlockSize) - len(s.blocks)
		if need <= e.pool.numFree {
			s.blocks = e.alloc(s.blocks, need)
			return true
		}
		v := e.victim()
		if v == s && !selfOK {
			return false
		}
		e.preempt(v)
		*preempted = true
		if v == s {
			return false
		}
	}
}

// victim is the most recently admitted running request that this step has not scheduled.
func (e *Engine) victim() *seq {
	for i := len(e.running) - 1; i >= 0; i-- {
		if s := e.running[i]; s.state == stateRunning && s.stepNo != e.stepNo {
			return s
		}
	}
	return nil // unreachable: the caller itself is running and unscheduled
}

// preempt frees s's blocks and puts it at the front of the waiting queue (recompute mode).
func (e *Engine) preempt(s *seq) {
	e.freeBlocks(s)
	s.computed, s.cachedBlocks = 0, 0
	s.state = stateWaiting
	if e.wHead > 0 {
		e.wHead--
		e.waiting[e.wHead] = s
	} else {
		e.waiting = append(e.waiting, nil)
		copy(e.waiting[1:], e.waiting)
		e.waiting[0] = s
	}
	e.stats.Preemptions++
	e.events = append(e.events, Event{Kind: EventPreempted, ReqID: s.id, CachedTokens: s.hit, OutputTokens: s.out})
}

// admit looks up s's prefix, and when the hit plus a chunk of at most budget tokens fits in the
// free blocks, takes the blocks and returns the chunk.
func (e *Engine) admit(s *seq, budget int) (int, bool) {
	if e.slots != nil {
		return e.slotAdmit(s, budget)
	}
	bs := e.cfg.BlockSize
	maxHit := min(len(s.hashes), (s.tokens()-1)/bs)
	hits := e.hitIDs[:0]
	evictable := 0
	for _, h := range s.hashes[:maxHit] {
		id, ok := e.pool.byHash.get(h, e.pool.blocks)
		if !ok {
			break
		}
		hits = append(hits, id)
		if e.pool.blocks[id].ref == 0 {
			evictable++
		}
	}
	e.hitIDs = hits
	hit := len(hits) * bs
	chunk := min(s.tokens()-hit, budget)
	need := ceilDiv(hit+chunk, bs) - len(hits)
	if need > e.pool.numFree-evictable {
		return 0, false
	}
	for _, id := range hits {
		e.pool.touch(id)
		s.blocks = append(s.blocks, id)
	}
	s.blocks = e.alloc(s.blocks, need)
	s.computed, s.hit, s.cachedBlocks = hit, hit, len(hits)
	if !s.counted {
		s.counted = true
		e.stats.PrefixQueryTokens += int64(s.prompt)
		e.stats.PrefixHitTokens += int64(hit)
	}
	return chunk, true
}

// schedule records that s computes chunk tokens in this step, and offers the full prompt blocks
// those tokens complete to the prefix cache.
func (e *Engine) schedule(s *seq, chunk int, decode bool) {
	s.stepNo, s.chunk, s.decode = e.stepNo, chunk, decode
	e.sched = append(e.sched, s)
	upto := min(len(s.hashes), (s.computed+chunk)/e.cfg.BlockSize)
	if upto <= s.cachedBlocks {
		return
	}
	runStart := -1 // arena offset of the current BlockStored run
	var parent uint64
	for i := s.cachedBlocks; i < upto; i++ {
		if !e.pool.register(s.blocks[i], s.hashes[i]) {
			runStart = -1
			continue
		}
		if !e.cfg.KVEvents {
			continue
		}
		if runStart < 0 {
			parent = 0
			if i > 0 {
				parent = s.hashes[i-1]
			}
			runStart = len(e.arena)
			e.kv = append(e.kv, KVEvent{Kind: KVBlockStored, Parent: parent, BlockSize: e.cfg.BlockSize})
		}
		e.arena = append(e.arena, s.hashes[i])
		e.kv[len(e.kv)-1].Hashes = e.arena[runStart:len(e.arena):len(e.arena)]
		e.remStart = -1
	}
	s.cachedBlocks = upto
}

// alloc appends n free blocks to dst (the caller has checked that n are free), recording the
// evictions of the prefixes they held. It takes all n before evicting any: the evictions' hash
// table deletions, each likely a cache miss, then run back to back, and the CPU overlaps them.
func (e *Engine) alloc(dst []int32, n int) []int32 {
	start := len(dst)
	for range n {
		dst = append(dst, e.pool.take())
	}
	for _, id := range dst[start:] {
		h, evicted := e.pool.evict(id)
		if evicted && e.cfg.KVEvents {
			if e.remStart < 0 {
				e.remStart = len(e.arena)
				e.kv = append(e.kv, KVEvent{Kind: KVBlockRemoved, BlockSize: e.cfg.BlockSize})
			}
			e.arena = append(e.arena, h)
			e.kv[len(e.kv)-1].Hashes = e.arena[e.remStart:len(e.arena):len(e.arena)]
		}
	}
	return dst
}

// freeBlocks releases s's blocks tail first, so that its last blocks are evicted first (in a
// slot cache: frees its slot, which keeps what s computed).
func (e *Engine) freeBlocks(s *seq) {
	for i := len(s.blocks) - 1; i >= 0; i-- {
		e.pool.release(s.blocks[i])
	}
	s.blocks = s.blocks[:0]
	if e.slots != nil {
		e.slots.release(s, e.cfg.BlockSize)
	}
}

// DrainKVEvents returns the KV events recorded since the last call (Config.KVEvents), oldest
// first. The slice and its hashes are the caller's.
func (e *Engine) DrainKVEvents() []KVEvent {
	out := e.kv
	e.kv, e.arena, e.remStart = nil, nil, -1
	return out
}

// Stats returns the engine's counters and gauges now.
func (e *Engine) Stats() Stats {
	st := e.stats
	st.Running = len(e.running)
	st.Waiting = len(e.waiting) - e.wHead
	st.UsedBlocks = e.cfg.NumBlocks - e.pool.numFree
	st.CachedFreeBlocks = e.pool.cachedFree
	if e.slots != nil {
		st.CachedFreeBlocks = e.slots.freeBlocks(e.cfg.BlockSize)
	}
	return st
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }
