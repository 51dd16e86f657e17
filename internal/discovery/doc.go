// Package discovery says which endpoints exist: the static list from the config, and a file of
// endpoints that is re-read when it changes, merged into one set for endpoint.Pool.Update.
// Later sources (DNS, Kubernetes EndpointSlices) plug into the same Merger.
package discovery
