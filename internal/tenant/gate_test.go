package tenant

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
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

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/openai"
)

const testSecret = "0123456789abcdef0123456789abcdef"

// fakeClock is a settable clock.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func testConfig(t testing.TB, tenants string) *config.Config {
	t.Helper()
	y := "endpoints: [{url: \"http://127.0.0.1:1\", models: [m], labels: {pool: gold}}]\n" +
		"auth: {mode: api_key, secret_env: KVR_SECRET}\n" + tenants
	cfg, err := config.Parse([]byte(y))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func newTestGate(t testing.TB, tenants string, logger *slog.Logger) (*Gate, *fakeClock) {
	t.Helper()
	clk := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	g, err := New(testConfig(t, tenants), Options{Now: clk.Now, Logger: logger,
		Getenv: func(k string) string {
			if k == "KVR_SECRET" {
				return testSecret
			}
			return ""
		}})
	if err != nil {
		t.Fatal(err)
	}
	return g, clk
}

// echo records the identity it was given and answers 200, reporting the usage queued in
// usage (one pair per request, prompt and completion tokens) if any.
type echo struct {
	mu     sync.Mutex
	ids    []*Identity
	usage  [][2]int
	leaked bool // a key header reached the handler
}

func (e *echo) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body) // the handler still gets the whole body
	e.mu.Lock()
	if r.Header.Get("Authorization") != "" || r.Header.Get("Api-Key") != "" {
		e.leaked = true
	}
	e.ids = append(e.ids, FromContext(r.Context()))
	if len(e.usage) > 0 {
		used(w, e.usage[0][0], e.usage[0][1])
		e.usage = e.usage[1:]
	}
	e.mu.Unlock()
	_, _ = w.Write([]byte("{}"))
}

func do(h http.Handler, hdr map[string]string, body string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body))
	for k, v := range hdr {
		r.Header.Set(k, v)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func chat(text string) string {
	b, _ := json.Marshal(map[string]any{"model": "m", "messages": []map[string]string{{"role": "user", "content": text}}})
	return string(b)
}

type errBody struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Code    *string `json:"code"`
		Param   *string `json:"param"`
	} `json:"error"`
}

func decodeErr(t *testing.T, w *httptest.ResponseRecorder) errBody {
	t.Helper()
	var e errBody
	if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil || e.Error.Message == "" {
		t.Fatalf("not an OpenAI error body: %q (%v)", w.Body.String(), err)
	}
	return e
}

func TestAuthentication(t *testing.T) {
	g, _ := newTestGate(t, `tenants:
  - {name: acme, api_keys: ["`+HashKey("sk-acme")+`"], priority: 2, models: [m], endpoint_labels: {pool: gold}}
  - {name: beta, api_keys: ["`+HashKey("sk-beta")+`", "`+HashKey("sk-beta2")+`"]}
`, nil)
	e := &echo{}
	h := middleware(g, e)
	for _, tc := range []struct {
		name string
		hdr  map[string]string
		code string
	}{
		{"no key", nil, "missing_api_key"},
		{"wrong key", map[string]string{"Authorization": "Bearer sk-nope"}, "invalid_api_key"},
		{"a digest is not a key", map[string]string{"Authorization": "Bearer " + HashKey("sk-acme")}, "invalid_api_key"},
	} {
		w := do(h, tc.hdr, chat("hi"))
		if w.Code != http.StatusUnauthorized {
			t.Errorf("%s: status %d, want 401", tc.name, w.Code)
			continue
		}
		eb := decodeErr(t, w)
		if eb.Error.Code == nil || *eb.Error.Code != tc.code || eb.Error.Type != "invalid_request_error" {
			t.Errorf("%s: error %+v, want code %s", tc.name, eb.Error, tc.code)
		}
	}
	if len(e.ids) != 0 {
		t.Fatalf("the handler was reached %d times without a valid key", len(e.ids))
	}
	for _, hdr := range []map[string]string{
		{"Authorization": "Bearer sk-acme"}, {"api-key": "sk-beta"}, {"Authorization": "bearer sk-beta2"},
	} {
		if w := do(h, hdr, chat("hi")); w.Code != http.StatusOK {
			t.Errorf("%v: status %d, want 200", hdr, w.Code)
		}
	}
	if len(e.ids) != 3 || e.leaked {
		t.Fatalf("handler reached %d times (want 3), key header passed on: %v", len(e.ids), e.leaked)
	}
	acme, beta := e.ids[0], e.ids[1]
	got := []any{acme.Name, acme.Salt, acme.Priority, acme.Models, acme.EndpointLabels, beta.Name, beta.Salt}
	want := []any{"acme", Salt([]byte(testSecret), "acme"), 2, []string{"m"}, map[string]string{"pool": "gold"},
		"beta", Salt([]byte(testSecret), "beta")}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("identities (-want +got):\n%s", diff)
	}
	if e.ids[2].Name != "beta" {
		t.Errorf("second key of beta authenticated as %q", e.ids[2].Name)
	}
}

