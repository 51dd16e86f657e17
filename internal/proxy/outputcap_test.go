package proxy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/metrics"
	"github.com/kvroute/kvroute/internal/tenant"
)

// capGate is a gate with tenant t1 (key sk-1): tokens_per_minute 10,000, max_output_tokens 500,
// on a clock that stands still.
func capGate(t *testing.T, m *metrics.TenantMetrics) *tenant.Gate {
	t.Helper()
	cfg, err := config.Parse([]byte("endpoints: [{url: \"http://127.0.0.1:1\"}]\nauth: {mode: api_key, secret_env: KVR_SECRET}\n" +
		"tenants: [{name: t1, api_keys: [\"" + tenant.HashKey("sk-1") + "\"], limits: {tokens_per_minute: 10000, max_output_tokens: 500}}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_700_000_000, 0)
	g, err := tenant.New(cfg, tenant.Options{Metrics: m, Logger: slog.New(slog.DiscardHandler),
		Now: func() time.Time { return now }, Getenv: func(string) string { return testSecret }})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// bodyEngine answers every request with a short completion and keeps the bodies it was sent.
type bodyEngine struct {
	srv    *httptest.Server
	mu     sync.Mutex
	bodies [][]byte
}

func newBodyEngine(t *testing.T) *bodyEngine {
	e := &bodyEngine{}
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		e.mu.Lock()
		e.bodies = append(e.bodies, b)
		e.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/v1/embeddings":
			_, _ = io.WriteString(w, `{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.1]}],"usage":{"prompt_tokens":2,"total_tokens":2}}`)
		case "/v1/responses":
			_, _ = io.WriteString(w, `{"id":"resp_1","object":"response","status":"completed","output":[],"usage":{"input_tokens":2,"output_tokens":3,"total_tokens":5}}`)
		default:
			_, _ = io.WriteString(w, `{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"x"},"finish_reason":"stop"}],"usage":{"prompt_tokens":2,"completion_tokens":3,"total_tokens":5}}`)
		}
	}))
	t.Cleanup(e.srv.Close)
	return e
}

// take returns the bodies sent since the last call.
func (e *bodyEngine) take() [][]byte {
	e.mu.Lock()
	defer e.mu.Unlock()
	b := e.bodies
	e.bodies = nil
	return b
}

