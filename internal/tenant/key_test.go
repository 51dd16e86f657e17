package tenant

import (
	"errors"
	"net/http"
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

// TestMultipleKeysRefused: the gate refuses a request with more than one key with 400 and
// an OpenAI error (code multiple_api_keys), whichever of its keys is valid; the same key twice
// authenticates.
func TestMultipleKeysRefused(t *testing.T) {
	g, _ := newTestGate(t, `tenants:
  - {name: acme, api_keys: ["`+HashKey("sk-acme")+`"]}
  - {name: beta, api_keys: ["`+HashKey("sk-beta")+`"]}
`, nil)
	for _, tc := range []struct {
		name string
		hdr  http.Header
	}{
		{"two bearers", http.Header{"Authorization": {"Bearer sk-acme", "Bearer sk-beta"}}},
		{"two api-keys", http.Header{"Api-Key": {"sk-beta", "sk-acme"}}},
		{"bearer and api-key", http.Header{"Authorization": {"Bearer sk-acme"}, "Api-Key": {"sk-beta"}}},
	} {
		id, oe := g.Authenticate(tc.hdr)
		if id != nil || oe == nil || oe.Status != http.StatusBadRequest || oe.Code == nil || *oe.Code != CodeMultipleKeys {
			t.Errorf("%s: identity %v, error %+v; want none and 400 %s", tc.name, id, oe, CodeMultipleKeys)
		}
	}
	id, oe := g.Authenticate(http.Header{"Authorization": {"Bearer sk-beta"}, "Api-Key": {"sk-beta"}})
	if oe != nil || id == nil || id.Name != "beta" {
		t.Errorf("the same key twice: identity %v, error %v; want beta", id, oe)
	}
}
