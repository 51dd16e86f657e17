// Package app assembles the router from a config: the endpoint pool (static endpoints plus
// the discovery sources), the health prober and metrics scraper, the policy and its request
// lifecycle, the tenant gate, the API handler (internal/proxy) and the admin handler; it
// applies new configs to a running router and serves both listeners (TLS, graceful drain).
// `kvroute serve` and `kvroute demo` build one.
package app
