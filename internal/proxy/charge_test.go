package proxy

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/metrics"
	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/tenant"
	"github.com/kvroute/kvroute/internal/testlog"
)

// chargeLimit is the tokens per minute of the tenant the charge tests use: far more than they
// spend, so that nothing they send is refused.
const chargeLimit = 100000

// chargeGate is a gate with one tenant, t1 (key sk-1, chargeLimit tokens per minute), on a
// clock that stands still: its bucket holds exactly what was not charged.
func chargeGate(t *testing.T, m *metrics.TenantMetrics) *tenant.Gate {
	t.Helper()
	cfg, err := config.Parse([]byte("endpoints: [{url: \"http://127.0.0.1:1\"}]\nauth: {mode: api_key, secret_env: KVR_SECRET}\n" +
		"tenants: [{name: t1, api_keys: [\"" + tenant.HashKey("sk-1") + "\"], limits: {tokens_per_minute: " + strconv.Itoa(chargeLimit) + "}}]\n"))
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

// charged returns what t1 was charged in all, by its token counters, and what its bucket has
// lost (its limit less the tokens it has left).
func charged(t *testing.T, g *tenant.Gate, m *metrics.TenantMetrics) (prompt, completion, spent int) {
	t.Helper()
	id, oe := g.Authenticate(http.Header{"Authorization": {"Bearer sk-1"}})
	if oe != nil {
		t.Fatal(oe)
	}
	h := http.Header{}
	tk, oe := g.Take(id, tenant.Demand{}, h)
	if oe != nil {
		t.Fatal(oe)
	}
	tk.End(http.StatusOK, 0, 0)
	left, err := strconv.Atoi(h.Get("x-ratelimit-remaining-tokens"))
	if err != nil {
		t.Fatal(err)
	}
	return int(testutil.ToFloat64(m.PromptTokens.WithLabelValues("t1"))),
		int(testutil.ToFloat64(m.CompletionTokens.WithLabelValues("t1"))), chargeLimit - left
}

// startRequest sends body to the fixture with t1's key and returns the response (its head has
// come) and the function that hangs up.
func startRequest(t *testing.T, f *fixture, body string) (*http.Response, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, f.srv.URL+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer sk-1")
	resp, err := f.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp, cancel
}

// waitClosed waits for ch to close (an engine saw its client go).
func waitClosed(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatal(what)
	}
}

// A client that hangs up in the middle of a stream whose usage never came is charged its
// prompt's estimate and one completion token per content event it was sent (the role chunk
// carries none).
func TestChargeStreamClientLeft(t *testing.T) {
	const events = 5
	gone := make(chan struct{})
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		fl := w.(http.Flusher)
		io.WriteString(w, "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n")
		for i := range events {
			io.WriteString(w, "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t"+strconv.Itoa(i)+"\"}}]}\n\n")
			fl.Flush()
		}
		<-r.Context().Done() // the usage would come last: the client leaves before
		close(gone)
	}))
	t.Cleanup(engine.Close)
	f := newFixture(t, spec(engine.URL, "m"))
	f.h.Gate = chargeGate(t, f.h.Metrics.Tenant)

	resp, cancel := startRequest(t, f, `{"model":"m","stream":true,"messages":[{"role":"user","content":"tell me a long story"}]}`)
	rd := bufio.NewReader(resp.Body)
	for seen := 0; seen < events; {
		line, err := rd.ReadString('\n')
		if err != nil {
			t.Fatalf("after %d content events: %v", seen, err)
		}
		if strings.Contains(line, `"content":"t`) {
			seen++
		}
	}
	cancel()
	resp.Body.Close()
	waitClosed(t, gone, "the engine's request was not cancelled after the client left")
	f.wait(t)

	est := f.pk.reqs[0].PromptTokens
	prompt, completion, spent := charged(t, f.h.Gate, f.h.Metrics.Tenant)
	if prompt != est || completion != events || spent != est+events {
		t.Errorf("charged prompt %d, completion %d, bucket spent %d; want %d, %d, %d (the estimate, one per content event)",
			prompt, completion, spent, est, events, est+events)
	}
}

