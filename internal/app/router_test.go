package app

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/route"
	"github.com/kvroute/kvroute/internal/testlog"
)

func routerConfig(t *testing.T, extra string, urls ...string) *config.Config {
	t.Helper()
	var b strings.Builder
	b.WriteString("scrape: {disabled: true}\nhealth: {interval: 1h}\nserver: {shutdown_timeout: 10s}\nendpoints:\n")
	for _, u := range urls {
		fmt.Fprintf(&b, "  - {url: %q, models: [m], engine: vllm}\n", u)
	}
	b.WriteString(extra)
	cfg, err := config.Parse([]byte(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func get(t *testing.T, h http.Handler, path string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	return rec.Code, rec.Body.String()
}

func TestRouterAdminAndReload(t *testing.T) {
	a, b := newFakeEngine(t), newFakeEngine(t)
	r, err := NewRouter(routerConfig(t, "", a.srv.URL, b.srv.URL), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	api, admin := r.Handler(), r.AdminHandler()
	rec := httptest.NewRecorder()
	api.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(chatBody)))
	if rec.Code != 200 {
		t.Fatalf("chat: %d %s", rec.Code, rec.Body)
	}
	code, body := get(t, admin, "/metrics")
	for _, want := range []string{`kvroute_requests_total{endpoint=`, `kvroute_endpoint_healthy{endpoint="` + a.srv.URL + `"} 1`, "kvroute_pick_duration_seconds_count 1", "go_goroutines"} {
		if code != 200 || !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if path, err := exec.LookPath("promtool"); err == nil {
		cmd := exec.Command(path, "check", "metrics")
		cmd.Stdin = strings.NewReader(body)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool check metrics: %v\n%s", err, out)
		}
	}
	if code, _ := get(t, admin, "/readyz"); code != 200 {
		t.Errorf("/readyz = %d", code)
	}
	code, body = get(t, admin, "/debug/endpoints")
	var dbg struct {
		Endpoints []EndpointInfo `json:"endpoints"`
	}
	if err := json.Unmarshal([]byte(body), &dbg); err != nil || code != 200 || len(dbg.Endpoints) != 2 {
		t.Fatalf("/debug/endpoints %d %s: %v", code, body, err)
	}

	// A bad policy is rejected whole: the endpoints stay as they were.
	bad := routerConfig(t, "", a.srv.URL)
	bad.Policy.Name = "no-such-policy"
	if err := r.Reload(bad); err == nil {
		t.Error("reload with an unknown policy: no error")
	}
	if r.Pool().Len() != 2 {
		t.Errorf("after rejected reload: %d endpoints, want 2", r.Pool().Len())
	}
	// A good one removes b; the kept endpoint keeps its object.
	keep := r.Pool().ByName(a.srv.URL)
	if err := r.Reload(routerConfig(t, "", a.srv.URL)); err != nil {
		t.Fatal(err)
	}
	if r.Pool().Len() != 1 || r.Pool().ByName(a.srv.URL) != keep {
		t.Errorf("after reload: %d endpoints, kept object changed: %v", r.Pool().Len(), r.Pool().ByName(a.srv.URL) != keep)
	}
	if _, body := get(t, admin, "/metrics"); strings.Contains(body, b.srv.URL) {
		t.Error("metrics still carry the removed endpoint")
	}
	if _, body := get(t, admin, "/metrics"); !strings.Contains(body, `kvroute_config_reloads_total{result="error"} 1`) {
		t.Error("rejected reload not counted")
	}
}

func TestRouterServeDrainsStreams(t *testing.T) {
	for _, srv := range []string{config.HTTPServerBuiltin, config.HTTPServerNetHTTP} {
		t.Run(srv, func(t *testing.T) { testServeDrainsStreams(t, srv) })
	}
}

func testServeDrainsStreams(t *testing.T, httpServer string) {
	e := newFakeEngine(t)
	e.hold, e.held = make(chan struct{}), make(chan struct{})
	cfg := routerConfig(t, "", e.srv.URL)
	cfg.Server.HTTPServer = httpServer
	r, err := NewRouter(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	apiLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	adminLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	served := make(chan error, 1)
	go func() { served <- r.Serve(ctx, apiLn, adminLn) }()

	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	resp, err := client.Post("http://"+apiLn.Addr().String()+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	<-e.held
	cancel() // shutdown starts while the stream is in flight
	// New connections are refused once shutdown has begun; poll with a deadline.
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		c, err := net.DialTimeout("tcp", apiLn.Addr().String(), time.Second)
		if err != nil {
			break
		}
		c.Close()
		time.Sleep(10 * time.Millisecond)
	}
	close(e.hold)
	body, err := io.ReadAll(resp.Body)
	if err != nil || !bytes.HasSuffix(body, []byte("data: [DONE]\n\n")) {
		t.Errorf("stream cut by shutdown: %v, %q", err, body)
	}
	select {
	case err := <-served:
		if err != nil {
			t.Errorf("Serve: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Serve did not return after the drain")
	}
}

func TestRouterTenants(t *testing.T) {
	e := newFakeEngine(t)
	dir := t.TempDir()
	secret := filepath.Join(dir, "secret")
	if err := os.WriteFile(secret, []byte(strings.Repeat("s", 40)), 0o600); err != nil {
		t.Fatal(err)
	}
	// "foo" is the key of acme.
	extra := fmt.Sprintf(`auth: {mode: api_key, secret_file: %q}
tenants:
  - name: acme
    api_keys: [sha256:2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae]
`, secret)
	r, err := NewRouter(routerConfig(t, extra, e.srv.URL), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	api := r.Handler()
	post := func(key string) int {
		req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions",
			strings.NewReader(`{"model":"m","cache_salt":"mine","messages":[{"role":"user","content":"x"}]}`))
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		rec := httptest.NewRecorder()
		api.ServeHTTP(rec, req)
		return rec.Code
	}
	if code := post(""); code != http.StatusUnauthorized {
		t.Errorf("no key: %d, want 401", code)
	}
	if code := post("foo"); code != http.StatusOK {
		t.Fatalf("acme's key: %d, want 200", code)
	}
	got := e.received()
	salt := string(openai.Field(got[len(got)-1], "cache_salt"))
	if salt == `"mine"` || len(salt) < 10 {
		t.Errorf("cache_salt sent = %s, want the tenant's salt", salt)
	}
	// Explaining needs the tenant's key too: its salt changes what the index holds for it.
	explain := func(key string) int {
		req := httptest.NewRequest(http.MethodPost, "/debug/explain", strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"x"}]}`))
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		rec := httptest.NewRecorder()
		r.AdminHandler().ServeHTTP(rec, req)
		return rec.Code
	}
	if code := explain(""); code != http.StatusUnauthorized {
		t.Errorf("explain without a key: %d, want 401", code)
	}
	if code := explain("foo"); code != http.StatusOK {
		t.Errorf("explain with acme's key: %d, want 200", code)
	}
}

func TestRouterKeepsPolicyAcrossReloads(t *testing.T) {
	e := newFakeEngine(t)
	r, err := NewRouter(routerConfig(t, "policy: {name: round-robin}\n", e.srv.URL), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	before := r.h.Load().Lifecycle.Picker()
	if err := r.Reload(routerConfig(t, "policy: {name: round-robin}\nlimits: {max_retries: 0}\n", e.srv.URL)); err != nil {
		t.Fatal(err)
	}
	if r.h.Load().Lifecycle.Picker() != before {
		t.Error("same policy and params: the policy was rebuilt (its learned state lost)")
	}
	if got := r.h.Load().Lifecycle.Attempts(); got != 1 {
		t.Errorf("attempts after reload = %d, want 1 (max_retries 0)", got)
	}
	if err := r.Reload(routerConfig(t, "policy: {name: least-request}\n", e.srv.URL)); err != nil {
		t.Fatal(err)
	}
	if r.h.Load().Lifecycle.Picker() == before {
		t.Error("new policy name: the policy was not rebuilt")
	}
}

func TestRouterDiscoveryFile(t *testing.T) {
	a, b := newFakeEngine(t), newFakeEngine(t)
	b.hold, b.held = make(chan struct{}), make(chan struct{})
	dir := t.TempDir()
	file := filepath.Join(dir, "endpoints.yaml")
	write := func(urls ...string) {
		var s strings.Builder
		fmt.Fprintf(&s, "# %d\n", time.Now().UnixNano())
		for _, u := range urls {
			fmt.Fprintf(&s, "- {url: %q, models: [m], engine: vllm}\n", u)
		}
		if err := os.WriteFile(file, []byte(s.String()), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(b.srv.URL)
	cfg := routerConfig(t, fmt.Sprintf("discovery: {file: %q, poll_interval: 50ms}\n", file))
	logs := &testlog.Buffer{}
	r, err := NewRouter(cfg, slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if r.Pool().Len() != 1 || r.Pool().ByName(b.srv.URL) == nil {
		t.Fatalf("endpoints at start: %d, want b", r.Pool().Len())
	}
	runRouter(t, r)

	// A stream in flight on b...
	rec := httptest.NewRecorder()
	streamed := make(chan struct{})
	go func() {
		defer close(streamed)
		r.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/chat/completions",
			strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}]}`)))
	}()
	<-b.held
	// ...survives a file that adds a and removes b.
	write(a.srv.URL)
	waitUntil(t, "a added, b removed", func() bool {
		return r.Pool().ByName(a.srv.URL) != nil && r.Pool().ByName(b.srv.URL) == nil
	})
	close(b.hold)
	select {
	case <-streamed:
	case <-time.After(10 * time.Second):
		t.Fatal("the stream on the removed endpoint did not finish")
	}
	if rec.Code != 200 || !strings.HasSuffix(rec.Body.String(), "data: [DONE]\n\n") {
		t.Errorf("stream on the removed endpoint: %d %q", rec.Code, rec.Body)
	}
	if n := r.Pool().Len(); n != 1 {
		t.Errorf("after the change: %d endpoints, want 1", n)
	}

	// A bad file keeps the endpoints in force.
	if err := os.WriteFile(file, []byte("- {url: 5, bogus: key}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "bad discovery file reported", func() bool { return strings.Contains(logs.String(), "discovery file rejected") })
	if n := testutil.ToFloat64(r.metrics.DiscoveryErrors.WithLabelValues("file")); n < 1 {
		t.Errorf("kvroute_discovery_errors_total{source=file} = %v, want 1 at least", n)
	}
	if r.Pool().Len() != 1 || r.Pool().ByName(a.srv.URL) == nil {
		t.Errorf("after a bad discovery file: %d endpoints, want a only", r.Pool().Len())
	}
}

// TestRouterDiscoveryDNS: a discovery.dns name gives an endpoint per address, at start (here
// localhost, from /etc/hosts) and as its addresses change; a failed resolution keeps them.
func TestRouterDiscoveryDNS(t *testing.T) {
	a := newFakeEngine(t)
	u, err := url.Parse(a.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	r := routerFromYAML(t, fmt.Sprintf("scrape: {disabled: true}\nhealth: {interval: 1h}\n"+
		"discovery: {dns: [{name: localhost, port: %s, endpoint: {models: [m], engine: vllm}}]}\n", u.Port()))
	if r.Pool().ByName(a.srv.URL) == nil {
		t.Fatalf("at start: endpoints %v, want %s (localhost)", r.Pool().All(), a.srv.URL)
	}
	rec := httptest.NewRecorder()
	r.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/chat/completions",
		strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"x"}]}`)))
	if rec.Code != http.StatusOK {
		t.Fatalf("request to the endpoint found by DNS: %d %s", rec.Code, rec.Body)
	}

	// The name then gains an address, then fails to resolve, then loses the first address.
	var mu sync.Mutex
	answers := [][]netip.Addr{{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2")}, nil, {netip.MustParseAddr("127.0.0.2")}}
	step, calls := 0, 0
	next := make(chan struct{})
	r.dns[0].Config.Interval = config.Duration(5 * time.Millisecond)
	r.dns[0].Lookup = func(context.Context, string) ([]netip.Addr, error) {
		mu.Lock()
		defer mu.Unlock()
		calls++
		i := min(step, len(answers)-1)
		if i < len(answers)-1 {
			select {
			case <-next: // the test moves on when it has seen the previous answer applied
				step++
				i = step
			default:
			}
		}
		if answers[i] == nil {
			return nil, errors.New("server misbehaving")
		}
		return answers[i], nil
	}
	runRouter(t, r)
	second := "http://127.0.0.2:" + u.Port()
	waitUntil(t, "127.0.0.2 added", func() bool { return r.Pool().Len() == 2 && r.Pool().ByName(second) != nil })
	next <- struct{}{} // now the lookups fail
	mu.Lock()
	failing := calls
	mu.Unlock()
	waitUntil(t, "three failed lookups", func() bool { mu.Lock(); defer mu.Unlock(); return calls >= failing+3 })
	if r.Pool().Len() != 2 {
		t.Errorf("after failed lookups: %d endpoints, want the 2 in force", r.Pool().Len())
	}
	next <- struct{}{}
	waitUntil(t, "127.0.0.1 removed", func() bool { return r.Pool().Len() == 1 && r.Pool().ByName(second) != nil })
	if n := testutil.ToFloat64(r.metrics.DiscoveryErrors.WithLabelValues("dns:localhost")); n < 3 {
		t.Errorf("kvroute_discovery_errors_total{source=dns:localhost} = %v, want the 3 failed lookups at least", n)
	}
	// The gauge is set just after the pool takes the set (both under the router's lock, which
	// Pool() does not take): the test may look between the two.
	waitUntil(t, "kvroute_discovery_endpoints{source=dns:localhost} 1", func() bool {
		return testutil.ToFloat64(r.metrics.DiscoveredEndpoints.WithLabelValues("dns:localhost")) == 1
	})
}

// runRouter runs r's discovery, health checks and scrapes until the test ends, and checks
// that Run then returns cleanly.
func runRouter(t *testing.T, r *Router) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}

// waitUntil polls cond for up to 10 s, and fails the test if it never holds.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10s", what)
		}
	}
}

// routerFromYAML builds a router from a config text; it is closed at the end of the test.
func routerFromYAML(t *testing.T, yaml string) *Router {
	t.Helper()
	cfg, err := config.Parse([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	r, err := NewRouter(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return r
}

// TestRouterRunStopsWithManySources: Run returns when its context ends, whatever the number of
// discovery sources (each sends its end to Run).
func TestRouterRunStopsWithManySources(t *testing.T) {
	file := filepath.Join(t.TempDir(), "endpoints.yaml")
	if err := os.WriteFile(file, []byte("[]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := routerFromYAML(t, fmt.Sprintf("scrape: {disabled: true}\nhealth: {interval: 1h}\ndiscovery: {file: %q, dns: ["+
		"{name: localhost, port: 1}, {name: localhost, port: 2}, {name: localhost, port: 3}]}\n", file))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	cancel() // every source still ends, and sends its end, whenever it starts
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return within 5 s of its context ending (a source blocked?)")
	}
}

func TestRouterEndpointHeaderFromConfig(t *testing.T) {
	e := newFakeEngine(t)
	r := routerFromYAML(t, fmt.Sprintf("scrape: {disabled: true}\nserver: {endpoint_header: X-Kvroute-Endpoint}\nendpoints: [{url: %q, models: [m], engine: vllm}]\n", e.srv.URL))
	rec := httptest.NewRecorder()
	r.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(chatBody)))
	if rec.Code != 200 || rec.Header().Get("X-Kvroute-Endpoint") != e.srv.URL {
		t.Errorf("chat: %d, X-Kvroute-Endpoint %q, want %q", rec.Code, rec.Header().Get("X-Kvroute-Endpoint"), e.srv.URL)
	}
}

// POST /debug/explain on the admin port ranks the endpoints for a request as the policy would
// now, with what each holds of its prompt, and routes nothing.
func TestRouterExplain(t *testing.T) {
	a, b := newFakeEngine(t), newFakeEngine(t)
	r, err := NewRouter(routerConfig(t, "policy: {name: prefix-aware}\n", a.srv.URL, b.srv.URL), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	api, admin := r.Handler(), r.AdminHandler()
	chat := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("the same long document, ", 60) + `"}]}`
	rec := httptest.NewRecorder()
	api.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(chat)))
	if rec.Code != 200 {
		t.Fatalf("chat: %d %s", rec.Code, rec.Body)
	}
	holder := a.srv.URL
	if len(b.received()) == 1 {
		holder = b.srv.URL
	}
	explain := func(path, body string) (int, string) {
		rec := httptest.NewRecorder()
		admin.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, path, strings.NewReader(body)))
		return rec.Code, rec.Body.String()
	}
	code, body := explain("/debug/explain", chat)
	var ex struct {
		Model        string `json:"model"`
		PromptTokens int    `json:"prompt_tokens"`
		Explained    bool   `json:"explained"`
		Candidates   []struct {
			Endpoint        string   `json:"endpoint"`
			CachedTokens    int      `json:"cached_tokens"`
			PredictedTTFTms *float64 `json:"predicted_ttft_ms"`
			WithinBound     *bool    `json:"within_bound"`
		} `json:"candidates"`
	}
	if err := json.Unmarshal([]byte(body), &ex); err != nil || code != 200 {
		t.Fatalf("/debug/explain: %d %s (%v)", code, body, err)
	}
	if !ex.Explained || ex.Model != "m" || ex.PromptTokens < 300 || len(ex.Candidates) != 2 {
		t.Fatalf("/debug/explain: %s; want both endpoints explained for a prompt of over 300 tokens", body)
	}
	first, second := ex.Candidates[0], ex.Candidates[1]
	if first.Endpoint != holder || first.CachedTokens < 256 || second.CachedTokens != 0 {
		t.Errorf("/debug/explain ranks %s (%d tokens held) before %s (%d); want the holder %s first, holding the prompt's blocks",
			first.Endpoint, first.CachedTokens, second.Endpoint, second.CachedTokens, holder)
	}
	if first.PredictedTTFTms == nil || second.PredictedTTFTms == nil || *first.PredictedTTFTms >= *second.PredictedTTFTms || first.WithinBound == nil {
		t.Errorf("/debug/explain: %s; want a lower predicted TTFT on the holder", body)
	}
	if n := len(a.received()) + len(b.received()); n != 1 {
		t.Errorf("the engines received %d requests, want 1: explaining routes nothing", n)
	}
	for _, c := range []struct {
		path, body string
		code       int
	}{
		{"/debug/explain", `{"model":"m"`, http.StatusBadRequest},
		{"/debug/explain", `{"model":"other","messages":[{"role":"user","content":"x"}]}`, http.StatusNotFound},
		{"/debug/explain?path=/v1/models", chat, http.StatusBadRequest},
		{"/debug/explain?path=/v1/completions", `{"model":"m","prompt":"x"}`, http.StatusOK},
	} {
		if code, body := explain(c.path, c.body); code != c.code || !json.Valid([]byte(body)) {
			t.Errorf("POST %s %s: %d %s, want %d with a JSON body", c.path, c.body, code, body, c.code)
		}
	}
	if code, _ := get(t, admin, "/debug/explain"); code != http.StatusMethodNotAllowed {
		t.Errorf("GET /debug/explain: %d, want 405", code)
	}
}

