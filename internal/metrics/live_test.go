package metrics

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/internal/metrics/metricstest"
)

// lateEvents counts what the end of a request on endpoint ep for model does (exchange.go),
// with a retry, a move, an ejection and a cache audit's verdict besides.
func lateEvents(m *Metrics, model, ep string) {
	m.PromptTokens.WithLabelValues(model).Add(10)
	m.CompletionTokens.WithLabelValues(model).Add(1000)
	m.PredictedCachedTokens(model, ep, 0)
	m.EngineCached.WithLabelValues(model).Add(0)
	m.CachedReported.WithLabelValues(model).Add(10)
	m.TTFT.WithLabelValues(model).Observe(0.008)
	m.Requests.WithLabelValues(model, ep, "200").Inc()
	m.Requests.WithLabelValues(model, ep, "422").Inc() // a status made at first use
	m.Duration.WithLabelValues(model).Observe(7)
	m.Retries.WithLabelValues(ep, RetryTimeout).Inc()
	m.Moved.WithLabelValues(ep, "backoff").Inc()
	m.EndpointEjected(ep, EjectFailures, time.Minute)
	m.EndpointCacheBlind(ep, true)
}

// TestLateEventsOfARemovedEndpoint: a stream still running on an endpoint when it leaves the
// fleet (a reload, a pod replaced) ends after its series were deleted; what it counts then
// must not make them again, for nothing would delete them after that. The same for a model
// that no endpoint serves any more. An endpoint that comes back is counted again.
func TestLateEventsOfARemovedEndpoint(t *testing.T) {
	m, reg, _ := newTestMetrics()
	const gone, kept = "http://127.0.0.1:26731", "http://127.0.0.1:26701"
	m.EndpointAdded(gone, []string{"m", "only-gone"})
	m.EndpointAdded(kept, []string{"m"})
	before := len(seriesOf(t, reg))

	m.ForgetEndpoints([]string{gone})
	afterForget := seriesOf(t, reg)
	for _, model := range []string{"m", "only-gone"} {
		lateEvents(m, model, gone)
	}
	for k := range seriesOf(t, reg) {
		if strings.Contains(k, gone) || strings.Contains(k, "only-gone") {
			t.Errorf("after the late events of the removed endpoint: %s", k)
		}
	}
	// What does not name the endpoint or the model is counted as before: the model m, which
	// kept serves.
	s := seriesOf(t, reg)
	if diff := cmp.Diff([]float64{10, 1, 1}, []float64{s[`kvroute_prompt_tokens_total{model=m}`],
		s[`kvroute_ttft_seconds_count{model=m}`], s[`kvroute_request_duration_seconds_count{model=m}`]}); diff != "" {
		t.Errorf("model m's prompt tokens, TTFT and duration counts (-want +got):\n%s", diff)
	}
	if n := len(s); n != len(afterForget) {
		t.Errorf("%d series after the late events, %d before them", n, len(afterForget))
	}

	// The endpoint comes back: it is counted again, from series at 0.
	m.EndpointAdded(gone, []string{"m"})
	lateEvents(m, "m", gone)
	s = seriesOf(t, reg)
	for _, k := range []string{
		`kvroute_requests_total{endpoint=` + gone + `,model=m,status=200}`,
		`kvroute_requests_total{endpoint=` + gone + `,model=m,status=422}`,
		`kvroute_retries_total{endpoint=` + gone + `,reason=timeout}`,
		`kvroute_requests_moved_total{endpoint=` + gone + `,reason=backoff}`,
		`kvroute_endpoint_ejections_total{endpoint=` + gone + `,reason=failures}`,
		`kvroute_endpoint_ejected{endpoint=` + gone + `}`,
		`kvroute_endpoint_cache_blind{endpoint=` + gone + `}`,
		`kvroute_endpoint_cache_blind_total{endpoint=` + gone + `}`,
	} {
		if s[k] != 1 {
			t.Errorf("re-added: %s = %v, want 1", k, s[k])
		}
	}
	if before == 0 {
		t.Fatal("no series at all")
	}
	lint(t, reg)
}

// TestCounterTakenBeforeRemoval: a counter taken while the endpoint was in the fleet and
// counted after it left counts nothing that is exported.
func TestCounterTakenBeforeRemoval(t *testing.T) {
	m, reg, _ := newTestMetrics()
	const ep = "http://127.0.0.1:1"
	m.EndpointAdded(ep, []string{"m"})
	c := m.Requests.WithLabelValues("m", ep, "200")
	o := m.TTFT.WithLabelValues("m")
	m.ForgetEndpoint(ep)
	c.Inc()
	o.Observe(1)
	for k := range seriesOf(t, reg) {
		if strings.Contains(k, ep) || strings.Contains(k, "model=m") {
			t.Errorf("after ForgetEndpoint and a late count: %s", k)
		}
	}
}

// TestLateEventsRace: requests end on an endpoint while it leaves the fleet and comes back
// over and over; once it has left for good, none of its series is left, whichever way
// each count and each deletion interleaved.
func TestLateEventsRace(t *testing.T) {
	m, reg, _ := newTestMetrics()
	const ep, other = "http://127.0.0.1:1", "http://127.0.0.1:2"
	m.EndpointAdded(other, []string{"m"})
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 4 {
		wg.Go(func() {
			for i := 0; i < 100_000; i++ { // bounded: stop ends it sooner
				select {
				case <-stop:
					return
				default:
				}
				m.Requests.WithLabelValues("m", ep, "200").Inc()
				m.Retries.WithLabelValues(ep, RetryTimeout).Inc()
				m.PredictedCachedTokens("m", ep, 1)
				m.EndpointEjected(ep, EjectPeerFailures, time.Second)
			}
		})
	}
	for range 300 {
		m.EndpointAdded(ep, []string{"m"})
		m.ForgetEndpoints([]string{ep})
	}
	close(stop)
	wg.Wait()
	for k := range seriesOf(t, reg) {
		if strings.Contains(k, ep+",") || strings.Contains(k, ep+"}") {
			t.Errorf("after the endpoint left for good: %s", k)
		}
	}
}

// TestUntrackedCountsEverything: metrics that were never told of an endpoint (a Handler
// without a router: tests, benchmarks) count every endpoint and model.
func TestUntrackedCountsEverything(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg)
	m.Requests.WithLabelValues("m", "http://127.0.0.1:1", "200").Inc()
	m.Retries.WithLabelValues("http://127.0.0.1:1", RetryConnectError).Inc()
	m.TTFT.WithLabelValues("m").Observe(0.1)
	m.EndpointEjected("http://127.0.0.1:1", EjectRefusals, 0)
	got := metricstest.Values(t, reg, "kvroute_")
	for _, k := range []string{`kvroute_requests_total{endpoint=http://127.0.0.1:1,model=m,status=200}`,
		`kvroute_retries_total{endpoint=http://127.0.0.1:1,reason=connect_error}`, `kvroute_ttft_seconds_count{model=m}`,
		`kvroute_endpoint_ejections_total{endpoint=http://127.0.0.1:1,reason=refusals}`} {
		if got[k] != 1 {
			t.Errorf("%s = %v, want 1", k, got[k])
		}
	}
	if n := testutil.ToFloat64(m.Requests.WithLabelValues("m", "http://127.0.0.1:1", "200")); n != 1 {
		t.Errorf("read back: %v, want 1", n)
	}
}
