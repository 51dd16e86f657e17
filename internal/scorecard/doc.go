// Package scorecard runs every routing policy over a fixed matrix of workloads and fleets in
// virtual time (package des) and scores each one per cell: its prefix-cache hit rate as a
// fraction of the pooled-LRU bound, its TTFT mean, p50 and p99 relative to the best other
// policy's, and its load imbalance; and it checks one policy, prefix-aware by default, against
// the targets of issue #16. It is what `kvroute simulate --scorecard` prints.
//
// The matrix holds the workload shapes that published router benchmarks use (inference-perf's
// shared_prefix, SGLang's generated-shared-prefix with and without Zipf group popularity, the
// Mooncake conversation trace, a tool-agent workload shaped after the Mooncake toolagent trace,
// agentic sessions over a fleet that doubles mid-run, a mixed-hardware fleet, a fleet with one
// slow instance, prompts that share nothing), each at three loads. A cell is deterministic per
// seed.
package scorecard
