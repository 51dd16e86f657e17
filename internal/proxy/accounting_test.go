package proxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/route"
	"github.com/kvroute/kvroute/internal/tenant"
	"github.com/kvroute/kvroute/internal/testlog"
)

// manualClock is the lifecycle's clock in tests that say how much time passes.
type manualClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *manualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *manualClock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// healthLog is passive health checking that only records what it is told.
type healthLog struct {
	mu     sync.Mutex
	failed []route.Failure
	ok     int
}

func (h *healthLog) Failed(_ *endpoint.Endpoint, f route.Failure) bool {
	h.mu.Lock()
	h.failed = append(h.failed, f)
	h.mu.Unlock()
	return false
}
func (h *healthLog) Succeeded(*endpoint.Endpoint)                         { h.mu.Lock(); h.ok++; h.mu.Unlock() }
func (h *healthLog) Ejected(*endpoint.Endpoint, time.Time) bool           { return false }
func (h *healthLog) Backoff(*endpoint.Endpoint, time.Time, time.Duration) {}
func (h *healthLog) BackedOff(*endpoint.Endpoint, time.Time) bool         { return false }
func (h *healthLog) Forget(*endpoint.Endpoint)                            {}
func (h *healthLog) told() ([]route.Failure, int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]route.Failure(nil), h.failed...), h.ok
}

// withLifecycle gives the fixture's handler a lifecycle on clk (nil: the wall clock) whose
// passive health is hl (nil: the default).
func withLifecycle(t *testing.T, f *fixture, clk *manualClock, hl *healthLog) {
	t.Helper()
	cfg := route.Config{Picker: f.pk, Attempts: 3}
	if clk != nil {
		cfg.Clock = clk
	}
	if hl != nil {
		cfg.Health = hl
	}
	lc, err := route.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	f.h.Lifecycle = lc
}

// jsonLogger has the fixture log JSON lines into the returned buffer.
func jsonLogger(f *fixture) *testlog.Buffer {
	var logs testlog.Buffer
	f.h.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
	return &logs
}

// accessLines returns the access lines logged so far.
func accessLines(t *testing.T, logs *testlog.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range logs.JSONLines(t) {
		if l["msg"] == "request" {
			out = append(out, l)
		}
	}
	return out
}

// lastAccess returns the last access line logged.
func lastAccess(t *testing.T, logs *testlog.Buffer) map[string]any {
	t.Helper()
	lines := accessLines(t, logs)
	if len(lines) == 0 {
		t.Fatalf("no access line in %q", logs.String())
	}
	return lines[len(lines)-1]
}

// postAndLeave sends body to the fixture with headers hdr (name, value, ...), waits until
// the engine has it (arrived), hangs up, and waits until the engine saw the client go (gone)
// and the handler finished.
func postAndLeave(t *testing.T, f *fixture, body string, arrived, gone <-chan struct{}, hdr ...string) {
	t.Helper()
	postAndLeaveTo(t, f, "/v1/chat/completions", body, arrived, gone, hdr...)
}

