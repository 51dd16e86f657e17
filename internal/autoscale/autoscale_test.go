package autoscale

import (
	"math"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/kvroute/kvroute/internal/endpoint"
)

var t0 = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

// scraped gives e a snapshot at at: its engine has computed computed prompt tokens and found
// hits in its cache so far.
func scraped(e *endpoint.Endpoint, at time.Duration, computed, hits float64) {
	scrapedKV(e, at, computed, hits, 0)
}

// scrapedKV is scraped with a KV-cache usage.
func scrapedKV(e *endpoint.Endpoint, at time.Duration, computed, hits, kv float64) {
	e.SetSnapshot(&endpoint.Snapshot{At: t0.Add(at), PrefixQueries: computed + hits, PrefixHits: hits, KVUsage: kv})
}

func TestSaturation_SteadyDemand(t *testing.T) {
	s := NewSaturation(time.Minute)
	a := &endpoint.Endpoint{ID: 0, Name: "a", Models: []string{"m"}}
	b := &endpoint.Endpoint{ID: 1, Name: "b", Models: []string{"m"}}
	eps := []*endpoint.Endpoint{a, b}
	rate := func(e *endpoint.Endpoint) float64 { return 10000 }
	// a computes 6,000 tokens/s, b 2,000 (b also serves 50,000 tokens/s from its cache: hits
	// cost no prefill), scraped every 15 s.
	for k := range 9 {
		at := time.Duration(k) * 15 * time.Second
		scraped(a, at, 6000*at.Seconds(), 0)
		scraped(b, at, 2000*at.Seconds(), 50000*at.Seconds())
		s.Sample(t0.Add(at), eps)
		if k == 0 {
			if f := s.Figures(eps, rate); f[0].Known() || f[0].Demand != 0 || f[0].Load != 0 {
				t.Errorf("after one sample: %+v, want no rate yet", f[0])
			}
		}
	}
	want := []Figures{{Model: "m", Engines: 2, Reporting: 2, Counted: 2, Demand: 8000, Rate: 10000, Prefill: 0.8, Load: 0.8, Saturation: 0.4}}
	if diff := cmp.Diff(want, s.Figures(eps, rate), cmpopts.EquateApprox(1e-9, 1e-9)); diff != "" {
		t.Errorf("steady demand (-want +got):\n%s", diff)
	}
	// b is drained (not available): its demand still counts (it finishes its requests), its
	// capacity no longer does.
	b.SetDraining(true)
	f := s.Figures(eps, rate)[0]
	if f.Engines != 1 || math.Abs(f.Saturation-0.8) > 1e-9 {
		t.Errorf("b draining: %d engines, saturation %g; want 1, 0.8", f.Engines, f.Saturation)
	}
}

// TestSaturation_Step: a step in demand shows up with the window's time constant, and the
// first intervals are not biased towards 0.
func TestSaturation_Step(t *testing.T) {
	s := NewSaturation(time.Minute)
	e := &endpoint.Endpoint{Name: "a"}
	eps := []*endpoint.Endpoint{e}
	computed := 0.0
	at := time.Duration(0)
	step := func(n int, perSecond float64) Figures {
		for range n {
			at += 5 * time.Second
			computed += perSecond * 5
			scraped(e, at, computed, 0)
			s.Sample(t0.Add(at), eps)
		}
		return s.Figures(eps, func(*endpoint.Endpoint) float64 { return 1000 })[0]
	}
	scraped(e, 0, 0, 0)
	s.Sample(t0.Add(at), eps)
	if f := step(1, 500); math.Abs(f.Demand-500) > 1e-9 || f.Model != "" {
		t.Errorf("first interval: demand %g model %q, want 500 (not biased towards 0), \"\"", f.Demand, f.Model)
	}
	step(60, 500) // five minutes at 500
	// Demand doubles: after one window, the average has gone 1 - 1/e of the way.
	f := step(12, 1000)
	if want := 1000 - 500/math.E; math.Abs(f.Demand-want) > 1 {
		t.Errorf("a window after the step: demand %g, want %g", f.Demand, want)
	}
	if math.Abs(f.Saturation-f.Demand/1000) > 1e-9 || math.Abs(f.Load-f.Saturation) > 1e-9 {
		t.Errorf("one engine: load %g and saturation %g, want both demand / rate", f.Load, f.Saturation)
	}
	// The engine restarts: its counters go back to 0. That interval is no measurement.
	computed = 0
	before := f.Demand
	at += 5 * time.Second
	scraped(e, at, 0, 0)
	s.Sample(t0.Add(at), eps)
	if got := s.Figures(eps, nil)[0].Demand; got != before {
		t.Errorf("restart: demand %g, want it unchanged at %g", got, before)
	}
	// A snapshot seen twice changes nothing.
	s.Sample(t0.Add(at), eps)
	if got := s.Figures(eps, nil)[0].Demand; got != before {
		t.Errorf("same snapshot again: demand %g, want %g", got, before)
	}
}

