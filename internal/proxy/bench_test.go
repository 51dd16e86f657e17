package proxy

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/kvroute/kvroute/internal/h1"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/metrics"
	"github.com/kvroute/kvroute/internal/policy"
	"github.com/kvroute/kvroute/internal/tenant"
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
	rt := httptest.NewServer(benchHandler(b, up.URL))
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

// benchHandler is a Handler in front of one vLLM endpoint at url: least-request, the h1
// transport (whose idle connections close when the benchmark ends), metrics on a registry of
// its own, logs discarded.
func benchHandler(b *testing.B, url string) *Handler {
	pool := endpoint.NewPool()
	if _, err := pool.Update([]endpoint.Spec{{Name: url, Models: []string{"m"}, Engine: "vllm"}}); err != nil {
		b.Fatal(err)
	}
	pk, err := policy.New("least-request", nil, policy.Env{})
	if err != nil {
		b.Fatal(err)
	}
	tr := h1.New(DefaultTransport())
	b.Cleanup(tr.CloseIdleConnections)
	return &Handler{Pool: pool, Picker: pk, Metrics: metrics.New(prometheus.NewRegistry()), Transport: tr,
		Logger: slog.New(slog.NewJSONHandler(io.Discard, nil)), Instance: NewInstanceID()} // as kvroute serve runs it
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
				Logger:    slog.New(slog.NewJSONHandler(io.Discard, nil)), Instance: NewInstanceID()}
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

// streamAnswer is a streamed chat answer of n tokens as vLLM writes it with include_usage: a
// role chunk, n content chunks (the last with its finish_reason), the usage-only chunk and
// [DONE], one SSE event each.
// With everyChunk, every token's chunk carries the usage so far as well, as vLLM's
// stream_options.continuous_usage_stats has it.
func streamAnswer(n int, everyChunk bool) []string {
	head := `data: {"id":"chatcmpl-5f0c","object":"chat.completion.chunk","created":1733400000,"model":"m",`
	evs := []string{head + `"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}` + "\n\n"}
	for i := range n {
		finish := "null"
		if i == n-1 {
			finish = `"length"`
		}
		usage := ""
		if everyChunk {
			usage = fmt.Sprintf(`,"usage":{"prompt_tokens":1000,"total_tokens":%d,"completion_tokens":%d}`, 1001+i, i+1)
		}
		evs = append(evs, fmt.Sprintf(`%s"choices":[{"index":0,"delta":{"content":" tok%d"},"logprobs":null,"finish_reason":%s}]%s}`+"\n\n", head, i, finish, usage))
	}
	evs = append(evs, fmt.Sprintf(`%s"choices":[],"usage":{"prompt_tokens":1000,"total_tokens":%d,"completion_tokens":%d,"prompt_tokens_details":{"cached_tokens":992}}}`+"\n\n", head, 1000+n, n))
	return append(evs, "data: [DONE]\n\n")
}

// BenchmarkStream is a streamed chat answer of N tokens, one SSE event per token, from an
// upstream through the Handler: "burst" writes the whole answer at once (as the instant
// simulator does), "flush" flushes after every event (as an engine streams). The client did
// not ask for usage, so the router adds include_usage and drops the usage chunk. "usage" is
// "burst" from an engine that puts the usage so far in every token's chunk (vLLM's
// continuous_usage_stats), each of which the router must read and pass on without its usage
// (the client did not ask for it). B/token and
// allocs/token are the op's figures over N.
func BenchmarkStream(b *testing.B) {
	for _, mode := range []string{"burst", "flush", "usage"} {
		for _, n := range []int{2, 64, 256} {
			b.Run(fmt.Sprintf("%s/N=%d", mode, n), func(b *testing.B) { benchStream(b, n, mode == "flush", mode == "usage") })
		}
	}
}

// serveH1 serves h on a loopback port with h1.Server, the server `kvroute serve` runs (net/http's
// allocates per chunk it writes), until the benchmark ends; it returns the base URL.
func serveH1(b testing.TB, h http.Handler) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &h1.Server{Handler: h}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	b.Cleanup(func() {
		srv.Close()
		<-served
	})
	return "http://" + ln.Addr().String()
}

