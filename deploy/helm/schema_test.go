package helm

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/yaml"
)

// renderWith runs helm template with values (YAML) over the chart's defaults and extra flags.
func renderWith(t *testing.T, values string, flags ...string) (string, error) {
	t.Helper()
	f := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(f, []byte(values), 0o600); err != nil {
		t.Fatal(err)
	}
	args := []string{"template", "llm", "kvroute", "--namespace", "serving", "--kube-version", kubeVersion, "--values", f}
	return helm(t, append(args, flags...)...)
}

// TestChartSchemaRefuses: values.schema.json refuses a misspelt key of the chart's own objects
// and a value of the wrong type or out of range, naming the key, where the templates alone
// rendered them (a ServiceMonitor silently left out, "replicas: two").
func TestChartSchemaRefuses(t *testing.T) {
	for _, tc := range []struct {
		set    []string // --set flags
		values string
		want   string
	}{
		// The new user's QA: a typo for enabled, and a word for a number.
		{set: []string{"serviceMonitor.enable=true"}, want: "at '/serviceMonitor': additional properties 'enable' not allowed"},
		{set: []string{"replicaCount=two"}, want: "at '/replicaCount': got string, want integer"},
		{set: []string{"replicaCount=0"}, want: "at '/replicaCount': minimum: got 0, want 1"},
		{values: "replicas: 3", want: "at '': additional properties 'replicas' not allowed"},
		{values: "autoscaling: {enabled: true, minReplica: 2}", want: "at '/autoscaling': additional properties 'minReplica' not allowed"},
		{values: "peers: {enabled: true, secret: {existingSecert: x}}", want: "at '/peers/secret': additional properties 'existingSecert' not allowed"},
		{values: "endpointPicker: {inferencePool: {selectors: {app: vllm}}}", want: "at '/endpointPicker/inferencePool': additional properties 'selectors' not allowed"},
		{values: "service: {api: {port: 70000}}", want: "at '/service/api/port': maximum: got 70,000, want 65,535"},
		{values: "service: {admin: {type: Internal}}", want: "at '/service/admin/type': value must be one of 'ClusterIP', 'NodePort', 'LoadBalancer'"},
		// A tag of digits, unquoted or through --set, is a number, which the image's name would
		// render as %!s(float64=2.0251201e+07): give it as a string (--set-string).
		{set: []string{"image.tag=20251201"}, want: "at '/image/tag': got number, want string"},
		{values: "image: {tag: 20251201}", want: "at '/image/tag': got number, want string"},
		{values: "image: {pullPolicy: always}", want: "at '/image/pullPolicy': value must be one of 'Always', 'IfNotPresent', 'Never'"},
		{values: "image: {digest: 74a92ec4679174f9cd378bdb4a22838cba04eb7774215071e04f57b2f6a331cf}", want: "at '/image/digest'"},
		{values: "podAnnotations: {a: 1}", want: "at '/podAnnotations/a': got number, want string"},
		{values: "memoryLimitPercent: 150", want: "at '/memoryLimitPercent': maximum: got 150, want 100"},
		{values: "serviceMonitor: {enabled: true, interval: 15}", want: "at '/serviceMonitor/interval': got number, want string"},
		{values: "podDeletionCost: {minChange: 2}", want: "at '/podDeletionCost/minChange': maximum: got 2, want 1"},
		{values: "kubernetesDiscovery: {enabled: 'yes'}", want: "at '/kubernetesDiscovery/enabled': got string, want boolean"},
		{values: "podDisruptionBudget: {maxUnavailable: half}", want: "at '/podDisruptionBudget/maxUnavailable': 'anyOf' failed"},
	} {
		var flags []string
		for _, s := range tc.set {
			flags = append(flags, "--set", s)
		}
		_, err := renderWith(t, tc.values, flags...)
		if err == nil || !strings.Contains(err.Error(), "values don't meet the specifications of the schema") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("--set %q, values %q: %v, want the schema to refuse it saying %q", tc.set, tc.values, err, tc.want)
		}
	}
	// helm lint checks the values against the schema as well.
	out, err := helm(t, "lint", "--strict", "--kube-version", kubeVersion, "kvroute", "--set", "serviceMonitor.enable=true")
	if want := "at '/serviceMonitor': additional properties 'enable' not allowed"; err == nil || !strings.Contains(out, want) {
		t.Errorf("helm lint --set serviceMonitor.enable=true: %v, want it to fail saying %q\n%s", err, want, out)
	}
}

