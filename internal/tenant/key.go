package tenant

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/metrics"
	"github.com/kvroute/kvroute/internal/openai"
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
//
// A request that presents more than one key gets ErrMultipleKeys: two Authorization headers,
// two api-key headers, or a Bearer key and an api-key that differ. Taking the first would let
// the order of headers choose the tenant, and a proxy in front may have checked another one.
func KeyFromHeader(h http.Header) (string, error) {
	auth, api := h["Authorization"], h["Api-Key"]
	if len(auth) > 1 {
		return "", fmt.Errorf("%w: %d Authorization headers", ErrMultipleKeys, len(auth))
	}
	if len(api) > 1 {
		return "", fmt.Errorf("%w: %d api-key headers", ErrMultipleKeys, len(api))
	}
	var bearer, key string
	if len(auth) == 1 {
		scheme, k, ok := strings.Cut(strings.TrimSpace(auth[0]), " ")
		if ok && strings.EqualFold(scheme, "Bearer") {
			bearer = strings.TrimSpace(k)
		}
	}
	if len(api) == 1 {
		key = strings.TrimSpace(api[0])
	}
	switch {
	case bearer == "":
		return key, nil
	case key != "" && key != bearer:
		return "", fmt.Errorf("%w: Authorization and api-key carry different keys", ErrMultipleKeys)
	}
	return bearer, nil
}

// noKeyMessage is the 401's message for a request in which KeyFromHeader found no key: no key
// at all, or an Authorization header that is not "Bearer <key>" (another scheme, such as
// Basic, or a key without "Bearer " before it), which a client's author reads as a key refused
// unless told. The header's value is never repeated (it may be the key itself), only a scheme
// name that looks like one.
func noKeyMessage(h http.Header) string {
	const how = "send it as 'Authorization: Bearer <key>' or in the api-key header"
	auth := strings.TrimSpace(h.Get("Authorization"))
	if auth == "" {
		return "no API key: " + how
	}
	scheme, rest, spaced := strings.Cut(auth, " ")
	switch {
	case strings.EqualFold(scheme, "Bearer"):
		return "no API key: the Authorization header has nothing after Bearer; " + how
	case spaced && strings.TrimSpace(rest) != "" && schemeName(scheme):
		return "no API key: the Authorization header uses the " + scheme + " scheme, which the router does not read; " + how
	}
	return "no API key: the Authorization header does not start with 'Bearer ' (a key must follow it); " + how
}

// schemeName reports whether s looks like an HTTP authentication scheme's name (Basic, Digest,
// Token), so that it may be named in an answer: a short word of letters, never a key's shape.
func schemeName(s string) bool {
	if len(s) == 0 || len(s) > 12 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
			return false
		}
	}
	return true
}

// ErrMultipleKeys is KeyFromHeader's error for a request that presents more than one key.
var ErrMultipleKeys = errors.New("more than one API key in the request")

// CodeMultipleKeys is the error code of the 400 that answers a request with more than one key.
const CodeMultipleKeys = "multiple_api_keys"

// multipleKeys refuses a request that presents more than one API key: 400, counted as a
// rejection of no tenant when count is set.
func (g *Gate) multipleKeys(err error, count bool) *openai.Error {
	if count {
		g.logger.LogAttrs(context.Background(), slog.LevelDebug, "authentication failed", slog.String("code", CodeMultipleKeys))
		g.m.Rejection(metrics.Unauthenticated, CodeMultipleKeys)
		g.m.Request(metrics.Unauthenticated, http.StatusBadRequest)
	}
	return openai.NewError(http.StatusBadRequest, openai.TypeInvalidRequest, "", CodeMultipleKeys,
		err.Error()+": send one key, as 'Authorization: Bearer <key>' or in the api-key header")
}
