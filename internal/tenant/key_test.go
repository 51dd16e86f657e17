package tenant

import (
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
		name string
		h    http.Header
		want string
	}{
		{"bearer", http.Header{"Authorization": {"Bearer sk-1"}}, "sk-1"},
		{"bearer lowercase scheme", http.Header{"Authorization": {"bearer   sk-1 "}}, "sk-1"},
		{"api-key", http.Header{"Api-Key": {"sk-2"}}, "sk-2"},
		{"bearer wins", http.Header{"Authorization": {"Bearer sk-1"}, "Api-Key": {"sk-2"}}, "sk-1"},
		{"basic is no key", http.Header{"Authorization": {"Basic dXNlcjpwYXNz"}}, ""},
		{"basic falls back to api-key", http.Header{"Authorization": {"Basic x"}, "Api-Key": {"sk-2"}}, "sk-2"},
		{"bearer without key", http.Header{"Authorization": {"Bearer"}}, ""},
		{"none", http.Header{}, ""},
	}
	for _, tc := range tests {
		if got := KeyFromHeader(tc.h); got != tc.want {
			t.Errorf("%s: KeyFromHeader = %q, want %q", tc.name, got, tc.want)
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
