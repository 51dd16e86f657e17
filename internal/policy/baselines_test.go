package policy

import (
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/internal/endpoint"
)

func mustNew(t *testing.T, name string, p Params, env Env) Picker {
	t.Helper()
	if env.Clock == nil {
		env.Clock = &fakeClock{t: time.Unix(1000, 0)}
	}
	pk, err := New(name, p, env)
	if err != nil {
		t.Fatal(err)
	}
	return pk
}

func pick(t *testing.T, pk Picker, r *Request, eps []*endpoint.Endpoint) []int {
	t.Helper()
	got, err := pk.Pick(r, eps)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(eps) {
		t.Fatalf("ranked %d of %d", len(got), len(eps))
	}
	seen := map[int]bool{}
	for _, e := range got {
		if seen[e.ID] {
			t.Fatalf("endpoint %d ranked twice", e.ID)
		}
		seen[e.ID] = true
	}
	return ids(got)
}

func load(e *endpoint.Endpoint, n int) {
	for i := 0; i < n; i++ {
		e.Start(1)
	}
}

func TestAllPolicies_EmptyCandidates(t *testing.T) {
	for _, name := range Names() {
		pk := mustNew(t, name, nil, Env{})
		if _, err := pk.Pick(req("x", 0, 1), nil); err != ErrNoCandidate {
			t.Errorf("%s: Pick(no candidates) error = %v, want ErrNoCandidate", name, err)
		}
	}
}

func TestAllPolicies_RejectUnknownParams(t *testing.T) {
	for _, name := range Names() {
		if _, err := New(name, Params{"bogus": "1"}, Env{}); err == nil || !strings.Contains(err.Error(), "unknown parameter \"bogus\"") {
			t.Errorf("%s: unknown parameter not reported: %v", name, err)
		}
	}
}

func TestConsistentHash_SameKeySameEndpoint(t *testing.T) {
	pk := mustNew(t, "consistent-hash", nil, Env{})
	eps := newEndpoints(5, 0)
	// Requests sharing the first block land on the same endpoint, whatever follows.
	for k := uint64(0); k < 50; k++ {
		a := pick(t, pk, req("a", 0, k, 1, 2), eps)[0]
		b := pick(t, pk, req("b", 0, k, 9), eps)[0]
		if a != b {
			t.Fatalf("key %d: %d vs %d", k, a, b)
		}
	}
	// Keys spread over the endpoints.
	hit := map[int]bool{}
	for k := uint64(0); k < 200; k++ {
		hit[pick(t, pk, req("a", 0, k), eps)[0]] = true
	}
	if len(hit) != 5 {
		t.Errorf("200 keys reached %d of 5 endpoints", len(hit))
	}
}

func TestConsistentHash_LoadBoundWalksOn(t *testing.T) {
	pk := mustNew(t, "consistent-hash", nil, Env{})
	eps := newEndpoints(4, 0)
	r := req("a", 0, 42)
	order := pick(t, pk, r, eps)
	home := eps[order[0]]
	// Bound = (total+1)/n x 1.25: with 4 in flight on home, (4+1)/4 x 1.25 = 1.56 < 4.
	load(home, 4)
	got := pick(t, pk, r, eps)
	if got[0] == home.ID {
		t.Fatalf("overloaded home %d still first", home.ID)
	}
	if got[0] != order[1] {
		t.Errorf("walked to %d, want the next on the ring %d", got[0], order[1])
	}
	// Removing an endpoint that is not the key's home does not move the key.
	var rest []*endpoint.Endpoint
	for _, e := range eps {
		if e.ID != order[3] {
			rest = append(rest, e)
		}
	}
	for _, e := range eps {
		for e.InFlight() > 0 {
			e.Finish(1, true)
		}
	}
	if got := pick(t, pk, r, rest)[0]; got != order[0] {
		t.Errorf("after removing %d the key moved from %d to %d", order[3], order[0], got)
	}
}

func TestPrefixSpill_HomeUntilThreshold(t *testing.T) {
	pk := mustNew(t, "prefix-spill", Params{"concurrency_threshold": "2"}, Env{})
	eps := newEndpoints(4, 0)
	// 1024 bytes = 16 blocks: requests equal in their first 16 blocks share a home.
	shared := seq(1, 16)
	r1 := req("1", 0, append(append([]uint64{}, shared...), 100)...)
	r2 := req("2", 0, append(append([]uint64{}, shared...), 200)...)
	home := pick(t, pk, r1, eps)[0]
	if got := pick(t, pk, r2, eps)[0]; got != home {
		t.Fatalf("same 1024-byte prefix went to %d and %d", home, got)
	}
	load(eps[home], 2)
	load(eps[(home+1)%4], 1)
	got := pick(t, pk, r1, eps)
	if got[0] == home || eps[got[0]].InFlight() != 0 {
		t.Errorf("at threshold: first %d (in flight %d), want an idle endpoint", got[0], eps[got[0]].InFlight())
	}
	if got[3] != home {
		t.Errorf("most loaded should be last: %v", got)
	}
	if _, err := New("prefix-spill", Params{"prefix_length": "100"}, Env{}); err == nil || !strings.Contains(err.Error(), "1024..65536") {
		t.Errorf("prefix_length=100 accepted or unclear: %v", err)
	}
}

