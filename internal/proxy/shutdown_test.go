package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/internal/h1"
)

// TestShutdownCut: a request still in flight when the router's drain runs out (Drain.Cut) is
// answered for the router, not taken for a client that left (499) nor for a failure of the
// engine: a stream ends with an SSE error event of code shutting_down, after the events it had,
// and its body ends properly; a request whose answer has not begun gets a 503 of that code; one
// that comes after the cut gets it at once. Each is logged and counted as a 503 with
// error_type service_unavailable_error and error_code shutting_down, and passive health
// checking hears nothing.
func TestShutdownCut(t *testing.T) {
	t.Run("stream", func(t *testing.T) {
		const n = 3
		eng := newOllamaLike(t, n, "hold")
		f := newFixture(t, spec(eng.srv.URL, "m"))
		hl := &healthLog{}
		withLifecycle(t, f, nil, hl)
		logs := jsonLogger(f)
		d := NewDrain()
		f.inner = d.Wrap(f.h)
		resp, _ := postStream(t, f, "/v1/chat/completions", streamBodies["/v1/chat/completions"])
		defer resp.Body.Close()
		rd := bufio.NewReader(resp.Body)
		for seen := 0; seen < n; {
			line, err := rd.ReadString('\n')
			if err != nil {
				t.Fatalf("after %d content events: %v", seen, err)
			}
			if strings.Contains(line, `" figur"`) {
				seen++
			}
		}
		if got := d.Cut(); got != 1 {
			t.Errorf("Cut = %d, want 1 request in flight", got)
		}
		rest, err := io.ReadAll(rd)
		if err != nil {
			t.Errorf("the stream's body broke after the cut: %v (got %q)", err, rest)
		}
		if !strings.HasPrefix(string(rest), "\nevent: error\ndata: ") || !strings.Contains(string(rest), `"code":"shutting_down"`) ||
			!strings.Contains(string(rest), `"type":"service_unavailable_error"`) {
			t.Errorf("after its events the stream ended with %q, want an SSE error event of code shutting_down", rest)
		}
		waitClosed(t, eng.gone, "the engine's request was not cancelled by the cut")
		f.wait(t)
		checkShutdownSettled(t, f, hl, eng.srv.URL, lastAccess(t, logs), n)
	})
	t.Run("no answer yet", func(t *testing.T) {
		arrived, gone := make(chan struct{}), make(chan struct{})
		eng := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			close(arrived)
			<-r.Context().Done() // no answer until the router gives up
			close(gone)
		}))
		defer eng.Close()
		f := newFixture(t, spec(eng.URL, "m"))
		hl := &healthLog{}
		withLifecycle(t, f, nil, hl)
		logs := jsonLogger(f)
		d := NewDrain()
		f.inner = d.Wrap(f.h)
		type answer struct {
			resp *http.Response
			body []byte
		}
		answered := make(chan answer, 1)
		go func() {
			resp, err := f.srv.Client().Post(f.srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(chatBody))
			if err != nil {
				answered <- answer{}
				return
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			answered <- answer{resp, b}
		}()
		waitClosed(t, arrived, "the engine did not get the request")
		d.Cut()
		var a answer
		select {
		case a = <-answered:
		case <-time.After(10 * time.Second):
			t.Fatal("no answer after the cut")
		}
		if a.resp == nil || a.resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(a.body), `"code":"shutting_down"`) {
			t.Fatalf("answer after the cut: %v %q, want 503 shutting_down", a.resp, a.body)
		}
		waitClosed(t, gone, "the engine's request was not cancelled by the cut")
		f.wait(t)
		checkShutdownSettled(t, f, hl, eng.URL, lastAccess(t, logs), 0)
	})
	t.Run("after the cut", func(t *testing.T) {
		e := newFakeEngine(t)
		f := newFixture(t, spec(e.srv.URL, "m"))
		d := NewDrain()
		f.inner = d.Wrap(f.h)
		d.Cut()
		resp, body := f.post(t, "/v1/chat/completions", chatBody)
		if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), `"code":"shutting_down"`) {
			t.Errorf("a request after the cut: %d %q, want 503 shutting_down", resp.StatusCode, body)
		}
	})
}

// drainServers are the servers `kvroute serve` may run the API on: h1.Server (builtin) and
// net/http's (http_server: net/http).
var drainServers = []string{"h1", "net/http"}

// serveDrained serves h, wrapped in d, on a loopback port with the server named (drainServers)
// built on d's BaseContext, as Serve builds it (net/http's in h1.NetHTTP, with
// CloseUnauthorized), until the test ends. It returns the base URL and the server's
// SetKeepAlivesEnabled, which Serve calls as the shutdown begins.
func serveDrained(t *testing.T, server string, d *Drain, h http.Handler) (string, func(bool)) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var srv interface {
		Serve(net.Listener) error
		Close() error
		SetKeepAlivesEnabled(bool)
	}
	if server == "net/http" {
		srv = &h1.NetHTTP{Server: &http.Server{Handler: d.Wrap(h), BaseContext: d.BaseContext}, CloseUnauthorized: true}
	} else {
		srv = &h1.Server{Handler: d.Wrap(h), BaseContext: d.BaseContext, CloseUnauthorized: true}
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	t.Cleanup(func() {
		srv.Close()
		select {
		case <-served:
		case <-time.After(10 * time.Second):
			t.Errorf("the %s server did not stop", server)
		}
	})
	return "http://" + ln.Addr().String(), srv.SetKeepAlivesEnabled
}

