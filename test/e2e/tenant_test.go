package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/app"
	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/prefix"
	"github.com/kvroute/kvroute/internal/simserver"
	"github.com/kvroute/kvroute/internal/tenant"
)

const tenantSecret = "e2e-secret-0123456789abcdef-0123456789abcdef"

// tenantStack is a simulated fleet behind a router built from a config with tenants, as
// `kvroute serve` builds it (the router builds the tenant gate).
type tenantStack struct {
	fleet  *simserver.Fleet
	router *app.Router
	gate   *tenant.Gate
	api    string
}

// startTenantStack starts n instances and a router with the given extra YAML (tenants,
// overload, server sections). logger nil: discard.
func startTenantStack(t *testing.T, n int, opts simserver.Options, extra string, logger *slog.Logger) *tenantStack {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	opts.Model = model
	if opts.DefaultMaxTokens == 0 {
		opts.DefaultMaxTokens = 16
	}
	fleet, err := simserver.StartFleet(ctx, opts, n, "127.0.0.1", 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fleet.Close() })
	var y strings.Builder
	y.WriteString("policy: {name: prefix-aware}\nhealth: {interval: 1h, unhealthy_threshold: 5}\nscrape: {interval: 100ms}\n")
	y.WriteString("auth: {mode: api_key, secret_env: KVROUTE_E2E_SECRET}\n")
	y.WriteString(extra)
	y.WriteString("\nendpoints:\n")
	for _, u := range fleet.URLs() {
		fmt.Fprintf(&y, "  - {url: %q, models: [%s], engine: vllm}\n", u, model)
	}
	cfg, err := config.Parse([]byte(y.String()))
	if err != nil {
		t.Fatal(err)
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	t.Setenv("KVROUTE_E2E_SECRET", tenantSecret) // the router reads auth.secret_env
	r, err := app.NewRouter(cfg, logger)
	if err != nil {
		t.Fatal(err)
	}
	api, _ := serveRouter(t, r, false)
	return &tenantStack{fleet: fleet, router: r, gate: r.Gate(), api: api}
}

// tenantYAML lists tenants as name=key pairs with the given limits (YAML flow map or "").
func tenantYAML(limits map[string]string, keys ...string) string {
	var b strings.Builder
	b.WriteString("tenants:\n")
	for _, nk := range keys {
		name, key, _ := strings.Cut(nk, "=")
		fmt.Fprintf(&b, "  - {name: %s, api_keys: [%q]", name, tenant.HashKey(key))
		if l := limits[name]; l != "" {
			fmt.Fprintf(&b, ", limits: %s", l)
		}
		b.WriteString("}\n")
	}
	return b.String()
}

type chatResult struct {
	status int
	header http.Header
	cached int
	body   string
}

