package proxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/h1"
	"github.com/kvroute/kvroute/internal/route"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/metrics"
	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/policy"
	"github.com/kvroute/kvroute/internal/prefix"
	"github.com/kvroute/kvroute/internal/tenant"
	"github.com/kvroute/kvroute/internal/testlog"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeEngine is an OpenAI-compatible engine on loopback that records what it receives.
type fakeEngine struct {
	srv      *httptest.Server
	mu       sync.Mutex
	bodies   [][]byte
	status   int           // answer with this status (0: 200)
	errBody  string        // body of a non-200 answer
	hang     chan struct{} // when set, streams send one chunk then wait for the client to go
	gone     chan struct{} // closed when a hung stream's request context ends
	held     chan struct{} // when set with hold, closed once a stream has sent its first chunk
	hold     chan struct{} // streams wait on it after their first chunk
	respID   string
	cachedTk int
	ids      []string // x-request-id of each request
}

func newFakeEngine(t *testing.T) *fakeEngine {
	f := &fakeEngine{cachedTk: 5}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeEngine) received() [][]byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([][]byte(nil), f.bodies...)
}

func (f *fakeEngine) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	f.bodies = append(f.bodies, body)
	f.ids = append(f.ids, r.Header.Get("X-Request-Id"))
	status, errBody, hang, gone, hold, held := f.status, f.errBody, f.hang, f.gone, f.hold, f.held
	f.mu.Unlock()
	if status != 0 && status != 200 {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, errBody)
		return
	}
	var req struct {
		Stream        bool `json:"stream"`
		StreamOptions struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
	}
	_ = json.Unmarshal(body, &req)
	usage := fmt.Sprintf(`{"prompt_tokens":10,"completion_tokens":2,"total_tokens":12,"prompt_tokens_details":{"cached_tokens":%d}}`, f.cachedTk)
	if r.URL.Path == "/v1/responses" {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":%q,"object":"response","output":[],"usage":{"input_tokens":10,"output_tokens":2}}`, f.respID)
		return
	}
	if !req.Stream {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}],"usage":%s}`, usage)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	fl := w.(http.Flusher)
	for i := range 2 {
		fmt.Fprintf(w, "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t%d\"}}]}\n\n", i)
		fl.Flush()
		if hold != nil && i == 0 {
			close(held)
			select {
			case <-hold:
			case <-r.Context().Done():
				return
			}
		}
		if hang != nil {
			close(hang)
			<-r.Context().Done()
			close(gone)
			return
		}
	}
	if req.StreamOptions.IncludeUsage {
		fmt.Fprintf(w, "data: {\"id\":\"c1\",\"choices\":[],\"usage\":%s}\n\n", usage)
	}
	io.WriteString(w, "data: [DONE]\n\n")
}

// orderPicker ranks candidates by the order of names and records what it observes.
type orderPicker struct {
	order []string
	mu    sync.Mutex
	log   []string
	done  []policy.Result
	reqs  []policy.Request // every request picked for
	ttfts []time.Duration  // FirstToken's, in order
}

func (p *orderPicker) Pick(req *policy.Request, c []*endpoint.Endpoint) ([]*endpoint.Endpoint, error) {
	p.mu.Lock()
	p.reqs = append(p.reqs, *req)
	p.mu.Unlock()
	var out []*endpoint.Endpoint
	for _, n := range p.order {
		for _, e := range c {
			if e.Name == n {
				out = append(out, e)
			}
		}
	}
	if len(out) == 0 {
		return nil, policy.ErrNoCandidate
	}
	return out, nil
}

func (p *orderPicker) record(s string) { p.mu.Lock(); p.log = append(p.log, s); p.mu.Unlock() }
func (p *orderPicker) Routed(_ *policy.Request, ep *endpoint.Endpoint) {
	p.record("routed " + ep.Name)
}
func (p *orderPicker) FirstToken(_ *policy.Request, ep *endpoint.Endpoint, ttft time.Duration) {
	p.mu.Lock()
	p.ttfts = append(p.ttfts, ttft)
	p.mu.Unlock()
	p.record("first " + ep.Name)
}
func (p *orderPicker) Done(_ *policy.Request, ep *endpoint.Endpoint, res policy.Result) {
	p.mu.Lock()
	p.done = append(p.done, res)
	p.mu.Unlock()
	p.record(fmt.Sprintf("done %s ok=%v", ep.Name, res.OK))
}
func (p *orderPicker) Removed(*endpoint.Endpoint) {}
func (p *orderPicker) events() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.log...)
}

type fixture struct {
	h     *Handler
	srv   *httptest.Server
	pk    *orderPicker
	reg   *prometheus.Registry
	pool  *endpoint.Pool
	names []string
	done  chan struct{} // one value per request the handler finished
	inner http.Handler  // what the server runs inside the completion signal
}

// newFixture puts a router in front of the given endpoint URLs, ranked in that order.
func newFixture(t *testing.T, specs ...endpoint.Spec) *fixture {
	t.Helper()
	pool := endpoint.NewPool()
	if _, err := pool.Update(specs); err != nil {
		t.Fatal(err)
	}
	names := make([]string, len(specs))
	for i, s := range specs {
		names[i] = s.Name
	}
	reg := prometheus.NewRegistry()
	pk := &orderPicker{order: names}
	tr := h1.New(DefaultTransport())
	h := &Handler{Pool: pool, Picker: pk, Metrics: metrics.New(reg), MaxRetries: 2,
		Logger: slog.New(slog.DiscardHandler), Transport: tr}
	f := &fixture{h: h, pk: pk, reg: reg, pool: pool, names: names, done: make(chan struct{}, 100), inner: h}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() { f.done <- struct{}{} }()
		f.inner.ServeHTTP(w, r)
	}))
	f.srv.Client().Timeout = 20 * time.Second // a router that hangs fails the test, not the run
	t.Cleanup(func() { f.srv.Close(); tr.CloseIdleConnections() })
	return f
}

func spec(url string, models ...string) endpoint.Spec {
	return endpoint.Spec{Name: url, Models: models, Engine: "vllm", CacheSalt: true}
}

func (f *fixture) post(t *testing.T, path, body string, hdr ...string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, f.srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := f.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	f.wait(t)
	return resp, b
}

// wait waits until the handler has finished one more request (its accounting runs after the
// last byte reaches the client).
func (f *fixture) wait(t *testing.T) {
	t.Helper()
	select {
	case <-f.done:
	case <-time.After(10 * time.Second):
		t.Fatal("handler did not finish the request")
	}
}

const chatBody = `{"model":"m","messages":[{"role":"user","content":"hello there"}],"vendor_field":{"keep":[1,"x"]}}`

func TestChatNonStreaming(t *testing.T) {
	e := newFakeEngine(t)
	f := newFixture(t, spec(e.srv.URL, "m"))
	resp, body := f.post(t, "/v1/chat/completions", chatBody, "X-Request-Id", "abc")
	if resp.StatusCode != 200 || !bytes.Contains(body, []byte(`"content":"hi"`)) {
		t.Fatalf("status %d body %s", resp.StatusCode, body)
	}
	if got := resp.Header.Get("X-Request-Id"); got != "abc" {
		t.Errorf("x-request-id = %q, want abc", got)
	}
	e.mu.Lock()
	if len(e.ids) != 1 || e.ids[0] != "abc" {
		t.Errorf("engine saw x-request-id %q, want abc", e.ids)
	}
	e.mu.Unlock()
	if got := e.received(); len(got) != 1 || string(got[0]) != chatBody {
		t.Errorf("engine received %q, want the client's bytes unchanged", got)
	}
	want := []string{"routed " + e.srv.URL, "done " + e.srv.URL + " ok=true"}
	if diff := cmp.Diff(want, f.pk.events()); diff != "" {
		t.Errorf("observer (-want +got):\n%s", diff)
	}
	// The engine counted 10 prompt tokens where the router estimated 6: the policy hears of
	// them in the router's units (cached 5 x 6/10 = 3), the ones it predicts in.
	est := f.pk.reqs[0].PromptTokens
	if scale := f.pool.ByName(e.srv.URL).TokenScale(); scale != 10/float64(est) {
		t.Errorf("token scale %v, want 10/%d", scale, est)
	}
	if r := f.pk.done[0]; r.PromptTokens != est || r.CachedTokens != int(math.Round(5*float64(est)/10)) || r.OutputTokens != 2 {
		t.Errorf("result = %+v, want prompt %d, cached 5 x %d/10, output 2", r, est, est)
	}
	if n := testutil.ToFloat64(f.h.Metrics.Requests.WithLabelValues("m", e.srv.URL, "200")); n != 1 {
		t.Errorf("requests_total = %v", n)
	}
	if n := testutil.ToFloat64(f.h.Metrics.EngineCached.WithLabelValues("m")); n != 5 {
		t.Errorf("engine cached = %v", n)
	}
	if ep := f.pool.ByName(e.srv.URL); ep.InFlight() != 0 || ep.PendingPrefill() != 0 {
		t.Errorf("in flight %d pending %d after the request", ep.InFlight(), ep.PendingPrefill())
	}
}

func readEvents(t *testing.T, body []byte) []string {
	t.Helper()
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(body))
	for sc.Scan() {
		if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			out = append(out, d)
		}
	}
	return out
}

func TestChatStreamingUsage(t *testing.T) {
	e := newFakeEngine(t)
	f := newFixture(t, spec(e.srv.URL, "m"))
	// The client did not ask for usage: the router asks the engine, reads it, drops the chunk.
	resp, body := f.post(t, "/v1/chat/completions", `{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}]}`)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("status %d type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	evs := readEvents(t, body)
	if len(evs) != 3 || evs[2] != "[DONE]" || strings.Contains(string(body), "usage") {
		t.Errorf("client got %q, want two chunks and [DONE] without usage", evs)
	}
	sent := e.received()[0]
	if !bytes.Contains(sent, []byte(`"stream_options":{"include_usage":true}`)) {
		t.Errorf("engine got %s, want include_usage injected", sent)
	}
	if r := f.pk.done[0]; r.CachedTokens <= 0 || r.CachedTokens > r.PromptTokens || r.TTFT <= 0 {
		t.Errorf("result %+v, want some cached tokens and a TTFT", r)
	}
	if got := f.pk.events(); len(got) != 3 || !strings.HasPrefix(got[1], "first ") {
		t.Errorf("observer events %q", got)
	}
	// The client asked for usage: it gets the chunk.
	_, body = f.post(t, "/v1/chat/completions", `{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"x"}]}`)
	if evs := readEvents(t, body); len(evs) != 4 || !strings.Contains(evs[2], `"usage"`) {
		t.Errorf("client got %q, want the usage chunk", evs)
	}
}

func TestErrorClasses(t *testing.T) {
	e := newFakeEngine(t)
	f := newFixture(t, spec(e.srv.URL, "m"))
	f.h.MaxBodyBytes = 1024
	tests := []struct {
		name, path, body string
		status           int
		code             string
	}{
		{"bad json", "/v1/chat/completions", `{"model":`, 400, ""},
		{"missing messages", "/v1/chat/completions", `{"model":"m"}`, 400, ""},
		{"unknown model", "/v1/chat/completions", `{"model":"nope","messages":[{"role":"user","content":"hi"}]}`, 404, "model_not_found"},
		{"unknown path", "/v1/nothing", `{}`, 404, "unknown_url"},
		{"too large", "/v1/completions", `{"model":"m","prompt":"` + strings.Repeat("x", 2000) + `"}`, 413, "request_too_large"},
	}
	for _, tt := range tests {
		resp, body := f.post(t, tt.path, tt.body)
		var v struct {
			Error struct {
				Message string  `json:"message"`
				Type    string  `json:"type"`
				Param   *string `json:"param"`
				Code    *string `json:"code"`
			} `json:"error"`
		}
		if err := json.Unmarshal(body, &v); err != nil || v.Error.Message == "" || v.Error.Type == "" {
			t.Errorf("%s: body %s is not an OpenAI error (%v)", tt.name, body, err)
		}
		code := ""
		if v.Error.Code != nil {
			code = *v.Error.Code
		}
		if resp.StatusCode != tt.status || code != tt.code {
			t.Errorf("%s: %d %q, want %d %q", tt.name, resp.StatusCode, code, tt.status, tt.code)
		}
	}
	if len(e.received()) != 0 {
		t.Errorf("engine received %d requests, want none", len(e.received()))
	}
}

func TestNoHealthyEndpoint(t *testing.T) {
	e := newFakeEngine(t)
	f := newFixture(t, spec(e.srv.URL, "m"))
	f.pool.ByName(e.srv.URL).SetHealthy(false)
	resp, _ := f.post(t, "/v1/chat/completions", chatBody)
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" {
		t.Errorf("status %d retry-after %q, want 503 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
}

// deadURL is a loopback address where nothing listens.
func deadURL(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return "http://" + addr
}

func TestFallbackOnConnectionErrorAndEjection(t *testing.T) {
	dead := deadURL(t)
	e := newFakeEngine(t)
	f := newFixture(t, spec(dead, "m"), spec(e.srv.URL, "m"))
	lc, err := route.New(route.Config{Picker: f.pk, Attempts: 3,
		Health: route.NewOutlier(route.OutlierConfig{Consecutive: 2, MaxEjectedPercent: 50}, nil)})
	if err != nil {
		t.Fatal(err)
	}
	f.h.Lifecycle = lc
	for i := range 2 {
		resp, body := f.post(t, "/v1/chat/completions", chatBody)
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: status %d body %s", i, resp.StatusCode, body)
		}
	}
	if !lc.Health().Ejected(f.pool.ByName(dead), time.Now()) {
		t.Error("dead endpoint not ejected after 2 connection errors")
	}
	if n := testutil.ToFloat64(f.h.Metrics.Retries.WithLabelValues(dead, "connect_error")); n != 2 {
		t.Errorf("retries = %v, want 2", n)
	}
	want := []string{"routed " + dead, "done " + dead + " ok=false", "routed " + e.srv.URL, "done " + e.srv.URL + " ok=true"}
	if diff := cmp.Diff(want, f.pk.events()[:4]); diff != "" {
		t.Errorf("observer (-want +got):\n%s", diff)
	}
	if ep := f.pool.ByName(dead); ep.InFlight() != 0 || ep.PendingPrefill() != 0 {
		t.Errorf("dead endpoint in flight %d pending %d", ep.InFlight(), ep.PendingPrefill())
	}
}

func TestRetryOn503AndUpstreamErrorShape(t *testing.T) {
	busy := newFakeEngine(t)
	busy.status, busy.errBody = 503, `{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}`
	bad := newFakeEngine(t)
	bad.status, bad.errBody = 400, `{"object":"error","message":"too long","type":"BadRequestError","param":null,"code":400}`
	f := newFixture(t, spec(busy.srv.URL, "m"), spec(bad.srv.URL, "m"))
	resp, body := f.post(t, "/v1/chat/completions", chatBody)
	want := `{"error":{"message":"too long","type":"BadRequestError","param":null,"code":"400"}}`
	if resp.StatusCode != 400 || string(body) != want {
		t.Errorf("got %d %s, want 400 %s", resp.StatusCode, body, want)
	}
	if len(busy.received()) != 1 || len(bad.received()) != 1 {
		t.Errorf("busy got %d, bad got %d requests; want 1 each", len(busy.received()), len(bad.received()))
	}
	// Only a 503 left: relayed in OpenAI shape.
	f2 := newFixture(t, spec(busy.srv.URL, "m"))
	resp, body = f2.post(t, "/v1/chat/completions", chatBody)
	if resp.StatusCode != 503 || !strings.Contains(string(body), `"message":"Loading model"`) {
		t.Errorf("got %d %s", resp.StatusCode, body)
	}
}

func TestCacheSaltAndTenancy(t *testing.T) {
	e := newFakeEngine(t)
	plain := newFakeEngine(t)
	s2 := spec(plain.srv.URL, "m")
	s2.CacheSalt = false
	f := newFixture(t, spec(e.srv.URL, "m"), s2)
	// Without tenancy the client's cache_salt passes through unchanged.
	body := `{"model":"m","cache_salt":"client","messages":[{"role":"user","content":"x"}]}`
	f.post(t, "/v1/chat/completions", body)
	if got := string(e.received()[0]); got != body {
		t.Errorf("engine got %s, want %s", got, body)
	}
	// With a tenant the tenant's salt overwrites it, the key is not forwarded, and the
	// tenant's tokens are settled from the engine's usage.
	reg := prometheus.NewRegistry()
	tm := metrics.New(reg).Tenant
	gate := tenantGate(t, tm, `tenants:
  - {name: t1, api_keys: ["`+tenant.HashKey("sk-1")+`"], models: [m]}
  - {name: t2, api_keys: ["`+tenant.HashKey("sk-2")+`"], models: [other]}
  - {name: t3, api_keys: ["`+tenant.HashKey("sk-3")+`"], endpoint_labels: {pool: gold}}
`)
	f.h.Gate = gate
	f.post(t, "/v1/chat/completions", body, "Authorization", "Bearer sk-1")
	sent := e.received()[1]
	if got, want := string(openai.Field(sent, "cache_salt")), strconv.Quote(tenant.Salt([]byte(testSecret), "t1")); got != want {
		t.Errorf("cache_salt sent = %s, want the tenant's %s", got, want)
	}
	if n := testutil.ToFloat64(tm.PromptTokens.WithLabelValues("t1")); n != 10 {
		t.Errorf("tenant prompt tokens = %v, want the engine's 10", n)
	}
	// A model outside the tenant's list is unknown to it; nothing was used.
	resp, _ := f.post(t, "/v1/chat/completions", body, "Authorization", "Bearer sk-2")
	if resp.StatusCode != 404 {
		t.Errorf("model outside the tenant's list: %d, want 404", resp.StatusCode)
	}
	// Endpoint labels restrict the candidates: none carries the label.
	resp, _ = f.post(t, "/v1/chat/completions", body, "Authorization", "Bearer sk-3")
	if resp.StatusCode != 404 {
		t.Errorf("no endpoint with the tenant's labels: %d, want 404", resp.StatusCode)
	}
	// No key: 401, the engine never sees it, and it is counted under its status.
	resp, _ = f.post(t, "/v1/chat/completions", body)
	if resp.StatusCode != 401 || resp.Header.Get("WWW-Authenticate") == "" {
		t.Errorf("no key: %d %q, want 401 with WWW-Authenticate", resp.StatusCode, resp.Header.Get("WWW-Authenticate"))
	}
	if n := testutil.ToFloat64(f.h.Metrics.Requests.WithLabelValues(metrics.UnknownModel, metrics.NoEndpoint, "401")); n != 1 {
		t.Errorf("requests_total{status=401} = %v, want 1", n)
	}
	if n := len(e.received()) + len(plain.received()); n != 2 {
		t.Errorf("engines received %d requests, want 2", n)
	}
}

const testSecret = "0123456789abcdef0123456789abcdef"

// tenantGate builds a tenant gate with authentication on and the given tenants section.
func tenantGate(t testing.TB, m *metrics.TenantMetrics, tenants string) *tenant.Gate {
	t.Helper()
	cfg, err := config.Parse([]byte("endpoints: [{url: \"http://127.0.0.1:1\"}]\nauth: {mode: api_key, secret_env: KVR_SECRET}\n" + tenants))
	if err != nil {
		t.Fatal(err)
	}
	g, err := tenant.New(cfg, tenant.Options{Metrics: m, Logger: slog.New(slog.DiscardHandler),
		Getenv: func(string) string { return testSecret }})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func TestClientAbortFreesUpstream(t *testing.T) {
	e := newFakeEngine(t)
	e.hang, e.gone = make(chan struct{}), make(chan struct{})
	f := newFixture(t, spec(e.srv.URL, "m"))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, f.srv.URL+"/v1/chat/completions",
		strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}]}`))
	resp, err := f.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	// Read the first event, then go away.
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("first line %q, %v", line, err)
	}
	cancel()
	resp.Body.Close()
	select {
	case <-e.gone:
	case <-time.After(10 * time.Second):
		t.Fatal("upstream request not cancelled after the client went away")
	}
	f.wait(t)
	ep := f.pool.ByName(e.srv.URL)
	if ep.InFlight() != 0 {
		t.Errorf("in flight %d after abort", ep.InFlight())
	}
}

