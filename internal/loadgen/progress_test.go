package loadgen

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// simulated is a run played on paper: each record with the time its request ends, in the order
// they end, and the time the last one ends.
type simulated struct {
	recs []Record
	ends []time.Duration
	end  time.Duration
}

func (s *simulated) sortByEnd() {
	idx := make([]int, len(s.recs))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int { return int(s.ends[a] - s.ends[b]) })
	recs, ends := make([]Record, len(idx)), make([]time.Duration, len(idx))
	for k, i := range idx {
		recs[k], ends[k] = s.recs[i], s.ends[i]
	}
	s.recs, s.ends = recs, ends
	s.end = ends[len(ends)-1]
}

// openLoop plays requests due at ats, each taking its e2e.
func openLoop(ats []time.Duration, e2e func(i int) time.Duration) *simulated {
	s := &simulated{}
	for i, at := range ats {
		d := e2e(i)
		s.recs = append(s.recs, Record{Index: i, Scheduled: at, Sent: at, E2E: d})
		s.ends = append(s.ends, at+d)
	}
	s.sortByEnd()
	return s
}

// closedLoop plays n requests on workers that each take the next as soon as they are free.
func closedLoop(n, workers int, e2e func(i int) time.Duration) *simulated {
	s := &simulated{}
	free := make([]time.Duration, workers)
	for i := range n {
		w := slices.Index(free, slices.Min(free))
		at, d := free[w], e2e(i)
		s.recs = append(s.recs, Record{Index: i, Scheduled: at, Sent: at, E2E: d})
		s.ends = append(s.ends, at+d)
		free[w] = at + d
	}
	s.sortByEnd()
	return s
}

// etaAt feeds p the records of s that end by frac of the run, on clock, and returns the ETA of
// the last line p printed then, and the time the run really had left.
func etaAt(t *testing.T, p *Progress, out *strings.Builder, clock *time.Time, start time.Time, s *simulated, frac float64) (got, want time.Duration, text string) {
	t.Helper()
	at := time.Duration(frac * float64(s.end))
	for i, r := range s.recs {
		if s.ends[i] > at {
			break
		}
		*clock = start.Add(s.ends[i])
		p.Record(r)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	last := lines[len(lines)-1]
	_, text, ok := strings.Cut(last, "eta ")
	if !ok {
		t.Fatalf("no eta in %q", last)
	}
	want = s.end - clock.Sub(start)
	if text == "?" {
		return -1, want, text
	}
	got, err := time.ParseDuration(text)
	if err != nil {
		t.Fatalf("eta %q in %q: %v", text, last, err)
	}
	return got, want, text
}

// A run's ETA early on came from the completion rate since the start, which counts the first
// requests' whole time as a wait: "eta 48s" for a run that took 8 s. With the pacing known it
// is the schedule left plus a request's time, and a tenth into the run it is within 25 % of the
// time the run really had left.
func TestProgress_ETAEarly(t *testing.T) {
	const n = 1000
	rng := rand.New(rand.NewPCG(1, 2))
	jitter := func(base, spread time.Duration) func(int) time.Duration {
		e := make([]time.Duration, n)
		for i := range e {
			e[i] = base + time.Duration(rng.Float64()*float64(spread))
		}
		return func(i int) time.Duration { return e[i] }
	}
	constant := make([]time.Duration, n) // --rate 100 --arrival constant
	poisson := make([]time.Duration, n)  // --rate 100
	slowFast := make([]time.Duration, n) // a trace: 10/s for 20 s, then 200/s
	var at time.Duration
	for i := range n {
		constant[i] = time.Duration(i) * 10 * time.Millisecond
		at += time.Duration(rng.ExpFloat64() * float64(10*time.Millisecond))
		poisson[i] = at
		if i < 200 {
			slowFast[i] = time.Duration(i) * 100 * time.Millisecond
		} else {
			slowFast[i] = 20*time.Second + time.Duration(i-200)*5*time.Millisecond
		}
	}
	cases := []struct {
		name string
		run  *simulated
		pace Pacing
	}{
		{"open loop, evenly spaced", openLoop(constant, jitter(400*time.Millisecond, 200*time.Millisecond)), Pacing{LastDue: constant[n-1]}},
		{"open loop, Poisson", openLoop(poisson, jitter(500*time.Millisecond, time.Second)), Pacing{LastDue: poisson[n-1]}},
		{"open loop, slow then fast", openLoop(slowFast, jitter(time.Second, 500*time.Millisecond)), Pacing{LastDue: slowFast[n-1]}},
		{"closed loop of 8", closedLoop(n/5, 8, jitter(800*time.Millisecond, 400*time.Millisecond)), Pacing{Concurrency: 8}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Unix(1000, 0)
			clock := start
			var out strings.Builder
			p := NewProgress(&out, ProgressLines, "bench", len(tc.run.recs), time.Nanosecond, func() time.Time { return clock })
			p.SetPacing(tc.pace)
			got, want, text := etaAt(t, p, &out, &clock, start, tc.run, 0.1)
			t.Logf("eta %s, left %v", text, want)
			if got < 0 || math.Abs(float64(got-want)) > 0.25*float64(want) {
				t.Errorf("a tenth into the run, eta %s; the run had %v left", text, want.Round(time.Millisecond))
			}
		})
	}
}

