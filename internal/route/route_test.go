package route

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/policy"
	"github.com/kvroute/kvroute/internal/prefix"
)

// stepClock is a clock a test moves by hand.
type stepClock struct{ t time.Time }

func (c *stepClock) Now() time.Time { return c.t }

// script ranks candidates by name order and records what the lifecycle tells it.
type script struct {
	order []string
	log   []string
}

func (s *script) Pick(_ *policy.Request, c []*endpoint.Endpoint) ([]*endpoint.Endpoint, error) {
	var out []*endpoint.Endpoint
	for _, n := range s.order {
		for _, e := range c {
			if e.Name == n {
				out = append(out, e)
			}
		}
	}
	return out, nil
}
func (s *script) Routed(_ *policy.Request, ep *endpoint.Endpoint) {
	s.log = append(s.log, "routed "+ep.Name)
}
func (s *script) FirstToken(_ *policy.Request, ep *endpoint.Endpoint, ttft time.Duration) {
	s.log = append(s.log, fmt.Sprintf("first %s %v", ep.Name, ttft))
}
func (s *script) Done(_ *policy.Request, ep *endpoint.Endpoint, r policy.Result) {
	s.log = append(s.log, fmt.Sprintf("done %s ok=%v cached=%d ttft=%v", ep.Name, r.OK, r.CachedTokens, r.TTFT))
}
func (s *script) Removed(ep *endpoint.Endpoint) { s.log = append(s.log, "removed "+ep.Name) }
func (s *script) PredictCached(_ *policy.Request, ep *endpoint.Endpoint) int {
	return int(ep.Name[len(ep.Name)-1]-'a') * 16
}

func pool(t *testing.T, names ...string) []*endpoint.Endpoint {
	t.Helper()
	p := endpoint.NewPool()
	specs := make([]endpoint.Spec, len(names))
	for i, n := range names {
		specs[i] = endpoint.Spec{Name: n}
	}
	if _, err := p.Update(specs); err != nil {
		t.Fatal(err)
	}
	return p.All()
}

func newLC(t *testing.T, s *script, clk *stepClock, attempts int) *Lifecycle {
	t.Helper()
	lc, err := New(Config{Picker: s, Clock: clk, Attempts: attempts, EjectAfter: 2})
	if err != nil {
		t.Fatal(err)
	}
	return lc
}

// TestCallSuccess: one attempt, its first token, its end: counters and the policy's view.
func TestCallSuccess(t *testing.T) {
	clk := &stepClock{t: time.Unix(100, 0)}
	s := &script{order: []string{"a", "b"}}
	lc := newLC(t, s, clk, 2)
	eps := pool(t, "a", "b")
	req := &policy.Request{PromptTokens: 100}
	c, err := lc.Begin(req, eps, "", clk.t)
	if err != nil {
		t.Fatal(err)
	}
	ep := c.Next()
	if ep.Name != "a" || ep.InFlight() != 1 || ep.PendingPrefill() != 100 || c.Predicted() != 0 {
		t.Fatalf("after Next: %s in flight %d pending %d predicted %d", ep.Name, ep.InFlight(), ep.PendingPrefill(), c.Predicted())
	}
	if again := c.Next(); again != nil {
		t.Errorf("Next during an attempt = %v, want nil", again.Name)
	}
	clk.t = clk.t.Add(30 * time.Millisecond)
	c.FirstToken()
	c.FirstToken() // counted once
	if ep.PendingPrefill() != 0 || c.TTFT() != 30*time.Millisecond {
		t.Errorf("after the first token: pending %d, TTFT %v", ep.PendingPrefill(), c.TTFT())
	}
	clk.t = clk.t.Add(time.Second)
	c.Finish(Outcome{OK: true, CachedTokens: 48, PromptTokens: 90, OutputTokens: 5})
	c.Finish(Outcome{OK: false}) // idempotent
	if ep.InFlight() != 0 || ep.PendingPrefill() != 0 {
		t.Errorf("after Finish: in flight %d pending %d", ep.InFlight(), ep.PendingPrefill())
	}
	want := []string{"routed a", "first a 30ms", "done a ok=true cached=48 ttft=30ms"}
	if diff := cmp.Diff(want, s.log); diff != "" {
		t.Errorf("policy saw (-want +got):\n%s", diff)
	}
	if fin, ok := c.Finished(); !fin || !ok {
		t.Errorf("Finished = %v, %v", fin, ok)
	}
}