// postAndLeaveTo is postAndLeave for the API path path.
func postAndLeaveTo(t *testing.T, f *fixture, path, body string, arrived, gone <-chan struct{}, hdr ...string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, f.srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	done := make(chan error, 1)
	go func() {
		resp, err := f.srv.Client().Do(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	select {
	case <-arrived:
	case <-time.After(10 * time.Second):
		t.Fatal("the engine did not get the request")
	}
	cancel()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("the client got an answer; it was to leave first")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the client did not give up")
	}
	waitClosed(t, gone, "the engine's request was not cancelled after the client left")
	f.wait(t)
}

// A non-streamed request whose client leaves before the answer is charged what its engine may
// have generated meanwhile: for each of its n choices, the time since it was routed times the
// endpoint's decode rate as learnt from its complete answers (default 20 tokens a second before
// any), at most max_tokens. Before, it was charged its prompt alone, however long it ran.
func TestChargeWholeAnswerNeverCame(t *testing.T) {
	const learnt = `{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"x"}}],"usage":{"prompt_tokens":5,"completion_tokens":300,"total_tokens":305}}`
	for _, tc := range []struct {
		name      string
		learn     bool // three answers first, 300 tokens in 3 s each: 100 tokens a second
		n, max    int
		wantExtra int // completion tokens charged for the request left
	}{
		{"rate learnt", true, 4, 1000, 4 * 5 * 100},
		{"capped by max_tokens", true, 4, 200, 4 * 200},
		{"nothing learnt yet", false, 2, 1000, 2 * 5 * tenant.DefaultDecodeRate},
		{"one choice, no max_tokens", true, 0, 0, 5 * 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := &manualClock{now: time.Unix(1_700_000_000, 0)}
			arrived, gone := make(chan struct{}, 1), make(chan struct{}, 1)
			engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				b, _ := io.ReadAll(r.Body)
				if bytes.Contains(b, []byte("learn")) {
					clk.advance(3 * time.Second)
					w.Header().Set("Content-Type", "application/json")
					io.WriteString(w, learnt)
					return
				}
				clk.advance(5 * time.Second) // generating, for 5 s, when the client leaves
				arrived <- struct{}{}
				<-r.Context().Done()
				gone <- struct{}{}
			}))
			t.Cleanup(engine.Close)
			f := newFixture(t, spec(engine.URL, "m"))
			withLifecycle(t, f, clk, nil)
			f.h.Gate = chargeGate(t, f.h.Metrics.Tenant)
			logs := jsonLogger(f)
			if tc.learn {
				for range tenant.MinDecodeSamples {
					resp, body := f.post(t, "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"learn"}]}`, "Authorization", "Bearer sk-1")
					if resp.StatusCode != http.StatusOK {
						t.Fatalf("status %d %s", resp.StatusCode, body)
					}
				}
			}
			_, completionBefore, spentBefore := charged(t, f.h.Gate, f.h.Metrics.Tenant)

			body := `{"model":"m","messages":[{"role":"user","content":"a long story"}]`
			if tc.n > 0 {
				body += fmt.Sprintf(`,"n":%d`, tc.n)
			}
			if tc.max > 0 {
				body += fmt.Sprintf(`,"max_tokens":%d`, tc.max)
			}
			postAndLeave(t, f, body+"}", arrived, gone, "Authorization", "Bearer sk-1")

			est := f.pk.reqs[len(f.pk.reqs)-1].PromptTokens
			_, completion, spent := charged(t, f.h.Gate, f.h.Metrics.Tenant)
			if got := completion - completionBefore; got != tc.wantExtra || spent-spentBefore != est+tc.wantExtra {
				t.Errorf("charged %d completion tokens, bucket spent %d; want %d and %d (the prompt's estimate %d beside)",
					got, spent-spentBefore, tc.wantExtra, est+tc.wantExtra, est)
			}
			line := lastAccess(t, logs)
			if line["status"] != float64(499) || line["charged_completion_tokens"] != float64(tc.wantExtra) {
				t.Errorf("access line status %v, charged_completion_tokens %v; want 499, %d", line["status"], line["charged_completion_tokens"], tc.wantExtra)
			}
		})
	}
}

