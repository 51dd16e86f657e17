// Package inferencepool finds engine endpoints through an InferencePool of the Gateway API
// Inference Extension (inference.networking.k8s.io/v1): the pool names its model servers by a
// pod label selector and one or more target ports, and kvroute, as the pool's endpoint picker,
// routes among the ready pods it selects. A Source follows the pool and its pods through
// client-go informers and gives the router sets of endpoints the way the file and DNS sources
// do.
//
// RBAC: get, list and watch on inferencepools (inference.networking.k8s.io) and list and watch
// on pods, in the pool's namespace.
package inferencepool

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"reflect"
	"slices"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	coreclient "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/discovery"
	"github.com/kvroute/kvroute/internal/discovery/kube"
	"github.com/kvroute/kvroute/internal/endpoint"
)

// Resource is the InferencePool API resource.
var Resource = schema.GroupVersionResource{Group: "inference.networking.k8s.io", Version: "v1", Resource: "inferencepools"}

// DefaultGrace is how long a Source keeps following an InferencePool that has disappeared, by
// the selector and ports it last had, unless Source.Grace says otherwise: long enough for a
// helm upgrade that deletes and recreates the pool, or an API server that answers without it
// for a while, and short enough that a pool deleted for good does not linger for long.
const DefaultGrace = 5 * time.Minute

// Source follows one InferencePool: each pod its selector picks that is ready for requests
// (running, its Ready condition true, not terminating, with an address) becomes one endpoint
// per target port, with the Endpoint template's keys. A pod that stops being ready leaves the
// set, so the pool drains it: no new requests, those in flight go on.
//
// A pool whose spec is invalid (Parse fails: no matchLabels, no target port, ...) is refused,
// as Envoy refuses (NACKs) a bad update: its last valid selector and ports stay in force, their
// pods still followed, and the problem is reported once; a valid spec is followed as soon as
// it comes, with an INFO line. A pool never seen valid has no endpoints. A selector that
// picked pods and now picks none is still followed (a scale to zero), with a warning said once.
//
// A pool that disappears (deleted, or missing from the API's answer after a relist) does not
// take every engine with it at once: its last valid selector and ports stay in force for
// Grace, the pods still followed by them, with a warning said once; if it is not back by then,
// its endpoints are dropped with an error, and the spec kept is forgotten. A pool that comes
// back, within the grace or later, is followed as it is then (refused, if invalid, in favour of
// the spec still kept). Envoy likewise keeps a cluster's last EDS endpoints while no new
// assignment comes (bounded by endpoint_stale_after where set).
type Source struct {
	// Namespace and Name name the InferencePool.
	Namespace, Name string
	// Pools reads InferencePools (client-go's dynamic client: the CRD needs no generated code).
	Pools dynamic.Interface
	// Pods reads the namespace's pods: a clientset (kubernetes.Interface, or a fake).
	Pods interface {
		CoreV1() coreclient.CoreV1Interface
	}
	// Scheme of the endpoints' URLs: "http" (the default) or "https".
	Scheme string
	// Endpoint is the template of every endpoint found (models, engine, labels, ...); its URL
	// is made from each pod's address and each target port.
	Endpoint config.Endpoint
	// Log receives failures and changes (discarded when nil); OnError, when set, also
	// receives each failure (for a metric or a test).
	Log     *slog.Logger
	OnError func(error)
	// Exclude, when set, leaves out each address it returns true for: the router's own listen
	// addresses, which would make a loop. Addresses no endpoint may have
	// (discovery.Unusable) are left out whether or not it is set; both are reported.
	Exclude func(netip.AddrPort) bool
	// Grace is how long the pool's last selector and ports stay in force once the pool has
	// disappeared (0: DefaultGrace).
	Grace time.Duration
}

// Key names the source in logs and metrics: "inferencepool:" and namespace/name.
func (s *Source) Key() string { return "inferencepool:" + s.Namespace + "/" + s.Name }

