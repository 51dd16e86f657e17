package kube

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	coreclient "k8s.io/client-go/kubernetes/typed/core/v1"
	discoveryclient "k8s.io/client-go/kubernetes/typed/discovery/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/kvroute/kvroute/internal/discovery"
)

// Client is the part of the Kubernetes API a Watch uses. client-go's whole clientset (real or
// fake) has it; NewClient builds just these two groups, so that a binary that watches slices
// does not carry every API group's client.
type Client interface {
	DiscoveryV1() discoveryclient.DiscoveryV1Interface
	CoreV1() coreclient.CoreV1Interface
}

// Target is one address that a Watch found ready to take requests.
type Target struct {
	// Addr is the endpoint's address (the first of the EndpointSlice endpoint's addresses).
	Addr netip.Addr
	// Port is the slice's port that the watch was told to use.
	Port int
	// Pod is namespace/name of the pod behind the address ("" when the slice names none).
	Pod string
	// Labels and Annotations are the pod's, when the watch reads pods (nil otherwise).
	Labels      map[string]string
	Annotations map[string]string
}

// HostPort is the target's address and port, like 10.0.0.5:8000 or [fd00::5]:8000.
func (t Target) HostPort() string { return netip.AddrPortFrom(t.Addr, uint16(t.Port)).String() }

// Watch follows the EndpointSlices of one namespace that a label selector picks, through
// informers, and reports the addresses ready for new requests every time that set changes.
// An endpoint that is not ready, or is terminating, is left out: the receiver stops sending
// it new requests, while those in flight go on (the pool drains what leaves it).
//
// It knows nothing of engines: Source turns targets into engine endpoints, and the same Watch
// with another selector and port finds other things, such as peer router replicas.
type Watch struct {
	// Client talks to the API server.
	Client Client
	// Namespace to watch (required).
	Namespace string
	// Selector picks EndpointSlices by label; nil: every slice of the namespace. A Service's
	// slices carry kubernetes.io/service-name=<name> and the Service's own labels.
	Selector labels.Selector
	// PortName names the slices' port; with Port 0 and PortName empty, a slice's only port.
	PortName string
	// Port, when not 0, is used for every address instead of a slice port.
	Port int
	// Pods also watches the namespace's pods (their metadata only), so that each target
	// carries its pod's labels and annotations of PodKeys. An address whose pod is not known
	// yet is held back until it is (pods are seen well before their endpoints turn ready).
	Pods bool
	// PodKeys are the label and annotation keys of a pod that a target carries (with Pods);
	// the others are not kept. Pods carry many, some of them large (a sidecar injector's
	// status, kubectl's last-applied-configuration): kept whole for each pod of a big
	// namespace, they would cost memory for nothing.
	PodKeys []string
	// Log receives watch failures and slices that cannot be used (discarded when nil).
	Log *slog.Logger
	// OnError, when set, also receives them (for a metric or a test).
	OnError func(error)
	// Name labels the watch in errors and logs.
	Name string
	// Exclude, when set, leaves out each address it returns true for (reported like a slice
	// problem): the router's own listen addresses, which would make a loop. Addresses no
	// endpoint may have (discovery.Unusable) are left out whether or not it is set.
	Exclude func(netip.AddrPort) bool
	// RequestTimeout bounds each list and watch request (0: MaxRequestTimeout).
	RequestTimeout time.Duration
	// SyncWarn is how often a watch whose first list has not completed says so (0: 10 s).
	SyncWarn time.Duration
}

// MaxRequestTimeout bounds each list and watch request of a Watch. client-go asks for watches
// of 5 to 10 minutes at random, and bounds neither a watch nor a list on its side: an API
// server, or a proxy in front of it, that accepts a request and never answers would hold
// discovery until it did. The API server ends a watch at this timeout and the informer starts
// the next one where it left off (one request a minute); the request's own deadline, a little
// later, ends one that got no answer, and the informer tries again with back-off.
const MaxRequestTimeout = 60 * time.Second

