package simserver

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// FuzzCompletion sends arbitrary bodies to both completion endpoints: every answer is a
// well-formed success or OpenAI error, never a panic or a hang.
func FuzzCompletion(f *testing.F) {
	in, err := New(Options{Profile: "instant", MaxModelLen: 2048})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = in.Close() })
	h := in.Handler()
	for _, s := range []string{
		`{"model":"` + DefaultModel + `","messages":[{"role":"user","content":"hi"}],"max_tokens":3}`,
		`{"model":"` + DefaultModel + `","prompt":"hi","stream":true,"max_tokens":2,"stream_options":{"include_usage":true}}`,
		`{"model":"` + DefaultModel + `","prompt":[1,2,3],"max_tokens":9223372036854775807}`,
		`{"model":"` + DefaultModel + `","prompt":"x","max_tokens":-1,"cache_salt":"s"}`,
		`{"model":"` + DefaultModel + `","prompt":["a","bb","a"],"stream":true,"max_tokens":2,"stream_options":{"include_usage":true}}`,
		`{"model":"` + DefaultModel + `","prompt":[[1,2],[3],[1,2]],"max_tokens":1}`,
		`{"model":"` + DefaultModel + `","messages":[{"role":"user","content":[{"type":"text","text":"a"}]}]}`,
		`{`, `[]`, `null`,
	} {
		f.Add(s, true)
		f.Add(s, false)
	}
	f.Fuzz(func(t *testing.T, body string, chat bool) {
		path := "/v1/completions"
		if chat {
			path = "/v1/chat/completions"
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, path, strings.NewReader(body)))
		switch {
		case rec.Code == http.StatusOK:
			if strings.HasPrefix(rec.Header().Get("Content-Type"), "text/event-stream") {
				if !strings.HasSuffix(rec.Body.String(), "data: [DONE]\n\n") {
					t.Errorf("stream does not end with [DONE]: %q", rec.Body.String())
				}
			} else if !json.Valid(rec.Body.Bytes()) {
				t.Errorf("200 with a body that is not JSON: %q", rec.Body.String())
			}
		case rec.Code >= 400 && rec.Code < 500:
			var e struct {
				Error struct{ Message string }
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || e.Error.Message == "" {
				t.Errorf("status %d without an OpenAI error body: %q", rec.Code, rec.Body.String())
			}
		default:
			t.Errorf("status %d: %q", rec.Code, rec.Body.String())
		}
	})
}