// A request for more choices than OpenAI's API allows (128) is refused with a 400 naming n,
// before it reaches an engine or the tenant's limits; 128 is taken.
func TestMaxChoices(t *testing.T) {
	e := newFakeEngine(t)
	f := newFixture(t, spec(e.srv.URL, "m"))
	resp, body := f.post(t, "/v1/chat/completions", `{"model":"m","n":129,"messages":[{"role":"user","content":"x"}]}`)
	var v struct {
		Error struct {
			Param *string `json:"param"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &v); err != nil || resp.StatusCode != http.StatusBadRequest || v.Error.Param == nil || *v.Error.Param != "n" {
		t.Errorf("n 129: %d %s, want 400 with param n", resp.StatusCode, body)
	}
	if n := len(e.received()); n != 0 {
		t.Errorf("the engine got %d requests, want none", n)
	}
	if resp, body := f.post(t, "/v1/chat/completions", `{"model":"m","n":128,"messages":[{"role":"user","content":"x"}]}`); resp.StatusCode != http.StatusOK {
		t.Errorf("n 128: %d %s, want 200", resp.StatusCode, body)
	}
}

// With tenants, the id the engines get and the access line's request_id are the router's own,
// one per request, whatever x-request-id the clients send (two tenants sending the same one
// must not collide in the engine nor in the log); each client gets its own back, and the
// access line keeps it as client_request_id. Without tenants the client's id is the request's.
func TestRequestIDs(t *testing.T) {
	t.Run("tenants", func(t *testing.T) {
		e := newFakeEngine(t)
		f := newFixture(t, spec(e.srv.URL, "m"))
		f.h.Gate = tenantGate(t, f.h.Metrics.Tenant, `tenants: [{name: t1, api_keys: ["`+tenant.HashKey("sk-1")+`"]}, {name: t2, api_keys: ["`+tenant.HashKey("sk-2")+`"]}]`)
		logs := jsonLogger(f)
		var echoed []string
		for _, key := range []string{"sk-1", "sk-2"} {
			resp, body := f.post(t, "/v1/chat/completions", chatBody, "Authorization", "Bearer "+key, "X-Request-Id", "same-id")
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d %s", resp.StatusCode, body)
			}
			echoed = append(echoed, resp.Header.Get("X-Request-Id"))
		}
		resp, _ := f.post(t, "/v1/chat/completions", chatBody, "Authorization", "Bearer sk-1")
		echoed = append(echoed, resp.Header.Get("X-Request-Id"))

		e.mu.Lock()
		ids := append([]string(nil), e.ids...)
		e.mu.Unlock()
		lines := accessLines(t, logs)
		if len(ids) != 3 || len(lines) != 3 {
			t.Fatalf("engine ids %q, %d access lines; want 3 of each", ids, len(lines))
		}
		if ids[0] == "same-id" || ids[1] == "same-id" || ids[0] == ids[1] || ids[0] == "" || ids[1] == "" {
			t.Errorf("the engine got ids %q for two requests sent with x-request-id same-id; want two of the router's", ids[:2])
		}
		for i, l := range lines {
			if l["request_id"] != ids[i] {
				t.Errorf("access line %d: request_id %v, the engine got %q", i, l["request_id"], ids[i])
			}
		}
		if lines[0]["client_request_id"] != "same-id" || lines[1]["client_request_id"] != "same-id" || lines[2]["client_request_id"] != nil {
			t.Errorf("client_request_id %v, %v, %v; want same-id, same-id and none", lines[0]["client_request_id"], lines[1]["client_request_id"], lines[2]["client_request_id"])
		}
		if diff := cmp.Diff([]string{"same-id", "same-id", ids[2]}, echoed); diff != "" {
			t.Errorf("x-request-id given back (-want +got):\n%s", diff)
		}
	})
	t.Run("no tenants", func(t *testing.T) {
		e := newFakeEngine(t)
		f := newFixture(t, spec(e.srv.URL, "m"))
		logs := jsonLogger(f)
		resp, _ := f.post(t, "/v1/chat/completions", chatBody, "X-Request-Id", "mine")
		line := lastAccess(t, logs)
		e.mu.Lock()
		ids := append([]string(nil), e.ids...)
		e.mu.Unlock()
		if resp.Header.Get("X-Request-Id") != "mine" || len(ids) != 1 || ids[0] != "mine" || line["request_id"] != "mine" || line["client_request_id"] != nil {
			t.Errorf("given back %q, engine got %q, logged %v (client_request_id %v); want mine everywhere, no client_request_id",
				resp.Header.Get("X-Request-Id"), ids, line["request_id"], line["client_request_id"])
		}
	})
}

// Every access line names the client's address, and a refusal its error code: a 401 says
// invalid_api_key and where it came from.
func TestAccessLogRemoteAndCode(t *testing.T) {
	e := newFakeEngine(t)
	f := newFixture(t, spec(e.srv.URL, "m"))
	f.h.Gate = tenantGate(t, f.h.Metrics.Tenant, `tenants: [{name: t1, api_keys: ["`+tenant.HashKey("sk-1")+`"]}]`)
	logs := jsonLogger(f)
	resp, _ := f.post(t, "/v1/chat/completions", chatBody, "Authorization", "Bearer sk-wrong")
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("status %d, want 401", resp.StatusCode)
	}
	line := lastAccess(t, logs)
	remote, _ := line["remote_addr"].(string)
	if !strings.HasPrefix(remote, "127.0.0.1:") || line["error_code"] != "invalid_api_key" || line["error_type"] != openai.TypeInvalidRequest {
		t.Errorf("401 access line: remote_addr %v, error_code %v, error_type %v; want 127.0.0.1:port, invalid_api_key, %s",
			line["remote_addr"], line["error_code"], line["error_type"], openai.TypeInvalidRequest)
	}
	f.post(t, "/v1/chat/completions", chatBody, "Authorization", "Bearer sk-1")
	line = lastAccess(t, logs)
	if remote, _ := line["remote_addr"].(string); !strings.HasPrefix(remote, "127.0.0.1:") || line["error_code"] != nil {
		t.Errorf("200 access line: remote_addr %v, error_code %v; want 127.0.0.1:port and none", line["remote_addr"], line["error_code"])
	}
}

// A request body with a content coding is refused with 415 naming Content-Encoding (the router
// reads bodies as JSON), before it is read; identity is taken, and the engine never gets the
// header.
func TestContentEncodingRefused(t *testing.T) {
	var mu sync.Mutex
	var got []string // Content-Encoding of each request the engine got
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		mu.Lock()
		got = append(got, r.Header.Get("Content-Encoding"))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"c","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1}}`)
	}))
	t.Cleanup(engine.Close)
	f := newFixture(t, spec(engine.URL, "m"))
	gz := "\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03" // a gzip header: what the router would read
	resp, body := f.post(t, "/v1/chat/completions", gz, "Content-Encoding", "gzip")
	if resp.StatusCode != http.StatusUnsupportedMediaType || !strings.Contains(string(body), "Content-Encoding") ||
		!strings.Contains(string(body), "unsupported_content_encoding") || resp.Header.Get("Accept-Encoding") != "identity" {
		t.Errorf("gzip body: %d %s (Accept-Encoding %q); want 415 naming Content-Encoding, Accept-Encoding identity",
			resp.StatusCode, body, resp.Header.Get("Accept-Encoding"))
	}
	resp, body = f.post(t, "/v1/chat/completions", chatBody, "Content-Encoding", "identity")
	if resp.StatusCode != http.StatusOK {
		t.Errorf("identity: %d %s, want 200", resp.StatusCode, body)
	}
	mu.Lock()
	defer mu.Unlock()
	if diff := cmp.Diff([]string{""}, got); diff != "" {
		t.Errorf("Content-Encoding the engine got, per request (-want +got):\n%s", diff)
	}

	// /debug/explain reads a body as the API does.
	r := httptest.NewRequest(http.MethodPost, "/debug/explain", strings.NewReader(gz))
	r.Header.Set("Content-Encoding", "gzip")
	w := httptest.NewRecorder()
	f.h.ServeExplain(w, r)
	if w.Code != http.StatusUnsupportedMediaType {
		t.Errorf("explain, gzip body: %d %s, want 415", w.Code, w.Body.Bytes())
	}
	// So does the other front end (ext_proc), which hands the body over whole.
	out := http.Header{}
	x := f.h.NewExchange("", "ext_proc")
	oe := x.Prepare(context.Background(), openai.KindChat, []byte(gz), http.Header{"Content-Encoding": {"gzip"}}, out, PrepareOptions{})
	if oe == nil || oe.Status != http.StatusUnsupportedMediaType || out.Get("Accept-Encoding") != "identity" {
		t.Errorf("Exchange.Prepare, gzip body: %v (Accept-Encoding %q), want a 415 and identity", oe, out.Get("Accept-Encoding"))
	}
	x.Settle(http.StatusUnsupportedMediaType, http.MethodPost, "/v1/chat/completions")
}

