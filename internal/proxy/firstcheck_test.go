package proxy

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/scrape"
	"github.com/kvroute/kvroute/internal/testlog"
)

// autoSpec is an endpoint as `kvroute serve --endpoint URL --model m` makes it: engine auto, no
// cache_salt, so out of rotation until its first health check finds its kind.
func autoSpec(url string) endpoint.Spec {
	return endpoint.Spec{Name: url, Models: []string{"m"}, Engine: "auto", CacheSaltAuto: true}
}

// waitingLine is what the handler says, at debug, when a request waits for a first check.
const waitingLine = "it waits for the first health check of one that would serve it"

// debugLogger gives f's handler a JSON logger at debug level, and returns what it writes.
func debugLogger(f *fixture) *testlog.Buffer {
	logs := &testlog.Buffer{}
	f.h.Logger = slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	return logs
}

// sent is the outcome of a request sent in the background.
type sent struct {
	status int
	body   string
	err    error
	took   time.Duration
}

// sendChat posts chatBody to f's router in the background, under ctx.
func sendChat(ctx context.Context, f *fixture) <-chan sent {
	out := make(chan sent, 1)
	go func() {
		start := time.Now()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, f.srv.URL+"/v1/chat/completions", strings.NewReader(chatBody))
		if err != nil {
			out <- sent{err: err}
			return
		}
		resp, err := f.srv.Client().Do(req)
		if err != nil {
			out <- sent{err: err, took: time.Since(start)}
			return
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		out <- sent{resp.StatusCode, string(b), err, time.Since(start)}
	}()
	return out
}

// waitWaiting polls logs, for at most 10 s, until they say that the request sent on ch waits
// for a first check; it fails at once if the request is answered first.
func waitWaiting(t *testing.T, logs *testlog.Buffer, ch <-chan sent) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); logs.Count(waitingLine) == 0; time.Sleep(time.Millisecond) {
		select {
		case a := <-ch:
			t.Fatalf("answered %d %s %v, without waiting for the first check", a.status, a.body, a.err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the log never said that the request waits:\n%s", logs.String())
		}
	}
}

// answer waits at most 15 s for ch's outcome.
func answer(t *testing.T, ch <-chan sent) sent {
	t.Helper()
	select {
	case a := <-ch:
		return a
	case <-time.After(15 * time.Second):
		t.Fatal("no answer within 15 s")
		return sent{}
	}
}

// TestFirstCheckWait: a request that finds no endpoint available while the only one that
// would serve it (engine auto, out of rotation until its first health check finds its kind)
// has not had its first check waits for that check, rather than getting a 503 because the
// router just started: routed once the check passes, 503 as before once it fails, 503 when it
// has not ended within FirstCheckWait; a change of the pool (discovery) looks again, and the
// client leaving ends the wait. An endpoint that is not auto is down from its first check on:
// no wait.
func TestFirstCheckWait(t *testing.T) {
	t.Run("the check passes", func(t *testing.T) {
		e := newFakeEngine(t)
		f := newFixture(t, autoSpec(e.srv.URL))
		f.h.FirstCheckWait = time.Minute
		logs := debugLogger(f)
		ep := f.pool.ByName(e.srv.URL)
		if ep.Available() || ep.FirstCheck() == nil {
			t.Fatalf("the auto endpoint starts available %v, awaiting its first check %v; want false, true", ep.Available(), ep.FirstCheck() != nil)
		}
		ch := sendChat(context.Background(), f)
		waitWaiting(t, logs, ch)
		ep.SetKind("vllm") // as the prober records a check that passed
		ep.SetHealthy(true)
		if a := answer(t, ch); a.err != nil || a.status != http.StatusOK {
			t.Fatalf("after the check passed: %d %s %v, want 200", a.status, a.body, a.err)
		}
		if n := len(e.received()); n != 1 {
			t.Errorf("the engine got %d requests, want 1", n)
		}
		if ep.FirstCheck() != nil {
			t.Error("FirstCheck is still awaited after the check")
		}
	})
	t.Run("the check fails", func(t *testing.T) {
		e := newFakeEngine(t)
		f := newFixture(t, autoSpec(e.srv.URL))
		f.h.FirstCheckWait = time.Minute
		logs := debugLogger(f)
		ch := sendChat(context.Background(), f)
		waitWaiting(t, logs, ch)
		f.pool.ByName(e.srv.URL).SetHealthy(false) // as the prober records a first check that failed
		a := answer(t, ch)
		if a.err != nil || a.status != http.StatusServiceUnavailable || !strings.Contains(a.body, `no healthy endpoint serves model \"m\": 1 endpoint serves it, none available now (1 failing its health check); retry shortly`) {
			t.Fatalf("after the check failed: %d %s %v, want 503 no healthy endpoint", a.status, a.body, a.err)
		}
		if n := len(e.received()); n != 0 {
			t.Errorf("the engine got %d requests, want none", n)
		}
	})
	t.Run("bounded", func(t *testing.T) {
		e := newFakeEngine(t)
		f := newFixture(t, autoSpec(e.srv.URL))
		f.h.FirstCheckWait = 200 * time.Millisecond
		a := answer(t, sendChat(context.Background(), f))
		if a.err != nil || a.status != http.StatusServiceUnavailable || a.took < f.h.FirstCheckWait || a.took > 10*time.Second {
			t.Fatalf("no check: %d %s %v after %v, want 503 after the %v wait", a.status, a.body, a.err, a.took, f.h.FirstCheckWait)
		}
	})
	t.Run("the pool changes", func(t *testing.T) {
		e, e2 := newFakeEngine(t), newFakeEngine(t)
		f := newFixture(t, autoSpec(e.srv.URL))
		f.pk.order = append(f.pk.order, e2.srv.URL)
		f.h.FirstCheckWait = time.Minute
		logs := debugLogger(f)
		ch := sendChat(context.Background(), f)
		waitWaiting(t, logs, ch)
		// Discovery replaces the endpoint with one that is up (a vllm one starts healthy).
		if _, err := f.pool.Update([]endpoint.Spec{spec(e2.srv.URL, "m")}); err != nil {
			t.Fatal(err)
		}
		if a := answer(t, ch); a.err != nil || a.status != http.StatusOK || len(e2.received()) != 1 {
			t.Fatalf("after the pool changed: %d %s %v, the new endpoint got %d requests; want 200 from it", a.status, a.body, a.err, len(e2.received()))
		}
	})
	t.Run("the client leaves", func(t *testing.T) {
		e := newFakeEngine(t)
		f := newFixture(t, autoSpec(e.srv.URL))
		f.h.FirstCheckWait = time.Minute
		logs := debugLogger(f)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		ch := sendChat(ctx, f)
		waitWaiting(t, logs, ch)
		cancel()
		if a := answer(t, ch); a.err == nil {
			t.Errorf("answered %d %s, want the client's request cancelled", a.status, a.body)
		}
		f.wait(t) // the handler returned
		if l := lastAccess(t, logs); l["status"] != 499.0 || l["error_code"] != "client_closed_request" {
			t.Errorf("access line %v, want status 499, client_closed_request", l)
		}
	})
	t.Run("not auto", func(t *testing.T) {
		e := newFakeEngine(t)
		f := newFixture(t, spec(e.srv.URL, "m"))
		f.h.FirstCheckWait = time.Minute
		logs := debugLogger(f)
		ep := f.pool.ByName(e.srv.URL)
		if !ep.Available() || ep.FirstCheck() != nil {
			t.Fatalf("a vllm endpoint starts available %v, awaiting a first check %v; want true, false", ep.Available(), ep.FirstCheck() != nil)
		}
		ep.SetHealthy(false)
		a := answer(t, sendChat(context.Background(), f))
		if a.status != http.StatusServiceUnavailable || a.took > 10*time.Second || logs.Count(waitingLine) != 0 {
			t.Errorf("a vllm endpoint down: %d after %v, waited %v; want 503 at once", a.status, a.took, logs.Count(waitingLine) != 0)
		}
	})
}

