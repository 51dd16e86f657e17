package proxy

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/metrics"
	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/policy"
)

// handler4K is BenchmarkHandlerOnly4K/least-request's handler, its access lines given to
// logger, and its 4 KB chat request.
func handler4K(b *testing.B, logger *slog.Logger) (*Handler, string) {
	pool := endpoint.NewPool()
	if _, err := pool.Update([]endpoint.Spec{{Name: "http://127.0.0.1:1", Models: []string{"m"}, Engine: "vllm"}}); err != nil {
		b.Fatal(err)
	}
	pk, err := policy.New("least-request", nil, policy.Env{})
	if err != nil {
		b.Fatal(err)
	}
	h := &Handler{Pool: pool, Picker: pk, Metrics: metrics.New(prometheus.NewRegistry()),
		Transport: cannedTransport{`{"id":"c","choices":[],"usage":{"prompt_tokens":1000,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":992}}}`},
		Logger:    logger, Instance: NewInstanceID()}
	sys := strings.Repeat("You are a helpful assistant who answers briefly. ", 80)[:3900]
	return h, fmt.Sprintf(`{"model":"m","max_tokens":1,"messages":[{"role":"system","content":%q},{"role":"user","content":"hi"}]}`, sys)
}

// serve4K sends body to h until the benchmark ends.
func serve4K(b *testing.B, h http.Handler, body string) { serve4KIn(b, context.Background(), h, body) }

// serve4KIn is serve4K with each request's context derived from ctx, as a server's BaseContext
// makes it.
func serve4KIn(b *testing.B, ctx context.Context, h http.Handler, body string) {
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/v1/chat/completions", strings.NewReader(body))
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != 200 {
			b.Fatalf("status %d: %s", rec.Code, rec.Body)
		}
	}
}

// BenchmarkHandlerDrain4K is BenchmarkHandlerOnly4K/least-request as `kvroute serve` runs the
// handler, in its Drain, each request's context derived from the drain's BaseContext as the
// server makes it ("drain"), or under a server that does not ("own-context": Wrap gives each
// request a context of its own), beside the handler alone ("bare"): what the drain adds to a
// request. (After the signal, the server itself closes each connection after its answer: the
// handler does nothing more.)
func BenchmarkHandlerDrain4K(b *testing.B) {
	for _, mode := range []string{"bare", "drain", "own-context"} {
		b.Run(mode, func(b *testing.B) {
			h, body := handler4K(b, slog.New(slog.NewJSONHandler(io.Discard, nil)))
			ctx := context.Background()
			var hh http.Handler = h
			if mode != "bare" {
				d := NewDrain()
				hh = d.Wrap(h)
				if mode == "drain" {
					ctx = d.BaseContext(nil)
				}
			}
			serve4KIn(b, ctx, hh, body)
		})
	}
}

// BenchmarkStreamDrain is BenchmarkStream/flush/N=64 with the handler in a Drain, as `kvroute
// serve` runs it, beside the handler alone: what the drain adds to each write of a stream.
func BenchmarkStreamDrain(b *testing.B) {
	b.Run("bare", func(b *testing.B) { benchStreamWrapped(b, 64, true, false, nil) })
	b.Run("drain", func(b *testing.B) { benchStreamWrapped(b, 64, true, false, NewDrain().Wrap) })
}

// BenchmarkHandlerAccessLog4K is BenchmarkHandlerOnly4K/least-request with the access log on
// (JSON, discarded) and off (log.access: false, under which the router's logger refuses info
// records): what the access line costs, and what is left of it when it is off.
func BenchmarkHandlerAccessLog4K(b *testing.B) {
	for _, mode := range []string{"on", "off"} {
		b.Run(mode, func(b *testing.B) {
			opts := &slog.HandlerOptions{}
			if mode == "off" {
				opts.Level = slog.LevelWarn
			}
			h, body := handler4K(b, slog.New(slog.NewJSONHandler(io.Discard, opts)))
			serve4K(b, h, body)
		})
	}
}

// BenchmarkSettle is the end of a request that no endpoint was picked for (a parsed chat
// request, fields removed, the client's address and id known), its access line on and off
// (log.access: false): the line's own cost, apart from the request's.
func BenchmarkSettle(b *testing.B) {
	for _, mode := range []string{"on", "off"} {
		b.Run(mode, func(b *testing.B) {
			opts := &slog.HandlerOptions{}
			if mode == "off" {
				opts.Level = slog.LevelWarn
			}
			h, body := handler4K(b, slog.New(slog.NewJSONHandler(io.Discard, opts)))
			h.once.Do(h.init)
			req, oe := parse(openai.KindChat, []byte(body), nil)
			if oe != nil {
				b.Fatal(oe)
			}
			c := &call{h: h, rid: "0123456789abcdef", start: time.Now(), req: req, model: "m", cached: -1, timingsCached: -1,
				remote: "127.0.0.1:50000", clientRID: "client-id", removed: []string{"logprobs", "top_logprobs"}, stream: true}
			b.ReportAllocs()
			for b.Loop() {
				c.settle(http.StatusOK, http.MethodPost, "/v1/chat/completions")
			}
		})
	}
}
