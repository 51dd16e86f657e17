package proxy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/metrics"
	"github.com/kvroute/kvroute/internal/policy"
	"github.com/kvroute/kvroute/internal/prefix"
	"github.com/kvroute/kvroute/internal/route"
	"github.com/kvroute/kvroute/internal/tenant"
)

// conversation returns a chat body of about tokens prompt tokens (4 bytes each, as the router
// estimates): a system prompt and alternating user and assistant turns of about 2,000 tokens
// each, as a long agent or chat session grows.
func conversation(tokens int) []byte {
	type message struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	word := "lorem ipsum dolor sit amet consectetur adipiscing elit "
	text := func(n, salt int) string {
		s := strings.Repeat(word, n*4/len(word)+1)[:n*4]
		return fmt.Sprintf("%d %s", salt, s)
	}
	msgs := []message{{"system", text(min(2000, tokens), 0)}}
	for left, k := tokens-2000, 1; left > 0; k++ {
		role := "user"
		if k%2 == 0 {
			role = "assistant"
		}
		n := min(2000, left)
		msgs = append(msgs, message{role, text(n, k)})
		left -= n
	}
	body, err := json.Marshal(map[string]any{"model": "m", "max_tokens": 1, "messages": msgs})
	if err != nil {
		panic(err)
	}
	return body
}

// BenchmarkHandlerLongContext is the router's own work on one chat request of 10k, 32k and 100k
// prompt tokens with the network taken out (read, parse, canonical text, normalise, hash,
// pick among 8 endpoints, forward, read usage, metrics, access log), prefix-aware with the
// conversation already in its index. Each request is the conversation so far plus one more
// short turn (64 turns, then it starts again), as a session's requests are. "plain" is that;
// "from-scratch" hashes every prompt whole, as the router did before prefix.Chains; "stream"
// asks for a stream without stream_options, which the router adds (the canned answer is JSON all
// the same; hashed whole too, as long4 measured it); "salt" and "stream-salt" are "plain" and
// "stream" sent with a tenant's key, so the router gives the body the tenant's cache_salt;
// "shared" is the live script's workload (scripts/longctx.sh): streamed requests that ask for
// usage, one user message each of a shared prefix and a question of its own (no prompt extends
// another; prefix.Chains takes the shared part's blocks from the first prompt's marks), the text
// with a double space every few blocks for the normalisation to collapse, no escapes; 160 bodies, so that a run of up to 159 requests (-benchtime 128x) sends
// none twice, as the script does not. "parts" is "plain" with each content an array of one text
// part, as many SDKs send text; "agent" a tool-using agent's session (agentSession: some 550
// messages at 100k tokens, each step a tool call and its result); "completion" is "plain" as
// /v1/completions requests, the contents one after the other as the prompt. Each
// mode can be run alone ('tokens=100000/salt$'): run together, a mode's figure depends on the
// garbage the ones before it left. cpu-ms/req is the process's CPU time (user + system, the
// garbage collector's included) per request.
func BenchmarkHandlerLongContext(b *testing.B) {
	pool := endpoint.NewPool()
	var specs []endpoint.Spec
	for i := range 8 {
		specs = append(specs, endpoint.Spec{Name: fmt.Sprintf("http://127.0.0.1:%d", 1+i), Models: []string{"m"}, Engine: "vllm", CacheSalt: true})
	}
	if _, err := pool.Update(specs); err != nil {
		b.Fatal(err)
	}
	for _, tokens := range []int{10_000, 32_000, 100_000} {
		bodies := growing(tokens, 64, false)
		for _, mode := range []string{"/plain", "/from-scratch", "/stream", "/salt", "/stream-salt", "/shared", "/parts", "/agent", "/completion"} {
			bodies := bodies
			switch {
			case strings.HasPrefix(mode, "/stream"):
				bodies = growing(tokens, 64, true)
			case mode == "/parts":
				bodies = withParts(bodies)
			case mode == "/agent":
				bodies = agentSession(tokens, 64)
			case mode == "/completion":
				bodies = asCompletion(bodies)
			}
			b.Run(fmt.Sprintf("tokens=%d%s", tokens, mode), func(b *testing.B) {
				if mode == "/shared" {
					// Built only when it runs: its 160 bodies, held from the start, would
					// grow the heap every other mode runs with, and so lower their figures.
					bodies = sharedPrefix(tokens, 160)
				}
				pk, err := policy.New("prefix-aware", nil, policy.Env{})
				if err != nil {
					b.Fatal(err)
				}
				keys := route.Keys{Chains: prefix.NewChains(1 << 20)}
				if mode == "/from-scratch" || strings.HasPrefix(mode, "/stream") {
					keys.Chains = nil
				}
				h := &Handler{Pool: pool, Picker: pk, Keys: keys, Metrics: metrics.New(prometheus.NewRegistry()),
					Transport: cannedTransport{fmt.Sprintf(`{"id":"c","choices":[],"usage":{"prompt_tokens":%d,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":%d}}}`, tokens, tokens-16)},
					Logger:    slog.New(slog.NewJSONHandler(io.Discard, nil))}
				salted := strings.HasSuffix(mode, "salt")
				if salted {
					h.Gate = tenantGate(b, h.Metrics.Tenant, `tenants: [{name: t1, api_keys: ["`+tenant.HashKey("sk-1")+`"]}]`)
				}
				serve := func(body []byte) {
					path := "/v1/chat/completions"
					if mode == "/completion" {
						path = "/v1/completions"
					}
					req := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body))
					if salted {
						req.Header.Set("Authorization", "Bearer sk-1")
					}
					rec := httptest.NewRecorder()
					h.ServeHTTP(rec, req)
					if rec.Code != 200 {
						b.Fatalf("status %d: %s", rec.Code, rec.Body)
					}
				}
				serve(bodies[0]) // the conversation's earlier turns are in the index
				b.ReportAllocs()
				b.SetBytes(int64(len(bodies[0])))
				cpu0 := cpuTime()
				i := 1
				for b.Loop() {
					serve(bodies[i%len(bodies)])
					i++
				}
				b.ReportMetric(float64(cpuTime()-cpu0)/float64(time.Millisecond)/float64(b.N), "cpu-ms/req")
			})
		}
	}
}

