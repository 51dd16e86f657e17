package des

import (
	"context"
	"errors"
	"math"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/policy"
	"github.com/kvroute/kvroute/internal/report"
	"github.com/kvroute/kvroute/internal/workload"
)

func ms(f float64) time.Duration { return time.Duration(f * float64(time.Millisecond)) }

// toyConfig is a fleet of n toy engines with 4-token blocks that reject prompts above 1000.
func toyConfig(n int) Config {
	return Config{
		Instances:        n,
		Model:            "toy",
		BlockSize:        4,
		KVCapacityTokens: 1000,
		NewEngine:        func(int) (Engine, error) { return newToy(4, 1000), nil },
	}
}

// req is a request of prompt tokens made of 4-token workload blocks with the given ids.
func req(id int, at time.Duration, prompt, output int, blocks ...uint64) workload.Request {
	return workload.Request{ID: id, Arrival: at, Blocks: blocks, BlockTokens: 4, PromptTokens: prompt, OutputTokens: output}
}

func run(t *testing.T, cfg Config, reqs []workload.Request, np NewPicker) *Result {
	t.Helper()
	res, err := Run(context.Background(), cfg, Prepare(reqs, cfg.Model, cfg.BlockSize), "p", np)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	return res
}

func TestSamePrefixHitsOnlyOnSameEngine(t *testing.T) {
	// Three requests with the same 10-token prompt (two full 4-token blocks), round-robin over
	// two engines: 0 and 2 land on sim-0, 1 on sim-1. Only request 2 finds the prefix.
	// Request 0: prefill 10 tokens = 1 + 1.0 ms, first token at 2 ms; one decode step, 3 ms.
	// Request 1: the same on sim-1 from 10 ms. Request 2 from 20 ms: 8 tokens cached, prefill
	// 2 tokens = 1.2 ms, first token at 21.2 ms, end at 22.2 ms.
	reqs := []workload.Request{
		req(0, 0, 10, 2, 1, 2, 3),
		req(1, ms(10), 10, 2, 1, 2, 3),
		req(2, ms(20), 10, 2, 1, 2, 3),
	}
	res := run(t, toyConfig(2), reqs, Named("round-robin", nil))
	want := []report.Record{
		{ID: "0", Policy: "p", EndpointID: 0, Endpoint: "sim-0", Arrival: 0, FirstToken: ms(2), Finish: ms(3), PromptTokens: 10, CachedTokens: 0, OutputTokens: 2, Attempts: 1},
		{ID: "1", Policy: "p", EndpointID: 1, Endpoint: "sim-1", Arrival: ms(10), FirstToken: ms(12), Finish: ms(13), PromptTokens: 10, CachedTokens: 0, OutputTokens: 2, Attempts: 1},
		{ID: "2", Policy: "p", EndpointID: 0, Endpoint: "sim-0", Arrival: ms(20), FirstToken: ms(21.2), Finish: ms(22.2), PromptTokens: 10, CachedTokens: 8, OutputTokens: 2, Attempts: 1},
	}
	if diff := cmp.Diff(want, res.Records); diff != "" {
		t.Errorf("records (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]time.Duration{ms(2) + ms(1) + ms(1.2) + ms(1), ms(3)}, res.Busy); diff != "" {
		t.Errorf("busy (-want +got):\n%s", diff)
	}
}

func TestSameInstantArrivalsJoinOneStep(t *testing.T) {
	// Two requests at t=0 on one engine: the toy prefills one per step, but both must be in
	// the engine before its first step starts, so the second is prefilled in step 2, not
	// after a wasted idle check. Request 0: first token at 1.4 ms (4 tokens). Step 2 prefills
	// request 1 (4 tokens, 1.4 ms) and finishes request 0 (one-decode): both at 2.8 ms.
	reqs := []workload.Request{req(0, 0, 4, 2, 7), req(1, 0, 4, 1, 8)}
	res := run(t, toyConfig(1), reqs, Named("round-robin", nil))
	got := [][2]time.Duration{{res.Records[0].FirstToken, res.Records[0].Finish}, {res.Records[1].FirstToken, res.Records[1].Finish}}
	want := [][2]time.Duration{{ms(1.4), ms(2.8)}, {ms(2.8), ms(2.8)}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(first token, finish) (-want +got):\n%s", diff)
	}
}

func TestNetworkLatency(t *testing.T) {
	// 5 ms each way: the engine gets the request at 5 ms, its first token is at 7 ms, the router
	// hears of it at 12 ms; the end (8 ms at the engine) at 13 ms.
	cfg := toyConfig(1)
	cfg.NetworkLatency = ms(5)
	res := run(t, cfg, []workload.Request{req(0, 0, 10, 2, 1, 2, 3)}, Named("round-robin", nil))
	r := res.Records[0]
	if r.FirstToken != ms(12) || r.Finish != ms(13) || r.Err != "" {
		t.Errorf("first token %v finish %v err %q, want 12ms 13ms none", r.FirstToken, r.Finish, r.Err)
	}
}

func randomWorkload(n int) []workload.Request {
	reqs := make([]workload.Request, n)
	for i := range reqs {
		// A few shared prefixes of varying depth, deterministic.
		g := uint64(i % 5)
		blocks := []uint64{100 + g, 200 + g, uint64(1000 + i)}
		reqs[i] = req(i, time.Duration(i)*ms(0.7), 10+i%3, 1+i%7, blocks...)
	}
	return reqs
}

func TestDeterministic(t *testing.T) {
	reqs := randomWorkload(300)
	cfg := toyConfig(4)
	cfg.Seed = 42
	for _, name := range []string{"random", "power-of-two", "round-robin", "least-request"} {
		a := run(t, cfg, reqs, Named(name, nil))
		b := run(t, cfg, reqs, Named(name, nil))
		if diff := cmp.Diff(a.Records, b.Records); diff != "" {
			t.Errorf("%s: two runs differ (-first +second):\n%s", name, diff)
		}
		done := 0
		for _, r := range a.Records {
			if r.Err == "" && r.Finish > 0 {
				done++
			}
		}
		if done != len(reqs) {
			t.Errorf("%s: %d of %d requests completed", name, done, len(reqs))
		}
	}
	// Another seed changes random's placement.
	a := run(t, cfg, reqs, Named("random", nil))
	cfg.Seed = 43
	b := run(t, cfg, reqs, Named("random", nil))
	if cmp.Equal(a.Records, b.Records) {
		t.Error("seeds 42 and 43 gave identical random placements")
	}
}

// spyPicker sends everything to the first candidate and records what it saw.
type spyPicker struct {
	clock policy.Clock
	mu    sync.Mutex
	seen  []spySeen
	calls []string
}

type spySeen struct {
	now      time.Time
	snap     endpoint.Snapshot
	inFlight int
	pending  int
}

func (p *spyPicker) Pick(_ *policy.Request, c []*endpoint.Endpoint) ([]*endpoint.Endpoint, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := spySeen{now: p.clock.Now(), inFlight: c[0].InFlight(), pending: c[0].PendingPrefill()}
	if sn := c[0].Snapshot(); sn != nil {
		s.snap = *sn
	}
	p.seen = append(p.seen, s)
	return c, nil
}

func (p *spyPicker) Routed(r *policy.Request, ep *endpoint.Endpoint) {
	p.calls = append(p.calls, "routed "+r.ID+" "+ep.Name)
}

func (p *spyPicker) FirstToken(r *policy.Request, ep *endpoint.Endpoint, ttft time.Duration) {
	p.calls = append(p.calls, "first "+r.ID+" "+ttft.String())
}

func (p *spyPicker) Done(r *policy.Request, ep *endpoint.Endpoint, res policy.Result) {
	p.calls = append(p.calls, "done "+r.ID+" "+res.TTFT.String()+" "+res.Duration.String()+" "+
		map[bool]string{true: "ok", false: "failed"}[res.OK]+" cached="+strconv.Itoa(res.CachedTokens))
}

func (p *spyPicker) Removed(*endpoint.Endpoint) {}

// PredictCached predicts, for the test, the router's in-flight count on ep times 100, so that
// the record shows the prediction was made before Routed.
func (p *spyPicker) PredictCached(_ *policy.Request, ep *endpoint.Endpoint) int {
	return 100 * ep.InFlight()
}

func TestSnapshotsAreScrapedNotLive(t *testing.T) {
	// Scrapes at 0, 100, 200 ms. Request 0 arrives at 10 ms and runs for 200+ ms (200 output
	// tokens at 1 ms each). Request 1 at 50 ms: the router's own counters show request 0 in
	// flight, but the snapshot is the one scraped at 0 (nothing running). Request 2 at 150 ms
	// sees the 100 ms snapshot, with request 0 running.
	cfg := toyConfig(1)
	cfg.ScrapeInterval = ms(100)
	reqs := []workload.Request{req(0, ms(10), 4, 200, 1), req(1, ms(50), 4, 1, 2), req(2, ms(150), 4, 1, 3)}
	spy := &spyPicker{}
	run(t, cfg, reqs, func(env policy.Env) (policy.Picker, error) { spy.clock = env.Clock; return spy, nil })
	if len(spy.seen) != 3 {
		t.Fatalf("picker called %d times, want 3", len(spy.seen))
	}
	ep := Epoch()
	type view struct {
		Now, At              time.Duration
		Running, InFlight    int
		BlockSize, NumBlocks int
	}
	var got []view
	for _, s := range spy.seen {
		got = append(got, view{s.now.Sub(ep), s.snap.At.Sub(ep), s.snap.Running, s.inFlight, s.snap.BlockSize, s.snap.NumGPUBlocks})
	}
	want := []view{
		{ms(10), 0, 0, 0, 4, 0},
		{ms(50), 0, 0, 1, 4, 0},
		{ms(150), ms(100), 1, 1, 4, 100},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("what the policy saw (-want +got):\n%s", diff)
	}
	for i, s := range spy.seen {
		if age := s.now.Sub(s.snap.At); age < 0 || age >= cfg.ScrapeInterval {
			t.Errorf("pick %d: snapshot age %v, want in [0, %v)", i, age, cfg.ScrapeInterval)
		}
	}
}

// TestSnapshotsCountTTFT checks the scraped TTFT histogram: the engine counts every first
// token, streamed or not, from the request's arrival at the engine (one network delay after
// routing), as vLLM's time_to_first_token_seconds does.
func TestSnapshotsCountTTFT(t *testing.T) {
	// TestObserverCalls's two requests, the second not streamed, 1 ms each way: their first
	// tokens come 2 ms and 1.2 ms after they reach the engine. A third request at 150 ms sees
	// the scrape at 100 ms.
	cfg := toyConfig(1)
	cfg.ScrapeInterval = ms(100)
	cfg.NetworkLatency = ms(1)
	reqs := []workload.Request{req(0, 0, 10, 2, 1, 2, 3), req(1, ms(5), 10, 2, 1, 2, 4), req(2, ms(150), 4, 1, 9)}
	reqs[1].Whole = true
	spy := &spyPicker{}
	run(t, cfg, reqs, func(env policy.Env) (policy.Picker, error) { spy.clock = env.Clock; return spy, nil })
	if len(spy.seen) != 3 {
		t.Fatalf("picker called %d times, want 3", len(spy.seen))
	}
	if sn := spy.seen[2].snap; sn.TTFTCount != 2 || math.Abs(sn.TTFTSum-0.0032) > 1e-9 {
		t.Errorf("scraped TTFT histogram: sum %g s over %g, want 0.0032 s over 2", sn.TTFTSum, sn.TTFTCount)
	}
}

func TestObserverCalls(t *testing.T) {
	// Request 0 (10 tokens, 2 out): first token at 2 ms, done at 3 ms. Request 1 shares both
	// blocks: 8 cached, first token at 5+1.2 = 6.2 ms, done at 7.2 ms.
	// Each request finds sim-0 idle when routed, so the spy's prediction (100 x in flight) is
	// 0: the simulator asks for it before Start and Routed count the request.
	reqs := []workload.Request{req(0, 0, 10, 2, 1, 2, 3), req(1, ms(5), 10, 2, 1, 2, 4)}
	spy := &spyPicker{}
	res := run(t, toyConfig(1), reqs, func(env policy.Env) (policy.Picker, error) { spy.clock = env.Clock; return spy, nil })
	for i, r := range res.Records {
		if !r.Predicted || r.PredictedCachedTokens != 0 {
			t.Errorf("record %d: predicted %v %d, want a prediction of 0 (made before Routed)", i, r.Predicted, r.PredictedCachedTokens)
		}
	}
	want := []string{
		"routed 0 sim-0", "first 0 2ms", "done 0 2ms 3ms ok cached=0",
		"routed 1 sim-0", "first 1 1.2ms", "done 1 1.2ms 2.2ms ok cached=8",
	}
	if diff := cmp.Diff(want, spy.calls); diff != "" {
		t.Errorf("observer calls (-want +got):\n%s", diff)
	}
}

type failPicker struct{}

func (failPicker) Pick(*policy.Request, []*endpoint.Endpoint) ([]*endpoint.Endpoint, error) {
	return nil, policy.ErrNoCandidate
}

func TestFailuresAreRecorded(t *testing.T) {
	// A prompt above the engine's capacity is rejected: failed, counters back to zero.
	cfg := toyConfig(2)
	reqs := []workload.Request{req(0, 0, 5000, 2, 1), req(1, ms(1), 10, 1, 1, 2)}
	res := run(t, cfg, reqs, Named("round-robin", nil))
	r := res.Records[0]
	if r.Err == "" || !strings.Contains(r.Err, "exceeds the KV capacity") || r.EndpointID != 0 || r.Finish != 0 {
		t.Errorf("oversized request: %+v, want failed on sim-0 at 0 with the engine's reason", r)
	}
	if res.Records[1].Err != "" {
		t.Errorf("request 1 failed: %q", res.Records[1].Err)
	}
	sum := report.Summarize("p", res.Records, res.Busy)
	if sum.Completed != 1 || sum.Failed != 1 {
		t.Errorf("completed %d failed %d, want 1 and 1", sum.Completed, sum.Failed)
	}

	// A picker that finds no candidate: failed, never routed.
	res = run(t, cfg, reqs[1:], func(policy.Env) (policy.Picker, error) { return failPicker{}, nil })
	if r := res.Records[0]; r.EndpointID != -1 || !strings.Contains(r.Err, "no candidate") {
		t.Errorf("unroutable request: %+v, want failed with no endpoint", r)
	}
}

func TestCounterBalance(t *testing.T) {
	// After a run, the router-side counters are back to zero on every endpoint.
	var eps []*endpoint.Endpoint
	cfg := toyConfig(3)
	run(t, cfg, randomWorkload(100), func(env policy.Env) (policy.Picker, error) {
		p, err := policy.New("least-request", nil, env)
		return collectPicker{p, &eps}, err
	})
	if len(eps) != 3 {
		t.Fatalf("saw %d endpoints, want 3", len(eps))
	}
	for _, ep := range eps {
		if ep.InFlight() != 0 || ep.PendingPrefill() != 0 {
			t.Errorf("%s: in flight %d, pending prefill %d after the run, want 0 and 0", ep.Name, ep.InFlight(), ep.PendingPrefill())
		}
	}
}

type collectPicker struct {
	policy.Picker
	eps *[]*endpoint.Endpoint
}

func (c collectPicker) Pick(r *policy.Request, cands []*endpoint.Endpoint) ([]*endpoint.Endpoint, error) {
	if len(*c.eps) == 0 {
		*c.eps = append(*c.eps, cands...)
	}
	return c.Picker.Pick(r, cands)
}

func TestRunErrors(t *testing.T) {
	w := Prepare(randomWorkload(3), "toy", 4)
	cfg := toyConfig(0)
	if _, err := Run(context.Background(), cfg, w, "p", Named("round-robin", nil)); err == nil || !strings.Contains(err.Error(), "instances") {
		t.Errorf("0 instances: err %v, want one naming instances", err)
	}
	if _, err := Run(context.Background(), toyConfig(1), w, "p", Named("nope", nil)); err == nil || !strings.Contains(err.Error(), "round-robin") {
		t.Errorf("unknown policy: err %v, want one listing the valid names", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Run(ctx, toyConfig(1), w, "p", Named("round-robin", nil)); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: err %v, want context.Canceled", err)
	}
}
