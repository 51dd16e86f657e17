package inferencepool

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	k8sfake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/endpoint"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const ns = "inference"

func inferencePool(match map[string]any, ports ...int64) *unstructured.Unstructured {
	tps := make([]any, len(ports))
	for i, p := range ports {
		tps[i] = map[string]any{"number": p}
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
		"metadata": map[string]any{"name": "llama", "namespace": ns},
		"spec": map[string]any{
			"selector":          map[string]any{"matchLabels": match},
			"targetPorts":       tps,
			"endpointPickerRef": map[string]any{"name": "kvroute", "port": map[string]any{"number": int64(9002)}},
		},
	}}
}

func pod(name, ip, app string, ready bool) *corev1.Pod {
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": app}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}},
	}
}

// world is a fake API server holding an InferencePool and pods, with a Source on it.
type world struct {
	dyn     *dynamicfake.FakeDynamicClient
	kube    *k8sfake.Clientset
	sets    chan []string
	errs    chan error
	watched chan string // the resource of each watch the informers opened
	stop    func()
}

func newWorld(t *testing.T, pool *unstructured.Unstructured, pods ...runtime.Object) *world {
	t.Helper()
	return newWorldWith(t, nil, pool, pods...)
}

// newWorldWith is newWorld with the Source first passed to with (when not nil).
func newWorldWith(t *testing.T, with func(*Source), pool *unstructured.Unstructured, pods ...runtime.Object) *world {
	t.Helper()
	w := &world{sets: make(chan []string, 16), errs: make(chan error, 16), watched: make(chan string, 16)}
	var objs []runtime.Object
	if pool != nil {
		objs = append(objs, pool)
	}
	w.dyn = dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{Resource: "InferencePoolList"}, objs...)
	w.kube = k8sfake.NewClientset(pods...)
	// The fake API server does not replay what happened between a list and its watch: the
	// test changes nothing until both watches are open.
	onWatch := func(a k8stesting.Action) (bool, watch.Interface, error) {
		w.watched <- a.GetResource().Resource
		return false, nil, nil
	}
	w.dyn.PrependWatchReactor("inferencepools", onWatch)
	w.kube.PrependWatchReactor("pods", onWatch)
	src := &Source{Namespace: ns, Name: "llama", Pools: w.dyn, Pods: w.kube,
		Endpoint: config.Endpoint{Models: []string{"llama3-70b"}, Engine: "vllm"},
		OnError:  func(err error) { w.errs <- err }}
	if with != nil {
		with(src)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- src.Run(ctx, func(specs []endpoint.Spec) error {
			names := []string{}
			for _, s := range specs {
				if s.Engine != "vllm" || len(s.Models) != 1 || s.Models[0] != "llama3-70b" {
					t.Errorf("%s lacks the template: %+v", s.Name, s)
				}
				names = append(names, s.Name)
			}
			w.sets <- names
			return nil
		})
	}()
	var once sync.Once
	w.stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if !errors.Is(err, context.Canceled) {
					t.Errorf("Run = %v, want context.Canceled", err)
				}
			case <-time.After(10 * time.Second):
				t.Error("Run did not return")
			}
		})
	}
	t.Cleanup(w.stop)
	for range 2 {
		select {
		case <-w.watched:
		case <-time.After(10 * time.Second):
			t.Fatal("the informers did not start watching")
		}
	}
	return w
}

// next waits for the next set of endpoint names.
func (w *world) next(t *testing.T) []string {
	t.Helper()
	select {
	case s := <-w.sets:
		return s
	case <-time.After(10 * time.Second):
		t.Fatal("no new set of endpoints")
		return nil
	}
}