func TestSaturation_ModelsAndUnknowns(t *testing.T) {
	s := NewSaturation(0)
	vllm := &endpoint.Endpoint{ID: 0, Name: "v", Models: []string{"big", "small"}}
	tgi := &endpoint.Endpoint{ID: 1, Name: "t", Models: []string{"small"}}
	idle := &endpoint.Endpoint{ID: 2, Name: "i", Models: []string{"big"}}
	eps := []*endpoint.Endpoint{vllm, tgi, idle}
	for k := range 3 {
		at := time.Duration(k) * 30 * time.Second
		scraped(vllm, at, 3000*at.Seconds(), 0)
		tgi.SetSnapshot(&endpoint.Snapshot{At: t0.Add(at), Running: 3}) // no prefix-cache counters, no KV usage
		scraped(idle, at, 0, 0)
		s.Sample(t0.Add(at), eps)
	}
	rates := map[string]float64{"v": 20000, "t": 10000, "i": 0}
	got := s.Figures(eps, func(e *endpoint.Endpoint) float64 { return rates[e.Name] })
	want := []Figures{
		// idle has reported no query yet and has no rate: the rate is v's alone, the
		// capacity both.
		{Model: "big", Engines: 2, Reporting: 1, Counted: 1, Demand: 3000, Rate: 20000, Prefill: 0.15, Load: 0.15, Saturation: 0.075},
		// tgi makes capacity but reports no load: the load known is v's, at its own rate.
		{Model: "small", Engines: 2, Reporting: 1, Counted: 1, Demand: 3000, Rate: 15000, Prefill: 0.15, Load: 0.15, Saturation: 0.075},
	}
	if diff := cmp.Diff(want, got, cmpopts.EquateApprox(1e-9, 1e-9)); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	// No rate at all and no KV usage: the demand is known, the load is not.
	f := s.Figures(eps, nil)[0]
	if f.Known() || f.Demand != 3000 || f.Load != 0 || f.Saturation != 0 {
		t.Errorf("no rate: %+v, want demand 3000 and no load", f)
	}
	// An endpoint that leaves is forgotten: it comes back without its history.
	now := t0.Add(time.Minute)
	s.Sample(now, []*endpoint.Endpoint{tgi, idle})
	s.Sample(now, eps)
	if f := s.Figures(eps, nil)[0]; f.Demand != 0 {
		t.Errorf("after v left and came back: demand %g, want 0 until it has a new interval", f.Demand)
	}
}

