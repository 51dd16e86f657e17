package route

import (
	"slices"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/policy"
)

// blindScript is a script that records what the lifecycle tells it of blindness, and predicts
// 64 cached tokens everywhere.
type blindScript struct {
	script
	blind map[string]bool
}

func (b *blindScript) SetCacheBlind(ep *endpoint.Endpoint, blind bool)       { b.blind[ep.Name] = blind }
func (b *blindScript) PredictCached(*policy.Request, *endpoint.Endpoint) int { return 64 }

// TestAuditSilentZeroHits: an endpoint whose engine keeps reporting no cached tokens where the
// policy predicted many goes blind (the policy told, predictions reported as 0), and sees again
// once its reports agree.
func TestAuditSilentZeroHits(t *testing.T) {
	clk := &stepClock{t: time.Unix(100, 0)}
	b := &blindScript{script: script{order: []string{"a"}}, blind: map[string]bool{}}
	var changes []bool
	audit := NewAudit(AuditConfig{OnChange: func(_ *endpoint.Endpoint, blind bool, _, _ float64) { changes = append(changes, blind) }})
	lc, err := New(Config{Picker: b, Clock: clk, Audit: audit})
	if err != nil {
		t.Fatal(err)
	}
	eps := pool(t, "a")
	serve := func(cached int) int {
		c, _ := lc.Begin(&policy.Request{PromptTokens: 100}, eps, "", clk.t)
		c.Next()
		p := c.Predicted()
		c.Finish(Outcome{OK: true, CachedTokens: cached})
		clk.t = clk.t.Add(time.Second)
		return p
	}
	for i := range 9 {
		if serve(0); audit.Blind(eps[0]) {
			t.Fatalf("blind after %d requests: want a verdict only after 10", i+1)
		}
	}
	serve(0)
	if !audit.Blind(eps[0]) || !b.blind["a"] {
		t.Fatalf("10 requests predicted 64 and found 0: blind %v, policy told %v", audit.Blind(eps[0]), b.blind)
	}
	if p := serve(0); p != 0 {
		t.Errorf("prediction on a blind endpoint = %d, want 0", p)
	}
	// The engine finds what was predicted again: back within a few requests.
	n := 0
	for ; audit.Blind(eps[0]) && n < 40; n++ {
		serve(64)
	}
	if audit.Blind(eps[0]) || b.blind["a"] || n > 20 {
		t.Errorf("after %d agreeing requests: blind %v, policy told %v", n, audit.Blind(eps[0]), b.blind)
	}
	if len(changes) != 2 || !changes[0] || changes[1] {
		t.Errorf("changes %v, want blind then not", changes)
	}
	if st := audit.Status(eps[0]); st.Blind || st.FoundShare <= 0.5 {
		t.Errorf("status %+v", st)
	}
	// Unreported cached tokens (-1) teach nothing.
	before := audit.Status(eps[0])
	serve(-1)
	if after := audit.Status(eps[0]); after != before {
		t.Errorf("an unreported count changed the audit: %+v -> %+v", before, after)
	}
}

// probeScript ranks a, then b, and predicts 64 cached tokens on b while holds, and on a (the
// pick) while pickHolds.
type probeScript struct {
	blindScript
	holds, pickHolds bool
}

func (p *probeScript) PredictCached(_ *policy.Request, ep *endpoint.Endpoint) int {
	if ep.Name == "b" && p.holds || ep.Name != "b" && p.pickHolds {
		return 64
	}
	return 0
}

// probeSetup returns a lifecycle whose policy (a probeScript) ranks a, then b, with a cache
// audit, its clock and its two endpoints; share, when not nil, gives it the Share to use.
func probeSetup(t *testing.T, share func(*stepClock) *Share) (*stepClock, *probeScript, *Audit, *Lifecycle, []*endpoint.Endpoint) {
	t.Helper()
	clk := &stepClock{t: time.Unix(100, 0)}
	p := &probeScript{blindScript: blindScript{script: script{order: []string{"a", "b"}}, blind: map[string]bool{}}, holds: true}
	audit := NewAudit(AuditConfig{})
	cfg := Config{Picker: p, Clock: clk, Audit: audit}
	if share != nil {
		cfg.Share = share(clk)
	}
	lc, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return clk, p, audit, lc, pool(t, "a", "b")
}

