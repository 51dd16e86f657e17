// Package simserver puts the engine model of package engine behind the HTTP API, the metrics
// and the KV events of a vLLM server, in real (optionally scaled) time, so that the router, the
// load generator, the demo and the end-to-end tests run against something that behaves like a
// real instance: a prompt whose prefix is cached gets its first token sooner, a busy instance
// queues.
//
// Each Instance owns one engine and one driver goroutine. The driver keeps the engine's model
// clock; model time m happens at wall time start + m x TimeScale. Requests are stamped with
// their arrival in model time when the handler receives them and join the engine at the first
// step that starts after they arrived; each step's events are delivered when the wall clock
// reaches the step's end. When the machine cannot keep up, the engine runs behind the wall clock
// and catches up without sleeping: the model stays exact (every reported duration is in model
// time) and the client sees the lag.
//
// Tokens come from a tokenizer-free estimate (prefix.EstimateTokens, shared with the router):
// the canonical prompt text (package openai) is cut into blocks of BlockSize x 4 bytes whose
// xxhash keys the engine chains into block hashes, so equal text prefixes share cache blocks.
// Each 4 bytes are one token whose id (TokenID) is a hash of them: BlockStored events carry the
// ids of the blocks they store, as vLLM's do.
//
// A completion whose prompt is a list is, as on vLLM, one engine request per prompt (each with
// its own cache lookup and first token) answered with one choice per prompt and summed usage.
package simserver
