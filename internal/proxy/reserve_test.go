package proxy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/route"
	"github.com/kvroute/kvroute/internal/tenant"
)

// A tenant's requests reserve their expected completion at admission, not their prompt
// alone: 8 requests of max_tokens 4000 sent at once by a tenant of 10,000 tokens a minute that
// has had no answer yet reserve 4000 each and the prompt's estimate, so 2 go to the engine and
// 6 are refused with 429, Retry-After and rate_limit_exceeded. Before, all 8 were admitted on
// their prompts' estimates and generated 32,000 tokens before any was charged.
func TestReservationBoundsBurst(t *testing.T) {
	const workers, maxTokens = 8, 4000
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
		fmt.Fprintf(w, `{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"x"}}],"usage":{"prompt_tokens":5,"completion_tokens":%d,"total_tokens":%d}}`, maxTokens, maxTokens+5)
	}))
	t.Cleanup(engine.Close)
	f := newFixture(t, spec(engine.URL, "m"))
	f.h.Gate = tenantGate(t, f.h.Metrics.Tenant, `tenants: [{name: t1, api_keys: ["`+tenant.HashKey("sk-1")+`"], limits: {tokens_per_minute: 10000}}]`)

	type result struct {
		status           int
		retryAfter, code string
	}
	results := make(chan result, workers)
	var wg sync.WaitGroup
	defer func() { close(release); wg.Wait() }()
	body := `{"model":"m","max_tokens":` + strconv.Itoa(maxTokens) + `,"messages":[{"role":"user","content":"write a long story"}]}`
	for range workers {
		wg.Go(func() {
			req, _ := http.NewRequest(http.MethodPost, f.srv.URL+"/v1/chat/completions", strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer sk-1")
			resp, err := f.srv.Client().Do(req)
			if err != nil {
				results <- result{}
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			var e struct {
				Error struct{ Code string } `json:"error"`
			}
			_ = json.Unmarshal(b, &e)
			results <- result{resp.StatusCode, resp.Header.Get("Retry-After"), e.Error.Code}
		})
	}
	// Each request either reaches the engine (and waits there) or is answered at once.
	admitted, refused := 0, 0
	timeout := time.After(10 * time.Second)
	for admitted+refused < workers {
		select {
		case <-arrived:
			admitted++
		case r := <-results:
			if r.status != http.StatusTooManyRequests || r.retryAfter == "" || r.code != "rate_limit_exceeded" {
				t.Errorf("a request answered %d (Retry-After %q, code %q) before any answer was released; want 429 with Retry-After, rate_limit_exceeded",
					r.status, r.retryAfter, r.code)
			}
			refused++
		case <-timeout:
			t.Fatalf("after 10 s: %d requests at the engine, %d refused, of %d", admitted, refused, workers)
		}
	}
	if admitted != 2 || refused != 6 {
		t.Errorf("%d requests reached the engine and %d were refused; want 2 and 6 (4000 tokens reserved each of 10,000)", admitted, refused)
	}
}

// A request reserves its max_tokens for each choice, however short the tenant's answers have
// been; one without max_tokens reserves what its answers had per choice, at least 1024
// (x-ratelimit-remaining-tokens shows the reservation on a clock that stands still).
func TestReservationLearnt(t *testing.T) {
	var mu sync.Mutex
	completion := 300
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		mu.Lock()
		c := completion
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"x"},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":%d,"total_tokens":%d}}`, c, c+5)
	}))
	t.Cleanup(engine.Close)
	f := newFixture(t, spec(engine.URL, "m"))
	f.h.Gate = chargeGate(t, f.h.Metrics.Tenant)
	// reserved sends a request of n choices and max_tokens (0: none), and returns what it
	// reserved for its completion: what the bucket had before, less what it had once the
	// request was admitted, less the prompt's estimate.
	reserved := func(n, maxTokens int) int {
		t.Helper()
		_, _, before := charged(t, f.h.Gate, f.h.Metrics.Tenant)
		body := fmt.Sprintf(`{"model":"m","n":%d,"messages":[{"role":"user","content":"a story"}]`, n)
		if maxTokens > 0 {
			body += fmt.Sprintf(`,"max_tokens":%d`, maxTokens)
		}
		resp, b := f.post(t, "/v1/chat/completions", body+"}", "Authorization", "Bearer sk-1")
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d %s", resp.StatusCode, b)
		}
		left, err := strconv.Atoi(resp.Header.Get("x-ratelimit-remaining-tokens"))
		if err != nil {
			t.Fatal(err)
		}
		return chargeLimit - before - left - f.pk.reqs[len(f.pk.reqs)-1].PromptTokens
	}
	if got := reserved(2, 0); got != 2*tenant.MinReservedCompletion {
		t.Errorf("2 choices without max_tokens, before any answer: %d reserved, want %d", got, 2*tenant.MinReservedCompletion)
	}
	// That answer had 300 completion tokens for its 2 choices: 150 each.
	if got := reserved(1, 4000); got != 4000 {
		t.Errorf("max_tokens 4000 after answers of 150 tokens a choice: %d reserved, want 4000", got)
	}
	mu.Lock()
	completion = 6000
	mu.Unlock()
	if got := reserved(2, 0); got != 2*tenant.MinReservedCompletion {
		t.Errorf("2 choices without max_tokens after answers of 300 tokens: %d reserved, want %d", got, 2*tenant.MinReservedCompletion)
	}
	// That answer had 3000 tokens a choice.
	if got := reserved(2, 0); got != 2*3000 {
		t.Errorf("2 choices without max_tokens after an answer of 3000 tokens a choice: %d reserved, want 6000", got)
	}
	if got := reserved(1, 100); got != 100 {
		t.Errorf("max_tokens 100: %d reserved, want 100", got)
	}
}

