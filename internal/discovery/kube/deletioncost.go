package kube

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/time/rate"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// DeletionCostAnnotation is the pod annotation a ReplicaSet reads when it scales in: it removes
// the pods with the lowest cost first (Kubernetes 1.22 on; int32, default 0).
const DeletionCostAnnotation = "controller.kubernetes.io/pod-deletion-cost"

// PodValue is an engine pod and what its cache is worth.
type PodValue struct {
	// Pod is namespace/name.
	Pod string
	// Value is the cache value in tokens (kvroute_endpoint_cache_value_tokens).
	Value float64
}

// CostWriter keeps each engine pod's pod-deletion-cost annotation at its cache value, so that a
// scale-in of the engines' Deployment removes the pod whose cache is worth least first: the one
// whose loss the fleet recomputes most cheaply. Kubernetes warns against updating the
// annotation often (every patch is a pod update every watcher of pods sees), so the writer
// patches a pod only when its value moved by MinChange since the last patch, and at most Limit
// allows, the largest moves first, leaving the rest for the next pass. It only patches:
// it needs patch on pods, nothing else.
type CostWriter struct {
	// Client talks to the API server.
	Client Client
	// Values gives the pods to write and their values now (nil: nothing this pass).
	Values func() []PodValue
	// Interval is the time between two passes (Run).
	Interval time.Duration
	// MinChange is the relative change of a value that is worth a patch: |new - last| >
	// MinChange x max(|new|, |last|). 0: every change.
	MinChange float64
	// Limit bounds the patches of all pods together.
	Limit *rate.Limiter
	// Log receives failed patches (discarded when nil); OnError, when set, also gets them.
	Log     *slog.Logger
	OnError func(error)
	// Now tells the time for Limit (nil: time.Now).
	Now func() time.Time

	written map[string]int32 // pod -> the cost last patched
}

// Cost is the annotation's value for a cache value: tokens, rounded, within int32.
func Cost(value float64) int32 {
	switch {
	case math.IsNaN(value) || value <= 0:
		return 0
	case value >= math.MaxInt32:
		return math.MaxInt32
	}
	return int32(math.Round(value))
}

// Run writes every Interval until ctx ends, and returns ctx's error.
func (w *CostWriter) Run(ctx context.Context) error {
	t := time.NewTicker(w.Interval)
	defer t.Stop()
	for {
		w.Write(ctx)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// Write makes one pass: it patches the pods whose value moved enough, the largest moves first,
// as many as the limit allows now, and returns how many it patched. A pod that could not be
// patched (it is gone, or the API server refused) is tried again at a later pass.
func (w *CostWriter) Write(ctx context.Context) int {
	if w.written == nil {
		w.written = map[string]int32{}
	}
	var vals []PodValue
	if w.Values != nil {
		vals = w.Values()
	}
	type move struct {
		pod  string
		cost int32
		by   float64
	}
	var moves []move
	seen := make(map[string]bool, len(vals))
	for _, v := range vals {
		seen[v.Pod] = true
		c := Cost(v.Value)
		last, ok := w.written[v.Pod]
		by := math.Abs(float64(c) - float64(last))
		switch {
		case !ok:
			by = math.Inf(1) // never written: first
		case c == last || by <= w.MinChange*max(math.Abs(float64(c)), math.Abs(float64(last))):
			continue
		}
		moves = append(moves, move{v.Pod, c, by})
	}
	for pod := range w.written {
		if !seen[pod] {
			delete(w.written, pod) // gone from discovery: if it comes back, write it again
		}
	}
	slices.SortFunc(moves, func(a, b move) int { return cmp.Or(cmp.Compare(b.by, a.by), strings.Compare(a.pod, b.pod)) })
	now := time.Now
	if w.Now != nil {
		now = w.Now
	}
	patched := 0
	for _, m := range moves {
		if w.Limit != nil && !w.Limit.AllowN(now(), 1) {
			break
		}
		if err := w.patch(ctx, m.pod, m.cost); err != nil {
			w.fail(err)
			continue
		}
		w.written[m.pod] = m.cost
		patched++
	}
	return patched
}

// patch sets pod's annotation to cost with a JSON merge patch: only that key changes.
func (w *CostWriter) patch(ctx context.Context, pod string, cost int32) error {
	ns, name, ok := strings.Cut(pod, "/")
	if !ok || ns == "" || name == "" {
		return fmt.Errorf("pod-deletion-cost: pod %q is not namespace/name", pod)
	}
	body := fmt.Appendf(nil, `{"metadata":{"annotations":{%q:%q}}}`, DeletionCostAnnotation, strconv.Itoa(int(cost)))
	_, err := w.Client.CoreV1().Pods(ns).Patch(ctx, name, types.MergePatchType, body, metav1.PatchOptions{FieldManager: "kvroute"})
	if err != nil {
		return fmt.Errorf("pod-deletion-cost of pod %s: %w", pod, err)
	}
	return nil
}

func (w *CostWriter) fail(err error) {
	if w.Log != nil {
		w.Log.Warn("pod-deletion-cost not written", "err", err)
	}
	if w.OnError != nil {
		w.OnError(err)
	}
}

// Pods returns the pods behind the endpoints the source found last: endpoint name (its URL) ->
// namespace/name. Endpoints whose slice names no pod are left out.
func (s *Source) Pods() map[string]string {
	if p := s.pods.Load(); p != nil {
		return *p
	}
	return nil
}

// keepPods records the pods of targets for Pods.
func (s *Source) keepPods(targets []Target) {
	pods := make(map[string]string, len(targets))
	for _, t := range targets {
		if t.Pod != "" {
			pods[s.Config.Scheme+"://"+t.HostPort()] = t.Pod
		}
	}
	s.pods.Store(&pods)
}
