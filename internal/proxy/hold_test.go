package proxy

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/policy"
	"github.com/kvroute/kvroute/internal/route"
)

// holdPicker is an orderPicker that, as a router replica would, holds every request for hold
// before picking (policy.Deferrer).
type holdPicker struct {
	*orderPicker
	hold time.Duration
}

func (p *holdPicker) Defer(*policy.Request, []*endpoint.Endpoint) time.Duration { return p.hold }

func holdFixture(t *testing.T, hold time.Duration) (*fixture, *fakeEngine) {
	t.Helper()
	e := newFakeEngine(t)
	f := newFixture(t, spec(e.srv.URL, "m"))
	lc, err := route.New(route.Config{Picker: &holdPicker{orderPicker: f.pk, hold: hold}})
	if err != nil {
		t.Fatal(err)
	}
	f.h.Lifecycle = lc
	return f, e
}

// TestHoldBeforePick: a request the policy holds is picked for after the hold, which counts
// in its time (kvroute_replica_held_total and _seconds_total).
func TestHoldBeforePick(t *testing.T) {
	f, e := holdFixture(t, 60*time.Millisecond)
	start := time.Now()
	resp, body := f.post(t, "/v1/chat/completions", chatBody)
	took := time.Since(start)
	if resp.StatusCode != 200 || len(e.received()) != 1 {
		t.Fatalf("status %d, engine saw %d requests; body %s", resp.StatusCode, len(e.received()), body)
	}
	if took < 60*time.Millisecond {
		t.Errorf("answered in %v: not held 60ms", took)
	}
	if n, s := testutil.ToFloat64(f.h.Metrics.Held), testutil.ToFloat64(f.h.Metrics.HeldSeconds); n != 1 || s != 0.06 {
		t.Errorf("held %v requests for %v s, want 1 for 0.06", n, s)
	}
}

// TestHoldClientLeaves: a client that leaves while its request is held costs nothing: no
// endpoint is picked or sent anything, and the hold does not outlast the client.
func TestHoldClientLeaves(t *testing.T) {
	f, e := holdFixture(t, time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, f.srv.URL+"/v1/chat/completions", strings.NewReader(chatBody))
	if err != nil {
		t.Fatal(err)
	}
	if resp, err := f.srv.Client().Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("status %d: the request was not held", resp.StatusCode)
	}
	select {
	case <-f.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the handler still holds the request 10 s after its client left")
	}
	if len(e.received()) != 0 || len(f.pk.events()) != 0 {
		t.Errorf("engine saw %d requests, picker %v: want none", len(e.received()), f.pk.events())
	}
	if n := testutil.ToFloat64(f.h.Metrics.Held); n != 0 {
		t.Errorf("held counted %v for a request its client left", n)
	}
}