func TestAuthOff(t *testing.T) {
	cfg, err := config.Parse([]byte("endpoints: [{url: \"http://127.0.0.1:1\"}]\nauth: {mode: none}\n"))
	if err != nil {
		t.Fatal(err)
	}
	g, err := New(cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	e := &echo{}
	if w := do(middleware(g, e), nil, chat("hi")); w.Code != http.StatusOK || len(e.ids) != 1 || e.ids[0] != nil {
		t.Errorf("auth off: status %d, identities %v; want 200 and no identity", w.Code, e.ids)
	}
	if g.Tenants() {
		t.Error("Tenants() with auth off, want false")
	}
	on, _ := newTestGate(t, `tenants: [{name: a, api_keys: ["`+HashKey("k")+`"]}]`+"\n", nil)
	if !on.Tenants() {
		t.Error("Tenants() with tenants, want true")
	}
}

func TestNewNeedsSecret(t *testing.T) {
	cfg := testConfig(t, "tenants: [{name: a, api_keys: [\""+HashKey("k")+"\"]}]\n")
	_, err := New(cfg, Options{Getenv: func(string) string { return "short" }})
	if err == nil || !strings.Contains(err.Error(), "at least 32") {
		t.Errorf("short secret: %v, want an error asking for 32 bytes", err)
	}
}

func TestRequestsPerMinute(t *testing.T) {
	g, clk := newTestGate(t, "tenants: [{name: a, api_keys: [\""+HashKey("k")+"\"], limits: {requests_per_minute: 2}}]\n", nil)
	h := middleware(g, &echo{})
	key := map[string]string{"Authorization": "Bearer k"}
	w := do(h, key, chat("x"))
	want := map[string]string{"x-ratelimit-limit-requests": "2", "x-ratelimit-remaining-requests": "1",
		"x-ratelimit-reset-requests": "30s"}
	for k, v := range want {
		if got := w.Header().Get(k); got != v {
			t.Errorf("first response: %s = %q, want %q", k, got, v)
		}
	}
	if w.Header().Get("x-ratelimit-limit-tokens") != "" {
		t.Error("token headers without a token limit")
	}
	if w := do(h, key, chat("x")); w.Code != http.StatusOK {
		t.Fatalf("second request: %d", w.Code)
	}
	clk.Add(10 * time.Second) // a third of a request back
	w = do(h, key, chat("x"))
	if w.Code != http.StatusTooManyRequests {
		t.Fatalf("third request: %d, want 429", w.Code)
	}
	hdr := map[string]string{}
	for _, k := range []string{"Retry-After", "retry-after-ms", "x-should-retry", "x-ratelimit-remaining-requests", "x-ratelimit-reset-requests"} {
		hdr[k] = w.Header().Get(k)
	}
	wantHdr := map[string]string{"Retry-After": "20", "retry-after-ms": "20000", "x-should-retry": "",
		"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "50s"}
	if diff := cmp.Diff(wantHdr, hdr); diff != "" {
		t.Errorf("429 headers (-want +got):\n%s", diff)
	}
	if eb := decodeErr(t, w); *eb.Error.Code != "rate_limit_exceeded" || eb.Error.Type != "requests" {
		t.Errorf("429 body %+v", eb.Error)
	}
	clk.Add(20 * time.Second)
	if w := do(h, key, chat("x")); w.Code != http.StatusOK {
		t.Errorf("after Retry-After: %d, want 200", w.Code)
	}
}

func TestTokensPerMinute(t *testing.T) {
	g, clk := newTestGate(t, "tenants: [{name: a, api_keys: [\""+HashKey("k")+"\"], limits: {tokens_per_minute: 600}}]\n", nil)
	e := &echo{}
	h := middleware(g, e)
	key := map[string]string{"Authorization": "Bearer k"}
	// A prompt that can never fit: 429 that says not to retry.
	w := do(h, key, chat(strings.Repeat("word ", 1000)))
	if w.Code != http.StatusTooManyRequests || w.Header().Get("x-should-retry") != "false" || w.Header().Get("Retry-After") != "" {
		t.Fatalf("oversized prompt: %d, x-should-retry %q, Retry-After %q; want 429, false, none",
			w.Code, w.Header().Get("x-should-retry"), w.Header().Get("Retry-After"))
	}
	if eb := decodeErr(t, w); *eb.Error.Code != "request_too_large" {
		t.Errorf("oversized prompt: code %s", *eb.Error.Code)
	}
	// Settlement: the engine reports 400 prompt + 200 completion tokens: a debt.
	e.usage = [][2]int{{400, 200}}
	w = do(h, key, chat(strings.Repeat("word ", 100)))
	if w.Code != http.StatusOK {
		t.Fatalf("fitting prompt: %d", w.Code)
	}
	est := 600 - atoi(t, w.Header().Get("x-ratelimit-remaining-tokens"))
	if est < 50 || est > 300 {
		t.Fatalf("estimated %d tokens for 100 words", est)
	}
	w = do(h, key, chat("x"))
	if w.Code != http.StatusTooManyRequests || w.Header().Get("x-should-retry") != "" {
		t.Fatalf("in debt: %d, want 429 (retryable)", w.Code)
	}
	// 600 units used at 10 per second: the bucket has a debt of 0 after 60s, full after 120s.
	ms := atoi(t, w.Header().Get("retry-after-ms"))
	if ms < 1 || ms > 1000 {
		t.Errorf("retry-after-ms %d; want the time for the missing few tokens", ms)
	}
	clk.Add(time.Minute)
	if w := do(h, key, chat("x")); w.Code != http.StatusOK {
		t.Errorf("after a minute: %d", w.Code)
	}
	// A request that used less than its estimate gives the difference back.
	e.usage = [][2]int{{0, 0}}
	before := atoi(t, do(h, key, chat(strings.Repeat("word ", 100))).Header().Get("x-ratelimit-remaining-tokens"))
	w = do(h, key, chat("x"))
	after := atoi(t, w.Header().Get("x-ratelimit-remaining-tokens"))
	if after <= before+40 {
		t.Errorf("refund: remaining %d before, %d after; want the estimate back", before, after)
	}
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	var n int
	if _, err := fmtSscan(s, &n); err != nil {
		t.Fatalf("%q is not a number", s)
	}
	return n
}

func TestConcurrency(t *testing.T) {
	g, _ := newTestGate(t, "tenants: [{name: a, api_keys: [\""+HashKey("k")+"\"], limits: {max_concurrent: 1}}]\n", nil)
	entered, leave := make(chan struct{}), make(chan struct{})
	h := middleware(g, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		<-leave
	}))
	key := map[string]string{"Authorization": "Bearer k"}
	first := make(chan int, 1)
	go func() { first <- do(h, key, chat("x")).Code }()
	<-entered
	w := do(h, key, chat("x"))
	if w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") != "1" {
		t.Errorf("second concurrent request: %d, Retry-After %q; want 429, 1", w.Code, w.Header().Get("Retry-After"))
	}
	if eb := decodeErr(t, w); *eb.Error.Code != "concurrency_limit_exceeded" {
		t.Errorf("code %s", *eb.Error.Code)
	}
	close(leave)
	if c := <-first; c != http.StatusOK {
		t.Errorf("first: %d", c)
	}
	go func() { <-entered }()
	if w := do(h, key, chat("x")); w.Code != http.StatusOK {
		t.Errorf("after the first ended: %d", w.Code)
	}
}

