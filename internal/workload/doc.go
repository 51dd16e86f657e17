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
//
// Traces in other forms (OpenAI request bodies, ShareGPT, Azure and BurstGPT CSV, Mooncake
// traces in other units or block sizes) are named when read, and converted by ConvertTrace
// (`kvroute trace convert`). Mooncake lines of the usual form are read by a small parser of our
// own (mooncakeRecord.parseUsual), anything else by encoding/json: measured on a 114 MB trace of
// 397,023 requests, the reader's allocations fell from 565.9 to 307.9 MB and its time from
// 3.2-5.3 s to 1.1-1.6 s (BenchmarkReadMooncake: 15,023 allocations a run to 39), and
// FuzzParseUsual checks that both read every line alike.
package workload