// BoundList bounds a list request: the API server is asked to end it within timeout (0:
// MaxRequestTimeout), and the returned context, to be cancelled when the list returns, ends it
// on this side a little later.
func BoundList(ctx context.Context, o *metav1.ListOptions, timeout time.Duration) (context.Context, context.CancelFunc) {
	if timeout <= 0 {
		timeout = MaxRequestTimeout
	}
	secs := max(int64((timeout+time.Second-1)/time.Second), 1)
	if o.TimeoutSeconds == nil || *o.TimeoutSeconds <= 0 || *o.TimeoutSeconds > secs {
		o.TimeoutSeconds = &secs
	}
	// The grace lets a server that ends the request at its timeout do so first, so that a
	// healthy watch ends cleanly rather than with an error every minute.
	grace := max(time.Duration(*o.TimeoutSeconds)*time.Second/4, time.Second)
	return context.WithTimeout(ctx, time.Duration(*o.TimeoutSeconds)*time.Second+grace)
}

// BoundWatch is a watch request bounded as BoundList bounds a list: the context it is opened
// with ends when the watch is stopped or its deadline passes.
func BoundWatch(ctx context.Context, o metav1.ListOptions, timeout time.Duration,
	open func(context.Context, metav1.ListOptions) (watch.Interface, error)) (watch.Interface, error) {
	ctx, cancel := BoundList(ctx, &o, timeout)
	w, err := open(ctx, o)
	if err != nil {
		cancel()
		return nil, err
	}
	return &boundWatch{Interface: w, cancel: cancel}, nil
}

type boundWatch struct {
	watch.Interface
	cancel context.CancelFunc
}

func (b *boundWatch) Stop() {
	b.Interface.Stop()
	b.cancel()
}

// WaitForSync waits until every informer has listed what it watches, or ctx ends (false).
// Each every (0: 10 s) that it still waits, it reports through fail that the API server has
// not answered, with how long: a router whose discovery is stuck at start says so, where
// client-go waits in silence.
func WaitForSync(ctx context.Context, name string, every time.Duration, fail func(error), synced ...cache.InformerSynced) bool {
	if every <= 0 {
		every = 10 * time.Second
	}
	start := time.Now()
	poll := time.NewTicker(min(100*time.Millisecond, every))
	defer poll.Stop()
	next := start.Add(every)
	for {
		all := true
		for _, s := range synced {
			if !s() {
				all = false
				break
			}
		}
		if all {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case now := <-poll.C:
			if now.Before(next) {
				continue
			}
			next = now.Add(every)
			fail(fmt.Errorf("%s: no answer from the API for %v: the first list has not completed, so nothing is found yet (a request that fails is reported apart; without one, the API server or the way to it does not answer)",
				name, now.Sub(start).Round(time.Second)))
		}
	}
}

