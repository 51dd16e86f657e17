package helm

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	rbacv1 "k8s.io/api/rbac/v1"

	"github.com/kvroute/kvroute/internal/config"
)

// TestChartPodDeletionCost: podDeletionCost renders autoscale.pod_deletion_cost into the
// config and adds patch on pods, and only that, to the discovery Role of every namespace
// watched; off (the default), neither is there.
func TestChartPodDeletionCost(t *testing.T) {
	out, err := render(t, `
kubernetesDiscovery:
  watches:
    - {service: vllm, port_name: http, endpoint: {engine: vllm}}
    - {namespace: gpu-b, service: vllm, port_name: http, pod_metadata: true, endpoint: {engine: vllm}}
podDeletionCost: {enabled: true, interval: 2m, minChange: 0.1, patchesPerSecond: 0.5}
`)
	if err != nil {
		t.Fatal(err)
	}
	m := decodeAll(t, out)
	c := m.kvrouteConfig(t)
	minChange := 0.1
	want := config.PodDeletionCost{Enabled: true, Interval: config.Duration(2 * time.Minute), MinChange: &minChange, PatchesPerSecond: 0.5}
	if diff := cmp.Diff(want, c.Autoscale.PodDeletionCost); diff != "" {
		t.Errorf("autoscale.pod_deletion_cost (-want +got):\n%s", diff)
	}
	patch := rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"patch"}}
	watch := rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list", "watch"}}
	epSlices := rbacv1.PolicyRule{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"list", "watch"}}
	if len(m.roles) != 2 {
		t.Fatalf("%d roles, want one per namespace watched", len(m.roles))
	}
	for _, r := range m.roles {
		if diff := cmp.Diff([]rbacv1.PolicyRule{epSlices, watch, patch}, r.Rules); diff != "" {
			t.Errorf("role in %s (-want +got):\n%s", r.Namespace, diff)
		}
	}

	out, err = render(t, "")
	if err != nil {
		t.Fatal(err)
	}
	m = decodeAll(t, out)
	if c := m.kvrouteConfig(t); c.Autoscale.PodDeletionCost.Enabled {
		t.Error("pod_deletion_cost enabled by default")
	}
	for _, r := range m.roles {
		for _, rule := range r.Rules {
			if slices.Contains(rule.Verbs, "patch") {
				t.Errorf("role in %s can patch by default: %+v", r.Namespace, rule)
			}
		}
	}
	for _, tc := range []struct{ values, want string }{
		{"config: {autoscale: {pod_deletion_cost: {enabled: true}}}", "config.autoscale.pod_deletion_cost: leave it out: use podDeletionCost"},
		{"podDeletionCost: {enabled: true}\nkubernetesDiscovery: {enabled: false}\nconfig: {endpoints: [{url: 'http://a:1'}]}", "podDeletionCost.enabled: needs kubernetesDiscovery.enabled"},
	} {
		if _, err := render(t, tc.values); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("values %q: %v, want an error saying %q", tc.values, err, tc.want)
		}
	}
}
