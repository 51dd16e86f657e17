package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/app"
	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/simserver"
)

// The fault tests (#12): engines that freeze, hang, fail fast, cut streams or die on a query of
// death, and clients that leave right after the end of a stream. Each runs the router as
// `kvroute serve` builds it, with passive ejection as the only health signal that can act
// within the test (the health check runs once at start, then hourly), so that what the test
// sees is what outlier detection and the per-attempt timeouts do.

// faultConfig is a router config in front of urls: policy, the first-token timeout ft, every
// other setting at its default, health checks hourly.
func faultConfig(t *testing.T, urls []string, policy string, ft time.Duration) *config.Config {
	t.Helper()
	var y strings.Builder
	fmt.Fprintf(&y, "policy: {name: %s}\nhealth: {interval: 1h}\nscrape: {interval: 200ms}\nserver: {shutdown_timeout: 5s}\n", policy)
	fmt.Fprintf(&y, "limits: {first_token_timeout: %s}\nendpoints:\n", ft)
	for _, u := range urls {
		fmt.Fprintf(&y, "  - {url: %q, models: [%s], engine: vllm}\n", u, model)
	}
	cfg, err := config.Parse([]byte(y.String()))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// startFaultFleet starts n in-process simulated instances (no time cost per token) that stop
// when the test ends.
func startFaultFleet(t *testing.T, n int) *simserver.Fleet {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	fleet, err := simserver.StartFleet(ctx, simserver.Options{Profile: "instant", Model: model, DefaultMaxTokens: 8}, n, "127.0.0.1", 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fleet.Close() })
	return fleet
}

// outcome is what a streaming client saw of one request.
type outcome struct {
	status   int
	done     bool // the stream reached [DONE]
	errEvent bool // an SSE error event came
	took     time.Duration
	err      error
}

func (o outcome) ok() bool { return o.err == nil && o.status == http.StatusOK && o.done && !o.errEvent }

// chatStream sends one streamed chat request and reads its answer to the end.
func chatStream(client *http.Client, api, content string) outcome {
	return chatOnce(client, api, content, true)
}

// chatWhole sends one non-streamed chat request and reads its answer: done when it is a
// chat completion with a choice.
func chatWhole(client *http.Client, api, content string) outcome {
	return chatOnce(client, api, content, false)
}

func chatOnce(client *http.Client, api, content string, stream bool) outcome {
	body := fmt.Sprintf(`{"model":%q,"stream":%v,"max_tokens":8,"messages":[{"role":"user","content":%q}]}`, model, stream, content)
	t0 := time.Now()
	resp, err := client.Post(api+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		return outcome{err: err, took: time.Since(t0)}
	}
	defer resp.Body.Close()
	o := outcome{status: resp.StatusCode}
	switch {
	case resp.StatusCode != http.StatusOK:
		_, _ = io.Copy(io.Discard, resp.Body)
	case stream:
		rd := openai.NewSSEReader(resp.Body, 1<<20)
		for range 10_000 {
			ev, err := rd.Next()
			if err != nil {
				if err != io.EOF {
					o.err = err
				}
				break
			}
			o.done = o.done || ev.IsDone()
			o.errEvent = o.errEvent || ev.Name == "error"
		}
	default:
		var answer struct {
			Object  string            `json:"object"`
			Choices []json.RawMessage `json:"choices"`
		}
		if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&answer); err != nil {
			o.err = err
		}
		o.done = answer.Object == "chat.completion" && len(answer.Choices) > 0
	}
	o.took = time.Since(t0)
	return o
}

// faultClient is an HTTP client for the fault tests: its own connections, a bound on every
// request.
func faultClient(t *testing.T) *http.Client {
	t.Helper()
	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}

// sumMetric sums the samples of the metric name whose label text contains match ("" for all)
// in a Prometheus text exposition.
func sumMetric(text, name, match string) float64 {
	var sum float64
	for l := range strings.SplitSeq(text, "\n") {
		if !strings.HasPrefix(l, name+"{") && !strings.HasPrefix(l, name+" ") {
			continue
		}
		if match != "" && !strings.Contains(l, match) {
			continue
		}
		f := strings.Fields(l)
		var v float64
		if _, err := fmt.Sscan(f[len(f)-1], &v); err == nil {
			sum += v
		}
	}
	return sum
}