// Run watches the pool and the namespace's pods and calls emit with the endpoints every time
// the set changes, the first time once both have been listed (an empty set while the pool does
// not exist, has never been valid or selects nothing ready). An invalid spec leaves the last
// valid one in force; a pool that disappears is followed by its last valid selector and ports
// for Grace, then its endpoints are dropped (Source). It blocks until ctx ends and
// returns ctx's error; the informers retry failed watches with back-off, and the last set
// stays in force meanwhile. Each list and watch request is bounded (kube.MaxRequestTimeout),
// and while the first list has not completed that is said every 10 s.
func (s *Source) Run(ctx context.Context, emit func([]endpoint.Spec) error) error {
	if s.Namespace == "" || s.Name == "" || s.Pools == nil || s.Pods == nil {
		return errors.New("inferencepool: a Source needs a namespace, a name and both clients")
	}
	if s.Grace < 0 {
		return fmt.Errorf("%s: grace %v: give how long a pool that disappears is still followed, like 5m, or 0 for the default", s.Key(), s.Grace)
	}
	grace := s.Grace
	if grace == 0 {
		grace = DefaultGrace
	}
	log := s.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	fail := func(err error) {
		log.Warn("inferencepool discovery", "source", s.Key(), "err", err)
		if s.OnError != nil {
			s.OnError(err)
		}
	}
	kick := make(chan struct{}, 1)
	poke := func() {
		select {
		case kick <- struct{}{}:
		default:
		}
	}
	handler := cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { poke() }, UpdateFunc: func(any, any) { poke() }, DeleteFunc: func(any) { poke() },
	}
	pools := s.Pools.Resource(Resource).Namespace(s.Namespace)
	byName := fields.OneTermEqualSelector("metadata.name", s.Name).String()
	// A client that cannot stream its first list (a fake) is listed the old way.
	poolInf := cache.NewSharedIndexInformer(cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = byName
			ctx, cancel := kube.BoundList(ctx, &o, 0)
			defer cancel()
			return pools.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = byName
			return kube.BoundWatch(ctx, o, 0, pools.Watch)
		},
	}, s.Pools), &unstructured.Unstructured{}, 0, cache.Indexers{})
	pods := s.Pods.CoreV1().Pods(s.Namespace)
	podInf := cache.NewSharedIndexInformer(cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			ctx, cancel := kube.BoundList(ctx, &o, 0)
			defer cancel()
			return pods.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return kube.BoundWatch(ctx, o, 0, pods.Watch)
		},
	}, s.Pods), &corev1.Pod{}, 0, cache.Indexers{})
	// Pods are large: keep what readiness and addresses need, so a big namespace costs little.
	if err := podInf.SetTransform(trimPod); err != nil {
		return fmt.Errorf("%s: %w", s.Key(), err)
	}
	for _, inf := range []cache.SharedIndexInformer{poolInf, podInf} {
		if _, err := inf.AddEventHandler(handler); err != nil {
			return fmt.Errorf("%s: %w", s.Key(), err)
		}
		if err := inf.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
			fail(fmt.Errorf("%s: watch: %w", s.Key(), err))
		}); err != nil {
			return fmt.Errorf("%s: %w", s.Key(), err)
		}
	}
	var running sync.WaitGroup
	defer running.Wait() // the informers stop with ctx
	running.Go(func() { poolInf.RunWithContext(ctx) })
	running.Go(func() { podInf.RunWithContext(ctx) })
	if !kube.WaitForSync(ctx, s.Key(), 0, fail, poolInf.HasSynced, podInf.HasSynced) {
		return ctx.Err()
	}
	var last []endpoint.Spec
	first := true
	lastProblem, lastLeft := "", ""
	// good is the pool's last valid spec, the one in force: while the pool is there and valid,
	// while it says something invalid (refused), and while it is absent, until expire ends the
	// grace. It is nil when there is none: never seen valid, or the grace is over.
	var good *Pool
	refused := false // the pool is there and its spec was refused
	// matched is how many pods the selector in force (sel) picked at the last event, ready or
	// not: a drop to none is said once (noPods).
	matched, sel := 0, ""
	var graceTimer *time.Timer
	var expire <-chan time.Time
	defer func() {
		if graceTimer != nil {
			graceTimer.Stop()
		}
	}()
	for {
		obj, ok, err := poolInf.GetStore().GetByKey(s.Namespace + "/" + s.Name)
		var specs []endpoint.Spec
		var left []error
		var inForce *Pool
		switch {
		case err != nil:
		case ok:
			if expire != nil {
				graceTimer.Stop()
				expire = nil
				log.Info("the InferencePool is back", "source", s.Key())
			}
			pool, perr := Parse(obj.(*unstructured.Unstructured))
			switch {
			case perr == nil:
				if refused {
					log.Info("the InferencePool's spec is valid again and followed from now on", "source", s.Key(),
						"selector", pool.Selector.String(), "target_ports", pool.Ports)
				}
				good, refused = &pool, false
			case good != nil:
				// Like a NACKed update: one bad apply of the pool must not take every engine
				// out of the router; the spec that last worked goes on working.
				refused = true
				err = fmt.Errorf("the InferencePool's spec is refused: %w; its last valid spec (selector %s, target ports %v) stays in force, the pods it selects still followed; fix the pool (kubectl -n %s edit inferencepool %s) and it is followed at once",
					perr, good.Selector, good.Ports, s.Namespace, s.Name)
			default:
				refused = true
				err = fmt.Errorf("the InferencePool's spec is invalid: %w; there is no earlier valid spec to keep in force, so the pool has no endpoints; fix the pool (kubectl -n %s edit inferencepool %s) and it is followed at once",
					perr, s.Namespace, s.Name)
			}
			inForce = good
		case good != nil:
			refused = false
			if expire == nil {
				graceTimer = time.NewTimer(grace)
				expire = graceTimer.C
				warn := fmt.Errorf("%s: the InferencePool is not found (deleted, or missing from the API's answer): its last valid selector and ports stay in force for %v, their %d endpoints with them, and it is followed again as soon as it is back",
					s.Key(), grace, len(last))
				log.Warn("InferencePool gone, keeping its endpoints for a while (said once)", "source", s.Key(), "err", warn)
				if s.OnError != nil {
					s.OnError(warn)
				}
			}
			inForce = good
		default:
			refused = false
		}
		n := 0
		if inForce != nil {
			all := podInf.GetStore().List()
			specs, left = s.Specs(*inForce, all)
			n = selected(inForce.Selector, all)
			if n == 0 && matched > 0 {
				s.noPods(log, inForce.Selector.String(), sel, matched)
			}
			sel = inForce.Selector.String()
		}
		matched = n
		// Addresses left out are said when what is left out changes.
		if l := errors.Join(left...); fmt.Sprint(l) != lastLeft {
			if lastLeft = fmt.Sprint(l); l != nil {
				fail(fmt.Errorf("%s: %w", s.Key(), l))
			}
		}
		// A problem is reported once, not at every event while it lasts.
		if p := fmt.Sprint(err); err != nil && p != lastProblem {
			fail(fmt.Errorf("%s: %w", s.Key(), err))
			lastProblem = p
		} else if err == nil {
			lastProblem = ""
		}
		if first || !reflect.DeepEqual(specs, last) {
			if err := emit(specs); err != nil {
				fail(fmt.Errorf("%s: %w", s.Key(), err))
			} else {
				first, last = false, specs
				log.Info("endpoints of the InferencePool changed", "source", s.Key(), "endpoints", len(specs))
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-kick:
		case <-expire:
			expire, good = nil, nil
			gone := fmt.Errorf("%s: the InferencePool has been gone for %v: its %d endpoints are dropped; it is followed again when it is created",
				s.Key(), grace, len(last))
			log.Error("InferencePool gone for good, its endpoints dropped", "source", s.Key(), "err", gone)
			if s.OnError != nil {
				s.OnError(gone)
			}
		}
	}
}