func TestResponsesPinning(t *testing.T) {
	a, b := newFakeEngine(t), newFakeEngine(t)
	a.respID, b.respID = "resp_a", "resp_b"
	f := newFixture(t, spec(a.srv.URL, "m"), spec(b.srv.URL, "m"))
	// b created resp_b: put it first by making the picker prefer b once.
	f.pk.order = []string{b.srv.URL, a.srv.URL}
	resp, body := f.post(t, "/v1/responses", `{"model":"m","input":"hi"}`)
	if resp.StatusCode != 200 || !strings.Contains(string(body), "resp_b") {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	f.pk.order = []string{a.srv.URL, b.srv.URL}
	f.post(t, "/v1/responses", `{"model":"m","input":"more","previous_response_id":"resp_b"}`)
	if len(b.received()) != 2 || len(a.received()) != 0 {
		t.Errorf("a got %d, b got %d; want the follow-up pinned to b", len(a.received()), len(b.received()))
	}
}

func TestModels(t *testing.T) {
	e := newFakeEngine(t)
	f := newFixture(t, spec(e.srv.URL, "m2", "m1"))
	resp, err := f.srv.Client().Get(f.srv.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	defer f.wait(t)
	var v struct {
		Object string `json:"object"`
		Data   []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		t.Fatal(err)
	}
	if v.Object != "list" || len(v.Data) != 2 || v.Data[0].ID != "m1" || v.Data[1].ID != "m2" {
		t.Errorf("models = %+v", v)
	}
}

func TestRewriteNormalisedPrompt(t *testing.T) {
	e := newFakeEngine(t)
	f := newFixture(t, spec(e.srv.URL, "m"))
	f.h.Rewrite = true
	f.post(t, "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"  hello \r\n\r\n  world  "}]}`)
	if got := string(openai.Field(e.received()[0], "messages")); got != `[{"role":"user","content":"hello\nworld"}]` {
		t.Errorf("engine got messages %s", got)
	}
	if n := testutil.ToFloat64(f.h.Metrics.Rewrites); n != 1 {
		t.Errorf("rewrites = %v", n)
	}
}

func TestAllEndpointsUnreachable(t *testing.T) {
	a, b := deadURL(t), deadURL(t)
	f := newFixture(t, spec(a, "m"), spec(b, "m"))
	resp, body := f.post(t, "/v1/chat/completions", chatBody)
	var v struct {
		Error struct {
			Type string  `json:"type"`
			Code *string `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &v); err != nil || resp.StatusCode != 502 || v.Error.Code == nil || *v.Error.Code != "upstream_unreachable" {
		t.Errorf("got %d %s, want 502 upstream_unreachable", resp.StatusCode, body)
	}
	if n := testutil.ToFloat64(f.h.Metrics.Requests.WithLabelValues("m", metrics.NoEndpoint, "502")); n != 1 {
		t.Errorf("requests_total{endpoint=none,status=502} = %v", n)
	}
}

func TestEndpointHeader(t *testing.T) {
	down, up := newFakeEngine(t), newFakeEngine(t)
	down.status, down.errBody = http.StatusServiceUnavailable, "busy"
	f := newFixture(t, spec(down.srv.URL, "m"), spec(up.srv.URL, "m"))
	f.h.EndpointHeader = "X-Kvroute-Endpoint"

	// Non-streamed, after a retry: the header names the endpoint that answered.
	resp, body := f.post(t, "/v1/chat/completions", chatBody)
	if resp.StatusCode != 200 || resp.Header.Get("X-Kvroute-Endpoint") != up.srv.URL {
		t.Errorf("chat: %d, header %q, want %q (%s)", resp.StatusCode, resp.Header.Get("X-Kvroute-Endpoint"), up.srv.URL, body)
	}

	// Streamed: the header is there while the stream is still open (before its end).
	up.hold, up.held = make(chan struct{}), make(chan struct{})
	req, err := http.NewRequest(http.MethodPost, f.srv.URL+"/v1/chat/completions",
		strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	sresp, err := f.srv.Client().Do(req)
	if err != nil {
		close(up.hold)
		t.Fatal(err)
	}
	got := sresp.Header.Get("X-Kvroute-Endpoint")
	close(up.hold)
	_, _ = io.Copy(io.Discard, sresp.Body)
	sresp.Body.Close()
	f.wait(t)
	if got != up.srv.URL {
		t.Errorf("stream header = %q, want %q", got, up.srv.URL)
	}

	// Off by default: no header.
	f.h.EndpointHeader = ""
	if resp, _ := f.post(t, "/v1/chat/completions", chatBody); resp.Header.Get("X-Kvroute-Endpoint") != "" {
		t.Errorf("header set while off: %q", resp.Header.Get("X-Kvroute-Endpoint"))
	}
}

// TestCompletionPromptListBlocks: a completions prompt that is a list is routed on each
// prompt's own block chain (what the engine caches for it), not on the joined text.
func TestCompletionPromptListBlocks(t *testing.T) {
	e := newFakeEngine(t)
	f := newFixture(t, spec(e.srv.URL, "m"))
	p1, p2 := strings.Repeat("alpha beta gamma ", 20), strings.Repeat("delta epsilon ", 30)
	seed := prefix.Seed("m", "")
	for _, tc := range []struct {
		name, body string
		blocks     []uint64
		maxTokens  int
	}{
		{"one prompt", fmt.Sprintf(`{"model":"m","max_tokens":7,"prompt":%q}`, p1), prefix.Blocks(nil, seed, p1, 0), 7},
		{"a list of one", fmt.Sprintf(`{"model":"m","max_tokens":7,"prompt":[%q]}`, p1), prefix.Blocks(nil, seed, p1, 0), 7},
		{"a list of two", fmt.Sprintf(`{"model":"m","max_tokens":7,"prompt":[%q,%q]}`, p1, p2),
			prefix.Blocks(prefix.Blocks(nil, seed, p1, 0), seed, p2, 0), 14},
	} {
		f.pk.mu.Lock()
		f.pk.reqs = nil
		f.pk.mu.Unlock()
		if resp, body := f.post(t, "/v1/completions", tc.body); resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", tc.name, resp.StatusCode, body)
		}
		f.pk.mu.Lock()
		got := f.pk.reqs[0]
		f.pk.mu.Unlock()
		if len(tc.blocks) < 4 {
			t.Fatalf("%s: only %d blocks expected: make the prompts longer", tc.name, len(tc.blocks))
		}
		if diff := cmp.Diff(tc.blocks, got.Blocks); diff != "" || got.MaxTokens != tc.maxTokens {
			t.Errorf("%s: blocks (-want +got):\n%s\nmax tokens %d, want %d", tc.name, diff, got.MaxTokens, tc.maxTokens)
		}
	}
}

// TestCompleteStreamClientClosesAfterDone: a stream that reached [DONE] is complete whatever
// the client does next; the client that closes its connection right after [DONE] (Go clients
// do) races the router's last upstream read, and that must never turn it into a 499. The
// engine holds the terminating chunk back until the client has gone.
func TestCompleteStreamClientClosesAfterDone(t *testing.T) {
	release := make(chan struct{})
	eng := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n")
		fmt.Fprint(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1}}\n\n")
		fmt.Fprint(w, "data: [DONE]\n\n")
		w.(http.Flusher).Flush()
		select { // the terminating chunk comes only after the client went away
		case <-release:
		case <-time.After(5 * time.Second):
		}
	}))
	defer eng.Close()
	defer close(release)
	f := newFixture(t, spec(eng.URL, "m"))
	var logs testlog.Buffer
	f.h.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
	for i := range 3 {
		conn, err := net.Dial("tcp", f.srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		body := `{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}]}`
		fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		br := bufio.NewReader(conn)
		_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				t.Fatalf("request %d: no [DONE]: %v", i, err)
			}
			if strings.HasPrefix(line, "data: [DONE]") {
				break
			}
		}
		conn.Close() // gone right after [DONE], before the chunked body's end
		f.wait(t)
	}
	if n := testutil.ToFloat64(f.h.Metrics.Requests.WithLabelValues("m", eng.URL, "200")); n != 3 {
		t.Errorf("requests_total{status=200} = %v, want 3 (log:\n%s)", n, logs.String())
	}
	if strings.Contains(logs.String(), `"status":499`) {
		t.Errorf("a complete stream was logged as 499:\n%s", logs.String())
	}
}

// TestCutStream: a stream whose body breaks before [DONE] (the engine's connection closes
// inside its chunked body, or closes a body whose end is not marked) is a failure (502 in
// metrics and the log, the policy told), and the client gets an SSE error event before the
// stream closes. (A body that ends properly without [DONE] is TestStreamEndedWithoutTerminator.)
func TestCutStream(t *testing.T) {
	const event = "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n"
	for _, tc := range []struct {
		name  string
		serve http.HandlerFunc
	}{
		{"chunked body broken", func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, event)
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler) // the connection closes without the chunked body's end
		}},
		{"unmarked end", func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			conn, buf, err := http.NewResponseController(w).Hijack()
			if err != nil {
				return
			}
			defer conn.Close()
			// No Content-Length, no chunking: only the close ends the body, as a crash would.
			fmt.Fprint(buf, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"+event)
			_ = buf.Flush()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eng := httptest.NewServer(tc.serve)
			defer eng.Close()
			f := newFixture(t, spec(eng.URL, "m"))
			resp, body := f.post(t, "/v1/chat/completions", `{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}]}`)
			if resp.StatusCode != 200 || !strings.HasPrefix(string(body), event) || !strings.Contains(string(body), "event: error") || !strings.Contains(string(body), "stream_cut") {
				t.Errorf("client got %d %q, want the chunk then an SSE error event", resp.StatusCode, body)
			}
			if n := testutil.ToFloat64(f.h.Metrics.Requests.WithLabelValues("m", eng.URL, "502")); n != 1 {
				t.Errorf("requests_total{status=502} = %v, want 1", n)
			}
			if len(f.pk.done) != 1 || f.pk.done[0].OK {
				t.Errorf("policy told %+v, want one failed result", f.pk.done)
			}
		})
	}
}

// TestStreamEventTooLarge: an event over maxEvent is cut by the router, and the client is told
// so, not that the engine ended its stream.
func TestStreamEventTooLarge(t *testing.T) {
	const event = "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n"
	eng := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, event)
		w.(http.Flusher).Flush()
		_, _ = w.Write([]byte("data: " + strings.Repeat("x", maxEvent+1024) + "\n\n"))
	}))
	defer eng.Close()
	f := newFixture(t, spec(eng.URL, "m"))
	resp, body := f.post(t, "/v1/chat/completions", `{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}]}`)
	if resp.StatusCode != 200 || !strings.HasPrefix(string(body), event) || !strings.Contains(string(body), "larger than the router's 4 MiB limit") {
		t.Errorf("client got %d %.300q, want the chunk then an error event naming the limit", resp.StatusCode, body)
	}
}

// TestBodyAnnouncedTooLarge: a Content-Length beyond the limit is refused with 413 before any
// of the body is read, and the connection is closed.
func TestBodyAnnouncedTooLarge(t *testing.T) {
	e := newFakeEngine(t)
	f := newFixture(t, spec(e.srv.URL, "m"))
	f.h.MaxBodyBytes = 1 << 20
	conn, err := net.Dial("tcp", f.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	start := time.Now()
	fmt.Fprint(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 10000000000\r\n\r\n{\"model\":")
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 413 || !strings.Contains(string(b), "request_too_large") || time.Since(start) > 2*time.Second {
		t.Errorf("got %d %s after %v, want 413 request_too_large at once", resp.StatusCode, b, time.Since(start))
	}
	if !resp.Close {
		t.Error("connection kept open after a refused body")
	}
	f.wait(t)
}

// TestReadBodyGrowsWithData: memory follows the bytes received, not the length announced.
func TestReadBodyGrowsWithData(t *testing.T) {
	r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(`{"a":1}`))
	r.ContentLength = 16 << 20 // announced, never sent
	b, oe := readBody(r, 32<<20)
	if oe != nil || string(b) != `{"a":1}` || cap(b) > 2*bodyStart {
		t.Errorf("readBody = %q (cap %d), %v; want the 7 bytes in a buffer of at most %d", b, cap(b), oe, 2*bodyStart)
	}
	var sb strings.Builder
	for i := 0; sb.Len() < 300<<10; i++ {
		sb.WriteString(strconv.Itoa(i)) // no two chunks alike
	}
	big := sb.String()
	// Announced, and no longer than exactBody: one buffer of that length, no copy.
	r = httptest.NewRequest(http.MethodPost, "/", strings.NewReader(big))
	if b, oe := readBody(r, 1<<20); oe != nil || string(b) != big || cap(b) != len(big)+1 {
		t.Errorf("readBody of %d announced bytes: %d bytes (cap %d), equal %v, %v; want them all in a buffer of their size (+1)", len(big), len(b), cap(b), string(b) == big, oe)
	}
	r = httptest.NewRequest(http.MethodPost, "/", strings.NewReader(big))
	r.ContentLength = -1
	if b, oe := readBody(r, 1<<20); oe != nil || string(b) != big || cap(b) != len(b) {
		t.Errorf("readBody of %d unannounced bytes: %d bytes (cap %d), equal %v, %v; want them all, in a buffer of their size", len(big), len(b), cap(b), string(b) == big, oe)
	}
	// A body longer than it announced is read whole, past its first buffer.
	r = httptest.NewRequest(http.MethodPost, "/", strings.NewReader(big))
	r.ContentLength = 10
	if b, oe := readBody(r, 1<<20); oe != nil || string(b) != big {
		t.Errorf("readBody of %d bytes announced as 10: %d bytes, %v", len(big), len(b), oe)
	}
	r = httptest.NewRequest(http.MethodPost, "/", strings.NewReader(big))
	r.ContentLength = -1
	if _, oe := readBody(r, 100<<10); oe == nil || oe.Status != 413 {
		t.Errorf("readBody beyond the limit: %v, want 413", oe)
	}
}

// TestLlamaCppTimingsCached: an engine that reports its cache use only in llama.cpp's
// timings.cache_n (no prompt_tokens_details) is read all the same, streamed or not.
func TestLlamaCppTimingsCached(t *testing.T) {
	eng := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if bytes.Contains(body, []byte(`"stream":true`)) {
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n")
			fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}],\"timings\":{\"cache_n\":7,\"prompt_n\":3}}\n\n")
			fmt.Fprint(w, "data: [DONE]\n\n")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"choices":[{"message":{"content":"a"}}],"usage":{"prompt_tokens":10,"completion_tokens":1},"timings":{"cache_n":9,"prompt_n":1}}`)
	}))
	defer eng.Close()
	f := newFixture(t, spec(eng.URL, "m"))
	f.post(t, "/v1/chat/completions", chatBody)
	f.post(t, "/v1/chat/completions", `{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}]}`)
	if n := testutil.ToFloat64(f.h.Metrics.EngineCached.WithLabelValues("m")); n != 16 {
		t.Errorf("engine cached tokens = %v, want 9 + 7 from timings.cache_n", n)
	}
}

