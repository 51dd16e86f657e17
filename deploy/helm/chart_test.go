// Package helm holds kvroute's Helm chart (kvroute/); its test lints and renders the chart with
// several value sets, decodes every manifest strictly into the Kubernetes API types and checks
// what the chart promises: a restricted security context, probes, least-privilege RBAC, and a
// kvroute config that kvroute itself loads.
package helm

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/policy"
)

// helmBinary finds helm: $KVROUTE_HELM (CI sets it from scripts/helm.sh), then the cache that
// script fills, then PATH.
func helmBinary(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("KVROUTE_HELM"); p != "" {
		return p
	}
	cache, err := os.UserCacheDir()
	if err == nil {
		matches, _ := filepath.Glob(filepath.Join(cache, "kvroute", "helm-*", "helm"))
		if len(matches) > 0 {
			slices.Sort(matches)
			return matches[len(matches)-1]
		}
	}
	if p, err := exec.LookPath("helm"); err == nil {
		return p
	}
	t.Skip("no helm: run KVROUTE_HELM=$(bash scripts/helm.sh) go test ./deploy/helm/ (CI does)")
	return ""
}

func helm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, helmBinary(t), args...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	if err != nil {
		return out.String(), fmt.Errorf("helm %s: %w\n%s", strings.Join(args, " "), err, errOut.String())
	}
	return out.String(), nil
}

// kubeVersion is the cluster version helm renders for (a helm built with go install does not
// know its default, and says v1.20, below the chart's kubeVersion).
const kubeVersion = "1.33.0"

// render runs helm template with values (YAML) over the chart's defaults.
func render(t *testing.T, values string) (string, error) {
	t.Helper()
	f := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(f, []byte(values), 0o600); err != nil {
		t.Fatal(err)
	}
	return helm(t, "template", "llm", "kvroute", "--namespace", "serving", "--kube-version", kubeVersion, "--values", f)
}

// strict decodes one manifest (YAML) into out, failing on a field out does not have.
func strict(doc []byte, out any) error {
	js, err := yaml.YAMLToJSON(doc)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	return dec.Decode(out)
}

// serviceMonitor is the part of the Prometheus Operator's type the chart renders (it is not in
// k8s.io/api); decoding strictly into it still catches a misspelt field.
type serviceMonitor struct {
	APIVersion string             `json:"apiVersion"`
	Kind       string             `json:"kind"`
	Metadata   map[string]any     `json:"metadata"`
	Spec       serviceMonitorSpec `json:"spec"`
}

type serviceMonitorSpec struct {
	Selector struct {
		MatchLabels map[string]string `json:"matchLabels"`
	} `json:"selector"`
	Endpoints []struct {
		Port          string `json:"port"`
		Path          string `json:"path"`
		HonorLabels   bool   `json:"honorLabels"`
		Interval      string `json:"interval"`
		ScrapeTimeout string `json:"scrapeTimeout"`
	} `json:"endpoints"`
}

// manifests is a rendered chart, by kind and name.
type manifests struct {
	deployment *appsv1.Deployment
	configMap  *corev1.ConfigMap
	secrets    []*corev1.Secret
	services   map[string]*corev1.Service
	account    *corev1.ServiceAccount
	roles      []*rbacv1.Role
	bindings   []*rbacv1.RoleBinding
	pdb        *policyv1.PodDisruptionBudget
	hpa        *autoscalingv2.HorizontalPodAutoscaler
	monitor    *serviceMonitor
	pools      []*inferencePool
	kinds      []string
}

