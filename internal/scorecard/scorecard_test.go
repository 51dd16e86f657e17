package scorecard

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/kvroute/kvroute/internal/des"
	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/report"
	"github.com/kvroute/kvroute/internal/workload"
)

// small is a matrix that runs in a second: shared prompts on two small instances, the same
// on a fleet that doubles at half time, and a trace that is not there.
func small(t *testing.T) []Scenario {
	return []Scenario{
		{Name: "small shared", Workload: "shared-prefix:groups=6,prompts=4,system=512,question=64,output=8", Fleet: []Group{{Count: 2, Profile: "llama3-8b-h100-tp1"}}},
		{Name: "small scale-up", Workload: "multi-turn:conversations=6,min-turns=2,max-turns=4,rate=2", Fleet: []Group{{Count: 4, Profile: "llama3-8b-h100-tp1"}}, Start: 2},
		{Name: "small trace", Fleet: []Group{{Count: 2, Profile: "llama3-8b-h100-tp1"}}},
	}
}

func runSmall(t *testing.T, seeds ...uint64) *Scorecard {
	t.Helper()
	sc, err := Run(context.Background(), Options{
		Matrix: small(t), Trace: filepath.Join("absent", "trace.jsonl"), Seeds: seeds,
		Policies: "prefix-aware,round-robin,least-request", Loads: []float64{0.5, 0.9}, Parallel: 2,
	})
	if err != nil {
		t.Fatal(err)
	}
	return sc
}

func TestRunCellsAndScores(t *testing.T) {
	sc := runSmall(t, 1, 2)
	if len(sc.Cells) != 3*2*2 {
		t.Fatalf("%d cells, want 3 scenarios x 2 loads x 2 seeds", len(sc.Cells))
	}
	var order []string
	for _, c := range sc.Cells {
		order = append(order, c.Scenario)
		if c.Scenario == "small trace" {
			if !strings.Contains(c.Skipped, "absent/trace.jsonl") || c.Scores != nil || c.Verdict != nil {
				t.Errorf("trace cell: skipped %q, %d scores, verdict %v; want skipped with the path", c.Skipped, len(c.Scores), c.Verdict)
			}
			continue
		}
		if c.Skipped != "" || len(c.Scores) != 3 || c.Verdict == nil {
			t.Fatalf("%s: skipped %q, %d scores, verdict %v", c.Scenario, c.Skipped, len(c.Scores), c.Verdict)
		}
		if math.Abs(c.OfferedLoad-c.Load) > 1e-9 {
			t.Errorf("%s: offered load %v, want %v", c.Scenario, c.OfferedLoad, c.Load)
		}
		for i, s := range c.Scores {
			if s.Completed != c.Requests || s.Failed != 0 {
				t.Errorf("%s %s: %d completed, %d failed of %d", c.Scenario, s.Policy, s.Completed, s.Failed, c.Requests)
			}
			best := math.Inf(1)
			for j, o := range c.Scores {
				if j != i {
					best = min(best, o.TTFT.P99)
				}
			}
			if want := s.TTFT.P99 / best; math.Abs(s.P99Ratio-want) > 1e-12 {
				t.Errorf("%s %s: p99 ratio %v, want %v", c.Scenario, s.Policy, s.P99Ratio, want)
			}
			if want := s.HitRate / c.Bounds.PooledLRUHitRate; math.Abs(s.HitOfBound-want) > 1e-12 {
				t.Errorf("%s %s: hit of bound %v, want %v", c.Scenario, s.Policy, s.HitOfBound, want)
			}
			if s.E2E.Mean <= s.TTFT.Mean || s.E2E.P99 < s.TTFT.P99 {
				t.Errorf("%s %s: whole time %+v, TTFT %+v; want the whole time longer", c.Scenario, s.Policy, s.E2E, s.TTFT)
			}
		}
	}
	want := []string{"small shared", "small shared", "small scale-up", "small scale-up", "small trace", "small trace"}
	if diff := cmp.Diff(append(want, want...), order); diff != "" {
		t.Errorf("cell order, seed by seed (-want +got):\n%s", diff)
	}
	if sc.WallSeconds <= 0 || sc.RunSeconds <= 0 {
		t.Errorf("wall %v s, simulations %v s: want both measured", sc.WallSeconds, sc.RunSeconds)
	}
}

