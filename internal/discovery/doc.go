// Package discovery says which endpoints exist besides the config's static list: a file of
// endpoints (FileSource) that is re-read when it changes, and DNS names whose addresses are
// endpoints (DNSSource), resolved again every interval. Merge combines the static list with
// what the sources found into one set for endpoint.Pool.Update; app.Router does so on every
// config reload and every new set. A later source (Kubernetes EndpointSlices) gives sets the
// same way. Unusable is the one filter of addresses every source applies (no unspecified,
// multicast, broadcast or link-local address becomes an endpoint), and each source has an
// Exclude hook for the router's own addresses.
package discovery
