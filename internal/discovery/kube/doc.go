// Package kube finds endpoints through the Kubernetes API: a Watch follows the EndpointSlices
// a label selector picks (a Service's, by its kubernetes.io/service-name label) with client-go
// informers and reports the addresses ready for new requests, and a Source turns them into
// engine endpoints (one discovery.kubernetes entry of the config), with per-pod engine kind,
// models and KV-event address from the pods' labels and annotations.
//
// Not-ready and terminating endpoints leave the set: the router's pool then drains them (no new
// requests, those in flight go on), which is what a rolling update or a scale-in needs. A pod
// that turns not ready comes back as a new endpoint, without what the router had learned of it:
// an engine whose readiness fails has usually restarted, and its cache with it.
//
// RBAC: list and watch on endpointslices (discovery.k8s.io) in the namespace; with
// pod_metadata also list and watch on pods. docs/kubernetes.md has the Role.
package kube
