package policy

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/endpoint"
)

// TestSpeedFitLapses: with a horizon, an endpoint's calibration stands while samples come, and
// lapses after a silence as long as its samples' weight would take to fade under learnMin
// (staleAt); the samples after that make a new one, owing nothing to the old. Without a
// horizon it never lapses.
func TestSpeedFitLapses(t *testing.T) {
	const horizon = 60.0 // seconds
	sec := func(s float64) int64 { return int64(s * 1e9) }
	var f speedFit
	f.init()
	// 100 samples, one every 0.1 s, each 20 times slower than predicted: a stall.
	now := sec(1000)
	for range 100 {
		now += sec(0.1)
		f.add(0.05, 1, learnWeight, now, horizon, 1)
	}
	got, w, ok := f.own(now)
	if !ok || w != 1 || math.Abs(got-maxSpeedFactor) > 1e-9 {
		t.Fatalf("after the stall: own %v at weight %v, %v; want %v at 1, true", got, w, ok, maxSpeedFactor)
	}
	// The samples' weight is n = about 43: with no sample, it would fade under learnMin at
	// the horizon after horizon x ln(n/5), about 130 s.
	lapse := float64(f.staleAt.Load()-now) / 1e9
	if want := horizon * math.Log(f.n/learnMin); math.Abs(lapse-want) > 0.01 || lapse < 100 || lapse > 150 {
		t.Fatalf("lapses %.1f s after the last sample (n %.1f), want %.1f", lapse, f.n, want)
	}
	if _, w, _ := f.own(now + sec(lapse-1)); w != 1 {
		t.Errorf("a second before it lapses: weight %v, want 1", w)
	}
	// From the lapse on, its weight against what stands in fades at the horizon.
	for _, after := range []float64{1, 60, 180} {
		if _, w, ok := f.own(now + sec(lapse+after)); !ok || math.Abs(w-math.Exp(-after/horizon)) > 1e-6 {
			t.Errorf("%v s after the lapse: weight %v, %v; want e^(-%v/%v) = %.4f", after, w, ok, after, horizon, math.Exp(-after/horizon))
		}
	}
	// The engine is well again: the first sample 60 s after the lapse starts from what the
	// faded calibration says there (against a fleet at 1: 20^(1/e), 3.0) with the weight of
	// learnMin samples; samples at the predicted speed then pull it to 1.
	now += sec(lapse + 60)
	f.add(0.05, 0.05, learnWeight, now, horizon, 1)
	fadedThen := math.Pow(maxSpeedFactor, math.Exp(-1))
	want := (fadedThen*learnMin*(1-learnWeight) + 1) / (learnMin*(1-learnWeight) + 1)
	if got, w, ok := f.own(now); !ok || w != 1 || math.Abs(got-want) > 1e-9 {
		t.Errorf("the first sample after the lapse: own %v at weight %v, %v; want %.4f (the faded %.4f, 5 samples' weight, and 1)", got, w, ok, want, fadedThen)
	}
	for range 200 {
		now += sec(0.1)
		f.add(0.05, 0.05, learnWeight, now, horizon, 1)
	}
	if got, _, _ := f.own(now); math.Abs(got-1) > 0.01 {
		t.Errorf("after 200 samples at speed: own %v, want 1", got)
	}

	// No horizon: the stall stands for ever.
	var g speedFit
	g.init()
	for i := range 100 {
		g.add(0.05, 1, learnWeight, sec(float64(i)), 0, 0)
	}
	if got, w, ok := g.own(sec(1e6)); !ok || w != 1 || math.Abs(got-maxSpeedFactor) > 1e-9 {
		t.Errorf("without a horizon, a million seconds later: own %v, %v; want %v, true", got, ok, maxSpeedFactor)
	}
}

