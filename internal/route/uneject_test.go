package route

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/internal/endpoint"
)

// TestOutlierHealthPassed, step by step: an active health check that passes, sent after an
// ejection for failures that say the engine was unreachable (connections refused or lost)
// began, ends it (an engine that restarted is back at once, not after the ejection time),
// while the ejections in a row still count for the next one's length. A check sent before the
// ejection ends nothing; nor does any check end an ejection for 5xx answers, by the refusal
// rule, or one that came after a check had readmitted the endpoint and it has not served
// passive_failures attempts in a row since (its engine fails where its health check passes).
func TestOutlierHealthPassed(t *testing.T) {
	clk := &stepClock{t: time.Unix(100, 0)}
	eps := pool(t, "a", "b", "c", "d")
	a, b, c, d := eps[0], eps[1], eps[2], eps[3]
	var told []string
	o := NewOutlier(OutlierConfig{Consecutive: 3, Fleet: func() int { return len(eps) },
		OnReadmit: func(ep *endpoint.Endpoint, byCheck bool) {
			told = append(told, fmt.Sprintf("%s by check %v", ep.Name, byCheck))
		}}, clk)
	fail := func(ep *endpoint.Endpoint, f Failure) {
		t.Helper()
		for range 3 {
			o.Failed(ep, f)
		}
		if !o.Ejected(ep, clk.t) {
			t.Fatalf("%s not ejected after 3 failures (%v)", ep.Name, f)
		}
	}
	wantUntil := func(ep *endpoint.Endpoint, want time.Time) {
		t.Helper()
		if got := o.EjectedUntil(ep); !got.Equal(want) {
			t.Fatalf("%s ejected until %v, want %v", ep.Name, got, want)
		}
	}

	// 1. a's engine restarts: its connections refused, it is ejected for 30 s.
	fail(a, FailConnect)
	began := clk.t
	wantUntil(a, began.Add(DefaultBaseEjection))
	clk.t = clk.t.Add(time.Second)
	// A check in flight as the ejection began tells nothing of what ejected it.
	for _, sent := range []time.Time{began.Add(-time.Second), began} {
		if o.HealthPassed(a, sent) || !o.Ejected(a, clk.t) {
			t.Fatalf("a check sent %v before the ejection ended it", began.Sub(sent))
		}
	}
	// One sent after it: a is back.
	if !o.HealthPassed(a, began.Add(500*time.Millisecond)) || o.Ejected(a, clk.t) {
		t.Fatal("a still ejected after a health check sent since its ejection passed")
	}
	wantUntil(a, time.Time{})
	if o.HealthPassed(a, clk.t) {
		t.Error("a second check ended an ejection again")
	}

	// 2. a fails again with no success in between (its engine dies at each request, or loses
	// connections behind a live /health): the check is no judge of it. Its second ejection in
	// a row lasts twice as long, and runs its time.
	fail(a, FailLost)
	second := clk.t
	wantUntil(a, second.Add(2*DefaultBaseEjection))
	clk.t = clk.t.Add(time.Second)
	if o.HealthPassed(a, clk.t) || !o.Ejected(a, clk.t) {
		t.Fatal("a check ended the ejection of an endpoint that failed right after a check readmitted it")
	}
	clk.t = second.Add(2 * DefaultBaseEjection)
	if o.Ejected(a, clk.t) {
		t.Fatal("a still ejected after its second ejection's time")
	}

	// 3. One success is not enough (half its requests lost, an engine succeeds now and then):
	// the third ejection in a row runs its time too.
	o.Succeeded(a)
	fail(a, FailLost)
	third := clk.t
	wantUntil(a, third.Add(3*DefaultBaseEjection))
	clk.t = clk.t.Add(time.Second)
	if o.HealthPassed(a, clk.t) || !o.Ejected(a, clk.t) {
		t.Fatal("a check ended an ejection after a single success since a check readmitted a")
	}
	clk.t = third.Add(3 * DefaultBaseEjection)
	if o.Ejected(a, clk.t) {
		t.Fatal("a still ejected after its third ejection's time")
	}

	// 4. Once a has served passive_failures attempts in a row, a check judges its next ejection
	// again, which still lasts as the fourth in a row.
	for range 3 {
		o.Succeeded(a)
	}
	fail(a, FailConnect)
	wantUntil(a, clk.t.Add(4*DefaultBaseEjection))
	clk.t = clk.t.Add(time.Second)
	if !o.HealthPassed(a, clk.t.Add(-time.Millisecond)) || o.Ejected(a, clk.t) {
		t.Fatal("a not readmitted by a passing check after it had served")
	}

	// 5. b is ejected by the fleet's count (another replica's lost connections): each replica
	// probes for itself, and this one's passing check ends it here. Ejected by the fleet's
	// count of 5xx answers, it runs its time.
	for range 3 {
		o.PeerFailed(b, FailLost)
	}
	if !o.Ejected(b, clk.t) {
		t.Fatal("b not ejected after 3 failures at peers")
	}
	clk.t = clk.t.Add(time.Second)
	if !o.HealthPassed(b, clk.t) || o.Ejected(b, clk.t) {
		t.Fatal("b's ejection for peers' lost connections not ended by a passing check")
	}
	for range 3 {
		o.Succeeded(b)
	}
	for range 3 {
		o.PeerFailed(b, FailStatus)
	}
	clk.t = clk.t.Add(time.Second)
	if o.HealthPassed(b, clk.t) || !o.Ejected(b, clk.t) {
		t.Fatal("b's ejection for peers' 5xx answers ended by a passing check")
	}

	// 6. c refuses what d serves: ejected by the refusal rule. Its engine answers /health all
	// the same, and no passing check ends that.
	answer(o, d, 20, 0)
	answer(o, c, 20, 20)
	if !o.Ejected(c, clk.t) {
		t.Fatal("c not ejected after refusing 20 of 20 while d served 20 of 20")
	}
	clk.t = clk.t.Add(time.Second)
	if o.HealthPassed(c, clk.t) || !o.Ejected(c, clk.t) {
		t.Fatal("a passing check ended an ejection by the refusal rule")
	}

	want := []string{"a by check true", "a by check false", "a by check false", "a by check true", "b by check true"}
	if diff := cmp.Diff(want, told); diff != "" {
		t.Errorf("OnReadmit (-want +got):\n%s", diff)
	}
}