// Run starts the informers, waits for their first list, calls emit with the ready targets,
// then again after every informer event (events that come while emit runs are taken
// together), so a change reaches emit within one event; the set is often the same as the last
// one, which the receiver compares. It blocks until ctx
// ends, stops the informers, and returns ctx's error. Watch failures are reported through
// Log and OnError; the informers retry them with back-off and the last set stays in force.
func (w *Watch) Run(ctx context.Context, emit func([]Target)) error {
	sel := w.Selector
	if sel == nil {
		sel = labels.Everything()
	}
	kick := make(chan struct{}, 1)
	onEvent := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { notify(kick) },
		UpdateFunc: func(any, any) { notify(kick) },
		DeleteFunc: func(any) { notify(kick) },
	}
	slicesAPI := w.Client.DiscoveryV1().EndpointSlices(w.Namespace)
	sliceInf := w.informer(&discoveryv1.EndpointSlice{},
		func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = sel.String()
			return slicesAPI.List(ctx, o)
		},
		func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = sel.String()
			return slicesAPI.Watch(ctx, o)
		})
	informersToSync := []cache.SharedIndexInformer{sliceInf}
	var podInf cache.SharedIndexInformer
	if w.Pods {
		podsAPI := w.Client.CoreV1().Pods(w.Namespace)
		podInf = w.informer(&corev1.Pod{},
			func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return podsAPI.List(ctx, o) },
			func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) { return podsAPI.Watch(ctx, o) })
		// Pods are large; keeping only the metadata read bounds the memory a big namespace costs.
		if err := podInf.SetTransform(podMetadata(w.PodKeys)); err != nil {
			return fmt.Errorf("%s: %w", w.Name, err)
		}
		informersToSync = append(informersToSync, podInf)
	}
	var running sync.WaitGroup
	defer running.Wait() // the informers stop with ctx
	for _, inf := range informersToSync {
		if _, err := inf.AddEventHandler(onEvent); err != nil {
			return fmt.Errorf("%s: %w", w.Name, err)
		}
		if err := inf.SetWatchErrorHandlerWithContext(func(_ context.Context, r *cache.Reflector, err error) {
			w.fail(fmt.Errorf("%s: watching %s: %w", w.Name, r.TypeDescription(), err))
		}); err != nil {
			return fmt.Errorf("%s: %w", w.Name, err)
		}
		running.Go(func() { inf.RunWithContext(ctx) })
	}
	synced := make([]cache.InformerSynced, len(informersToSync))
	for i, inf := range informersToSync {
		synced[i] = inf.HasSynced
	}
	if !WaitForSync(ctx, w.Name, w.SyncWarn, w.fail, synced...) {
		return ctx.Err()
	}

	sliceStore := sliceInf.GetStore()
	pod := func(ns, name string) (*metav1.ObjectMeta, bool) { return nil, false }
	if podInf != nil {
		idx := podInf.GetIndexer()
		pod = func(ns, name string) (*metav1.ObjectMeta, bool) {
			obj, ok, err := idx.GetByKey(ns + "/" + name)
			if err != nil || !ok {
				return nil, false
			}
			p, ok := obj.(*metav1.PartialObjectMetadata)
			if !ok {
				return nil, false
			}
			return &p.ObjectMeta, true
		}
	}
	problems := reporter{fail: w.fail}
	for {
		// A fake or an older API server may keep a slice that left the selector (re-labelled)
		// in the cache; filtering here makes the answer right either way.
		var chosen []*discoveryv1.EndpointSlice
		for _, obj := range sliceStore.List() {
			if s, ok := obj.(*discoveryv1.EndpointSlice); ok && sel.Matches(labels.Set(s.Labels)) {
				chosen = append(chosen, s)
			}
		}
		targets, errs := Targets(chosen, w.PortName, w.Port, w.Pods, pod)
		if w.Exclude != nil {
			targets = slices.DeleteFunc(targets, func(t Target) bool {
				if !w.Exclude(netip.AddrPortFrom(t.Addr, uint16(t.Port))) {
					return false
				}
				errs = append(errs, fmt.Errorf("address %s of pod %s left out: %s", t.HostPort(), cmp.Or(t.Pod, "(none)"), discovery.Excluded))
				return true
			})
		}
		for i, err := range errs {
			errs[i] = fmt.Errorf("%s: %w", w.Name, err)
		}
		problems.report(errs)
		emit(targets)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-kick:
		}
	}
}

// informer is a shared informer of one resource of the watch's namespace, by list and watch,
// each request bounded by RequestTimeout.
func (w *Watch) informer(obj runtime.Object, list cache.ListWithContextFunc, watchFn cache.WatchFuncWithContext) cache.SharedIndexInformer {
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			ctx, cancel := BoundList(ctx, &o, w.RequestTimeout)
			defer cancel()
			return list(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return BoundWatch(ctx, o, w.RequestTimeout, watchFn)
		},
	}
	return cache.NewSharedIndexInformer(cache.ToListWatcherWithWatchListSemantics(lw, w.Client), obj, 0, cache.Indexers{})
}

func (w *Watch) fail(err error) {
	if w.Log != nil {
		w.Log.Warn("kubernetes discovery", "err", err)
	}
	if w.OnError != nil {
		w.OnError(err)
	}
}

