package tenant

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// countingReader counts the reads of a request body.
type countingReader struct {
	strings.Reader
	reads int
}

func (r *countingReader) Read(p []byte) (int, error) {
	r.reads++
	return r.Reader.Read(p)
}

// TestAnnouncedTooLargeNotRead: with a token limit the gate reads the body to estimate it, but
// not one whose announced length is over limits.max_body_bytes: the handler refuses that at
// once, without waiting for a body it will not take.
func TestAnnouncedTooLargeNotRead(t *testing.T) {
	g, _ := newTestGate(t, "tenants: [{name: a, api_keys: [\""+HashKey("k")+"\"], limits: {tokens_per_minute: 6000}}]\n", nil)
	body := &countingReader{Reader: *strings.NewReader(chat("hi"))}
	readBefore := -1
	h := g.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		readBefore = body.reads
		w.WriteHeader(http.StatusRequestEntityTooLarge)
	}))
	r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", body)
	r.ContentLength = 10_000_000_000
	r.Header.Set("Authorization", "Bearer k")
	h.ServeHTTP(httptest.NewRecorder(), r)
	if readBefore != 0 {
		t.Errorf("the gate read the body %d times before the handler (want 0; -1: the handler did not run)", readBefore)
	}
}