// TestDrainClosing: once the shutdown begins (the server's keep-alives off), every answer closes
// its connection, that of a request sent on a connection kept alive before included: the
// connection stays open for it rather than close under the client, which may be sending on it
// just then (a POST is not sent again). The requests in flight are counted until they end.
func TestDrainClosing(t *testing.T) {
	for _, server := range drainServers {
		t.Run(server, func(t *testing.T) {
			e := newFakeEngine(t)
			f := newFixture(t, spec(e.srv.URL, "m"))
			d := NewDrain()
			url, keepAlives := serveDrained(t, server, d, f.h)
			tr := &http.Transport{MaxConnsPerHost: 1}
			defer tr.CloseIdleConnections()
			client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
			post := func(what string) *http.Response {
				t.Helper()
				resp, err := client.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody))
				if err != nil {
					t.Fatalf("%s: %v", what, err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				return resp
			}
			if resp := post("before the shutdown"); resp.StatusCode != http.StatusOK || resp.Close {
				t.Errorf("before the shutdown: %d, connection close %v; want 200, kept alive", resp.StatusCode, resp.Close)
			}
			keepAlives(false)  // what Serve does as the shutdown begins
			for i := range 2 { // on the connection kept alive, then on a new one
				if resp := post("after the shutdown began"); resp.StatusCode != http.StatusOK || !resp.Close {
					t.Errorf("request %d after the shutdown began: %d, connection close %v; want 200 with Connection: close", i, resp.StatusCode, resp.Close)
				}
			}
			// The client may read the whole answer before the handler has returned: wait.
			for deadline := time.Now().Add(5 * time.Second); d.InFlight() != 0; {
				if time.Now().After(deadline) {
					t.Fatalf("InFlight = %d 5 s after every answer was read, want 0", d.InFlight())
				}
				time.Sleep(time.Millisecond)
			}
		})
	}
}

// TestDrainCutThroughBaseContext: under a server whose requests' contexts derive from the
// drain's BaseContext (h1.Server, net/http's, as Serve builds them), Cut ends a request in flight
// with ErrShuttingDown, answered 503 shutting_down, and one that comes after at once; Wrap
// gives them no context of their own.
func TestDrainCutThroughBaseContext(t *testing.T) {
	for _, server := range drainServers {
		t.Run(server, func(t *testing.T) {
			arrived, gone := make(chan struct{}), make(chan struct{})
			var once sync.Once
			eng := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				first := false
				once.Do(func() { first = true })
				if !first {
					http.Error(w, "only one request expected", http.StatusTeapot)
					return
				}
				close(arrived)
				<-r.Context().Done() // no answer until the router gives up
				close(gone)
			}))
			defer eng.Close()
			f := newFixture(t, spec(eng.URL, "m"))
			d := NewDrain()
			url, _ := serveDrained(t, server, d, f.h)
			client := &http.Client{Transport: &http.Transport{}, Timeout: 10 * time.Second}
			defer client.CloseIdleConnections()
			type answer struct {
				status int
				body   string
				err    error
			}
			post := func() answer {
				resp, err := client.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody))
				if err != nil {
					return answer{err: err}
				}
				defer resp.Body.Close()
				b, err := io.ReadAll(resp.Body)
				return answer{resp.StatusCode, string(b), err}
			}
			answered := make(chan answer, 1)
			go func() { answered <- post() }()
			waitClosed(t, arrived, "the engine did not get the request")
			if n := d.Cut(); n != 1 {
				t.Errorf("Cut = %d, want 1 request in flight", n)
			}
			var a answer
			select {
			case a = <-answered:
			case <-time.After(10 * time.Second):
				t.Fatal("no answer after the cut")
			}
			if a.err != nil || a.status != http.StatusServiceUnavailable || !strings.Contains(a.body, `"code":"shutting_down"`) {
				t.Errorf("the request in flight at the cut: %d %q, %v; want 503 shutting_down", a.status, a.body, a.err)
			}
			waitClosed(t, gone, "the engine's request was not cancelled by the cut")
			if a := post(); a.err != nil || a.status != http.StatusServiceUnavailable || !strings.Contains(a.body, `"code":"shutting_down"`) {
				t.Errorf("a request after the cut: %d %q, %v; want 503 shutting_down", a.status, a.body, a.err)
			}
		})
	}
}