// TestFirstCheckProber is TestFirstCheckWait with the prober that `kvroute serve` runs checking
// the endpoint, its first check held back by the engine's answer to the kind's detection: the
// request that came meanwhile is routed once the check passes, or answered 503 as soon as it
// fails (well before FirstCheckWait).
func TestFirstCheckProber(t *testing.T) {
	for _, up := range []bool{true, false} {
		name := "engine up"
		if !up {
			name = "engine failing"
		}
		t.Run(name, func(t *testing.T) {
			probed, release := make(chan struct{}), make(chan struct{})
			var released sync.Once
			free := func() { released.Do(func() { close(release) }) }
			eng := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				switch {
				case r.URL.Path == "/metrics":
					select {
					case probed <- struct{}{}:
					default:
					}
					select {
					case <-release:
					case <-r.Context().Done():
						return
					}
					if !up {
						http.Error(w, "down", http.StatusInternalServerError)
						return
					}
					_, _ = io.WriteString(w, "vllm:num_requests_running 0\n")
				case !up:
					http.Error(w, "down", http.StatusInternalServerError)
				case r.URL.Path == "/health":
				case r.URL.Path == "/v1/models":
					_, _ = io.WriteString(w, `{"object":"list","data":[{"id":"m","object":"model","owned_by":"vllm"}]}`)
				case r.URL.Path == "/v1/chat/completions":
					w.Header().Set("Content-Type", "application/json")
					_, _ = io.WriteString(w, `{"id":"c","choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}],"usage":{"prompt_tokens":3,"completion_tokens":1}}`)
				default:
					http.NotFound(w, r)
				}
			}))
			defer eng.Close()
			defer free() // before the engine closes: a test that failed early leaves no check held
			f := newFixture(t, autoSpec(eng.URL))
			f.h.FirstCheckWait = 30 * time.Second
			logs := debugLogger(f)
			client := &http.Client{Timeout: 10 * time.Second}
			defer client.CloseIdleConnections()
			p := scrape.New(f.pool, client, scrape.Options{HealthTimeout: 10 * time.Second}, slog.New(slog.DiscardHandler))
			ep := f.pool.ByName(eng.URL)
			checked := make(chan error, 1)
			go func() { checked <- p.Check(context.Background(), ep) }()
			waitClosedOrSent(t, probed, "the prober did not ask the engine")
			ch := sendChat(context.Background(), f)
			waitWaiting(t, logs, ch)
			free()
			a := answer(t, ch)
			switch {
			case up && (a.err != nil || a.status != http.StatusOK):
				t.Errorf("after the first check passed: %d %s %v, want 200", a.status, a.body, a.err)
			case !up && (a.err != nil || a.status != http.StatusServiceUnavailable || a.took > 10*time.Second):
				t.Errorf("after the first check failed: %d %s %v after %v, want 503 at once", a.status, a.body, a.err, a.took)
			}
			select {
			case err := <-checked:
				if (err == nil) != up {
					t.Errorf("the check returned %v", err)
				}
			case <-time.After(15 * time.Second):
				t.Fatal("the check did not end")
			}
		})
	}
}

// waitClosedOrSent waits at most 10 s for a value on ch (or its close).
func waitClosedOrSent(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatal(what)
	}
}
