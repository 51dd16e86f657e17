package proxy

import (
	"encoding/json"
	"io"
	"net/http"
	"testing"

	"github.com/kvroute/kvroute/internal/h1"
)

type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }

// TestBodyTimeoutIs408: a body the API server gave up on (its body timeout) is answered 408
// with an OpenAI error body, and reaches no engine.
func TestBodyTimeoutIs408(t *testing.T) {
	e := newFakeEngine(t)
	f := newFixture(t, spec(e.srv.URL, "m"))
	f.inner = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Body = io.NopCloser(errReader{h1.ErrBodyReadTimeout})
		f.h.ServeHTTP(w, r)
	})
	resp, body := f.post(t, "/v1/chat/completions", chatBody)
	var v struct {
		Error struct {
			Code *string `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &v); err != nil || resp.StatusCode != http.StatusRequestTimeout || v.Error.Code == nil || *v.Error.Code != "request_timeout" {
		t.Errorf("got %d %s (%v); want 408 with code request_timeout", resp.StatusCode, body, err)
	}
	if n := len(e.received()); n != 0 {
		t.Errorf("engine received %d requests, want none", n)
	}
}