func TestCacheAware_Steps(t *testing.T) {
	pk := mustNew(t, "cache-aware", Params{"balance_abs_threshold": "3", "balance_rel_threshold": "1.5"}, Env{})
	ca := pk.(*cacheAware)
	eps := newEndpoints(3, 0)
	a := req("a", 0, seq(1, 10)...)
	ca.Routed(a, eps[1])
	// 1. Matched 10 of 10 blocks > 0.3: goes to the tree that holds it.
	if got := pick(t, pk, req("b", 0, append(seq(1, 10), 77)...), eps); got[0] != 1 {
		t.Errorf("step 1: %v, want 1 first", got)
	}
	// 2. Low match ratio (1 of 10 blocks): goes to the smallest tree (0 and 2 are empty, 0 first).
	if got := pick(t, pk, req("c", 0, append([]uint64{1}, seq(500, 9)...)...), eps); got[0] == 1 {
		t.Errorf("step 2: %v, want an empty tree first", got)
	}
	// 3. Imbalance: endpoint 1 has 5 in flight, others 0: 5-0 > 3 and 5 > 1.5 x 0: shortest queue.
	load(eps[1], 5)
	load(eps[2], 1)
	if got := pick(t, pk, req("d", 0, seq(1, 10)...), eps); got[0] != 0 || got[2] != 1 {
		t.Errorf("step 3: %v, want 0 first and 1 last", got)
	}
	// 4. Endpoint 1 goes away: its tree is dropped.
	ca.Removed(eps[1])
	if n, _ := ca.IndexSize(); n != 0 {
		t.Errorf("step 4: %d entries after removal", n)
	}
}

func TestScorerWeighted_Scores(t *testing.T) {
	pk := mustNew(t, "scorer-weighted", nil, Env{Rand: rand.New(rand.NewPCG(1, 1))})
	sw := pk.(*scorerWeighted)
	eps := newEndpoints(3, 0)
	sw.Routed(req("a", 0, seq(1, 4)...), eps[2])
	// Prefix: endpoint 2 holds 4 of 4 blocks: 3 x 1 = 3 points ahead.
	if got := pick(t, pk, req("b", 0, seq(1, 4)...), eps); got[0] != 2 {
		t.Errorf("prefix: %v, want 2 first", got)
	}
	// Queue and KV from the scrape: endpoint 2 full (waiting 10, KV 1.0) loses 2+2 = 4 points.
	eps[2].SetSnapshot(&endpoint.Snapshot{Waiting: 10, KVUsage: 1})
	eps[0].SetSnapshot(&endpoint.Snapshot{Waiting: 0, KVUsage: 0.5})
	eps[1].SetSnapshot(&endpoint.Snapshot{Waiting: 0, KVUsage: 0})
	if diff := cmp.Diff([]int{1, 0, 2}, pick(t, pk, req("c", 0, seq(1, 4)...), eps)); diff != "" {
		t.Errorf("weighted (-want +got):\n%s", diff)
	}
	// Ties are broken at random: with everything equal all endpoints come first sometimes.
	for _, e := range eps {
		e.SetSnapshot(&endpoint.Snapshot{})
	}
	firsts := map[int]bool{}
	for i := 0; i < 60; i++ {
		firsts[pick(t, pk, req("d", 0, 999), eps)[0]] = true
	}
	if len(firsts) != 3 {
		t.Errorf("random tie-break reached %d of 3 endpoints", len(firsts))
	}
}

func TestOverlapCost_Steps(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	pk := mustNew(t, "overlap-cost", nil, Env{Clock: clk, Rand: rand.New(rand.NewPCG(2, 2))})
	oc := pk.(*overlapCost)
	eps := newEndpoints(2, 0)
	a := req("a", 0, seq(1, 10)...)
	oc.Routed(a, eps[0]) // 10 active blocks on 0, and 0 holds a's blocks
	// b shares a's 10 blocks and adds 11: while a is active, cost on 0 = 11 + 10 = 21 and on
	// 1 = 21 + 0 = 21; once a is done, 0 costs 11.
	b := req("b", 0, append(seq(1, 10), seq(50, 11)...)...)
	oc.Done(a, eps[0], Result{})
	if got := pick(t, pk, b, eps); got[0] != 0 {
		t.Errorf("overlap: %v, want 0 first", got)
	}
	// 121 s later, without events, the entries have expired: a cold tie again, broken randomly.
	clk.t = clk.t.Add(121 * time.Second)
	firsts := map[int]bool{}
	for i := 0; i < 40; i++ {
		firsts[pick(t, pk, b, eps)[0]] = true
	}
	if len(firsts) != 2 {
		t.Errorf("after ttl the old holder still wins every time: %v", firsts)
	}
	if n, _ := oc.IndexSize(); n != 0 {
		t.Errorf("%d entries survive the ttl", n)
	}
	// Active blocks count: 30 blocks in flight on 1 make 0 cheaper for a cold request.
	oc.Routed(req("big", 0, seq(900, 30)...), eps[1])
	if got := pick(t, pk, req("e", 0, 7777), eps); got[0] != 0 {
		t.Errorf("active blocks: %v, want 0 first", got)
	}
}