// TestSourceFollowsPoolAndPods: churn of pods and of the pool itself, each change reaching the
// router within one informer event.
func TestSourceFollowsPoolAndPods(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t, inferencePool(map[string]any{"app": "vllm"}, 8000),
		pod("a", "10.0.0.1", "vllm", true), pod("b", "10.0.0.2", "vllm", false), pod("c", "10.0.0.3", "other", true),
		pod("d", "fd00::4", "vllm", true))
	step := func(what string, want ...string) {
		t.Helper()
		if diff := cmp.Diff(want, w.next(t)); diff != "" {
			t.Errorf("%s: endpoints (-want +got):\n%s", what, diff)
		}
	}
	step("start: the ready pods the selector picks", "http://10.0.0.1:8000", "http://[fd00::4]:8000")

	pods := w.kube.CoreV1().Pods(ns)
	if _, err := pods.UpdateStatus(ctx, pod("b", "10.0.0.2", "vllm", true), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	step("b turns ready", "http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://[fd00::4]:8000")

	term := pod("a", "10.0.0.1", "vllm", true)
	now := metav1.Now()
	term.DeletionTimestamp = &now
	if _, err := pods.Update(ctx, term, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	step("a terminates", "http://10.0.0.2:8000", "http://[fd00::4]:8000")
	if err := pods.Delete(ctx, "d", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	step("d is removed", "http://10.0.0.2:8000")

	pools := w.dyn.Resource(Resource).Namespace(ns)
	if _, err := pools.Update(ctx, inferencePool(map[string]any{"app": "vllm"}, 8000, 8001), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	step("a second target port", "http://10.0.0.2:8000", "http://10.0.0.2:8001")
	if _, err := pools.Update(ctx, inferencePool(map[string]any{"app": "other"}, 8000), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	step("the selector changes", "http://10.0.0.3:8000")

	// A spec without a port is refused (TestSourceRefusesInvalidSpec); the fix is followed.
	if _, err := pools.Update(ctx, inferencePool(map[string]any{"app": "other"}), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := w.nextErr(t); !strings.Contains(err.Error(), "spec.targetPorts is empty") {
		t.Errorf("error %v, want it to name spec.targetPorts", err)
	}
	if _, err := pools.Update(ctx, inferencePool(map[string]any{"app": "other"}, 8000, 8002), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	step("fixed, with a second port", "http://10.0.0.3:8000", "http://10.0.0.3:8002")
	w.stop()
}

// nextErr waits for the next problem reported.
func (w *world) nextErr(t *testing.T) error {
	t.Helper()
	select {
	case err := <-w.errs:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("no problem reported")
		return nil
	}
}

// TestSourcePoolGoneAndBack: a pool deleted and created again (a helm upgrade that recreates
// it) keeps its endpoints meanwhile, said once, its pods still followed by its last selector
// and ports; the pool that comes back is followed as it is. It used to drop every endpoint at
// once.
func TestSourcePoolGoneAndBack(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t, inferencePool(map[string]any{"app": "vllm"}, 8000),
		pod("a", "10.0.0.1", "vllm", true), pod("b", "10.0.0.2", "vllm", false))
	if diff := cmp.Diff([]string{"http://10.0.0.1:8000"}, w.next(t)); diff != "" {
		t.Errorf("start (-want +got):\n%s", diff)
	}
	pools := w.dyn.Resource(Resource).Namespace(ns)
	if err := pools.Delete(ctx, "llama", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := w.nextErr(t); !strings.Contains(err.Error(), "the InferencePool is not found") ||
		!strings.Contains(err.Error(), "stay in force for 5m0s, their 1 endpoints with them") {
		t.Errorf("the pool's deletion reported as %q, want its endpoints said to stay for 5m0s", err)
	}
	// Meanwhile pods come and go by the pool's last selector: b turns ready and joins, and
	// that is the next set (none empty came before it).
	if _, err := w.kube.CoreV1().Pods(ns).UpdateStatus(ctx, pod("b", "10.0.0.2", "vllm", true), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"http://10.0.0.1:8000", "http://10.0.0.2:8000"}, w.next(t)); diff != "" {
		t.Errorf("b ready while the pool is gone (-want +got):\n%s", diff)
	}
	if _, err := pools.Create(ctx, inferencePool(map[string]any{"app": "vllm"}, 8000, 8001), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	want := []string{"http://10.0.0.1:8000", "http://10.0.0.1:8001", "http://10.0.0.2:8000", "http://10.0.0.2:8001"}
	if diff := cmp.Diff(want, w.next(t)); diff != "" {
		t.Errorf("the pool back with a second port (-want +got):\n%s", diff)
	}
	select {
	case err := <-w.errs:
		t.Errorf("reported again: %v; want the pool's absence said once", err)
	default:
	}
}

// TestSourcePoolGoneForGood: a pool that stays gone past the grace has its endpoints dropped,
// with an error, no sooner; created again, it is followed again.
func TestSourcePoolGoneForGood(t *testing.T) {
	ctx := context.Background()
	const grace = 300 * time.Millisecond
	w := newWorldWith(t, func(s *Source) { s.Grace = grace }, inferencePool(map[string]any{"app": "vllm"}, 8000),
		pod("a", "10.0.0.1", "vllm", true))
	if diff := cmp.Diff([]string{"http://10.0.0.1:8000"}, w.next(t)); diff != "" {
		t.Errorf("start (-want +got):\n%s", diff)
	}
	pools := w.dyn.Resource(Resource).Namespace(ns)
	deleted := time.Now()
	if err := pools.Delete(ctx, "llama", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := w.nextErr(t); !strings.Contains(err.Error(), "stay in force for 300ms") {
		t.Errorf("the pool's deletion reported as %q", err)
	}
	if got := w.next(t); len(got) != 0 {
		t.Errorf("after the grace: %v, want no endpoint", got)
	}
	if el := time.Since(deleted); el < grace {
		t.Errorf("endpoints dropped %v after the pool's deletion, before the grace of %v", el, grace)
	}
	if err := w.nextErr(t); !strings.Contains(err.Error(), "has been gone for 300ms: its 1 endpoints are dropped") {
		t.Errorf("the end of the grace reported as %q", err)
	}
	if _, err := pools.Create(ctx, inferencePool(map[string]any{"app": "vllm"}, 8000), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"http://10.0.0.1:8000"}, w.next(t)); diff != "" {
		t.Errorf("the pool created again (-want +got):\n%s", diff)
	}
}

// TestSourceWithoutPool: a pool that does not exist yet is an empty set, then its pods.
func TestSourceWithoutPool(t *testing.T) {
	w := newWorld(t, nil, pod("a", "10.0.0.1", "vllm", true))
	if got := w.next(t); len(got) != 0 {
		t.Errorf("no pool: %v, want none", got)
	}
	if _, err := w.dyn.Resource(Resource).Namespace(ns).Create(context.Background(), inferencePool(map[string]any{"app": "vllm"}, 8000), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"http://10.0.0.1:8000"}, w.next(t)); diff != "" {
		t.Errorf("pool created (-want +got):\n%s", diff)
	}
}

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name string
		u    *unstructured.Unstructured
		want string // an error's text, "" for none
	}{
		{"good", inferencePool(map[string]any{"app": "vllm"}, 8000, 8000, 9000), ""},
		{"no selector", inferencePool(map[string]any{}, 8000), "spec.selector.matchLabels is empty"},
		{"bad label", inferencePool(map[string]any{"app": "a b"}, 8000), "spec.selector.matchLabels"},
		{"bad port", inferencePool(map[string]any{"app": "vllm"}, 70000), "spec.targetPorts[0].number"},
	} {
		p, err := Parse(tc.u)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: error %v, want %q", tc.name, err, tc.want)
		case tc.want == "" && !cmp.Equal(p.Ports, []int{8000, 9000}):
			t.Errorf("%s: ports %v, want [8000 9000]", tc.name, p.Ports)
		}
	}
}

// TestSpecsLeavesOutUnusable: a pod whose address no endpoint may have, or that Exclude names
// (the router's own), is left out and reported.
func TestSpecsLeavesOutUnusable(t *testing.T) {
	s := &Source{Namespace: ns, Name: "llama", Exclude: func(a netip.AddrPort) bool {
		return a == netip.MustParseAddrPort("10.0.0.2:8000")
	}}
	pool, err := Parse(inferencePool(map[string]any{"app": "vllm"}, 8000))
	if err != nil {
		t.Fatal(err)
	}
	specs, left := s.Specs(pool, []any{
		pod("a", "10.0.0.1", "vllm", true), pod("b", "10.0.0.2", "vllm", true),
		pod("c", "169.254.169.254", "vllm", true), pod("d", "0.0.0.0", "vllm", true), pod("e", "ff02::1", "vllm", true),
	})
	var names []string
	for _, sp := range specs {
		names = append(names, sp.Name)
	}
	if diff := cmp.Diff([]string{"http://10.0.0.1:8000"}, names); diff != "" {
		t.Errorf("endpoints (-want +got):\n%s", diff)
	}
	msg := fmt.Sprint(errors.Join(left...))
	for _, want := range []string{
		"pod b: address 10.0.0.2:8000 left out: excluded", "pod c: address 169.254.169.254:8000 left out: link-local",
		"pod d: address 0.0.0.0:8000 left out: unspecified", "pod e: address [ff02::1]:8000 left out: a multicast",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("problems lack %q:\n%s", want, msg)
		}
	}
}

// TestSourceNegativeGrace: a negative grace is refused, not read as none.
func TestSourceNegativeGrace(t *testing.T) {
	s := &Source{Namespace: ns, Name: "llama", Pools: dynamicfake.NewSimpleDynamicClient(runtime.NewScheme()),
		Pods: k8sfake.NewClientset(), Grace: -time.Second}
	err := s.Run(context.Background(), func([]endpoint.Spec) error { return nil })
	if err == nil || !strings.Contains(err.Error(), "grace -1s: give how long") {
		t.Errorf("Run with a negative grace: %v, want it refused", err)
	}
}

// logged keeps what a Source logs, for a test to read.
type logged struct {
	mu   sync.Mutex
	recs []record
}

type record struct {
	level slog.Level
	msg   string
	attrs map[string]string
}

func (l *logged) Enabled(context.Context, slog.Level) bool { return true }
func (l *logged) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logged) WithGroup(string) slog.Handler            { return l }

