package policy

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/kvroute/kvroute/internal/endpoint"
)

// indexPolicies are the policies that match requests against a prefix index.
var indexPolicies = []string{"prefix-aware", "cache-aware", "scorer-weighted", "overlap-cost"}

// churnFleet is policy name with 8 endpoints of a pool that handed out churn IDs before them
// (discovery churn: a pod that turns not ready and back, a rollout; IDs are never reused),
// each removed from the policy as the router would, and a request whose first 32 blocks the
// fleet shares and whose whole prompt one endpoint holds.
func churnFleet(tb testing.TB, name string, churn int) (Picker, []*endpoint.Endpoint, *Request) {
	tb.Helper()
	pool := endpoint.NewPool()
	specs := func(prefix string, n int) []endpoint.Spec {
		s := make([]endpoint.Spec, n)
		for i := range s {
			s[i] = endpoint.Spec{Name: fmt.Sprintf("http://%s-%d", prefix, i), Models: []string{"m"}, KVCapacityTokens: 1_000_000}
		}
		return s
	}
	pk, err := New(name, nil, Env{Clock: &fakeClock{t: time.Unix(1000, 0)}, Rand: rand.New(rand.NewPCG(1, 2))})
	if err != nil {
		tb.Fatal(err)
	}
	if churn > 0 {
		if _, err := pool.Update(specs("old", churn)); err != nil {
			tb.Fatal(err)
		}
		// The old endpoints served and left: the policy saw each of them.
		obs, _ := pk.(Observer)
		old := pool.Candidates(nil, "m", nil)
		for i, e := range old {
			if obs != nil && i%64 == 0 {
				r := req(fmt.Sprint("old", i), 0, uint64(i), 1, 2)
				obs.Routed(r, e)
				obs.Done(r, e, Result{OK: true, CachedTokens: -1})
			}
		}
		if _, err := pool.Update(nil); err != nil {
			tb.Fatal(err)
		}
		for _, e := range old {
			if obs != nil {
				obs.Removed(e)
			}
		}
	}
	if _, err := pool.Update(specs("ep", 8)); err != nil {
		tb.Fatal(err)
	}
	eps := pool.Candidates(nil, "m", nil)
	if len(eps) != 8 || eps[0].ID != churn {
		tb.Fatalf("fleet %v, want 8 endpoints from ID %d", eps, churn)
	}
	keys := make([]uint64, 256)
	for i := range keys {
		keys[i] = uint64(i) + 100
	}
	obs, _ := pk.(Observer)
	// Sessions of the shared 32-block prefix land on the fleet; one holds the whole prompt.
	for s := range 16 {
		r := req(fmt.Sprint("s", s), 0, append(slices.Clone(keys[:32]), uint64(1000+s))...)
		got, err := pk.Pick(r, eps)
		if err != nil {
			tb.Fatal(err)
		}
		if obs != nil {
			obs.Routed(r, got[0])
			obs.Done(r, got[0], Result{OK: true, CachedTokens: -1, PromptTokens: r.PromptTokens})
		}
	}
	rq := req("bench", 0, keys...)
	if obs != nil {
		obs.Routed(rq, eps[5])
		obs.Done(rq, eps[5], Result{OK: true, CachedTokens: -1, PromptTokens: rq.PromptTokens})
	}
	return pk, eps, rq
}

// BenchmarkPick_IDChurn picks among 8 endpoints in a fresh pool (IDs 0..7) and in one that
// handed out 50,000 IDs before them: a pick should cost about the same in both.
func BenchmarkPick_IDChurn(b *testing.B) {
	for _, name := range indexPolicies {
		for _, churn := range []int{0, 50_000} {
			b.Run(fmt.Sprintf("%s/first-id=%d", name, churn), func(b *testing.B) {
				pk, eps, rq := churnFleet(b, name, churn)
				b.ReportAllocs()
				for b.Loop() {
					if _, err := pk.Pick(rq, eps); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// TestPick_IDChurn: a pool that handed out 50,000 endpoint IDs before the fleet's 8 ranks them
// as a fresh one does, and a pick costs about the same: per-request work that grew with the
// highest ID ever seen made one pick hundreds of times slower (QA: 12 µs before a churn of
// 45,000 IDs, 365 µs after, for good). The bound is loose (10x, the best of five rounds of
// each) so that only such a growth fails it.
func TestPick_IDChurn(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a pool of 50,000 endpoints")
	}
	for _, name := range indexPolicies {
		t.Run(name, func(t *testing.T) {
			fresh, freshEps, rq := churnFleet(t, name, 0)
			churned, churnedEps, _ := churnFleet(t, name, 50_000)
			positions := func(pk Picker, eps []*endpoint.Endpoint) []int {
				got, err := pk.Pick(rq, eps)
				if err != nil {
					t.Fatal(err)
				}
				var pos []int
				for _, e := range got {
					pos = append(pos, slices.Index(eps, e))
				}
				return pos
			}
			want := positions(fresh, freshEps)
			if want[0] != 5 && name != "overlap-cost" {
				t.Errorf("fresh fleet picked position %d first, want 5 (holds the whole prompt)", want[0])
			}
			if diff := cmp.Diff(want, positions(churned, churnedEps)); diff != "" {
				t.Errorf("churned fleet ranks differently (-fresh +churned):\n%s", diff)
			}
			best := func(pk Picker, eps []*endpoint.Endpoint) time.Duration {
				d := time.Duration(math.MaxInt64)
				for range 5 {
					start := time.Now()
					for range 50 {
						_, _ = pk.Pick(rq, eps)
					}
					d = min(d, time.Since(start))
				}
				return d
			}
			f, c := best(fresh, freshEps), best(churned, churnedEps)
			if c > 10*f {
				t.Errorf("50 picks take %v after the churn, %v before: over 10x", c, f)
			}
		})
	}
}