// A tenant's max_output_tokens reaches the engine in every request that generates and sets no
// bound of its own (the client's other bytes kept, the field added before the closing brace or
// in place of a null), and a request that asks for more, or for less than 1, is refused with
// 400 naming the field, the value and the cap, and never forwarded. Before, the body went as
// it came: the engine generated what it would (vLLM: the rest of the context).
func TestOutputCap(t *testing.T) {
	e := newBodyEngine(t)
	f := newFixture(t, spec(e.srv.URL, "m"))
	f.h.Gate = capGate(t, f.h.Metrics.Tenant)
	const msgs = `"messages":[{"role":"user","content":"write a long story"}]`
	for _, tc := range []struct {
		name, path, body string
		// want are the members the engine must see (JSON values); a 400 is wanted where param
		// is set.
		want               map[string]string
		param, code, words string
	}{
		{name: "chat without max_tokens", path: "/v1/chat/completions", body: `{"model":"m",` + msgs + `}`,
			want: map[string]string{"max_tokens": "500"}},
		{name: "chat stream", path: "/v1/chat/completions", body: `{"model":"m","stream":true,` + msgs + `}`,
			want: map[string]string{"max_tokens": "500", "stream_options": `{"include_usage":true}`}},
		{name: "chat max_tokens null", path: "/v1/chat/completions", body: `{"model":"m","max_tokens":null,` + msgs + `}`,
			want: map[string]string{"max_tokens": "500"}},
		{name: "chat max_tokens under the cap", path: "/v1/chat/completions", body: `{"model":"m","max_tokens":300,` + msgs + `}`,
			want: map[string]string{"max_tokens": "300"}},
		{name: "chat max_completion_tokens alone: max_tokens too, for engines that read that one", path: "/v1/chat/completions",
			body: `{"model":"m","max_completion_tokens":300,` + msgs + `}`,
			want: map[string]string{"max_tokens": "300", "max_completion_tokens": "300"}},
		{name: "max_tokens twice, the last null (the engine reads the last)", path: "/v1/chat/completions",
			body: `{"model":"m","max_tokens":100,` + msgs + `,"max_tokens":null}`,
			want: map[string]string{"max_tokens": "100"}},
		{name: "completions", path: "/v1/completions", body: `{"model":"m","prompt":"once upon a time"}`,
			want: map[string]string{"max_tokens": "500"}},
		// No engine reads a completion's max_completion_tokens (vLLM's and SGLang's
		// CompletionRequest declare max_tokens only): it is left as it came, and max_tokens
		// bounds the answer. The QA's body, which kvroute sim before b24e302 answered with 60
		// tokens past a cap of 50.
		{name: "completions max_completion_tokens above the cap: read by none, max_tokens written", path: "/v1/completions",
			body: `{"model":"m","prompt":"hello","max_completion_tokens":4000}`,
			want: map[string]string{"max_tokens": "500", "max_completion_tokens": "4000"}},
		{name: "completions max_completion_tokens and max_tokens under the cap", path: "/v1/completions",
			body: `{"model":"m","prompt":"hello","max_completion_tokens":4000,"max_tokens":20}`,
			want: map[string]string{"max_tokens": "20", "max_completion_tokens": "4000"}},
		{name: "responses", path: "/v1/responses", body: `{"model":"m","input":"once upon a time"}`,
			want: map[string]string{"max_output_tokens": "500"}},
		{name: "embeddings: nothing generated, nothing written", path: "/v1/embeddings", body: `{"model":"m","input":"x"}`,
			want: map[string]string{"max_tokens": ""}},
		{name: "max_tokens above the cap", path: "/v1/chat/completions", body: `{"model":"m","max_tokens":501,` + msgs + `}`,
			param: "max_tokens", code: "integer_above_max_value", words: "max_tokens is 501, more than this API key may ask for: at most 500"},
		{name: "max_completion_tokens above the cap, max_tokens under", path: "/v1/chat/completions",
			body:  `{"model":"m","max_tokens":100,"max_completion_tokens":4000,` + msgs + `}`,
			param: "max_completion_tokens", code: "integer_above_max_value", words: "max_completion_tokens is 4000"},
		// Refused by the parser, for every tenant, before the cap is looked at.
		{name: "max_tokens -1 (llama.cpp, ollama: no bound)", path: "/v1/completions", body: `{"model":"m","max_tokens":-1,"prompt":"x"}`,
			param: "max_tokens", code: "integer_below_min_value", words: "max_tokens must be at least 1, got -1"},
		// Past the parser (it takes the last), but the cap holds each one an engine may read.
		{name: "max_tokens twice, the first -1", path: "/v1/completions", body: `{"model":"m","max_tokens":-1,"max_tokens":5,"prompt":"x"}`,
			param: "max_tokens", code: "integer_below_min_value", words: "max_tokens is -1: ask for 1 to 500"},
		{name: "max_output_tokens above the cap", path: "/v1/responses", body: `{"model":"m","max_output_tokens":9000,"input":"x"}`,
			param: "max_output_tokens", code: "integer_above_max_value", words: "max_output_tokens is 9000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, b := f.post(t, tc.path, tc.body, "Authorization", "Bearer sk-1")
			sent := e.take()
			if tc.param != "" {
				var eb struct {
					Error struct{ Type, Param, Code, Message string } `json:"error"`
				}
				_ = json.Unmarshal(b, &eb)
				if resp.StatusCode != http.StatusBadRequest || eb.Error.Type != "invalid_request_error" || eb.Error.Param != tc.param ||
					eb.Error.Code != tc.code || !strings.Contains(eb.Error.Message, tc.words) {
					t.Errorf("answer %d %s; want 400 invalid_request_error, param %s, code %s, saying %q", resp.StatusCode, b, tc.param, tc.code, tc.words)
				}
				if len(sent) != 0 {
					t.Errorf("the engine was sent %d request(s): %s", len(sent), sent)
				}
				return
			}
			if resp.StatusCode != http.StatusOK || len(sent) != 1 {
				t.Fatalf("answer %d %s, %d request(s) at the engine; want 200 and 1", resp.StatusCode, b, len(sent))
			}
			var got map[string]json.RawMessage
			if err := json.Unmarshal(sent[0], &got); err != nil {
				t.Fatalf("the engine got no JSON object: %v: %s", err, sent[0])
			}
			for k, v := range tc.want {
				if string(got[k]) != v {
					t.Errorf("the engine got %s %s; want %q (body %s)", k, got[k], v, sent[0])
				}
			}
			// The client's bytes up to its closing brace go as they came (the cache salt and
			// the bound are added after them, or the null replaced).
			if !strings.Contains(tc.body, "null") && !bytes.HasPrefix(sent[0], []byte(tc.body[:len(tc.body)-1])) {
				t.Errorf("the engine got %s; want the client's bytes %s first", sent[0], tc.body[:len(tc.body)-1])
			}
		})
	}
	m := f.h.Metrics.Tenant
	if got := testutil.ToFloat64(m.Rejections.WithLabelValues("t1", tenant.ReasonMaxOutputTokens)); got != 4 {
		t.Errorf("rejections for max_output_tokens: %v, want 4", got)
	}
	if got := testutil.ToFloat64(m.Requests.WithLabelValues("t1", "400")); got != 5 {
		t.Errorf("requests answered 400: %v, want 5 (each counted once: the 4 above and the parser's)", got)
	}
}