// reporter passes on each problem once while it stands, not again on every event.
type reporter struct {
	fail func(error)
	last map[string]bool
}

func (r *reporter) report(errs []error) {
	now := make(map[string]bool, len(errs))
	for _, err := range errs {
		now[err.Error()] = true
		if !r.last[err.Error()] {
			r.fail(err)
		}
	}
	r.last = now
}

func notify(kick chan struct{}) {
	select {
	case kick <- struct{}{}:
	default: // a recount is pending already; it will see this change too
	}
}

// podMetadata returns an informer transform that keeps what Targets reads of a pod: its name
// and, of its labels and annotations, those of keys. It keeps them in a PartialObjectMetadata,
// a fifth of an empty Pod's size.
func podMetadata(keys []string) cache.TransformFunc {
	only := func(m map[string]string) map[string]string {
		var out map[string]string
		for _, k := range keys {
			if v, ok := m[k]; ok {
				if out == nil {
					out = make(map[string]string, len(keys))
				}
				out[k] = v
			}
		}
		return out
	}
	return func(obj any) (any, error) {
		p, ok := obj.(*corev1.Pod)
		if !ok { // a tombstone of a deleted pod
			return obj, nil
		}
		return &metav1.PartialObjectMetadata{TypeMeta: p.TypeMeta, ObjectMeta: metav1.ObjectMeta{
			Name: p.Name, Namespace: p.Namespace, ResourceVersion: p.ResourceVersion,
			Labels: only(p.Labels), Annotations: only(p.Annotations),
		}}, nil
	}
}

// Targets returns the addresses of the slices in ready for new requests, ordered by address and port,
// and the problems of slices it could not use (an address that does not parse, a port that is
// not there). An endpoint is ready unless its ready condition is false or it is terminating
// (Kubernetes reads an absent ready condition as ready). A pod listed in several slices (one
// per address family, or twice while slices are rebalanced) counts once, by its IPv4 address
// when it has one. With withPods, an address whose pod is unknown to pod is left out. An
// address no endpoint may have (discovery.Unusable: unspecified, multicast, broadcast,
// link-local) is left out and returned as a problem.
func Targets(in []*discoveryv1.EndpointSlice, portName string, port int, withPods bool,
	pod func(namespace, name string) (*metav1.ObjectMeta, bool)) ([]Target, []error) {
	ordered := slices.Clone(in)
	family := func(t discoveryv1.AddressType) int {
		switch t {
		case discoveryv1.AddressTypeIPv4:
			return 0
		case discoveryv1.AddressTypeIPv6:
			return 1
		}
		return 2
	}
	slices.SortFunc(ordered, func(a, b *discoveryv1.EndpointSlice) int {
		return cmp.Or(cmp.Compare(family(a.AddressType), family(b.AddressType)), strings.Compare(a.Name, b.Name))
	})
	var out []Target
	var problems []error
	seen := map[string]bool{}
	for _, s := range ordered {
		if s.AddressType != discoveryv1.AddressTypeIPv4 && s.AddressType != discoveryv1.AddressTypeIPv6 {
			problems = append(problems, fmt.Errorf("endpointslice %s: address type %q is not supported: use IPv4 or IPv6 slices", s.Name, s.AddressType))
			continue
		}
		p, err := slicePort(s, portName, port)
		if err != nil {
			problems = append(problems, err)
			continue
		}
		for _, e := range s.Endpoints {
			if len(e.Addresses) == 0 || !ready(e.Conditions) {
				continue
			}
			addr, err := netip.ParseAddr(e.Addresses[0])
			if err != nil {
				problems = append(problems, fmt.Errorf("endpointslice %s: address %q: %w", s.Name, e.Addresses[0], err))
				continue
			}
			if why := discovery.Unusable(addr); why != "" {
				problems = append(problems, fmt.Errorf("endpointslice %s: address %s left out: %s", s.Name, e.Addresses[0], why))
				continue
			}
			t := Target{Addr: addr.Unmap(), Port: p}
			if r := e.TargetRef; r != nil && r.Kind == "Pod" && r.Name != "" {
				ns := cmp.Or(r.Namespace, s.Namespace)
				t.Pod = ns + "/" + r.Name
				if withPods {
					po, ok := pod(ns, r.Name)
					if !ok {
						continue
					}
					t.Labels, t.Annotations = po.Labels, po.Annotations
				}
			}
			if seen[t.HostPort()] || (t.Pod != "" && seen["pod "+t.Pod]) {
				continue
			}
			seen[t.HostPort()] = true
			if t.Pod != "" {
				seen["pod "+t.Pod] = true
			}
			out = append(out, t)
		}
	}
	slices.SortFunc(out, func(a, b Target) int {
		return cmp.Or(a.Addr.Compare(b.Addr), cmp.Compare(a.Port, b.Port))
	})
	return out, problems
}