// TestRunProgress: the scenario skipped for its missing trace is told first, then each cell
// that ran once, with the time left; the scorecard is the one a run without progress gives.
func TestRunProgress(t *testing.T) {
	var log bytes.Buffer
	o := Options{
		Matrix: small(t), Trace: filepath.Join("absent", "trace.jsonl"), Seeds: []uint64{5},
		Policies: "round-robin,least-request", Loads: []float64{0.5, 0.9}, Parallel: 2,
	}
	quiet, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	o.Progress = &log
	told, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(quiet.Cells, told.Cells, cmpopts.IgnoreFields(Score{}, "WallSeconds")); diff != "" {
		t.Errorf("cells with progress told (-without +with):\n%s", diff)
	}
	lines := strings.Split(strings.TrimSuffix(log.String(), "\n"), "\n")
	if len(lines) != 1+4 {
		t.Fatalf("%d lines, want the skipped scenario and 4 cells (2 scenarios x 2 loads):\n%s", len(lines), log.String())
	}
	if want := "scorecard: small trace skipped: trace not found: " + filepath.Join("absent", "trace.jsonl"); !strings.HasPrefix(lines[0], want) {
		t.Errorf("first line %q, want it to begin %q", lines[0], want)
	}
	var cells []string
	for i, l := range lines[1:] {
		if !strings.HasPrefix(l, fmt.Sprintf("scorecard: %d/4 cells: small ", i+1)) || !strings.Contains(l, " elapsed, ") {
			t.Errorf("line %q: want cell %d of 4 told, with the time elapsed", l, i+1)
		}
		scenario, _, _ := strings.Cut(strings.TrimPrefix(l, fmt.Sprintf("scorecard: %d/4 cells: ", i+1)), " (")
		cells = append(cells, scenario)
	}
	slices.Sort(cells)
	want := []string{"small scale-up, load 0.5, seed 5", "small scale-up, load 0.9, seed 5", "small shared, load 0.5, seed 5", "small shared, load 0.9, seed 5"}
	if diff := cmp.Diff(want, cells); diff != "" {
		t.Errorf("cells told (-want +got):\n%s", diff)
	}
	if !strings.Contains(lines[3], "about ") || !strings.HasSuffix(lines[4], "all done") {
		t.Errorf("want an estimate of the time left before the last cell, all done after it:\n%s", log.String())
	}
}

func TestRunDeterministic(t *testing.T) {
	a, b := runSmall(t, 3), runSmall(t, 3)
	ignore := cmpopts.IgnoreFields(Score{}, "WallSeconds")
	if diff := cmp.Diff(a.Cells, b.Cells, ignore); diff != "" {
		t.Errorf("two runs with seed 3 differ (-first +second):\n%s", diff)
	}
	c := runSmall(t, 4)
	if cmp.Equal(a.Cells[0].Scores, c.Cells[0].Scores, ignore) {
		t.Errorf("seeds 3 and 4 give the same scores")
	}
}

func TestRunErrors(t *testing.T) {
	tests := []struct {
		o    Options
		want []string
	}{
		{Options{Policies: "nope"}, []string{"--policies", `"nope"`}},
		{Options{Scenarios: []string{"nothing like it"}}, []string{"no scenario matches", "mooncake conversation"}},
		{Options{Loads: []float64{0.5, -1}}, []string{"load -1"}},
		{Options{Parallel: -1}, []string{"parallel -1"}},
		{Options{Matrix: []Scenario{{Name: "bad", Workload: "shared-prefix", Fleet: []Group{{Count: 1, Profile: "gpu-9000"}}}}}, []string{"scenario bad", `"gpu-9000"`}},
		{Options{Matrix: []Scenario{{Name: "bad spec", Workload: "shared-prefix:groups=x", Fleet: []Group{{Count: 1, Profile: "instant"}}}}}, []string{"key groups"}},
	}
	for _, tt := range tests {
		_, err := Run(context.Background(), tt.o)
		if err == nil {
			t.Errorf("Run(%+v): no error", tt.o)
			continue
		}
		for _, s := range tt.want {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("Run(%+v) error %q lacks %q", tt.o, err, s)
			}
		}
	}
}

func TestRunCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := Run(ctx, Options{Matrix: small(t), Policies: "round-robin"})
	if err == nil || !strings.Contains(err.Error(), "canceled") {
		t.Errorf("cancelled run: error %v, want a cancellation", err)
	}
}

func TestBuildFleetLoad(t *testing.T) {
	reqs, err := workload.Generate("unique:n=200,rate=5", 1)
	if err != nil {
		t.Fatal(err)
	}
	h200, _ := engine.LookupProfile(h200)
	h100, _ := engine.LookupProfile(h100)
	work := func(p engine.Profile) float64 {
		var w time.Duration
		for i := range reqs {
			w += p.UnloadedTTFT(reqs[i].PromptTokens, 0)
		}
		return w.Seconds()
	}
	tests := []struct {
		s    Scenario
		want float64 // the fleet's capacity, in workloads per second of the unscaled span
		kv   int
	}{
		{Scenario{Fleet: []Group{{Count: 8, Profile: h200.Name}}}, 8 / work(h200), 8 * h200.KVTokens()},
		{Scenario{Fleet: []Group{{Count: 4, Profile: h200.Name}, {Count: 4, Profile: h100.Name}}}, 4/work(h200) + 4/work(h100), 4*h200.KVTokens() + 4*h100.KVTokens()},
		{Scenario{Fleet: []Group{{Count: 1, Profile: h200.Name, Slowdown: 2}, {Count: 7, Profile: h200.Name}}}, 0.5/work(h200) + 7/work(h200), 8 * h200.KVTokens()},
		{Scenario{Fleet: []Group{{Count: 8, Profile: h200.Name}}, Start: 4}, 4/work(h200) + 4*0.5/work(h200), 8 * h200.KVTokens()},
	}
	d := span(reqs).Seconds()
	for _, tt := range tests {
		f, scaled, err := tt.s.buildFleet(reqs, 0.7, 1)
		if err != nil {
			t.Fatal(err)
		}
		if want := 0.7 * d * tt.want; math.Abs(f.speedup/want-1) > 1e-6 {
			t.Errorf("%s: speed-up %v, want %v", tt.s.FleetName(), f.speedup, want)
		}
		if math.Abs(f.load-0.7) > 1e-3 || f.kv != tt.kv || len(scaled) != len(reqs) {
			t.Errorf("%s: load %v kv %d, want 0.7 and %d", tt.s.FleetName(), f.load, f.kv, tt.kv)
		}
		if tt.s.Start > 0 {
			at := span(scaled) / 2
			want := []des.Change{{At: at, Instance: 4, Kind: des.Add}, {At: at, Instance: 5, Kind: des.Add}, {At: at, Instance: 6, Kind: des.Add}, {At: at, Instance: 7, Kind: des.Add}}
			if diff := cmp.Diff(want, f.config.Changes); diff != "" {
				t.Errorf("scale-up changes (-want +got):\n%s", diff)
			}
		}
	}
}

func TestSlowed(t *testing.T) {
	p, _ := engine.LookupProfile(h200)
	s := slowed(p, 2)
	if s.KVTokens() != p.KVTokens() {
		t.Errorf("slowed KV %d, want %d", s.KVTokens(), p.KVTokens())
	}
	for _, n := range []int{100, 2048, 30000} {
		if got, want := s.UnloadedTTFT(n, 0), 2*p.UnloadedTTFT(n, 0); got < want-time.Microsecond || got > want+time.Microsecond {
			t.Errorf("%d tokens: %v at half speed, want twice %v", n, got, p.UnloadedTTFT(n, 0))
		}
	}
}