// noPods says that the selector in force, now, picks no pod, where at the last event the
// selector was, before, and picked n. The pool is still followed: scaling the model servers to
// zero is legitimate. But a router with no endpoints fails every request, and the likeliest
// other cause, a typo in the pool's matchLabels or in the pods' labels, shows nowhere else; so
// it is a warning, said once per drop (matched must rise again first), and not a discovery
// error: a scale to zero must not count as one.
func (s *Source) noPods(log *slog.Logger, now, before string, n int) {
	if now != before {
		log.Warn("the InferencePool's new selector matches no pod: if its labels are a typo, fix the pool's spec.selector.matchLabels",
			"source", s.Key(), "selector", now, "selector_before", before, "pods_before", n)
		return
	}
	log.Warn("the InferencePool's selector no longer matches any pod: expected after a scale to zero; if not, compare the pods' labels with the pool's spec.selector.matchLabels",
		"source", s.Key(), "selector", now, "pods_before", n)
}

// selected counts the pods sel picks, ready or not.
func selected(sel labels.Selector, pods []any) int {
	n := 0
	for _, o := range pods {
		if p, ok := o.(*corev1.Pod); ok && sel.Matches(labels.Set(p.Labels)) {
			n++
		}
	}
	return n
}

// Pool is what kvroute reads of an InferencePool: the pods it selects and their ports.
type Pool struct {
	Selector labels.Selector
	Ports    []int
}

