package autoscale

import "math"

// DefaultTolerance is the Kubernetes HorizontalPodAutoscaler's default tolerance (the
// controller manager's --horizontal-pod-autoscaler-tolerance): no change while the metric is
// within 10 % of its target.
const DefaultTolerance = 0.1

// HPA is the rule by which a Kubernetes HorizontalPodAutoscaler (autoscaling/v2) sizes a
// Deployment on one external metric with an AverageValue target, as KEDA's Prometheus scaler
// sets it up: desired = ceil(metric / Target), unless metric / (Target x current) is within
// Tolerance of 1 (then current stays), between Min and Max.
type HPA struct {
	// Target is the metric's target per replica (the ScaledObject trigger's threshold).
	Target float64
	// Tolerance: 0 means DefaultTolerance.
	Tolerance float64
	// Min and Max bound the count (minReplicaCount, maxReplicaCount); Max 0: no bound.
	Min, Max int
}

// Desired is the replica count the HPA asks for, with current replicas and the metric at
// metric. A metric that is not a number leaves the count as it is.
func (h HPA) Desired(current int, metric float64) int {
	tol := h.Tolerance
	if tol <= 0 {
		tol = DefaultTolerance
	}
	want := current
	if h.Target > 0 && !math.IsNaN(metric) && !math.IsInf(metric, 0) && metric >= 0 {
		if current <= 0 || math.Abs(metric/(h.Target*float64(current))-1) > tol {
			want = int(math.Ceil(metric / h.Target))
		}
	}
	if h.Max > 0 {
		want = min(want, h.Max)
	}
	return max(want, h.Min)
}