// TestFallback walks the failure classes: what is retried, what is not, what counts against an
// endpoint, and that an ejected endpoint is skipped by later calls.
func TestFallback(t *testing.T) {
	clk := &stepClock{t: time.Unix(100, 0)}
	s := &script{order: []string{"a", "b", "c"}}
	lc := newLC(t, s, clk, 3)
	eps := pool(t, "a", "b", "c")
	a, b := eps[0], eps[1]

	// a refuses connections, b answers 503, c serves.
	c, _ := lc.Begin(&policy.Request{PromptTokens: 10}, eps, "", clk.t)
	var tried []string
	for ep := c.Next(); ep != nil; ep = c.Next() {
		tried = append(tried, ep.Name)
		switch ep.Name {
		case "a":
			if !c.Fail(FailConnect) {
				t.Fatal("connect error on a: not retried")
			}
		case "b":
			if !c.Fail(FailUnavailable) {
				t.Fatal("503 on b: not retried")
			}
		default:
			c.Answered()
			c.Finish(Outcome{OK: true, CachedTokens: -1})
		}
	}
	if diff := cmp.Diff([]string{"a", "b", "c"}, tried); diff != "" {
		t.Errorf("attempts (-want +got):\n%s", diff)
	}
	for _, e := range eps {
		if e.InFlight() != 0 || e.PendingPrefill() != 0 {
			t.Errorf("%s: in flight %d pending %d after the call", e.Name, e.InFlight(), e.PendingPrefill())
		}
	}
	if !a.Healthy() {
		t.Error("a ejected after one connection error (threshold 2)")
	}
	// A second connection error in a row ejects a; the call goes on to b.
	c, _ = lc.Begin(&policy.Request{PromptTokens: 10}, eps, "", clk.t)
	if ep := c.Next(); ep != a || !c.Fail(FailConnect) || a.Healthy() {
		t.Fatalf("second connection error: a healthy %v", a.Healthy())
	}
	if ep := c.Next(); ep != b {
		t.Fatalf("after a: %v, want b", ep)
	}
	// A request that reached b and lost its connection is not sent again.
	if c.Fail(FailLost) {
		t.Error("a lost request was retried")
	}
	c.Finish(Outcome{OK: false})
	if !b.Healthy() {
		t.Error("b ejected for a lost request")
	}
	// a, ejected, is skipped when it is no longer the first choice of a call made before.
	c, _ = lc.Begin(&policy.Request{PromptTokens: 10}, eps, "", clk.t)
	s.order = []string{"b", "a", "c"}
	c2, _ := lc.Begin(&policy.Request{PromptTokens: 10}, eps, "", clk.t)
	if ep := c2.Next(); ep != b || !c2.Fail(FailConnect) {
		t.Fatal("b first")
	}
	if ep := c2.Next(); ep == nil || ep.Name != "c" {
		t.Errorf("after b: %v, want c (a is ejected)", ep)
	}
	c2.Finish(Outcome{OK: true})
	if ep := c.Next(); ep != a {
		t.Errorf("the first choice is tried even when ejected since the pick: %v", ep)
	}
	c.Finish(Outcome{OK: false})
	if a.InFlight() != 0 {
		t.Errorf("a in flight %d", a.InFlight())
	}
}