// ejectedNow reports, per endpoint name, whether passive ejection holds it out now.
func ejectedNow(r *app.Router) map[string]bool {
	out := map[string]bool{}
	for _, e := range r.Endpoints() {
		out[e.Name] = e.EjectedUntil != nil
	}
	return out
}

// waitChecked waits (10 s at most) until the router has recorded a first health check of every
// endpoint, so that a fault set afterwards meets a router that saw the fleet healthy.
func waitChecked(t *testing.T, r *app.Router) {
	t.Helper()
	waitFor(t, 10*time.Second, "a first passing health check of every endpoint", func() bool {
		for _, e := range r.Endpoints() {
			if e.Probe.LastCheck.IsZero() || !e.Healthy {
				return false
			}
		}
		return true
	})
}

// paced sends n streamed requests, one every gap, each on its own goroutine, and returns their
// outcomes in order.
func paced(t *testing.T, client *http.Client, api string, n int, gap time.Duration, tag string) []outcome {
	t.Helper()
	return pacedWith(chatStream, client, api, n, gap, tag)
}

// pacedWith is paced with send for each request.
func pacedWith(send func(*http.Client, string, string) outcome, client *http.Client, api string, n int, gap time.Duration, tag string) []outcome {
	out := make([]outcome, n)
	var wg sync.WaitGroup
	tick := time.NewTicker(gap)
	defer tick.Stop()
	for i := range n {
		if i > 0 {
			<-tick.C
		}
		wg.Go(func() { out[i] = send(client, api, fmt.Sprintf("%s question %d", tag, i)) })
	}
	wg.Wait()
	return out
}

// slowest returns the longest outcome and how many took longer than d.
func slowest(outs []outcome, d time.Duration) (longest time.Duration, over int) {
	for _, o := range outs {
		longest = max(longest, o.took)
		if o.took > d {
			over++
		}
	}
	return longest, over
}

// incomplete reports each outcome that is not a complete stream as an error, and counts them.
func incomplete(t *testing.T, outs []outcome) int {
	t.Helper()
	n := 0
	for i, o := range outs {
		if !o.ok() {
			n++
			t.Errorf("request %d: %+v, want a complete stream", i, o)
		}
	}
	return n
}

// retryAllowance is what one more attempt on a healthy simulated engine (no time per token)
// may add to a request, on a loaded 2-core machine with the race detector.
const retryAllowance = time.Second

// TestFrozenEngine: one of two engines (kvroute sim processes) is frozen with SIGSTOP: it
// accepts connections (the kernel does) and answers nothing, its /health neither. 30 requests
// over 15 s, with a first-token timeout of 1 s: none waits longer than the timeout plus one
// retry, every one succeeds, and the frozen engine is ejected.
func TestFrozenEngine(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("SIGSTOP and SIGCONT on a child process: Linux only here")
	}
	bin := kvrouteBinary(t)
	simAddr := func(f []string) (string, bool) {
		if len(f) > 2 && f[0] == "instance" && f[1] == "0:" {
			return f[2], true // instance 0: http://127.0.0.1:PORT model=...
		}
		return "", false
	}
	var sims []*process
	for range 2 {
		sims = append(sims, startProcess(t, bin, nil, simAddr, "sim", "--profile", "instant", "--port", "0", "--model", model, "--default-max-tokens", "8"))
	}
	const ft = time.Second
	r, api, admin := startRouter(t, faultConfig(t, []string{sims[0].addr, sims[1].addr}, "prefix-aware", ft))
	waitChecked(t, r)
	frozen := sims[0]
	if err := frozen.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	// Registered after the processes' own cleanups, so it runs before them: a stopped process
	// does not act on the interrupt they send.
	t.Cleanup(func() { _ = frozen.cmd.Process.Signal(syscall.SIGCONT) })

	outs := paced(t, faultClient(t), api, 30, 500*time.Millisecond, "frozen")
	longest, over := slowest(outs, ft)
	failed := incomplete(t, outs)
	m := metricsText(t, admin)
	timeouts := sumMetric(m, "kvroute_retries_total", `reason="timeout"`)
	ejections := sumMetric(m, "kvroute_endpoint_ejections_total", `endpoint="`+frozen.addr+`"`)
	t.Logf("frozen engine: %d of %d requests failed; slowest %v; %d took longer than the first-token timeout (%v); %v timeouts retried; the frozen engine ejected %v times",
		failed, len(outs), longest.Round(time.Millisecond), over, ft, timeouts, ejections)
	if longest > ft+retryAllowance {
		t.Errorf("slowest request took %v, want at most the first-token timeout %v plus one retry (%v)", longest, ft, retryAllowance)
	}
	if !ejectedNow(r)[frozen.addr] || ejections != 1 {
		t.Errorf("frozen engine: ejected now %v, ejections %v; want it ejected once", ejectedNow(r)[frozen.addr], ejections)
	}
	if timeouts < 1 || float64(over) > timeouts {
		t.Errorf("%v timeouts retried for %d requests slower than the first-token timeout: want at least one, one per slow request", timeouts, over)
	}
}

