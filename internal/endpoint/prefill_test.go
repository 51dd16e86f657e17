package endpoint

import (
	"testing"
	"time"
)

// TestLearnPrefill: the fastest prefill seen, faded by half for every prefillFade since it was
// learned (counted at the next request); requests with no tokens or no TTFT change nothing.
func TestLearnPrefill(t *testing.T) {
	e := &Endpoint{}
	t0 := time.Unix(1000, 0).UnixNano()
	steps := []struct {
		tokens int
		ttft   time.Duration
		at     int64
		want   float64
	}{
		{0, time.Second, t0, 0},                       // no tokens to compute
		{1000, 0, t0, 0},                              // no TTFT
		{10_000, 2 * time.Second, t0, 5000},           // the first rate
		{1000, time.Second, t0, 5000},                 // slower (a queue ahead of it): the faster one kept
		{30_000, 3 * time.Second, t0, 10_000},         // faster
		{1000, time.Second, t0 + prefillFade, 5000},   // an hour later: 10,000 faded by half
		{1000, time.Second, t0 + 3*prefillFade, 1250}, // two more: by a quarter
		{1000, time.Second, t0 + 2*prefillFade, 1250}, // out of order: no fading back
		{4000, time.Second, t0 + 3*prefillFade, 4000}, // faster again
	}
	for i, s := range steps {
		e.LearnPrefill(s.tokens, s.ttft, s.at)
		if got := e.PrefillRate(); got != s.want {
			t.Errorf("step %d (%d tokens in %v): rate %v, want %v", i, s.tokens, s.ttft, got, s.want)
		}
	}
}
