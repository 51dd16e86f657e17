package helm

import (
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	rbacv1 "k8s.io/api/rbac/v1"

	"github.com/kvroute/kvroute/internal/config"
)

// TestChartPeersKubernetes: with peers.discovery: kubernetes the replicas find each other in
// their headless Service's EndpointSlices: the config names that Service and its gossip port
// (no dns), a Role grants list and watch on endpointslices in the release's namespace and
// nothing else, and the pods get a service account token even without kubernetes discovery.
func TestChartPeersKubernetes(t *testing.T) {
	out, err := render(t, "peers: {enabled: true, discovery: kubernetes}\nkubernetesDiscovery: {enabled: false}\nconfig: {endpoints: [{url: 'http://vllm:8000'}], auth: {mode: none}}\n")
	if err != nil {
		t.Fatal(err)
	}
	m := decodeAll(t, out)
	checkPod(t, m.deployment)
	c := m.kvrouteConfig(t)
	want := &config.PeersKubernetes{Namespace: "serving", Service: "llm-kvroute-peers", PortName: "gossip"}
	if diff := cmp.Diff(want, c.Peers.Kubernetes); diff != "" || c.Peers.DNS != nil {
		t.Errorf("peers.kubernetes (-want +got):\n%s\ndns %+v: want none", diff, c.Peers.DNS)
	}
	// The Service the watch names publishes its port gossip (TCP) on the slices.
	hl := m.services["llm-kvroute-peers"]
	if hl == nil || !hl.Spec.PublishNotReadyAddresses || hl.Spec.Ports[1].Name != "gossip" || hl.Spec.Ports[1].Protocol != "TCP" {
		t.Fatalf("peers service %+v", hl)
	}
	if len(m.roles) != 1 || len(m.bindings) != 1 {
		t.Fatalf("%d roles and %d bindings, want the peers' one", len(m.roles), len(m.bindings))
	}
	r, b := m.roles[0], m.bindings[0]
	rules := []rbacv1.PolicyRule{{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"list", "watch"}}}
	if diff := cmp.Diff(rules, r.Rules); diff != "" || r.Name != "llm-kvroute-peers" || r.Namespace != "serving" {
		t.Errorf("role %s/%s rules (-want +got):\n%s", r.Namespace, r.Name, diff)
	}
	if b.RoleRef.Name != r.Name || len(b.Subjects) != 1 || b.Subjects[0].Name != m.deployment.Spec.Template.Spec.ServiceAccountName || b.Namespace != "serving" {
		t.Errorf("binding %+v", b)
	}
	if tok := m.deployment.Spec.Template.Spec.AutomountServiceAccountToken; tok == nil || !*tok {
		t.Errorf("automountServiceAccountToken %v: the watch needs the token", tok)
	}
	if tok := m.account.AutomountServiceAccountToken; tok == nil || !*tok {
		t.Errorf("service account automountServiceAccountToken %v", tok)
	}

	// With kubernetes discovery on too: each its own Role, the discovery's unchanged.
	out, err = render(t, "peers: {enabled: true, discovery: kubernetes}\n")
	if err != nil {
		t.Fatal(err)
	}
	m = decodeAll(t, out)
	var names []string
	for _, r := range m.roles {
		names = append(names, r.Name)
	}
	slices.Sort(names)
	if diff := cmp.Diff([]string{"llm-kvroute-discovery", "llm-kvroute-peers"}, names); diff != "" {
		t.Errorf("roles (-want +got):\n%s", diff)
	}

	// The default, dns: no Role for the peers, and no token without discovery.
	out, err = render(t, "peers: {enabled: true}\nkubernetesDiscovery: {enabled: false}\nconfig: {endpoints: [{url: 'http://vllm:8000'}]}\n")
	if err != nil {
		t.Fatal(err)
	}
	m = decodeAll(t, out)
	if c := m.kvrouteConfig(t); c.Peers.DNS == nil || c.Peers.Kubernetes != nil || len(m.roles) != 0 || strings.Contains(out, "endpointslices") {
		t.Errorf("dns: peers %+v, %d roles", c.Peers, len(m.roles))
	}
	if tok := m.deployment.Spec.Template.Spec.AutomountServiceAccountToken; tok == nil || *tok {
		t.Errorf("automountServiceAccountToken %v with dns and no discovery, want false", tok)
	}

	for _, tc := range []struct{ values, want string }{
		{"peers: {enabled: true, discovery: api}", `peers.discovery: "api": use dns (the headless Service's name) or kubernetes`},
		{"peers: {enabled: true}\nconfig: {peers: {kubernetes: {service: x}}}", "config.peers.kubernetes: leave it out"},
	} {
		if _, err := render(t, tc.values); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("values %q: %v, want an error saying %q", tc.values, err, tc.want)
		}
	}
}
