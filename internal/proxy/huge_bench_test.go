package proxy

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/metrics"
	"github.com/kvroute/kvroute/internal/policy"
)

// hugeText returns size bytes of prose, a line break every 80 or so bytes.
func hugeText(size int) string {
	words := strings.Fields("the of and to in is it that for on as with was by at be this from or an which are have")
	var sb strings.Builder
	sb.Grow(size + 16)
	for i := 0; sb.Len() < size; i++ {
		sb.WriteString(words[(i*7+i/13)%len(words)])
		if i%16 == 15 {
			sb.WriteByte('\n')
		} else {
			sb.WriteByte(' ')
		}
	}
	return sb.String()[:size]
}

// BenchmarkHandlerHugePrompt is the router's work on one request of a 15 MiB prompt (a chat
// message, a conversation of some 2,000 messages of 8,000 bytes, a completions prompt), with its Content-Length ("length") or without
// ("chunked"), the network taken out: B/op is what one request allocates, most of it the body
// read (readBodyHeld) and the canonical prompt text (openai.Request.AppendCanonical).
func BenchmarkHandlerHugePrompt(b *testing.B) {
	text := hugeText(15 << 20)
	chat, err := json.Marshal(map[string]any{"model": "m", "max_tokens": 1, "messages": []map[string]string{{"role": "user", "content": text}}})
	if err != nil {
		b.Fatal(err)
	}
	completion, err := json.Marshal(map[string]any{"model": "m", "max_tokens": 1, "prompt": text})
	if err != nil {
		b.Fatal(err)
	}
	var turns []map[string]string
	for at, k := 0, 0; at < len(text); at, k = at+8000, k+1 {
		role := "user"
		if k%2 == 1 {
			role = "assistant"
		}
		turns = append(turns, map[string]string{"role": role, "content": text[at:min(at+8000, len(text))]})
	}
	conversation, err := json.Marshal(map[string]any{"model": "m", "max_tokens": 1, "messages": turns})
	if err != nil {
		b.Fatal(err)
	}
	pool := endpoint.NewPool()
	if _, err := pool.Update([]endpoint.Spec{{Name: "http://127.0.0.1:1", Models: []string{"m"}, Engine: "vllm"}}); err != nil {
		b.Fatal(err)
	}
	for _, tc := range []struct {
		name, path string
		body       []byte
	}{{"chat", "/v1/chat/completions", chat}, {"conversation", "/v1/chat/completions", conversation}, {"completion", "/v1/completions", completion}} {
		for _, framing := range []string{"length", "chunked"} {
			b.Run(tc.name+"/"+framing, func(b *testing.B) {
				pk, err := policy.New("least-request", nil, policy.Env{})
				if err != nil {
					b.Fatal(err)
				}
				h := &Handler{Pool: pool, Picker: pk, Metrics: metrics.New(prometheus.NewRegistry()), MaxBodyBytes: 32 << 20,
					Transport: cannedTransport{`{"id":"c","choices":[],"usage":{"prompt_tokens":10,"completion_tokens":1}}`},
					Logger:    slog.New(slog.NewJSONHandler(io.Discard, nil))}
				b.SetBytes(int64(len(tc.body)))
				b.ReportAllocs()
				for b.Loop() {
					var body io.Reader = bytes.NewReader(tc.body)
					if framing == "chunked" {
						body = struct{ io.Reader }{body} // no length known
					}
					req := httptest.NewRequest(http.MethodPost, tc.path, body)
					rec := httptest.NewRecorder()
					h.ServeHTTP(rec, req)
					if rec.Code != 200 {
						b.Fatalf("status %d: %s", rec.Code, rec.Body)
					}
				}
			})
		}
	}
}