// Without the pacing the ETA comes from the completion rate since the first completion, and
// shows "?" until 10 requests finished.
func TestProgress_ETAFromRate(t *testing.T) {
	ats := make([]time.Duration, 1000)
	for i := range ats {
		ats[i] = time.Duration(i) * 10 * time.Millisecond
	}
	run := openLoop(ats, func(int) time.Duration { return 500 * time.Millisecond })
	start := time.Unix(1000, 0)
	clock := start
	var out strings.Builder
	p := NewProgress(&out, ProgressLines, "bench", len(ats), time.Nanosecond, func() time.Time { return clock })
	for i := range minRateSamples - 1 {
		clock = start.Add(run.ends[i])
		p.Record(run.recs[i])
	}
	if !strings.HasSuffix(out.String(), "eta ?\n") {
		t.Errorf("after %d requests: %q, want eta ?", minRateSamples-1, out.String())
	}
	got, want, text := etaAt(t, p, &out, &clock, start, run, 0.1)
	if got < 0 || math.Abs(float64(got-want)) > 0.25*float64(want) {
		t.Errorf("a tenth into the run, eta %s; the run had %v left", text, want)
	}
}

// The bar shows the ETA in its description, not the bar's own prediction.
func TestProgress_BarETA(t *testing.T) {
	start := time.Unix(1000, 0)
	clock := start
	var out strings.Builder
	p := NewProgress(&out, ProgressBar, "bench", 3, time.Second, func() time.Time { return clock })
	p.SetPacing(Pacing{LastDue: 10 * time.Second})
	clock = start.Add(2 * time.Second)
	p.Record(Record{Scheduled: 0, Sent: 0, E2E: 2 * time.Second})
	if !strings.Contains(out.String(), "bench (eta 10s)") {
		t.Errorf("bar %q: want the description bench (eta 10s): due at 10 s, 2 s a request, 2 s in", out.String())
	}
}

func TestPacingOf(t *testing.T) {
	its := []Item{{At: 0}, {At: 3 * time.Second}, {At: 7 * time.Second}, {At: 5 * time.Second}}
	got := []Pacing{
		PacingOf(Config{}, its),
		PacingOf(Config{Duration: 6 * time.Second}, its),
		PacingOf(Config{Concurrency: 4, Duration: time.Minute}, its),
	}
	want := []Pacing{
		{LastDue: 7 * time.Second},
		{LastDue: 5 * time.Second, Duration: 6 * time.Second},
		{Concurrency: 4, Duration: time.Minute},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("pacing (-want +got):\n%s", diff)
	}
}
