package kube

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/time/rate"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kvroute/kvroute/internal/config"
)

// costs reads the pods' pod-deletion-cost annotations ("" where there is none).
func costs(t *testing.T, client *fake.Clientset, pods ...string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, p := range pods {
		got, err := client.CoreV1().Pods(ns).Get(context.Background(), p, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		out[p] = got.Annotations[DeletionCostAnnotation]
	}
	return out
}

// patches counts the patch actions the fake API server has seen.
func patches(client *fake.Clientset) int {
	n := 0
	for _, a := range client.Actions() {
		if a.GetVerb() == "patch" {
			n++
		}
	}
	return n
}

func TestCost(t *testing.T) {
	for _, c := range []struct {
		v    float64
		want int32
	}{{0, 0}, {-3, 0}, {math.NaN(), 0}, {1.4, 1}, {1.6, 2}, {123456.5, 123457}, {1e12, math.MaxInt32}, {math.Inf(1), math.MaxInt32}} {
		if got := Cost(c.v); got != c.want {
			t.Errorf("Cost(%g) = %d, want %d", c.v, got, c.want)
		}
	}
}

// TestCostWriter: the first pass writes every pod; later passes patch only the pods whose value
// moved by more than MinChange; other annotations stay; a pod that left discovery and comes
// back is written again.
func TestCostWriter(t *testing.T) {
	client := fake.NewClientset(pod("a", map[string]string{"keep": "me"}), pod("b", nil), pod("c", nil))
	vals := map[string]float64{ns + "/a": 5000.4, ns + "/b": 0, ns + "/c": 800}
	w := &CostWriter{Client: client, MinChange: 0.2, Values: func() []PodValue {
		var out []PodValue
		for p, v := range vals {
			out = append(out, PodValue{p, v})
		}
		return out
	}}
	ctx := context.Background()
	if n := w.Write(ctx); n != 3 {
		t.Errorf("first pass patched %d pods, want 3", n)
	}
	if diff := cmp.Diff(map[string]string{"a": "5000", "b": "0", "c": "800"}, costs(t, client, "a", "b", "c")); diff != "" {
		t.Errorf("costs (-want +got):\n%s", diff)
	}
	if got, _ := client.CoreV1().Pods(ns).Get(ctx, "a", metav1.GetOptions{}); got.Annotations["keep"] != "me" {
		t.Errorf("pod a's other annotations: %v, want keep=me kept", got.Annotations)
	}
	before := patches(client)
	vals[ns+"/a"] = 5900 // 15 %: not worth a patch
	vals[ns+"/c"] = 1200 // 33 %
	if n := w.Write(ctx); n != 1 || patches(client) != before+1 {
		t.Errorf("second pass patched %d pods (%d patches sent), want 1", n, patches(client)-before)
	}
	if diff := cmp.Diff(map[string]string{"a": "5000", "b": "0", "c": "1200"}, costs(t, client, "a", "b", "c")); diff != "" {
		t.Errorf("costs after the second pass (-want +got):\n%s", diff)
	}
	// b leaves discovery, and comes back with the same value: written again (its pod may be a
	// new one under the same name).
	delete(vals, ns+"/b")
	w.Write(ctx)
	vals[ns+"/b"] = 0
	before = patches(client)
	if n := w.Write(ctx); n != 1 || patches(client) != before+1 {
		t.Errorf("b back: patched %d, want 1", n)
	}
}

// TestCostWriter_RateLimited: with a budget of one patch at a time, a pass patches the largest
// move first and leaves the others for the next passes, as the budget refills; a pod the API
// server does not know is reported and tried again, and does not stop the others.
func TestCostWriter_RateLimited(t *testing.T) {
	client := fake.NewClientset(pod("a", nil), pod("b", nil), pod("c", nil))
	now := time.Unix(1000, 0)
	var errs []error
	w := &CostWriter{
		Client: client, Limit: rate.NewLimiter(1, 1), Now: func() time.Time { return now },
		OnError: func(err error) { errs = append(errs, err) },
		Values: func() []PodValue {
			return []PodValue{{ns + "/a", 10}, {ns + "/b", 20}, {ns + "/c", 30}}
		},
	}
	ctx := context.Background()
	// Never written: all tie as first writes; then by name.
	if n := w.Write(ctx); n != 1 {
		t.Fatalf("first pass patched %d, want 1 (budget of one)", n)
	}
	if n := w.Write(ctx); n != 0 {
		t.Errorf("same instant: patched %d, want 0 (no budget left)", n)
	}
	now = now.Add(time.Second)
	w.Write(ctx)
	now = now.Add(time.Second)
	w.Write(ctx)
	if diff := cmp.Diff(map[string]string{"a": "10", "b": "20", "c": "30"}, costs(t, client, "a", "b", "c")); diff != "" {
		t.Errorf("after three refills (-want +got):\n%s", diff)
	}
	// The largest move goes first.
	w.Values = func() []PodValue { return []PodValue{{ns + "/a", 100}, {ns + "/b", 2000}, {ns + "/c", 30}} }
	now = now.Add(time.Second)
	w.Write(ctx)
	if got := costs(t, client, "a", "b")["b"]; got != "2000" {
		t.Errorf("b's move (1980) is the largest: b is %q, want 2000 first", got)
	}
	// A pod the API server does not know.
	w.Values = func() []PodValue { return []PodValue{{ns + "/gone", 5}, {ns + "/a", 100}, {"no-namespace", 1}} }
	w.Limit = nil
	if n := w.Write(ctx); n != 1 {
		t.Errorf("with a missing pod: patched %d, want 1 (a)", n)
	}
	msg := errors.Join(errs...).Error()
	for _, want := range []string{"pod-deletion-cost of pod " + ns + "/gone", `pod "no-namespace" is not namespace/name`} {
		if !strings.Contains(msg, want) {
			t.Errorf("errors lack %q: %s", want, msg)
		}
	}
	errs = nil
	w.Write(ctx)
	if len(errs) != 2 {
		t.Errorf("the next pass reported %d errors, want the two pods tried again", len(errs))
	}
}

// TestCostWriter_Run: Run writes at once and then every interval, and returns when its context
// ends.
func TestCostWriter_Run(t *testing.T) {
	client := fake.NewClientset(pod("a", nil))
	passes := make(chan struct{}, 10)
	w := &CostWriter{Client: client, Interval: time.Millisecond, Values: func() []PodValue {
		passes <- struct{}{}
		return []PodValue{{ns + "/a", 7}}
	}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	for range 3 {
		select {
		case <-passes:
		case <-time.After(10 * time.Second):
			t.Fatal("no pass within 10s")
		}
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Run = %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return within 10s of its context's end")
	}
	if got := costs(t, client, "a")["a"]; got != "7" {
		t.Errorf("a = %q, want 7", got)
	}
	// Only patches: the writer reads nothing (its RBAC is patch alone).
	for _, a := range client.Actions() {
		if a.GetVerb() != "patch" && a.GetVerb() != "get" { // get: this test's own reads
			t.Errorf("action %s %s: the writer should only patch", a.GetVerb(), a.GetResource().Resource)
		}
		if p, ok := a.(k8stesting.PatchAction); ok && !strings.Contains(string(p.GetPatch()), DeletionCostAnnotation) {
			t.Errorf("patch %s touches more than the annotation", p.GetPatch())
		}
	}
}

// TestSource_Pods: a source remembers which pod is behind each endpoint it gave.
func TestSource_Pods(t *testing.T) {
	v4 := discoveryv1.AddressTypeIPv4
	client := fake.NewClientset(slice("vllm-1", "vllm", v4, httpPort, nil,
		ep("10.0.0.1", "a", "ready"), ep("10.0.0.2", "", "ready"), ep("10.0.0.3", "c", "not-ready")))
	src := source(client, config.KubernetesDiscovery{Service: "vllm", PortName: "http", Scheme: "http"})
	if src.Pods() != nil {
		t.Errorf("before any set: %v, want nil", src.Pods())
	}
	next, _ := run(t, src)
	next()
	want := map[string]string{"http://10.0.0.1:8000": ns + "/a"} // 10.0.0.2 names no pod; c is not ready
	if diff := cmp.Diff(want, src.Pods()); diff != "" {
		t.Errorf("pods (-want +got):\n%s", diff)
	}
}
