package main

import (
	"fmt"
	"io"
)

// What the columns of the verbs' tables mean, printed after the flags in -h, so that a table
// can be read without docs/results.md, whose definitions these follow. No line starts with
// "  -" and a letter: test/docs reads such lines of -h as flags.

// summaryColumns explains the table that simulate, bench and demo print (report.WriteTable).
const summaryColumns = `
columns of the table (a row per policy, or per bench run; docs/results.md):
  hit rate       the engines' prefix-cache hits over prompt tokens ("unknown": no cached
                 tokens reported)
  TTFT mean ms   time to first token in milliseconds: its mean, then p50, p90 and p99
  TPOT p50 ms    median time per output token after the first
  tok/s          output tokens per second, from the first arrival to the last finish
  imbalance      max / mean of the instances' busy time (1.00: evenly loaded)
  completed      requests that completed; failed: requests that ended in an error
  "-" stands for a figure with nothing to measure (no request completed).
  hit-rate bounds (above the table): the hit rate of one unbounded cache (infinite cache) and
  of one LRU cache the size of the whole fleet's KV cache (pooled LRU); no router beats them
  from cold caches
`

// simulateColumns adds what --scorecard and --autoscale print.
const simulateColumns = `
with --scorecard, each cell's table (policy against policy on one workload, fleet and load):
  of bound       the policy's hit rate over the pooled-LRU bound
  mean/best      its TTFT mean over the best (lowest) of the other policies'; p50/best and
                 p99/best the same for p50 and p99
  imbalance      max / mean of the instances' busy fractions, each over its time in the fleet

with --autoscale, each policy's timeline (a row every= apart; the summary above it numbers
engines from 0, as --kill does):
  time           the look's virtual time, m:ss
  engines        instances serving; asked: serving or on their way
  demand tok/s   prompt tokens per second the engines computed (not found in their caches),
                 averaged over window=
  rate tok/s     one engine's prefill rate; prefill: demand over rate, summed over the engines
  KV usage       the engines' mean KV-cache usage, 0 to 1
  load           engines' worth of work: per engine the larger of its prefill share and its KV
                 usage, summed; saturation: load / engines
  wanted         instances the autoscaler asks for at this look
  requests       requests that arrived since the row before; failed: how many of them failed
  TTFT p50 ms    the others' median time to first token; p90: their 90th percentile
`

// benchColumns adds the lines under bench's table.
const benchColumns = `
under the table, one line per run:
  sent           requests per second sent (and the rate asked or scheduled)
  send lag ms    how late requests were sent against their schedule: p50, p99
  ITL ms         inter-token latency, the time between two streamed tokens: p50, p90, p99
  errors         failed requests by kind, each with its first message
Against a live target, imbalance is "-" where the responses do not name the backend that served
(--endpoint-header), and the pooled-LRU bound is unknown: the fleet's KV cache is not known.
`

// demoColumns adds the table --compare-simulate prints.
const demoColumns = `
with --compare-simulate, live against simulated:
  hit live, hit sim   the hit rate over HTTP and in kvroute simulate; delta: live minus sim
  TTFT p50 live, sim  the median TTFT in milliseconds; ratio: live over sim
  agree               yes when both differences are within the tolerance above the table
`

// planColumns explains plan's table.
const planColumns = `
columns of the table (one row per policy):
  instances          the fewest that meet the SLO ("> N": not met with --max-instances N)
  TTFT p50 ms, p90 ms, hit rate
                     measured on that fleet (on --max-instances where the SLO is not met)
  one fewer: p90 ms  TTFT p90 on one instance fewer, which misses the SLO; failed: the
                     requests that failed there ("-": no fleet below)
`

// columnsHelp returns a verbHelp.more that prints texts, in order, and then more (nil: nothing).
func columnsHelp(more func(io.Writer), texts ...string) func(io.Writer) {
	return func(w io.Writer) {
		for _, t := range texts {
			fmt.Fprint(w, t)
		}
		if more != nil {
			more(w)
		}
	}
}
