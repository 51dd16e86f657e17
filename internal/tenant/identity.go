// Package tenant keeps customers of one shared fleet apart: API keys to tenants, per-tenant
// request, token and concurrency limits, per-tenant cache salts, and fair admission under
// overload.
package tenant

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
	// AllowFields are the config.EngineFields the tenant may send to the engine.
	AllowFields []string
	// MaxOutputTokens caps each sequence's completion tokens (limits.max_output_tokens; 0: no
	// cap): the caller writes it into the body of a request that sets no max_tokens, whose
	// Demand then has none, and Gate.Take refuses one that asks for more.
	MaxOutputTokens int
	state           *tenantState // its limits (nil in an Identity built elsewhere)
}
