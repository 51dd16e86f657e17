package policy

import (
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/prefix"
)

// fakeClock is a manual clock for tests.
type fakeClock struct{ t time.Time }

func (c *fakeClock) Now() time.Time { return c.t }

// state returns endpoint id's state, adding it: tests name endpoints by ID, and those made in
// order 0, 1, ... before any other get slots of the same numbers in the index.
func (pa *prefixAware) state(id int) *paState {
	_, s, _ := pa.eps.get(&endpoint.Endpoint{ID: id})
	return s
}

func newEndpoints(n, kvTokens int) []*endpoint.Endpoint {
	eps := make([]*endpoint.Endpoint, n)
	for i := range eps {
		eps[i] = &endpoint.Endpoint{ID: i, Name: "ep-" + string(rune('0'+i)), KVCapacityTokens: kvTokens}
	}
	return eps
}

// req builds a request of len(keys) 16-token blocks plus tail extra tokens.
func req(id string, tail int, keys ...uint64) *Request {
	return &Request{
		ID: id, Model: "m", BlockTokens: 16,
		Blocks:       prefix.Chain(nil, prefix.Seed("m", ""), keys),
		PromptTokens: 16*len(keys) + tail,
	}
}

func seq(from, n uint64) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = from + uint64(i)
	}
	return out
}

func ids(eps []*endpoint.Endpoint) []int {
	out := make([]int, len(eps))
	for i, e := range eps {
		out[i] = e.ID
	}
	return out
}

func newPA(t *testing.T, p Params) (*prefixAware, *fakeClock) {
	t.Helper()
	clk := &fakeClock{t: time.Unix(1000, 0)}
	pk, err := New("prefix-aware", p, Env{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	return pk.(*prefixAware), clk
}

// newPAWith is newPA with the always-on mechanisms set by set, to test one alone.
func newPAWith(t *testing.T, p Params, set func(*prefixAware)) (*prefixAware, *fakeClock) {
	t.Helper()
	pa, clk := newPA(t, p)
	set(pa)
	return pa, clk
}

// route picks and routes like the proxy does, returning the chosen endpoint.
func route(t *testing.T, pa *prefixAware, r *Request, eps []*endpoint.Endpoint) *endpoint.Endpoint {
	t.Helper()
	ranked, err := pa.Pick(r, eps)
	if err != nil {
		t.Fatal(err)
	}
	if len(ranked) != len(eps) {
		t.Fatalf("ranked %d of %d candidates", len(ranked), len(eps))
	}
	ep := ranked[0]
	ep.Start(r.PromptTokens)
	pa.Routed(r, ep)
	return ep
}

// finish delivers first token and done, with the engine reporting cached tokens.
func finish(pa *prefixAware, r *Request, ep *endpoint.Endpoint, ttft time.Duration, cached int) {
	ep.FirstToken(r.PromptTokens)
	pa.FirstToken(r, ep, ttft)
	ep.Finish(r.PromptTokens, true)
	pa.Done(r, ep, Result{OK: true, CachedTokens: cached, PromptTokens: r.PromptTokens, TTFT: ttft})
}

func TestPrefixAware_FollowsCachedPrefix(t *testing.T) {
	pa, _ := newPA(t, nil)
	eps := newEndpoints(4, 1<<20)
	a := req("a", 5, seq(1, 100)...)
	first := route(t, pa, a, eps)
	finish(pa, a, first, 0, -1)
	// A follow-up sharing 100 blocks goes where they are.
	r := req("b", 5, append(seq(1, 100), 500, 501)...)
	ranked, err := pa.Pick(r, eps)
	if err != nil {
		t.Fatal(err)
	}
	if ranked[0] != first {
		t.Errorf("follow-up went to %d, want %d (holds the prefix)", ranked[0].ID, first.ID)
	}
	if got, want := pa.PredictCached(r, first), 1600; got != want {
		t.Errorf("PredictCached = %d, want %d", got, want)
	}
	if got := pa.PredictCached(r, eps[(first.ID+1)%4]); got != 0 {
		t.Errorf("PredictCached elsewhere = %d, want 0", got)
	}
	if n, b := pa.IndexSize(); n != 100 || b <= 0 {
		t.Errorf("IndexSize = %d, %d; want 100 entries", n, b)
	}
}

func TestPrefixAware_QueueBeatsCache(t *testing.T) {
	pa, _ := newPA(t, Params{"max_load_factor": "100"})
	eps := newEndpoints(2, 1<<20)
	// Endpoint 0 holds a 100-block prefix, but 20 requests of 2,000 uncached blocks each are
	// queued on it: recomputing 1,600 tokens on idle endpoint 1 is faster.
	warm := req("w", 0, seq(1, 100)...)
	eps[0].Start(warm.PromptTokens)
	pa.Routed(warm, eps[0])
	finish(pa, warm, eps[0], 0, 0)
	for i := 0; i < 20; i++ {
		r := req("q", 0, seq(uint64(10000+i*3000), 2000)...)
		eps[0].Start(r.PromptTokens)
		pa.Routed(r, eps[0])
	}
	got, err := pa.Pick(req("x", 0, append(seq(1, 100), 7)...), eps)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]int{1, 0}, ids(got)); diff != "" {
		t.Errorf("ranking (-want +got):\n%s", diff)
	}
}

