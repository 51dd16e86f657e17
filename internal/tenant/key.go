package tenant

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strings"

	"github.com/kvroute/kvroute/internal/config"
)

// HashKey returns the form an API key takes in the config's tenants[].api_keys:
// "sha256:<lowercase hex>". It is config.KeyDigest, named here for callers that think in
// tenants.
func HashKey(key string) string { return config.KeyDigest(key) }

// Salt returns a tenant's cache salt: the hex HMAC-SHA256 of the tenant's name under the
// server secret. 256 bits, unguessable without the secret, stable across restarts and across
// router replicas sharing the secret, and different for every tenant.
func Salt(secret []byte, tenant string) string {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(tenant))
	return hex.EncodeToString(m.Sum(nil))
}

// KeyFromHeader returns the API key a request presents: "Authorization: Bearer <key>" (the
// OpenAI clients) or "api-key: <key>" (the Azure OpenAI clients), "" when there is none.
// The Bearer scheme name is case-insensitive; another scheme counts as no key.
func KeyFromHeader(h http.Header) string {
	if a := h.Get("Authorization"); a != "" {
		scheme, key, ok := strings.Cut(strings.TrimSpace(a), " ")
		if ok && strings.EqualFold(scheme, "Bearer") {
			return strings.TrimSpace(key)
		}
	}
	return strings.TrimSpace(h.Get("Api-Key"))
}