// best_of, in a completions request, is bounded as n is (at most 128, an integer: a 400
// naming it, before the engine) wherever its name is found as an engine reads it: escaped,
// or the last of two.
func TestBestOfBounded(t *testing.T) {
	e := newFakeEngine(t)
	f := newFixture(t, spec(e.srv.URL, "m"))
	for _, tc := range []struct {
		field string // the body's best_of member(s)
		ok    bool
	}{
		{`"best_of":128`, true},
		{`"best_of":null`, true},
		{`"best_of":1`, true},
		{`"best_of":129`, false},
		{`"best_of":100000000000000000000000`, false},
		{`"best\u005fof":129`, false},
		{`"best_of":129,"best_of":2`, true},
		{`"best_of":2,"best_of":129`, false},
		{`"best_of":0`, false},
		{`"best_of":-3`, false},
		{`"best_of":2.0`, false},
		{`"best_of":"129"`, false},
		{`"best_of":[129]`, false},
		{`"Best_Of":129`, true}, // not best_of to an engine that reads names as written
	} {
		before := len(e.received())
		resp, body := f.post(t, "/v1/completions", `{"model":"m","prompt":"once upon a time",`+tc.field+`}`)
		sent := len(e.received()) - before
		if tc.ok {
			if resp.StatusCode != http.StatusOK || sent != 1 {
				t.Errorf("%s: %d %s, sent %d; want 200, sent once", tc.field, resp.StatusCode, body, sent)
			}
			continue
		}
		var v struct {
			Error struct {
				Param *string `json:"param"`
			} `json:"error"`
		}
		if err := json.Unmarshal(body, &v); err != nil || resp.StatusCode != http.StatusBadRequest || v.Error.Param == nil || *v.Error.Param != "best_of" || sent != 0 {
			t.Errorf("%s: %d %s, sent %d; want 400 with param best_of, nothing sent", tc.field, resp.StatusCode, body, sent)
		}
	}
}