func decodeAll(t *testing.T, out string) *manifests {
	t.Helper()
	m := &manifests{services: map[string]*corev1.Service{}}
	for _, doc := range strings.Split(out, "\n---") {
		if strings.TrimSpace(strings.ReplaceAll(doc, "---", "")) == "" {
			continue
		}
		var head struct{ APIVersion, Kind string }
		if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
			t.Fatalf("a manifest does not parse: %v\n%s", err, doc)
		}
		m.kinds = append(m.kinds, head.Kind)
		var obj any
		wantAPI := map[string]string{
			"Deployment": "apps/v1", "ConfigMap": "v1", "Secret": "v1", "Service": "v1", "ServiceAccount": "v1",
			"Role": "rbac.authorization.k8s.io/v1", "RoleBinding": "rbac.authorization.k8s.io/v1",
			"PodDisruptionBudget": "policy/v1", "HorizontalPodAutoscaler": "autoscaling/v2",
			"ServiceMonitor": "monitoring.coreos.com/v1", "InferencePool": "inference.networking.k8s.io/v1",
		}[head.Kind]
		if wantAPI == "" || head.APIVersion != wantAPI {
			t.Errorf("unexpected manifest %s %s", head.APIVersion, head.Kind)
			continue
		}
		switch head.Kind {
		case "Deployment":
			m.deployment = &appsv1.Deployment{}
			obj = m.deployment
		case "ConfigMap":
			m.configMap = &corev1.ConfigMap{}
			obj = m.configMap
		case "Secret":
			s := &corev1.Secret{}
			m.secrets = append(m.secrets, s)
			obj = s
		case "Service":
			s := &corev1.Service{}
			defer func() { m.services[s.Name] = s }()
			obj = s
		case "ServiceAccount":
			m.account = &corev1.ServiceAccount{}
			obj = m.account
		case "Role":
			r := &rbacv1.Role{}
			m.roles = append(m.roles, r)
			obj = r
		case "RoleBinding":
			b := &rbacv1.RoleBinding{}
			m.bindings = append(m.bindings, b)
			obj = b
		case "PodDisruptionBudget":
			m.pdb = &policyv1.PodDisruptionBudget{}
			obj = m.pdb
		case "HorizontalPodAutoscaler":
			m.hpa = &autoscalingv2.HorizontalPodAutoscaler{}
			obj = m.hpa
		case "ServiceMonitor":
			m.monitor = &serviceMonitor{}
			obj = m.monitor
		case "InferencePool":
			p := &inferencePool{doc: doc}
			m.pools = append(m.pools, p)
			obj = p
		}
		if err := strict([]byte(doc), obj); err != nil {
			t.Errorf("%s does not decode strictly: %v\n%s", head.Kind, err, doc)
		}
	}
	if m.deployment == nil || m.configMap == nil {
		t.Fatalf("rendered kinds %v: want a Deployment and a ConfigMap", m.kinds)
	}
	// Whatever the values, the pod stops in the order its config's drain needs.
	checkShutdown(t, m)
	return m
}

// serveChecks are the judgements kvroute serve (and serve --check) makes of its config at start
// (cmd/kvroute's configChecks): the policy's name and parameters besides what config judges
// alone. The secrets are not read: the files the rendered config names are the pod's mounts.
func serveChecks() config.Checks {
	return config.Checks{PolicyNames: policy.Names(), Policy: policy.Check}
}

// loadAsServe loads a kvroute.yaml the way kvroute serve --check does: from a file, strictly,
// with serveChecks.
func loadAsServe(t *testing.T, data string) (*config.Config, error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kvroute.yaml")
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	return config.LoadWith(path, nil, serveChecks())
}

// kvrouteConfig loads the rendered kvroute.yaml the way kvroute serve --check does.
func (m *manifests) kvrouteConfig(t *testing.T) *config.Config {
	t.Helper()
	data := m.configMap.Data["kvroute.yaml"]
	c, err := loadAsServe(t, data)
	if err != nil {
		t.Fatalf("kvroute serve --check rejects the rendered config: %v\n%s", err, data)
	}
	return c
}

func checkPod(t *testing.T, d *appsv1.Deployment) {
	t.Helper()
	spec := d.Spec.Template.Spec
	psc := spec.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser != 65532 ||
		psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod security context %+v: want non-root 65532 and the RuntimeDefault seccomp profile", psc)
	}
	if len(spec.Containers) != 1 {
		t.Fatalf("%d containers", len(spec.Containers))
	}
	c := spec.Containers[0]
	sc := c.SecurityContext
	if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.AllowPrivilegeEscalation == nil ||
		*sc.AllowPrivilegeEscalation || sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) ||
		len(sc.Capabilities.Add) != 0 || (sc.Privileged != nil && *sc.Privileged) {
		t.Errorf("container security context %+v: want a read-only root, no privilege escalation, every capability dropped", sc)
	}
	for _, p := range []struct {
		name  string
		probe *corev1.Probe
		path  string
	}{{"liveness", c.LivenessProbe, "/healthz"}, {"readiness", c.ReadinessProbe, "/readyz"}} {
		if p.probe == nil || p.probe.HTTPGet == nil || p.probe.HTTPGet.Path != p.path || p.probe.HTTPGet.Port.String() != "admin" {
			t.Errorf("%s probe %+v: want GET %s on the admin port", p.name, p.probe, p.path)
		}
	}
	if diff := cmp.Diff([]string{"serve", "--config", "/etc/kvroute/kvroute.yaml"}, c.Args); diff != "" {
		t.Errorf("args (-want +got):\n%s", diff)
	}
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	if ports["http"] != 8080 || ports["admin"] != 9090 {
		t.Errorf("container ports %v", ports)
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Limits.Memory().IsZero() {
		t.Errorf("resources %+v: want requests and a memory limit", c.Resources)
	}
}