// TestRetryReasonsMatchFailures: the retry reasons made at 0 in the metrics are exactly the
// retryable failure classes of the lifecycle.
func TestRetryReasonsMatchFailures(t *testing.T) {
	var want []string
	for f := route.FailNone; f <= route.FailNotServed; f++ {
		if f.Retryable() || f.RetryableOnce() {
			want = append(want, f.String())
		}
	}
	if diff := cmp.Diff(want, metrics.RetryReasons); diff != "" {
		t.Errorf("retry reasons (-route +metrics):\n%s", diff)
	}
}

// TestCacheSaltSpliced: a tenant's request reaches an engine that honours cache_salt with the
// tenant's salt, whether the router splices it in as it sends the body (added, or in place of
// the client's own) or patches a copy: the bytes are Patch's in every case, the client's salt
// never survives, and an engine that does not honour the salt gets the body without it.
func TestCacheSaltSpliced(t *testing.T) {
	const msgs = `"messages":[{"role":"user","content":"x"}]`
	gate := func() *tenant.Gate {
		return tenantGate(t, metrics.New(prometheus.NewRegistry()).Tenant,
			`tenants: [{name: t1, api_keys: ["`+tenant.HashKey("sk-1")+`"]}]`)
	}
	salt := strconv.Quote(tenant.Salt([]byte(testSecret), "t1"))
	for _, body := range []string{
		`{"model":"m",` + msgs + `}`,
		`{"model":"m","stream":true,` + msgs + `}`,
		`{"model":"m","stream":true,"stream_options":{"include_usage":true},` + msgs + `}`,
		`{"model":"m","cache_salt":"client",` + msgs + `}`,
		`{"model":"m","stream":true, "cache_salt" : "client" ,` + msgs + "}\n",
		`{"model":"m","stream":true,"cache_salt":null,` + msgs + `}`,
		`{"model":"m","stream":true,"cache\u005fsalt":"client",` + msgs + `}`,
		`{"model":"m","cache_salt":"a","cache_salt":"b",` + msgs + `}`,
	} {
		e := newFakeEngine(t)
		f := newFixture(t, spec(e.srv.URL, "m"))
		f.h.Gate = gate()
		if resp, got := f.post(t, "/v1/chat/completions", body, "Authorization", "Bearer sk-1"); resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", body, resp.StatusCode, got)
		}
		want := []byte(body)
		if strings.Contains(body, `"stream":true`) && !strings.Contains(body, "stream_options") {
			var err error
			if want, err = openai.WithIncludeUsage(want); err != nil {
				t.Fatal(err)
			}
		}
		want, err := openai.Patch(want, openai.Set{Key: "cache_salt", Value: []byte(salt)})
		if err != nil {
			t.Fatal(err)
		}
		if got := e.received(); len(got) != 1 || string(got[0]) != string(want) {
			t.Errorf("%s: engine got %q, want %q", body, got, want)
		}
		if r, err := openai.Parse(openai.KindChat, e.received()[0]); err != nil || strconv.Quote(r.CacheSalt) != salt {
			t.Errorf("%s: the engine reads cache_salt %v (%v), want the tenant's", body, r, err)
		}

		plain := newFakeEngine(t)
		s := spec(plain.srv.URL, "m")
		s.CacheSalt = false
		f = newFixture(t, s)
		f.h.Gate = gate()
		f.post(t, "/v1/chat/completions", body, "Authorization", "Bearer sk-1")
		if got := plain.received(); len(got) != 1 || bytes.Contains(got[0], []byte(salt)) {
			t.Errorf("%s: an engine that does not honour cache_salt got %q", body, got)
		}
	}
}

