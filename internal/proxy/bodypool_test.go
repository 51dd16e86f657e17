package proxy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/metrics"
)

// TestBodyClasses: a pooled body buffer holds what it was asked for, up to the longest body
// read whole (exactBody and the byte that sees EOF), and goes back when its last holder lets go.
func TestBodyClasses(t *testing.T) {
	for _, n := range []int{pooledBody + 1, 1 << minClass, 1<<minClass + 1, 400_001, exactBody + 1} {
		b := newHeldBody(n)
		c := cap(*b.buf)
		if c < n || c&(c-1) != 0 || c > 2*n+(1<<minClass) {
			t.Errorf("newHeldBody(%d): a buffer of %d bytes", n, c)
		}
		b.hold()
		b.release()
		if b.buf == nil {
			t.Fatalf("newHeldBody(%d): given back while still held", n)
		}
		b.release()
		if b.buf != nil {
			t.Errorf("newHeldBody(%d): not given back by its last holder", n)
		}
	}
}

// longChat is a chat body of about n bytes whose content has line breaks (so that the parser
// decodes it into its scratch) and starts with tag.
func longChat(tag string, n int, stream bool) []byte {
	text := tag + " " + strings.Repeat(strings.Repeat(tag+" lorem ipsum ", 20)+"\n\n", n/(20*(len(tag)+13)+2)+1)
	b, err := json.Marshal(map[string]any{"model": "m", "stream": stream, "messages": []any{
		map[string]any{"role": "system", "content": text}, map[string]any{"role": "user", "content": "hi " + tag}}})
	if err != nil {
		panic(err)
	}
	return b
}

// Long bodies, read into pooled buffers and parsed into pooled scratch, one request after the
// other: each reaches the engine as the client sent it, whatever the requests before it left
// in the memory they gave back.
func TestPooledBodiesReachTheEngine(t *testing.T) {
	e := newFakeEngine(t)
	f := newFixture(t, spec(e.srv.URL, "m"))
	var sent [][]byte
	for i, n := range []int{300 << 10, 100 << 10, 500 << 10, 300 << 10, 70 << 10} {
		body := longChat(fmt.Sprintf("r%d", i), n, false)
		sent = append(sent, body)
		resp, got := f.post(t, "/v1/chat/completions", string(body))
		if resp.StatusCode != 200 || !bytes.Contains(got, []byte(`"content":"hi"`)) {
			t.Fatalf("request %d: %d %.200s", i, resp.StatusCode, got)
		}
	}
	got := e.received()
	if len(got) != len(sent) {
		t.Fatalf("the engine got %d requests, want %d", len(got), len(sent))
	}
	for i := range sent {
		if !bytes.Equal(got[i], sent[i]) {
			t.Errorf("request %d: the engine got %d bytes starting %.40q, the client sent %d starting %.40q", i, len(got[i]), got[i], len(sent[i]), sent[i])
		}
	}
}

// keepingTransport answers at once and keeps each request's body unread, as a transport that
// sends it later might: it never says it is done with it (h1.MemBody.Sent).
type keepingTransport struct {
	mu     sync.Mutex
	bodies []io.ReadCloser
}

func (k *keepingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	k.mu.Lock()
	k.bodies = append(k.bodies, r.Body)
	k.mu.Unlock()
	const answer = `{"id":"c","choices":[],"usage":{"prompt_tokens":10,"completion_tokens":1}}`
	return &http.Response{StatusCode: 200, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: http.Header{"Content-Type": {"application/json"}}, Body: io.NopCloser(strings.NewReader(answer)),
		ContentLength: int64(len(answer)), Request: r}, nil
}