// TestHungEngine: one of two engines answers /health but never answers an API request (the
// hang fault). It is ejected after passive_failures first-token timeouts, and every request
// succeeds on the other within the timeout plus one retry.
func TestHungEngine(t *testing.T) {
	fleet := startFaultFleet(t, 2)
	const ft = time.Second
	r, api, admin := startRouter(t, faultConfig(t, fleet.URLs(), "prefix-aware", ft))
	waitChecked(t, r)
	hung, hungURL := fleet.Instances()[0], fleet.URLs()[0]
	if err := hung.SetFaults(simserver.Faults{Hang: true}); err != nil {
		t.Fatal(err)
	}
	outs := paced(t, faultClient(t), api, 20, 250*time.Millisecond, "hung")
	longest, over := slowest(outs, ft)
	failed := incomplete(t, outs)
	held := sumMetric(metricsText(t, hungURL), "kvroute_sim_faults_total", `fault="hang"`)
	ejections := sumMetric(metricsText(t, admin), "kvroute_endpoint_ejections_total", `endpoint="`+hungURL+`"`)
	t.Logf("hung engine: %d of %d requests failed; slowest %v; %d took longer than the first-token timeout (%v); the hung engine held %v requests and was ejected %v times",
		failed, len(outs), longest.Round(time.Millisecond), over, ft, held, ejections)
	if longest > ft+retryAllowance {
		t.Errorf("slowest request took %v, want at most %v plus one retry (%v)", longest, ft, retryAllowance)
	}
	if !ejectedNow(r)[hungURL] || ejections != 1 {
		t.Errorf("hung engine: ejected now %v, ejections %v; want it ejected once", ejectedNow(r)[hungURL], ejections)
	}
	if passive := r.Config().Health.PassiveFailures; held < float64(passive) {
		t.Errorf("the hung engine held %v requests: ejection needs %d timeouts in a row", held, passive)
	}
}

// TestStalledEngine: as TestHungEngine, with the first-token and response timeouts at a minute
// and limits.stall_timeout at 1 s: once the router has calibrated its TTFT predictions (a few
// streams), a request held by the hung engine, which answers nothing else meanwhile, is given
// up as stalled after about a second, not the minute, and succeeds on the other engine; the
// engine is then marked stalled (/debug/endpoints stalled_since). Streams, and non-streamed
// requests, which show nothing before their answer is complete: for those the hung engine's
// silence is read from the token counters scraped from it (every 200 ms here), so each engine
// first computes something, and a held request may wait up to twice the stall timeout (the
// last scrape must fall in the silence's second half).
func TestStalledEngine(t *testing.T) {
	for _, tc := range []struct {
		name  string
		send  func(*http.Client, string, string) outcome
		bound time.Duration // the slowest request's, less one retry
	}{
		{"streams", chatStream, time.Second},
		{"non-streamed", chatWhole, 2 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fleet := startFaultFleet(t, 2)
			const ft, stall = time.Minute, time.Second
			cfg := faultConfig(t, fleet.URLs(), "prefix-aware", ft)
			cfg.Limits.StallTimeout = config.Duration(stall)
			cfg.Limits.ResponseTimeout = config.Duration(ft)
			r, api, admin := startRouter(t, cfg)
			waitChecked(t, r)
			client := faultClient(t)
			incomplete(t, paced(t, client, api, 10, 20*time.Millisecond, "calibrate"))
			for _, u := range fleet.URLs() {
				incomplete(t, []outcome{chatWhole(client, u, "directly")})
			}
			waitFor(t, 5*time.Second, "a scrape of the engines' token counters after the calibration", func() bool {
				for _, e := range r.Endpoints() {
					if e.Snapshot == nil || e.Snapshot.Work <= 0 {
						return false
					}
				}
				return true
			})
			hung, hungURL := fleet.Instances()[0], fleet.URLs()[0]
			if err := hung.SetFaults(simserver.Faults{Hang: true}); err != nil {
				t.Fatal(err)
			}
			outs := pacedWith(tc.send, client, api, 20, 250*time.Millisecond, "stalled")
			longest, over := slowest(outs, stall)
			failed := incomplete(t, outs)
			held := sumMetric(metricsText(t, hungURL), "kvroute_sim_faults_total", `fault="hang"`)
			timeouts := sumMetric(metricsText(t, admin), "kvroute_retries_total", `reason="timeout"`)
			t.Logf("stalled engine, %s: %d of %d requests failed; slowest %v; %d took longer than the stall timeout (%v); the hung engine held %v requests, %v given up",
				tc.name, failed, len(outs), longest.Round(time.Millisecond), over, stall, held, timeouts)
			if longest > tc.bound+retryAllowance {
				t.Errorf("slowest request took %v, want at most %v plus one retry (%v), far below the timeouts' %v",
					longest, tc.bound, retryAllowance, ft)
			}
			if held < 1 || timeouts < held {
				t.Errorf("the hung engine held %v requests and %v were given up: want at least one, each given up", held, timeouts)
			}
			// Found stalled, it goes after the other engine (but for a probe every 30 s) until
			// it answers, and /debug/endpoints says since when.
			for _, e := range r.Endpoints() {
				if (e.Name == hungURL) != (e.StalledSince != nil) {
					t.Errorf("/debug/endpoints: %s stalled since %v; want a time for the hung engine only", e.Name, e.StalledSince)
				}
			}
		})
	}
}

