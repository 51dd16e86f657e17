package peer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/discovery/kube"
	"github.com/kvroute/kvroute/internal/testkube"
	"github.com/kvroute/kvroute/internal/testlog"
)

const kubeNS = "serving"

// peerSlice is an EndpointSlice of the replicas' headless Service as the chart renders it
// (ports peers, gossip and gossip-udp), with one ready endpoint per address given: a replica
// as host:port puts its gossip port on the slice, so that replicas sharing 127.0.0.1 each get
// a slice of their own (a slice has one port of a name).
func peerSlice(name string, gossip int32, ips ...string) *discoveryv1.EndpointSlice {
	tcp, udp := corev1.ProtocolTCP, corev1.ProtocolUDP
	feed := int32(7947)
	ready := true
	s := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name, Namespace: kubeNS, Labels: map[string]string{kube.ServiceNameLabel: "kvroute-peers"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports: []discoveryv1.EndpointPort{
			{Name: ptr("peers"), Port: &feed, Protocol: &tcp},
			{Name: ptr("gossip"), Port: &gossip, Protocol: &tcp},
			{Name: ptr("gossip-udp"), Port: &gossip, Protocol: &udp},
		},
	}
	for i, ip := range ips {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: &ready},
			TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: kubeNS, Name: fmt.Sprintf("%s-%d", name, i)}})
	}
	return s
}

func ptr[T any](v T) *T { return &v }

// fakeAPI is a fake API server whose list and watch of EndpointSlices can be made to fail, and
// whose open watches can be cut, as when the API server goes away.
type fakeAPI struct {
	t      *testing.T
	client *fake.Clientset
	down   atomic.Bool

	mu      sync.Mutex
	watches []watch.Interface
}

var errAPIDown = errors.New("dial tcp 127.0.0.1:6443: connect: connection refused")

func newFakeAPI(t *testing.T, objs ...runtime.Object) *fakeAPI {
	api := &fakeAPI{t: t, client: fake.NewClientset(objs...)}
	api.client.PrependReactor("list", "endpointslices", func(k8stesting.Action) (bool, runtime.Object, error) {
		if api.down.Load() {
			return true, nil, errAPIDown
		}
		return false, nil, nil
	})
	api.client.PrependWatchReactor("endpointslices", func(a k8stesting.Action) (bool, watch.Interface, error) {
		if api.down.Load() {
			return true, nil, errAPIDown
		}
		w, err := api.client.Tracker().Watch(a.GetResource(), a.GetNamespace())
		if err != nil {
			return true, nil, err
		}
		api.mu.Lock()
		api.watches = append(api.watches, w)
		api.mu.Unlock()
		return true, w, nil
	})
	return api
}

// goDown makes the API fail and ends the watches open on it.
func (api *fakeAPI) goDown() {
	api.down.Store(true)
	api.mu.Lock()
	defer api.mu.Unlock()
	for _, w := range api.watches {
		w.Stop()
	}
	api.watches = nil
}

func (api *fakeAPI) watching() int {
	api.mu.Lock()
	defer api.mu.Unlock()
	return len(api.watches)
}

func (api *fakeAPI) apply(s *discoveryv1.EndpointSlice) {
	api.t.Helper()
	c := api.client.DiscoveryV1().EndpointSlices(kubeNS)
	if _, err := c.Update(context.Background(), s, metav1.UpdateOptions{}); err == nil {
		return
	}
	if _, err := c.Create(context.Background(), s, metav1.CreateOptions{}); err != nil {
		api.t.Fatal(err)
	}
}

func (api *fakeAPI) remove(name string) {
	api.t.Helper()
	if err := api.client.DiscoveryV1().EndpointSlices(kubeNS).Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
		api.t.Fatal(err)
	}
}

// runKube runs a source on api's client, for the replicas' Service's gossip port, until the
// test ends; failures are counted.
func runKube(t *testing.T, api *fakeAPI) (k *Kube, logs *testlog.Buffer, failures *atomic.Int64) {
	t.Helper()
	logs, failures = &testlog.Buffer{}, &atomic.Int64{}
	k = &Kube{
		Watch: kube.Watch{Client: api.client, Namespace: kubeNS, PortName: "gossip", Name: "peers:kubernetes:serving/kvroute-peers",
			Selector: labels.SelectorFromSet(labels.Set{kube.ServiceNameLabel: "kvroute-peers"})},
		Log:     slog.New(slog.NewTextHandler(logs, nil)),
		OnError: func(error) { failures.Add(1) },
	}
	testkube.RunUntilCleanup(t, k.Run)
	return k, logs, failures
}

// addrsAre waits until the source's Addrs gives want.
func addrsAre(t *testing.T, k *Kube, what string, want ...string) {
	t.Helper()
	var got []string
	var err error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		got, err = k.Addrs(context.Background())
		if err == nil && cmp.Equal(append([]string{}, want...), got) {
			return
		}
	}
	t.Fatalf("%s: Addrs = %v, %v; want %v within 10s", what, got, err, want)
}

