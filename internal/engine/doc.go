// Package engine models one vLLM-like inference engine in virtual time: paged KV blocks of
// BlockSize tokens, a prefix cache keyed by chained block hashes (the request's cache salt mixed
// into the first block only), reference-counted blocks whose freed copies stay cached in an LRU
// free queue until a new block is needed, a FCFS waiting queue, continuous batching with chunked
// prefill, recompute preemption when blocks run out, and a step time taken from a calibrated
// Profile. A profile with CacheSlots models ollama's cache instead: that many slots, each
// holding one whole sequence, picked by ollama's own rule (slots.go); batching and step times
// are the same.
//
// The engine is driven by its caller's clock: Submit and Step take the time since the engine's
// start, Step returns when the batch step ends and what happened then. It starts no goroutines,
// never sleeps and never reads the wall clock, so that the fleet simulator (package des) and the
// HTTP engine simulator (package simserver) drive the same code, and a test can work the expected
// answer out by hand. An Engine is not safe for concurrent use; callers serialise.
//
// Modelling choices where vLLM leaves room or where the model knows less than an engine:
//   - Only prompt blocks with a content key (Request.BlockKeys) are cacheable; blocks of
//     generated tokens and a prompt's partial last block never are.
//   - Blocks are offered to the cache when their prefill is scheduled (as vLLM does), so a request
//     admitted later in the same step can hit them. When another block already caches the same
//     hash, the new copy stays uncached (vLLM keeps both; the hit set is the same).
//   - PrefixQueryTokens and PrefixHitTokens count a request once, at its first admission; a
//     request recomputed after preemption is not counted again.
//   - The first output token is reported as EventFirstToken only; EventToken (with
//     Config.TokenEvents) reports the second and later ones.
//
// The steady state allocates nothing per block: block state lives in preallocated slices, the
// free queue is an intrusive doubly-linked list over block ids, and the prefix cache is an
// open-addressing table from block hash to block id.
package engine
