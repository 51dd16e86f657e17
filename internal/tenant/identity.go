// Package tenant keeps customers of one shared fleet apart: API keys to tenants, per-tenant
// request, token and concurrency limits, per-tenant cache salts, and fair admission under
// overload.
package tenant

import "context"

// Identity is the authenticated tenant of a request, as the proxy sees it.
type Identity struct {
	Name string
	// Salt is the tenant's cache salt (hex of HMAC-SHA256(server secret, tenant name)). The
	// router seeds its prefix hashes with it and injects it as cache_salt into requests for
	// engines that honour it, overwriting anything the client sent.
	Salt string
	// Priority orders waiting requests under overload (higher first).
	Priority int
	// Models the tenant may use; empty means all.
	Models []string
	// EndpointLabels restrict the tenant to endpoints carrying all these labels (a dedicated pool).
	EndpointLabels map[string]string
	// Settle, when set, is called once when the request ends with the usage the engine reported
	// (or the router's estimate), so token limits count what was really used.
	Settle func(promptTokens, completionTokens int)
}

type ctxKey struct{}

// WithIdentity returns ctx carrying id.
func WithIdentity(ctx context.Context, id *Identity) context.Context {
	return context.WithValue(ctx, ctxKey{}, id)
}

// FromContext returns the request's tenant, or nil when authentication is off.
func FromContext(ctx context.Context) *Identity {
	id, _ := ctx.Value(ctxKey{}).(*Identity)
	return id
}