// TestAttemptsBound: a request is sent to at most Attempts endpoints.
func TestAttemptsBound(t *testing.T) {
	clk := &stepClock{t: time.Unix(100, 0)}
	lc := newLC(t, &script{order: []string{"a", "b", "c"}}, clk, 2)
	eps := pool(t, "a", "b", "c")
	c, _ := lc.Begin(&policy.Request{}, eps, "", clk.t)
	n := 0
	for ep := c.Next(); ep != nil; ep = c.Next() {
		n++
		if c.Fail(FailUnavailable) != (n < 2) {
			t.Errorf("attempt %d: retry answer wrong", n)
		}
	}
	if n != 2 || c.Attempts() != 2 {
		t.Errorf("%d attempts, want 2", n)
	}
}

// TestPins: the endpoint that created a response goes first for a request naming it.
func TestPins(t *testing.T) {
	clk := &stepClock{t: time.Unix(100, 0)}
	s := &script{order: []string{"a", "b"}}
	lc := newLC(t, s, clk, 2)
	eps := pool(t, "a", "b")
	s.order = []string{"b", "a"}
	c, _ := lc.Begin(&policy.Request{}, eps, "", clk.t)
	c.Next()
	c.Finish(Outcome{OK: true, ResponseID: "resp_1"})
	s.order = []string{"a", "b"}
	c, _ = lc.Begin(&policy.Request{}, eps, "resp_1", clk.t)
	if ep := c.Next(); ep.Name != "b" {
		t.Errorf("pinned request went to %s, want b", ep.Name)
	}
	c.Finish(Outcome{OK: true})
	// A pin shared through State survives a new Lifecycle (a config reload).
	lc2, _ := New(Config{Picker: s, Clock: clk, State: lc.state})
	c, _ = lc2.Begin(&policy.Request{}, eps, "resp_1", clk.t)
	if ep := c.Next(); ep.Name != "b" {
		t.Errorf("after a reload the pinned request went to %s, want b", ep.Name)
	}
	// Only the policy's candidates count: a pin to an endpoint that is gone changes nothing.
	c, _ = lc.Begin(&policy.Request{}, eps[:1], "resp_1", clk.t)
	if ep := c.Next(); ep.Name != "a" {
		t.Errorf("pin to a missing endpoint: %s, want a", ep.Name)
	}
}

func TestBeginNoCandidate(t *testing.T) {
	lc := newLC(t, &script{}, &stepClock{}, 1)
	if _, err := lc.Begin(&policy.Request{}, nil, "", time.Time{}); err != ErrNoCandidate {
		t.Errorf("no candidates: %v", err)
	}
	if _, err := lc.Begin(&policy.Request{}, pool(t, "a"), "", time.Time{}); err != ErrNoCandidate {
		t.Errorf("policy ranks none: %v", err)
	}
}

// TestKeys: the live request and a simulated one built from the same text's content keys get
// the same routing blocks, so the simulator routes on what the router would.
func TestKeys(t *testing.T) {
	k := Keys{BlockTokens: 4}
	text := strings.Repeat("You are a helpful assistant. ", 30)
	req, err := openai.Parse(openai.KindCompletion, fmt.Appendf(nil, `{"model":"m","max_tokens":9,"prompt":%q}`, text))
	if err != nil {
		t.Fatal(err)
	}
	var live policy.Request
	k.FromOpenAI(&live, req, "salt")
	sim := k.FromContent(nil, "m", "salt", prefix.ContentKeys(nil, []byte(text), 4))
	if diff := cmp.Diff(sim, live.Blocks); diff != "" || len(sim) == 0 {
		t.Errorf("blocks differ (-sim +live):\n%s", diff)
	}
	if live.PromptTokens != prefix.EstimateTokens(text) || live.MaxTokens != 9 || live.BlockTokens != 4 || live.Model != "m" {
		t.Errorf("request = %+v", live)
	}
	var other policy.Request
	k.FromOpenAI(&other, req, "another salt")
	if other.Blocks[0] == live.Blocks[0] {
		t.Error("another salt shares the first block")
	}
}
