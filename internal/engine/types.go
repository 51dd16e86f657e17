package engine

import "time"

// Request is one prompt submitted to the engine.
type Request struct {
	ID           string
	PromptTokens int
	// OutputTokens is how many tokens to generate (at least 1).
	OutputTokens int
	// BlockKeys holds the content key of each full block of BlockSize prompt tokens, in order
	// (like vLLM's tuple of token ids); len(BlockKeys) <= PromptTokens/BlockSize, and missing
	// trailing keys mean those blocks are never cacheable. The engine chains them into block
	// hashes itself, mixing Salt into the first one.
	BlockKeys []uint64
	// Salt is the request's cache_salt: requests with different salts never share cache blocks.
	Salt string
}

// EventKind says what happened to a request.
type EventKind int

const (
	// EventFirstToken: prefill finished and the first output token was produced.
	EventFirstToken EventKind = iota + 1
	// EventToken: one more output token (only with Config.TokenEvents).
	EventToken
	// EventFinished: the request produced all its tokens and left the engine.
	EventFinished
	// EventPreempted: the request lost its blocks and went back to the waiting queue.
	EventPreempted
)

// Event is something that happened to a request at time At (the end of the step that did it).
type Event struct {
	Kind  EventKind
	ReqID string
	At    time.Duration
	// CachedTokens is the prefix-cache hit of the request's (last) scheduling, in tokens.
	CachedTokens int
	// OutputTokens produced so far.
	OutputTokens int
}

// KVEventKind is the kind of a KV-cache event, as vLLM publishes them.
type KVEventKind int

const (
	// KVBlockStored: blocks entered the prefix cache (their prefill was scheduled).
	KVBlockStored KVEventKind = iota + 1
	// KVBlockRemoved: cached blocks were evicted to hold new tokens.
	KVBlockRemoved
	// KVAllBlocksCleared: the whole prefix cache was dropped (the engine model never does this;
	// the kind exists for consumers of real engines' events).
	KVAllBlocksCleared
)

// KVEvent is a change to the set of cached blocks (vLLM's BlockStored / BlockRemoved /
// AllBlocksCleared).
type KVEvent struct {
	Kind   KVEventKind
	Hashes []uint64
	// Parent is the hash of the block before Hashes[0] (BlockStored), 0 for none.
	Parent    uint64
	BlockSize int
}

// Stats are the engine's counters, as vLLM counts them.
type Stats struct {
	Running, Waiting  int
	UsedBlocks        int // blocks held by running requests
	CachedFreeBlocks  int // freed blocks still holding a reusable prefix
	TotalBlocks       int
	PrefixQueryTokens int64 // cumulative prompt tokens looked up in the prefix cache
	PrefixHitTokens   int64 // cumulative prompt tokens found there
	PromptTokens      int64 // cumulative prompt tokens computed or cached
	GenerationTokens  int64
	Preemptions       int64
	Finished          int64
	Busy              time.Duration // total time spent in steps
}