// sharedPrefix returns n streamed chat bodies that ask for usage, as kvroute bench sends them: one
// user message each, of a prefix of about tokens-2000 prompt tokens that all share and a question
// of 2,000 tokens of its own; a double space every 300 or so bytes.
func sharedPrefix(tokens, n int) [][]byte {
	words := strings.Fields("the of and to in is it that for on as with was by at be this from or an which are have")
	text := func(size int, salt uint64) string {
		var sb strings.Builder
		x := salt*0x9e3779b97f4a7c15 + 1
		for sb.Len() < size {
			x ^= x << 13
			x ^= x >> 7
			x ^= x << 17
			sb.WriteString(words[x%uint64(len(words))])
			sb.WriteByte(' ')
			if x%37 == 0 {
				sb.WriteByte(' ')
			}
		}
		return sb.String()[:size]
	}
	shared := text((tokens-2000)*4, 0)
	out := make([][]byte, n)
	for i := range out {
		body, err := json.Marshal(map[string]any{"model": "m", "max_tokens": 1, "stream": true,
			"stream_options": map[string]any{"include_usage": true},
			"messages":       []map[string]string{{"role": "user", "content": shared + text(8000, uint64(i+1))}}})
		if err != nil {
			panic(err)
		}
		out[i] = body
	}
	return out
}

// growing returns n chat bodies: a conversation of about tokens prompt tokens, then the same
// with one, two, ... more short user turns; with stream, streamed requests that do not ask for
// usage (the router adds stream_options.include_usage).
func growing(tokens, n int, stream bool) [][]byte {
	base := conversation(tokens)
	var msgs map[string]any
	if err := json.Unmarshal(base, &msgs); err != nil {
		panic(err)
	}
	if stream {
		msgs["stream"] = true
	}
	turns := msgs["messages"].([]any)
	out := make([][]byte, n)
	for i := range out {
		if i > 0 {
			turns = append(turns, map[string]any{"role": "user", "content": fmt.Sprintf("turn %d: and one more thing about that, please", i)})
		}
		msgs["messages"] = turns
		b, err := json.Marshal(msgs)
		if err != nil {
			panic(err)
		}
		out[i] = b
	}
	return out
}

