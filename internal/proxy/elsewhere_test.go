package proxy

import (
	"context"
	"net/http"
	"strconv"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/internal/metrics"
	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/route"
)

// TestExchangeAnsweredElsewhere: an answer a front end was given by no endpoint of the call
// (ext_proc: an address Envoy's own balancing chose, or Envoy itself) is counted and logged
// under no endpoint, whatever its status, and whatever became of the call's attempt; the
// attempt still open is closed as nobody's (health hears nothing); a 503, 429 or 404 costs the
// tenant nothing, another answer is charged as an engine's. Before, settle named the call's
// endpoint for it (the answer taken for its own, or a 5xx taken for its failed attempt's).
func TestExchangeAnsweredElsewhere(t *testing.T) {
	for _, tc := range []struct {
		status int
		free   bool // a refusal: nothing charged
	}{
		{http.StatusOK, false},
		{http.StatusInternalServerError, false},
		{http.StatusBadGateway, false},
		{http.StatusServiceUnavailable, true},
		{http.StatusTooManyRequests, true},
		{http.StatusNotFound, true},
	} {
		t.Run(strconv.Itoa(tc.status), func(t *testing.T) {
			f := newFixture(t, spec("http://127.0.0.1:1", "m"))
			hl := &healthLog{}
			withLifecycle(t, f, nil, hl)
			f.h.Gate = chargeGate(t, f.h.Metrics.Tenant)
			logs := jsonLogger(f)
			x := f.h.NewExchange("", "ext_proc")
			hdr, out := http.Header{"Authorization": {"Bearer sk-1"}}, http.Header{}
			if oe := x.Authenticate(hdr, out); oe != nil {
				t.Fatal(oe)
			}
			if oe := x.Prepare(context.Background(), openai.KindChat, []byte(chatBody), hdr, out, PrepareOptions{}); oe != nil {
				t.Fatal(oe)
			}
			if x.Call().Next() == nil {
				t.Fatal("no endpoint")
			}
			x.AnsweredElsewhere(tc.status)
			x.Whole([]byte(`{"error":{"message":"model m not found","type":"x","param":null,"code":null}}`))
			x.Settle(tc.status, http.MethodPost, "/v1/chat/completions")
			if n := testutil.ToFloat64(f.h.Metrics.Requests.WithLabelValues("m", metrics.NoEndpoint, strconv.Itoa(tc.status))); n != 1 {
				t.Errorf("requests_total{endpoint=none,status=%d} = %v, want 1", tc.status, n)
			}
			line := lastAccess(t, logs)
			if ep, ok := line["endpoint"]; ok {
				t.Errorf("access line names endpoint %v, want none", ep)
			}
			if failed, ok := hl.told(); len(failed) != 0 || ok != 0 {
				t.Errorf("health told failures %v and %d successes; want nothing", failed, ok)
			}
			if len(f.pk.done) != 1 || f.pk.done[0].OK {
				t.Errorf("policy told %+v, want the attempt closed, not a success", f.pk.done)
			}
			if ep := f.pool.ByName("http://127.0.0.1:1"); ep.Refuses("m", f.h.Lifecycle.Now()) {
				t.Error("a 404 from elsewhere left the call's endpoint out for the model")
			}
			if prompt, _, _ := charged(t, f.h.Gate, f.h.Metrics.Tenant); (prompt == 0) != tc.free {
				t.Errorf("tenant charged %d prompt tokens for a %d; want nothing only for a refusal", prompt, tc.status)
			}
		})
	}
}

// TestExchangeAttempted: the attempts the front end says it made are the access line's, in
// place of the lifecycle's, which counts each endpoint the call was moved past (ext_proc moves
// it down the list to the endpoint Envoy says answered, past those Envoy skipped untried).
func TestExchangeAttempted(t *testing.T) {
	for _, tc := range []struct {
		told, want int
	}{{0, 2}, {1, 1}, {3, 3}} {
		f := newFixture(t, spec("http://127.0.0.1:1", "m"), spec("http://127.0.0.1:2", "m"))
		withLifecycle(t, f, nil, &healthLog{})
		logs := jsonLogger(f)
		x := f.h.NewExchange("", "ext_proc")
		if oe := x.Prepare(context.Background(), openai.KindChat, []byte(chatBody), http.Header{}, http.Header{}, PrepareOptions{}); oe != nil {
			t.Fatal(oe)
		}
		rc := x.Call()
		rc.Next()
		rc.Fail(route.FailNone) // passed over
		if rc.Next() == nil {
			t.Fatal("no second endpoint")
		}
		x.Attempted(tc.told)
		x.Answered(http.StatusOK)
		x.Whole([]byte(`{"id":"x","choices":[]}`))
		x.Settle(http.StatusOK, http.MethodPost, "/v1/chat/completions")
		if got := lastAccess(t, logs)["attempts"]; got != float64(tc.want) {
			t.Errorf("told %d attempts: access line's attempts %v, want %d", tc.told, got, tc.want)
		}
	}
}