// TestAuditProbesBlind: a blind endpoint that the policy ranks second is tried first by one
// request every ProbeEvery, when the index says it holds some of the prompt, so that its
// reports can agree again; by a prompt the pick is predicted to hold too, only once in 30 s;
// never more often, never with a prompt it is not predicted to hold, never while it has more
// requests in flight than the pick, and not once it sees again.
func TestAuditProbesBlind(t *testing.T) {
	clk, p, audit, lc, eps := probeSetup(t, nil)
	first := func() string {
		t.Helper()
		c, err := lc.Begin(&policy.Request{PromptTokens: 100}, eps, "", clk.t)
		if err != nil {
			t.Fatal(err)
		}
		return c.Next().Name
	}
	if got := first(); got != "a" {
		t.Fatalf("nothing blind: first %s, want a", got)
	}
	for range 10 {
		audit.Observe(eps[1], 64, 0, clk.t)
	}
	if !audit.Blind(eps[1]) {
		t.Fatal("b not blind after 10 requests that found nothing")
	}
	var got []string
	for _, step := range []time.Duration{0, 0, 100 * time.Millisecond, 150 * time.Millisecond, 0, 250 * time.Millisecond} {
		clk.t = clk.t.Add(step)
		got = append(got, first())
	}
	if want := []string{"b", "a", "a", "b", "a", "b"}; !slices.Equal(got, want) {
		t.Errorf("blind b, probed every 250 ms: first %v, want %v", got, want)
	}
	p.holds = false
	clk.t = clk.t.Add(time.Second)
	if got := first(); got != "a" {
		t.Errorf("a prompt b is not predicted to hold: first %s, want a", got)
	}
	// Prompts the pick is predicted to hold too probe b once in 30 s; the others still every
	// 250 ms.
	p.holds, p.pickHolds = true, true
	got = nil
	for range 3 {
		clk.t = clk.t.Add(time.Second)
		got = append(got, first())
	}
	p.pickHolds = false
	clk.t = clk.t.Add(time.Second)
	got = append(got, first())
	p.pickHolds = true
	clk.t = clk.t.Add(29 * time.Second)
	got = append(got, first())
	clk.t = clk.t.Add(time.Second)
	got = append(got, first())
	if want := []string{"b", "a", "a", "b", "b", "a"}; !slices.Equal(got, want) {
		t.Errorf("probes by prompts the pick holds (1 s apart, one without, 29 s, 1 s): first %v, want %v", got, want)
	}
	// Once a probe's report agrees, the next probe is expected to find its prefix too: those
	// by prompts the pick holds go at the free probes' pace until a report disagrees again.
	got = nil
	for _, found := range []int{64, 0} {
		audit.Observe(eps[1], 64, found, clk.t)
		clk.t = clk.t.Add(time.Second)
		got = append(got, first())
	}
	if want := []string{"b", "a"}; !slices.Equal(got, want) {
		t.Errorf("prompts the pick holds, after a report that agreed, then one that did not: first %v, want %v", got, want)
	}
	p.pickHolds = false
	// Nor to an endpoint with more requests in flight than the pick: b waits until a has as
	// many.
	busy := eps[0].InFlight() - eps[1].InFlight() + 2
	for range busy {
		eps[1].Start(100)
	}
	got = nil
	for range 3 {
		clk.t = clk.t.Add(time.Second)
		got = append(got, first())
	}
	if want := []string{"a", "a", "b"}; !slices.Equal(got, want) {
		t.Errorf("b with 2 requests in flight more than a, 1 s apart: first %v, want %v", got, want)
	}
	for range busy {
		eps[1].Finish(100, false)
	}
	for i := 0; audit.Blind(eps[1]) && i < 40; i++ {
		audit.Observe(eps[1], 64, 64, clk.t)
	}
	clk.t = clk.t.Add(time.Second)
	if audit.Blind(eps[1]) || first() != "a" {
		t.Errorf("b sees again: blind %v, want a first", audit.Blind(eps[1]))
	}
	audit.Forget(eps[1])
	if n := audit.nblind.Load(); n != 0 {
		t.Errorf("%d blind after Forget", n)
	}
}