func checkRBAC(t *testing.T, m *manifests, namespaces []string, pods bool) {
	t.Helper()
	var got []string
	discovery := 0
	for _, r := range m.roles {
		if !strings.HasSuffix(r.Name, "-discovery") {
			continue // the endpoint picker's (checkPickerRBAC)
		}
		discovery++
		got = append(got, r.Namespace)
		want := []rbacv1.PolicyRule{{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"list", "watch"}}}
		if pods {
			want = append(want, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list", "watch"}})
		}
		if diff := cmp.Diff(want, r.Rules); diff != "" {
			t.Errorf("role in %s: rules (-want +got):\n%s", r.Namespace, diff)
		}
	}
	if diff := cmp.Diff(namespaces, got); diff != "" {
		t.Errorf("roles' namespaces (-want +got):\n%s", diff)
	}
	if len(m.bindings) != len(m.roles) || discovery != len(namespaces) {
		t.Errorf("%d roles for discovery, %d roles, %d role bindings, want %d and a binding each", discovery, len(m.roles), len(m.bindings), len(namespaces))
	}
	for _, b := range m.bindings {
		if len(b.Subjects) != 1 || b.Subjects[0].Name != m.deployment.Spec.Template.Spec.ServiceAccountName || b.Subjects[0].Namespace != "serving" {
			t.Errorf("binding %s/%s subjects %+v: want the router's service account", b.Namespace, b.Name, b.Subjects)
		}
	}
	token := m.deployment.Spec.Template.Spec.AutomountServiceAccountToken
	if token == nil || *token != (len(m.roles) > 0) {
		t.Errorf("automountServiceAccountToken %v: want a token only with kubernetes discovery or the endpoint picker", token)
	}
}

func TestChartLint(t *testing.T) {
	for _, set := range []string{"", "mode=endpointPicker,endpointPicker.inferencePool.create=true,endpointPicker.inferencePool.selector.app=vllm,peers.enabled=true", "peers.enabled=true,peers.discovery=kubernetes,peers.tls.secretName=peers-tls"} {
		args := []string{"lint", "--strict", "--kube-version", kubeVersion, "kvroute"}
		if set != "" {
			args = append(args, "--set", set)
		}
		out, err := helm(t, args...)
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		if !strings.Contains(out, "0 chart(s) failed") {
			t.Errorf("helm lint --set %q: %s", set, out)
		}
	}
}

func TestChartDefaults(t *testing.T) {
	out, err := render(t, "")
	if err != nil {
		t.Fatal(err)
	}
	m := decodeAll(t, out)
	checkPod(t, m.deployment)
	if r := m.deployment.Spec.Replicas; r == nil || *r != 3 {
		t.Errorf("replicas %v, want 3", r)
	}
	if img := m.deployment.Spec.Template.Spec.Containers[0].Image; img != "kvroute/kvroute:0.1.0" {
		t.Errorf("image %q, want kvroute/kvroute:<appVersion>", img)
	}
	c := m.kvrouteConfig(t)
	if c.Listen != "0.0.0.0:8080" || c.AdminListen != "0.0.0.0:9090" {
		t.Errorf("listen %q, admin_listen %q", c.Listen, c.AdminListen)
	}
	want := []config.KubernetesDiscovery{{Service: "vllm", PortName: "http", Scheme: "http", MaxEndpoints: config.DefaultMaxEndpoints, Endpoint: config.Endpoint{Engine: "vllm"}}}
	if diff := cmp.Diff(want, c.Discovery.Kubernetes); diff != "" {
		t.Errorf("discovery.kubernetes (-want +got):\n%s", diff)
	}
	checkRBAC(t, m, []string{"serving"}, false)
	if m.pdb == nil || m.pdb.Spec.MaxUnavailable == nil || m.pdb.Spec.MaxUnavailable.IntValue() != 1 {
		t.Errorf("pod disruption budget %+v: want maxUnavailable 1", m.pdb)
	}
	if _, ok := m.services["llm-kvroute"]; !ok {
		t.Errorf("services %v: want llm-kvroute (API) and llm-kvroute-admin", m.services)
	}
	if s, ok := m.services["llm-kvroute-admin"]; !ok || s.Spec.Ports[0].Port != 9090 {
		t.Errorf("admin service %+v", s)
	}
	if m.hpa != nil || m.monitor != nil || len(m.secrets) != 0 {
		t.Errorf("optional objects rendered by default: %v", m.kinds)
	}
	if h := m.deployment.Spec.Template.Spec.Containers[0].Lifecycle; h != nil {
		t.Errorf("lifecycle %+v: want no preStop sleep (kvroute's drain delay keeps the API listener open while the endpoints follow)", h)
	}
	if env := m.deployment.Spec.Template.Spec.Containers[0].Env; len(env) != 1 || env[0].Name != "GOMEMLIMIT" || env[0].Value != "921MiB" {
		t.Errorf("env %+v: want GOMEMLIMIT at 90 %% of the 1Gi limit, 921MiB", env)
	}
}