func TestReloadKeepsUse(t *testing.T) {
	g, _ := newTestGate(t, "tenants: [{name: a, api_keys: [\""+HashKey("k")+"\"], limits: {requests_per_minute: 2}}]\n", nil)
	h := middleware(g, &echo{})
	key := map[string]string{"Authorization": "Bearer k"}
	do(h, key, chat("x"))
	do(h, key, chat("x"))
	cfg := testConfig(t, "tenants: [{name: a, api_keys: [\""+HashKey("k2")+"\"], limits: {requests_per_minute: 2}}]\n")
	if err := g.Reload(cfg); err != nil {
		t.Fatal(err)
	}
	if w := do(h, key, chat("x")); w.Code != http.StatusUnauthorized {
		t.Errorf("old key after reload: %d, want 401", w.Code)
	}
	if w := do(h, map[string]string{"Authorization": "Bearer k2"}, chat("x")); w.Code != http.StatusTooManyRequests {
		t.Errorf("new key of the same tenant: %d, want 429 (the tenant used its limit)", w.Code)
	}
}

// TestNoSecretsInLogs runs requests through the gate with a debug logger and checks that no
// line holds a key, a digest of one, the secret, a salt or prompt text.
func TestNoSecretsInLogs(t *testing.T) {
	var buf bytes.Buffer
	logger := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	g, _ := newTestGate(t, "tenants: [{name: a, api_keys: [\""+HashKey("sk-live-secret")+"\"], limits: {requests_per_minute: 1, tokens_per_minute: 100}}]\n", logger)
	h := middleware(g, &echo{})
	prompt := "the launch code is swordfish"
	do(h, map[string]string{"Authorization": "Bearer sk-live-secret"}, chat(prompt))
	do(h, map[string]string{"Authorization": "Bearer sk-live-secret"}, chat(prompt))
	do(h, map[string]string{"Authorization": "Bearer sk-wrong-secret"}, chat(prompt))
	do(h, map[string]string{"api-key": "sk-live-secret"}, chat(strings.Repeat(prompt, 100)))
	logs := buf.String()
	if strings.Count(logs, "\n") < 3 {
		t.Fatalf("expected debug lines for the refusals, got %q", logs)
	}
	for _, s := range []string{"sk-live-secret", "sk-wrong-secret", HashKey("sk-live-secret")[7:], testSecret,
		Salt([]byte(testSecret), "a"), "swordfish"} {
		if strings.Contains(logs, s) {
			t.Errorf("a log line contains %q:\n%s", s, logs)
		}
	}
}