// TestChartSchemaLeavesPassThroughOpen: the objects the chart passes to Kubernetes or to
// kvroute's config as they are take any key (Kubernetes and kvroute judge them), and reach the
// manifests.
func TestChartSchemaLeavesPassThroughOpen(t *testing.T) {
	out, err := render(t, `
global: {team: inference}
image: {tag: "20251201"}
imagePullSecrets: [{name: regcred}]
podAnnotations: {example.com/owner: inference}
podLabels: {team: inference}
nodeSelector: {kubernetes.io/arch: arm64}
tolerations: [{key: dedicated, operator: Equal, value: router, effect: NoSchedule}]
affinity: {podAntiAffinity: {preferredDuringSchedulingIgnoredDuringExecution: [{weight: 100, podAffinityTerm: {topologyKey: kubernetes.io/hostname}}]}}
topologySpreadConstraints: [{maxSkew: 1, topologyKey: topology.kubernetes.io/zone, whenUnsatisfiable: ScheduleAnyway}]
podSecurityContext: {fsGroupChangePolicy: OnRootMismatch}
resources: {requests: {ephemeral-storage: 1Gi}}
livenessProbe: {initialDelaySeconds: 5}
config: {limits: {max_retries: 1}}
kubernetesDiscovery:
  watches: [{service: vllm, port_name: http, scheme: https, endpoint: {engine: vllm, models: [llama3-70b]}}]
`)
	if err != nil {
		t.Fatal(err)
	}
	m := decodeAll(t, out)
	checkPod(t, m.deployment)
	tmpl := m.deployment.Spec.Template
	spec := tmpl.Spec
	c := spec.Containers[0]
	got := map[string]any{
		"image":               c.Image,
		"pull secret":         spec.ImagePullSecrets[0].Name,
		"annotation":          tmpl.Annotations["example.com/owner"],
		"label":               tmpl.Labels["team"],
		"node selector":       spec.NodeSelector["kubernetes.io/arch"],
		"toleration":          spec.Tolerations[0].Key,
		"anti-affinity":       spec.Affinity != nil && spec.Affinity.PodAntiAffinity != nil,
		"spread":              spec.TopologySpreadConstraints[0].TopologyKey,
		"fsGroupChangePolicy": spec.SecurityContext.FSGroupChangePolicy != nil,
		"ephemeral-storage":   c.Resources.Requests.StorageEphemeral().String(),
		"initialDelaySeconds": c.LivenessProbe.InitialDelaySeconds,
	}
	want := map[string]any{
		"image":               "kvroute/kvroute:20251201",
		"pull secret":         "regcred",
		"annotation":          "inference",
		"label":               "inference",
		"node selector":       "arm64",
		"toleration":          "dedicated",
		"anti-affinity":       true,
		"spread":              "topology.kubernetes.io/zone",
		"fsGroupChangePolicy": true,
		"ephemeral-storage":   "1Gi",
		"initialDelaySeconds": int32(5),
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("pass-through values (-want +got):\n%s", diff)
	}
	cfg := m.kvrouteConfig(t)
	if cfg.Limits.MaxRetries == nil || *cfg.Limits.MaxRetries != 1 || len(cfg.Discovery.Kubernetes) != 1 || cfg.Discovery.Kubernetes[0].Scheme != "https" ||
		!slices.Equal(cfg.Discovery.Kubernetes[0].Endpoint.Models, []string{"llama3-70b"}) {
		t.Errorf("config: limits %+v, discovery.kubernetes %+v", cfg.Limits, cfg.Discovery.Kubernetes)
	}
}