// Where the engine gave no usage, the access line's completion_tokens counts the content events
// relayed (as the tenant's charge does), not 0: a stream cut after 3 of them, and one whose
// client left after 4.
func TestCompletionLoggedWithoutUsage(t *testing.T) {
	const event = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n"
	t.Run("cut", func(t *testing.T) {
		engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n")
			for range 3 {
				io.WriteString(w, event)
			}
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler) // the stream breaks before its usage and [DONE]
		}))
		t.Cleanup(engine.Close)
		f := newFixture(t, spec(engine.URL, "m"))
		logs := jsonLogger(f)
		resp, body := f.post(t, "/v1/chat/completions", `{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}]}`)
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "stream_cut") {
			t.Fatalf("%d %s, want the events and stream_cut", resp.StatusCode, body)
		}
		if line := lastAccess(t, logs); line["status"] != float64(502) || line["completion_tokens"] != float64(3) {
			t.Errorf("access line status %v, completion_tokens %v; want 502, 3", line["status"], line["completion_tokens"])
		}
	})
	t.Run("client left", func(t *testing.T) {
		arrived, gone := make(chan struct{}, 1), make(chan struct{}, 1)
		engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "text/event-stream")
			for range 4 {
				io.WriteString(w, event)
			}
			w.(http.Flusher).Flush()
			arrived <- struct{}{}
			<-r.Context().Done()
			gone <- struct{}{}
		}))
		t.Cleanup(engine.Close)
		f := newFixture(t, spec(engine.URL, "m"))
		logs := jsonLogger(f)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, f.srv.URL+"/v1/chat/completions",
			strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}]}`))
		resp, err := f.srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		rd := bufio.NewReader(resp.Body)
		for seen := 0; seen < 4; {
			line, err := rd.ReadString('\n')
			if err != nil {
				t.Fatalf("after %d events: %v", seen, err)
			}
			if strings.HasPrefix(line, "data: ") {
				seen++
			}
		}
		select {
		case <-arrived:
		case <-time.After(10 * time.Second):
			t.Fatal("the engine did not send its events")
		}
		cancel()
		resp.Body.Close()
		waitClosed(t, gone, "the engine's request was not cancelled after the client left")
		f.wait(t)
		if line := lastAccess(t, logs); line["status"] != float64(499) || line["completion_tokens"] != float64(4) {
			t.Errorf("access line status %v, completion_tokens %v; want 499, 4", line["status"], line["completion_tokens"])
		}
	})
}

// A non-streamed 200 whose body is not a JSON object (it does not start and end as one) is
// answered 502 upstream_bad_answer (the relay holds a whole answer before sending it), counted
// as a failure of the endpoint (server_error) and logged; it is not sent to another engine.
func TestBadJSONAnswer(t *testing.T) {
	for _, bad := range []string{`{"id":"x","choices":[{"message":{"content":"tru`, ``, `not json at all`, `<html><body>502 Bad Gateway</body></html>`} {
		engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, bad)
		}))
		other := newFakeEngine(t)
		f := newFixture(t, spec(engine.URL, "m"), spec(other.srv.URL, "m"))
		hl := &healthLog{}
		withLifecycle(t, f, nil, hl)
		logs := jsonLogger(f)
		resp, body := f.post(t, "/v1/chat/completions", chatBody)
		engine.Close()
		if resp.StatusCode != http.StatusBadGateway || !strings.Contains(string(body), codeBadAnswer) {
			t.Errorf("%q: %d %s, want 502 %s", bad, resp.StatusCode, body, codeBadAnswer)
		}
		if n := len(other.received()); n != 0 {
			t.Errorf("%q: sent to the other engine %d times, want none", bad, n)
		}
		if failed, ok := hl.told(); len(failed) != 1 || failed[0] != route.FailStatus || ok != 0 {
			t.Errorf("%q: health told failures %v and %d successes; want one server_error", bad, failed, ok)
		}
		line := lastAccess(t, logs)
		if line["status"] != float64(502) || line["error_code"] != codeBadAnswer || line["endpoint"] != engine.URL {
			t.Errorf("%q: access line status %v, error_code %v, endpoint %v; want 502, %s, %s", bad, line["status"], line["error_code"], line["endpoint"], codeBadAnswer, engine.URL)
		}
		if !strings.Contains(logs.String(), "not a JSON object") {
			t.Errorf("%q: no warning logged: %s", bad, logs.String())
		}
	}
}