// TestKube_Scale: the replica set scales 2 -> 3 -> 2, and Addrs follows from the cache, at the
// gossip port (not the feed's, not the UDP one); replicas not ready are left out.
func TestKube_Scale(t *testing.T) {
	api := newFakeAPI(t, peerSlice("kvroute-peers-1", 7946, "10.0.0.1", "10.0.0.2"),
		// Another Service's slice in the namespace: never selected.
		&discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "vllm-1", Namespace: kubeNS, Labels: map[string]string{kube.ServiceNameLabel: "vllm"}},
			AddressType: discoveryv1.AddressTypeIPv4, Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.0.1.1"}}}})
	k, _, _ := runKube(t, api)
	addrsAre(t, k, "2 replicas", "10.0.0.1:7946", "10.0.0.2:7946")
	// The fake API does not replay what changed between a list and its watch.
	waitFor(t, 10*time.Second, "the watch open", func() bool { return api.watching() > 0 })
	api.apply(peerSlice("kvroute-peers-1", 7946, "10.0.0.1", "10.0.0.2", "10.0.0.3"))
	addrsAre(t, k, "scaled to 3", "10.0.0.1:7946", "10.0.0.2:7946", "10.0.0.3:7946")
	s := peerSlice("kvroute-peers-1", 7946, "10.0.0.1", "10.0.0.2", "10.0.0.3")
	s.Endpoints[1].Conditions.Terminating = ptr(true)
	api.apply(s)
	addrsAre(t, k, "one terminating", "10.0.0.1:7946", "10.0.0.3:7946")
	api.apply(peerSlice("kvroute-peers-1", 7946, "10.0.0.1", "10.0.0.3"))
	addrsAre(t, k, "scaled to 2", "10.0.0.1:7946", "10.0.0.3:7946")
	// What Addrs returns is the caller's.
	got, _ := k.Addrs(context.Background())
	got[0] = "changed"
	addrsAre(t, k, "after the caller changed its copy", "10.0.0.1:7946", "10.0.0.3:7946")
	api.remove("kvroute-peers-1")
	addrsAre(t, k, "the Service gone")
}

// TestKube_APIUnreachableAtStart: an API server that does not answer at start is an error
// from Addrs (nothing is known), logged once however often the watch retries; once it
// answers, the replicas come, and the recovery is logged.
func TestKube_APIUnreachableAtStart(t *testing.T) {
	api := newFakeAPI(t, peerSlice("kvroute-peers-1", 7946, "10.0.0.1", "10.0.0.2"))
	api.down.Store(true)
	k, logs, failures := runKube(t, api)
	waitFor(t, 10*time.Second, "two failed lists", func() bool { return failures.Load() >= 2 })
	if _, err := k.Addrs(context.Background()); !errors.Is(err, errNotListed) || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("Addrs before any list = %v, want errNotListed with the API's failure", err)
	}
	if n := logs.Count(watchFailed); n != 1 {
		t.Errorf("%d failures were retried, logged %d times, want once:\n%s", failures.Load(), n, logs.String())
	}
	api.down.Store(false)
	addrsAre(t, k, "the API up", "10.0.0.1:7946", "10.0.0.2:7946")
	if n := logs.Count("after_problem=true"); n != 1 {
		t.Errorf("recovery logged %d times, want once:\n%s", n, logs.String())
	}
}

const watchFailed = "Kubernetes watch problem"

// TestKube_APIGoesAway: when the API server goes away, Addrs keeps giving the replicas last
// found and the failure is logged once; when it comes back, a change made meanwhile arrives.
func TestKube_APIGoesAway(t *testing.T) {
	api := newFakeAPI(t, peerSlice("kvroute-peers-1", 7946, "10.0.0.1", "10.0.0.2"))
	k, logs, failures := runKube(t, api)
	addrsAre(t, k, "the API up", "10.0.0.1:7946", "10.0.0.2:7946")
	waitFor(t, 10*time.Second, "the watch open", func() bool { return api.watching() > 0 })
	api.goDown()
	// The watch ends; the informer lists again after its back-off (0.8 to 1.6 s), which fails.
	// Kube.fail passes a failure to OnError before it logs it, so a failure counted may not be
	// logged yet: wait for the line itself.
	waitFor(t, 10*time.Second, "the outage logged", func() bool { return logs.Count(watchFailed) >= 1 })
	addrsAre(t, k, "the API down: what it knew", "10.0.0.1:7946", "10.0.0.2:7946")
	if n := logs.Count(watchFailed); n != 1 || failures.Load() < 1 {
		t.Errorf("%d failures, the outage logged %d times, want once:\n%s", failures.Load(), n, logs.String())
	}
	// Scaled to 3 while the watch could not see it (the fake's store takes it; lists fail).
	if err := api.client.Tracker().Update(discoveryv1.SchemeGroupVersion.WithResource("endpointslices"),
		peerSlice("kvroute-peers-1", 7946, "10.0.0.1", "10.0.0.2", "10.0.0.3"), kubeNS); err != nil {
		t.Fatal(err)
	}
	api.down.Store(false)
	addrsAre(t, k, "back, with the change", "10.0.0.1:7946", "10.0.0.2:7946", "10.0.0.3:7946")
}