// rawEngine serves every request on a loopback port with the same chunked SSE answer, each
// event a chunk, written from bytes built once: all at once, or one write per event (flush).
// It allocates nothing per event, so that the benchmark's allocations are the router's (and
// the client's); a Go HTTP server allocates per chunk it writes. It returns the base URL.
func rawEngine(b *testing.B, evs []string, flush bool) string {
	head := []byte("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
	var chunks [][]byte
	for _, ev := range evs {
		chunks = append(chunks, fmt.Appendf(nil, "%x\r\n%s\r\n", len(ev), ev))
	}
	chunks = append(chunks, []byte("0\r\n\r\n"))
	whole := append(head, bytes.Join(chunks, nil)...)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	serve := func(c net.Conn) {
		defer wg.Done()
		defer c.Close()
		br := bufio.NewReader(c)
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			_, _ = io.Copy(io.Discard, req.Body)
			if !flush {
				if _, err := c.Write(whole); err != nil {
					return
				}
				continue
			}
			if _, err := c.Write(head); err != nil {
				return
			}
			for _, ch := range chunks {
				if _, err := c.Write(ch); err != nil {
					return
				}
			}
		}
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go serve(c)
		}
	}()
	b.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return "http://" + ln.Addr().String()
}

func benchStream(b *testing.B, n int, flush, everyChunk bool) {
	benchStreamWrapped(b, n, flush, everyChunk, nil)
}

// benchStreamWrapped is benchStream with the handler wrapped by wrap (nil: none), as
// `kvroute serve` wraps it in its Drain.
func benchStreamWrapped(b *testing.B, n int, flush, everyChunk bool, wrap func(http.Handler) http.Handler) {
	evs := streamAnswer(n, everyChunk)
	up := rawEngine(b, evs, flush)
	var h http.Handler = benchHandler(b, up)
	if wrap != nil {
		h = wrap(h)
	}
	rt := serveH1(b, h)
	body := fmt.Sprintf(`{"model":"m","max_tokens":%d,"stream":true,"messages":[{"role":"user","content":"hi"}]}`, n)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	defer client.CloseIdleConnections()
	// The usage chunk dropped, and the usage of every token's chunk (the client did not ask).
	plain := streamAnswer(n, false)
	want := len(strings.Join(plain, "")) - len(plain[len(plain)-2])
	b.ReportAllocs()
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	for b.Loop() {
		resp, err := client.Post(rt+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		got, _ := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || got != int64(want) {
			b.Fatalf("status %d, %d bytes, want 200 and %d", resp.StatusCode, got, want)
		}
	}
	runtime.ReadMemStats(&m1)
	perToken := float64(b.N) * float64(n)
	b.ReportMetric(float64(m1.TotalAlloc-m0.TotalAlloc)/perToken, "B/token")
	b.ReportMetric(float64(m1.Mallocs-m0.Mallocs)/perToken, "allocs/token")
}

// BenchmarkHandlerTenant4K is BenchmarkHandlerOnly4K/least-request with a tenant gate (an API
// key, requests, tokens per minute and concurrency limits, per-tenant metrics), for a chat
// request and a completions request of 4 KB each: the router's work on a request that takes
// and settles the tenant's limits.
func BenchmarkHandlerTenant4K(b *testing.B) {
	pool := endpoint.NewPool()
	if _, err := pool.Update([]endpoint.Spec{{Name: "http://127.0.0.1:1", Models: []string{"m"}, Engine: "vllm"}}); err != nil {
		b.Fatal(err)
	}
	sys := strings.Repeat("You are a helpful assistant who answers briefly. ", 80)[:3900]
	for _, bc := range []struct{ name, path, body string }{
		{"chat", "/v1/chat/completions", fmt.Sprintf(`{"model":"m","max_tokens":64,"messages":[{"role":"system","content":%q},{"role":"user","content":"hi"}]}`, sys)},
		{"completions", "/v1/completions", fmt.Sprintf(`{"model":"m","max_tokens":64,"n":2,"prompt":%q}`, sys)},
	} {
		b.Run(bc.name, func(b *testing.B) {
			pk, err := policy.New("least-request", nil, policy.Env{})
			if err != nil {
				b.Fatal(err)
			}
			m := metrics.New(prometheus.NewRegistry())
			h := &Handler{Pool: pool, Picker: pk, Metrics: m,
				Gate:      tenantGate(b, m.Tenant, `tenants: [{name: t1, api_keys: ["`+tenant.HashKey("sk-1")+`"], limits: {requests_per_minute: 1000000000, tokens_per_minute: 1000000000, max_concurrent: 100}}]`),
				Transport: cannedTransport{`{"id":"c","choices":[],"usage":{"prompt_tokens":1000,"completion_tokens":60,"prompt_tokens_details":{"cached_tokens":992}}}`},
				Logger:    slog.New(slog.NewJSONHandler(io.Discard, nil)), Instance: NewInstanceID()}
			b.ReportAllocs()
			b.SetBytes(int64(len(bc.body)))
			for b.Loop() {
				req := httptest.NewRequest(http.MethodPost, bc.path, strings.NewReader(bc.body))
				req.Header.Set("Authorization", "Bearer sk-1")
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				if rec.Code != 200 {
					b.Fatalf("status %d: %s", rec.Code, rec.Body)
				}
			}
		})
	}
}