// A client that hangs up once its request has reached the engine, before the answer's head
// (every non-streamed request, which engines answer whole, and a stream before its first
// event), is charged its prompt's estimate: the engine computed it.
func TestChargeAbortedBeforeAnswer(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run("stream="+strconv.FormatBool(stream), func(t *testing.T) {
			got, gone := make(chan struct{}), make(chan struct{})
			engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				close(got)
				<-r.Context().Done()
				close(gone)
			}))
			t.Cleanup(engine.Close)
			f := newFixture(t, spec(engine.URL, "m"))
			f.h.Gate = chargeGate(t, f.h.Metrics.Tenant)

			body := `{"model":"m","stream":` + strconv.FormatBool(stream) + `,"messages":[{"role":"user","content":"` + strings.Repeat("word ", 700) + `"}]}`
			done := make(chan error, 1)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go func() {
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, f.srv.URL+"/v1/chat/completions", strings.NewReader(body))
				req.Header.Set("Authorization", "Bearer sk-1")
				resp, err := f.srv.Client().Do(req)
				if err == nil {
					resp.Body.Close()
				}
				done <- err
			}()
			waitClosed(t, got, "the engine never got the request")
			cancel()
			if err := <-done; err == nil {
				t.Fatal("the request succeeded although its client hung up before any answer")
			}
			waitClosed(t, gone, "the engine's request was not cancelled after the client left")
			f.wait(t)

			est := f.pk.reqs[0].PromptTokens
			if est < 700 {
				t.Fatalf("estimate %d tokens for a 700-word prompt", est)
			}
			prompt, completion, spent := charged(t, f.h.Gate, f.h.Metrics.Tenant)
			if prompt != est || completion != 0 || spent != est {
				t.Errorf("charged prompt %d, completion %d, bucket spent %d; want the estimate %d, 0, %d", prompt, completion, spent, est, est)
			}
			if n := testutil.ToFloat64(f.h.Metrics.Tenant.Requests.WithLabelValues("t1", "499")); n != 1 {
				t.Errorf("tenant requests with 499: %v, want 1", n)
			}
		})
	}
}

// A request that reached no engine costs nothing: the connection failed, or the engine refused
// it (503), the refusal relayed to the client.
func TestChargeNothingWhenRefused(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String()
	ln.Close() // nothing listens there: connections are refused
	busy := newFakeEngine(t)
	busy.status, busy.errBody = http.StatusServiceUnavailable, `{"error":{"message":"busy"}}`
	f := newFixture(t, spec(closed, "m"), spec(busy.srv.URL, "m"))
	f.h.Gate = chargeGate(t, f.h.Metrics.Tenant)
	resp, _ := f.post(t, "/v1/chat/completions", chatBody, "Authorization", "Bearer sk-1")
	if resp.StatusCode != http.StatusServiceUnavailable || len(busy.received()) != 1 {
		t.Fatalf("status %d, the busy engine got %d requests; want its 503 relayed, 1", resp.StatusCode, len(busy.received()))
	}
	if prompt, completion, spent := charged(t, f.h.Gate, f.h.Metrics.Tenant); prompt != 0 || completion != 0 || spent != 0 {
		t.Errorf("charged prompt %d, completion %d, bucket spent %d; want nothing", prompt, completion, spent)
	}
}

// Through an Exchange (a front end that carries the request, ext_proc), a request routed to an
// engine whose client leaves before any answer is charged its estimate too.
func TestChargeExchangeClientLeft(t *testing.T) {
	f := newFixture(t, spec("http://127.0.0.1:1", "m"))
	f.h.Gate = chargeGate(t, f.h.Metrics.Tenant)
	x := f.h.NewExchange("", "test")
	hdr, out := http.Header{"Authorization": {"Bearer sk-1"}}, http.Header{}
	if oe := x.Authenticate(hdr, out); oe != nil {
		t.Fatal(oe)
	}
	if oe := x.Prepare(context.Background(), openai.KindChat, []byte(chatBody), hdr, out, PrepareOptions{}); oe != nil {
		t.Fatal(oe)
	}
	if x.Call().Next() == nil {
		t.Fatal("no endpoint to send to")
	}
	x.Settle(499, http.MethodPost, "/v1/chat/completions")
	est := f.pk.reqs[0].PromptTokens
	if prompt, completion, spent := charged(t, f.h.Gate, f.h.Metrics.Tenant); prompt != est || completion != 0 || spent != est {
		t.Errorf("charged prompt %d, completion %d, bucket spent %d; want the estimate %d, 0, %d", prompt, completion, spent, est, est)
	}
}

