package proxy

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/route"
	"github.com/kvroute/kvroute/internal/tenant"
)

// overrunChunk is one chat chunk carrying a token of text.
func overrunChunk(i int) string {
	return fmt.Sprintf("data: {\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" tok%d\"},\"finish_reason\":null}]}\n\n", i)
}

// endlessEngine streams token chunks, 10 to a write, until its client goes (at most 100,000
// chunks, so that a router that relays without end fails the test rather than hangs it), and
// tells how many it wrote on sent. whole, when set, answers a request that is not a stream
// instead.
func endlessEngine(t *testing.T, whole func(w http.ResponseWriter, r *http.Request)) (url string, sent chan int) {
	sent = make(chan int, 16)
	srv := engine(t, func(w http.ResponseWriter, r *http.Request) {
		if whole != nil && r.Header.Get("X-Whole") != "" {
			whole(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		bw := bufio.NewWriter(w)
		i := 0
		for ; i < 100_000; i++ {
			if _, err := bw.WriteString(overrunChunk(i)); err != nil {
				break
			}
			if i%10 == 9 {
				if bw.Flush() != nil {
					break
				}
				w.(http.Flusher).Flush()
				if r.Context().Err() != nil {
					break
				}
			}
		}
		sent <- i
	})
	return srv.URL, sent
}

// overrunGate is a gate with tenant t1 (key sk-1, chargeLimit tokens per minute) and, where
// maxOut is positive, limits.max_output_tokens maxOut, on a clock that stands still.
func overrunGate(t *testing.T, f *fixture, maxOut int) *tenant.Gate {
	t.Helper()
	limits := "tokens_per_minute: " + strconv.Itoa(chargeLimit)
	if maxOut > 0 {
		limits += ", max_output_tokens: " + strconv.Itoa(maxOut)
	}
	cfg, err := config.Parse([]byte("endpoints: [{url: \"http://127.0.0.1:1\"}]\nauth: {mode: api_key, secret_env: KVR_SECRET}\n" +
		"tenants: [{name: t1, api_keys: [\"" + tenant.HashKey("sk-1") + "\"], limits: {" + limits + "}}]\n"))
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

// contentEvents counts the data events of a stream's body that carry text, and returns its
// last event.
func contentEventsIn(body []byte) (n int, last string) {
	for ev := range strings.SplitSeq(strings.TrimSpace(string(body)), "\n\n") {
		if strings.Contains(ev, `"content":" tok`) {
			n++
		}
		last = ev
	}
	return n, last
}

// TestEngineIgnoresMaxTokens: an engine that streams without end whatever max_tokens says.
// Before, the client got everything the engine sent (the QA's: 558 MB in 5 s for max_tokens
// 5), the tenant was charged one token per event (3.6 million) and locked out for an hour,
// and the endpoint answered 200. Now the stream is cut after 2 x max_tokens x n + 16 content
// events with an SSE error event naming the engine's fault, the engine's connection is closed,
// the request is settled 502 upstream_bad_answer against the endpoint (a server error, as a bad
// answer), the tenant is charged at most max_tokens x n, and its next request is served. The
// bound is the tenant's max_output_tokens where the request sets none.
func TestEngineIgnoresMaxTokens(t *testing.T) {
	for _, tc := range []struct {
		name   string
		maxOut int    // the tenant's max_output_tokens (0: none)
		fields string // the request's bound
		bound  int    // max_tokens x n
	}{
		{"max_tokens", 0, `"max_tokens":5`, 5},
		{"max_tokens and n", 0, `"max_tokens":5,"n":3`, 15},
		{"max_completion_tokens", 0, `"max_completion_tokens":7`, 7},
		{"the tenant's max_output_tokens", 6, ``, 6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url, sent := endlessEngine(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				_, _ = io.WriteString(w, `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"a"}}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`)
			})
			f := newFixture(t, spec(url, "m"))
			hl := &healthLog{}
			withLifecycle(t, f, nil, hl)
			logs := jsonLogger(f)
			f.h.Gate = overrunGate(t, f, tc.maxOut)
			body := `{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}]` + strings.TrimSuffix(","+tc.fields, ",") + `}`
			resp, got := f.post(t, "/v1/chat/completions", body, "Authorization", "Bearer sk-1")
			n, last := contentEventsIn(got)
			if want := 2*tc.bound + 16; resp.StatusCode != http.StatusOK || n != want {
				t.Errorf("got %d with %d content events (%d bytes); want 200 and the %d events within the bound", resp.StatusCode, n, len(got), want)
			}
			if !strings.HasPrefix(last, "event: error") || !strings.Contains(last, `"code":"upstream_bad_answer"`) || !strings.Contains(last, "ignored max_tokens") {
				t.Errorf("the stream's last event is %q; want an error event upstream_bad_answer saying the engine ignored max_tokens", last)
			}
			select {
			case wrote := <-sent:
				if wrote >= 100_000 {
					t.Errorf("the engine wrote all of its %d chunks: its connection was not closed", wrote)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the engine never saw its client go")
			}
			line := lastAccess(t, logs)
			if line["status"] != float64(502) || line["error_code"] != "upstream_bad_answer" || line["charged_completion_tokens"] != float64(tc.bound) {
				t.Errorf("access line: status %v, error_code %v, charged_completion_tokens %v; want 502, upstream_bad_answer, %d",
					line["status"], line["error_code"], line["charged_completion_tokens"], tc.bound)
			}
			if failed, _ := hl.told(); !slices.Equal(failed, []route.Failure{route.FailStatus}) {
				t.Errorf("the endpoint was told %v; want one %v (a bad answer)", failed, route.FailStatus)
			}
			if !strings.Contains(logs.String(), `"msg":"the engine ignored max_tokens`) {
				t.Errorf("no WARN line for the overrun: %s", logs.String())
			}
			resp, got = f.post(t, "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":1}`,
				"Authorization", "Bearer sk-1", "X-Whole", "1")
			if resp.StatusCode != http.StatusOK {
				t.Errorf("the tenant's next request: %d %s; want it served", resp.StatusCode, got)
			}
		})
	}
}

// TestChargeWithinMaxTokens: what the router counts of a stream (a token per content event)
// is charged at most max_tokens x n, even where the stream stays within the cut's margin: 20
// events for max_tokens 5 (an engine that ignores it, or one that sends empty-looking
// events) were charged 20.
func TestChargeWithinMaxTokens(t *testing.T) {
	eng := engine(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range 20 {
			_, _ = io.WriteString(w, overrunChunk(i))
		}
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	})
	f := newFixture(t, spec(eng.URL, "m"))
	logs := jsonLogger(f)
	f.h.Gate = overrunGate(t, f, 0)
	resp, got := f.post(t, "/v1/chat/completions", `{"model":"m","stream":true,"max_tokens":5,"messages":[{"role":"user","content":"x"}]}`,
		"Authorization", "Bearer sk-1")
	if n, _ := contentEventsIn(got); resp.StatusCode != http.StatusOK || n != 20 {
		t.Fatalf("got %d with %d content events; want 200 with all 20 (within the margin)", resp.StatusCode, n)
	}
	line := lastAccess(t, logs)
	if line["status"] != float64(200) || line["charged_completion_tokens"] != float64(5) || line["completion_tokens"] != float64(20) {
		t.Errorf("access line: status %v, completion_tokens %v, charged_completion_tokens %v; want 200, 20 relayed, 5 charged",
			line["status"], line["completion_tokens"], line["charged_completion_tokens"])
	}
}

// TestNoMaxTokensNoBound: without max_tokens and without a tenant's cap nothing is bounded: a
// long stream (500 events) and a long answer (3 MiB) pass whole, charged what they had.
func TestNoMaxTokensNoBound(t *testing.T) {
	long := strings.Repeat("a", 3<<20)
	eng := engine(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Whole") != "" {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"%s"}}],"usage":{"prompt_tokens":3,"completion_tokens":7000,"total_tokens":7003}}`, long)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range 500 {
			_, _ = io.WriteString(w, overrunChunk(i))
		}
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	})
	f := newFixture(t, spec(eng.URL, "m"))
	logs := jsonLogger(f)
	f.h.Gate = overrunGate(t, f, 0)
	resp, got := f.post(t, "/v1/chat/completions", streamBody, "Authorization", "Bearer sk-1")
	if n, _ := contentEventsIn(got); resp.StatusCode != http.StatusOK || n != 500 || !strings.HasSuffix(string(got), "data: [DONE]\n\n") {
		t.Errorf("stream: %d with %d content events; want 200 with all 500 and [DONE]", resp.StatusCode, n)
	}
	if line := lastAccess(t, logs); line["status"] != float64(200) || line["charged_completion_tokens"] != float64(500) {
		t.Errorf("stream's access line: status %v, charged_completion_tokens %v; want 200, 500", line["status"], line["charged_completion_tokens"])
	}
	resp, got = f.post(t, "/v1/chat/completions", chatBody, "Authorization", "Bearer sk-1", "X-Whole", "1")
	if resp.StatusCode != http.StatusOK || !bytes.Contains(got, []byte(long)) {
		t.Errorf("whole answer: %d, %d bytes; want 200 with the whole answer", resp.StatusCode, len(got))
	}
}

// TestWholeAnswerIgnoresMaxTokens: a whole answer far longer than max_tokens can produce (the
// QA's engine sent 1 GiB, with its Content-Length and without, for max_tokens 50). One that
// announces its length is answered 502 upstream_bad_answer before anything goes out; one of
// unknown length that passes the bound within the first part the router holds likewise; one
// that passes it later is cut there (the client's answer ends short: nothing else can be
// said after a 200), and each is settled 502 against the endpoint, charged at most max_tokens.
func TestWholeAnswerIgnoresMaxTokens(t *testing.T) {
	for _, tc := range []struct {
		name      string
		maxTokens int // the bound: 1 MiB + the body + 32 KiB a token (8: some 1.25 MiB; 200: 7.25 MiB)
		announce  bool
		size      int64
		wantHead  int // the client's status
	}{
		{"announced", 8, true, 1 << 30, http.StatusBadGateway},
		{"unannounced, within what the router holds", 8, false, 3 << 20, http.StatusBadGateway},
		{"unannounced, past what the router holds", 200, false, 64 << 20, http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			maxTokens := tc.maxTokens
			bound := int64(answerBaseBytes + answerTokenBytes*maxTokens)
			whole := func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				if tc.announce {
					w.Header().Set("Content-Length", strconv.FormatInt(tc.size, 10))
				}
				_, _ = io.WriteString(w, `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"`)
				blk := strings.Repeat("a", 64<<10)
				for n := int64(0); n < tc.size; n += int64(len(blk)) {
					if _, err := io.WriteString(w, blk); err != nil {
						return
					}
				}
			}
			url, _ := endlessEngine(t, whole)
			f := newFixture(t, spec(url, "m"))
			hl := &healthLog{}
			withLifecycle(t, f, nil, hl)
			logs := jsonLogger(f)
			f.h.Gate = overrunGate(t, f, 0)
			body := `{"model":"m","max_tokens":` + strconv.Itoa(maxTokens) + `,"messages":[{"role":"user","content":"x"}]}`
			req, err := http.NewRequest(http.MethodPost, f.srv.URL+"/v1/chat/completions", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Authorization", "Bearer sk-1")
			req.Header.Set("X-Whole", "1")
			resp, err := f.srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			got, rerr := io.ReadAll(resp.Body)
			resp.Body.Close()
			f.wait(t)
			if resp.StatusCode != tc.wantHead {
				t.Errorf("status %d; want %d", resp.StatusCode, tc.wantHead)
			}
			switch {
			case tc.wantHead == http.StatusBadGateway:
				if errorCode(got) != codeBadAnswer || !bytes.Contains(got, []byte("ignored max_tokens")) {
					t.Errorf("body %.300s; want an upstream_bad_answer error saying the engine ignored max_tokens", got)
				}
			case rerr == nil || int64(len(got)) > bound+int64(len(body)):
				t.Errorf("the client read %d bytes (err %v); want the answer cut short of %d bytes", len(got), rerr, bound+int64(len(body)))
			}
			line := lastAccess(t, logs)
			if line["status"] != float64(502) || line["error_code"] != codeBadAnswer || line["charged_completion_tokens"].(float64) > float64(maxTokens) {
				t.Errorf("access line: status %v, error_code %v, charged_completion_tokens %v; want 502, %s, at most %d",
					line["status"], line["error_code"], line["charged_completion_tokens"], codeBadAnswer, maxTokens)
			}
			if failed, _ := hl.told(); !slices.Equal(failed, []route.Failure{route.FailStatus}) {
				t.Errorf("the endpoint was told %v; want one %v (a bad answer)", failed, route.FailStatus)
			}
		})
	}
}

// TestMaxAnswerBytesAsksPrompt: the bound of a whole answer is off only where the request asks
// for its prompt back, at its top level as an engine reads it (echo not false, prompt_logprobs
// not null; a name escaped counts); a tool schema's property "echo", or the word in a prompt,
// left the answer unbounded (R1 review).
func TestMaxAnswerBytesAsksPrompt(t *testing.T) {
	const msgs = `"messages":[{"role":"user","content":"x"}]`
	for _, tc := range []struct {
		body    string
		bounded bool
	}{
		{`{"model":"m",` + msgs + `}`, true},
		{`{"model":"m","prompt":"x","echo":true}`, false},
		{`{"model":"m","prompt":"x","echo":1}`, false},
		{`{"model":"m","prompt":"x","\u0065cho":true}`, false},
		{`{"model":"m","prompt":"x","prompt_logprobs":0}`, false},
		{`{"model":"m","prompt":"x","echo":false}`, true},
		{`{"model":"m","prompt":"x","echo":null,"prompt_logprobs":null}`, true},
		{`{"model":"m","tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"echo":{"type":"boolean"}}}}}],` + msgs + `}`, true},
		{`{"model":"m","messages":[{"role":"user","content":"say \"echo\" and \"prompt_logprobs\""}]}`, true},
		{`{"model":"m","extra":{"echo":true},` + msgs + `}`, true},
	} {
		c := &call{req: &openai.Request{MaxTokens: 8}, body: []byte(tc.body)}
		if got := c.maxAnswerBytes() > 0; got != tc.bounded {
			t.Errorf("%s: bounded %v (%d), want %v", tc.body, got, c.maxAnswerBytes(), tc.bounded)
		}
	}
}