func TestImbalanceCountsPresence(t *testing.T) {
	// Instance 1 joins at 50 s of a 100 s run and is busy half of its 50 s, as instance 0 is
	// half of its 100: even.
	res := &des.Result{
		Records: []report.Record{{Finish: 100 * time.Second}},
		Busy:    []time.Duration{50 * time.Second, 25 * time.Second},
	}
	if got := imbalance(res, []des.Change{{At: 50 * time.Second, Instance: 1, Kind: des.Add}}); math.Abs(got-1) > 1e-12 {
		t.Errorf("imbalance %v, want 1", got)
	}
	if got := imbalance(res, nil); math.Abs(got-4.0/3) > 1e-12 {
		t.Errorf("imbalance without the change %v, want 4/3", got)
	}
}

// cell builds a scored cell from (policy, hit rate, TTFT mean, p99, imbalance) rows.
func cell(bound float64, noSharing bool, rows ...Score) Cell {
	c := Cell{Bounds: report.Bounds{PooledLRUHitRate: bound}, NoSharing: noSharing, Scores: rows}
	for i := range c.Scores {
		c.Scores[i].Completed = 10
		c.Scores[i].TTFT.P50 = c.Scores[i].TTFT.Mean
	}
	score(&c)
	return c
}

func row(policy string, hit, mean, p99, imb float64) Score {
	return Score{Policy: policy, HitRate: hit, TTFT: report.Latency{Mean: mean, P99: p99}, Imbalance: imb}
}

func TestJudge(t *testing.T) {
	tests := []struct {
		name string
		c    Cell
		want []string // substrings of the misses, in order; none: met
	}{
		{"wins", cell(0.5, false, row("prefix-aware", 0.495, 100, 200, 1.1), row("cache-aware", 0.49, 120, 300, 1.0)), nil},
		{"hit below 0.98 of the bound where another reaches it",
			cell(0.5, false, row("prefix-aware", 0.485, 100, 200, 1.1), row("cache-aware", 0.49, 120, 300, 1.0)), []string{"0.970 of the bound"}},
		{"no one reaches the bound: within 0.005 of the best",
			cell(0.5, false, row("prefix-aware", 0.446, 100, 200, 1.1), row("cache-aware", 0.45, 120, 300, 1.0)), nil},
		{"no one reaches the bound: too far below the best",
			cell(0.5, false, row("prefix-aware", 0.44, 100, 200, 1.1), row("cache-aware", 0.45, 120, 300, 1.0)), []string{"0.0100 below the best"}},
		{"slower mean and p99, imbalanced",
			cell(0.5, false, row("prefix-aware", 0.5, 103, 250, 1.3), row("cache-aware", 0.49, 100, 240, 1.0)), []string{"mean 103 ms is 1.030", "p99 250 ms is 1.042", "imbalance 1.300"}},
		{"no sharing: compared with least-request only",
			cell(0, true, row("prefix-aware", 0, 101, 200, 1.0), row("least-request", 0, 100, 199, 1.0), row("random", 0, 50, 60, 1.0)), nil},
		{"no sharing: slower than least-request",
			cell(0, true, row("prefix-aware", 0, 103, 200, 1.0), row("least-request", 0, 100, 190, 1.0)), []string{"mean 103 ms is 1.030 x least-request's", "p99 200 ms is 1.053 x least-request's"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := judge(&tt.c, 0)
			if v.Met != (len(tt.want) == 0) || len(v.Misses) != len(tt.want) {
				t.Fatalf("verdict %+v, want misses %q", v, tt.want)
			}
			for i, w := range tt.want {
				if !strings.Contains(v.Misses[i], w) {
					t.Errorf("miss %d %q lacks %q", i, v.Misses[i], w)
				}
			}
		})
	}
	failed := cell(0.5, false, row("prefix-aware", 0.5, 100, 200, 1.0), row("cache-aware", 0.5, 100, 200, 1.0))
	failed.Scores[0].Failed = 2
	if v := judge(&failed, 0); v.Met || !strings.Contains(v.Misses[0], "2 requests failed") {
		t.Errorf("failed requests: verdict %+v", v)
	}
}