// TestChartMemoryLimit: GOMEMLIMIT follows resources.limits.memory and memoryLimitPercent; a
// limit in a unit the chart does not read, or a percent of 0, sets none.
func TestChartMemoryLimit(t *testing.T) {
	for values, want := range map[string]string{
		"resources: {limits: {memory: 512Mi}}":                       "460MiB",
		"resources: {limits: {memory: 4Gi}}\nmemoryLimitPercent: 75": "3072MiB",
		"resources: {limits: {memory: 2G}}":                          "",
		"memoryLimitPercent: 0":                                      "",
	} {
		out, err := render(t, values)
		if err != nil {
			t.Fatal(err)
		}
		got := ""
		for _, e := range decodeAll(t, out).deployment.Spec.Template.Spec.Containers[0].Env {
			if e.Name == "GOMEMLIMIT" {
				got = e.Value
			}
		}
		if got != want {
			t.Errorf("%s: GOMEMLIMIT %q, want %q", values, got, want)
		}
	}
}

func TestChartStaticEndpointsWithExtras(t *testing.T) {
	out, err := render(t, `
kubernetesDiscovery: {enabled: false}
config:
  policy: {name: prefix-aware, params: {max_load_factor: 1.5}}
  endpoints:
    - {url: "http://vllm-0.vllm.serving.svc:8000", engine: vllm, models: [llama3-70b]}
  auth: {mode: api_key}
  tenants:
    - {name: team-a, api_keys: ["sha256:f3abf2a6cc4f00987743db5f544ba345b4899ae31f326d8ee9c4816de153c9e0"]}
saltSecret: {value: "0123456789abcdef0123456789abcdef-not-for-production"}
autoscaling: {enabled: true, minReplicas: 2, maxReplicas: 6}
serviceMonitor: {enabled: true, labels: {release: prometheus}}
podDisruptionBudget: {enabled: false}
preStopSleepSeconds: 0
image: {digest: "sha256:74a92ec4679174f9cd378bdb4a22838cba04eb7774215071e04f57b2f6a331cf"}
`)
	if err != nil {
		t.Fatal(err)
	}
	m := decodeAll(t, out)
	checkPod(t, m.deployment)
	checkRBAC(t, m, nil, false)
	if m.deployment.Spec.Replicas != nil {
		t.Errorf("replicas %d with an autoscaler: want none (the HPA owns it)", *m.deployment.Spec.Replicas)
	}
	if m.hpa == nil || *m.hpa.Spec.MinReplicas != 2 || m.hpa.Spec.MaxReplicas != 6 || m.hpa.Spec.ScaleTargetRef.Name != "llm-kvroute" {
		t.Errorf("hpa %+v", m.hpa)
	}
	if m.monitor == nil || m.monitor.Metadata["labels"].(map[string]any)["release"] != "prometheus" || m.monitor.Spec.Endpoints[0].Port != "admin" {
		t.Errorf("service monitor %+v", m.monitor)
	}
	// The Operator sets endpoint="admin" (the port's name) on every series it scrapes; without
	// honorLabels kvroute's endpoint label, which the dashboard and alerts group by, is renamed
	// exported_endpoint.
	if m.monitor != nil && !m.monitor.Spec.Endpoints[0].HonorLabels {
		t.Errorf("service monitor endpoint %+v: want honorLabels, so that kvroute's endpoint label stays endpoint", m.monitor.Spec.Endpoints[0])
	}
	if m.pdb != nil {
		t.Error("a pod disruption budget though disabled")
	}
	if len(m.secrets) != 1 || string(m.secrets[0].Data["salt"]) != "0123456789abcdef0123456789abcdef-not-for-production" {
		t.Errorf("salt secret %+v", m.secrets)
	}
	c := m.kvrouteConfig(t)
	if c.Auth == nil || c.Auth.SecretFile != "/etc/kvroute-secret/salt" || len(c.Tenants) != 1 || len(c.Endpoints) != 1 {
		t.Errorf("config: auth %+v, %d tenants, %d endpoints", c.Auth, len(c.Tenants), len(c.Endpoints))
	}
	spec := m.deployment.Spec.Template.Spec
	var mounts []string
	for _, v := range spec.Containers[0].VolumeMounts {
		mounts = append(mounts, v.MountPath)
	}
	if diff := cmp.Diff([]string{"/etc/kvroute", "/etc/kvroute-secret"}, mounts); diff != "" {
		t.Errorf("mounts (-want +got):\n%s", diff)
	}
	if img := spec.Containers[0].Image; img != "kvroute/kvroute@sha256:74a92ec4679174f9cd378bdb4a22838cba04eb7774215071e04f57b2f6a331cf" {
		t.Errorf("image %q: want the digest", img)
	}
	if spec.Containers[0].Lifecycle != nil {
		t.Errorf("lifecycle %+v with preStopSleepSeconds 0", spec.Containers[0].Lifecycle)
	}
}

