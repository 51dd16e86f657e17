package config

import (
	"math"
	"time"
)

// Autoscale configures what the router gives autoscalers: the load it exports for KEDA or a
// HorizontalPodAutoscaler (kvroute_model_load), and the pod-deletion-cost writer for
// cache-aware scale-in (docs/kubernetes.md).
type Autoscale struct {
	// Window is the time over which kvroute_model_load and the prefill demand are averaged.
	// Default 1m.
	Window Duration `json:"window"`
	// PrefillRate is one engine's prefill rate, in the engine's tokens per second, for the
	// prefill part of kvroute_model_load. 0 (default): the policy's calibrated rate
	// (prefix-aware); with another policy and no rate, the load counts KV-cache usage only.
	PrefillRate float64 `json:"prefill_rate"`
	// PodDeletionCost writes each engine pod's controller.kubernetes.io/pod-deletion-cost
	// annotation from its cache value, so that a scale-in removes the pod whose cache is
	// worth least first. Off by default.
	PodDeletionCost PodDeletionCost `json:"pod_deletion_cost"`
}

// PodDeletionCost configures the pod-deletion-cost writer. It writes the pods that
// discovery.kubernetes finds, and needs patch on pods in their namespaces.
type PodDeletionCost struct {
	Enabled bool `json:"enabled"`
	// Interval is how often the values are compared with what was written. Default 1m.
	Interval Duration `json:"interval"`
	// MinChange is the relative change of a pod's value that is worth a new patch (0.2: by
	// a fifth). Default 0.2; 0 patches every change.
	MinChange *float64 `json:"min_change"`
	// PatchesPerSecond bounds the patches sent to the API server, all pods together (a burst
	// of 5 at most). Default 1.
	PatchesPerSecond float64 `json:"patches_per_second"`
}

// Defaults of the autoscale section.
const (
	DefaultAutoscaleWindow       = time.Minute
	DefaultDeletionCostInterval  = time.Minute
	DefaultDeletionCostMinChange = 0.2
	DefaultDeletionCostPatches   = 1.0
)

// MinChangeValue returns pod_deletion_cost.min_change (its default when unset).
func (d PodDeletionCost) MinChangeValue() float64 {
	if d.MinChange == nil {
		return DefaultDeletionCostMinChange
	}
	return *d.MinChange
}

func (a *Autoscale) setDefaults(*Config) {
	if a.Window == 0 {
		a.Window = Duration(DefaultAutoscaleWindow)
	}
	d := &a.PodDeletionCost
	if d.Interval == 0 {
		d.Interval = Duration(DefaultDeletionCostInterval)
	}
	if d.PatchesPerSecond == 0 {
		d.PatchesPerSecond = DefaultDeletionCostPatches
	}
}

func (a *Autoscale) validate(c *Config, p *problems) {
	if a.Window < Duration(time.Second) {
		p.add("autoscale.window", "%v: give at least 1s, like 1m (longer smooths more and reacts later)", a.Window.D())
	}
	if a.PrefillRate < 0 || math.IsNaN(a.PrefillRate) || math.IsInf(a.PrefillRate, 0) {
		p.add("autoscale.prefill_rate", "%g: give one engine's prefill tokens per second, like 30000, or 0 for the policy's calibrated rate", a.PrefillRate)
	}
	d := a.PodDeletionCost
	if d.Interval < Duration(time.Second) {
		p.add("autoscale.pod_deletion_cost.interval", "%v: give at least 1s, like 1m", d.Interval.D())
	}
	if m := d.MinChangeValue(); m < 0 || m > 1 || math.IsNaN(m) {
		p.add("autoscale.pod_deletion_cost.min_change", "%g: give a share from 0 (patch every change) to 1, like 0.2", m)
	}
	if d.PatchesPerSecond <= 0 || math.IsNaN(d.PatchesPerSecond) || math.IsInf(d.PatchesPerSecond, 0) {
		p.add("autoscale.pod_deletion_cost.patches_per_second", "%g: give a positive rate, like 1", d.PatchesPerSecond)
	}
	if d.Enabled && len(c.Discovery.Kubernetes) == 0 {
		p.add("autoscale.pod_deletion_cost.enabled", "needs discovery.kubernetes: the pods it writes are the ones found there")
	}
}