// A prefix every request shares: the first endpoint takes requests until the load bound
// stops it, then the prefix spills to the next one, which from then on holds it too.
func TestPrefixAware_HotPrefixSpillsAtLoadBound(t *testing.T) {
	pa, _ := newPA(t, Params{"max_load_factor": "1.5"})
	eps := newEndpoints(4, 1<<20)
	shared := seq(1, 200)
	counts := map[int]int{}
	for i := 0; i < 12; i++ {
		// 200 shared blocks plus a unique short tail: the cached prefix dominates.
		r := req("r", 0, append(append([]uint64{}, shared...), uint64(100000+i))...)
		ep := route(t, pa, r, eps)
		counts[ep.ID]++
		total := 0
		for _, e := range eps {
			total += e.InFlight()
		}
		// An endpoint within its bound (this request counted) takes one more.
		limit := int(math.Ceil(1.5*float64(total)/4)) + 1
		for _, e := range eps {
			if e.InFlight() > limit {
				t.Fatalf("request %d: endpoint %d has %d in flight, above the bound %d", i, e.ID, e.InFlight(), limit)
			}
		}
	}
	if len(counts) < 2 {
		t.Fatalf("hot prefix never spilled: %v", counts)
	}
	holders := 0
	probe := req("p", 0, shared...)
	for _, e := range eps {
		if pa.PredictCached(probe, e) > 0 {
			holders++
		}
	}
	if holders != len(counts) {
		t.Errorf("%d endpoints hold the prefix, %d took requests", holders, len(counts))
	}
}

func TestPrefixAware_NewContentGoesWhereCacheHasRoom(t *testing.T) {
	pa, clk := newPA(t, nil)
	eps := newEndpoints(3, 16*100) // 100 blocks each
	// Fill endpoint 0 to 60 % and endpoint 1 to 30 %: a cold prompt goes to 2, then 1.
	for i, n := range []uint64{60, 30} {
		r := req("fill", 0, seq(uint64(1000*(i+1)), n)...)
		eps[i].Start(r.PromptTokens)
		pa.Routed(r, eps[i])
		finish(pa, r, eps[i], time.Millisecond, 0)
	}
	if diff := cmp.Diff([]int{2, 1, 0}, ids(mustPick(t, pa, req("cold", 0, seq(9000, 20)...), eps))); diff != "" {
		t.Errorf("ranking by cache fill (-want +got):\n%s", diff)
	}
	// All full: the endpoint whose oldest entry is oldest evicts the least useful content.
	for at, i := range []int{1, 2, 0} { // endpoint 1 filled first, then 2, then 0
		clk.t = time.Unix(2001+int64(at), 0)
		r := req("full", 0, seq(uint64(20000*(i+1)), 100)...)
		eps[i].Start(r.PromptTokens)
		pa.Routed(r, eps[i])
		finish(pa, r, eps[i], time.Millisecond, 0)
	}
	clk.t = time.Unix(2010, 0)
	if got := mustPick(t, pa, req("cold2", 0, seq(50000, 20)...), eps); got[0].ID != 1 {
		t.Errorf("ranking %v, want 1 (oldest content) first", ids(got))
	}
	// A request whose prefix one endpoint holds still goes there: the term weighs new work only.
	if got := mustPick(t, pa, req("warm", 0, seq(20000, 100)...), eps); got[0].ID != 0 {
		t.Errorf("ranking %v, want 0 (holds the prefix) first", ids(got))
	}
}

