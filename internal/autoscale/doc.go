// Package autoscale holds the signals a fleet autoscaler reads from the router, and the
// arithmetic of the autoscaler that acts on them.
//
// Saturation gives each model's load in engines: for every engine, the larger of its prefill
// utilisation (prompt tokens it computed, not served from its prefix cache, per second, from
// the engine's own counters, over its calibrated prefill rate) and its KV-cache usage (what
// long decodes fill first), summed; and that over the available engines. It measures the work
// that calls for engines, not the queueing that work causes: the load does not change when
// engines are added, so an autoscaler that sizes the fleet as load / target lands on the same
// count from any starting point, instead of chasing a queue that vanishes as soon as there are
// enough engines and comes back when some are taken away (docs/kubernetes.md, "Scaling with
// KEDA", has the reasoning and the figures). HPA is what a Kubernetes HorizontalPodAutoscaler
// does with such a metric.
//
// It is pure code, with no Prometheus and no Kubernetes: internal/metrics exports the figures,
// internal/des runs a controller on them in virtual time (kvroute simulate --autoscale).
package autoscale