// TestSaturation_Stale: an engine that stops answering scrapes keeps its last snapshot; two
// windows later it counts no load, and it counts again once a new snapshot comes.
func TestSaturation_Stale(t *testing.T) {
	s := NewSaturation(time.Minute)
	a := &endpoint.Endpoint{ID: 0, Name: "a", Models: []string{"m"}}
	eps := []*endpoint.Endpoint{a}
	for k := range 5 {
		at := time.Duration(k) * 15 * time.Second
		scrapedKV(a, at, 5000*at.Seconds(), 0, 0.3)
		s.Sample(t0.Add(at), eps)
	}
	load := func() float64 { return s.Figures(eps, func(*endpoint.Endpoint) float64 { return 10000 })[0].Load }
	if got := load(); math.Abs(got-0.5) > 1e-9 {
		t.Fatalf("load %g, want 0.5", got)
	}
	s.Sample(t0.Add(60*time.Second+2*time.Minute), eps) // the last snapshot is from 60 s
	if got := load(); math.Abs(got-0.5) > 1e-9 {
		t.Errorf("snapshot two windows old: load %g, want 0.5 still", got)
	}
	s.Sample(t0.Add(60*time.Second+2*time.Minute+time.Second), eps)
	if got := load(); got != 0 {
		t.Errorf("snapshot older than two windows: load %g, want 0", got)
	}
	at := 60*time.Second + 2*time.Minute + 15*time.Second
	scrapedKV(a, at, 5000*at.Seconds(), 0, 0.3)
	s.Sample(t0.Add(at), eps)
	if got := load(); math.Abs(got-0.5) > 1e-9 {
		t.Errorf("scraped again: load %g, want 0.5", got)
	}
}

// TestSaturation_KVUsage: an engine whose running requests fill its KV cache is loaded
// whatever its prefill: each endpoint counts the larger of its prefill utilisation and its
// KV-cache usage. Without any prefill rate, the KV usage alone makes the load.
func TestSaturation_KVUsage(t *testing.T) {
	s := NewSaturation(time.Minute)
	a := &endpoint.Endpoint{ID: 0, Name: "a", Models: []string{"m"}}
	b := &endpoint.Endpoint{ID: 1, Name: "b", Models: []string{"m"}}
	eps := []*endpoint.Endpoint{a, b}
	for k := range 12 {
		at := time.Duration(k) * 15 * time.Second
		scrapedKV(a, at, 6000*at.Seconds(), 0, 0.2) // prefill 0.6 of 10,000/s, KV 0.2
		scrapedKV(b, at, 1000*at.Seconds(), 0, 0.7) // prefill 0.1, long decodes: KV 0.7
		s.Sample(t0.Add(at), eps)
	}
	rate := func(*endpoint.Endpoint) float64 { return 10000 }
	want := []Figures{{Model: "m", Engines: 2, Reporting: 2, Counted: 2, Demand: 7000, Rate: 10000, Prefill: 0.7, KVUsage: 0.45, Load: 1.3, Saturation: 0.65}}
	if diff := cmp.Diff(want, s.Figures(eps, rate), cmpopts.EquateApprox(1e-9, 1e-9)); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	want = []Figures{{Model: "m", Engines: 2, Reporting: 2, Counted: 2, Demand: 7000, KVUsage: 0.45, Load: 0.9, Saturation: 0.45}}
	if diff := cmp.Diff(want, s.Figures(eps, nil), cmpopts.EquateApprox(1e-9, 1e-9)); diff != "" {
		t.Errorf("no rate (-want +got):\n%s", diff)
	}
}

func TestHPA(t *testing.T) {
	h := HPA{Target: 0.7, Min: 2, Max: 10}
	for _, c := range []struct {
		current int
		metric  float64
		want    int
	}{
		{4, 2.8, 4},            // exactly at target: 2.8 / (0.7 x 4) = 1
		{4, 3.0, 4},            // 7 % over: within the tolerance
		{4, 3.2, 5},            // 14 % over: ceil(3.2 / 0.7) = 5
		{4, 6.0, 9},            // the count comes from the metric, not from the steps before
		{9, 6.0, 9},            // and stays there: 6 / 6.3 is within tolerance
		{4, 1.0, 2},            // down to ceil(1 / 0.7) = 2
		{4, 0, 2},              // Min
		{4, 100, 10},           // Max
		{4, math.NaN(), 4},     // no metric: no change
		{0, 1.5, 3},            // from nothing
		{4, math.Inf(1), 4},    // nonsense: no change
		{1, -1, 2},             // nonsense below Min: Min
		{11, 7.7, 10},          // above Max already: back to Max
		{4, 3.05, 4},           // 9 % over: still inside
		{4, 2.8*1.1 + 0.01, 5}, // and past it, out
	} {
		if got := h.Desired(c.current, c.metric); got != c.want {
			t.Errorf("Desired(%d, %g) = %d, want %d", c.current, c.metric, got, c.want)
		}
	}
}