func mustPick(t *testing.T, pa *prefixAware, r *Request, eps []*endpoint.Endpoint) []*endpoint.Endpoint {
	t.Helper()
	got, err := pa.Pick(r, eps)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func TestPrefixAware_LearnsPrefillRate(t *testing.T) {
	pa, _ := newPA(t, Params{"max_load_factor": "100"})
	eps := newEndpoints(3, 1<<20)
	// Endpoint 1 turns out 4x slower than the prior model says; endpoints 0 and 2 match it,
	// give or take 10 % of noise.
	for i := 0; i < 60; i++ {
		for _, e := range eps {
			r := req("l", 0, seq(uint64(1e6*(e.ID+1)+i*1000), uint64(10+i%7*40))...)
			e.Start(r.PromptTokens)
			pa.Routed(r, e)
			predicted := 0.02 + float64(pa.mustFlight(t, r).ahead)/10000
			slow := 1 + 0.1*float64(i%3-1)
			if e.ID == 1 {
				slow = 4
			}
			finish(pa, r, e, time.Duration(slow*predicted*float64(time.Second)), 0)
		}
	}
	for id, want := range []float64{10000, 2500, 10000} {
		got := pa.PrefillRate(id)
		if math.Abs(got-want)/want > 0.1 {
			t.Errorf("endpoint %d: learned rate %.0f tokens/s, want %.0f", id, got, want)
		}
	}
	// Noise between the two equal endpoints is ignored: they get the same rate.
	if a, b := pa.PrefillRate(0), pa.PrefillRate(2); a != b {
		t.Errorf("equal endpoints calibrated apart: %.0f vs %.0f", a, b)
	}
	// Equally loaded, equally cold endpoints: the slow one comes last.
	got, _ := pa.Pick(req("x", 0, seq(7e6, 300)...), eps)
	if got[2].ID != 1 {
		t.Errorf("ranking %v, want the slow endpoint 1 last", ids(got))
	}
}

func (pa *prefixAware) mustFlight(t *testing.T, r *Request) *paFlight {
	t.Helper()
	v, ok := pa.inflight.Load(r)
	if !ok {
		t.Fatalf("request %s not in flight", r.ID)
	}
	return v.(*paFlight)
}

func TestPrefixAware_CorrectsIndexFromCachedTokens(t *testing.T) {
	pa, clk := newPA(t, nil)
	eps := newEndpoints(2, 1<<20)
	oldest := req("oldest", 0, seq(7000, 20)...)
	eps[0].Start(oldest.PromptTokens)
	pa.Routed(oldest, eps[0])
	finish(pa, oldest, eps[0], time.Millisecond, 0)
	clk.t = clk.t.Add(time.Second)
	old := req("old", 0, seq(1, 50)...)
	eps[0].Start(old.PromptTokens)
	pa.Routed(old, eps[0])
	finish(pa, old, eps[0], time.Millisecond, 0)
	clk.t = clk.t.Add(time.Second)
	newer := req("new", 0, seq(100, 20)...)
	eps[0].Start(newer.PromptTokens)
	pa.Routed(newer, eps[0])
	finish(pa, newer, eps[0], time.Millisecond, 0)

	clk.t = clk.t.Add(time.Second)
	again := req("again", 8, seq(1, 50)...)
	if got := pa.PredictCached(again, eps[0]); got != 800 {
		t.Fatalf("predicted %d cached tokens, want 800", got)
	}
	eps[0].Start(again.PromptTokens)
	pa.Routed(again, eps[0])
	// The engine had only the first 10 blocks: it evicted block 10 and, being LRU, everything
	// older. The index drops them; newer entries survive.
	finish(pa, again, eps[0], time.Millisecond, 160)
	if got := pa.PredictCached(req("p", 0, seq(7000, 20)...), eps[0]); got != 0 {
		t.Errorf("older entries survived the correction: %d tokens predicted", got)
	}
	if got := pa.PredictCached(req("p", 0, seq(100, 20)...), eps[0]); got != 304 {
		t.Errorf("newer entries: %d tokens predicted, want 304", got)
	}
	// What the request itself just computed is held again.
	if got := pa.PredictCached(again, eps[0]); got != 800 {
		t.Errorf("after correction predicted %d, want 800 (recomputed blocks)", got)
	}
}

func TestPrefixAware_EndpointGoesDown(t *testing.T) {
	pa, _ := newPA(t, nil)
	eps := newEndpoints(3, 1<<20)
	r := req("a", 0, seq(1, 64)...)
	eps[2].Start(r.PromptTokens)
	pa.Routed(r, eps[2])
	finish(pa, r, eps[2], time.Millisecond, 0)
	if got, _ := pa.Pick(req("b", 0, seq(1, 64)...), eps); got[0].ID != 2 {
		t.Fatalf("picked %d, want 2", got[0].ID)
	}
	// Endpoint 2 goes down: the proxy stops offering it, then removes it.
	got, err := pa.Pick(req("c", 0, seq(1, 64)...), eps[:2])
	if err != nil || len(got) != 2 {
		t.Fatalf("Pick without 2: %v, %v", ids(got), err)
	}
	pa.Removed(eps[2])
	if n, _ := pa.IndexSize(); n != 0 {
		t.Errorf("index holds %d entries after Removed", n)
	}
	if pa.PredictCached(r, eps[2]) != 0 {
		t.Errorf("removed endpoint still predicted to hold the prefix")
	}
	// Late callbacks for requests on the removed endpoint are harmless.
	pa.Done(r, eps[2], Result{CachedTokens: 0})
}

func TestPrefixAware_FailedAttemptLeavesNoTrace(t *testing.T) {
	pa, _ := newPA(t, nil)
	eps := newEndpoints(2, 1<<20)
	warm := req("warm", 0, seq(1, 10)...)
	eps[1].Start(warm.PromptTokens)
	pa.Routed(warm, eps[1])
	finish(pa, warm, eps[1], time.Millisecond, 0)
	// A longer request goes to endpoint 1, which refuses it (connection error, 503): the proxy
	// reports it done, not OK, without a first token, and falls back to endpoint 0.
	r := req("r", 0, seq(1, 30)...)
	eps[1].Start(r.PromptTokens)
	pa.Routed(r, eps[1])
	eps[1].Finish(r.PromptTokens, false)
	pa.Done(r, eps[1], Result{OK: false, CachedTokens: -1, PromptTokens: r.PromptTokens})
	if got := pa.PredictCached(r, eps[1]); got != 160 {
		t.Errorf("endpoint 1 predicted %d cached tokens, want 160 (what it held before)", got)
	}
	if s := pa.state(1); s.pending.Load() != 0 || s.waiting.Load() != 0 {
		t.Errorf("endpoint 1 still has pending %d, waiting %d", s.pending.Load(), s.waiting.Load())
	}
	eps[0].Start(r.PromptTokens)
	pa.Routed(r, eps[0])
	finish(pa, r, eps[0], time.Millisecond, 0)
	if got := pa.PredictCached(r, eps[0]); got != 464 {
		t.Errorf("endpoint 0 predicted %d cached tokens, want 464", got)
	}
}

func TestPrefixAware_IndexSizedFromKVCapacity(t *testing.T) {
	pa, _ := newPA(t, nil)
	eps := newEndpoints(1, 160) // 10 blocks of 16 tokens
	r := req("a", 0, seq(1, 30)...)
	route(t, pa, r, eps)
	if n, _ := pa.IndexSize(); n != 10 {
		t.Errorf("index holds %d entries, want the endpoint's 10 KV blocks", n)
	}
	eps[0].SetSnapshot(&endpoint.Snapshot{BlockSize: 16, NumGPUBlocks: 20})
	route(t, pa, req("b", 0, seq(1, 30)...), eps)
	if n, _ := pa.IndexSize(); n != 20 {
		t.Errorf("index holds %d entries, want 20 after the scrape", n)
	}
}

func TestPrefixAware_BadParams(t *testing.T) {
	_, err := New("prefix-aware", Params{"max_load_factor": "0.5", "cache_weight": "lots", "affinity_window": "-1", "step_tokens": "-1", "learn": "false", "colour": "red"}, Env{})
	if err == nil {
		t.Fatal("want an error")
	}
	for _, want := range []string{"max_load_factor=0.5 must be at least 1", `cache_weight="lots" is not a number`,
		"affinity_window=-1 must not be negative", "step_tokens=-1 must not be negative", "parameter learn was removed: learning from observed TTFTs is always on; delete it", `unknown parameter "colour"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
}

func TestPrefixAware_ConcurrentPicks(t *testing.T) {
	pa, _ := newPA(t, nil)
	eps := newEndpoints(8, 1<<16)
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				r := req("c", 3, seq(uint64(i%10*100), uint64(20+g))...)
				r.Whole = (i+g)%3 == 0 // its end alone, and streamed first tokens behind it
				ranked, err := pa.Pick(r, eps)
				if err != nil || len(ranked) != len(eps) {
					t.Errorf("Pick: %d ranked, %v", len(ranked), err)
					return
				}
				ep := ranked[0]
				ep.Start(r.PromptTokens)
				pa.Routed(r, ep)
				if r.Whole {
					ep.Finish(r.PromptTokens, false)
					pa.Done(r, ep, Result{OK: true, CachedTokens: 16, PromptTokens: r.PromptTokens})
					continue
				}
				finish(pa, r, ep, time.Millisecond, 16)
			}
		}(g)
	}
	wg.Wait()
	for _, e := range eps {
		s := pa.state(e.ID)
		if s.pending.Load() != 0 || s.waiting.Load() != 0 || e.InFlight() != 0 {
			t.Errorf("endpoint %d: pending %d waiting %d in flight %d after all done", e.ID, s.pending.Load(), s.waiting.Load(), e.InFlight())
		}
	}
}

// An endpoint with too few samples of its own is calibrated like the fleet: its prior (factor
// 1) is no measurement, and comparing it with measured endpoints would make them look faster.
func TestPrefixAware_UnlearnedEndpointUsesFleetSpeed(t *testing.T) {
	pa, _ := newPA(t, nil)
	eps := newEndpoints(3, 1<<20)
	// Endpoint 0 turns out 2x slower than the prior model says; 1 and 2 have served nothing.
	for i := 0; i < 20; i++ {
		r := req("l", 0, seq(uint64(1000*i), 50)...)
		eps[0].Start(r.PromptTokens)
		pa.Routed(r, eps[0])
		predicted := 0.02 + float64(pa.mustFlight(t, r).ahead)/10000
		finish(pa, r, eps[0], time.Duration(2*predicted*float64(time.Second)), 0)
	}
	if got := pa.PrefillRate(0); math.Abs(got-5000) > 50 {
		t.Fatalf("endpoint 0: learned rate %.0f tokens/s, want 5000", got)
	}
	for _, id := range []int{1, 2} {
		if got := pa.PrefillRate(id); math.Abs(got-5000) > 50 {
			t.Errorf("endpoint %d (no samples): rate %.0f tokens/s, want the fleet's 5000", id, got)
		}
	}
}

// The head of a queue is being prefilled: what it has done since it started no longer waits.
func TestPrefixAware_HeadProgressShortensQueue(t *testing.T) {
	for _, tc := range []struct {
		progress bool
		want     []int // ranking of the follow-up 2.4 s after the long prefill started
	}{
		{true, []int{0, 1}},
		{false, []int{1, 0}},
	} {
		t.Run(fmt.Sprintf("progress=%v", tc.progress), func(t *testing.T) {
			pa, clk := newPAWith(t, Params{"cache_weight": "0", "affinity_window": "0"}, func(pa *prefixAware) {
				pa.progress, pa.learn = tc.progress, false
			})
			eps := newEndpoints(2, 1<<20)
			warm := req("warm", 0, seq(1, 100)...)
			eps[0].Start(warm.PromptTokens)
			pa.Routed(warm, eps[0])
			finish(pa, warm, eps[0], time.Millisecond, 0)
			// A cold 20,000-token prompt starts on endpoint 0: 20,000 + 25 x 200M pairs / 1M =
			// 25,000 units of work, 2.52 s at the prior rate.
			long := req("long", 0, seq(50000, 1250)...)
			eps[0].Start(long.PromptTokens)
			pa.Routed(long, eps[0])
			// The follow-up has 5 uncached tokens on endpoint 0 and 1,605 (1,637 units) on 1.
			r := req("r", 5, seq(1, 100)...)
			if got := ids(mustPick(t, pa, r, eps)); got[0] != 1 {
				t.Fatalf("at once: ranking %v, want 1 first (25,000 units queued on 0)", got)
			}
			// 2.4 s later the prefill has done (2.4 - 0.02) x 10,000 = 23,800 units: 1,200 remain.
			clk.t = clk.t.Add(2400 * time.Millisecond)
			if diff := cmp.Diff(tc.want, ids(mustPick(t, pa, r, eps))); diff != "" {
				t.Errorf("after 2.4 s, ranking (-want +got):\n%s", diff)
			}
			// Its first token takes it off the queue, whatever the progress model said.
			finish(pa, long, eps[0], 2500*time.Millisecond, 0)
			if got := pa.queued(pa.state(0), clk.t.UnixNano(), 1); got != 0 {
				t.Errorf("queued after the first token: %g, want 0", got)
			}
		})
	}
}

// Under chunked prefill a request fills the rest of the last step of the request at the tail
// of the queue when that step has not started, and that one's first token comes with the
// fuller step: the placement is charged that delay (step_tokens), and a request routed once
// the tail's last step has started begins a step of its own.
func TestPrefixAware_SharedLastStep(t *testing.T) {
	for _, tc := range []struct {
		step int
		want []int // ranking of a 1,000-token prompt
	}{
		{4096, []int{1, 0}},
		{0, []int{0, 1}},
	} {
		t.Run(fmt.Sprintf("step_tokens=%d", tc.step), func(t *testing.T) {
			pa, clk := newPAWith(t, Params{"cache_weight": "0", "affinity_window": "0", "attention_weight": "0",
				"step_tokens": fmt.Sprint(tc.step)}, func(pa *prefixAware) { pa.learn = false })
			eps := newEndpoints(2, 1<<20)
			place := func(r *Request, ep *endpoint.Endpoint) {
				ep.Start(r.PromptTokens)
				pa.Routed(r, ep)
			}
			// Endpoint 1: 9,000 tokens (steps of 4,096, 4,096 and 808); 0.84 s later the prior
			// rate has done (0.84 - 0.02) x 10,000 = 8,200 of them: the last step has started,
			// and the next 4,096 tokens fill a step of their own. 4,896 remain.
			c := req("c", 8, seq(1000, 562)...)
			place(c, eps[1])
			clk.t = clk.t.Add(840 * time.Millisecond)
			place(req("d", 0, seq(2000, 256)...), eps[1])
			// Endpoint 0: 4,500 tokens just placed: steps of 4,096 and 404, the second not started.
			a := req("a", 4, seq(3000, 281)...)
			place(a, eps[0])
			b := req("b", 8, seq(4000, 62)...) // 1,000 tokens, none cached
			now := clk.t.UnixNano()
			want0 := 0.0
			if tc.step > 0 {
				want0 = 1000 // all of b fits in the 3,692 tokens left in a's last step
			}
			if got := pa.shared(pa.state(0), b, 0, now, 1); got != want0 {
				t.Errorf("shared on 0: %g, want %g", got, want0)
			}
			if got := pa.shared(pa.state(1), b, 0, now, 1); got != 0 {
				t.Errorf("shared on 1: %g, want 0 (its tail fills a step)", got)
			}
			// 4,500 + 1,000 + 1,000 against 4,896 + 1,000; without the term 5,500 against 5,896.
			if diff := cmp.Diff(tc.want, ids(mustPick(t, pa, b, eps))); diff != "" {
				t.Errorf("ranking (-want +got):\n%s", diff)
			}
			if tc.step == 0 {
				return
			}
			long := req("long", 8, seq(5000, 312)...) // 5,000 tokens: 3,692 of them fill a's last step
			if got := pa.shared(pa.state(0), long, 0, now, 1); got != 3692 {
				t.Errorf("shared on 0 for 5,000 tokens: %g, want 3692", got)
			}
			// 0.42 s on, a's progress (4,000 tokens) is short of its last step; at 0.43 s it
			// is past it (4,100 of 4,096).
			clk.t = clk.t.Add(420 * time.Millisecond)
			if got := pa.shared(pa.state(0), b, 0, clk.t.UnixNano(), 1); got != 1000 {
				t.Errorf("after 0.42 s: shared %g, want 1000", got)
			}
			clk.t = clk.t.Add(10 * time.Millisecond)
			if got := pa.shared(pa.state(0), b, 0, clk.t.UnixNano(), 1); got != 0 {
				t.Errorf("after 0.43 s: shared %g, want 0 (a's last step has started)", got)
			}
			// c's first token: d is the head, its tokens from 9,000 (where c's last step ended).
			finish(pa, c, eps[1], 900*time.Millisecond, 0)
			s := pa.state(1)
			s.mu.Lock()
			start, fill, at, ok := s.stepTail(clk.t.UnixNano(), 1)
			s.mu.Unlock()
			if start != 9000 || fill != 4096 || at != 9000 || ok {
				t.Errorf("endpoint 1 after c's first token: tail step at %d holding %d, head at %d, ok %v; want 9000, 4096, 9000, false", start, fill, at, ok)
			}
		})
	}
}

// With one router a request that would fill the rest of the tail's last step, when that step
// has not started and the head's prefill is within its tokens of it, is held until a quarter
// into the step (by the calibrated speed), so that it starts a step of its own; a request that
// would go there meanwhile waits until just after the held one; nothing is held before the
// fleet's speed is calibrated, without a step budget, or once the step has started.
func TestPrefixAware_HoldsForTheTailsLastStep(t *testing.T) {
	for _, tc := range []struct {
		name       string
		step       string
		calibrated bool
		want       []time.Duration // at 0, 0.40, 0.43 and 0.45 s
	}{
		// 4,500 tokens: steps of 4,096 and 404. At 0.40 s the prior rate has done 3,800 of
		// them: 296 to the step, plus a quarter of its 404, is 397 tokens, 39.7 ms; the hold
		// for it lasts to 0.4397 s, so at 0.43 s the next one waits 9.7 ms (and a nanosecond).
		{"held", "4096", true, []time.Duration{0, 39700 * time.Microsecond, 9700*time.Microsecond + 1, 0}},
		{"no step budget", "0", true, []time.Duration{0, 0, 0, 0}},
		{"not calibrated", "4096", false, []time.Duration{0, 0, 0, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pa, clk := newPAWith(t, Params{"cache_weight": "0", "affinity_window": "0", "attention_weight": "0",
				"step_tokens": tc.step}, func(pa *prefixAware) { pa.learn = false })
			if tc.calibrated {
				for range 10 {
					pa.fleet.add(1, 1, learnWeight, 0, 0, 0) // observed as predicted: speed 1
				}
			}
			eps := newEndpoints(1, 1<<20)
			t0 := clk.t
			a := req("a", 4, seq(3000, 281)...)
			eps[0].Start(a.PromptTokens)
			pa.Routed(a, eps[0])
			b := req("b", 8, seq(4000, 62)...) // 1,000 tokens
			for k, at := range []time.Duration{0, 400 * time.Millisecond, 430 * time.Millisecond, 450 * time.Millisecond} {
				clk.t = t0.Add(at)
				got := pa.Defer(b, eps)
				if d := got - tc.want[k]; d < -time.Microsecond || d > time.Microsecond {
					t.Errorf("at %v: held %v, want %v", at, got, tc.want[k])
				}
			}
		})
	}
}

// New work on an endpoint whose cache draws steady traffic delays that traffic: between two
// otherwise equal idle endpoints, a cold prompt goes to the one fewer requests are bound to.
func TestPrefixAware_AffinityTrafficWeighsNewWork(t *testing.T) {
	for _, tc := range []struct {
		window string
		want   []int
	}{
		{"60", []int{1, 0}},
		{"0", []int{0, 1}}, // a tie: candidate order
	} {
		t.Run("affinity_window="+tc.window, func(t *testing.T) {
			pa, clk := newPAWith(t, Params{"affinity_window": tc.window, "cache_weight": "0"}, func(pa *prefixAware) { pa.learn = false })
			eps := newEndpoints(2, 1<<20)
			// Twenty requests, one a second, share a 200-block prefix that endpoint 0 holds;
			// endpoint 1 serves as many prompts that share nothing.
			for i := 0; i < 20; i++ {
				clk.t = clk.t.Add(time.Second)
				a := req("a", 0, append(seq(1, 200), uint64(10000+i))...)
				eps[0].Start(a.PromptTokens)
				pa.Routed(a, eps[0])
				finish(pa, a, eps[0], 50*time.Millisecond, 0)
				b := req("b", 0, seq(uint64(100000+i*1000), 201)...)
				eps[1].Start(b.PromptTokens)
				pa.Routed(b, eps[1])
				finish(pa, b, eps[1], 50*time.Millisecond, 0)
			}
			if diff := cmp.Diff(tc.want, ids(mustPick(t, pa, req("cold", 0, seq(900000, 500)...), eps))); diff != "" {
				t.Errorf("ranking of a cold prompt (-want +got):\n%s", diff)
			}
		})
	}
}

// The engine frees a request's blocks into its LRU when the request ends, not when it starts,
// so the index renews them at Done: a long request's prefix outlives a short one routed later.
func TestPrefixAware_BlocksRenewedWhenRequestEnds(t *testing.T) {
	for _, tc := range []struct {
		touch      bool
		long, late int // predicted cached tokens after the eviction
	}{
		{true, 160, 80},
		{false, 80, 160},
	} {
		t.Run(fmt.Sprintf("touch=%v", tc.touch), func(t *testing.T) {
			pa, clk := newPAWith(t, nil, func(pa *prefixAware) { pa.touchDone = tc.touch })
			eps := newEndpoints(1, 16*30) // 30 blocks
			long := req("long", 8, seq(1, 10)...)
			eps[0].Start(long.PromptTokens)
			pa.Routed(long, eps[0])
			clk.t = clk.t.Add(time.Second)
			late := req("late", 8, seq(100, 10)...)
			route(t, pa, late, eps)
			clk.t = clk.t.Add(time.Second)
			finish(pa, late, eps[0], time.Millisecond, 0)
			clk.t = clk.t.Add(time.Second)
			finish(pa, long, eps[0], time.Millisecond, 0)
			// 15 new blocks: 5 of the 20 held must go, the least recently freed first (a
			// prompt's last blocks before its first ones).
			clk.t = clk.t.Add(time.Second)
			route(t, pa, req("new", 0, seq(1000, 15)...), eps)
			if got := pa.PredictCached(long, eps[0]); got != tc.long {
				t.Errorf("long request's prefix: %d tokens predicted, want %d", got, tc.long)
			}
			if got := pa.PredictCached(late, eps[0]); got != tc.late {
				t.Errorf("later, shorter request's prefix: %d tokens predicted, want %d", got, tc.late)
			}
		})
	}
}

// An endpoint that is slower takes a smaller share of the requests in flight before the load
// bound sends its requests elsewhere: shares follow the calibrated speeds.
func TestPrefixAware_BoundSharesFollowSpeed(t *testing.T) {
	pa, _ := newPA(t, Params{"max_load_factor": "1"})
	eps := newEndpoints(3, 1<<20)
	// Endpoint 2 turns out 2x slower than 0 and 1, which match the prior model.
	for i := range 20 {
		for _, e := range eps {
			r := req("l", 0, seq(uint64(1e6*(e.ID+1)+i*1000), 50)...)
			e.Start(r.PromptTokens)
			pa.Routed(r, e)
			predicted := overhead + float64(pa.mustFlight(t, r).ahead)/prefillRate
			slow := 1.0
			if e.ID == 2 {
				slow = 2
			}
			finish(pa, r, e, time.Duration(slow*predicted*float64(time.Second)), 0)
		}
	}
	// Endpoint 2 holds the prompt. Three requests in flight on endpoint 0 and three on 2: with
	// this one, 7 in the fleet. A fast endpoint's share is about 7 x 0.75 / 2 = 2.6 (bound 3:
	// it may take one more), the slow one's 7 x 0.5 / 2 = 1.75 (bound 2: it may not).
	hot := req("hot", 0, seq(5e6, 100)...)
	eps[2].Start(hot.PromptTokens)
	pa.Routed(hot, eps[2])
	finish(pa, hot, eps[2], 10*time.Millisecond, 0)
	for _, i := range []int{0, 0, 0, 2, 2, 2} {
		eps[i].Start(1)
	}
	ex := pa.Explain(req("x", 0, append(seq(5e6, 100), 1)...), eps)
	within := map[int]bool{}
	for _, x := range ex {
		within[x.Endpoint.ID] = x.WithinBound
	}
	if diff := cmp.Diff(map[int]bool{0: true, 1: true, 2: false}, within); diff != "" {
		t.Errorf("within the bound, with 3, 0, 3 in flight (-want +got):\n%s", diff)
	}
	if ex[2].Endpoint.ID != 2 {
		t.Errorf("ranking %v, want the holder past its bound last", []int{ex[0].Endpoint.ID, ex[1].Endpoint.ID, ex[2].Endpoint.ID})
	}
}

// Explain says what Pick weighs: in Pick's order, what each endpoint holds of the prompt and
// the TTFT predicted there.
func TestPrefixAware_Explain(t *testing.T) {
	pa, _ := newPA(t, nil)
	eps := newEndpoints(3, 1<<20)
	warm := req("w", 0, seq(1, 100)...)
	route(t, pa, warm, eps)
	finish(pa, warm, eps[0], 20*time.Millisecond, 0)
	r := req("r", 5, seq(1, 100)...)
	ex := pa.Explain(r, eps)
	ranked := mustPick(t, pa, r, eps)
	if len(ex) != 3 {
		t.Fatalf("%d explanations, want 3", len(ex))
	}
	for k := range ex {
		if ex[k].Endpoint != ranked[k] {
			t.Errorf("explanation %d is endpoint %d, Pick ranks %d there", k, ex[k].Endpoint.ID, ranked[k].ID)
		}
	}
	if ex[0].Endpoint.ID != 0 || ex[0].CachedTokens != 1600 || ex[1].CachedTokens != 0 {
		t.Errorf("explanations %+v, want endpoint 0 first holding 1600 tokens, the others none", ex)
	}
	// 5 uncached tokens at the prior rate after the overhead; 1605 (plus attention) elsewhere.
	if d := ex[0].PredictedTTFT; d < 20*time.Millisecond || d > 21*time.Millisecond {
		t.Errorf("predicted TTFT on the holder %v, want just over the 20 ms overhead", d)
	}
	if d := ex[1].PredictedTTFT; d < 180*time.Millisecond {
		t.Errorf("predicted TTFT elsewhere %v, want 1605 tokens' worth, over 180 ms", d)
	}
	if !ex[0].WithinBound || ex[0].Cost > ex[1].Cost {
		t.Errorf("holder: within bound %v, cost %v against %v", ex[0].WithinBound, ex[0].Cost, ex[1].Cost)
	}
	if pa.Explain(r, nil) != nil {
		t.Errorf("no candidates: want no explanation")
	}
	var _ Explainer = pa
}

// A blind endpoint (its engine's hits stay far below what the index says it holds) is ranked
// as if it held nothing, while PredictCached keeps saying what the index holds, so that the
// router can tell when the engine's reports agree again.
func TestPrefixAware_CacheBlind(t *testing.T) {
	pa, _ := newPA(t, nil)
	eps := newEndpoints(2, 1<<20)
	warm := req("w", 0, seq(1, 100)...)
	eps[1].Start(warm.PromptTokens)
	pa.Routed(warm, eps[1])
	finish(pa, warm, eps[1], 20*time.Millisecond, 0)
	// Endpoint 1 holds the prompt but has one request running; endpoint 0 is idle.
	eps[1].Start(1)
	r := req("r", 5, seq(1, 100)...)
	if got := mustPick(t, pa, r, eps)[0].ID; got != 1 {
		t.Fatalf("seeing: picked %d, want the holder 1", got)
	}
	var _ CacheBlind = pa
	pa.SetCacheBlind(eps[1], true)
	ex := pa.Explain(r, eps)
	if got := mustPick(t, pa, r, eps)[0].ID; got != 0 || ex[0].Endpoint.ID != 0 {
		t.Errorf("blind: picked %d (explained first: %d), want the idle endpoint 0", got, ex[0].Endpoint.ID)
	}
	if ex[1].CachedTokens != 0 || !ex[1].CacheBlind {
		t.Errorf("blind holder explained as holding %d tokens, blind %v; want 0, true", ex[1].CachedTokens, ex[1].CacheBlind)
	}
	if got := pa.PredictCached(r, eps[1]); got != 1600 {
		t.Errorf("blind: PredictCached %d, want what the index holds, 1600", got)
	}
	pa.SetCacheBlind(eps[1], false)
	if got := mustPick(t, pa, r, eps)[0].ID; got != 1 {
		t.Errorf("seeing again: picked %d, want the holder 1", got)
	}
}

// An answer that comes whole shows the router no first token: its prefill leaves the queue
// when the queue model says it ends (settle), not when the answer does, and a streamed first
// token after it takes it off too (the engine computes its queue in order).
func TestPrefixAware_WholeAnswerSettles(t *testing.T) {
	for _, whole := range []bool{true, false} {
		t.Run(fmt.Sprintf("whole=%v", whole), func(t *testing.T) {
			pa, clk := newPAWith(t, Params{"cache_weight": "0", "affinity_window": "0"}, func(pa *prefixAware) {
				pa.learn = false
			})
			eps := newEndpoints(2, 1<<20)
			start := clk.t
			s := pa.state(0)
			// Two cold 20,000-token prompts, 25,000 units of work each: 2.52 s at the prior
			// rate, one after the other.
			a, b := req("a", 0, seq(50000, 1250)...), req("b", 0, seq(90000, 1250)...)
			for _, r := range []*Request{a, b} {
				r.Whole = whole
				eps[0].Start(r.PromptTokens)
				pa.Routed(r, eps[0])
			}
			work := pa.work(a, 0)
			probe := req("probe", 0, seq(1, 4)...)
			at := func(d time.Duration) (waiting int64, queued float64) {
				clk.t = start.Add(d)
				mustPick(t, pa, probe, eps) // reads, and settles, every candidate
				return s.waiting.Load(), pa.queued(s, clk.t.UnixNano(), 1)
			}
			if w, q := at(2400 * time.Millisecond); w != 2 || q != float64(2*work)-23800 {
				t.Errorf("at 2.4 s: %d waiting, %g queued; want 2 and %d", w, q, 2*work-23800)
			}
			w, q := at(2600 * time.Millisecond)
			if whole {
				// a's first token was due at 2.52 s, b has run 0.08 s since: 600 units done.
				if w != 1 || q != float64(work)-600 {
					t.Errorf("at 2.6 s: %d waiting, %g queued; want 1 and %d", w, q, work-600)
				}
			} else if w != 2 || q != float64(work) {
				t.Errorf("streamed, at 2.6 s: %d waiting, %g queued; want 2 and %d (a's first token not seen)", w, q, work)
			}
			if whole {
				if w, q := at(5100 * time.Millisecond); w != 0 || q != 0 {
					t.Errorf("at 5.1 s: %d waiting, %g queued; want nothing", w, q)
				}
			}
			for _, r := range []*Request{a, b} {
				eps[0].Finish(r.PromptTokens, false)
				pa.Done(r, eps[0], Result{OK: true, CachedTokens: -1, PromptTokens: r.PromptTokens, OutputTokens: 100})
			}
			if w, p := s.waiting.Load(), s.pending.Load(); w != 0 || p != 0 {
				t.Errorf("after both ended: %d waiting, %d pending; want 0 and 0 (counted once)", w, p)
			}

			// A streamed first token behind a whole answer: the whole one's came before.
			c, d := req("c", 0, seq(130000, 1250)...), req("d", 0, seq(170000, 4)...)
			c.Whole = whole
			for _, r := range []*Request{c, d} {
				eps[0].Start(r.PromptTokens)
				pa.Routed(r, eps[0])
			}
			clk.t = clk.t.Add(time.Second)
			finish(pa, d, eps[0], time.Second, -1)
			wantW := int64(0)
			if !whole {
				wantW = 1 // c streams: its own first token is still to come
			}
			if w := s.waiting.Load(); w != wantW {
				t.Errorf("after d's first token: %d waiting, want %d", w, wantW)
			}
		})
	}
}
