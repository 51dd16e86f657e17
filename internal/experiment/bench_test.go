package experiment

import (
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/internal/loadgen"
	"github.com/kvroute/kvroute/internal/workload"
)

func TestConstantRateAndScheduledRate(t *testing.T) {
	reqs := constantRate(make([]workload.Request, 5), 4) // every 250 ms
	var at []time.Duration
	for _, r := range reqs {
		at = append(at, r.Arrival)
	}
	want := []time.Duration{0, 250 * time.Millisecond, 500 * time.Millisecond, 750 * time.Millisecond, time.Second}
	if diff := cmp.Diff(want, at); diff != "" {
		t.Errorf("arrivals (-want +got):\n%s", diff)
	}
	if got := scheduledRate(workloadItems(reqs)); got != 4 {
		t.Errorf("scheduled rate %v, want 4 (4 gaps in 1 s)", got)
	}
	if got := scheduledRate(workloadItems(reqs[:1])); got != 0 {
		t.Errorf("one request: rate %v, want 0", got)
	}
}

// TestRateNote: "asked" is --rate, not the schedule's own rate, which a Poisson draw of few
// requests puts far from it; the sending is judged against the schedule, in words ("0.03%
// below the schedule", not "-0.03% of the schedule").
func TestRateNote(t *testing.T) {
	for _, tt := range []struct {
		name string
		e    BenchExtra
		want string
	}{
		{"few Poisson arrivals", BenchExtra{RequestedRate: 50, AskedRate: 120.4, AchievedRate: 120.28},
			" (asked 50.0, scheduled 120.4, sent 0.10% below the schedule: the random arrivals of 5 requests come to a rate far from the one asked; more requests come closer)"},
		{"many Poisson arrivals", BenchExtra{RequestedRate: 50, AskedRate: 51, AchievedRate: 51},
			" (asked 50.0, scheduled 51.0, sent on the schedule)"},
		{"QA's run: a little slow", BenchExtra{RequestedRate: 5, AskedRate: 4.2, AchievedRate: 4.2 * (1 - 0.0003)},
			" (asked 5.0, scheduled 4.2, sent 0.03% below the schedule: the random arrivals of 5 requests come to a rate far from the one asked; more requests come closer)"},
		{"constant arrivals", BenchExtra{RequestedRate: 500, AskedRate: 500, AchievedRate: 499},
			" (asked 500.0, sent 0.20% below the schedule)"},
		{"one request", BenchExtra{RequestedRate: 2, AchievedRate: 0}, " (asked 2.0)"},
		{"a trace's own times", BenchExtra{AskedRate: 4, AchievedRate: 4.04}, " (scheduled 4.0, sent 1.00% above the schedule)"},
		{"concurrency", BenchExtra{AchievedRate: 30}, ""},
	} {
		if got := rateNote(tt.e, 5); got != tt.want {
			t.Errorf("%s: got %q\nwant %q", tt.name, got, tt.want)
		}
	}
}

// TestReportRecords: live times divided by the time scale give model time; endpoints are
// numbered in order of first appearance.
func TestReportRecords(t *testing.T) {
	recs := []loadgen.Record{
		{Index: 0, Sent: 2 * time.Second, TTFT: 200 * time.Millisecond, E2E: time.Second, Endpoint: "b", CachedTokens: -1},
		{Index: 1, Sent: 4 * time.Second, TTFT: 0, E2E: 2 * time.Second, Endpoint: "a", CachedTokens: 16},
		{Index: 2, Sent: 6 * time.Second, TTFT: 100 * time.Millisecond, E2E: 2 * time.Second, Endpoint: "b"},
	}
	got, n := reportRecords("p", recs, 2)
	if n != 2 {
		t.Errorf("%d endpoints, want 2", n)
	}
	type rec struct {
		ID                       string
		Arrival, First, Finish   time.Duration
		EndpointID, CachedTokens int
	}
	var out []rec
	for _, r := range got {
		out = append(out, rec{r.ID, r.Arrival, r.FirstToken, r.Finish, r.EndpointID, r.CachedTokens})
	}
	want := []rec{
		{"0", time.Second, 1100 * time.Millisecond, 1500 * time.Millisecond, 0, 0}, // unknown cached tokens count as 0
		{"1", 2 * time.Second, 0, 3 * time.Second, 1, 16},                          // no first token
		{"2", 3 * time.Second, 3050 * time.Millisecond, 4 * time.Second, 0, 0},
	}
	if diff := cmp.Diff(want, out); diff != "" {
		t.Errorf("records (-want +got):\n%s", diff)
	}
}