// TestKubeJoin: replicas that find each other through the fake API join and follow each
// other, scale 2 -> 3 -> 2; each one's own address is in the set, and joining skips it.
func TestKubeJoin(t *testing.T) {
	api := newFakeAPI(t)
	sources := 0
	kubeSource := func(c *Config) {
		sources++
		k := &Kube{Watch: kube.Watch{Client: api.client, Namespace: kubeNS, PortName: "gossip",
			Selector: labels.SelectorFromSet(labels.Set{kube.ServiceNameLabel: "kvroute-peers"})}}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = k.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-done })
		c.Sources = []Source{k}
	}
	register := func(r *replica) {
		// The fake API does not replay what changed between a list and its watch.
		waitFor(t, 10*time.Second, "every source watching", func() bool { return api.watching() >= sources })
		host, port, _ := net.SplitHostPort(r.node.GossipAddr())
		p, _ := strconv.Atoi(port)
		api.apply(peerSlice("kvroute-peers-"+r.node.Name(), int32(p), host))
	}
	a := startReplica(t, "a", nil, kubeSource)
	register(a)
	// a alone: its own address is the only one found, and it is not joined.
	waitFor(t, 10*time.Second, "a's source listing a", func() bool {
		got, err := a.node.cfg.Sources[0].Addrs(context.Background())
		return err == nil && len(got) == 1 && got[0] == a.node.GossipAddr()
	})
	if n := a.node.joinSources(context.Background()); n != 0 {
		t.Errorf("a joined %d replicas from a set of itself", n)
	}
	b := startReplica(t, "b", nil, kubeSource)
	register(b)
	waitFor(t, 15*time.Second, "a and b following each other", func() bool {
		return isFollowing(a, "b")() && isFollowing(b, "a")()
	})
	c := startReplica(t, "c", nil, kubeSource)
	register(c)
	waitFor(t, 15*time.Second, "three following each other", func() bool {
		return isFollowing(a, "b", "c")() && isFollowing(b, "a", "c")() && isFollowing(c, "a", "b")()
	})
	api.remove("kvroute-peers-c")
	c.stop()
	waitFor(t, 15*time.Second, "a and b following each other only", func() bool {
		return isFollowing(a, "b")() && isFollowing(b, "a")()
	})
}

// TestKubeFromConfig builds the source from peers.kubernetes: the namespace the kubeconfig
// implies, the service's slices, the gossip port.
func TestKubeFromConfig(t *testing.T) {
	dir := t.TempDir()
	kubeconfig := testkube.Kubeconfig(t, kubeNS)
	load := func(section string) *config.Config {
		t.Helper()
		path := filepath.Join(dir, "kvroute.yaml")
		if err := os.WriteFile(path, []byte("endpoints: [{url: http://127.0.0.1:8000}]\nauth: {mode: none}\npeers: {listen: ':7947', secret_env: X, kubernetes: "+section+"}\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		c, err := config.Load(path)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	k, err := KubeFromConfig(load("{service: kvroute-peers, kubeconfig: "+kubeconfig+"}"), "kvroute/test", nil)
	if err != nil {
		t.Fatal(err)
	}
	w := k.Watch
	if w.Namespace != kubeNS || w.Port != config.DefaultGossipPort || w.PortName != "" || w.Selector.String() != kube.ServiceNameLabel+"=kvroute-peers" ||
		k.String() != "peers:kubernetes:serving/kvroute-peers" {
		t.Errorf("source = namespace %q, port %d %q, selector %q, name %q", w.Namespace, w.Port, w.PortName, w.Selector, k.String())
	}
	k, err = KubeFromConfig(load("{namespace: other, selector: 'app.kubernetes.io/name=kvroute', port_name: gossip, kubeconfig: "+kubeconfig+"}"), "kvroute/test", nil)
	if err != nil || k.Watch.Namespace != "other" || k.Watch.PortName != "gossip" || k.Watch.Port != 0 || k.String() != "peers:kubernetes:other/app.kubernetes.io/name=kvroute" {
		t.Errorf("KubeFromConfig = %+v, %v", k, err)
	}
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	t.Setenv("KUBECONFIG", "")
	t.Setenv("HOME", t.TempDir())
	if _, err := KubeFromConfig(load("{service: kvroute-peers}"), "kvroute/test", nil); err == nil || !strings.Contains(err.Error(), "peers.kubernetes: no cluster to talk to") {
		t.Errorf("no cluster: %v, want it said", err)
	}
	if k, err := KubeFromConfig(&config.Config{}, "", nil); k != nil || err != nil {
		t.Errorf("without peers.kubernetes: %v, %v", k, err)
	}
}
