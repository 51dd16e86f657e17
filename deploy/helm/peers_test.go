package helm

import (
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"

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
		{"peers: {enabled: true}\nconfig: {peers: {kubernetes: {service: x}}}", "config.peers.kubernetes: leave it out"},
	} {
		if _, err := render(t, tc.values); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("values %q: %v, want an error saying %q", tc.values, err, tc.want)
		}
	}
}

// TestChartPeersTLS: peers.tls.secretName mounts a cert-manager style Secret (tls.crt, tls.key,
// ca.crt) and points peers.tls at it, the server name defaulting to the peers' Service.
func TestChartPeersTLS(t *testing.T) {
	out, err := render(t, "peers: {enabled: true, tls: {secretName: router-peers-tls}}\n")
	if err != nil {
		t.Fatal(err)
	}
	m := decodeAll(t, out)
	checkPod(t, m.deployment)
	// The files are not here to load: decode the section strictly, without kvroute's checks.
	var cfg struct {
		Peers struct {
			TLS *config.PeersTLS `json:"tls"`
		} `json:"peers"`
	}
	if err := yaml.Unmarshal([]byte(m.configMap.Data["kvroute.yaml"]), &cfg); err != nil {
		t.Fatal(err)
	}
	want := &config.PeersTLS{CertFile: "/etc/kvroute-peers-tls/tls.crt", KeyFile: "/etc/kvroute-peers-tls/tls.key",
		CAFile: "/etc/kvroute-peers-tls/ca.crt", ServerName: "llm-kvroute-peers"}
	if diff := cmp.Diff(want, cfg.Peers.TLS); diff != "" {
		t.Errorf("peers.tls (-want +got):\n%s", diff)
	}
	spec := m.deployment.Spec.Template.Spec
	var mount, volume string
	for _, v := range spec.Containers[0].VolumeMounts {
		if v.Name == "peers-tls" && v.ReadOnly {
			mount = v.MountPath
		}
	}
	for _, v := range spec.Volumes {
		if v.Name == "peers-tls" && v.Secret != nil {
			volume = v.Secret.SecretName
		}
	}
	if mount != "/etc/kvroute-peers-tls" || volume != "router-peers-tls" {
		t.Errorf("peers TLS secret mounted at %q from %q", mount, volume)
	}

	out, err = render(t, "peers: {enabled: true, tls: {secretName: x, serverName: peers.example}}\n")
	if err != nil || !strings.Contains(out, "server_name: peers.example") {
		t.Errorf("serverName not rendered: %v", err)
	}
	// Without it: no TLS, nothing mounted.
	out, err = render(t, "peers: {enabled: true}\n")
	if err != nil || strings.Contains(out, "peers-tls") || strings.Contains(out, "ca_file") {
		t.Errorf("TLS rendered without peers.tls.secretName: %v", err)
	}
	if _, err := render(t, "peers: {enabled: true}\nconfig: {peers: {tls: {cert_file: a}}}"); err == nil || !strings.Contains(err.Error(), "config.peers.tls: leave it out") {
		t.Errorf("config.peers.tls: %v, want it refused", err)
	}
}

// TestChartPeersAdvertisePodIP: with peers enabled each replica advertises its pod IP: the
// container gets a variable from the downward API's status.podIP and the config's
// peers.advertise_env names it, so that the config the pods share gives each its own address
// (kvroute reads the variable at load and at start). peers.advertisePodIP: false leaves both
// out, for memberlist's pick or config.peers.advertise; with it, config.peers.advertise and
// advertise_env are refused at render, as kvroute would refuse both set at start.
func TestChartPeersAdvertisePodIP(t *testing.T) {
	out, err := render(t, "peers: {enabled: true}\n")
	if err != nil {
		t.Fatal(err)
	}
	m := decodeAll(t, out)
	c := m.kvrouteConfig(t)
	fromPod := map[string]string{} // the variables the kubelet sets from the pod's status
	for _, e := range m.deployment.Spec.Template.Spec.Containers[0].Env {
		if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
			fromPod[e.Name] = e.ValueFrom.FieldRef.FieldPath
		}
	}
	if diff := cmp.Diff(map[string]string{"KVROUTE_POD_IP": "status.podIP"}, fromPod); diff != "" || c.Peers.AdvertiseEnv != "KVROUTE_POD_IP" || c.Peers.Advertise != "" {
		t.Fatalf("env from the pod (-want +got):\n%s\npeers.advertise_env %q, advertise %q: want the pod IP's variable",
			diff, c.Peers.AdvertiseEnv, c.Peers.Advertise)
	}
	// As kvroute starts in the pod: the kubelet's value is advertised, IPv4 or IPv6.
	for _, podIP := range []string{"10.42.0.7", "fd00:10:42::7"} {
		getenv := func(name string) string {
			if fromPod[name] == "status.podIP" {
				return podIP
			}
			return ""
		}
		if got, err := c.PeerAdvertise(getenv); got != podIP || err != nil {
			t.Errorf("pod IP %s: advertised %q, %v", podIP, got, err)
		}
	}

	out, err = render(t, "peers: {enabled: true, advertisePodIP: false}\nconfig: {peers: {advertise: kvroute.example}}\n")
	if err != nil {
		t.Fatal(err)
	}
	m = decodeAll(t, out)
	if c := m.kvrouteConfig(t); c.Peers.AdvertiseEnv != "" || c.Peers.Advertise != "kvroute.example" || strings.Contains(out, "status.podIP") {
		t.Errorf("advertisePodIP false: advertise_env %q, advertise %q, env %+v", c.Peers.AdvertiseEnv, c.Peers.Advertise,
			m.deployment.Spec.Template.Spec.Containers[0].Env)
	}
	for _, key := range []string{"advertise: 10.0.0.1", "advertise_env: MY_IP"} {
		want := "config.peers." + strings.Split(key, ":")[0] + ": leave it out: the chart sets advertise_env to the pod IP (peers.advertisePodIP); set peers.advertisePodIP: false"
		if _, err := render(t, "peers: {enabled: true}\nconfig: {peers: {"+key+"}}\n"); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("config.peers {%s}: %v, want an error saying %q", key, err, want)
		}
	}
}
