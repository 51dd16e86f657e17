package helm

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/discovery/inferencepool"
)

// inferencePool is the InferencePool (inference.networking.k8s.io/v1) as the chart renders it:
// the fields of the API's v1 type that the chart sets (it is not in k8s.io/api), so that a
// strict decode still catches a misspelt field.
type inferencePool struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   metav1.ObjectMeta `json:"metadata"`
	Spec       struct {
		Selector struct {
			MatchLabels map[string]string `json:"matchLabels"`
		} `json:"selector"`
		TargetPorts []struct {
			Number int32 `json:"number"`
		} `json:"targetPorts"`
		EndpointPickerRef struct {
			Group *string `json:"group"`
			Kind  string  `json:"kind"`
			Name  string  `json:"name"`
			Port  *struct {
				Number int32 `json:"number"`
			} `json:"port"`
			FailureMode string `json:"failureMode"`
		} `json:"endpointPickerRef"`
	} `json:"spec"`

	doc string // the manifest, for kvroute's own reading of it
}

// check holds the pool to what the v1 API requires (its CRD's validation) and to what kvroute's
// InferencePool source reads of it.
func (p *inferencePool) check(t *testing.T) {
	t.Helper()
	s := p.Spec
	if len(s.Selector.MatchLabels) == 0 {
		t.Error("InferencePool spec.selector.matchLabels is empty")
	}
	if len(s.TargetPorts) != 1 || s.TargetPorts[0].Number < 1 || s.TargetPorts[0].Number > 65535 {
		t.Errorf("InferencePool spec.targetPorts %+v: the v1 API wants exactly one port", s.TargetPorts)
	}
	ref := s.EndpointPickerRef
	if ref.Name == "" || (ref.Kind == "Service" || ref.Kind == "") && ref.Port == nil {
		t.Errorf("InferencePool spec.endpointPickerRef %+v: want a name, and a port for a Service", ref)
	}
	if ref.FailureMode != "" && ref.FailureMode != "FailOpen" && ref.FailureMode != "FailClose" {
		t.Errorf("InferencePool failureMode %q", ref.FailureMode)
	}
	// As the API server gives it to a client: JSON, whole numbers as int64.
	js, err := yaml.YAMLToJSON([]byte(p.doc))
	if err != nil {
		t.Fatal(err)
	}
	var u unstructured.Unstructured
	if err := u.UnmarshalJSON(js); err != nil {
		t.Fatal(err)
	}
	if _, err := inferencepool.Parse(&u); err != nil {
		t.Errorf("kvroute's InferencePool source cannot read the pool: %v", err)
	}
}

func containerPorts(m *manifests) map[string]corev1.ContainerPort {
	out := map[string]corev1.ContainerPort{}
	for _, p := range m.deployment.Spec.Template.Spec.Containers[0].Ports {
		out[p.Name] = p
	}
	return out
}