// TestStalledEndpointComesBack: an engine that stalls for 10 s (its ten requests held, then
// reporting TTFTs of 10 s) is calibrated as slow, without dragging the fleet's calibration
// with it, and gets no new request while another endpoint is less loaded than 20 times its
// queue; with no TTFT from it since, its calibration lapses within a few affinity windows,
// fades towards the fleet's over the next few, and it is chosen again.
// stallFixture is prefix-aware with two endpoints that served 100 requests each at the
// prior's speed; next makes a new request, serve has one served at once with ttft.
func stallFixture(t *testing.T) (pa *prefixAware, clk *fakeClock, eps []*endpoint.Endpoint, next func(keys ...uint64) *Request, serve func(ep int, ttft time.Duration, keys ...uint64)) {
	pa, clk = newPA(t, Params{"affinity_window": "60"})
	eps = newEndpoints(2, 1<<20)
	n := 0
	next = func(keys ...uint64) *Request {
		n++
		return req(fmt.Sprint("r", n), 4, keys...)
	}
	serve = func(ep int, ttft time.Duration, keys ...uint64) {
		r := next(keys...)
		pa.Routed(r, eps[ep])
		clk.t = clk.t.Add(ttft)
		pa.FirstToken(r, eps[ep], ttft)
		pa.Done(r, eps[ep], Result{OK: true, CachedTokens: -1})
		clk.t = clk.t.Add(100 * time.Millisecond)
	}
	for i := range 200 {
		serve(i%2, 30*time.Millisecond, seq(uint64(1000*i), 8)...)
	}
	return pa, clk, eps, next, serve
}

func TestStalledEndpointComesBack(t *testing.T) {
	pa, clk, eps, next, serve := stallFixture(t)
	fleet := pa.PrefillRate(0)
	// Endpoint 1 stalls: ten requests held for 10 s.
	var held []*Request
	for i := range 10 {
		held = append(held, next(seq(uint64(500_000+1000*i), 8)...))
	}
	for _, r := range held {
		pa.Routed(r, eps[1])
	}
	clk.t = clk.t.Add(10 * time.Second)
	for _, r := range held {
		pa.FirstToken(r, eps[1], 10*time.Second)
		pa.Done(r, eps[1], Result{OK: true, CachedTokens: -1})
	}
	if got := pa.PrefillRate(1); got > fleet/2 {
		t.Fatalf("after the stall: endpoint 1's prefill rate %.0f tokens/s, want it calibrated as slow (the fleet's %.0f)", got, fleet)
	}
	if got := pa.PrefillRate(0); got < fleet/2 {
		t.Errorf("after the stall: endpoint 0's prefill rate %.0f tokens/s, was %.0f: one engine's stall slowed the fleet's calibration", got, fleet)
	}
	// Endpoint 0 has 2,000 tokens queued; a new prompt still goes there, not to the endpoint
	// calibrated 20 times slower.
	k := 0
	busyPick := func() int {
		k++
		busy := req(fmt.Sprint("busy", k), 0, seq(uint64(7_000_000+1000*k), 125)...)
		pa.Routed(busy, eps[0])
		got, _ := pa.Pick(req(fmt.Sprint("new", k), 4, seq(uint64(8_000_000+1000*k), 8)...), eps)
		pa.Done(busy, eps[0], Result{OK: false}) // no TTFT learned from it
		return got[0].ID
	}
	if got := busyPick(); got != 0 {
		t.Fatalf("right after the stall, picked endpoint %d, want 0 (1 calibrated as slow)", got)
	}
	// Endpoint 0 keeps serving, a request a second; 1 serves nothing for three affinity windows.
	for i := range 180 {
		serve(0, 30*time.Millisecond, seq(uint64(200_000+1000*i), 8)...)
		clk.t = clk.t.Add(870 * time.Millisecond)
	}
	// Its calibration lapsed after about 2 min 20 s, and fades towards the fleet's since.
	slow := pa.PrefillRate(1)
	if want := prefillRate / pa.fleet.get(); slow <= fleet/maxSpeedFactor*1.5 || slow >= want {
		t.Errorf("three minutes without a TTFT: endpoint 1's prefill rate %.0f, want it between the stall's (%.0f) and the fleet's %.0f",
			slow, fleet/maxSpeedFactor, want)
	}
	for i := range 120 {
		serve(0, 30*time.Millisecond, seq(uint64(400_000+1000*i), 8)...)
		clk.t = clk.t.Add(870 * time.Millisecond)
	}
	if got, want := pa.PrefillRate(1), prefillRate/pa.fleet.get(); got != want {
		t.Errorf("five minutes without a TTFT: endpoint 1's prefill rate %.0f, want the fleet's %.0f (the faded stall within learnTolerance of it)", got, want)
	}
	if got := busyPick(); got != 1 {
		t.Errorf("five minutes later, picked endpoint %d, want 1 (idle, its stall forgotten)", got)
	}
}

