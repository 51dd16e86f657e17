package proxy

import (
	"bytes"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/tenant"
	"github.com/kvroute/kvroute/internal/testlog"
)

// absurdAnswer is a whole answer whose usage no engine could have: 9e18 completion tokens.
const absurdAnswer = `{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"x"}}],"usage":{"prompt_tokens":5,"completion_tokens":9000000000000000000,"total_tokens":9000000000000000005}}`

// absurdEngine answers a body holding "learn" with absurdAnswer after 3 s of clk, and holds any
// other until its client leaves, 5 s of clk later (arrived when it has it, gone when the client
// left).
func absurdEngine(t *testing.T, clk *manualClock) (url string, arrived, gone chan struct{}) {
	arrived, gone = make(chan struct{}, 1), make(chan struct{}, 1)
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if bytes.Contains(b, []byte("learn")) {
			clk.advance(3 * time.Second)
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, absurdAnswer)
			return
		}
		clk.advance(5 * time.Second)
		arrived <- struct{}{}
		<-r.Context().Done()
		gone <- struct{}{}
	}))
	t.Cleanup(engine.Close)
	return engine.URL, arrived, gone
}

// twoTenants is chargeGate with a second tenant, t2 (key sk-2), without limits.
func twoTenants(t *testing.T, f *fixture) *tenant.Gate {
	t.Helper()
	cfg, err := config.Parse([]byte("endpoints: [{url: \"http://127.0.0.1:1\"}]\nauth: {mode: api_key, secret_env: KVR_SECRET}\n" +
		"tenants: [{name: t1, api_keys: [\"" + tenant.HashKey("sk-1") + "\"], limits: {tokens_per_minute: " + strconv.Itoa(chargeLimit) + "}}, " +
		"{name: t2, api_keys: [\"" + tenant.HashKey("sk-2") + "\"]}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_700_000_000, 0)
	g, err := tenant.New(cfg, tenant.Options{Metrics: f.h.Metrics.Tenant, Logger: slog.New(slog.DiscardHandler),
		Now: func() time.Time { return now }, Getenv: func(string) string { return testSecret }})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// usageWarnings counts the lines logged at level about a usage out of range.
func usageWarnings(t *testing.T, logs *testlog.Buffer, level string) int {
	t.Helper()
	n := 0
	for _, l := range logs.JSONLines(t) {
		if l["level"] == level && strings.Contains(l["msg"].(string), "usage is out of range") {
			n++
		}
	}
	return n
}

// An engine whose usage says 9e18 completion tokens in 3 s. Before, three such answers to
// another tenant taught the gate 3e18 tokens a second; a request of t1 (n 4, no max_tokens)
// whose client left after 5 s was charged generated(), 5 x 3e18 x 4 converted to int, which
// overflowed: charged_completion_tokens -9.223372036854776e+18, and t1's next request was
// refused "retry in -2562047h47m16.853s", for good. And one such answer to t1 itself charged
// it 9e18 (the same lockout) and made each of its later requests without max_tokens reserve
// its whole limit. Now the usage is bounded by what the request can have had (3 s at
// tenant.MaxDecodeRate: 30,000 tokens), logged at WARN once, so is the rate, and so is the
// debt.
func TestAbsurdUsage(t *testing.T) {
	t.Run("another tenant's answers teach the rate", func(t *testing.T) {
		clk := &manualClock{now: time.Unix(1_700_000_000, 0)}
		url, arrived, gone := absurdEngine(t, clk)
		f := newFixture(t, spec(url, "m"))
		withLifecycle(t, f, clk, nil)
		logs := jsonLogger(f)
		f.h.Gate = twoTenants(t, f)
		for i := range tenant.MinDecodeSamples {
			resp, body := f.post(t, "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"learn"}]}`, "Authorization", "Bearer sk-2")
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("answer %d: %d %s", i, resp.StatusCode, body)
			}
		}
		if n := usageWarnings(t, logs, "WARN"); n != 1 {
			t.Errorf("%d WARN lines for 3 usages out of range, want 1: %s", n, logs.String())
		}
		if rate, from := f.h.Gate.DecodeRates().Rate(url); rate != tenant.MaxDecodeRate || from != "endpoint" {
			t.Errorf("learnt rate %v from %s, want %v from endpoint", rate, from, float64(tenant.MaxDecodeRate))
		}
		postAndLeave(t, f, `{"model":"m","messages":[{"role":"user","content":"a long story"}],"n":4}`, arrived, gone, "Authorization", "Bearer sk-1")
		line := lastAccess(t, logs)
		// 5 s at MaxDecodeRate, for each of 4 choices.
		if c, want := line["charged_completion_tokens"], float64(5*tenant.MaxDecodeRate*4); c != want {
			t.Errorf("status %v, charged_completion_tokens %v for a request that ran 5 s; want %v", line["status"], c, want)
		}
		resp, body := f.post(t, "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"learn"}]}`, "Authorization", "Bearer sk-1")
		ra, err := strconv.Atoi(resp.Header.Get("Retry-After"))
		// In debt by 100,004 tokens at 1,666.7 a second (the gate's clock stands still).
		if resp.StatusCode != http.StatusTooManyRequests || err != nil || ra != 61 {
			t.Errorf("t1's next request: %d, Retry-After %q, %s; want 429, 61", resp.StatusCode, resp.Header.Get("Retry-After"), body)
		}
	})
	t.Run("one answer to the tenant", func(t *testing.T) {
		clk := &manualClock{now: time.Unix(1_700_000_000, 0)}
		url, _, _ := absurdEngine(t, clk)
		f := newFixture(t, spec(url, "m"))
		withLifecycle(t, f, clk, nil)
		logs := jsonLogger(f)
		f.h.Gate = twoTenants(t, f)
		for i := range 2 {
			resp, body := f.post(t, "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"learn"}]}`, "Authorization", "Bearer sk-1")
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("request %d: %d %s", i, resp.StatusCode, body)
			}
			// 3 s at MaxDecodeRate; the prompt as the engine says.
			if line := lastAccess(t, logs); line["charged_completion_tokens"] != float64(3*tenant.MaxDecodeRate) || line["charged_prompt_tokens"] != 5.0 {
				t.Errorf("request %d: charged %v prompt and %v completion tokens; want 5 and %v", i,
					line["charged_prompt_tokens"], line["charged_completion_tokens"], float64(3*tenant.MaxDecodeRate))
			}
		}
		// The second request reserved what the first had (30,000 and its prompt), not the
		// limit: it was admitted with 69,995 left.
		_, completion, spent := charged(t, f.h.Gate, f.h.Metrics.Tenant)
		if completion != 60000 || spent != 60010 {
			t.Errorf("t1 charged %d completion tokens, its bucket spent %d; want 60000, 60010 (2 x 3 s at MaxDecodeRate, and the prompts)", completion, spent)
		}
		if n := usageWarnings(t, logs, "WARN"); n != 1 {
			t.Errorf("%d WARN lines for 2 usages out of range, want 1", n)
		}
	})
}

// boundUsage: the completion within max_tokens for each sequence, and within
// tenant.MaxDecodeRate a second since the pick (a second at least); no count below 0 nor
// above math.MaxInt32. An honest usage is left as it is.
func TestBoundUsage(t *testing.T) {
	for _, tc := range []struct {
		name             string
		maxTokens, seqs  int
		elapsed          time.Duration
		in               string
		prompt, complete int
		cached           int
	}{
		{"honest", 100, 2, time.Second, `{"prompt_tokens":7,"completion_tokens":150,"prompt_tokens_details":{"cached_tokens":3}}`, 7, 150, 3},
		{"over max_tokens x seqs", 100, 2, time.Minute, `{"prompt_tokens":7,"completion_tokens":201}`, 7, 200, -1},
		{"no max_tokens: the rate for 2 s", 0, 3, 2 * time.Second, `{"prompt_tokens":7,"completion_tokens":9000000000000000000}`, 7, 2 * 3 * tenant.MaxDecodeRate, -1},
		{"no max_tokens: a second at least", 0, 1, 0, `{"prompt_tokens":7,"completion_tokens":20000}`, 7, tenant.MaxDecodeRate, -1},
		{"Responses", 0, 1, 0, `{"input_tokens":9000000000000000000,"output_tokens":-4,"input_tokens_details":{"cached_tokens":-2}}`, 1<<31 - 1, 0, 0},
		{"negative", 10, 1, 0, `{"prompt_tokens":-7,"completion_tokens":-1,"prompt_tokens_details":{"cached_tokens":9000000000000000000}}`, 0, 0, 1<<31 - 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := &manualClock{now: time.Unix(1_700_000_000, 0)}
			f := newFixture(t)
			withLifecycle(t, f, clk, nil)
			f.h.Logger = slog.New(slog.DiscardHandler)
			c := &call{h: f.h, req: &openai.Request{MaxTokens: tc.maxTokens}, seqs: tc.seqs, choices: tc.seqs, routed: clk.Now()}
			clk.advance(tc.elapsed)
			u, ok := openai.FindUsage([]byte(`{"usage":` + tc.in + `}`))
			if !ok {
				t.Fatal("no usage")
			}
			c.setUsage(u)
			if got := [3]int{c.usage.Prompt(), c.usage.Completion(), c.cached}; got != [3]int{tc.prompt, tc.complete, tc.cached} {
				t.Errorf("prompt, completion, cached = %v; want %v", got, [3]int{tc.prompt, tc.complete, tc.cached})
			}
		})
	}
}