// TestChartTemplateChecksBehindTheSchema: what the schema now refuses first, the templates
// still refuse with their own fix when it is skipped (helm's --skip-schema-validation).
func TestChartTemplateChecksBehindTheSchema(t *testing.T) {
	for _, tc := range []struct{ values, schema, template string }{
		{"mode: proxy", "at '/mode': value must be one of 'standalone', 'endpointPicker'",
			`mode: "proxy" is not a mode: use standalone or endpointPicker`},
		{"mode: endpointPicker\nendpointPicker: {inferencePool: {create: true, selector: {a: b}, failureMode: Open}}",
			"at '/endpointPicker/inferencePool/failureMode': value must be one of 'FailClose', 'FailOpen'",
			`failureMode: "Open": use FailClose or FailOpen`},
		{"peers: {enabled: true, discovery: api}", "at '/peers/discovery': value must be one of 'dns', 'kubernetes'",
			`peers.discovery: "api": use dns (the headless Service's name) or kubernetes`},
		{"preStopSleepSeconds: 2.5", "at '/preStopSleepSeconds': 'anyOf' failed",
			`preStopSleepSeconds: "2.5": give whole seconds (0: no sleep), or auto`},
		{"preStopSleepSeconds: -1", "at '/preStopSleepSeconds': 'anyOf' failed", `preStopSleepSeconds: "-1"`},
		{"terminationGracePeriodSeconds: 1m", "at '/terminationGracePeriodSeconds': got string, want integer",
			`terminationGracePeriodSeconds: "1m": give whole seconds`},
	} {
		if _, err := renderWith(t, tc.values); err == nil || !strings.Contains(err.Error(), tc.schema) {
			t.Errorf("values %q: %v, want the schema to refuse it saying %q", tc.values, err, tc.schema)
		}
		if _, err := renderWith(t, tc.values, "--skip-schema-validation"); err == nil || !strings.Contains(err.Error(), tc.template) {
			t.Errorf("values %q, --skip-schema-validation: %v, want the templates to refuse it saying %q", tc.values, err, tc.template)
		}
	}
}

// TestChartSchemaMatchesValues: every object of the schema that refuses unknown keys lists
// exactly the keys values.yaml gives it, so that a value added to values.yaml without the
// schema (refused at once by every render), or a key left in the schema after values.yaml
// dropped it (quietly accepted and ignored), is caught here.
func TestChartSchemaMatchesValues(t *testing.T) {
	var schema map[string]any
	data, err := os.ReadFile("kvroute/values.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &schema); err != nil {
		t.Fatalf("values.schema.json: %v", err)
	}
	var values map[string]any
	data, err = os.ReadFile("kvroute/values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, &values); err != nil {
		t.Fatalf("values.yaml: %v", err)
	}
	defs, _ := schema["definitions"].(map[string]any)
	closed := 0
	var walk func(path string, s map[string]any, v any)
	walk = func(path string, s map[string]any, v any) {
		if ref, ok := s["$ref"].(string); ok {
			def, ok := defs[strings.TrimPrefix(ref, "#/definitions/")].(map[string]any)
			if !ok {
				t.Errorf("%s: $ref %q names no definition", path, ref)
				return
			}
			s = def
		}
		obj, isObj := v.(map[string]any)
		if s["additionalProperties"] != false || !isObj {
			return
		}
		closed++
		props, _ := s["properties"].(map[string]any)
		var inSchema, inValues []string
		for k := range props {
			if !(path == "" && k == "global") {
				inSchema = append(inSchema, k)
			}
		}
		for k := range obj {
			inValues = append(inValues, k)
		}
		slices.Sort(inSchema)
		slices.Sort(inValues)
		if diff := cmp.Diff(inValues, inSchema); diff != "" {
			t.Errorf("keys of %q: values.yaml (-) and values.schema.json (+) differ:\n%s", "/"+path, diff)
		}
		for k, sub := range props {
			if subSchema, ok := sub.(map[string]any); ok {
				walk(strings.TrimPrefix(path+"/"+k, "/"), subSchema, obj[k])
			}
		}
	}
	walk("", schema, values)
	// The root, image, kubernetesDiscovery, podDeletionCost, saltSecret, endpointPicker (3),
	// peers (3), service (3), serviceAccount, podDisruptionBudget, autoscaling, serviceMonitor.
	if closed != 18 {
		t.Errorf("%d closed objects walked, want 18: update the count with the schema", closed)
	}
}