// TestFailingEngine: one of two engines fails every request it gets, answering 500 at once or
// cutting every stream after two tokens. At least 90 % of 200 requests (4 clients at a time)
// succeed: outlier detection takes the failing engine out after passive_failures failures. A
// 500 before any byte costs no request at all: it is sent on once, to the other engine.
func TestFailingEngine(t *testing.T) {
	for _, tc := range []struct {
		name    string
		faults  simserver.Faults
		fault   string // its kvroute_sim_faults_total label
		retried bool   // the failures are sent on to the other engine
	}{
		{"500", simserver.Faults{FailRate: 1, FailStatus: 500}, "fail_rate", true},
		{"cut streams", simserver.Faults{CutAfter: 2}, "cut_after", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fleet := startFaultFleet(t, 2)
			r, api, admin := startRouter(t, faultConfig(t, fleet.URLs(), "prefix-aware", 10*time.Second))
			waitChecked(t, r)
			bad, badURL := fleet.Instances()[0], fleet.URLs()[0]
			if err := bad.SetFaults(tc.faults); err != nil {
				t.Fatal(err)
			}
			const n, clients = 200, 4
			client := faultClient(t)
			var next, ok atomic.Int64
			var wg sync.WaitGroup
			for range clients {
				wg.Go(func() {
					for i := next.Add(1); i <= n; i = next.Add(1) {
						if chatStream(client, api, fmt.Sprintf("%s question %d", tc.name, i)).ok() {
							ok.Add(1)
						}
					}
				})
			}
			wg.Wait()
			struck := sumMetric(metricsText(t, badURL), "kvroute_sim_faults_total", `fault="`+tc.fault+`"`)
			m := metricsText(t, admin)
			ejections := sumMetric(m, "kvroute_endpoint_ejections_total", `endpoint="`+badURL+`"`)
			t.Logf("%s: %d of %d requests succeeded (%.1f %%); the failing engine failed %v of them and was ejected %v times",
				tc.name, ok.Load(), n, 100*float64(ok.Load())/n, struck, ejections)
			if ok.Load() < n*9/10 {
				t.Errorf("%d of %d requests succeeded, want at least 90 %%", ok.Load(), n)
			}
			if ejections < 1 {
				t.Error("the failing engine was never ejected")
			}
			switch {
			case tc.retried && (ok.Load() != n || struck < 1):
				t.Errorf("%d of %d requests succeeded, the engine failed %v: want every one served, the failures sent on", ok.Load(), n, struck)
			case !tc.retried && float64(n)-float64(ok.Load()) != struck:
				t.Errorf("%d requests failed, the engine failed %v: want every failure to be the failing engine's", n-ok.Load(), struck)
			}
		})
	}
}