// A request without max_tokens reserves the cap for its completion, as one that asks for the
// cap does (x-ratelimit-remaining-tokens on a clock that stands still), and not a learnt
// length of at least 1024 (tenant.MinReservedCompletion), which it was before.
func TestOutputCapReserved(t *testing.T) {
	e := newBodyEngine(t)
	f := newFixture(t, spec(e.srv.URL, "m"))
	remaining := func(body string) int {
		t.Helper()
		f.h.Gate = capGate(t, f.h.Metrics.Tenant) // a full bucket
		resp, b := f.post(t, "/v1/chat/completions", body, "Authorization", "Bearer sk-1")
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d %s", resp.StatusCode, b)
		}
		n, err := strconv.Atoi(resp.Header.Get("x-ratelimit-remaining-tokens"))
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	const msgs = `"messages":[{"role":"user","content":"write a long story"}]`
	for n := 1; n <= 2; n++ {
		none := remaining(fmt.Sprintf(`{"model":"m","n":%d,%s}`, n, msgs))
		asked := remaining(fmt.Sprintf(`{"model":"m","n":%d,"max_tokens":500,%s}`, n, msgs))
		less := remaining(fmt.Sprintf(`{"model":"m","n":%d,"max_tokens":100,%s}`, n, msgs))
		if none != asked || less-asked != 400*n {
			t.Errorf("n %d: remaining %d without max_tokens, %d with 500, %d with 100; want the first two equal, the third %d more",
				n, none, asked, less, 400*n)
		}
	}
}

// The tenant's gauges count its requests in flight while they are, and read 0 once the load
// has ended.
func TestTenantInFlightGauge(t *testing.T) {
	const workers = 4
	arrived, release := make(chan struct{}, workers), make(chan struct{})
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		arrived <- struct{}{}
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"x"},"finish_reason":"stop"}],"usage":{"prompt_tokens":2,"completion_tokens":3,"total_tokens":5}}`)
	}))
	t.Cleanup(engine.Close)
	f := newFixture(t, spec(engine.URL, "m"))
	f.h.Gate = capGate(t, f.h.Metrics.Tenant)
	gauge := func(name string) float64 {
		t.Helper()
		v, ok := gathered(t, f, name)[`tenant="t1"`]
		if !ok {
			t.Fatalf("%s{tenant=\"t1\"} is not exported", name)
		}
		return v
	}
	var wg sync.WaitGroup
	statuses := make(chan int, workers)
	for range workers {
		wg.Go(func() {
			req, _ := http.NewRequest(http.MethodPost, f.srv.URL+"/v1/chat/completions",
				strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"x"}]}`))
			req.Header.Set("Authorization", "Bearer sk-1")
			resp, err := f.srv.Client().Do(req)
			if err != nil {
				statuses <- 0
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			statuses <- resp.StatusCode
		})
	}
	timeout := time.After(10 * time.Second)
	for range workers {
		select {
		case <-arrived:
		case <-timeout:
			close(release)
			wg.Wait()
			t.Fatal("the requests did not all reach the engine within 10 s")
		}
	}
	if got := gauge("kvroute_tenant_in_flight"); got != workers {
		t.Errorf("in flight while %d requests are at the engine: %v", workers, got)
	}
	close(release)
	wg.Wait()
	for range workers {
		f.wait(t)
		if s := <-statuses; s != http.StatusOK {
			t.Errorf("status %d, want 200", s)
		}
	}
	if got := gauge("kvroute_tenant_in_flight"); got != 0 {
		t.Errorf("in flight after the load ended: %v, want 0", got)
	}
	if got := gauge("kvroute_tenant_queued"); got != 0 {
		t.Errorf("queued after the load ended: %v, want 0", got)
	}
}

// gathered returns the series of the family name in the fixture's registry, by their labels
// written as `k="v",...`.
func gathered(t *testing.T, f *fixture, name string) map[string]float64 {
	t.Helper()
	mfs, err := f.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			out[strings.Join(labels, ",")] = m.GetGauge().GetValue()
		}
	}
	return out
}
