package config

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestParse_Autoscale(t *testing.T) {
	c, err := Parse([]byte(`
auth: {mode: none}
discovery:
  kubernetes: [{service: vllm}]
autoscale:
  window: 30s
  prefill_rate: 30000
  pod_deletion_cost: {enabled: true, min_change: 0}
`))
	if err != nil {
		t.Fatal(err)
	}
	zero := 0.0
	want := Autoscale{Window: Duration(30 * time.Second), PrefillRate: 30000,
		PodDeletionCost: PodDeletionCost{Enabled: true, Interval: Duration(time.Minute), MinChange: &zero, PatchesPerSecond: 1}}
	if diff := cmp.Diff(want, c.Autoscale); diff != "" {
		t.Errorf("autoscale (-want +got):\n%s", diff)
	}
	if got := c.Autoscale.PodDeletionCost.MinChangeValue(); got != 0 {
		t.Errorf("min_change 0 given: %g, want 0 (patch every change), not the default", got)
	}
	if got := (PodDeletionCost{}).MinChangeValue(); got != DefaultDeletionCostMinChange {
		t.Errorf("min_change unset: %g, want %g", got, DefaultDeletionCostMinChange)
	}
}

func TestParse_AutoscaleProblems(t *testing.T) {
	_, err := Parse([]byte(`
auth: {mode: none}
endpoints: [{url: "http://127.0.0.1:8000"}]
autoscale:
  window: 10ms
  prefill_rate: -5
  pod_deletion_cost: {enabled: true, interval: 1ms, min_change: 1.5, patches_per_second: -1}
`))
	if err == nil {
		t.Fatal("want an error")
	}
	for _, want := range []string{
		"autoscale.window: 10ms: give at least 1s",
		"autoscale.prefill_rate: -5: give one engine's prefill tokens per second",
		"autoscale.pod_deletion_cost.interval: 1ms: give at least 1s",
		"autoscale.pod_deletion_cost.min_change: 1.5: give a share from 0",
		"autoscale.pod_deletion_cost.patches_per_second: -1: give a positive rate",
		"autoscale.pod_deletion_cost.enabled: needs discovery.kubernetes",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q; got:\n%v", want, err)
		}
	}
}