// post sends a non-streaming chat request with key and returns the status and cached tokens.
func post(t *testing.T, api, key, body string) chatResult {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, api+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var out struct {
		Usage struct {
			Details *struct {
				Cached int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	_ = json.Unmarshal(b, &out)
	r := chatResult{status: resp.StatusCode, header: resp.Header, body: string(b)}
	if out.Usage.Details != nil {
		r.cached = out.Usage.Details.Cached
	}
	return r
}

func chatJSON(text string, extra string) string {
	b, _ := json.Marshal(text)
	return `{"model":"` + model + `","max_tokens":4,"messages":[{"role":"user","content":` + string(b) + `}]` + extra + `}`
}

// TestTenantCacheIsolation: the same prompt from two tenants shares neither a router index
// entry nor engine cache: the second tenant gets no cached tokens, even when it sends a
// cache_salt of its own.
func TestTenantCacheIsolation(t *testing.T) {
	s := startTenantStack(t, 1, simserver.Options{Profile: "instant"}, tenantYAML(nil, "alice=sk-alice", "bob=sk-bob", "carol=sk-carol", "dave=sk-dave"), nil)
	prompt := strings.Repeat("The quarterly numbers for project nightingale are confidential. ", 40)

	if r := post(t, s.api, "", chatJSON(prompt, "")); r.status != http.StatusUnauthorized {
		t.Fatalf("no key: %d, want 401", r.status)
	}
	first := post(t, s.api, "sk-alice", chatJSON(prompt, ""))
	again := post(t, s.api, "sk-alice", chatJSON(prompt, ""))
	if first.status != 200 || again.status != 200 || again.cached == 0 {
		t.Fatalf("alice twice: %d/%d, cached on the second %d; want 200s and a cache hit (%s)", first.status, again.status, again.cached, again.body)
	}
	// Each other tenant's first request, whatever cache_salt its client sends, finds nothing
	// (its own second request would hit its own entry: that is allowed).
	for key, extra := range map[string]string{"sk-bob": "", "sk-carol": `,"cache_salt":"alice"`, "sk-dave": `,"cache_salt":""`} {
		r := post(t, s.api, key, chatJSON(prompt, extra))
		if r.status != 200 || r.cached != 0 {
			t.Errorf("%s with the same prompt (%q): status %d, cached %d; want 200 and no cached tokens", key, extra, r.status, r.cached)
		}
	}
	if r := post(t, s.api, "sk-bob", chatJSON(prompt, "")); r.cached == 0 {
		t.Errorf("bob's second request: no cached tokens; want a hit on his own entry")
	}
	// The router's own index: the two tenants' block hashes of the prompt have nothing in common.
	sa, sb := tenant.Salt([]byte(tenantSecret), "alice"), tenant.Salt([]byte(tenantSecret), "bob")
	ba := prefix.Blocks(nil, prefix.Seed(model, sa), prompt, prefix.DefaultBlockTokens)
	bb := prefix.Blocks(nil, prefix.Seed(model, sb), prompt, prefix.DefaultBlockTokens)
	seen := map[uint64]bool{}
	for _, h := range ba {
		seen[h] = true
	}
	for _, h := range bb {
		if seen[h] {
			t.Fatalf("block hash %x is shared by both tenants", h)
		}
	}
	if len(ba) == 0 {
		t.Fatal("the prompt made no blocks")
	}
}

// TestTenant429OpenAIClient: over its requests-per-minute limit a tenant gets 429 with
// OpenAI's headers, and the openai npm client, retrying by itself, succeeds after the delay
// the router advised.
func TestTenant429OpenAIClient(t *testing.T) {
	s := startTenantStack(t, 1, simserver.Options{Profile: "instant"},
		tenantYAML(map[string]string{"slow": "{requests_per_minute: 1}", "node": "{requests_per_minute: 60}"},
			"slow=sk-slow", "node=sk-node"), nil)

	if r := post(t, s.api, "sk-slow", chatJSON("hi", "")); r.status != 200 || r.header.Get("x-ratelimit-remaining-requests") != "0" {
		t.Fatalf("first request: %d, remaining %q", r.status, r.header.Get("x-ratelimit-remaining-requests"))
	}
	r := post(t, s.api, "sk-slow", chatJSON("hi", ""))
	if r.status != http.StatusTooManyRequests {
		t.Fatalf("second request within the minute: %d, want 429", r.status)
	}
	h := r.header
	ms, ra := atoiE2E(h.Get("retry-after-ms")), atoiE2E(h.Get("Retry-After"))
	if ms < 55_000 || ms > 60_000 || ra != (ms+999)/1000 || h.Get("x-should-retry") != "" ||
		h.Get("x-ratelimit-limit-requests") != "1" || h.Get("x-ratelimit-remaining-requests") != "0" ||
		!strings.HasSuffix(h.Get("x-ratelimit-reset-requests"), "s") || !strings.Contains(r.body, `"rate_limit_exceeded"`) {
		t.Errorf("429 headers %v body %s", h, r.body)
	}

	needNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", "tenant_429.mjs")
	cmd.Env = append(os.Environ(), "KVROUTE_BASE_URL="+s.api+"/v1", "KVROUTE_MODEL="+model, "KVROUTE_API_KEY=sk-node")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node tenant_429.mjs: %v\nstdout %s\nstderr %s", err, out, stderr.String())
	}
	var res struct {
		Burst     int    `json:"burst"`
		BurstErr  string `json:"burstError"`
		OK        bool   `json:"ok"`
		Content   string `json:"content"`
		ElapsedMs int    `json:"elapsedMs"`
		Rounds    int    `json:"rounds"`
		Attempts  []struct {
			Status       int    `json:"status"`
			RetryAfterMs string `json:"retryAfterMs"`
			Remaining    string `json:"remaining"`
		} `json:"attempts"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("node printed %q: %v", out, err)
	}
	t.Logf("node: %+v", res)
	if res.BurstErr != "RateLimitError" || res.Burst < 50 {
		t.Fatalf("burst: %d requests before %q; want about 60 and a RateLimitError", res.Burst, res.BurstErr)
	}
	if !res.OK || res.Content == "" || len(res.Attempts) < 2 || res.Attempts[0].Status != 429 || res.Attempts[len(res.Attempts)-1].Status != 200 {
		t.Fatalf("the retrying client: %+v; want a 429 then a 200", res)
	}
	advised := atoiE2E(res.Attempts[0].RetryAfterMs)
	if advised <= 0 || advised > 1000 || res.ElapsedMs+20 < advised {
		t.Errorf("advised %d ms, the client took %d ms: want it to wait at least the advised delay", advised, res.ElapsedMs)
	}
}

func atoiE2E(s string) int {
	var n int
	if _, err := fmt.Sscan(s, &n); err != nil {
		return -1
	}
	return n
}

// TestTenantNoSecretsInLogs: no log line of the router or the gate holds a key, a salt or
// prompt text, at debug level, across successes, 401s and 429s.
func TestTenantNoSecretsInLogs(t *testing.T) {
	pr, pw := io.Pipe()
	lines := make(chan string, 1000)
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	logger := slog.New(slog.NewJSONHandler(pw, &slog.HandlerOptions{Level: slog.LevelDebug}))
	s := startTenantStack(t, 1, simserver.Options{Profile: "instant"},
		tenantYAML(map[string]string{"a": "{requests_per_minute: 2}"}, "a=sk-very-secret-key"), logger)
	prompt := "my password is hunter2-correct-horse"
	post(t, s.api, "sk-very-secret-key", chatJSON(prompt, ""))
	post(t, s.api, "sk-very-secret-key", chatJSON(prompt, ""))
	post(t, s.api, "sk-very-secret-key", chatJSON(prompt, "")) // 429
	post(t, s.api, "sk-wrong-key-value", chatJSON(prompt, "")) // 401
	t.Cleanup(func() {
		// After the router stopped (cleanups run last-in first-out: this one first is fine,
		// the logger is only read here).
		pw.Close()
		var all []string
		for l := range lines {
			all = append(all, l)
		}
		if len(all) < 3 {
			t.Errorf("only %d log lines: the test saw nothing", len(all))
		}
		salt := tenant.Salt([]byte(tenantSecret), "a")
		for _, l := range all {
			for _, secret := range []string{"sk-very-secret-key", "sk-wrong-key-value", "hunter2", salt, tenantSecret} {
				if strings.Contains(l, secret) {
					t.Errorf("log line holds %q: %s", secret, l)
				}
			}
		}
	})
}
