package extproc

import (
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/internal/metrics/metricstest"
	"github.com/kvroute/kvroute/internal/route"
)

// TestEngineRefusals: an engine's answer that reaches kvroute (Envoy did not retry it, or had no
// endpoint left) is settled as `kvroute serve` settles its last attempt (docs/router.md,
// "Failing engines"): a 429 is the engine shedding load, which neither counts against it nor is
// a refusal for the refusal rule (serve: route.FailBusy); a 400 is a refusal; a 500 and a 503
// count against the endpoint. The policy hears the 429 and the 400 as failed attempts (what
// raises prefix-aware's cost of the endpoint), the 5xx being passive health's to judge. Before, a 429 through ext_proc was taken for a refusal, so an
// engine busy while the rest of the fleet was not could be ejected as refusing its traffic.
func TestEngineRefusals(t *testing.T) {
	for _, tc := range []struct {
		status   int
		refused  []string
		failures []string
		costs    bool // the policy hears a failed attempt (prefix-aware's cost of the endpoint rises)
	}{
		{status: http.StatusTooManyRequests, costs: true},
		{status: http.StatusBadRequest, refused: []string{ep1}, costs: true},
		{status: http.StatusInternalServerError, failures: []string{ep1 + " server_error"}},
		{status: http.StatusServiceUnavailable, failures: []string{ep1 + " unavailable"}},
	} {
		t.Run(strconv.Itoa(tc.status), func(t *testing.T) {
			f := newFixture(t, []string{ep1})
			e, _ := f.routed(t, plainChat)
			e.send(respHeaders(tc.status, "10.0.0.1:8000", false, "content-type", "application/json", "retry-after", "2"))
			e.recv()
			body := `{"error":{"message":"no","type":"x","param":null,"code":null}}`
			e.send(respBody(body, true))
			if got, _ := e.streamedBody(true); got != body {
				t.Errorf("the engine's answer passed on as %q", got)
			}
			e.close()
			f.streamEnded(t)
			if diff := cmp.Diff(tc.refused, f.health.refusals()); diff != "" {
				t.Errorf("refusals (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.failures, f.health.failures()); diff != "" {
				t.Errorf("failures counted (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff([]string{"routed " + ep1, "done " + ep1 + " ok=false cached=false"}, f.pk.events()); diff != "" {
				t.Errorf("policy events (-want +got):\n%s", diff)
			}
			f.pk.mu.Lock()
			if len(f.pk.done) != 1 || f.pk.done[0].Failed != tc.costs {
				t.Errorf("the policy heard %+v, want one attempt with Failed %v", f.pk.done, tc.costs)
			}
			f.pk.mu.Unlock()
			v := metricstest.Values(t, f.reg, "kvroute_requests_total")
			if got := v["kvroute_requests_total{endpoint="+ep1+",model=m,status="+strconv.Itoa(tc.status)+"}"]; got != 1 {
				t.Errorf("requests_total %d = %v, want 1", tc.status, got)
			}
			if n := f.pool.ByName(ep1).InFlight(); n != 0 {
				t.Errorf("in flight = %d", n)
			}
		})
	}
}

// stepClock is a clock that moves when told.
type stepClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *stepClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *stepClock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// TestClientLeavesStalledEngine: a client that leaves (the gateway ends the stream) an attempt
// whose engine has held it without its first token, silent to every request, for a stall
// watch's span (limits.stall_timeout here) leaves a failure against the endpoint, counted as a
// timeout, and the endpoint marked stalled, as `kvroute serve` does (docs/router.md, "Failing
// engines"): an engine that hangs is not hidden behind clients that give up first. One that
// leaves sooner, or after the first event, leaves nothing against it. Before, every client
// that left was settled as 499 alone: a hung engine behind impatient clients was never counted.
func TestClientLeavesStalledEngine(t *testing.T) {
	for _, tc := range []struct {
		name     string
		head     bool // the stream's head came
		event    bool // and its first event
		after    time.Duration
		failures []string
	}{
		{name: "no head, stalled", after: time.Second, failures: []string{ep1 + " timeout"}},
		{name: "head without an event, stalled", head: true, after: time.Second, failures: []string{ep1 + " timeout"}},
		{name: "no head, left sooner", after: 100 * time.Millisecond},
		{name: "first event came", head: true, event: true, after: time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, []string{ep1})
			clk := &stepClock{t: time.Unix(1000, 0)}
			lc, err := route.New(route.Config{Picker: f.pk, Attempts: 1, Health: f.health, Clock: clk, StallTimeout: 500 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			f.h.Lifecycle = lc
			e, _ := f.routed(t, streamChat)
			if tc.head {
				e.head("text/event-stream")
			}
			if tc.event {
				e.send(respBody(event1, false))
				e.chunk(true)
			}
			clk.add(tc.after)
			e.cancel()
			f.streamEnded(t)
			if diff := cmp.Diff(tc.failures, f.health.failures()); diff != "" {
				t.Errorf("failures counted (-want +got):\n%s", diff)
			}
			if stalled := f.pool.ByName(ep1).StalledSince() != 0; stalled != (tc.failures != nil) {
				t.Errorf("endpoint marked stalled = %v, want %v", stalled, tc.failures != nil)
			}
			v := metricstest.Values(t, f.reg, "kvroute_requests_total")
			if got := v["kvroute_requests_total{endpoint="+ep1+",model=m,status=499}"]; got != 1 {
				t.Errorf("requests_total 499 = %v, want 1", got)
			}
			if n := f.pool.ByName(ep1).InFlight(); n != 0 {
				t.Errorf("in flight = %d", n)
			}
		})
	}
}