// Through an Exchange, a stream that the router's shutdown cut after its engine's 200 is
// settled 503 (shutting_down), and charged all the same: the prompt's estimate and a completion
// token for each content event relayed. The engine's answer says whether it computed, not the
// status the request ends with.
func TestChargeExchangeShutdownCut(t *testing.T) {
	f := newFixture(t, spec("http://127.0.0.1:1", "m"))
	f.h.Gate = chargeGate(t, f.h.Metrics.Tenant)
	x := f.h.NewExchange("", "test")
	hdr, out := http.Header{"Authorization": {"Bearer sk-1"}}, http.Header{}
	if oe := x.Authenticate(hdr, out); oe != nil {
		t.Fatal(oe)
	}
	body := `{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}]}`
	if oe := x.Prepare(context.Background(), openai.KindChat, []byte(body), hdr, out, PrepareOptions{}); oe != nil {
		t.Fatal(oe)
	}
	if x.Call().Next() == nil {
		t.Fatal("no endpoint to send to")
	}
	x.Answered(http.StatusOK)
	for range 2 {
		if pass, _, _ := x.Event(openai.Event{Data: []byte(`{"choices":[{"index":0,"delta":{"content":"hi"}}]}`)}); !pass {
			t.Fatal("a content event was not passed on")
		}
	}
	x.Cut()
	x.Refused(shutdownError(x.RequestID()))
	x.Settle(http.StatusServiceUnavailable, http.MethodPost, "/v1/chat/completions")
	est := f.pk.reqs[0].PromptTokens
	if prompt, completion, spent := charged(t, f.h.Gate, f.h.Metrics.Tenant); prompt != est || completion != 2 || spent != est+2 {
		t.Errorf("charged prompt %d, completion %d, bucket spent %d; want the estimate %d, 2, %d", prompt, completion, spent, est, est+2)
	}
}

func TestContentEvent(t *testing.T) {
	for _, tc := range []struct {
		name, data string
		want       bool
	}{
		{"", `{"choices":[{"index":0,"delta":{"content":"hi"}}]}`, true},
		{"", `{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`, false},
		{"", `{"choices":[{"index":0,"delta": {"content" : "spaced"}}]}`, true},
		{"", `{"choices":[{"index":0,"delta":{"reasoning_content":"hmm"}}]}`, true},
		{"", `{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\""}}]}}]}`, true},
		{"", `{"choices":[{"index":0,"text":"once","logprobs":null}]}`, true},
		{"", `{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`, false},
		{"", `{"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":2}}`, false},
		{"", `{"choices":[{"index":0,"delta":{"content":null}}]}`, false},
		{"", `{"choices":[{"index":0,"delta":{"content":"","x":"say \"content\":\"no\""}}]}`, false},
		{"", `[DONE]`, false},
		{"response.output_text.delta", `{"type":"response.output_text.delta","delta":"hi"}`, true},
		{"", `{"type":"response.output_text.delta","delta":"hi"}`, true},
		{"response.created", `{"type":"response.created","response":{"output":[{"content":[{"text":"x"}]}]}}`, false},
		{"response.completed", `{"type":"response.completed","response":{"output":[{"content":[{"text":"x"}]}]}}`, false},
	} {
		if got := contentEvent(openai.Event{Name: tc.name, Data: []byte(tc.data)}); got != tc.want {
			t.Errorf("contentEvent(%q, %s) = %v, want %v", tc.name, tc.data, got, tc.want)
		}
	}
}

// hungEngine reads each request and never answers it: it waits for the router to give up.
func hungEngine(t *testing.T) *httptest.Server {
	t.Helper()
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		<-r.Context().Done()
	}))
	t.Cleanup(s.Close)
	return s
}