// An interrupted run's figures are of the requests that finished, whichever they are: here
// the second request, long, is cancelled in flight at the interrupt while the third and fourth
// had finished. The schedule's rate and the infinite-cache bound are those of requests 1, 3
// and 4 (2 gaps over 1 s; no prompt repeated), not of the first three (2 over 0.3 s, and the
// second repeating the first: a bound of 1/3).
func TestBenchInterruptedOutOfOrder(t *testing.T) {
	trace := filepath.Join(t.TempDir(), "trace.jsonl")
	lines := `{"timestamp":0,"input_length":1024,"output_length":1,"hash_ids":[1,2]}
{"timestamp":100,"input_length":1024,"output_length":1,"hash_ids":[1,2]}
{"timestamp":300,"input_length":1024,"output_length":1,"hash_ids":[3,4]}
{"timestamp":1000,"input_length":1024,"output_length":1,"hash_ids":[5,6]}
`
	if err := os.WriteFile(trace, []byte(lines), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, interrupt := context.WithCancel(t.Context())
	defer interrupt()
	// The stand-in for loadgen.Run: requests 0, 2 and 3 finish, then Ctrl-C cancels request 1.
	run := func(ctx context.Context, cfg loadgen.Config, items []loadgen.Item) (loadgen.Result, error) {
		recs := make([]loadgen.Record, len(items))
		for _, i := range []int{0, 2, 3} {
			recs[i] = loadgen.Record{Index: i, Class: loadgen.ClassOK, Scheduled: items[i].At, Sent: items[i].At,
				TTFT: 10 * time.Millisecond, E2E: 20 * time.Millisecond, PromptTokens: 1024, OutputTokens: 1}
			cfg.OnRecord(recs[i])
		}
		interrupt()
		<-ctx.Done()
		recs[1] = loadgen.Record{Index: 1, Class: loadgen.ClassCanceled, Scheduled: items[1].At, Sent: items[1].At,
			E2E: time.Second, PromptTokens: 1024, CachedTokens: -1, Err: "context canceled"}
		cfg.OnRecord(recs[1])
		return loadgen.Result{Records: recs, Elapsed: 1100 * time.Millisecond}, fmt.Errorf("loadgen: run cancelled: %w", ctx.Err())
	}
	rep, err := Bench(ctx, BenchOptions{
		Target: "http://127.0.0.1:1", Model: "m", Trace: trace, Arrival: "poisson",
		MaxInFlight: 8, Timeout: time.Minute, Log: io.Discard, run: run,
	})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(&BenchStopped{Interrupted: true, Planned: 4, Sent: 4, Canceled: 1}, rep.Stopped); diff != "" {
		t.Errorf("stopped (-want +got):\n%s", diff)
	}
	if got := rep.Scenario.Requests; got != 3 {
		t.Errorf("%d requests in the report, want the 3 that finished", got)
	}
	if got := rep.Bench[0].AskedRate; math.Abs(got-2) > 1e-9 {
		t.Errorf("scheduled rate %v, want 2 (requests 1, 3 and 4: 2 gaps in 1 s)", got)
	}
	if got := rep.Bounds.InfiniteCacheHitRate; got != 0 {
		t.Errorf("infinite-cache bound %v, want 0 (requests 1, 3 and 4 share nothing)", got)
	}
}