// TestDrainWrapAllocs: a request whose context derives from the drain's BaseContext costs Wrap
// no allocation; under a server that does not build on it, Wrap makes the request a context
// of its own for Cut to end.
func TestDrainWrapAllocs(t *testing.T) {
	d := NewDrain()
	h := d.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	w := httptest.NewRecorder()
	based := httptest.NewRequestWithContext(d.BaseContext(nil), http.MethodGet, "/", nil)
	if n := testing.AllocsPerRun(100, func() { h.ServeHTTP(w, based) }); n != 0 {
		t.Errorf("a request on BaseContext: %v allocations in Wrap, want 0", n)
	}
	other := httptest.NewRequest(http.MethodGet, "/", nil)
	if n := testing.AllocsPerRun(100, func() { h.ServeHTTP(w, other) }); n == 0 {
		t.Error("a request on another context: no allocation: it has no context for Cut to end")
	}
}

// checkShutdownSettled checks how a request the shutdown cut on endpoint ep was settled: 503
// shutting_down in the access line l (with the completion tokens relayed) and in
// kvroute_requests_total, a failed result for the policy, nothing for passive health.
func checkShutdownSettled(t *testing.T, f *fixture, hl *healthLog, ep string, l map[string]any, completion float64) {
	t.Helper()
	if l["status"] != 503.0 || l["error_type"] != "service_unavailable_error" || l["error_code"] != "shutting_down" || l["completion_tokens"] != completion {
		t.Errorf("access line: status %v, error_type %v, error_code %v, completion_tokens %v; want 503, service_unavailable_error, shutting_down, %v",
			l["status"], l["error_type"], l["error_code"], l["completion_tokens"], completion)
	}
	if got := testutil.ToFloat64(f.h.Metrics.Requests.WithLabelValues("m", ep, "503")); got != 1 {
		t.Errorf("requests_total{status=503} = %v, want 1", got)
	}
	if got := testutil.ToFloat64(f.h.Metrics.Requests.WithLabelValues("m", ep, "499")); got != 0 {
		t.Errorf("requests_total{status=499} = %v, want 0", got)
	}
	if failed, ok := hl.told(); len(failed) != 0 || ok != 0 {
		t.Errorf("passive health told failures %v and %d successes, want nothing: the router cut the request", failed, ok)
	}
	if len(f.pk.done) != 1 || f.pk.done[0].OK {
		t.Errorf("policy told %+v, want one result, not OK", f.pk.done)
	}
}

// TestDrainClosingInFlight: a request in flight when the shutdown begins (the signal: Serve
// turns the server's keep-alives off), answered after, closes its connection too (Connection:
// close), streamed or not, on net/http's server and on h1.Server (kvroute serve's): its
// client's next request must not go to a connection that is about to close. The answer itself
// is whole.
func TestDrainClosingInFlight(t *testing.T) {
	for _, server := range drainServers {
		for _, stream := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/stream=%v", server, stream), func(t *testing.T) {
				arrived, release := make(chan struct{}), make(chan struct{})
				eng := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					_, _ = io.Copy(io.Discard, r.Body)
					close(arrived)
					select {
					case <-release:
					case <-r.Context().Done():
						return
					}
					if stream {
						w.Header().Set("Content-Type", "text/event-stream")
						_, _ = io.WriteString(w, `data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"hi"}}]}`+"\n\n")
						http.NewResponseController(w).Flush()
						_, _ = io.WriteString(w, "data: [DONE]\n\n")
						return
					}
					w.Header().Set("Content-Type", "application/json")
					_, _ = io.WriteString(w, `{"id":"c","choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}],"usage":{"prompt_tokens":3,"completion_tokens":1}}`)
				}))
				defer eng.Close()
				f := newFixture(t, spec(eng.URL, "m"))
				url, keepAlives := serveDrained(t, server, NewDrain(), f.h)
				client := &http.Client{Transport: &http.Transport{}, Timeout: 10 * time.Second}
				defer client.CloseIdleConnections()
				body := chatBody
				if stream {
					body = `{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}]}`
				}
				type answer struct {
					status int
					close  bool
					body   string
					err    error
				}
				answered := make(chan answer, 1)
				go func() {
					resp, err := client.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
					if err != nil {
						answered <- answer{err: err}
						return
					}
					b, err := io.ReadAll(resp.Body)
					resp.Body.Close()
					answered <- answer{resp.StatusCode, resp.Close, string(b), err}
				}()
				waitClosed(t, arrived, "the engine did not get the request")
				keepAlives(false)
				close(release)
				var a answer
				select {
				case a = <-answered:
				case <-time.After(10 * time.Second):
					t.Fatal("no answer")
				}
				want := `"content":"hi"`
				if stream {
					want = "data: [DONE]"
				}
				if a.err != nil || a.status != http.StatusOK || !strings.Contains(a.body, want) {
					t.Fatalf("answer %d %q, %v; want 200 with %s", a.status, a.body, a.err, want)
				}
				if !a.close {
					t.Error("the answer of a request in flight at Closing kept its connection (no Connection: close)")
				}
			})
		}
	}
}