func TestChartSelectorsInTwoNamespaces(t *testing.T) {
	out, err := render(t, `
kubernetesDiscovery:
  enabled: true
  watches:
    - {selector: "app.kubernetes.io/name=vllm", port_name: http, pod_metadata: true, endpoint: {engine: vllm}}
    - {namespace: gpu-b, service: sglang, port: 30000, endpoint: {engine: sglang}}
saltSecret: {existingSecret: kvroute-salt, key: secret}
rollOnConfigChange: true
`)
	if err != nil {
		t.Fatal(err)
	}
	m := decodeAll(t, out)
	checkPod(t, m.deployment)
	checkRBAC(t, m, []string{"serving", "gpu-b"}, true)
	c := m.kvrouteConfig(t)
	if len(c.Discovery.Kubernetes) != 2 || !c.Discovery.Kubernetes[0].PodMetadata || c.Discovery.Kubernetes[1].Port != 30000 {
		t.Errorf("discovery.kubernetes %+v", c.Discovery.Kubernetes)
	}
	if c.Auth.SecretFile != "/etc/kvroute-secret/secret" || len(m.secrets) != 0 {
		t.Errorf("secret_file %q, %d secrets rendered: want the existing secret's key, no new secret", c.Auth.SecretFile, len(m.secrets))
	}
	if len(m.deployment.Spec.Template.Annotations["checksum/config"]) != 64 {
		t.Errorf("pod annotations %v: want checksum/config", m.deployment.Spec.Template.Annotations)
	}
	var secretName string
	for _, v := range m.deployment.Spec.Template.Spec.Volumes {
		if v.Secret != nil {
			secretName = v.Secret.SecretName
		}
	}
	if secretName != "kvroute-salt" {
		t.Errorf("secret volume %q, want kvroute-salt", secretName)
	}
}

// TestChartSetOnAWatch: --set on an index of kubernetesDiscovery.watches replaces the default
// list, its endpoint.engine included; the chart refuses that rather than let kvroute take vLLM
// for an openai engine, and renders the watch once the engine is given as well.
func TestChartSetOnAWatch(t *testing.T) {
	args := []string{"template", "llm", "kvroute", "--namespace", "serving", "--kube-version", kubeVersion,
		"--set", "kubernetesDiscovery.watches[0].service=vllm", "--set", "kubernetesDiscovery.watches[0].port_name=http"}
	_, err := helm(t, args...)
	if want := "kubernetesDiscovery.watches[0].endpoint.engine: give the engines' kind"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("--set on watches[0] without the engine: %v, want an error saying %q", err, want)
	}
	out, err := helm(t, append(args, "--set", "kubernetesDiscovery.watches[0].endpoint.engine=vllm")...)
	if err != nil {
		t.Fatal(err)
	}
	want := []config.KubernetesDiscovery{{Service: "vllm", PortName: "http", Scheme: "http", MaxEndpoints: config.DefaultMaxEndpoints, Endpoint: config.Endpoint{Engine: "vllm"}}}
	if diff := cmp.Diff(want, decodeAll(t, out).kvrouteConfig(t).Discovery.Kubernetes); diff != "" {
		t.Errorf("discovery.kubernetes (-want +got):\n%s", diff)
	}
}