func TestWriters(t *testing.T) {
	sc := runSmall(t, 1)
	var table bytes.Buffer
	if err := sc.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{
		"== small shared: shared-prefix:groups=6", "on 2 x llama3-8b-h100-tp1",
		"load 0.9, seed 1:", "hit rate  of bound  TTFT mean ms", "prefix-aware: ",
		"skipped: trace not found", "targets for prefix-aware", "small scale-up  0.5   ",
		"of 4 cells", "6 cells x 3 policies in",
	} {
		if !strings.Contains(table.String(), s) {
			t.Errorf("table lacks %q:\n%s", s, table.String())
		}
	}
	var js bytes.Buffer
	if err := sc.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back Scorecard
	if err := json.Unmarshal(js.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(sc, &back); diff != "" {
		t.Errorf("JSON round trip (-want +got):\n%s", diff)
	}
	path := filepath.Join(t.TempDir(), "card.html")
	if err := sc.SaveHTML(path); err != nil {
		t.Fatal(err)
	}
	if err := sc.SaveHTML(filepath.Join(t.TempDir(), "no", "dir.html")); err == nil || !strings.Contains(err.Error(), "--html") {
		t.Errorf("unwritable html: error %v", err)
	}
}

func TestParseSeeds(t *testing.T) {
	tests := []struct {
		in   string
		want []uint64
		err  string
	}{
		{"1-5", []uint64{1, 2, 3, 4, 5}, ""},
		{"1, 3,7-8", []uint64{1, 3, 7, 8}, ""},
		{"4", []uint64{4}, ""},
		{"5-1", nil, `"5-1" is not a seed`},
		{"x", nil, `"x" is not a seed`},
		{"", nil, `"" is not a seed`},
		{"1-1000", nil, "more than 100 seeds"},
	}
	for _, tt := range tests {
		got, err := ParseSeeds(tt.in)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("ParseSeeds(%q) error %v, want %q", tt.in, err, tt.err)
			}
			continue
		}
		if err != nil || !cmp.Equal(got, tt.want) {
			t.Errorf("ParseSeeds(%q) = %v, %v, want %v", tt.in, got, err, tt.want)
		}
	}
}

func TestMatrixIsValid(t *testing.T) {
	names := map[string]bool{}
	for _, s := range Matrix() {
		if names[s.Name] {
			t.Errorf("scenario %q twice", s.Name)
		}
		names[s.Name] = true
		if _, err := s.profiles(); err != nil {
			t.Error(err)
		}
		if s.Note == "" {
			t.Errorf("scenario %q has no note", s.Name)
		}
		if s.Trace() {
			continue
		}
		if _, err := workload.Generate(s.Workload+map[bool]string{true: ",n=50", false: ":n=50"}[strings.Contains(s.Workload, ":")], 1); err != nil {
			t.Errorf("scenario %q: %v", s.Name, err)
		}
	}
	if len(names) != 10 {
		t.Errorf("%d scenarios, want the 10 of issue #16", len(names))
	}
}

// cancelWriter cancels a run at its first progress line, as Ctrl-C after the first cell would.
type cancelWriter struct{ cancel context.CancelFunc }

func (w cancelWriter) Write(p []byte) (int, error) {
	w.cancel()
	return len(p), nil
}

// Ctrl-C mid-run ends it as "scorecard interrupted", whatever the simulations it stopped say:
// before, the first of them to fail gave the message ("small shared, load 0.9, seed 1, policy
// round-robin: simulation stopped at 1.2s of virtual time: context canceled").
func TestRunInterrupted(t *testing.T) {
	for range 10 {
		ctx, cancel := context.WithCancel(context.Background())
		_, err := Run(ctx, Options{
			Matrix: small(t)[:2], Seeds: []uint64{1, 2}, Policies: "prefix-aware,round-robin,least-request",
			Loads: []float64{0.5, 0.9}, Parallel: 2, Progress: cancelWriter{cancel},
		})
		cancel()
		if err == nil || err.Error() != "scorecard interrupted: context canceled" || !errors.Is(err, context.Canceled) {
			t.Fatalf("error %v, want scorecard interrupted: context canceled", err)
		}
	}
}