// best_of k above n generates k sequences for each prompt: the request reserves k expected
// completions, and is charged k/n times the completion tokens the engine's usage counts (vLLM
// counts the n sequences it returns), or, when its answer never came, k sequences' estimate.
// Before, best_of was charged as one sequence.
func TestBestOfCharged(t *testing.T) {
	clk := &manualClock{now: time.Unix(1_700_000_000, 0)}
	arrived, gone := make(chan struct{}, 1), make(chan struct{}, 1)
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if bytes.Contains(b, []byte("hang")) {
			clk.advance(5 * time.Second) // generating, for 5 s, when the client leaves
			arrived <- struct{}{}
			<-r.Context().Done()
			gone <- struct{}{}
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"c","object":"text_completion","choices":[{"index":0,"text":"x","finish_reason":"length"}],"usage":{"prompt_tokens":5,"completion_tokens":50,"total_tokens":55}}`)
	}))
	t.Cleanup(engine.Close)
	f := newFixture(t, spec(engine.URL, "m"))
	withLifecycle(t, f, clk, nil)
	f.h.Gate = chargeGate(t, f.h.Metrics.Tenant)

	_, _, spentBefore := charged(t, f.h.Gate, f.h.Metrics.Tenant)
	resp, body := f.post(t, "/v1/completions", `{"model":"m","prompt":"once","best_of":4,"max_tokens":50}`, "Authorization", "Bearer sk-1")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d %s", resp.StatusCode, body)
	}
	est := f.pk.reqs[len(f.pk.reqs)-1].PromptTokens
	if left, _ := strconv.Atoi(resp.Header.Get("x-ratelimit-remaining-tokens")); chargeLimit-spentBefore-left != est+4*50 {
		t.Errorf("reserved %d tokens, want %d (the prompt's %d and 4 x max_tokens 50)", chargeLimit-spentBefore-left, est+4*50, est)
	}
	_, completion, _ := charged(t, f.h.Gate, f.h.Metrics.Tenant)
	if completion != 4*50 {
		t.Errorf("charged %d completion tokens for best_of 4 whose answer counts 50 (its one choice), want 200", completion)
	}

	postAndLeaveTo(t, f, "/v1/completions", `{"model":"m","prompt":"hang","best_of":3,"max_tokens":1000}`, arrived, gone, "Authorization", "Bearer sk-1")
	_, after, _ := charged(t, f.h.Gate, f.h.Metrics.Tenant)
	if got, want := after-completion, 3*5*int(tenant.DefaultDecodeRate); got != want {
		t.Errorf("charged %d completion tokens for best_of 3 left after 5 s, want %d (3 sequences at the default rate)", got, want)
	}
}

// The decode rates learnt from an endpoint's answers outlive a config reload, which builds a
// new Handler on the same pool and gate (internal/app): a request left after the reload is
// charged at the rate learnt before it. Before, the new handler started from the default.
func TestDecodeRateKeptAcrossReload(t *testing.T) {
	const learnt = `{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"x"}}],"usage":{"prompt_tokens":5,"completion_tokens":300,"total_tokens":305}}`
	clk := &manualClock{now: time.Unix(1_700_000_000, 0)}
	arrived, gone := make(chan struct{}, 1), make(chan struct{}, 1)
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if bytes.Contains(b, []byte("learn")) {
			clk.advance(3 * time.Second) // 300 tokens in 3 s: 100 a second
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, learnt)
			return
		}
		clk.advance(5 * time.Second)
		arrived <- struct{}{}
		<-r.Context().Done()
		gone <- struct{}{}
	}))
	t.Cleanup(engine.Close)
	f := newFixture(t, spec(engine.URL, "m"))
	withLifecycle(t, f, clk, nil)
	f.h.Gate = chargeGate(t, f.h.Metrics.Tenant)
	for range 3 {
		if resp, body := f.post(t, "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"learn"}]}`, "Authorization", "Bearer sk-1"); resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d %s", resp.StatusCode, body)
		}
	}

	// The reload: a new handler and lifecycle, the same pool, gate and metrics.
	old := f.h
	lc, err := route.New(route.Config{Picker: f.pk, Attempts: 3, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	f.h = &Handler{Pool: old.Pool, Lifecycle: lc, Gate: old.Gate, Metrics: old.Metrics, Logger: old.Logger, Transport: old.Transport}
	f.inner = f.h

	_, before, _ := charged(t, f.h.Gate, f.h.Metrics.Tenant)
	postAndLeave(t, f, `{"model":"m","max_tokens":10000,"messages":[{"role":"user","content":"a long story"}]}`, arrived, gone, "Authorization", "Bearer sk-1")
	_, after, _ := charged(t, f.h.Gate, f.h.Metrics.Tenant)
	if got := after - before; got != 5*100 {
		t.Errorf("after the reload, a request left after 5 s was charged %d completion tokens; want 500 (the 100 a second learnt before it; %d at the default rate)",
			got, 5*int(tenant.DefaultDecodeRate))
	}
}