// asCompletion returns chat bodies as completion requests whose prompt is the messages' contents
// one after the other.
func asCompletion(bodies [][]byte) [][]byte {
	return rewrite(bodies, func(v map[string]any) {
		var sb strings.Builder
		for _, m := range v["messages"].([]any) {
			sb.WriteString(m.(map[string]any)["content"].(string))
			sb.WriteString("\n")
		}
		delete(v, "messages")
		v["prompt"] = sb.String()
	})
}

// withParts returns bodies with every message's content as an array of one text part
// ([{"type": "text", "text": ...}]), as many SDKs and agent frameworks send it.
func withParts(bodies [][]byte) [][]byte {
	return rewrite(bodies, func(v map[string]any) {
		for _, m := range v["messages"].([]any) {
			m := m.(map[string]any)
			m["content"] = []any{map[string]any{"type": "text", "text": m["content"]}}
		}
	})
}

// rewrite returns the JSON bodies as edit changes them.
func rewrite(bodies [][]byte, edit func(map[string]any)) [][]byte {
	out := make([][]byte, len(bodies))
	for i, body := range bodies {
		var v map[string]any
		if err := json.Unmarshal(body, &v); err != nil {
			panic(err)
		}
		edit(v)
		b, err := json.Marshal(v)
		if err != nil {
			panic(err)
		}
		out[i] = b
	}
	return out
}

// agentSession returns n chat bodies of a tool-using agent's session of about tokens prompt
// tokens: a system prompt of 2,000 tokens and a tools list, then a user task and steps of an
// assistant message with one tool call (its JSON arguments) and the tool's result of 80 to 560
// tokens, about 180 tokens a message (550 messages at 100k tokens); each next body is the
// session plus one more step, as an agent's requests are.
func agentSession(tokens, n int) [][]byte {
	word := "lorem ipsum dolor sit amet consectetur adipiscing elit "
	text := func(n, salt int) string {
		s := strings.Repeat(word, n*4/len(word)+1)[:n*4]
		return fmt.Sprintf("%d %s", salt, s)
	}
	tools := []any{}
	for _, name := range []string{"read_file", "run_command", "search"} {
		tools = append(tools, map[string]any{"type": "function", "function": map[string]any{
			"name": name, "description": "does " + name,
			"parameters": map[string]any{"type": "object", "properties": map[string]any{"arg": map[string]any{"type": "string"}}}}})
	}
	msgs := []any{
		map[string]any{"role": "system", "content": text(2000, 0)},
		map[string]any{"role": "user", "content": text(200, 1)},
	}
	left := tokens - 2200
	step := func(k int) {
		id := fmt.Sprintf("call_%08d", k)
		args := fmt.Sprintf(`{"arg": "src/pkg%d/file%d.go", "lines": [1, %d]}`, k%7, k, 40+k%300)
		msgs = append(msgs,
			map[string]any{"role": "assistant", "content": nil, "tool_calls": []any{map[string]any{
				"id": id, "type": "function", "function": map[string]any{"name": "read_file", "arguments": args}}}},
			map[string]any{"role": "tool", "tool_call_id": id, "content": text(80+(k*97)%480, k)})
		left -= 40 + 80 + (k*97)%480
	}
	k := 2
	for ; left > 0; k++ {
		step(k)
	}
	out := make([][]byte, n)
	for i := range out {
		if i > 0 {
			step(k)
			k++
		}
		b, err := json.Marshal(map[string]any{"model": "m", "max_tokens": 1, "tools": tools, "messages": msgs})
		if err != nil {
			panic(err)
		}
		out[i] = b
	}
	return out
}

// cpuTime is the process's user plus system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
