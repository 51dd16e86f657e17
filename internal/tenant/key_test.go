package tenant

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestSalt(t *testing.T) {
	secret := []byte("0123456789abcdef0123456789abcdef")
	// Computed independently: hmac.new(secret, b"acme", hashlib.sha256).hexdigest() in Python.
	const want = "d8ad00265ff0a302d72247bcd296954337283c37fd952e4402787e655458b2ae"
	if got := Salt(secret, "acme"); got != want {
		t.Errorf("Salt = %s, want %s", got, want)
	}
	if Salt(secret, "acme") == Salt(secret, "acme2") {
		t.Error("two tenants got the same salt")
	}
	if Salt(secret, "acme") == Salt([]byte("another secret of thirty-two b.."), "acme") {
		t.Error("two secrets gave the same salt")
	}
}

func TestKeyFromHeader(t *testing.T) {
	tests := []struct {
		name     string
		h        http.Header
		want     string
		multiple bool
	}{
		{"bearer", http.Header{"Authorization": {"Bearer sk-1"}}, "sk-1", false},
		{"bearer lowercase scheme", http.Header{"Authorization": {"bearer   sk-1 "}}, "sk-1", false},
		{"api-key", http.Header{"Api-Key": {"sk-2"}}, "sk-2", false},
		{"both, the same key", http.Header{"Authorization": {"Bearer sk-1"}, "Api-Key": {" sk-1"}}, "sk-1", false},
		{"both, different keys", http.Header{"Authorization": {"Bearer sk-1"}, "Api-Key": {"sk-2"}}, "", true},
		{"two authorizations", http.Header{"Authorization": {"Bearer sk-1", "Bearer sk-2"}}, "", true},
		{"two equal authorizations", http.Header{"Authorization": {"Bearer sk-1", "Bearer sk-1"}}, "", true},
		{"two api-keys", http.Header{"Api-Key": {"sk-2", "sk-3"}}, "", true},
		{"basic is no key", http.Header{"Authorization": {"Basic dXNlcjpwYXNz"}}, "", false},
		{"basic falls back to api-key", http.Header{"Authorization": {"Basic x"}, "Api-Key": {"sk-2"}}, "sk-2", false},
		{"bearer without key", http.Header{"Authorization": {"Bearer"}}, "", false},
		{"empty bearer, api-key", http.Header{"Authorization": {"Bearer "}, "Api-Key": {"sk-2"}}, "sk-2", false},
		{"none", http.Header{}, "", false},
	}
	for _, tc := range tests {
		got, err := KeyFromHeader(tc.h)
		if got != tc.want || errors.Is(err, ErrMultipleKeys) != tc.multiple || tc.multiple != (err != nil) {
			t.Errorf("%s: KeyFromHeader = %q, %v; want %q, multiple keys %v", tc.name, got, err, tc.want, tc.multiple)
		}
	}
}

func TestHashKey(t *testing.T) {
	// printf %s sk-test | sha256sum
	const want = "sha256:f3abf2a6cc4f00987743db5f544ba345b4899ae31f326d8ee9c4816de153c9e0"
	if got := HashKey("sk-test"); got != want {
		t.Errorf("HashKey = %s, want %s", got, want)
	}
}

// TestMultipleKeysRefused: through the gate, a request with more than one key gets 400 with
// an OpenAI error body and reaches no handler, whichever of its keys is valid.
func TestMultipleKeysRefused(t *testing.T) {
	g, _ := newTestGate(t, `tenants:
  - {name: acme, api_keys: ["`+HashKey("sk-acme")+`"]}
  - {name: beta, api_keys: ["`+HashKey("sk-beta")+`"]}
`, nil)
	e := &echo{}
	h := g.Middleware(e)
	for _, tc := range []struct {
		name string
		hdr  http.Header
	}{
		{"two bearers", http.Header{"Authorization": {"Bearer sk-acme", "Bearer sk-beta"}}},
		{"two api-keys", http.Header{"Api-Key": {"sk-beta", "sk-acme"}}},
		{"bearer and api-key", http.Header{"Authorization": {"Bearer sk-acme"}, "Api-Key": {"sk-beta"}}},
	} {
		r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(chat("hi")))
		r.Header = tc.hdr
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != http.StatusBadRequest {
			t.Errorf("%s: status %d, want 400", tc.name, w.Code)
			continue
		}
		if eb := decodeErr(t, w); eb.Error.Code == nil || *eb.Error.Code != CodeMultipleKeys || eb.Error.Type != "invalid_request_error" {
			t.Errorf("%s: error %+v, want code %s", tc.name, eb.Error, CodeMultipleKeys)
		}
	}
	if len(e.ids) != 0 {
		t.Errorf("the handler was reached %d times", len(e.ids))
	}
	w := do(h, map[string]string{"Authorization": "Bearer sk-beta", "Api-Key": "sk-beta"}, chat("hi"))
	if w.Code != http.StatusOK || len(e.ids) != 1 || e.ids[0].Name != "beta" {
		t.Errorf("the same key twice: status %d, %d identities; want 200 as beta", w.Code, len(e.ids))
	}
}