// TestProberFollowsNoRedirect: the engines' probes do not follow a redirect elsewhere.
func TestProberFollowsNoRedirect(t *testing.T) {
	var hit atomic.Int32
	inside := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { hit.Add(1) }))
	defer inside.Close()
	engine := httptest.NewServer(http.RedirectHandler(inside.URL+"/secret", http.StatusFound))
	defer engine.Close()
	resp, err := proberClient(http.DefaultTransport).Get(engine.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusFound || hit.Load() != 0 {
		t.Errorf("status %d, the redirect's target asked %d times; want 302 and never", resp.StatusCode, hit.Load())
	}
}

// An endpoint that leaves the pool leaves passive health checking too: its ejection no longer
// counts against max_ejected_percent (a rollout's new engines could not be ejected while the old
// ones' ejections ran), nor is it told to a starting replica.
func TestRouterForgetsRemovedEndpoints(t *testing.T) {
	a, b, c := newFakeEngine(t), newFakeEngine(t), newFakeEngine(t)
	conf := func(urls ...string) *config.Config {
		cfg := routerConfig(t, "", urls...)
		cfg.Health.PassiveFailures = 1
		return cfg
	}
	r, err := NewRouter(conf(a.srv.URL, b.srv.URL), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	old := r.pool.ByName(a.srv.URL)
	if !r.outlier.Failed(old, route.FailConnect) {
		t.Fatal("one failure of two endpoints' first did not eject it")
	}
	if err := r.Reload(conf(b.srv.URL, c.srv.URL)); err != nil {
		t.Fatal(err)
	}
	if ej := r.outlier.Ejections(time.Now()); len(ej) != 0 {
		t.Errorf("after its removal, ejections %v; want none", ej)
	}
	if !r.outlier.Failed(r.pool.ByName(c.srv.URL), route.FailConnect) {
		t.Error("the new endpoint was not ejected: the removed one's ejection still counts against max_ejected_percent")
	}
}

// TestFirstCheckWaitFromHealthTimeout: a request in the router's first moments waits for an
// endpoint's first health check at most health.timeout, the longest one check may take.
func TestFirstCheckWaitFromHealthTimeout(t *testing.T) {
	r, err := NewRouter(routerConfig(t, "", "http://127.0.0.1:9"), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if got, want := r.h.Load().FirstCheckWait, r.Config().Health.Timeout.D(); got != want || want <= 0 {
		t.Errorf("FirstCheckWait %v, want health.timeout %v", got, want)
	}
}
