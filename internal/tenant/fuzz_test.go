package tenant

import (
	"net/http"
	"strings"
	"testing"
)

// FuzzMiddleware feeds arbitrary key headers and bodies to the gate: it must answer 200, 401
// or 429 with an OpenAI error body (400 multiple_api_keys when the two headers carry different
// keys), never panic.
func FuzzMiddleware(f *testing.F) {
	f.Add("Bearer k", "", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
	f.Add("bearer  k ", "k", `{"model":"m","prompt":["a","b"]}`)
	f.Add("Basic x", "k", `{"model":`)
	f.Add("Bearer k", "other", `{"model":"m","prompt":"a"}`)
	f.Add("", "", strings.Repeat("[", 1000))
	f.Fuzz(func(t *testing.T, authz, apiKey, body string) {
		g, _ := newTestGate(t, "tenants: [{name: a, api_keys: [\""+HashKey("k")+"\"], limits: {tokens_per_minute: 1000, requests_per_minute: 1000000}}]\n", nil)
		e := &echo{}
		w := do(middleware(g, e), map[string]string{"Authorization": authz, "Api-Key": apiKey}, body)
		switch w.Code {
		case http.StatusOK:
			if len(e.ids) != 1 || e.ids[0].Name != "a" {
				t.Fatalf("200 without the tenant's identity: %v", e.ids)
			}
		case http.StatusUnauthorized, http.StatusTooManyRequests:
			decodeErr(t, w)
		case http.StatusBadRequest:
			if e := decodeErr(t, w); e.Error.Code == nil || *e.Error.Code != CodeMultipleKeys {
				t.Fatalf("400 %+v: want code %s", e.Error, CodeMultipleKeys)
			}
		default:
			t.Fatalf("status %d", w.Code)
		}
	})
}
