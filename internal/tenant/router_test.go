package tenant_test

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/app"
	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/tenant"
)

// TestRouterTenantMetrics checks the wiring: the router gives its gate the router's tenant
// metrics, so /metrics on the admin handler shows a tenant's requests, refusals and the
// tokens its engine reported.
func TestRouterTenantMetrics(t *testing.T) {
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"c1","object":"chat.completion","model":"m",`+
			`"choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],`+
			`"usage":{"prompt_tokens":11,"completion_tokens":3,"total_tokens":14}}`)
	}))
	defer engine.Close()
	r := acmeRouter(t, engine.URL)
	api := r.Handler()
	for _, key := range []string{"sk-acme", "sk-wrong"} {
		req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions",
			strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hello"}]}`))
		req.Header.Set("Authorization", "Bearer "+key)
		w := httptest.NewRecorder()
		api.ServeHTTP(w, req)
		if want := map[string]int{"sk-acme": 200, "sk-wrong": 401}[key]; w.Code != want {
			t.Fatalf("key %s: status %d, want %d: %s", key, w.Code, want, w.Body)
		}
	}
	w := httptest.NewRecorder()
	r.AdminHandler().ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	body := w.Body.String()
	for _, line := range []string{
		`kvroute_tenant_requests_total{status="200",tenant="acme"} 1`,
		`kvroute_tenant_requests_total{status="401",tenant=""} 1`,
		`kvroute_tenant_rejections_total{reason="invalid_api_key",tenant=""} 1`,
		`kvroute_tenant_prompt_tokens_total{tenant="acme"} 11`,
		`kvroute_tenant_completion_tokens_total{tenant="acme"} 3`,
		`kvroute_tenant_queue_wait_seconds_count{tenant="acme"} 1`,
	} {
		if !strings.Contains(body, "\n"+line+"\n") {
			t.Errorf("/metrics lacks %s", line)
		}
	}
}

// TestRouterTenantStream: with the tenant metrics on, a stream through the gate still goes out
// event by event (the gate's status recorder passes flushes on), and is counted.
func TestRouterTenantStream(t *testing.T) {
	release := make(chan struct{})
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		chunk := `{"id":"c1","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"content":"%s"}}]}`
		fmt.Fprintf(w, "data: "+chunk+"\n\n", "a")
		w.(http.Flusher).Flush()
		select {
		case <-release: // the client has read the first event
		case <-time.After(10 * time.Second):
		}
		fmt.Fprintf(w, "data: "+chunk+"\n\n", "b")
		fmt.Fprint(w, `data: {"id":"c1","object":"chat.completion.chunk","model":"m","choices":[],"usage":{"prompt_tokens":7,"completion_tokens":2,"total_tokens":9}}`+"\n\n")
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	defer engine.Close()
	r := acmeRouter(t, engine.URL)
	api := httptest.NewServer(r.Handler())
	defer api.Close()
	req, _ := http.NewRequest(http.MethodPost, api.URL+"/v1/chat/completions",
		strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"hello"}]}`))
	req.Header.Set("Authorization", "Bearer sk-acme")
	client := &http.Client{Timeout: 20 * time.Second}
	// The headers and the first event must arrive while the engine holds the rest back.
	type result struct {
		resp  *http.Response
		sc    *bufio.Scanner
		first string
		err   error
	}
	got := make(chan result, 1)
	go func() {
		resp, err := client.Do(req)
		if err != nil {
			got <- result{err: err}
			return
		}
		res := result{resp: resp, sc: bufio.NewScanner(resp.Body)}
		for res.sc.Scan() {
			if strings.HasPrefix(res.sc.Text(), "data: ") {
				res.first = res.sc.Text()
				break
			}
		}
		got <- res
	}()
	var res result
	select {
	case res = <-got:
	case <-time.After(5 * time.Second):
		close(release)
		t.Fatal("no first event while the engine held the rest back: the stream was not flushed")
	}
	close(release)
	if res.err != nil {
		t.Fatal(res.err)
	}
	defer res.resp.Body.Close()
	if res.resp.StatusCode != http.StatusOK || !strings.Contains(res.first, `"content":"a"`) {
		t.Fatalf("status %d, first event %q; want 200 and the first chunk", res.resp.StatusCode, res.first)
	}
	sc := res.sc
	for sc.Scan() {
	}
	res.resp.Body.Close()
	// The router counts when the handler returns, which may be just after the client read
	// the end: poll with a deadline.
	want := []string{`kvroute_tenant_requests_total{status="200",tenant="acme"} 1`,
		`kvroute_tenant_prompt_tokens_total{tenant="acme"} 7`, `kvroute_tenant_completion_tokens_total{tenant="acme"} 2`}
	deadline := time.Now().Add(5 * time.Second)
	for {
		w := httptest.NewRecorder()
		r.AdminHandler().ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/metrics", nil))
		var missing []string
		for _, line := range want {
			if !strings.Contains(w.Body.String(), "\n"+line+"\n") {
				missing = append(missing, line)
			}
		}
		if len(missing) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("/metrics lacks %q", missing)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// acmeRouter is a router with API-key auth, one tenant "acme" (key sk-acme) and one endpoint
// serving model m at url; it is closed when the test ends.
func acmeRouter(t *testing.T, url string) *app.Router {
	t.Helper()
	t.Setenv("KVR_ROUTER_TEST_SECRET", "0123456789abcdef0123456789abcdef")
	cfg, err := config.Parse([]byte(`auth: {mode: api_key, secret_env: KVR_ROUTER_TEST_SECRET}
tenants: [{name: acme, api_keys: ["` + tenant.HashKey("sk-acme") + `"]}]
endpoints: [{url: "` + url + `", models: [m]}]
`))
	if err != nil {
		t.Fatal(err)
	}
	r, err := app.NewRouter(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return r
}
