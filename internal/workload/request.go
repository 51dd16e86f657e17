package workload

import "time"

// Request is one request of a workload: a prompt as a sequence of blocks plus lengths.
// Equal block ids at the same position mean an equal prompt prefix up to and including that
// block (the Mooncake trace's hash_ids convention).
type Request struct {
	ID      int
	Arrival time.Duration // from the start of the workload, before any speed-up
	Session string        // conversation id for multi-turn workloads, "" otherwise
	Blocks  []uint64
	// BlockTokens is the number of tokens each block stands for; the last block may be partial.
	BlockTokens  int
	PromptTokens int
	OutputTokens int
	// Whole is true when the client asks for the answer whole ("stream": false): the router
	// sees no first token, only the end.
	Whole bool
}