// TestAuditSeesAgainByCostlyProbes: a blind endpoint whose only evidence is probes by prompts
// the pick holds too (no other request is predicted to find anything there) sees again within
// seconds of the engine being put right, not after the several agreeing reports 30 s apart
// that the limit on such probes alone would take (3 minutes here).
func TestAuditSeesAgainByCostlyProbes(t *testing.T) {
	clk, p, audit, lc, eps := probeSetup(t, nil)
	p.pickHolds = true
	for range 10 {
		audit.Observe(eps[1], 64, 0, clk.t)
	}
	if !audit.Blind(eps[1]) {
		t.Fatal("b not blind after 10 requests that found nothing")
	}
	fixed := clk.t
	probes := 0
	for i := 0; audit.Blind(eps[1]) && i < 10000; i++ { // a request every 100 ms, 1000 s at most
		c, err := lc.Begin(&policy.Request{PromptTokens: 100}, eps, "", clk.t)
		if err != nil {
			t.Fatal(err)
		}
		ep := c.Next()
		c.FirstToken()
		if ep == eps[1] {
			probes++
		}
		// The engine finds what it was predicted to hold, on either endpoint.
		c.Finish(Outcome{OK: true, CachedTokens: 64, PromptTokens: 100})
		clk.t = clk.t.Add(100 * time.Millisecond)
	}
	if took := clk.t.Sub(fixed); audit.Blind(eps[1]) || took > 35*time.Second {
		t.Errorf("b sees again after %v and %d probes (blind now: %v), want within 35 s", took, probes, audit.Blind(eps[1]))
	} else {
		t.Logf("b sees again %v after it was fixed, after %d probes", took, probes)
	}
}

// TestAuditProbesReplicas: with four router replicas sharing their events, whose audits each
// hear every probe's answer, a replica probes a blind endpoint every 4 x ProbeEvery.
func TestAuditProbesReplicas(t *testing.T) {
	clk, _, audit, lc, eps := probeSetup(t, func(clk *stepClock) *Share {
		sh := NewShare(ShareConfig{Self: 1, Clock: clk})
		sh.SetReplicas(4, 0, time.Millisecond)
		return sh
	})
	for range 10 {
		audit.Observe(eps[1], 64, 0, clk.t)
	}
	var got []string
	for _, step := range []time.Duration{0, 250 * time.Millisecond, 500 * time.Millisecond, 249 * time.Millisecond, time.Millisecond} {
		clk.t = clk.t.Add(step)
		c, err := lc.Begin(&policy.Request{PromptTokens: 100}, eps, "", clk.t)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, c.Next().Name)
	}
	if want := []string{"b", "a", "a", "a", "b"}; !slices.Equal(got, want) {
		t.Errorf("blind b, four replicas: first %v, want %v (a probe every second)", got, want)
	}
}

// TestAuditProbesAgree: each report in a row that agrees with the prediction halves the wait
// for the next probe of a blind endpoint, down to an eighth; one that finds nothing again
// restores it.
func TestAuditProbesAgree(t *testing.T) {
	clk, _, audit, lc, eps := probeSetup(t, nil)
	for range 30 {
		audit.Observe(eps[1], 64, 0, clk.t)
	}
	if !audit.Blind(eps[1]) {
		t.Fatal("b not blind")
	}
	// due reports after how long b is probed again: the clock steps 1 ms at a time from the
	// last probe until a request goes to b first.
	due := func() time.Duration {
		t.Helper()
		for d := time.Duration(0); d <= time.Second; d += time.Millisecond {
			c, err := lc.Begin(&policy.Request{PromptTokens: 100}, eps, "", clk.t)
			if err != nil {
				t.Fatal(err)
			}
			if c.Next().Name == "b" {
				return d
			}
			clk.t = clk.t.Add(time.Millisecond)
		}
		t.Fatal("b not probed within a second")
		return 0
	}
	due() // the first probe goes at once
	var got []time.Duration
	for range 5 {
		audit.Observe(eps[1], 64, 64, clk.t)
		got = append(got, due())
	}
	want := []time.Duration{125 * time.Millisecond, 63 * time.Millisecond, 32 * time.Millisecond, 32 * time.Millisecond, 32 * time.Millisecond}
	if !slices.Equal(got, want) {
		t.Errorf("waits between probes after agreeing reports: %v, want %v", got, want)
	}
	if !audit.Blind(eps[1]) {
		t.Fatal("b sees again after 5 agreeing reports: too soon for the test")
	}
	audit.Observe(eps[1], 64, 0, clk.t)
	if d := due(); d != 250*time.Millisecond {
		t.Errorf("after a report that found nothing: wait %v, want 250ms", d)
	}
	for i := 0; audit.Blind(eps[1]) && i < 40; i++ {
		audit.Observe(eps[1], 64, 64, clk.t)
	}
	if audit.Blind(eps[1]) {
		t.Fatal("b still blind after 40 agreeing reports")
	}
	if n := audit.st[eps[1]].agreeing; n != 0 {
		t.Errorf("agreeing %d after seeing again, want 0", n)
	}
}
