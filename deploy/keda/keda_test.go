// Package keda holds an example KEDA ScaledObject (scaledobject.yaml) that sizes the engines on
// the load kvroute exports. Its test decodes the example strictly, checks that the query reads
// metrics the router exports, with the threshold docs/kubernetes.md argues for, and, when
// promtool is installed, that Prometheus evaluates the query to the largest of the routers'
// values.
package keda

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	autoscalingv2 "k8s.io/api/autoscaling/v2"
	"sigs.k8s.io/yaml"

	"github.com/kvroute/kvroute/internal/autoscale"
	"github.com/kvroute/kvroute/internal/metrics"
)

// scaledObject is the part of KEDA's ScaledObject (keda.sh/v1alpha1) the example uses; the
// HPA behaviour is the Kubernetes type itself. Decoding strictly into it catches a misspelt
// field.
type scaledObject struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"metadata"`
	Spec struct {
		ScaleTargetRef struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Name       string `json:"name"`
		} `json:"scaleTargetRef"`
		MinReplicaCount int `json:"minReplicaCount"`
		MaxReplicaCount int `json:"maxReplicaCount"`
		PollingInterval int `json:"pollingInterval"`
		Advanced        struct {
			HorizontalPodAutoscalerConfig struct {
				Behavior autoscalingv2.HorizontalPodAutoscalerBehavior `json:"behavior"`
			} `json:"horizontalPodAutoscalerConfig"`
		} `json:"advanced"`
		Triggers []struct {
			Type       string            `json:"type"`
			MetricType string            `json:"metricType"`
			Metadata   map[string]string `json:"metadata"`
		} `json:"triggers"`
	} `json:"spec"`
}

// promScalerKeys are the Prometheus scaler's metadata keys the example may use.
var promScalerKeys = []string{"serverAddress", "query", "threshold", "activationThreshold", "ignoreNullValues", "namespace", "unsafeSsl"}

func load(t *testing.T) *scaledObject {
	t.Helper()
	b, err := os.ReadFile("scaledobject.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var so scaledObject
	if err := yaml.UnmarshalStrict(b, &so); err != nil {
		t.Fatalf("scaledobject.yaml: %v", err)
	}
	return &so
}

func TestScaledObject(t *testing.T) {
	so := load(t)
	if so.APIVersion != "keda.sh/v1alpha1" || so.Kind != "ScaledObject" {
		t.Errorf("%s %s, want keda.sh/v1alpha1 ScaledObject", so.APIVersion, so.Kind)
	}
	ref := so.Spec.ScaleTargetRef
	if ref.APIVersion != "apps/v1" || ref.Kind != "Deployment" || ref.Name == "" {
		t.Errorf("scaleTargetRef %+v, want the engines' Deployment", ref)
	}
	if so.Spec.MinReplicaCount < 1 || so.Spec.MaxReplicaCount < so.Spec.MinReplicaCount {
		t.Errorf("replicas %d..%d: want at least one engine, and max >= min", so.Spec.MinReplicaCount, so.Spec.MaxReplicaCount)
	}
	b := so.Spec.Advanced.HorizontalPodAutoscalerConfig.Behavior
	if b.ScaleDown == nil || b.ScaleDown.StabilizationWindowSeconds == nil || *b.ScaleDown.StabilizationWindowSeconds < 300 {
		t.Errorf("scaleDown %+v: want a stabilization window of at least the HPA's default 300 s", b.ScaleDown)
	}
	if len(so.Spec.Triggers) != 1 {
		t.Fatalf("%d triggers, want one", len(so.Spec.Triggers))
	}
	tr := so.Spec.Triggers[0]
	if tr.Type != "prometheus" || tr.MetricType != "AverageValue" {
		t.Errorf("trigger %s %s, want prometheus AverageValue (the HPA then asks for load / threshold engines)", tr.Type, tr.MetricType)
	}
	for k := range tr.Metadata {
		if !slices.Contains(promScalerKeys, k) {
			t.Errorf("trigger metadata %q is not a Prometheus scaler key (%v)", k, promScalerKeys)
		}
	}
	if tr.Metadata["ignoreNullValues"] != "false" {
		t.Errorf("ignoreNullValues %q: want false, so that no answer is not read as no load", tr.Metadata["ignoreNullValues"])
	}
	th, err := strconv.ParseFloat(tr.Metadata["threshold"], 64)
	if err != nil || th != 0.5 {
		t.Errorf("threshold %q: want 0.5, the target docs/kubernetes.md argues for", tr.Metadata["threshold"])
	}
	exported, err := metrics.Names()
	if err != nil {
		t.Fatal(err)
	}
	names := regexp.MustCompile(`\bkvroute_[a-z_]+`).FindAllString(tr.Metadata["query"], -1)
	if len(names) == 0 {
		t.Errorf("query %q reads no kvroute metric", tr.Metadata["query"])
	}
	for _, n := range names {
		if !slices.Contains(exported, n) {
			t.Errorf("query reads %s, which the router does not export", n)
		}
	}
}

// TestQuery evaluates the query with promtool against three router replicas that export the
// model's load, and checks the engines the HPA would then ask for.
func TestQuery(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool not installed (Debian package prometheus)")
	}
	so := load(t)
	query := so.Spec.Triggers[0].Metadata["query"]
	dir := t.TempDir()
	rules := fmt.Sprintf("groups:\n  - name: keda\n    rules:\n      - record: keda:engines_load\n        expr: %q\n", query)
	// Three replicas: one just started (less history), two that agree; and another model.
	tests := `rule_files: [rules.yaml]
evaluation_interval: 30s
tests:
  - interval: 30s
    input_series:
      - series: 'kvroute_model_load{instance="r1:9090",model="llama3-70b"}'
        values: '3.1x4'
      - series: 'kvroute_model_load{instance="r2:9090",model="llama3-70b"}'
        values: '3.2x4'
      - series: 'kvroute_model_load{instance="r3:9090",model="llama3-70b"}'
        values: '0.4x4'
      - series: 'kvroute_model_load{instance="r1:9090",model="llama3-8b"}'
        values: '9x4'
    promql_expr_test:
      - expr: keda:engines_load
        eval_time: 1m
        exp_samples:
          - labels: 'keda:engines_load'
            value: 3.2
`
	for name, body := range map[string]string{"rules.yaml": rules, "tests.yaml": tests} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(promtool, "test", "rules", "tests.yaml")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("promtool test rules: %v\n%s", err, out)
	}
	// With 4 engines and a load of 3.2, the HPA asks for ceil(3.2 / 0.5) = 7.
	th, _ := strconv.ParseFloat(so.Spec.Triggers[0].Metadata["threshold"], 64)
	hpa := autoscale.HPA{Target: th, Min: so.Spec.MinReplicaCount, Max: so.Spec.MaxReplicaCount}
	if got := hpa.Desired(4, 3.2); got != 7 {
		t.Errorf("engines asked for at load 3.2 from 4: %d, want 7", got)
	}
	if !strings.Contains(query, `model="llama3-70b"`) {
		t.Errorf("query %q: want it to pick the engines' model", query)
	}
}