// A quick run is one seed (the first), one load (QuickLoad), every cell cut to MaxRequests
// (QuickRequests unless set), and it says so: in the Scorecard, every verdict, the table and
// the page.
func TestRunQuick(t *testing.T) {
	sc, err := Run(context.Background(), Options{
		Matrix: small(t), Trace: filepath.Join("absent", "trace.jsonl"), Seeds: []uint64{3, 4},
		Policies: "prefix-aware,least-request", Parallel: 2, Quick: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	type cell struct {
		Scenario string
		Load     float64
		Seed     uint64
		Skipped  bool
	}
	var got []cell
	for _, c := range sc.Cells {
		got = append(got, cell{c.Scenario, c.Load, c.Seed, c.Skipped != ""})
		if c.Skipped == "" && (c.Verdict == nil || !c.Verdict.Quick) {
			t.Errorf("%s: verdict %+v, want one marked quick", c.Scenario, c.Verdict)
		}
	}
	want := []cell{{"small shared", QuickLoad, 3, false}, {"small scale-up", QuickLoad, 3, false}, {"small trace", QuickLoad, 3, true}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("quick cells (-want +got):\n%s", diff)
	}
	if !sc.Quick || sc.MaxRequests != QuickRequests || !slices.Equal(sc.Seeds, []uint64{3}) {
		t.Errorf("quick %v, max requests %d, seeds %v; want true, %d, [3]", sc.Quick, sc.MaxRequests, sc.Seeds, QuickRequests)
	}
	var table, page, js bytes.Buffer
	if err := sc.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	if err := sc.WriteHTML(&page); err != nil {
		t.Fatal(err)
	}
	if err := sc.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"QUICK RUN (--quick): seed 3 only, one load, each cell cut to its first 4000 requests: the verdicts are indicative only",
		"prefix-aware: met (quick run: indicative only)", "cells of a quick run (indicative only: run without --quick to decide)"} {
		if !strings.Contains(table.String(), s) {
			t.Errorf("table lacks %q:\n%s", s, table.String())
		}
	}
	if !strings.Contains(page.String(), "QUICK RUN (--quick)") || !strings.Contains(page.String(), "met (quick run: indicative only)") {
		t.Errorf("page does not say the run was quick:\n%s", page.String())
	}
	var doc struct {
		Quick       bool `json:"quick"`
		MaxRequests int  `json:"max_requests"`
		Cells       []struct {
			Verdict *struct {
				Quick bool `json:"quick"`
			} `json:"verdict"`
		} `json:"cells"`
	}
	if err := json.Unmarshal(js.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	if !doc.Quick || doc.MaxRequests != QuickRequests || doc.Cells[0].Verdict == nil || !doc.Cells[0].Verdict.Quick {
		t.Errorf("JSON does not say quick at the top and in the verdict:\n%s", js.String())
	}
}

// MaxRequests keeps each cell's earliest arrivals, sets the load on them, and says how many
// the workload had.
func TestRunMaxRequests(t *testing.T) {
	o := Options{
		Matrix: small(t)[:1], Seeds: []uint64{1}, Policies: "prefix-aware,least-request", Loads: []float64{0.7}, Parallel: 2,
	}
	whole, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	o.MaxRequests = 10
	cut, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	w, c := whole.Cells[0], cut.Cells[0]
	if w.Requests != 24 || w.WorkloadRequests != 0 || c.Requests != 10 || c.WorkloadRequests != 24 {
		t.Errorf("requests %d (of %d) whole, %d (of %d) cut; want 24 (of 0) and 10 (of 24)", w.Requests, w.WorkloadRequests, c.Requests, c.WorkloadRequests)
	}
	if math.Abs(c.OfferedLoad-0.7) > 1e-6 || c.Scores[0].Completed != 10 {
		t.Errorf("cut cell: offered load %v, %d completed; want 0.7 and 10", c.OfferedLoad, c.Scores[0].Completed)
	}
	var table bytes.Buffer
	if err := cut.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(table.String(), "seed 1: 10 of the workload's 24 requests (the first), speed-up") {
		t.Errorf("table does not say the cell was cut:\n%s", table.String())
	}
	o.MaxRequests = -1
	if _, err := Run(context.Background(), o); err == nil || !strings.Contains(err.Error(), "max requests -1") {
		t.Errorf("MaxRequests -1: error %v", err)
	}
}

// The time left weighs the cells by their prompt tokens: a first cell of 1 token-unit that took
// 2 s of simulation, 9 units to go, one simulation at a time, is 18 s left. Before, the mean
// time per cell so far times the cells left said 4 s: the cheap cells came first, and the
// estimate was a fifth of the truth until the trace's cells ran.
func TestProgressWeighsCells(t *testing.T) {
	var log bytes.Buffer
	clock := time.Unix(0, 0)
	p := &progress{w: &log, start: clock, now: func() time.Time { return clock }, parallel: 1, total: 3, weight: 10}
	clock = clock.Add(2 * time.Second)
	p.cellDone(&Cell{Scenario: "cheap", Load: 0.5, Seed: 1}, 1, 2*time.Second)
	clock = clock.Add(2 * time.Second)
	p.parallel = 2 // two at a time: half the time
	p.cellDone(&Cell{Scenario: "cheap", Load: 0.9, Seed: 1}, 1, 2*time.Second)
	clock = clock.Add(16 * time.Second)
	p.cellDone(&Cell{Scenario: "dear", Load: 0.5, Seed: 1}, 8, 16*time.Second)
	want := "scorecard: 1/3 cells: cheap, load 0.5, seed 1 (2s of simulations); 2s elapsed, about 18s left\n" +
		"scorecard: 2/3 cells: cheap, load 0.9, seed 1 (2s of simulations); 4s elapsed, about 8s left\n" +
		"scorecard: 3/3 cells: dear, load 0.5, seed 1 (16s of simulations); 20s elapsed, all done\n"
	if diff := cmp.Diff(want, log.String()); diff != "" {
		t.Errorf("progress (-want +got):\n%s", diff)
	}
}

// A policy that completed no request timed nothing: the table and the page show its TTFT,
// its ratios and its imbalance as "-", as kvroute simulate's table does, not as 0.00 (instant,
// and infinitely better than the best). The other policy's figures stay.
func TestNothingCompletedShowsDash(t *testing.T) {
	c := cell(0.5, false, row("prefix-aware", 0.4, 100, 200, 1.1), row("cache-aware", 0, 0, 0, 0))
	c.Scenario, c.Workload, c.Fleet, c.Load, c.Seed, c.Requests = "s", "w", "f", 0.5, 1, 10
	c.Scores[1].Completed, c.Scores[1].Failed = 0, 10
	score(&c)
	sc := &Scorecard{Subject: "prefix-aware", Seeds: []uint64{1}, Cells: []Cell{c}}
	want := map[string][]string{
		"prefix-aware": {"prefix-aware", "0.400", "0.800", "100", "100", "200", "-", "-", "-", "1.10", "0"},
		"cache-aware":  {"cache-aware", "0.000", "-", "-", "-", "-", "-", "-", "-", "-", "10"},
	}

	var table bytes.Buffer
	if err := sc.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	rows := 0
	for line := range strings.Lines(table.String()) {
		f := strings.Fields(line)
		if !strings.HasPrefix(line, "  ") || len(f) == 0 || want[f[0]] == nil {
			continue // not a policy's row
		}
		rows++
		if diff := cmp.Diff(want[f[0]], f); diff != "" {
			t.Errorf("table row (-want +got):\n%s", diff)
		}
	}
	if rows != 2 {
		t.Errorf("%d policy rows in the table, want 2:\n%s", rows, table.String())
	}

	var page bytes.Buffer
	if err := sc.WriteHTML(&page); err != nil {
		t.Fatal(err)
	}
	trs := regexp.MustCompile(`<tr><td>(.*?)</tr>`).FindAllStringSubmatch(page.String(), -1)
	if len(trs) != 2 {
		t.Fatalf("%d policy rows on the page, want 2:\n%s", len(trs), page.String())
	}
	for _, tr := range trs {
		var cells []string
		for _, m := range regexp.MustCompile(`>([^<>]*)</td>`).FindAllStringSubmatch("<td>"+tr[1], -1) {
			cells = append(cells, m[1])
		}
		if diff := cmp.Diff(want[cells[0]], cells); diff != "" {
			t.Errorf("page row (-want +got):\n%s", diff)
		}
	}
}