// Through a front end that relays the answer itself (Exchange, ext_proc), a whole 200 that is
// no JSON was relayed already: the endpoint is still counted as failing and the line says so.
func TestExchangeBadAnswer(t *testing.T) {
	f := newFixture(t, spec("http://127.0.0.1:1", "m"))
	hl := &healthLog{}
	withLifecycle(t, f, nil, hl)
	logs := jsonLogger(f)
	x := f.h.NewExchange("", "ext_proc")
	if oe := x.Prepare(context.Background(), openai.KindChat, []byte(chatBody), http.Header{}, http.Header{}, PrepareOptions{}); oe != nil {
		t.Fatal(oe)
	}
	if ep := x.Call().Next(); ep == nil {
		t.Fatal("no endpoint")
	}
	x.Answered(http.StatusOK)
	x.Whole([]byte(`{"id":"x","choices":[{"message":{"content":"tru`))
	x.Settle(http.StatusOK, http.MethodPost, "/v1/chat/completions")
	if failed, ok := hl.told(); len(failed) != 1 || failed[0] != route.FailStatus || ok != 0 {
		t.Errorf("health told failures %v and %d successes; want one server_error", failed, ok)
	}
	if len(f.pk.done) != 1 || f.pk.done[0].OK {
		t.Errorf("policy told %+v, want one failed result", f.pk.done)
	}
	if line := lastAccess(t, logs); line["error_code"] != codeBadAnswer {
		t.Errorf("access line error_code %v, want %s", line["error_code"], codeBadAnswer)
	}
}