// TestSaltedPartsRefusesUnpatchable: a body that neither the splice nor Patch can give the
// tenant's cache_salt gets no parts (the request is refused), never the body without the salt.
func TestSaltedPartsRefusesUnpatchable(t *testing.T) {
	c := &call{body: []byte(`[{"cache_salt":"mine"}]`), req: &openai.Request{}, id: &tenant.Identity{Salt: "s"}}
	if p := c.saltedParts(&Handler{}); p != nil {
		t.Fatalf("parts %q, want none", p)
	}
	c = &call{body: []byte(`{"model":"m"}`), req: &openai.Request{}, id: &tenant.Identity{Salt: "s"}}
	if got := string(bytes.Join(c.saltedParts(&Handler{}), nil)); got != `{"model":"m","cache_salt":"s"}` {
		t.Fatalf("salted body %s", got)
	}
}

// TestAccessLogMoved: a request whose first endpoint is not the policy's pick says why in its
// access line (moved_by): here the pick answered the request before 429, and is left alone for
// the second of rest it asked.
func TestAccessLogMoved(t *testing.T) {
	busy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Retry-After", "30")
		http.Error(w, `{"error":{"message":"busy"}}`, http.StatusTooManyRequests)
	}))
	defer busy.Close()
	ok := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"choices":[{"message":{"role":"assistant","content":"hi"}}],"usage":{"prompt_tokens":3,"completion_tokens":1}}`)
	}))
	defer ok.Close()
	f := newFixture(t, spec(busy.URL, "m"), spec(ok.URL, "m"))
	var logs testlog.Buffer
	f.h.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
	for i := range 2 {
		if resp, body := f.post(t, "/v1/chat/completions", chatBody); resp.StatusCode != 200 {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, body)
		}
	}
	var lines []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err == nil && m["msg"] == "request" {
			lines = append(lines, m)
		}
	}
	if len(lines) != 2 || lines[0]["moved_by"] != nil || lines[1]["moved_by"] != "backoff" || lines[1]["attempts"] != 1.0 {
		t.Errorf("access lines %v, want the first without moved_by (the pick, then the retry), the second moved_by backoff in one attempt", lines)
	}
	if n := testutil.ToFloat64(f.h.Metrics.Moved.WithLabelValues(ok.URL, "backoff")); n != 1 {
		t.Errorf("kvroute_requests_moved_total{endpoint=ok, reason=backoff} = %v, want 1", n)
	}

	// With the access log off (log.access: false: the logger refuses info), the line goes and
	// the count stays.
	off := newFixture(t, spec(busy.URL, "m"), spec(ok.URL, "m"))
	var offLogs testlog.Buffer
	off.h.Logger = slog.New(slog.NewJSONHandler(&offLogs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	for i := range 2 {
		if resp, body := off.post(t, "/v1/chat/completions", chatBody); resp.StatusCode != 200 {
			t.Fatalf("access log off, request %d: %d %s", i, resp.StatusCode, body)
		}
	}
	if n := testutil.ToFloat64(off.h.Metrics.Moved.WithLabelValues(ok.URL, "backoff")); n != 1 || offLogs.Count(`"msg":"request"`) != 0 {
		t.Errorf("access log off: kvroute_requests_moved_total{endpoint=ok, reason=backoff} = %v, want 1; log %q, want no access line", n, offLogs.String())
	}
}

// TestNotServedFailsOver: an engine that answers 404 naming the model (started with another
// model than the config says) is failed over, nothing charged against it, and left out for
// that model: the next request goes to the other at once. A 404 that names no model (a path the
// engine lacks) is failed over too, and the engine stays a candidate. With only 404s left, the
// client gets the last.
func TestNotServedFailsOver(t *testing.T) {
	wrong := newFakeEngine(t)
	wrong.status, wrong.errBody = 404, `{"object":"error","message":"The model `+"`m`"+` does not exist.","type":"NotFoundError","param":null,"code":404}`
	good := newFakeEngine(t)
	f := newFixture(t, spec(wrong.srv.URL, "m"), spec(good.srv.URL, "m"))
	var logs testlog.Buffer
	f.h.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
	for i := range 3 {
		resp, body := f.post(t, "/v1/chat/completions", chatBody)
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, body)
		}
	}
	if w, g := len(wrong.received()), len(good.received()); w > 1 || g != 3 {
		t.Errorf("the engine without the model got %d requests, the other %d; want at most 1 and 3", w, g)
	}
	if n := testutil.ToFloat64(f.h.Metrics.Retries.WithLabelValues(wrong.srv.URL, "not_served")); n != float64(len(wrong.received())) {
		t.Errorf("retries{not_served} = %v, want %d", n, len(wrong.received()))
	}
	if ep := f.h.Pool.ByName(wrong.srv.URL); ep.Serves("m") {
		t.Error("the engine without the model is still a candidate for it")
	}
	// Said once, naming the flag beside the config key (a quick start has no config file).
	if n := logs.Count(`the engine says it does not serve the model: requests for it go to the other endpoints; check endpoints[].models (--model)`); n != 1 {
		t.Errorf("the warning naming endpoints[].models (--model) was logged %d times, want 1:\n%s", n, logs.String())
	}

	// A 404 of a path: failed over, the engine kept.
	lacks := newFakeEngine(t)
	lacks.status, lacks.errBody = 404, `{"detail":"Not Found"}`
	f2 := newFixture(t, spec(lacks.srv.URL, "m"), spec(good.srv.URL, "m"))
	if resp, body := f2.post(t, "/v1/chat/completions", chatBody); resp.StatusCode != 200 {
		t.Errorf("after a path's 404: %d %s", resp.StatusCode, body)
	}
	if !f2.h.Pool.ByName(lacks.srv.URL).Serves("m") {
		t.Error("a path's 404 left the engine out for the model")
	}

	// Only 404s: the last goes to the client.
	f3 := newFixture(t, spec(lacks.srv.URL, "m"))
	if resp, body := f3.post(t, "/v1/chat/completions", chatBody); resp.StatusCode != 404 || !strings.Contains(string(body), "Not Found") {
		t.Errorf("only a 404 left: %d %s, want the engine's 404", resp.StatusCode, body)
	}
}

// TestNoCandidateSaysWhy: when no endpoint can take a request, the answer says what is known.
// An endpoint that names the model and is down: 503, retry. Only endpoints whose engines said
// they do not serve it: 404, saying so. Down endpoints whose models are unknown (they may serve
// any): 503, but saying that no endpoint is known to serve the model, for a name with a typo.
func TestNoCandidateSaysWhy(t *testing.T) {
	e1, e2, e3 := newFakeEngine(t), newFakeEngine(t), newFakeEngine(t)
	now := time.Now()
	tests := []struct {
		name   string
		specs  []endpoint.Spec
		setup  func(p *endpoint.Pool)
		model  string
		status int
		code   string
		want   []string // in the message
	}{
		{"the engine said it does not serve it",
			[]endpoint.Spec{spec(e1.srv.URL, "m")},
			func(p *endpoint.Pool) { p.ByName(e1.srv.URL).NotServing("m", now, time.Minute) },
			"m", 404, "model_not_found", []string{`the model "m" is not served here`, "the engines of the 1 endpoint that would serve it answered that they do not", "check endpoints[].models (--model) against the names"}},
		{"one said so, another naming it is down",
			[]endpoint.Spec{spec(e1.srv.URL, "m"), spec(e2.srv.URL, "m")},
			func(p *endpoint.Pool) {
				p.ByName(e1.srv.URL).NotServing("m", now, time.Minute)
				p.ByName(e2.srv.URL).SetHealthy(false)
			},
			"m", 503, "no_healthy_endpoint", []string{`no healthy endpoint serves model "m": 1 endpoint serves it, none available now (1 failing its health check); retry shortly`, "/debug/endpoints"}},
		{"three down, one draining",
			[]endpoint.Spec{spec(e1.srv.URL, "m"), spec(e2.srv.URL, "m"), spec(e3.srv.URL, "m"), spec(deadURL(t), "m")},
			func(p *endpoint.Pool) {
				for i, e := range p.All() {
					if i == 0 {
						e.SetDraining(true)
					} else {
						e.SetHealthy(false)
					}
				}
			},
			"m", 503, "no_healthy_endpoint", []string{`no healthy endpoint serves model "m": 4 endpoints serve it, none available now (3 failing their health checks, 1 draining (being removed)); retry shortly`}},
		{"a typo while an endpoint of unknown models is down",
			[]endpoint.Spec{spec(e1.srv.URL, "m"), spec(e2.srv.URL)},
			func(p *endpoint.Pool) { p.ByName(e2.srv.URL).SetHealthy(false) },
			"mm", 503, "no_healthy_endpoint", []string{`no endpoint is known to serve model "mm"; 1 endpoint whose models are unknown (no endpoints[].models (--model), and not yet listed by the engine)`, "is unavailable", "check the model's name"}},
		{"and another's engine said it does not serve it",
			[]endpoint.Spec{spec(e1.srv.URL, "m"), spec(e2.srv.URL), spec(e3.srv.URL), spec(deadURL(t))},
			func(p *endpoint.Pool) {
				for _, e := range p.All()[1:] {
					e.SetHealthy(false)
				}
				p.ByName(e1.srv.URL).NotServing("mm", now, time.Minute)
			},
			"mm", 503, "no_healthy_endpoint", []string{`3 endpoints whose models are unknown`, "are unavailable", "the engines of 1 endpoint answered that they do not serve it"}},
		{"none serves it",
			[]endpoint.Spec{spec(e1.srv.URL, "m")}, func(*endpoint.Pool) {},
			"mm", 404, "model_not_found", []string{`the model "mm" does not exist or is not served here`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, tt.specs...)
			tt.setup(f.pool)
			resp, body := f.post(t, "/v1/chat/completions", `{"model":"`+tt.model+`","messages":[{"role":"user","content":"x"}]}`)
			if resp.StatusCode != tt.status || errorCode(body) != tt.code {
				t.Fatalf("%d %s, want %d %s", resp.StatusCode, body, tt.status, tt.code)
			}
			if got := resp.Header.Get("Retry-After") != ""; got != (tt.status == 503) {
				t.Errorf("Retry-After set %v on a %d", got, tt.status)
			}
			var v struct {
				Error struct{ Message string } `json:"error"`
			}
			if err := json.Unmarshal(body, &v); err != nil {
				t.Fatal(err)
			}
			for _, w := range tt.want {
				if !strings.Contains(v.Error.Message, w) {
					t.Errorf("message %q does not say %q", v.Error.Message, w)
				}
			}
		})
	}
	for _, e := range []*fakeEngine{e1, e2, e3} {
		if n := len(e.received()); n != 0 {
			t.Errorf("an engine received %d requests, want none", n)
		}
	}
}

// TestEnginePathNotFound: an engine's 404 that is no JSON error and does not name the model (an
// engine without the API path: Go's "404 page not found\n", FastAPI's {"detail":"Not Found"})
// reaches the client as what it is, the path the engines lack, with their text trimmed. An
// engine's own JSON error is relayed as it says it.
func TestEnginePathNotFound(t *testing.T) {
	plain, fastapi, own := newFakeEngine(t), newFakeEngine(t), newFakeEngine(t)
	plain.status, plain.errBody = 404, "404 page not found\n"
	fastapi.status, fastapi.errBody = 404, `{"detail":"Not Found"}`
	own.status, own.errBody = 404, `{"error":{"message":"no such thing","type":"not_found_error","code":"nope"}}`
	const embed = `{"model":"m","input":"hello"}`
	tests := []struct {
		name      string
		engines   []*fakeEngine
		path      string
		body      string
		code, msg string
	}{
		{"plain text", []*fakeEngine{plain}, "/v1/embeddings", embed,
			"unknown_url", `the engine does not serve POST /v1/embeddings: it answered 404 "404 page not found"`},
		{"FastAPI's", []*fakeEngine{fastapi}, "/v1/responses", `{"model":"m","input":"hello"}`,
			"unknown_url", `the engine does not serve POST /v1/responses: it answered 404 "{\"detail\":\"Not Found\"}"`},
		{"two engines", []*fakeEngine{plain, fastapi}, "/v1/embeddings", embed,
			"unknown_url", `the engines of the 2 endpoints tried do not serve POST /v1/embeddings: the last answered 404 "{\"detail\":\"Not Found\"}"`},
		{"the engine's own error", []*fakeEngine{own}, "/v1/embeddings", embed, "nope", "no such thing"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var specs []endpoint.Spec
			for _, e := range tt.engines {
				specs = append(specs, spec(e.srv.URL, "m"))
			}
			f := newFixture(t, specs...)
			resp, body := f.post(t, tt.path, tt.body)
			var v struct {
				Error struct {
					Message string `json:"message"`
					Type    string `json:"type"`
				} `json:"error"`
			}
			if err := json.Unmarshal(body, &v); err != nil {
				t.Fatalf("%s: %v", body, err)
			}
			if resp.StatusCode != 404 || errorCode(body) != tt.code || v.Error.Message != tt.msg || v.Error.Type != openai.TypeNotFound {
				t.Errorf("%d %s, want 404 %s %q", resp.StatusCode, body, tt.code, tt.msg)
			}
		})
	}
}

// TestModelLabelAsConfigured: a request naming a configured model with or without ":latest"
// (ollama's spelling) is counted under the config's spelling, whose series the router deletes
// when the model leaves the config; the other spelling would stay for good.
func TestModelLabelAsConfigured(t *testing.T) {
	eng := newFakeEngine(t)
	f := newFixture(t, spec(eng.srv.URL, "tiny"))
	if resp, body := f.post(t, "/v1/chat/completions", `{"model":"tiny:latest","messages":[{"role":"user","content":"x"}]}`); resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	if n := testutil.ToFloat64(f.h.Metrics.Requests.WithLabelValues("tiny", eng.srv.URL, "200")); n != 1 {
		t.Errorf("requests_total{model=tiny} = %v, want 1", n)
	}
	mfs, err := f.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "model" && l.GetValue() == "tiny:latest" {
					t.Errorf("%s has a series of model %q", mf.GetName(), l.GetValue())
				}
			}
		}
	}
}
