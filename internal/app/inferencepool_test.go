package app

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	k8sfake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kvroute/kvroute/internal/discovery/inferencepool"
	"github.com/kvroute/kvroute/internal/testkube"
)

// poolPod is a model server pod of the InferencePool in the test: labelled app=vllm.
func poolPod(name, ip string, ready bool) *corev1.Pod {
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "inference", Labels: map[string]string{"app": "vllm"}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}},
	}
}

// TestRouterInferencePool: a router whose only endpoints come from discovery.inference_pool
// (a fake API server) routes to the pool's ready pods, with the section's endpoint template,
// and follows them as they turn ready, terminate and leave.
func TestRouterInferencePool(t *testing.T) {
	eng := newFakeEngine(t)
	_, port, err := net.SplitHostPort(eng.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	portNum, _ := strconv.Atoi(port)
	pool := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
		"metadata": map[string]any{"name": "llama", "namespace": "inference"},
		"spec": map[string]any{
			"selector":          map[string]any{"matchLabels": map[string]any{"app": "vllm"}},
			"targetPorts":       []any{map[string]any{"number": int64(portNum)}},
			"endpointPickerRef": map[string]any{"name": "kvroute", "port": map[string]any{"number": int64(9002)}},
		},
	}}
	// Pod a is the fake engine; b (127.0.0.2, same port) never gets a request in this test.
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{inferencepool.Resource: "InferencePoolList"}, pool)
	kc := k8sfake.NewClientset(poolPod("a", "127.0.0.1", true), poolPod("b", "127.0.0.2", false))
	// The fake API server does not replay what happened between a list and its watch: nothing
	// changes until both watches are open.
	watched := make(chan string, 4)
	onWatch := func(a k8stesting.Action) (bool, watch.Interface, error) {
		watched <- a.GetResource().Resource
		return false, nil, nil
	}
	dyn.PrependWatchReactor("inferencepools", onWatch)
	kc.PrependWatchReactor("pods", onWatch)

	// The kubeconfig names an API server nobody listens on (and the namespace): the fakes
	// replace it.
	kubeconfig := testkube.Kubeconfig(t, "inference")
	r := routerFromYAML(t, fmt.Sprintf(`
auth: {mode: none}
scrape: {disabled: true}
health: {interval: 1h}
discovery:
  inference_pool: {name: llama, kubeconfig: %q, grace: 200ms, endpoint: {engine: sglang, models: [m]}}
`, kubeconfig))
	r.PoolClient, r.KubeClient = dyn, kc
	ctx, cancel := context.WithCancel(context.Background())
	runDone := make(chan error, 1)
	go func() { runDone <- r.Run(ctx) }()
	defer func() {
		cancel()
		select {
		case err := <-runDone:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Run did not return")
		}
	}()
	for range 2 {
		select {
		case <-watched:
		case <-time.After(10 * time.Second):
			t.Fatal("the informers did not start watching")
		}
	}

	const source = "inferencepool:inference/llama"
	a, b := "http://127.0.0.1:"+port, "http://127.0.0.2:"+port
	poolIs := func(what string, want ...string) {
		t.Helper()
		var got []string
		var n float64
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
			got = got[:0]
			for _, e := range r.Pool().All() {
				got = append(got, e.Name)
			}
			slices.Sort(got)
			// The gauge is set just after the pool changes.
			n = testutil.ToFloat64(r.Metrics().DiscoveredEndpoints.WithLabelValues(source))
			if slices.Equal(got, want) && n == float64(len(want)) {
				return
			}
		}
		t.Fatalf("%s: pool %v, discovered endpoints metric %v; want %v within 10s", what, got, n, want)
	}
	poolIs("start: the ready pod", a)
	ep := r.Pool().All()[0]
	if ep.Engine != "sglang" || !cmp.Equal(ep.Models, []string{"m"}) {
		t.Errorf("endpoint %s: engine %q, models %v: want the template's sglang and [m]", ep.Name, ep.Engine, ep.Models)
	}
	rec := httptest.NewRecorder()
	r.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(chatBody)))
	if rec.Code != http.StatusOK || len(eng.received()) != 1 {
		t.Fatalf("a request through the router: %d %s, the pod received %d", rec.Code, rec.Body, len(eng.received()))
	}

	pods := kc.CoreV1().Pods("inference")
	if _, err := pods.UpdateStatus(ctx, poolPod("b", "127.0.0.2", true), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	poolIs("b turns ready", a, b)
	term := poolPod("a", "127.0.0.1", true)
	now := metav1.Now()
	term.DeletionTimestamp = &now
	if _, err := pods.Update(ctx, term, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	poolIs("a terminates", b)
	if err := dyn.Resource(inferencepool.Resource).Namespace("inference").Delete(ctx, "llama", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	poolIs("the pool is deleted, and its grace is over")
}
