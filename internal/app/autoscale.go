package app

import (
	"context"
	"sync"

	"golang.org/x/time/rate"

	"github.com/kvroute/kvroute/internal/autoscale"
	"github.com/kvroute/kvroute/internal/discovery/kube"
	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/metrics"
	"github.com/kvroute/kvroute/internal/policy"
)

// deletionCostBurst is how many pod-deletion-cost patches may go at once, past the
// patches_per_second rate.
const deletionCostBurst = 5

// watchAutoscale makes the autoscaling collectors read the pool and the policy in force.
func (r *Router) watchAutoscale(a *metrics.Autoscale) {
	a.Watch(r.pool.All, r.engineRate)
	a.WatchCacheValue(r.cacheValue)
	a.WatchLabels(r.metrics.ModelLabel)
}

// currentPicker is the policy in force (nil before the first apply).
func (r *Router) currentPicker() policy.Picker {
	if h := r.h.Load(); h != nil {
		return h.Lifecycle.Picker()
	}
	return nil
}

// engineRate is ep's prefill rate in the engine's tokens per second: autoscale.prefill_rate, or
// the policy's calibrated rate.
func (r *Router) engineRate(ep *endpoint.Endpoint) float64 {
	return autoscale.EngineRate(r.currentPicker(), r.Config().Autoscale.PrefillRate, ep)
}

// cacheValue is ep's cache value in the engine's tokens, when the policy can tell it.
func (r *Router) cacheValue(ep *endpoint.Endpoint) (float64, bool) {
	v, ok := r.currentPicker().(policy.CacheValuer)
	if !ok {
		return 0, false
	}
	return v.CacheValue(ep) * float64(r.Config().Prefix.BlockTokens) * ep.TokenScale(), true
}

// runDeletionCost writes the pod-deletion-cost of the pods each Kubernetes source finds, when
// autoscale.pod_deletion_cost is on, until ctx ends: one writer per source (each with its
// source's client), one rate limit for all.
func (r *Router) runDeletionCost(ctx context.Context, wg *sync.WaitGroup, errc chan<- error) {
	d := r.Config().Autoscale.PodDeletionCost
	if !d.Enabled {
		return
	}
	if _, ok := r.currentPicker().(policy.CacheValuer); !ok {
		r.logger.Warn("autoscale.pod_deletion_cost: the policy tells no cache value (prefix-aware does): no pod is written", "policy", r.Config().Policy.Name)
	}
	limit := rate.NewLimiter(rate.Limit(d.PatchesPerSecond), deletionCostBurst)
	for _, k := range r.kube {
		w := &kube.CostWriter{
			Client: k.Client, Interval: d.Interval.D(), MinChange: d.MinChangeValue(), Limit: limit, Log: r.logger,
			Values: func() []kube.PodValue { return r.podValues(k) },
		}
		wg.Go(func() { errc <- w.Run(ctx) })
	}
}

// podValues is the cache value of each pod behind an endpoint that source k found.
func (r *Router) podValues(k *kube.Source) []kube.PodValue {
	var out []kube.PodValue
	for name, pod := range k.Pods() {
		ep := r.pool.ByName(name)
		if ep == nil {
			continue
		}
		if v, ok := r.cacheValue(ep); ok {
			out = append(out, kube.PodValue{Pod: pod, Value: v})
		}
	}
	return out
}
