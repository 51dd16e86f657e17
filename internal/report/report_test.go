package report

import (
	"bytes"
	"encoding/json"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

func TestPercentile(t *testing.T) {
	xs := []float64{10, 20, 30, 40, 50}
	tests := []struct {
		p    float64
		want float64
	}{
		{0, 10}, {50, 30}, {90, 46}, {99, 49.6}, {100, 50}, {25, 20}, {-5, 10}, {150, 50},
	}
	for _, tt := range tests {
		if got := Percentile(xs, tt.p); math.Abs(got-tt.want) > 1e-9 {
			t.Errorf("Percentile(%v, %v) = %v, want %v", xs, tt.p, got, tt.want)
		}
	}
	if got := Percentile(nil, 50); got != 0 {
		t.Errorf("Percentile(nil) = %v, want 0", got)
	}
	if got := Percentile([]float64{7}, 99); got != 7 {
		t.Errorf("Percentile([7], 99) = %v, want 7", got)
	}
}

func TestSummarise(t *testing.T) {
	got := Summarise([]float64{4, 1, 3, 2}) // sorted: 1 2 3 4
	want := Latency{Mean: 2.5, P50: 2.5, P90: 3.7, P99: 3.97}
	if diff := cmp.Diff(want, got, cmpopts.EquateApprox(0, 1e-9)); diff != "" {
		t.Errorf("Summarise (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(Latency{}, Summarise(nil)); diff != "" {
		t.Errorf("Summarise(nil) (-want +got):\n%s", diff)
	}
}

func TestImbalance(t *testing.T) {
	tests := []struct {
		loads []float64
		want  float64
	}{
		{[]float64{1, 1, 1, 1}, 1},
		{[]float64{4, 0, 0, 0}, 4},
		{[]float64{3, 1}, 1.5},
		{[]float64{0, 0}, 0},
		{nil, 0},
	}
	for _, tt := range tests {
		if got := Imbalance(tt.loads); math.Abs(got-tt.want) > 1e-12 {
			t.Errorf("Imbalance(%v) = %v, want %v", tt.loads, got, tt.want)
		}
	}
}

func msd(n int) time.Duration { return time.Duration(n) * time.Millisecond }

func TestSummarize(t *testing.T) {
	recs := []Record{
		// TTFT 100 ms, e2e 1100 ms, 11 tokens: TPOT 100 ms.
		{ID: "a", EndpointID: 0, Arrival: 0, FirstToken: msd(100), Finish: msd(1100), PromptTokens: 1000, CachedTokens: 0, OutputTokens: 11},
		// TTFT 300 ms, e2e 500 ms, 3 tokens: TPOT 100 ms.
		{ID: "b", EndpointID: 1, Arrival: msd(500), FirstToken: msd(800), Finish: msd(1000), PromptTokens: 1000, CachedTokens: 500, OutputTokens: 3, Predicted: true, PredictedCachedTokens: 750},
		// One token: no TPOT. TTFT 200, e2e 200. Last finish at 2000 ms.
		{ID: "c", EndpointID: 1, Arrival: msd(1800), FirstToken: msd(2000), Finish: msd(2000), PromptTokens: 2000, CachedTokens: 1500, OutputTokens: 1},
		// Failed: counts neither in latencies nor hit rate.
		{ID: "d", EndpointID: -1, Arrival: msd(10), Finish: msd(10), PromptTokens: 900000, Err: "prompt too long"},
	}
	busy := []time.Duration{msd(500), msd(1500)}
	got := Summarize("rr", recs, busy)
	want := Result{
		Policy:               "rr",
		Completed:            3,
		Failed:               1,
		HitRate:              2000.0 / 4000.0,
		TTFT:                 Latency{Mean: 200, P50: 200, P90: 280, P99: 298},
		TPOT:                 Latency{Mean: 100, P50: 100, P90: 100, P99: 100},
		E2E:                  Latency{Mean: 600, P50: 500, P90: 980, P99: 1088},
		ThroughputTokensPerS: 15.0 / 2.0,
		LoadImbalance:        1.5,
		InstanceBusyFraction: []float64{0.25, 0.75},
		InstanceRequests:     []int{1, 2},
		PredictedHitRate:     ptr(0.75),
	}
	if diff := cmp.Diff(want, got, cmpopts.EquateApprox(0, 1e-9)); diff != "" {
		t.Errorf("Summarize (-want +got):\n%s", diff)
	}

	// Without busy times the imbalance falls back to request counts: max 2 / mean 1.5.
	got = Summarize("rr", recs, nil)
	if math.Abs(got.LoadImbalance-4.0/3.0) > 1e-12 || got.InstanceBusyFraction != nil {
		t.Errorf("Summarize without busy: imbalance %v busy %v, want 1.333 and nil", got.LoadImbalance, got.InstanceBusyFraction)
	}
}

func TestWriteJSONShape(t *testing.T) {
	s := &Summary{
		Scenario: Scenario{Workload: "w", Requests: 3, Instances: 2, Profile: "p", Speedup: 1.5, Seed: 7},
		Bounds:   Bounds{InfiniteCacheHitRate: 0.5, PooledLRUHitRate: 0.25},
		Results:  []Result{Summarize("x", []Record{{EndpointID: 0, FirstToken: msd(1), Finish: msd(2), OutputTokens: 2, PromptTokens: 1}}, []time.Duration{msd(1)})},
	}
	var buf bytes.Buffer
	if err := WriteJSON(&buf, s); err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(buf.Bytes(), &m); err != nil {
		t.Fatalf("output is not JSON: %v", err)
	}
	for _, k := range []string{"scenario", "bounds", "results"} {
		if _, ok := m[k]; !ok {
			t.Errorf("missing key %q", k)
		}
	}
	res := m["results"].([]any)[0].(map[string]any)
	for _, k := range []string{"policy", "completed", "failed", "hit_rate", "ttft_ms", "tpot_ms", "e2e_ms",
		"throughput_tokens_per_s", "load_imbalance", "instance_busy_fraction", "wall_seconds"} {
		if _, ok := res[k]; !ok {
			t.Errorf("result missing key %q", k)
		}
	}
	ttft := res["ttft_ms"].(map[string]any)
	if ttft["p50"] != 1.0 {
		t.Errorf("ttft_ms.p50 = %v, want 1", ttft["p50"])
	}
	if got := m["bounds"].(map[string]any)["pooled_lru_hit_rate"]; got != 0.25 {
		t.Errorf("pooled_lru_hit_rate = %v, want 0.25", got)
	}
}

func TestWriteTable(t *testing.T) {
	s := &Summary{
		Scenario: Scenario{Workload: "w", Requests: 1, Instances: 1, Profile: "p", Speedup: 1},
		Bounds:   Bounds{InfiniteCacheHitRate: 0.6},
		Results: []Result{
			{Policy: "round-robin", HitRate: 0.125, TTFT: Latency{Mean: 1234.5, P50: 12.34, P90: 5, P99: 6}, Completed: 10},
			{Policy: "x", HitRate: 0.5, Completed: 9, Failed: 1},
		},
	}
	var buf bytes.Buffer
	if err := WriteTable(&buf, s); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimRight(buf.String(), "\n"), "\n")
	if len(lines) != 6 {
		t.Fatalf("got %d lines, want 6:\n%s", len(lines), buf.String())
	}
	header, row1, row2 := lines[3], lines[4], lines[5]
	if !strings.HasPrefix(row1, "  round-robin ") || !strings.HasPrefix(row2, "  x           ") {
		t.Errorf("policy column not left-aligned:\n%s", buf.String())
	}
	if len(header) != len(row1) || len(row1) != len(row2) {
		t.Errorf("rows not aligned (%d, %d, %d):\n%s", len(header), len(row1), len(row2), buf.String())
	}
	for _, want := range []string{"0.125", "1234", "12.3", "5.00"} {
		if !strings.Contains(row1, want) {
			t.Errorf("row %q lacks %q", row1, want)
		}
	}
}

// A live run's hit rate above the infinite-cache bound says the engines were warm, once.
func TestWriteTableWarmEngines(t *testing.T) {
	s := &Summary{
		Bounds: Bounds{InfiniteCacheHitRate: 0.212},
		Results: []Result{
			{Policy: "bench", HitRate: 0.999, Completed: 10},
			{Policy: "cold", HitRate: 0.2, Completed: 10},
			{Policy: "unknown", HitRateUnknown: true, Completed: 10},
		},
	}
	var buf bytes.Buffer
	if err := WriteTable(&buf, s); err != nil {
		t.Fatal(err)
	}
	if got := strings.Count(buf.String(), "note: "); got != 1 || !strings.Contains(buf.String(), "note: bench's hit rate 0.999 is above the infinite-cache bound 0.212") {
		t.Errorf("%d notes in:\n%s\nwant one, on bench", got, buf.String())
	}
}

func ptr(f float64) *float64 { return &f }

func TestWriteRecords(t *testing.T) {
	recs := []Record{
		{ID: "1", Policy: "rr", EndpointID: 0, Endpoint: "sim-0", Arrival: msd(10), FirstToken: msd(30), Finish: msd(110),
			PromptTokens: 100, CachedTokens: 32, OutputTokens: 5, Predicted: true, PredictedCachedTokens: 48},
		{ID: "2", Policy: "rr", EndpointID: -1, Arrival: msd(20), Finish: msd(20), PromptTokens: 7, Err: "pick: no candidate endpoint"},
	}
	var buf bytes.Buffer
	if err := WriteRecords(&buf, recs); err != nil {
		t.Fatal(err)
	}
	want := `{"id":"1","policy":"rr","endpoint":"sim-0","arrival_ms":10,"first_token_ms":30,"finish_ms":110,"ttft_ms":20,"e2e_ms":100,"prompt_tokens":100,"cached_tokens":32,"output_tokens":5,"predicted_cached_tokens":48}
{"id":"2","policy":"rr","arrival_ms":20,"finish_ms":20,"e2e_ms":0,"prompt_tokens":7,"cached_tokens":0,"output_tokens":0,"error":"pick: no candidate endpoint"}
`
	if diff := cmp.Diff(want, buf.String()); diff != "" {
		t.Errorf("records (-want +got):\n%s", diff)
	}
}

// Requests whose engine reported no cached tokens count in neither side of the hit rate; when
// no completed request had them reported (or none completed), the hit rate is unknown, in JSON (null, and back),
// the table and the records.
func TestSummarize_CachedTokensUnknown(t *testing.T) {
	recs := []Record{
		{ID: "a", EndpointID: 0, FirstToken: msd(10), Finish: msd(20), PromptTokens: 1000, CachedTokens: 250, OutputTokens: 1},
		{ID: "b", EndpointID: 1, FirstToken: msd(10), Finish: msd(20), PromptTokens: 3000, CachedUnknown: true, OutputTokens: 1},
	}
	mixed := Summarize("p", recs, nil)
	if mixed.HitRateUnknown || mixed.HitRate != 0.25 {
		t.Errorf("mixed: hit rate %v unknown %v, want 0.25 over the reporting request", mixed.HitRate, mixed.HitRateUnknown)
	}
	none := Summarize("p", recs[1:], nil)
	if !none.HitRateUnknown || none.HitRate != 0 {
		t.Errorf("none reported: hit rate %v unknown %v, want unknown", none.HitRate, none.HitRateUnknown)
	}
	// No completed request: no hit rate was measured, so it is unknown, not 0.
	if failedOnly := Summarize("p", []Record{{EndpointID: -1, Err: "x", CachedUnknown: true}}, nil); !failedOnly.HitRateUnknown {
		t.Error("no completed request: hit rate known, want unknown")
	}

	s := &Summary{Bounds: Bounds{InfiniteCacheHitRate: 0.5, PooledLRUUnknown: true}, Results: []Result{none, mixed}}
	var buf bytes.Buffer
	if err := WriteJSON(&buf, s); err != nil {
		t.Fatal(err)
	}
	var raw struct {
		Bounds  map[string]any
		Results []map[string]any
	}
	if err := json.Unmarshal(buf.Bytes(), &raw); err != nil {
		t.Fatal(err)
	}
	if v, ok := raw.Results[0]["hit_rate"]; !ok || v != nil {
		t.Errorf("unknown hit_rate = %v (present %v), want null", v, ok)
	}
	if v := raw.Results[1]["hit_rate"]; v != 0.25 {
		t.Errorf("known hit_rate = %v, want 0.25", v)
	}
	if v, ok := raw.Bounds["pooled_lru_hit_rate"]; !ok || v != nil || raw.Bounds["infinite_cache_hit_rate"] != 0.5 {
		t.Errorf("bounds = %v, want pooled null and infinite 0.5", raw.Bounds)
	}
	var back Summary
	if err := json.Unmarshal(buf.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(*s, back, cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("JSON round trip (-want +got):\n%s", diff)
	}

	buf.Reset()
	if err := WriteTable(&buf, s); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimRight(buf.String(), "\n"), "\n")
	if !strings.Contains(lines[1], "pooled LRU unknown") || !strings.Contains(lines[4], " unknown ") || !strings.Contains(lines[5], " 0.250 ") {
		t.Errorf("table does not say unknown where it is:\n%s", buf.String())
	}

	buf.Reset()
	if err := WriteRecords(&buf, recs); err != nil {
		t.Fatal(err)
	}
	if got := strings.Count(buf.String(), `"cached_tokens":null`); got != 1 {
		t.Errorf("records: %d null cached_tokens, want 1:\n%s", got, buf.String())
	}
}

// A run in which no request completed timed nothing: its latencies and imbalance read "-",
// not 0.00 (instant) and 1.00 (perfectly even); a load that is not known (a live target's)
// is left out of the header rather than given as 0.00.
func TestWriteTableNothingCompleted(t *testing.T) {
	s := &Summary{
		Scenario: Scenario{Workload: "w", Requests: 3, Instances: 1, Profile: "http://127.0.0.1:1", Speedup: 1, Seed: 1},
		Results:  []Result{{Policy: "bench", HitRateUnknown: true, LoadImbalance: 1, Failed: 3}},
	}
	var buf bytes.Buffer
	if err := WriteTable(&buf, s); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimRight(buf.String(), "\n"), "\n")
	if want := "workload w: 3 requests, 1 x http://127.0.0.1:1, speed-up 1, seed 1"; lines[0] != want {
		t.Errorf("header %q, want %q", lines[0], want)
	}
	if got := strings.Fields(lines[4]); !slices.Equal(got, []string{"bench", "unknown", "-", "-", "-", "-", "-", "0", "-", "0", "3"}) {
		t.Errorf("row %q: want every timed figure and the imbalance as -", lines[4])
	}
}

// Pacing replaces the speed-up in the header and on the page: a bench paced by --rate or
// --concurrency said "speed-up 1", which nothing had applied.
func TestPacingReplacesSpeedup(t *testing.T) {
	s := &Summary{Scenario: Scenario{Workload: "w", Requests: 3, Instances: 1, Profile: "http://127.0.0.1:1", Speedup: 1, Pacing: "rate 5 req/s, Poisson arrivals", Seed: 1}}
	var buf bytes.Buffer
	if err := WriteTable(&buf, s); err != nil {
		t.Fatal(err)
	}
	header, _, _ := strings.Cut(buf.String(), "\n")
	if want := "workload w: 3 requests, 1 x http://127.0.0.1:1, rate 5 req/s, Poisson arrivals, seed 1"; header != want {
		t.Errorf("header %q, want %q", header, want)
	}
	if got, want := scenarioLine(s), "workload w: 3 requests, 1 instances of http://127.0.0.1:1, rate 5 req/s, Poisson arrivals, seed 1"; got != want {
		t.Errorf("page's scenario line %q, want %q", got, want)
	}
}