// ready reads an EndpointSlice endpoint's conditions: new requests may go to it.
func ready(c discoveryv1.EndpointConditions) bool {
	return (c.Ready == nil || *c.Ready) && (c.Terminating == nil || !*c.Terminating)
}

// slicePort picks the port of a slice: port when set; else the TCP port named name; else, with
// no name, the slice's only TCP port (an unnamed one first). Only TCP ports count, endpoints
// taking HTTP: a UDP or SCTP port, even of the same name or number (HTTP/3's, a DNS server's
// twin), is never picked, and an error that lists the ports says which are not TCP.
func slicePort(s *discoveryv1.EndpointSlice, name string, port int) (int, error) {
	if port != 0 {
		return port, nil
	}
	var tcp, named []int32
	var tcpList, otherList []string
	other := "" // the protocol of a port named name that is not TCP
	for _, p := range s.Ports {
		if p.Port == nil {
			continue
		}
		n, proto := ptrOr(p.Name, ""), ptrOr(p.Protocol, corev1.ProtocolTCP)
		if proto != corev1.ProtocolTCP {
			otherList = append(otherList, fmt.Sprintf("%q %d/%s", n, *p.Port, proto))
			if n == name && other == "" {
				other = fmt.Sprintf("%d/%s", *p.Port, proto)
			}
			continue
		}
		tcp, tcpList = append(tcp, *p.Port), append(tcpList, fmt.Sprintf("%q %d", n, *p.Port))
		if n == name {
			named = append(named, *p.Port)
		}
	}
	if name == "" && len(named) == 0 {
		named = tcp
	}
	if len(named) == 1 {
		return int(named[0]), nil
	}
	tcps := strings.Join(tcpList, ", ")
	if len(otherList) > 0 {
		tcps += "; not TCP, so never used: " + strings.Join(otherList, ", ")
	}
	switch {
	case len(tcp) == 0 && len(otherList) == 0:
		return 0, fmt.Errorf("endpointslice %s has no port: give the Service a port, or set port", s.Name)
	case len(tcp) == 0:
		return 0, fmt.Errorf("endpointslice %s has no TCP port, only %s (endpoints take HTTP, over TCP): give the Service a TCP port, or set port",
			s.Name, strings.Join(otherList, ", "))
	case name == "":
		return 0, fmt.Errorf("endpointslice %s has %d TCP ports (%s): set port_name to one of them", s.Name, len(tcp), tcps)
	case other != "":
		return 0, fmt.Errorf("endpointslice %s: its port %q is %s, not TCP (endpoints take HTTP, over TCP): set port_name to one of its TCP ports (%s)",
			s.Name, name, other, strings.Join(tcpList, ", "))
	case len(named) > 1: // an API server refuses a slice with two ports of one name
		return 0, fmt.Errorf("endpointslice %s has %d TCP ports named %q (%s): set port", s.Name, len(named), name, tcps)
	}
	return 0, fmt.Errorf("endpointslice %s has no port named %q (its TCP ports: %s): set port_name to one of them", s.Name, name, tcps)
}

func ptrOr[T any](p *T, or T) T {
	if p == nil {
		return or
	}
	return *p
}
