package proxy

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/h1"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/metrics"
	"github.com/kvroute/kvroute/internal/policy"
)

// BenchmarkChat4K compares a 4 KB non-streamed chat request sent straight to an upstream with
// the same request through the Handler (same client, same loopback): the difference per op is
// the router's added latency on an idle machine.
func BenchmarkChat4K(b *testing.B) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"c","choices":[{"index":0,"message":{"role":"assistant","content":"x"}}],"usage":{"prompt_tokens":1000,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":992}}}`)
	}))
	defer up.Close()
	pool := endpoint.NewPool()
	if _, err := pool.Update([]endpoint.Spec{{Name: up.URL, Models: []string{"m"}, Engine: "vllm"}}); err != nil {
		b.Fatal(err)
	}
	pk, err := policy.New("least-request", nil, policy.Env{})
	if err != nil {
		b.Fatal(err)
	}
	tr := h1.New(DefaultTransport())
	defer tr.CloseIdleConnections()
	h := &Handler{Pool: pool, Picker: pk, Metrics: metrics.New(prometheus.NewRegistry()), Transport: tr,
		Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))}
	rt := httptest.NewServer(h)
	defer rt.Close()
	sys := strings.Repeat("You are a helpful assistant who answers briefly. ", 80)[:3900]
	body := fmt.Sprintf(`{"model":"m","max_tokens":1,"messages":[{"role":"system","content":%q},{"role":"user","content":"hi"}]}`, sys)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	defer client.CloseIdleConnections()
	for _, bc := range []struct{ name, url string }{{"direct", up.URL}, {"router", rt.URL}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				resp, err := client.Post(bc.url+"/v1/chat/completions", "application/json", strings.NewReader(body))
				if err != nil {
					b.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					b.Fatalf("status %d", resp.StatusCode)
				}
			}
		})
	}
}

// cannedTransport answers every request with the same JSON, without a network.
type cannedTransport struct{ body string }

func (c cannedTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	_, _ = io.Copy(io.Discard, r.Body)
	if m, ok := r.Body.(*h1.MemBody); ok {
		m.Sent() // done with it, as h1.Transport is when its RoundTrip returns
	}
	return &http.Response{
		StatusCode: 200, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header:        http.Header{"Content-Type": {"application/json"}},
		Body:          io.NopCloser(strings.NewReader(c.body)),
		ContentLength: int64(len(c.body)),
		Request:       r,
	}, nil
}

// BenchmarkHandlerOnly4K is the router's own work on a 4 KB chat request (parse, canonical
// text, normalise, hash, pick, forward, read usage, metrics, access log) with the network
// taken out: what the router adds besides one loopback hop.
func BenchmarkHandlerOnly4K(b *testing.B) {
	pool := endpoint.NewPool()
	if _, err := pool.Update([]endpoint.Spec{{Name: "http://127.0.0.1:1", Models: []string{"m"}, Engine: "vllm"}}); err != nil {
		b.Fatal(err)
	}
	for _, name := range []string{"least-request", "prefix-aware"} {
		b.Run(name, func(b *testing.B) {
			pk, err := policy.New(name, nil, policy.Env{})
			if err != nil {
				b.Fatal(err)
			}
			h := &Handler{Pool: pool, Picker: pk, Metrics: metrics.New(prometheus.NewRegistry()),
				Transport: cannedTransport{`{"id":"c","choices":[],"usage":{"prompt_tokens":1000,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":992}}}`},
				Logger:    slog.New(slog.NewJSONHandler(io.Discard, nil))}
			sys := strings.Repeat("You are a helpful assistant who answers briefly. ", 80)[:3900]
			body := fmt.Sprintf(`{"model":"m","max_tokens":1,"messages":[{"role":"system","content":%q},{"role":"user","content":"hi"}]}`, sys)
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body))
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				if rec.Code != 200 {
					b.Fatalf("status %d: %s", rec.Code, rec.Body)
				}
			}
		})
	}
}