// TestStallFoundByWatchTeachesNothing: the requests an engine held through a stall that a stall
// watch found (endpoint.Stalled, until its next answer) teach no speed, to the endpoint or to
// the fleet; one that waited through no stall does, even if slow.
func TestStallFoundByWatchTeachesNothing(t *testing.T) {
	pa, clk, eps, next, _ := stallFixture(t)
	rate0, rate1, fleet := pa.PrefillRate(0), pa.PrefillRate(1), pa.fleet.get()
	// Endpoint 1 stalls for 10 s, found by a watch 5 s in; ten requests held through it.
	var held []*Request
	for i := range 10 {
		held = append(held, next(seq(uint64(500_000+1000*i), 8)...))
	}
	start := clk.t
	for _, r := range held {
		pa.Routed(r, eps[1])
	}
	eps[1].Stalled(start.UnixNano(), start.Add(5*time.Second).UnixNano())
	clk.t = clk.t.Add(10 * time.Second)
	eps[1].Progressed(clk.t.UnixNano()) // the first token of the first held request
	for _, r := range held {
		pa.FirstToken(r, eps[1], 10*time.Second)
		pa.Done(r, eps[1], Result{OK: true, CachedTokens: -1})
	}
	if got0, got1, gotFleet := pa.PrefillRate(0), pa.PrefillRate(1), pa.fleet.get(); got0 != rate0 || got1 != rate1 || gotFleet != fleet {
		t.Errorf("after a stall found by a watch: prefill rates %.0f and %.0f tokens/s (fleet factor %.3f), want %.0f and %.0f (%.3f) as before it",
			got0, got1, gotFleet, rate0, rate1, fleet)
	}
	// The same wait, no stall found: learned.
	slow := next(seq(900_000, 8)...)
	pa.Routed(slow, eps[1])
	clk.t = clk.t.Add(10 * time.Second)
	pa.FirstToken(slow, eps[1], 10*time.Second)
	if got := pa.fleet.get(); got <= fleet {
		t.Errorf("a 10-s TTFT with no stall found: fleet factor %.3f, want above %.3f", got, fleet)
	}
}

// TestSpeedFitAgesWithTime: with a horizon, a calibration says what the endpoint did over
// about the last horizon, however few samples came since. A burst of 50 TTFTs four times
// slower than predicted, then one TTFT at the predicted speed every 10 s (an endpoint chosen
// only now and then): after four minutes of those, the burst has faded to 1.17 (within
// learnTolerance of 1), where counted by samples alone, 24 of them at 2 % each, it still said
// 2.51. Samples that come often age mostly by their number, as before (one every 100 ms: 0.17 %
// a sample by time against 2 % by number). Without a horizon (the fleet's), time changes
// nothing.
func TestSpeedFitAgesWithTime(t *testing.T) {
	const horizon = 60.0 // seconds
	sec := func(s float64) int64 { return int64(s * 1e9) }
	burst := func(h float64) (*speedFit, int64) {
		var f speedFit
		f.init()
		now := sec(1000)
		for range 50 {
			now += sec(0.1)
			f.add(0.2, 0.8, learnWeight, now, h, 1)
		}
		return &f, now
	}
	f, now := burst(horizon)
	if got := f.get(); math.Abs(got-4) > 1e-9 {
		t.Fatalf("after the burst: %v, want 4", got)
	}
	for range 24 {
		now += sec(10)
		f.add(0.2, 0.2, learnWeight, now, horizon, 1)
	}
	if got, w, ok := f.own(now); !ok || w != 1 || got > 1+learnTolerance {
		t.Errorf("24 samples at speed, one every 10 s after the burst: own %.3f at weight %v, %v; want at most %v at 1, true", got, w, ok, 1+learnTolerance)
	}

	g, now := burst(0)
	for range 24 {
		now += sec(10)
		g.add(0.2, 0.2, learnWeight, now, 0, 0)
	}
	want := (4*(1-math.Pow(1-learnWeight, 50))*math.Pow(1-learnWeight, 24) + 1 - math.Pow(1-learnWeight, 24)) /
		(1 - math.Pow(1-learnWeight, 74))
	if got := g.get(); math.Abs(got-want) > 1e-9 || got < 2.5 {
		t.Errorf("without a horizon, the same samples: %.4f, want %.4f (by number alone)", got, want)
	}
}