func TestChartRefusesWhatItCannotRender(t *testing.T) {
	for _, tc := range []struct{ values, want string }{
		{"config: {listen: 0.0.0.0:80}", "config.listen: leave it out"},
		{"config: {discovery: {kubernetes: []}}", "config.discovery.kubernetes: leave it out"},
		{"saltSecret: {value: short}", "saltSecret.value: at least 32 bytes"},
		{"saltSecret: {value: 0123456789abcdef0123456789abcdef, existingSecret: x}", "give value or existingSecret, not both"},
		{"kubernetesDiscovery: {watches: []}", "kubernetesDiscovery.watches: list at least one watch"},
		// What helm install --set 'kubernetesDiscovery.watches[0].service=vllm' gives: the list
		// replaced, the default's engine gone (kvroute would take the engines for openai).
		{"kubernetesDiscovery: {watches: [{service: vllm, port_name: http}]}", "kubernetesDiscovery.watches[0].endpoint.engine: give the engines' kind"},
		{"kubernetesDiscovery: {watches: [{service: vllm, endpoint: {engine: vllm}}, {service: b, endpoint: {models: [m]}}]}", "kubernetesDiscovery.watches[1].endpoint.engine: give the engines' kind"},
		{"mode: endpointPicker\nendpointPicker: {inferencePool: {create: true}}", "endpointPicker.inferencePool.selector: give the model server pods' labels"},
		{"mode: endpointPicker\nconfig: {extproc: {listen: ':9002'}}", "config.extproc.listen: leave it out"},
		{"mode: endpointPicker\nconfig: {extproc: {tls: {self_signed: true}}}", "config.extproc.tls: leave it out"},
		{"config: {discovery: {inference_pool: {name: x}}}", "config.discovery.inference_pool: leave it out"},
		{"peers: {enabled: true}\nreplicaCount: 1", "peers.enabled: a lone replica has no peers"},
		{"peers: {enabled: true, secret: {value: short}}", "peers.secret.value: at least 32 bytes"},
		{"peers: {enabled: true, secret: {value: 0123456789abcdef0123456789abcdef, existingSecret: x}}", "peers.secret: give value or existingSecret, not both"},
		{"peers: {enabled: true, gossipPort: 7947}", "peers.gossipPort: the same as peers.port"},
		{"peers: {enabled: true, secret: {acceptKey: next}}", "peers.secret.acceptKey: a key of existingSecret"},
		{"peers: {enabled: true, secret: {existingSecret: x, key: s, acceptKey: s}}", "peers.secret.acceptKey: the same as peers.secret.key"},
		{"peers: {enabled: true}\nconfig: {peers: {accept_secret_env: X}}", "config.peers.accept_secret_env: leave it out"},
		{"peers: {enabled: true}\nconfig: {peers: {static: [a:1]}}", "config.peers.static: leave it out"},
		{"config: {peers: {batch_interval: 5ms}}", "config.peers: set peers.enabled: true as well"},
	} {
		_, err := render(t, tc.values)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("values %q: %v, want an error saying %q", tc.values, err, tc.want)
		}
	}
}

// TestChartConfigJudgedAsServeDoes: the rendered config is held to what kvroute serve --check
// judges, not only to what the config package judges alone: a misspelt policy parameter
// decodes (policy.params is free-form) and would stop every pod at start.
func TestChartConfigJudgedAsServeDoes(t *testing.T) {
	out, err := render(t, "config: {policy: {name: prefix-aware, params: {max_load_factr: 1.5}}}")
	if err != nil {
		t.Fatal(err)
	}
	data := decodeAll(t, out).configMap.Data["kvroute.yaml"]
	if _, err := config.Parse([]byte(data)); err != nil {
		t.Fatalf("config.Parse: %v; the case needs a config that only serve's checks refuse", err)
	}
	if _, err := loadAsServe(t, data); err == nil || !strings.Contains(err.Error(), `policy.params: policy prefix-aware: unknown parameter "max_load_factr"`) {
		t.Errorf("a misspelt policy parameter: %v, want serve's checks to name it", err)
	}
	// The defaults draw no warning from serve --check either.
	out, err = render(t, "")
	if err != nil {
		t.Fatal(err)
	}
	if w := decodeAll(t, out).kvrouteConfig(t).Warnings; len(w) != 0 {
		t.Errorf("the default config draws warnings: %q", w)
	}
}
