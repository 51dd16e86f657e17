package proxy

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/route"
)

// counted wraps an engine's handler to count the API requests it gets.
func counted(n *atomic.Int32, handle func(w http.ResponseWriter, r *http.Request)) func(w http.ResponseWriter, r *http.Request) {
	return func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		handle(w, r)
	}
}

// failing answers every request with status and an error body.
func failing(status int) func(w http.ResponseWriter, r *http.Request) {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		fmt.Fprintf(w, `{"object":"error","message":"engine says %d","type":"InternalServerError","code":%d}`, status, status)
	}
}

// losing closes the connection of every request it gets, before any byte of an answer.
func losing(w http.ResponseWriter, r *http.Request) {
	if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
		conn.Close()
	}
}

// failures returns the consecutive failures counted against the endpoint named name.
func (f *fixture) failures(t *testing.T, name string) int {
	t.Helper()
	for _, e := range f.pool.All() {
		if e.Name == name {
			here, _ := f.h.Lifecycle.Health().(*route.Outlier).Failures(e)
			return here
		}
	}
	t.Fatalf("no endpoint %s", name)
	return 0
}

// TestServerErrorRetriedOnce: an engine that answers 500, 502 or 504 before any byte (a broken
// engine that still passes its health checks) costs no request: the next endpoint answers,
// streamed or not. Two such failures end the request, however many endpoints are left (a
// request that fails every engine is not sent round the fleet): the client gets the second,
// and the third engine never sees it.
func TestServerErrorRetriedOnce(t *testing.T) {
	for _, status := range []int{500, 502, 504} {
		t.Run(fmt.Sprint(status), func(t *testing.T) {
			var nbad, nbad2, ngood atomic.Int32
			bad := engine(t, counted(&nbad, failing(status)))
			good := newFakeEngine(t)
			f := newFixture(t, spec(bad.URL, "m"), spec(good.srv.URL, "m"))
			for _, body := range []string{chatBody, streamBody} {
				resp, b := f.post(t, "/v1/chat/completions", body)
				if resp.StatusCode != 200 {
					t.Errorf("%d, then a good engine: got %d %q, want 200 from the good one", status, resp.StatusCode, b)
				}
			}
			if n := testutil.ToFloat64(f.h.Metrics.Retries.WithLabelValues(bad.URL, route.FailStatus.String())); nbad.Load() != 2 || n != 2 {
				t.Errorf("the failing engine got %d requests, %v retried from it; want 2 and 2", nbad.Load(), n)
			}
			if n := f.failures(t, bad.URL); n != 2 {
				t.Errorf("failures counted against the failing engine: %d, want 2", n)
			}

			bad2 := engine(t, counted(&nbad2, failing(502)))
			third := engine(t, counted(&ngood, failing(200)))
			f = newFixture(t, spec(bad.URL, "m"), spec(bad2.URL, "m"), spec(third.URL, "m"))
			resp, b := f.post(t, "/v1/chat/completions", chatBody)
			if resp.StatusCode != http.StatusBadGateway || !strings.Contains(string(b), "engine says 502") {
				t.Errorf("%d, then 502: got %d %q; want the second engine's 502", status, resp.StatusCode, b)
			}
			if ngood.Load() != 0 {
				t.Errorf("the third engine got %d requests after two 5xx, want 0", ngood.Load())
			}
			if a, b := f.failures(t, bad.URL), f.failures(t, bad2.URL); a != 1 || b != 0 {
				t.Errorf("failures counted: %d and %d; want 1 against the first, none against the second (the request is suspect)", a, b)
			}
		})
	}
}

// TestLostRetriedOnce: a request whose engine closes the connection before any byte of an
// answer (a crash, or an engine that does so to every request) goes on to the next endpoint,
// once: a second loss ends it with 502 upstream_connection_lost, and the third engine never
// sees it.
func TestLostRetriedOnce(t *testing.T) {
	var nlost, nlost2, nthird atomic.Int32
	lost := engine(t, counted(&nlost, losing))
	good := newFakeEngine(t)
	f := newFixture(t, spec(lost.URL, "m"), spec(good.srv.URL, "m"))
	for _, body := range []string{chatBody, streamBody} {
		if resp, b := f.post(t, "/v1/chat/completions", body); resp.StatusCode != 200 {
			t.Errorf("a lost connection, then a good engine: got %d %q; want 200", resp.StatusCode, b)
		}
	}
	if n := testutil.ToFloat64(f.h.Metrics.Retries.WithLabelValues(lost.URL, route.FailLost.String())); nlost.Load() != 2 || n != 2 {
		t.Errorf("the losing engine got %d requests, %v retried from it; want 2 and 2", nlost.Load(), n)
	}

	lost2 := engine(t, counted(&nlost2, losing))
	third := engine(t, counted(&nthird, failing(200)))
	f = newFixture(t, spec(lost.URL, "m"), spec(lost2.URL, "m"), spec(third.URL, "m"))
	resp, b := f.post(t, "/v1/chat/completions", chatBody)
	if resp.StatusCode != http.StatusBadGateway || errorCode(b) != "upstream_connection_lost" {
		t.Errorf("two lost connections: got %d %q; want 502 upstream_connection_lost", resp.StatusCode, b)
	}
	if nlost2.Load() != 1 || nthird.Load() != 0 {
		t.Errorf("the second engine got %d requests, the third %d; want 1 and 0", nlost2.Load(), nthird.Load())
	}
}

