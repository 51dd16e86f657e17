// Package discovery says which endpoints exist besides the config's static list: a file of
// endpoints (FileSource) that is re-read when it changes. Merge combines the static list with
// what a source found into one set for endpoint.Pool.Update; proxy.Router does so on every
// config reload and every new file. Later sources (DNS, Kubernetes EndpointSlices) give sets
// the same way.
package discovery