// A stream the engine labels text/plain or application/json is a stream still: passed on as it
// comes (the client has the first event before the engine sends the second), its first bytes
// taken for the first token (TTFT on the access line), its events read for usage.
func TestStreamUnderOtherContentType(t *testing.T) {
	for _, ct := range []string{"text/plain", "application/json"} {
		t.Run(ct, func(t *testing.T) {
			next := make(chan struct{})
			engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				w.Header().Set("Content-Type", ct)
				io.WriteString(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n")
				w.(http.Flusher).Flush()
				select {
				case <-next:
				case <-r.Context().Done():
					return
				}
				io.WriteString(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"b\"}}]}\n\n")
				io.WriteString(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":2}}\n\n")
				io.WriteString(w, "data: [DONE]\n\n")
			}))
			t.Cleanup(engine.Close)
			f := newFixture(t, spec(engine.URL, "m"))
			logs := jsonLogger(f)
			req, _ := http.NewRequest(http.MethodPost, f.srv.URL+"/v1/chat/completions",
				strings.NewReader(`{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"x"}]}`))
			resp, err := f.srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			first := make(chan string, 1)
			rd := bufio.NewReader(resp.Body)
			go func() { l, _ := rd.ReadString('\n'); first <- l }()
			select {
			case l := <-first:
				if !strings.Contains(l, `"content":"a"`) {
					t.Errorf("first line %q", l)
				}
			case <-time.After(10 * time.Second):
				close(next)
				t.Fatal("the first event was held back until the stream's end")
			}
			close(next)
			rest, _ := io.ReadAll(rd)
			if !strings.Contains(string(rest), "[DONE]") {
				t.Errorf("rest of the stream %q", rest)
			}
			f.wait(t)
			line := lastAccess(t, logs)
			if line["status"] != float64(200) || line["completion_tokens"] != float64(2) || line["prompt_tokens"] != float64(7) || line["ttft_ms"] == nil {
				t.Errorf("access line status %v, tokens %v/%v, ttft_ms %v; want 200, 7/2 and a TTFT",
					line["status"], line["prompt_tokens"], line["completion_tokens"], line["ttft_ms"])
			}
			if len(f.pk.ttfts) != 1 {
				t.Errorf("the policy was told %d first tokens, want 1", len(f.pk.ttfts))
			}
		})
	}
}

// A request whose client leaves while its attempt is at an engine is logged and counted on
// that endpoint, not under none.
func TestClientGoneNamesEndpoint(t *testing.T) {
	arrived, gone := make(chan struct{}, 1), make(chan struct{}, 1)
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		arrived <- struct{}{}
		<-r.Context().Done()
		gone <- struct{}{}
	}))
	t.Cleanup(engine.Close)
	f := newFixture(t, spec(engine.URL, "m"))
	logs := jsonLogger(f)
	postAndLeave(t, f, chatBody, arrived, gone)
	if line := lastAccess(t, logs); line["status"] != float64(499) || line["endpoint"] != engine.URL {
		t.Errorf("access line status %v, endpoint %v; want 499, %s", line["status"], line["endpoint"], engine.URL)
	}
	if n := testutil.ToFloat64(f.h.Metrics.Requests.WithLabelValues("m", engine.URL, "499")); n != 1 {
		t.Errorf("requests_total{endpoint=%s,status=499} = %v, want 1", engine.URL, n)
	}
}