// TestWholeBodyIdle: a non-streamed answer whose head comes and whose body then stops is ended
// after the idle timeout without a byte, not the response timeout: 504 upstream_timeout,
// counted against the endpoint, whatever its engine kind (no work counters here). A body that
// keeps coming, slower than the idle timeout in all but never silent that long, is relayed.
func TestWholeBodyIdle(t *testing.T) {
	answer := `{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}]}`
	mode := "stop"
	eng := engine(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", fmt.Sprint(len(answer)))
		w.WriteHeader(200)
		if mode == "stop" {
			_, _ = io.WriteString(w, answer[:10])
			w.(http.Flusher).Flush()
			<-r.Context().Done()
			return
		}
		for i := range len(answer) { // a byte every 20 ms: 2 s in all
			_, _ = io.WriteString(w, answer[i:i+1])
			w.(http.Flusher).Flush()
			select {
			case <-time.After(20 * time.Millisecond):
			case <-r.Context().Done():
				return
			}
		}
	})
	f := newFixture(t, endpoint.Spec{Name: eng.URL, Models: []string{"m"}, Engine: "openai"})
	f.h.Timeouts = Timeouts{Response: 15 * time.Second, StreamIdle: 300 * time.Millisecond}
	start := time.Now()
	resp, body := f.post(t, "/v1/chat/completions", chatBody)
	if took := time.Since(start); resp.StatusCode != http.StatusGatewayTimeout || errorCode(body) != "upstream_timeout" || took > 5*time.Second {
		t.Errorf("head, then a stalled body: got %d %q after %v; want 504 upstream_timeout at the 300 ms idle timeout", resp.StatusCode, body, took)
	}
	if n := f.failures(t, eng.URL); n != 1 {
		t.Errorf("failures counted against the endpoint: %d, want 1", n)
	}

	mode = "trickle"
	resp, body = f.post(t, "/v1/chat/completions", chatBody)
	if resp.StatusCode != 200 || string(body) != answer {
		t.Errorf("a body that trickles: got %d %q; want the answer whole", resp.StatusCode, body)
	}
}

// TestStallWatchedCold: a router whose policy predicts no TTFT (as prefix-aware before its
// calibration, and every other policy) still gives up a stream its engine holds without a
// word after the stall timeout, for the next endpoint, instead of waiting the first-token
// timeout.
func TestStallWatchedCold(t *testing.T) {
	silent := engine(t, func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	good := newFakeEngine(t)
	f := newFixture(t, spec(silent.URL, "m"), spec(good.srv.URL, "m"))
	lc, err := route.New(route.Config{Picker: f.pk, Attempts: 3, StallTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	f.h.Lifecycle = lc
	f.h.Timeouts = Timeouts{FirstToken: 15 * time.Second}
	start := time.Now()
	resp, body := f.post(t, "/v1/chat/completions", streamBody)
	if took := time.Since(start); resp.StatusCode != 200 || took > 5*time.Second {
		t.Errorf("a silent engine first: got %d %q after %v; want 200 from the next after the 300 ms stall timeout", resp.StatusCode, body, took)
	}
	if n := testutil.ToFloat64(f.h.Metrics.Retries.WithLabelValues(silent.URL, route.FailTimeout.String())); n != 1 {
		t.Errorf("retried from the silent engine: %v, want 1 (timeout)", n)
	}
}

// TestClientLeavesStalledEngine: a client that gives up on a stream its engine has held
// without a word for longer than the stall timeout (the request's last attempt: not watched)
// leaves a failure against the engine, which is marked stalled: an engine that hangs is not
// hidden by clients that leave first.
func TestClientLeavesStalledEngine(t *testing.T) {
	silent := engine(t, func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	f := newFixture(t, spec(silent.URL, "m"))
	lc, err := route.New(route.Config{Picker: f.pk, Attempts: 1, StallTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	f.h.Lifecycle = lc
	f.h.Timeouts = Timeouts{FirstToken: 15 * time.Second}
	client := *f.srv.Client()
	client.Timeout = 600 * time.Millisecond
	resp, err := client.Post(f.srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(streamBody))
	if err == nil {
		resp.Body.Close()
		t.Fatalf("got %d, want the client's timeout", resp.StatusCode)
	}
	f.wait(t)
	if n := f.failures(t, silent.URL); n != 1 {
		t.Errorf("failures counted against the silent engine: %d, want 1", n)
	}
	if ep := f.pool.All()[0]; ep.StalledSince() == 0 {
		t.Error("the silent engine was not marked stalled")
	}
}