// An attempt that reached an engine and was given up for another (no answer within its
// timeout) is charged its prompt's estimate beside what the answer that came is charged: its
// engine may have computed the prefill. When every attempt timed out, each is charged.
func TestChargeAbandonedAttempts(t *testing.T) {
	slow := func(url string) endpoint.Spec {
		s := spec(url, "m")
		s.ResponseTimeout = 200 * time.Millisecond
		return s
	}
	t.Run("then answered", func(t *testing.T) {
		good := newFakeEngine(t) // usage: 10 prompt, 2 completion
		f := newFixture(t, slow(hungEngine(t).URL), spec(good.srv.URL, "m"))
		f.h.Gate = chargeGate(t, f.h.Metrics.Tenant)
		resp, body := f.post(t, "/v1/chat/completions", chatBody, "Authorization", "Bearer sk-1")
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d %s, want the second engine's 200", resp.StatusCode, body)
		}
		est := f.pk.reqs[0].PromptTokens
		if prompt, completion, spent := charged(t, f.h.Gate, f.h.Metrics.Tenant); prompt != 10+est || completion != 2 || spent != 12+est {
			t.Errorf("charged prompt %d, completion %d, bucket spent %d; want %d, 2, %d (the answer's usage and the abandoned attempt's estimate %d)",
				prompt, completion, spent, 10+est, 12+est, est)
		}
	})
	t.Run("every attempt timed out", func(t *testing.T) {
		f := newFixture(t, slow(hungEngine(t).URL), slow(hungEngine(t).URL))
		f.h.Gate = chargeGate(t, f.h.Metrics.Tenant)
		resp, body := f.post(t, "/v1/chat/completions", chatBody, "Authorization", "Bearer sk-1")
		if resp.StatusCode != http.StatusGatewayTimeout {
			t.Fatalf("status %d %s, want 504", resp.StatusCode, body)
		}
		// No answer came: beside the prompts, what the engines may have generated meanwhile
		// (call.generated): the 2 x 200 ms the attempts took at the default decode rate, at least.
		est := f.pk.reqs[0].PromptTokens
		least := int(0.4 * tenant.DefaultDecodeRate)
		if prompt, completion, spent := charged(t, f.h.Gate, f.h.Metrics.Tenant); prompt != 2*est || completion < least || completion > 10*least || spent != prompt+completion {
			t.Errorf("charged prompt %d, completion %d, bucket spent %d; want two estimates of %d and %d to %d completion tokens", prompt, completion, spent, est, least, 10*least)
		}
	})
}

// The access line says what the tenant was charged beside the engine's usage: the same
// tokens for an answer with its usage; nothing for a request an engine refused, whose line
// still carries the prompt's estimate as its prompt_tokens.
func TestAccessLogCharged(t *testing.T) {
	busy := newFakeEngine(t)
	busy.status, busy.errBody = http.StatusServiceUnavailable, `{"error":{"message":"busy"}}`
	for _, tc := range []struct {
		name                             string
		engine                           *fakeEngine
		status                           int
		prompt, completion               int // the engine's usage as logged; -1: the estimate
		chargedPrompt, chargedCompletion int // -1: the estimate
	}{
		{"answered", newFakeEngine(t), http.StatusOK, 10, 2, 10, 2},
		{"refused", busy, http.StatusServiceUnavailable, -1, 0, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, spec(tc.engine.srv.URL, "m"))
			f.h.Gate = chargeGate(t, f.h.Metrics.Tenant)
			var logs testlog.Buffer
			f.h.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
			if resp, body := f.post(t, "/v1/chat/completions", chatBody, "Authorization", "Bearer sk-1"); resp.StatusCode != tc.status {
				t.Fatalf("status %d %s, want %d", resp.StatusCode, body, tc.status)
			}
			var line map[string]any
			for _, l := range logs.JSONLines(t) {
				if l["msg"] == "request" {
					line = l
				}
			}
			est := f.pk.reqs[0].PromptTokens
			or := func(n int) float64 {
				if n < 0 {
					return float64(est)
				}
				return float64(n)
			}
			want := map[string]any{"tenant": "t1", "prompt_tokens": or(tc.prompt), "completion_tokens": float64(tc.completion),
				"charged_prompt_tokens": or(tc.chargedPrompt), "charged_completion_tokens": float64(tc.chargedCompletion)}
			got := map[string]any{}
			for k := range want {
				got[k] = line[k]
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("access line (-want +got):\n%s", diff)
			}
			if p, c, _ := charged(t, f.h.Gate, f.h.Metrics.Tenant); float64(p) != got["charged_prompt_tokens"] || float64(c) != got["charged_completion_tokens"] {
				t.Errorf("the tenant's counters say %d prompt and %d completion tokens charged; the access line %v and %v",
					p, c, got["charged_prompt_tokens"], got["charged_completion_tokens"])
			}
		})
	}
}