func (l *logged) Handle(_ context.Context, r slog.Record) error {
	rec := record{level: r.Level, msg: r.Message, attrs: map[string]string{}}
	r.Attrs(func(a slog.Attr) bool {
		rec.attrs[a.Key] = a.Value.String()
		return true
	})
	l.mu.Lock()
	defer l.mu.Unlock()
	l.recs = append(l.recs, rec)
	return nil
}

// find returns the records at level whose message holds part.
func (l *logged) find(level slog.Level, part string) []record {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []record
	for _, r := range l.recs {
		if r.level == level && strings.Contains(r.msg, part) {
			out = append(out, r)
		}
	}
	return out
}

// noErr checks that nothing more was reported. The Source reports a problem before it emits
// the set of the same event, so after next returns, that event's problems are in w.errs.
func (w *world) noErr(t *testing.T, when string) {
	t.Helper()
	select {
	case err := <-w.errs:
		t.Errorf("%s: reported %v, want nothing", when, err)
	default:
	}
}

// wantErr checks that err holds each of parts.
func wantErr(t *testing.T, what string, err error, parts ...string) {
	t.Helper()
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Errorf("%s: reported %q, want it to hold %q", what, err, p)
		}
	}
}

// TestSourceRefusesInvalidSpec: a pool updated with an invalid spec keeps its last valid
// selector and ports in force, the pods still followed by them, each distinct problem said
// once; the fix is followed at once, with an INFO line. An invalid spec used to drop every
// endpoint at once.
func TestSourceRefusesInvalidSpec(t *testing.T) {
	ctx := context.Background()
	logs := &logged{}
	w := newWorldWith(t, func(s *Source) { s.Log = slog.New(logs) }, inferencePool(map[string]any{"app": "vllm"}, 8000),
		pod("a", "10.0.0.1", "vllm", true), pod("b", "10.0.0.2", "vllm", false))
	if diff := cmp.Diff([]string{"http://10.0.0.1:8000"}, w.next(t)); diff != "" {
		t.Errorf("start (-want +got):\n%s", diff)
	}
	pools := w.dyn.Resource(Resource).Namespace(ns)
	if _, err := pools.Update(ctx, inferencePool(map[string]any{}, 8000), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	wantErr(t, "no matchLabels", w.nextErr(t), "inferencepool:inference/llama: the InferencePool's spec is refused",
		"spec.selector.matchLabels is empty", "its last valid spec (selector app=vllm, target ports [8000]) stays in force",
		"fix the pool (kubectl -n inference edit inferencepool llama)")
	// b turns ready and joins by the last valid selector: that is the next set, no empty one
	// came before it, and the problem is not said again at this event.
	if _, err := w.kube.CoreV1().Pods(ns).UpdateStatus(ctx, pod("b", "10.0.0.2", "vllm", true), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"http://10.0.0.1:8000", "http://10.0.0.2:8000"}, w.next(t)); diff != "" {
		t.Errorf("b ready while the spec is refused (-want +got):\n%s", diff)
	}
	w.noErr(t, "a pod event while the spec is refused")

	// Another problem is said too, the same spec still in force.
	if _, err := pools.Update(ctx, inferencePool(map[string]any{"app": "vllm"}, 70000), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	wantErr(t, "a bad port", w.nextErr(t), "spec.targetPorts[0].number is 70000: want a port in 1..65535",
		"its last valid spec (selector app=vllm, target ports [8000]) stays in force")

	if got := logs.find(slog.LevelInfo, "valid again"); len(got) != 0 {
		t.Errorf("said valid again before it was: %v", got)
	}
	if _, err := pools.Update(ctx, inferencePool(map[string]any{"app": "vllm"}, 8000, 8001), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	want := []string{"http://10.0.0.1:8000", "http://10.0.0.1:8001", "http://10.0.0.2:8000", "http://10.0.0.2:8001"}
	if diff := cmp.Diff(want, w.next(t)); diff != "" {
		t.Errorf("fixed with a second port (-want +got):\n%s", diff)
	}
	got := logs.find(slog.LevelInfo, "the InferencePool's spec is valid again")
	if len(got) != 1 || got[0].attrs["selector"] != "app=vllm" || got[0].attrs["target_ports"] != "[8000 8001]" {
		t.Errorf("the fix logged as %+v, want one INFO line with the new selector and ports", got)
	}
	w.noErr(t, "fixed")
}

// TestSourceNeverValid: a router started against an invalid pool has no endpoints, with an
// error that says why and how to fix it; the fix is followed at once.
func TestSourceNeverValid(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t, inferencePool(map[string]any{"app": "vllm"}), pod("a", "10.0.0.1", "vllm", true))
	if got := w.next(t); len(got) != 0 {
		t.Errorf("start: %v, want no endpoint", got)
	}
	wantErr(t, "no target port", w.nextErr(t), "inferencepool:inference/llama: the InferencePool's spec is invalid",
		"spec.targetPorts is empty: the pool names no port; give the model servers' port, like [{number: 8000}]",
		"no earlier valid spec to keep in force, so the pool has no endpoints",
		"fix the pool (kubectl -n inference edit inferencepool llama) and it is followed at once")
	if _, err := w.dyn.Resource(Resource).Namespace(ns).Update(ctx, inferencePool(map[string]any{"app": "vllm"}, 8000), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"http://10.0.0.1:8000"}, w.next(t)); diff != "" {
		t.Errorf("fixed (-want +got):\n%s", diff)
	}
	w.noErr(t, "fixed")
}