// TestQueryOfDeath: a request that makes whatever engine reads it drop the connection (drop_on,
// on each of three engines) is delivered to two engines only (a lost connection is sent on
// once, and a second ends the request), answered with an error, and counts once, against the
// first engine. Three of them make three counted failures in all, so with the default passive_failures (3) they eject at most
// one engine (all three on the same one, with no success in between), never more; other
// clients' requests, sent all along, all succeed.
func TestQueryOfDeath(t *testing.T) {
	const poison = "POISON-PILL"
	fleet := startFaultFleet(t, 3)
	for _, in := range fleet.Instances() {
		if err := in.SetFaults(simserver.Faults{DropOn: poison}); err != nil {
			t.Fatal(err)
		}
	}
	cfg := faultConfig(t, fleet.URLs(), "prefix-aware", 10*time.Second)
	r, api, admin := startRouter(t, cfg)
	waitChecked(t, r)
	client := faultClient(t)

	// Other clients: four of them, all along.
	stop := make(chan struct{})
	var sent, ok atomic.Int64
	var wg sync.WaitGroup
	for c := range 4 {
		wg.Go(func() {
			for i := 0; i < 10_000; i++ {
				select {
				case <-stop:
					return
				default:
				}
				sent.Add(1)
				if chatStream(client, api, fmt.Sprintf("client %d question %d", c, i)).ok() {
					ok.Add(1)
				}
			}
		})
	}
	waitFor(t, 10*time.Second, "other clients' first answers", func() bool { return ok.Load() >= 20 })
	type answer struct {
		status int
		body   string
	}
	var answers []answer
	for range 3 {
		body := fmt.Sprintf(`{"model":%q,"max_tokens":4,"messages":[{"role":"user","content":"tell me about the %s"}]}`, model, poison)
		resp, err := client.Post(api+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatalf("poisoned request: %v", err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		answers = append(answers, answer{resp.StatusCode, string(b)})
		// Some answers in between, as in production.
		before := ok.Load()
		waitFor(t, 10*time.Second, "other clients' answers", func() bool { return ok.Load() >= before+10 })
	}
	close(stop)
	wg.Wait()

	delivered := 0.0
	for _, u := range fleet.URLs() {
		delivered += sumMetric(metricsText(t, u), "kvroute_sim_faults_total", `fault="drop_on"`)
	}
	m := metricsText(t, admin)
	ejections := sumMetric(m, "kvroute_endpoint_ejections_total", "")
	out := 0
	for _, e := range ejectedNow(r) {
		if e {
			out++
		}
	}
	t.Logf("query of death: 3 requests delivered %v times; answers %v; other clients: %d of %d succeeded; %v ejections, %d endpoints out at the end",
		delivered, answers, ok.Load(), sent.Load(), ejections, out)
	if delivered != 6 {
		t.Errorf("3 poisoned requests were delivered %v times, want 6 (twice each)", delivered)
	}
	for i, a := range answers {
		var e struct {
			Error openai.Error `json:"error"`
		}
		if a.status < 500 || json.Unmarshal([]byte(a.body), &e) != nil || e.Error.Message == "" || strings.Contains(a.body, "127.0.0.1") {
			t.Errorf("poisoned request %d: %d %s, want a 5xx OpenAI error body without an engine's address", i, a.status, a.body)
		}
	}
	if ok.Load() != sent.Load() {
		t.Errorf("other clients: %d of %d succeeded, want all", ok.Load(), sent.Load())
	}
	if passive := r.Config().Health.PassiveFailures; ejections > float64(3/passive) {
		t.Errorf("%v ejections after 3 counted failures with passive_failures %d: want at most %d", ejections, passive, 3/passive)
	}
}

// TestStreamsClosedAfterDone: 400 complete streams through the router binary (built-in server)
// whose clients close the connection as soon as they read `data: [DONE]` (half of them with a
// reset) are all logged 200, none 499; then a stream the engine cuts is logged as a failure
// (502, error_type stream_cut) and the client gets an SSE error event.
func TestStreamsClosedAfterDone(t *testing.T) {
	bin := kvrouteBinary(t)
	fleet := startFaultFleet(t, 2)
	var y strings.Builder
	y.WriteString("policy: {name: least-request}\nhealth: {interval: 1h}\nserver: {shutdown_timeout: 5s}\nendpoints:\n")
	for _, u := range fleet.URLs() {
		fmt.Fprintf(&y, "  - {url: %q, models: [%s], engine: vllm}\n", u, model)
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "kvroute.yaml")
	if err := os.WriteFile(file, []byte(y.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	logFile, err := os.Create(filepath.Join(dir, "access.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	p := startProcessLogged(t, bin, nil, logFile, func(f []string) (string, bool) {
		if len(f) > 3 && f[2] == "api" {
			return strings.TrimPrefix(f[3], "http://"), true
		}
		return "", false
	}, "serve", "--config", file, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--log-format", "json")

	const n, clients = 400, 8
	var next, sawDone atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range clients {
		wg.Go(func() {
			for i := next.Add(1); i <= n; i = next.Add(1) {
				if err := closeAfterDone(p.addr, fmt.Sprintf("closer %d", i), i%2 == 0); err != nil {
					errs <- err
					continue
				}
				sawDone.Add(1)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	lines := waitLogged(t, logFile.Name(), n)
	statuses := map[int]int{}
	for _, l := range lines {
		statuses[l.Status]++
	}
	t.Logf("%d streams read to [DONE] and closed at once (half with a reset): access log statuses %v", sawDone.Load(), statuses)
	if statuses[499] != 0 || statuses[http.StatusOK] != n {
		t.Errorf("access log statuses %v, want all %d streams 200 and none 499", statuses, n)
	}

	// A stream the engine cuts.
	for _, in := range fleet.Instances() {
		if err := in.SetFaults(simserver.Faults{CutAfter: 2}); err != nil {
			t.Fatal(err)
		}
	}
	o := chatStream(faultClient(t), "http://"+p.addr, "cut me short")
	if o.done || !o.errEvent {
		t.Errorf("cut stream: %+v, want an SSE error event and no [DONE]", o)
	}
	last := waitLogged(t, logFile.Name(), n+1)[n]
	t.Logf("cut stream logged: status %d, error_type %q", last.Status, last.ErrorType)
	if last.Status != http.StatusBadGateway || last.ErrorType != "stream_cut" {
		t.Errorf("cut stream logged %+v, want status 502 and error_type stream_cut", last)
	}
}

// closeAfterDone sends a streamed chat request on a connection of its own, reads until
// `data: [DONE]`, and closes the connection at once (with a reset when reset is set).
func closeAfterDone(addr, content string, reset bool) error {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	if reset {
		_ = c.(*net.TCPConn).SetLinger(0)
	}
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	body := fmt.Sprintf(`{"model":%q,"stream":true,"max_tokens":4,"messages":[{"role":"user","content":%q}]}`, model, content)
	if _, err := fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: kvroute\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body); err != nil {
		return err
	}
	var got []byte
	buf := make([]byte, 4096)
	for len(got) < 1<<20 {
		n, err := c.Read(buf)
		got = append(got, buf[:n]...)
		if bytes.Contains(got, []byte("data: [DONE]")) {
			if !bytes.HasPrefix(got, []byte("HTTP/1.1 200 ")) {
				return fmt.Errorf("stream %q: %q", content, got)
			}
			return nil // and close at once
		}
		if err != nil {
			return fmt.Errorf("stream %q ended before [DONE]: %v: %q", content, err, got)
		}
	}
	return fmt.Errorf("stream %q: no [DONE] in 1 MiB", content)
}

// accessLine is the part of a JSON access-log line the tests read.
type accessLine struct {
	Msg       string `json:"msg"`
	Path      string `json:"path"`
	Status    int    `json:"status"`
	ErrorType string `json:"error_type"`
}

// waitLogged polls the JSON log file until it holds n access lines of the chat path (20 s at
// most) and returns them in order.
func waitLogged(t *testing.T, file string, n int) []accessLine {
	t.Helper()
	var lines []accessLine
	waitFor(t, 20*time.Second, fmt.Sprintf("%d access-log lines", n), func() bool {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		lines = lines[:0]
		sc := bufio.NewScanner(bytes.NewReader(b))
		sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
		for sc.Scan() {
			var l accessLine
			if json.Unmarshal(sc.Bytes(), &l) == nil && l.Msg == "request" && l.Path == "/v1/chat/completions" {
				lines = append(lines, l)
			}
		}
		return len(lines) >= n
	})
	return lines
}