func TestChartEndpointPicker(t *testing.T) {
	out, err := render(t, `
mode: endpointPicker
endpointPicker:
  inferencePool:
    create: true
    name: llama3-8b
    selector: {app: vllm-llama3-8b}
    targetPort: 8000
    endpoint: {engine: vllm, models: [meta-llama/Llama-3.1-8B-Instruct]}
config:
  extproc: {max_endpoints: 1}
`)
	if err != nil {
		t.Fatal(err)
	}
	m := decodeAll(t, out)
	checkPod(t, m.deployment)
	checkRBAC(t, m, nil, false) // no discovery.kubernetes in this mode

	c := m.kvrouteConfig(t)
	wantExt := config.ExtProc{Listen: "0.0.0.0:9002", HealthListen: "0.0.0.0:9003", MaxEndpoints: 1, TLS: config.ExtProcTLS{SelfSigned: true}}
	if diff := cmp.Diff(wantExt, c.ExtProc); diff != "" {
		t.Errorf("extproc (-want +got):\n%s", diff)
	}
	wantPool := &config.InferencePoolDiscovery{Name: "llama3-8b", Namespace: "serving", Scheme: "http", Grace: config.Duration(config.DefaultInferencePoolGrace),
		Endpoint: config.Endpoint{Engine: "vllm", Models: []string{"meta-llama/Llama-3.1-8B-Instruct"}}}
	if diff := cmp.Diff(wantPool, c.Discovery.InferencePool); diff != "" {
		t.Errorf("discovery.inference_pool (-want +got):\n%s", diff)
	}
	if len(c.Discovery.Kubernetes) != 0 {
		t.Errorf("discovery.kubernetes %+v in endpoint-picker mode", c.Discovery.Kubernetes)
	}

	ports := containerPorts(m)
	if ports["ext-proc"].ContainerPort != 9002 || ports["grpc-health"].ContainerPort != 9003 {
		t.Errorf("container ports %v: want ext-proc 9002 and grpc-health 9003", ports)
	}
	svc := m.services["llm-kvroute"]
	var svcPorts []string
	for _, p := range svc.Spec.Ports {
		svcPorts = append(svcPorts, fmt.Sprintf("%s:%d->%s", p.Name, p.Port, p.TargetPort.String()))
	}
	if !slices.Contains(svcPorts, "grpc-ext-proc:9002->ext-proc") || !slices.Contains(svcPorts, "grpc-health:9003->grpc-health") {
		t.Errorf("service ports %v: want grpc-ext-proc and grpc-health", svcPorts)
	}

	// The picker's Role: the pool and its pods, read through informers, nothing else.
	var role *rbacv1.Role
	for _, r := range m.roles {
		if r.Name == "llm-kvroute-inferencepool" {
			role = r
		}
	}
	wantRules := []rbacv1.PolicyRule{
		{APIGroups: []string{"inference.networking.k8s.io"}, Resources: []string{"inferencepools"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list", "watch"}},
	}
	if role == nil || role.Namespace != "serving" {
		t.Fatalf("roles %v: want llm-kvroute-inferencepool in serving", m.roles)
	}
	if diff := cmp.Diff(wantRules, role.Rules); diff != "" {
		t.Errorf("picker role rules (-want +got):\n%s", diff)
	}

	if len(m.pools) != 1 {
		t.Fatalf("%d InferencePools, want 1", len(m.pools))
	}
	p := m.pools[0]
	p.check(t)
	ref := p.Spec.EndpointPickerRef
	if p.Metadata.Name != "llama3-8b" || p.Metadata.Namespace != "serving" || ref.Name != "llm-kvroute" || ref.Port.Number != 9002 ||
		ref.Kind != "Service" || ref.FailureMode != "FailClose" {
		t.Errorf("InferencePool %s/%s endpointPickerRef %+v: want llm-kvroute:9002 (the router's Service), FailClose", p.Metadata.Namespace, p.Metadata.Name, ref)
	}
	if _, ok := svc.Spec.Selector["app.kubernetes.io/name"]; !ok || ref.Name != svc.Name {
		t.Errorf("the pool's picker %q is not the router's Service %q", ref.Name, svc.Name)
	}
	if diff := cmp.Diff(map[string]string{"app": "vllm-llama3-8b"}, p.Spec.Selector.MatchLabels); diff != "" {
		t.Errorf("pool selector (-want +got):\n%s", diff)
	}
}

func TestChartEndpointPickerOwnPool(t *testing.T) {
	out, err := render(t, "mode: endpointPicker\nendpointPicker: {tls: {selfSigned: false}, inferencePool: {grace: 90s}}\n")
	if err != nil {
		t.Fatal(err)
	}
	m := decodeAll(t, out)
	if len(m.pools) != 0 {
		t.Errorf("an InferencePool rendered without inferencePool.create")
	}
	c := m.kvrouteConfig(t)
	if c.ExtProc.TLS.Enabled() || c.Discovery.InferencePool == nil || c.Discovery.InferencePool.Name != "llm-kvroute" {
		t.Errorf("extproc tls %+v, inference_pool %+v: want plain gRPC and the pool named after the release", c.ExtProc.TLS, c.Discovery.InferencePool)
	}
	// The grace of a vanished pool: the chart owns discovery.inference_pool, so it passes it on.
	if ip := c.Discovery.InferencePool; ip == nil || ip.Grace.D() != 90*time.Second {
		t.Errorf("inference_pool %+v: want grace 90s from endpointPicker.inferencePool.grace", ip)
	}
}

func TestChartPeers(t *testing.T) {
	out, err := render(t, "peers: {enabled: true}\nconfig: {policy: {name: prefix-aware}, auth: {mode: none}, peers: {batch_interval: 5ms}}\n")
	if err != nil {
		t.Fatal(err)
	}
	m := decodeAll(t, out)
	checkPod(t, m.deployment)
	hl := m.services["llm-kvroute-peers"]
	if hl == nil || hl.Spec.ClusterIP != corev1.ClusterIPNone || !hl.Spec.PublishNotReadyAddresses {
		t.Fatalf("peers service %+v: want headless, publishing replicas not ready yet", hl)
	}
	var got []string
	for _, p := range hl.Spec.Ports {
		got = append(got, p.Name+"/"+string(p.Protocol)+"/"+p.TargetPort.String())
	}
	if diff := cmp.Diff([]string{"peers/TCP/peers", "gossip/TCP/gossip", "gossip-udp/UDP/gossip-udp"}, got); diff != "" {
		t.Errorf("peers service ports (-want +got):\n%s", diff)
	}
	ports := containerPorts(m)
	if ports["peers"].ContainerPort != 7947 || ports["gossip"].ContainerPort != 7946 || ports["gossip-udp"].Protocol != corev1.ProtocolUDP {
		t.Errorf("container ports %v", ports)
	}

	c := m.kvrouteConfig(t)
	p := c.Peers
	if p == nil || p.Listen != "0.0.0.0:7947" || p.GossipListen != "0.0.0.0:7946" || p.DNS == nil ||
		p.DNS.Name != "llm-kvroute-peers.serving.svc.cluster.local" || p.DNS.Port != 7946 ||
		p.SecretFile != "/etc/kvroute-peers/peer-secret" || p.BatchInterval.D().Milliseconds() != 5 {
		t.Fatalf("peers %+v: want the chart's addresses, dns and secret file, and config.peers' batch_interval", p)
	}
	// The generated secret, where kvroute reads it, is one kvroute takes.
	if len(m.secrets) != 1 || m.secrets[0].Name != "llm-kvroute-peers" {
		t.Fatalf("secrets %v: want llm-kvroute-peers", m.secrets)
	}
	file := filepath.Join(t.TempDir(), "peer-secret")
	if err := os.WriteFile(file, m.secrets[0].Data["peer-secret"], 0o600); err != nil {
		t.Fatal(err)
	}
	p.SecretFile = file
	if secret, err := c.PeerSecret(nil); err != nil || len(secret) < config.MinSecretBytes {
		t.Errorf("the generated secret: %d bytes, %v", len(secret), err)
	}
	var mount, volume string
	for _, v := range m.deployment.Spec.Template.Spec.Containers[0].VolumeMounts {
		if v.Name == "peers-secret" {
			mount = v.MountPath
		}
	}
	for _, v := range m.deployment.Spec.Template.Spec.Volumes {
		if v.Name == "peers-secret" && v.Secret != nil {
			volume = v.Secret.SecretName
		}
	}
	if mount != "/etc/kvroute-peers" || volume != "llm-kvroute-peers" {
		t.Errorf("peers secret mounted at %q from %q", mount, volume)
	}

	// An existing Secret: none rendered, that one mounted.
	out, err = render(t, "peers: {enabled: true, secret: {existingSecret: router-peers, key: s}}\n")
	if err != nil {
		t.Fatal(err)
	}
	m = decodeAll(t, out)
	if len(m.secrets) != 0 || !strings.Contains(out, "secretName: router-peers") || m.kvrouteConfig(t).Peers.SecretFile != "/etc/kvroute-peers/s" {
		t.Errorf("existingSecret: %d secrets rendered, secret_file %q", len(m.secrets), m.kvrouteConfig(t).Peers.SecretFile)
	}
	// A rotation's second secret, from the same Secret.
	out, err = render(t, "peers: {enabled: true, secret: {existingSecret: router-peers, key: s, acceptKey: next}}\n")
	if err != nil {
		t.Fatal(err)
	}
	if got := decodeAll(t, out).kvrouteConfig(t).Peers.AcceptSecretFile; got != "/etc/kvroute-peers/next" {
		t.Errorf("acceptKey: accept_secret_file %q", got)
	}
	// No peers: nothing of theirs.
	out, err = render(t, "")
	if err != nil {
		t.Fatal(err)
	}
	m = decodeAll(t, out)
	if _, ok := m.services["llm-kvroute-peers"]; ok || m.kvrouteConfig(t).Peers != nil || containerPorts(m)["peers"].ContainerPort != 0 {
		t.Error("peers rendered without peers.enabled")
	}
}
