// Package workload describes what a fleet is asked to do: requests as sequences of prompt
// blocks plus lengths and arrival times. It reads the Mooncake JSONL trace, generates synthetic
// workloads (shared-prefix, multi-turn, prefix-repetition, tool-agent, unique), re-times arrivals (speed-up,
// Poisson), turns blocks into engine block keys and into deterministic prompt text, and computes
// the prefix-cache hit rates that bound what any routing policy can reach.
//
// Block ids follow the Mooncake convention: equal ids at the same position mean an equal prompt
// prefix up to and including that block. Generated workloads build their ids by hashing each
// block's content identity chained with the previous block's id, so the convention holds for
// them too. Everything here is deterministic under a seed.
package workload