// A body that a transport still holds when the handler has finished is not reused by the
// requests after it: read after them, it is still the bytes its client sent.
func TestPooledBodyKeptByTransport(t *testing.T) {
	pool := endpoint.NewPool()
	if _, err := pool.Update([]endpoint.Spec{spec("http://127.0.0.1:1", "m")}); err != nil {
		t.Fatal(err)
	}
	kt := &keepingTransport{}
	h := &Handler{Pool: pool, Picker: &orderPicker{order: []string{"http://127.0.0.1:1"}},
		Metrics: metrics.New(prometheus.NewRegistry()), Logger: slog.New(slog.DiscardHandler), Transport: kt}
	var sent [][]byte
	for i := range 8 {
		body := longChat(fmt.Sprintf("k%d", i), 300<<10, false)
		sent = append(sent, body)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(body)))
		if rec.Code != 200 {
			t.Fatalf("request %d: %d %s", i, rec.Code, rec.Body)
		}
	}
	for i, b := range kt.bodies {
		got, err := io.ReadAll(b)
		if err != nil || !bytes.Equal(got, sent[i]) {
			t.Errorf("request %d: the kept body reads %d bytes starting %.40q (error %v), the client sent %d starting %.40q", i, len(got), got, err, len(sent[i]), sent[i])
		}
	}
}

// TestHugeBodyPooled: a body longer than exactBody (announced or not) is joined, once read,
// into a pooled buffer of its size's class, held until its holders let go, so that the next
// such body takes the same buffer instead of allocating its size again (a 15 MiB prompt's
// body was allocated anew for each request).
func TestHugeBodyPooled(t *testing.T) {
	want := bytes.Repeat([]byte("0123456789abcdef"), (3<<20)/16)
	for _, length := range []int64{int64(len(want)), -1} {
		read := func() ([]byte, *heldBody) {
			r, _ := http.NewRequest(http.MethodPost, "/v1/completions", struct{ io.Reader }{bytes.NewReader(want)})
			r.ContentLength = length
			body, held, oe := readBodyHeld(r, 16<<20, true)
			if oe != nil {
				t.Fatalf("length %d: %v", length, oe)
			}
			return body, held
		}
		body, held := read()
		if !bytes.Equal(body, want) {
			t.Fatalf("length %d: read %d bytes, not the body of %d", length, len(body), len(want))
		}
		if held == nil || !isClass(cap(body)) || &(*held.buf)[:1][0] != &body[:1][0] {
			t.Fatalf("length %d: a body of %d bytes read into a buffer of %d bytes that is not a pooled class's (held %v)", length, len(body), cap(body), held != nil)
		}
		held.release()
		if raceEnabled {
			continue // sync.Pool drops a share of what it is given back
		}
		// No collection meanwhile (it would empty the pools), and the least of three tries (a
		// goroutine moved to another P does not see what it gave back to the first's pool).
		gc := debug.SetGCPercent(-1)
		least := uint64(math.MaxUint64)
		for range 3 {
			var m0, m1 runtime.MemStats
			runtime.ReadMemStats(&m0)
			_, held = read()
			runtime.ReadMemStats(&m1)
			held.release()
			least = min(least, m1.TotalAlloc-m0.TotalAlloc)
		}
		debug.SetGCPercent(gc)
		if least > uint64(len(want))/4 {
			t.Errorf("length %d: reading the body again allocated %d bytes for a body of %d", length, least, len(want))
		}
	}
}

// TestHugeBodyExact: a body longer than the largest pooled class (maxClassBuf, 4 MiB) is read
// into a buffer of its size, held by no pool: in classes up to 16 MiB a 9 MiB body took a
// 16 MiB buffer, and the pools held 513 MiB after a burst of 32 such bodies and a collection.
func TestHugeBodyExact(t *testing.T) {
	if maxClassBuf > 4<<20 {
		t.Errorf("the largest pooled body buffer is %d bytes, want at most 4 MiB", maxClassBuf)
	}
	want := bytes.Repeat([]byte("0123456789abcdef"), (9<<20)/16)
	for _, length := range []int64{int64(len(want)), -1} {
		r, _ := http.NewRequest(http.MethodPost, "/v1/completions", struct{ io.Reader }{bytes.NewReader(want)})
		r.ContentLength = length
		body, held, oe := readBodyHeld(r, 16<<20, true)
		if oe != nil {
			t.Fatalf("length %d: %v", length, oe)
		}
		if !bytes.Equal(body, want) {
			t.Fatalf("length %d: read %d bytes, not the body of %d", length, len(body), len(want))
		}
		if held != nil || cap(body) != len(body) {
			t.Errorf("length %d: a body of %d bytes read into a buffer of %d (pooled %v), want one of its size, not pooled",
				length, len(body), cap(body), held != nil)
			if held != nil {
				held.release()
			}
		}
	}
}