func TestAdmit(t *testing.T) {
	pool := endpoint.NewPool()
	if _, err := pool.Update([]endpoint.Spec{{Name: "http://127.0.0.1:1"}, {Name: "http://127.0.0.1:2"}}); err != nil {
		t.Fatal(err)
	}
	eps := pool.All()
	now := time.Now()
	for _, e := range eps {
		e.SetSnapshot(&endpoint.Snapshot{At: now, Waiting: 10})
	}
	cfg := testConfig(t, "tenants: [{name: a, api_keys: [\""+HashKey("k")+"\"]}]\noverload: {max_waiting_per_endpoint: 4, max_wait: 50ms, queue_size: 1}\n")
	g, err := New(cfg, Options{Getenv: func(string) string { return testSecret }, Poll: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	// Saturated past max_wait: 503 (the proxy adds Retry-After).
	var admitErr error
	h := middleware(g, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, admitErr = g.Admit(r.Context(), FromContext(r.Context()), eps)
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	do(h, map[string]string{"Authorization": "Bearer k"}, chat("x"))
	var oe *openai.Error
	if !errors.As(admitErr, &oe) || oe.Status != http.StatusServiceUnavailable || *oe.Code != "overloaded" {
		t.Fatalf("saturated: %v; want a 503 overloaded error", admitErr)
	}
	// One endpoint frees up while a request waits: it is admitted.
	id := &Identity{Name: "a"}
	done := make(chan error, 1)
	g2, _ := New(testConfig(t, "tenants: [{name: a, api_keys: [\""+HashKey("k")+"\"]}]\noverload: {max_waiting_per_endpoint: 4, max_wait: 10s}\n"),
		Options{Getenv: func(string) string { return testSecret }, Poll: time.Millisecond})
	go func() {
		release, err := g2.Admit(context.Background(), id, eps)
		if release != nil {
			release()
		}
		done <- err
	}()
	deadline := time.Now().Add(5 * time.Second)
	for g2.Waiting() != 1 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if g2.Waiting() != 1 {
		t.Fatal("the request did not wait while every endpoint was saturated")
	}
	eps[1].SetSnapshot(&endpoint.Snapshot{At: now, Waiting: 1})
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("admitted with an error: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("not admitted after an endpoint freed up")
	}
}

func fmtSscan(s string, n *int) (int, error) { return fmt.Sscan(s, n) }

func TestSaturation(t *testing.T) {
	pool := endpoint.NewPool()
	if _, err := pool.Update([]endpoint.Spec{{Name: "http://127.0.0.1:1"}, {Name: "http://127.0.0.1:2"}}); err != nil {
		t.Fatal(err)
	}
	eps := pool.All()
	rate := func(*endpoint.Endpoint) float64 { return 1000 } // tokens per second
	o := config.Overload{MaxWaitingPerEndpoint: 2, MaxPredictedTTFT: config.Duration(time.Second)}
	if saturation(config.Overload{}, rate) != nil {
		t.Error("no limits, yet a predicate")
	}
	if saturation(config.Overload{MaxPredictedTTFT: config.Duration(time.Second)}, nil) != nil {
		t.Error("predicted TTFT without a prefill rate, yet a predicate")
	}
	sat := saturation(o, rate)
	if sat(eps) {
		t.Error("idle endpoints saturated")
	}
	eps[0].SetSnapshot(&endpoint.Snapshot{At: time.Now(), Waiting: 3})
	if sat(eps) {
		t.Error("one endpoint free, yet saturated")
	}
	if !sat(eps[:1]) {
		t.Error("3 waiting over a limit of 2: not saturated")
	}
	eps[1].Start(1500) // 1.5 s of queued prefill at 1000 tokens/s
	if !sat(eps) {
		t.Error("1.5 s of queued prefill over a limit of 1 s: not saturated")
	}
	eps[1].FirstToken(1500)
	if sat(eps) {
		t.Error("prefill done, yet saturated")
	}
	// In-flight requests beyond the engine's running batch count as waiting before a scrape.
	eps[0].SetSnapshot(&endpoint.Snapshot{At: time.Now(), Running: 1})
	for range 4 {
		eps[0].Start(1)
		eps[0].FirstToken(1)
	}
	if got := EngineWaiting(eps[0]); got != 3 {
		t.Errorf("EngineWaiting = %d, want 4 in flight - 1 running = 3", got)
	}
}

// TestReloadRemovedAndBack: a tenant removed by a reload and added back by the next goes on
// with its slots in use and its token debt, rather than with fresh limits.
func TestReloadRemovedAndBack(t *testing.T) {
	withA := "tenants: [{name: a, api_keys: [\"" + HashKey("k") + "\"], limits: {max_concurrent: 1, tokens_per_minute: 1000}}, " +
		"{name: b, api_keys: [\"" + HashKey("kb") + "\"]}]\n"
	withoutA := "tenants: [{name: b, api_keys: [\"" + HashKey("kb") + "\"]}]\n"
	g, clk := newTestGate(t, withA, nil)
	take := func(est int) (*Ticket, *openai.Error) {
		t.Helper()
		id, oe := g.Authenticate(http.Header{"Authorization": {"Bearer k"}})
		if oe != nil {
			t.Fatalf("a's key: %v", oe)
		}
		return g.Take(id, Demand{Prompt: est}, http.Header{})
	}
	reload := func(tenants string) {
		t.Helper()
		if err := g.Reload(testConfig(t, tenants)); err != nil {
			t.Fatal(err)
		}
	}
	first, oe := take(100)
	if oe != nil {
		t.Fatalf("first request: %v", oe)
	}
	reload(withoutA)
	reload(withA)
	if _, oe := take(100); oe == nil || *oe.Code != "concurrency_limit_exceeded" {
		t.Fatalf("second request while the first is in flight across the reloads: %v, want concurrency_limit_exceeded", oe)
	}
	first.End(http.StatusOK, 100, 1500) // more than the minute's tokens: a debt
	reload(withoutA)
	reload(withA)
	if _, oe := take(100); oe == nil || *oe.Code != "rate_limit_exceeded" {
		t.Fatalf("request with the tenant in debt across the reloads: %v, want rate_limit_exceeded", oe)
	}
	// Once its bucket has refilled, a removed tenant's state is forgotten: nothing to keep.
	clk.Add(2 * time.Minute)
	reload(withoutA)
	if n := len(g.retired); n != 0 {
		t.Errorf("%d idle limiters kept after the reload", n)
	}
	reload(withA)
	if tk, oe := take(100); oe != nil {
		t.Errorf("after the refill: %v", oe)
	} else {
		tk.End(http.StatusOK, 100, 0)
	}
}

// A client that sends its key without "Bearer " (or under another scheme) is told that the
// scheme is wrong, not that the key is missing; the code, and the rejection's reason, stay
// missing_api_key. The header's value is never repeated but for a scheme's name.
func TestAuthenticationWrongScheme(t *testing.T) {
	g, _ := newTestGate(t, `tenants:
  - {name: acme, api_keys: ["`+HashKey("sk-acme")+`"]}
`, nil)
	h := middleware(g, &echo{})
	for _, tc := range []struct {
		name, auth string
		want       string
	}{
		{"none", "", "no API key: send it as 'Authorization: Bearer <key>' or in the api-key header"},
		{"a bare key", "sk-acme", "no API key: the Authorization header does not start with 'Bearer ' (a key must follow it); send it as 'Authorization: Bearer <key>' or in the api-key header"},
		{"Basic", "Basic c2stYWNtZQ==", "no API key: the Authorization header uses the Basic scheme, which the router does not read; send it as 'Authorization: Bearer <key>' or in the api-key header"},
		{"a key with a space", "sk-acme x", "no API key: the Authorization header does not start with 'Bearer ' (a key must follow it); send it as 'Authorization: Bearer <key>' or in the api-key header"},
		{"Bearer alone", "Bearer", "no API key: the Authorization header has nothing after Bearer; send it as 'Authorization: Bearer <key>' or in the api-key header"},
	} {
		hdr := map[string]string{}
		if tc.auth != "" {
			hdr["Authorization"] = tc.auth
		}
		w := do(h, hdr, chat("hi"))
		eb := decodeErr(t, w)
		if w.Code != http.StatusUnauthorized || eb.Error.Code == nil || *eb.Error.Code != "missing_api_key" || eb.Error.Message != tc.want {
			t.Errorf("%s: %d %+v, want 401 missing_api_key %q", tc.name, w.Code, eb.Error, tc.want)
		}
		if strings.Contains(eb.Error.Message, "sk-acme") || strings.Contains(eb.Error.Message, "c2stYWNtZQ") {
			t.Errorf("%s: the message repeats the key: %q", tc.name, eb.Error.Message)
		}
	}
}