// TestSourceInvalidThenDeleted: a pool deleted while its spec is refused keeps the last valid
// spec in force for the grace, like a valid pool deleted, then its endpoints go; the spec kept
// is forgotten then, so the pool created again still invalid has none.
func TestSourceInvalidThenDeleted(t *testing.T) {
	ctx := context.Background()
	const grace = 300 * time.Millisecond
	w := newWorldWith(t, func(s *Source) { s.Grace = grace }, inferencePool(map[string]any{"app": "vllm"}, 8000),
		pod("a", "10.0.0.1", "vllm", true))
	if diff := cmp.Diff([]string{"http://10.0.0.1:8000"}, w.next(t)); diff != "" {
		t.Errorf("start (-want +got):\n%s", diff)
	}
	pools := w.dyn.Resource(Resource).Namespace(ns)
	if _, err := pools.Update(ctx, inferencePool(map[string]any{"app": "vllm"}), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	wantErr(t, "no target port", w.nextErr(t), "spec is refused", "spec.targetPorts is empty", "stays in force")
	deleted := time.Now()
	if err := pools.Delete(ctx, "llama", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	wantErr(t, "the refused pool's deletion", w.nextErr(t), "the InferencePool is not found",
		"its last valid selector and ports stay in force for 300ms, their 1 endpoints with them")
	if got := w.next(t); len(got) != 0 {
		t.Errorf("after the grace: %v, want no endpoint", got)
	}
	if el := time.Since(deleted); el < grace {
		t.Errorf("endpoints dropped %v after the pool's deletion, before the grace of %v", el, grace)
	}
	wantErr(t, "the end of the grace", w.nextErr(t), "has been gone for 300ms: its 1 endpoints are dropped")
	if _, err := pools.Create(ctx, inferencePool(map[string]any{"app": "vllm"}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	wantErr(t, "created again, invalid", w.nextErr(t), "spec is invalid", "no earlier valid spec to keep")
	if _, err := pools.Update(ctx, inferencePool(map[string]any{"app": "vllm"}, 8000), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"http://10.0.0.1:8000"}, w.next(t)); diff != "" {
		t.Errorf("fixed (-want +got):\n%s", diff)
	}
}

// TestSourceBackInvalid: a pool deleted and created again with an invalid spec (a helm upgrade
// with a broken value) ends the grace and is refused: its last valid spec stays in force, not
// only for the grace, its pods still followed.
func TestSourceBackInvalid(t *testing.T) {
	ctx := context.Background()
	const grace = 200 * time.Millisecond
	w := newWorldWith(t, func(s *Source) { s.Grace = grace }, inferencePool(map[string]any{"app": "vllm"}, 8000),
		pod("a", "10.0.0.1", "vllm", true), pod("b", "10.0.0.2", "vllm", false))
	if diff := cmp.Diff([]string{"http://10.0.0.1:8000"}, w.next(t)); diff != "" {
		t.Errorf("start (-want +got):\n%s", diff)
	}
	pools := w.dyn.Resource(Resource).Namespace(ns)
	if err := pools.Delete(ctx, "llama", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	wantErr(t, "the deletion", w.nextErr(t), "the InferencePool is not found")
	if _, err := pools.Create(ctx, inferencePool(map[string]any{}, 8000), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	wantErr(t, "back without matchLabels", w.nextErr(t), "spec is refused", "spec.selector.matchLabels is empty",
		"its last valid spec (selector app=vllm, target ports [8000]) stays in force")
	if _, err := w.kube.CoreV1().Pods(ns).UpdateStatus(ctx, pod("b", "10.0.0.2", "vllm", true), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"http://10.0.0.1:8000", "http://10.0.0.2:8000"}, w.next(t)); diff != "" {
		t.Errorf("b ready while the spec is refused (-want +got):\n%s", diff)
	}
	// Nothing to wait on: that the grace no longer runs shows as nothing happening past it.
	select {
	case got := <-w.sets:
		t.Errorf("%v past the grace, want the endpoints kept", got)
	case err := <-w.errs:
		t.Errorf("reported %v past the grace, want nothing", err)
	case <-time.After(3 * grace):
	}
}

// TestSourceWarnsWhenNoPodMatches: a valid selector that matched pods and now matches none
// is followed (no endpoint), with one warning per drop, not counted as an error; a typo in a
// new selector and a scale to zero are told apart.
func TestSourceWarnsWhenNoPodMatches(t *testing.T) {
	ctx := context.Background()
	logs := &logged{}
	w := newWorldWith(t, func(s *Source) { s.Log = slog.New(logs) }, inferencePool(map[string]any{"app": "vllm"}, 8000),
		pod("a", "10.0.0.1", "vllm", true), pod("c", "10.0.0.3", "other", true))
	if diff := cmp.Diff([]string{"http://10.0.0.1:8000"}, w.next(t)); diff != "" {
		t.Errorf("start (-want +got):\n%s", diff)
	}
	pools := w.dyn.Resource(Resource).Namespace(ns)
	if _, err := pools.Update(ctx, inferencePool(map[string]any{"app": "vlm"}, 8000), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := w.next(t); len(got) != 0 {
		t.Errorf("a selector matching no pod: %v, want it followed, no endpoint", got)
	}
	w.noErr(t, "a selector matching no pod")
	got := logs.find(slog.LevelWarn, "new selector matches no pod")
	if len(got) != 1 || got[0].attrs["selector"] != "app=vlm" || got[0].attrs["selector_before"] != "app=vllm" || got[0].attrs["pods_before"] != "1" {
		t.Errorf("the typo logged as %+v, want one WARN line naming both selectors", got)
	}
	// While it still matches none, no second warning: an invalid update is the event to wait
	// on (its refusal is reported), the typo staying in force.
	if _, err := pools.Update(ctx, inferencePool(map[string]any{"app": "vlm"}), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	wantErr(t, "no target port", w.nextErr(t), "its last valid spec (selector app=vlm, target ports [8000]) stays in force")
	if got := logs.find(slog.LevelWarn, "matches no pod"); len(got) != 1 {
		t.Errorf("%d warnings, want the first one only", len(got))
	}

	if _, err := pools.Update(ctx, inferencePool(map[string]any{"app": "vllm"}, 8000), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"http://10.0.0.1:8000"}, w.next(t)); diff != "" {
		t.Errorf("fixed (-want +got):\n%s", diff)
	}
	if err := w.kube.CoreV1().Pods(ns).Delete(ctx, "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := w.next(t); len(got) != 0 {
		t.Errorf("scaled to zero: %v, want no endpoint", got)
	}
	w.noErr(t, "scaled to zero")
	got = logs.find(slog.LevelWarn, "no longer matches any pod")
	if len(got) != 1 || got[0].attrs["selector"] != "app=vllm" || got[0].attrs["pods_before"] != "1" {
		t.Errorf("the scale to zero logged as %+v, want one WARN line", got)
	}
}
