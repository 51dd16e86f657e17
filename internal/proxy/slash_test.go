package proxy

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// An API path with a trailing slash is answered as vLLM's server answers it: 307 (the method
// and the body kept) to the path without the slash, relative so that a prefix a proxy in front
// removed is kept; a client that follows redirects is served, one that does not reads an OpenAI
// error naming the path. The ext_proc front end, which cannot redirect, gets a 404 naming it
// (Resolve). Other unknown paths are refused as before.
func TestTrailingSlash(t *testing.T) {
	e := newFakeEngine(t)
	f := newFixture(t, spec(e.srv.URL, "m"))
	noFollow := &http.Client{Timeout: 20 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	tests := []struct {
		method, path string
		status       int
		location     string // "" for none
		names        string // what the message must say
	}{
		{"POST", "/v1/chat/completions/", 307, "../completions", "the path is /v1/chat/completions, without the trailing slash"},
		{"POST", "/v1/completions/", 307, "../completions", "the path is /v1/completions"},
		{"POST", "/v1/embeddings/", 307, "../embeddings", "the path is /v1/embeddings"},
		{"POST", "/v1/responses/?stream=1", 307, "../responses?stream=1", "the path is /v1/responses"},
		{"GET", "/v1/models/", 307, "../models", "the path is /v1/models"},
		{"POST", "/v1/nothing/", 404, "", "kvroute serves /v1/chat/completions"},
		{"POST", "/v1/chat/completions//", 404, "", "kvroute serves /v1/chat/completions"},
		{"POST", "/v1/chat/", 404, "", "kvroute serves /v1/chat/completions"},
	}
	for _, tt := range tests {
		req, err := http.NewRequest(tt.method, f.srv.URL+tt.path, strings.NewReader(chatBody))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := noFollow.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		f.wait(t)
		var v struct {
			Error struct {
				Message string `json:"message"`
				Code    string `json:"code"`
			} `json:"error"`
		}
		if err := json.Unmarshal(body, &v); err != nil || v.Error.Code != "unknown_url" || !strings.Contains(v.Error.Message, tt.names) {
			t.Errorf("%s %s: body %s, want an unknown_url error saying %q (%v)", tt.method, tt.path, body, tt.names, err)
		}
		if resp.StatusCode != tt.status || resp.Header.Get("Location") != tt.location {
			t.Errorf("%s %s: %d Location %q, want %d %q", tt.method, tt.path, resp.StatusCode, resp.Header.Get("Location"), tt.status, tt.location)
		}
	}
	if n := len(e.received()); n != 0 {
		t.Fatalf("the engine received %d requests before any was followed, want 0", n)
	}

	// Go's client, as the OpenAI SDKs, follows the 307 with the body: the request is served.
	resp, err := f.srv.Client().Post(f.srv.URL+"/v1/chat/completions/", "application/json", strings.NewReader(chatBody))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	f.wait(t)
	f.wait(t)
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"content":"hi"`) {
		t.Errorf("followed: %d %s, want the engine's answer", resp.StatusCode, body)
	}
	if got := e.received(); len(got) != 1 || string(got[0]) != chatBody {
		t.Errorf("the engine received %q, want the client's body once", got)
	}

	// Through Resolve (the ext_proc front end): a 404 that names the path.
	if _, _, oe := Resolve(http.MethodPost, "/v1/chat/completions/"); oe == nil || oe.Status != 404 ||
		!strings.Contains(oe.Message, "the path is /v1/chat/completions, without the trailing slash") {
		t.Errorf("Resolve: %+v, want a 404 naming /v1/chat/completions", oe)
	}
}
