// Package report turns per-request records into the figures we compare routing policies by:
// hit rate, TTFT / TPOT / end-to-end latency percentiles, throughput and load imbalance. It
// renders them as an aligned text table or as JSON.
//
// It knows nothing of where the records came from: `kvroute simulate` fills them from the
// discrete-event simulator in virtual time, `kvroute bench` from live HTTP requests.
package report
