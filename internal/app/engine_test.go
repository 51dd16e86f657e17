package app

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
)

// fakeEngine is an OpenAI-compatible engine on loopback that records the bodies it receives.
type fakeEngine struct {
	srv    *httptest.Server
	mu     sync.Mutex
	bodies [][]byte
	held   chan struct{} // when set with hold, closed once a stream has sent its first chunk
	hold   chan struct{} // streams wait on it after their first chunk
}

func newFakeEngine(t *testing.T) *fakeEngine {
	f := &fakeEngine{}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeEngine) received() [][]byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([][]byte(nil), f.bodies...)
}

func (f *fakeEngine) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet {
		if r.URL.Path == "/health" {
			return
		}
		http.NotFound(w, r)
		return
	}
	body, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	f.bodies = append(f.bodies, body)
	hold, held := f.hold, f.held
	f.mu.Unlock()
	var req struct {
		Stream bool `json:"stream"`
	}
	_ = json.Unmarshal(body, &req)
	usage := `{"prompt_tokens":10,"completion_tokens":2,"total_tokens":12,"prompt_tokens_details":{"cached_tokens":5}}`
	if !req.Stream {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}],"usage":%s}`, usage)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	fl := w.(http.Flusher)
	for i := range 2 {
		fmt.Fprintf(w, "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t%d\"}}]}\n\n", i)
		fl.Flush()
		if hold != nil && i == 0 {
			close(held)
			select {
			case <-hold:
			case <-r.Context().Done():
				return
			}
		}
	}
	fmt.Fprintf(w, "data: {\"id\":\"c1\",\"choices\":[],\"usage\":%s}\n\n", usage)
	io.WriteString(w, "data: [DONE]\n\n")
}

const chatBody = `{"model":"m","messages":[{"role":"user","content":"hello there"}],"vendor_field":{"keep":[1,"x"]}}`
