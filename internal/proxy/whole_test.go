package proxy

import (
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/metrics"
	"github.com/kvroute/kvroute/internal/policy"
)

// wholeAnswer is a non-streamed chat answer of about n bytes, its usage at the end as engines
// write it.
func wholeAnswer(n int) string {
	head := `{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"`
	tail := `"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1000,"completion_tokens":7,"prompt_tokens_details":{"cached_tokens":992}}}`
	return head + strings.Repeat("x", max(n-len(head)-len(tail), 0)) + tail
}

// sizedTransport answers every request with body, announcing its length or not (chunked).
type sizedTransport struct {
	body     string
	noLength bool
}

func (t sizedTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := cannedTransport{t.body}.RoundTrip(r)
	if err == nil && t.noLength {
		resp.ContentLength = -1
	}
	return resp, err
}

// discardWriter is a ResponseWriter that counts what is written and keeps none of it.
type discardWriter struct {
	h      http.Header
	status int
	n      int
}

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) WriteHeader(code int)        { w.status = code }
func (w *discardWriter) Write(b []byte) (int, error) { w.n += len(b); return len(b), nil }

// BenchmarkWholeAnswer is a non-streamed answer of 1 and 4 MiB through the Handler, the network
// taken out, its length announced or not: what the router allocates and copies to read it
// whole before relaying it.
func BenchmarkWholeAnswer(b *testing.B) {
	pool := endpoint.NewPool()
	if _, err := pool.Update([]endpoint.Spec{{Name: "http://127.0.0.1:1", Models: []string{"m"}, Engine: "vllm"}}); err != nil {
		b.Fatal(err)
	}
	req := `{"model":"m","messages":[{"role":"user","content":"hi"}]}`
	for _, size := range []int{1 << 20, 4 << 20} {
		for _, length := range []bool{true, false} {
			b.Run(fmt.Sprintf("size=%dMiB/length=%v", size>>20, length), func(b *testing.B) {
				pk, err := policy.New("least-request", nil, policy.Env{})
				if err != nil {
					b.Fatal(err)
				}
				answer := wholeAnswer(size)
				h := &Handler{Pool: pool, Picker: pk, Metrics: metrics.New(prometheus.NewRegistry()),
					Transport: sizedTransport{body: answer, noLength: !length}, Logger: slog.New(slog.DiscardHandler)}
				b.SetBytes(int64(len(answer)))
				b.ReportAllocs()
				for b.Loop() {
					w := &discardWriter{h: http.Header{}}
					h.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(req)))
					if w.status != 200 || w.n != len(answer) {
						b.Fatalf("status %d, %d bytes, want 200 and %d", w.status, w.n, len(answer))
					}
				}
			})
		}
	}
}

// wholeHandler is a Handler in front of one vLLM endpoint that answers every request with
// answer, its length announced as length (-1: not announced; another value than its length: a
// length that lies).
func wholeHandler(t testing.TB, answer string, length int64) *Handler {
	pool := endpoint.NewPool()
	if _, err := pool.Update([]endpoint.Spec{{Name: "http://127.0.0.1:1", Models: []string{"m"}, Engine: "vllm"}}); err != nil {
		t.Fatal(err)
	}
	pk, err := policy.New("least-request", nil, policy.Env{})
	if err != nil {
		t.Fatal(err)
	}
	return &Handler{Pool: pool, Picker: pk, Metrics: metrics.New(prometheus.NewRegistry()),
		Transport: lengthTransport{body: answer, length: length}, Logger: slog.New(slog.DiscardHandler)}
}

// lengthTransport answers every request with body and the Content-Length length.
type lengthTransport struct {
	body   string
	length int64
}

func (t lengthTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := cannedTransport{t.body}.RoundTrip(r)
	if err == nil {
		resp.ContentLength = t.length
	}
	return resp, err
}

// TestWholeAnswerRelayed: a whole answer of any size, its length announced or not (or wrongly),
// reaches the client byte for byte, and its usage is read, also past maxCapture (from its tail)
// and for sizes at the edges of the buffers it is read into.
func TestWholeAnswerRelayed(t *testing.T) {
	for _, size := range []int{300, maxPooledCapture - 1, maxPooledCapture, 100_000, 1 << minClass, 1 << 20, maxClassBuf - 1, maxCapture - 1, maxCapture, maxCapture + 5000} {
		answer := wholeAnswer(size)
		for _, length := range []int64{int64(len(answer)), -1, int64(len(answer)) / 2, int64(len(answer)) - 1} {
			h := wholeHandler(t, answer, length)
			for i := range 2 { // the second from pooled buffers
				w := &discardWriter{h: http.Header{}}
				h.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(chatBody)))
				if w.status != 200 || w.n != len(answer) {
					t.Fatalf("%d bytes, length %d, request %d: status %d, %d bytes", len(answer), length, i, w.status, w.n)
				}
			}
			if n := testutil.ToFloat64(h.Metrics.CompletionTokens.WithLabelValues("m")); n != 14 {
				t.Errorf("%d bytes, length %d: completion tokens %v, want 14 (7 a request): usage not read", len(answer), length, n)
			}
		}
	}
}

// TestWholeAnswerReadOnce: a whole answer is read into one buffer, which the relay writes and
// the usage is read from, taken from a pool: a 1 MiB answer whose length is announced allocates
// a small part of its size (it allocated six times its size when the capture kept a second copy
// of it and the buffer grew from 4 KiB).
func TestWholeAnswerReadOnce(t *testing.T) {
	answer := wholeAnswer(1 << 20)
	h := wholeHandler(t, answer, int64(len(answer)))
	serve := func() {
		w := &discardWriter{h: http.Header{}}
		h.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(chatBody)))
		if w.status != 200 || w.n != len(answer) {
			t.Fatalf("status %d, %d bytes", w.status, w.n)
		}
	}
	serve() // the pools fill
	const n = 8
	var m0, m1 runtime.MemStats
	runtime.GC() // a pooled buffer may have gone with the collector: then it is allocated once
	serve()
	runtime.ReadMemStats(&m0)
	for range n {
		serve()
	}
	runtime.ReadMemStats(&m1)
	// Under the race detector the pool drops a buffer now and then: a 2 MiB one (a class's)
	// allocated again at worst for every request, still far from six times the answer.
	limit, why := uint64(len(answer))/4, "a quarter of its size"
	if raceEnabled {
		limit, why = uint64(len(answer))*5/2, "2.5 times its size (race detector)"
	}
	if per := (m1.TotalAlloc - m0.TotalAlloc) / n; per > limit {
		t.Errorf("a %d-byte answer allocated %d bytes a request, want under %s", len(answer), per, why)
	}
}

// TestAnswerBufClasses: answerBuf's buffers hold the answer and a byte more (up to maxCapture),
// and go back to the pool they came from; those of the body classes full length again, as
// request bodies take them.
func TestAnswerBufClasses(t *testing.T) {
	for _, size := range []int64{-1, 0, 100, maxPooledCapture - 1, maxPooledCapture, 1 << minClass, 1<<minClass - 1, 1 << 20, maxCapture - 1, maxCapture, 1 << 30} {
		bp := answerBuf(size)
		if len(*bp) != 0 || size >= 0 && int64(cap(*bp)) < min(size+1, maxCapture) {
			t.Errorf("answerBuf(%d): len %d cap %d", size, len(*bp), cap(*bp))
		}
		*bp = append(*bp, "xyz"...)
		putCapture(bp)
		if c := cap(*bp); isClass(c) && len(*bp) != c {
			t.Errorf("answerBuf(%d): a buffer of class size %d given back with length %d", size, c, len(*bp))
		}
	}
}
