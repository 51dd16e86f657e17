package report

import (
	"testing"
	"time"
)

// BenchmarkSummarize summarises 12,000 records (the Mooncake trace's size) over 8 instances.
func BenchmarkSummarize(b *testing.B) {
	recs := make([]Record, 12000)
	for i := range recs {
		at := time.Duration(i) * 300 * time.Millisecond
		recs[i] = Record{
			EndpointID: i % 8, Arrival: at, FirstToken: at + time.Duration(100+i%977)*time.Millisecond,
			Finish: at + time.Duration(5000+i%3001)*time.Millisecond, PromptTokens: 12000, CachedTokens: i % 5000,
			OutputTokens: 1 + i%700,
		}
	}
	busy := make([]time.Duration, 8)
	for i := range busy {
		busy[i] = time.Duration(1000+i) * time.Second
	}
	b.ReportAllocs()
	for b.Loop() {
		r := Summarize("p", recs, busy)
		if r.Completed != len(recs) {
			b.Fatalf("completed %d", r.Completed)
		}
	}
}
