package app

import (
	"context"
	"net/netip"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/discovery/inferencepool"
	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/version"
)

// addInferencePool builds the discovery.inference_pool source, when the config has one, as the
// last discovery source: its endpoints go in the slot it appends to r.discovered.
func (r *Router) addInferencePool(cfg *config.Config, exclude func(netip.AddrPort) bool) error {
	src, err := inferencepool.FromConfig(cfg, version.UserAgent(), r.logger)
	if err != nil || src == nil {
		return err
	}
	src.Exclude = exclude
	r.infpool = src
	r.discovered = append(r.discovered, nil)
	r.metrics.DiscoverySource(src.Key())
	return nil
}

// runInferencePool follows the InferencePool until ctx ends (nil at once without one). The
// test hooks PoolClient and KubeClient replace the clients the config gave.
func (r *Router) runInferencePool(ctx context.Context) error {
	src := r.infpool
	if src == nil {
		return nil
	}
	i := len(r.discovered) - 1
	src.OnError = func(error) { r.metrics.DiscoveryErrors.WithLabelValues(src.Key()).Inc() }
	if r.PoolClient != nil {
		src.Pools = r.PoolClient
	}
	if r.KubeClient != nil {
		src.Pods = r.KubeClient
	}
	return src.Run(ctx, func(specs []endpoint.Spec) error { return r.setDiscovered(i, specs) })
}