// Parse reads an InferencePool's spec.selector.matchLabels and spec.targetPorts[].number.
func Parse(u *unstructured.Unstructured) (Pool, error) {
	ml, found, err := unstructured.NestedStringMap(u.Object, "spec", "selector", "matchLabels")
	if err != nil {
		return Pool{}, fmt.Errorf("spec.selector.matchLabels: %w", err)
	}
	if !found || len(ml) == 0 {
		return Pool{}, errors.New("spec.selector.matchLabels is empty: the pool selects no pods; give the model servers' pod labels, like {app: vllm}")
	}
	sel, err := labels.ValidatedSelectorFromSet(ml)
	if err != nil {
		return Pool{}, fmt.Errorf("spec.selector.matchLabels: %w", err)
	}
	tps, _, err := unstructured.NestedSlice(u.Object, "spec", "targetPorts")
	if err != nil {
		return Pool{}, fmt.Errorf("spec.targetPorts: %w", err)
	}
	var ports []int
	for i, tp := range tps {
		m, _ := tp.(map[string]any)
		n, ok, _ := unstructured.NestedInt64(m, "number")
		switch {
		case !ok:
			return Pool{}, fmt.Errorf("spec.targetPorts[%d].number is missing or not a number: give the model servers' port, like {number: 8000}", i)
		case n < 1 || n > 65535:
			return Pool{}, fmt.Errorf("spec.targetPorts[%d].number is %d: want a port in 1..65535", i, n)
		}
		if !slices.Contains(ports, int(n)) {
			ports = append(ports, int(n))
		}
	}
	if len(ports) == 0 {
		return Pool{}, errors.New("spec.targetPorts is empty: the pool names no port; give the model servers' port, like [{number: 8000}]")
	}
	return Pool{Selector: sel, Ports: ports}, nil
}

// Specs turns the pods the pool selects that are ready into endpoints, sorted by name. A pod
// whose address no endpoint may have (discovery.Unusable, or Exclude's) is left out, and
// returned as a problem.
func (s *Source) Specs(pool Pool, pods []any) ([]endpoint.Spec, []error) {
	scheme := s.Scheme
	if scheme == "" {
		scheme = "http"
	}
	var out []endpoint.Spec
	var left []error
	for _, o := range pods {
		p, ok := o.(*corev1.Pod)
		if !ok || !pool.Selector.Matches(labels.Set(p.Labels)) {
			continue
		}
		addr, ok := Ready(p)
		if !ok {
			continue
		}
		for _, port := range pool.Ports {
			if why := discovery.Check(addr, port, s.Exclude); why != "" {
				left = append(left, fmt.Errorf("pod %s: address %s left out: %s", p.Name, net.JoinHostPort(addr.String(), strconv.Itoa(port)), why))
				continue
			}
			e := s.Endpoint
			e.Models = slices.Clone(e.Models)
			e.URL = scheme + "://" + net.JoinHostPort(addr.String(), strconv.Itoa(port))
			e.SetDefaults()
			out = append(out, discovery.Spec(&e))
		}
	}
	slices.SortFunc(out, func(a, b endpoint.Spec) int {
		switch {
		case a.Name < b.Name:
			return -1
		case a.Name > b.Name:
			return 1
		}
		return 0
	})
	return out, left
}

// Ready returns the address of a pod that may take new requests: running, Ready, not
// terminating, with an address.
func Ready(p *corev1.Pod) (netip.Addr, bool) {
	if p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning {
		return netip.Addr{}, false
	}
	ready := false
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			ready = c.Status == corev1.ConditionTrue
		}
	}
	addr, err := netip.ParseAddr(p.Status.PodIP)
	return addr, ready && err == nil
}

// trimPod keeps of a pod what Specs reads.
func trimPod(o any) (any, error) {
	p, ok := o.(*corev1.Pod)
	if !ok {
		return o, nil // a deletion tombstone
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, Labels: p.Labels,
			DeletionTimestamp: p.DeletionTimestamp, ResourceVersion: p.ResourceVersion},
		Status: corev1.PodStatus{Phase: p.Status.Phase, PodIP: p.Status.PodIP, Conditions: p.Status.Conditions},
	}, nil
}
