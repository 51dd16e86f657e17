package kube

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/testkube"
)

const ns = "inference"

// cond builds an endpoint's conditions; "ready", "not-ready", "terminating" (not ready, still
// serving, as kubelet reports a pod in its grace period) or "unset" (nil: Kubernetes reads ready).
func cond(state string) discoveryv1.EndpointConditions {
	t, f := true, false
	switch state {
	case "ready":
		return discoveryv1.EndpointConditions{Ready: &t, Serving: &t, Terminating: &f}
	case "not-ready":
		return discoveryv1.EndpointConditions{Ready: &f, Serving: &f, Terminating: &f}
	case "terminating":
		return discoveryv1.EndpointConditions{Ready: &f, Serving: &t, Terminating: &t}
	case "unset":
		return discoveryv1.EndpointConditions{}
	}
	panic("unknown state " + state)
}

// ep is an endpoint of pod at ip in the given state.
func ep(ip, pod, state string) discoveryv1.Endpoint {
	e := discoveryv1.Endpoint{Addresses: []string{ip}, Conditions: cond(state)}
	if pod != "" {
		e.TargetRef = &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: pod}
	}
	return e
}

type port struct {
	name string
	num  int32
}

// slice is an EndpointSlice of service (labelled as Kubernetes does) with extra labels.
func slice(name, service string, family discoveryv1.AddressType, ports []port, extra map[string]string, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	l := map[string]string{ServiceNameLabel: service, "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"}
	for k, v := range extra {
		l[k] = v
	}
	s := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name, Namespace: ns, Labels: l},
		AddressType: family,
		Endpoints:   eps,
	}
	tcp := corev1.ProtocolTCP
	for _, p := range ports {
		s.Ports = append(s.Ports, discoveryv1.EndpointPort{Name: &p.name, Port: &p.num, Protocol: &tcp})
	}
	return s
}

var httpPort = []port{{"http", 8000}}

// withPort adds to s a port of the protocol given.
func withPort(s *discoveryv1.EndpointSlice, name string, num int32, proto corev1.Protocol) *discoveryv1.EndpointSlice {
	s.Ports = append(s.Ports, discoveryv1.EndpointPort{Name: &name, Port: &num, Protocol: &proto})
	return s
}

func pod(name string, annotations map[string]string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Annotations: annotations,
		Labels: map[string]string{"app": "vllm"}}}
}

func addrs(ts []Target) []string {
	out := []string{}
	for _, t := range ts {
		out = append(out, t.HostPort()+" "+t.Pod)
	}
	return out
}

func TestTargets(t *testing.T) {
	v4, v6 := discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6
	tcp, udp := corev1.ProtocolTCP, corev1.ProtocolUDP
	one := func(name string) *discoveryv1.EndpointSlice {
		return slice(name, "vllm", v4, nil, nil, ep("10.0.0.1", "a", "ready"))
	}
	tests := []struct {
		name     string
		slices   []*discoveryv1.EndpointSlice
		portName string
		port     int
		want     []string
		problems []string
	}{
		{
			name: "ready, unset and not-ready, terminating",
			slices: []*discoveryv1.EndpointSlice{slice("s1", "vllm", v4, httpPort, nil,
				ep("10.0.0.3", "c", "ready"), ep("10.0.0.1", "a", "unset"), ep("10.0.0.2", "b", "not-ready"),
				ep("10.0.0.4", "d", "terminating"))},
			portName: "http",
			want:     []string{"10.0.0.1:8000 inference/a", "10.0.0.3:8000 inference/c"},
		},
		{
			name: "several slices, a pod listed twice while rebalancing, an address with no pod",
			slices: []*discoveryv1.EndpointSlice{
				slice("s2", "vllm", v4, httpPort, nil, ep("10.0.0.2", "b", "ready"), ep("10.0.0.1", "a", "ready")),
				slice("s1", "vllm", v4, httpPort, nil, ep("10.0.0.1", "a", "ready"), ep("10.0.0.9", "", "ready")),
			},
			portName: "http",
			want:     []string{"10.0.0.1:8000 inference/a", "10.0.0.2:8000 inference/b", "10.0.0.9:8000 "},
		},
		{
			name: "dual stack: a pod once, by its IPv4 address; an IPv6-only pod by its IPv6 one",
			slices: []*discoveryv1.EndpointSlice{
				slice("s6", "vllm", v6, httpPort, nil, ep("fd00::1", "a", "ready"), ep("fd00::2", "b", "ready")),
				slice("s4", "vllm", v4, httpPort, nil, ep("10.0.0.1", "a", "ready")),
			},
			portName: "http",
			want:     []string{"10.0.0.1:8000 inference/a", "[fd00::2]:8000 inference/b"},
		},
		{
			name:   "the only port when no name is given",
			slices: []*discoveryv1.EndpointSlice{slice("s1", "vllm", v4, []port{{"", 9000}}, nil, ep("10.0.0.1", "a", "ready"))},
			want:   []string{"10.0.0.1:9000 inference/a"},
		},
		{
			name:   "a port number overrides the slice's ports",
			slices: []*discoveryv1.EndpointSlice{slice("s1", "vllm", v4, []port{{"http", 8000}, {"metrics", 9000}}, nil, ep("10.0.0.1", "a", "ready"))},
			port:   7000,
			want:   []string{"10.0.0.1:7000 inference/a"},
		},
		{
			name: "a slice without the port is reported and left out, the others count",
			slices: []*discoveryv1.EndpointSlice{
				slice("s1", "vllm", v4, []port{{"grpc", 9000}, {"metrics", 9090}}, nil, ep("10.0.0.1", "a", "ready")),
				slice("s2", "vllm", v4, httpPort, nil, ep("10.0.0.2", "b", "ready")),
				slice("s3", "vllm", v4, []port{{"a", 1}, {"b", 2}}, nil, ep("10.0.0.3", "c", "ready")),
				slice("s4", "vllm", discoveryv1.AddressTypeFQDN, httpPort, nil, ep("x.example", "d", "ready")),
				slice("s5", "vllm", v4, httpPort, nil, ep("10.0.0.300", "e", "ready")),
			},
			portName: "http",
			want:     []string{"10.0.0.2:8000 inference/b"},
			problems: []string{
				`endpointslice s1 has no port named "http" (its TCP ports: "grpc" 9000, "metrics" 9090): set port_name to one of them`,
				`endpointslice s3 has no port named "http" (its TCP ports: "a" 1, "b" 2)`,
				`endpointslice s5: address "10.0.0.300"`,
				`endpointslice s4: address type "FQDN" is not supported`,
			},
		},
		{
			name: "addresses no endpoint may have are reported and left out; a pod's other family counts",
			slices: []*discoveryv1.EndpointSlice{
				slice("s4", "vllm", v4, httpPort, nil, ep("0.0.0.0", "a", "ready"), ep("169.254.169.254", "b", "ready"),
					ep("224.0.0.1", "c", "ready"), ep("255.255.255.255", "d", "ready"), ep("10.0.0.5", "e", "ready")),
				slice("s6", "vllm", v6, httpPort, nil, ep("::", "f", "ready"), ep("fe80::1%eth0", "g", "ready"),
					ep("ff02::1", "h", "ready"), ep("fd00::1", "a", "ready")),
			},
			portName: "http",
			want:     []string{"10.0.0.5:8000 inference/e", "[fd00::1]:8000 inference/a"},
			problems: []string{
				"endpointslice s4: address 0.0.0.0 left out: unspecified",
				"endpointslice s4: address 169.254.169.254 left out: link-local",
				"endpointslice s4: address 224.0.0.1 left out: a multicast address",
				"endpointslice s4: address 255.255.255.255 left out: the broadcast address",
				"endpointslice s6: address :: left out: unspecified",
				"endpointslice s6: address fe80::1%eth0 left out: link-local",
				"endpointslice s6: address ff02::1 left out: a multicast address",
			},
		},
		{
			name:     "several ports and no name",
			slices:   []*discoveryv1.EndpointSlice{slice("s1", "vllm", v4, []port{{"a", 1}, {"b", 2}}, nil, ep("10.0.0.1", "a", "ready"))},
			problems: []string{`endpointslice s1 has 2 TCP ports ("a" 1, "b" 2): set port_name to one of them`},
		},
		{
			// An API server refuses two ports of one name; a fake, or a slice written by
			// hand to a server that does not check, has them.
			name:     "a TCP and a UDP port of one name: the TCP one, named",
			slices:   []*discoveryv1.EndpointSlice{withPort(withPort(one("s1"), "dns", 5353, udp), "dns", 53, tcp)},
			portName: "dns",
			want:     []string{"10.0.0.1:53 inference/a"},
		},
		{
			name:   "a TCP and a UDP port of one name: the TCP one, no name given",
			slices: []*discoveryv1.EndpointSlice{withPort(withPort(one("s1"), "dns", 5353, udp), "dns", 53, tcp)},
			want:   []string{"10.0.0.1:53 inference/a"},
		},
		{
			name:   "no name given: the only TCP port, a UDP one beside it (HTTP/3)",
			slices: []*discoveryv1.EndpointSlice{withPort(withPort(one("s1"), "h3", 8443, udp), "https", 8443, tcp)},
			want:   []string{"10.0.0.1:8443 inference/a"},
		},
		{
			name:     "a port named that is UDP is said to be so",
			slices:   []*discoveryv1.EndpointSlice{withPort(withPort(one("s1"), "h3", 8443, udp), "https", 8443, tcp)},
			portName: "h3",
			problems: []string{`endpointslice s1: its port "h3" is 8443/UDP, not TCP (endpoints take HTTP, over TCP): set port_name to one of its TCP ports ("https" 8443)`},
		},
		{
			name: "several TCP ports and a UDP one, no name: each listed, the UDP one as never used",
			slices: []*discoveryv1.EndpointSlice{withPort(withPort(withPort(one("s1"), "peers", 7947, tcp), "gossip", 7946, tcp),
				"gossip-udp", 7946, udp)},
			problems: []string{`endpointslice s1 has 2 TCP ports ("peers" 7947, "gossip" 7946; not TCP, so never used: "gossip-udp" 7946/UDP): set port_name to one of them`},
		},
		{
			name:     "no TCP port",
			slices:   []*discoveryv1.EndpointSlice{withPort(one("s1"), "dns", 53, udp)},
			problems: []string{`endpointslice s1 has no TCP port, only "dns" 53/UDP (endpoints take HTTP, over TCP): give the Service a TCP port, or set port`},
		},
		{
			name:     "no slice at all",
			portName: "http",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, problems := Targets(tc.slices, tc.portName, tc.port, false, nil)
			if diff := cmp.Diff(tc.want, addrs(got)); tc.want != nil && diff != "" {
				t.Errorf("targets (-want +got):\n%s", diff)
			}
			if tc.want == nil && len(got) != 0 {
				t.Errorf("targets = %v, want none", addrs(got))
			}
			if len(problems) != len(tc.problems) {
				t.Fatalf("problems = %v, want %d", problems, len(tc.problems))
			}
			for _, want := range tc.problems {
				if !strings.Contains(errors.Join(problems...).Error(), want) {
					t.Errorf("problems %v lack %q", problems, want)
				}
			}
		})
	}
}

func TestTargets_PodsHeldBackUntilKnown(t *testing.T) {
	s := slice("s1", "vllm", discoveryv1.AddressTypeIPv4, httpPort, nil, ep("10.0.0.1", "a", "ready"), ep("10.0.0.2", "b", "ready"))
	known := map[string]*corev1.Pod{"a": pod("a", map[string]string{KeyEngine: "sglang"})}
	got, _ := Targets([]*discoveryv1.EndpointSlice{s}, "http", 0, true, func(namespace, name string) (*metav1.ObjectMeta, bool) {
		if namespace != ns {
			t.Errorf("pod looked up in namespace %q", namespace)
		}
		p, ok := known[name]
		if !ok {
			return nil, false
		}
		return &p.ObjectMeta, true
	})
	if len(got) != 1 || got[0].Pod != "inference/a" || got[0].Annotations[KeyEngine] != "sglang" || got[0].Labels["app"] != "vllm" {
		t.Errorf("targets = %+v, want only a, with its labels and annotations", got)
	}
}

func source(client kubernetes.Interface, k config.KubernetesDiscovery) *Source {
	if k.Scheme == "" {
		k.Scheme = "http"
	}
	return &Source{Config: k, Namespace: ns, Client: client}
}

func TestSource_Specs(t *testing.T) {
	s := source(nil, config.KubernetesDiscovery{Service: "vllm", PortName: "http", PodMetadata: true,
		Endpoint: config.Endpoint{Models: []string{"llama3-70b"}, Labels: map[string]string{"pool": "a"}}})
	a, b := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("fd00::2")
	specs, problems := s.Specs([]Target{
		{Addr: a, Port: 8000, Pod: "inference/a"},
		{Addr: b, Port: 8000, Pod: "inference/b", Labels: map[string]string{KeyEngine: "sglang"},
			Annotations: map[string]string{KeyEngine: "vllm", KeyModels: " llama3-8b, meta-llama/Llama-3.1-8B ,", KeyKVEvents: "5557"}},
		{Addr: a, Port: 8001, Pod: "inference/c", Annotations: map[string]string{KeyKVEvents: "tcp://kv.example:5557"}},
		{Addr: a, Port: 8002, Pod: "inference/bad", Annotations: map[string]string{KeyEngine: "vlm", KeyModels: " , ", KeyKVEvents: "udp://x:1"}},
		{Addr: a, Port: 8003, Pod: "inference/bad-port", Annotations: map[string]string{KeyKVEvents: "70000"}},
	})
	want := []endpoint.Spec{
		{Name: "http://10.0.0.1:8000", Models: []string{"llama3-70b"}, Labels: map[string]string{"pool": "a"}, Engine: "openai", MetricsPath: "/metrics"},
		{Name: "http://[fd00::2]:8000", Models: []string{"llama3-8b", "meta-llama/Llama-3.1-8B"}, Labels: map[string]string{"pool": "a"},
			Engine: "vllm", CacheSalt: true, MetricsPath: "/metrics", KVEvents: "tcp://[fd00::2]:5557"},
		{Name: "http://10.0.0.1:8001", Models: []string{"llama3-70b"}, Labels: map[string]string{"pool": "a"}, Engine: "openai",
			MetricsPath: "/metrics", KVEvents: "tcp://kv.example:5557"},
	}
	if diff := cmp.Diff(want, specs); diff != "" {
		t.Errorf("specs (-want +got):\n%s", diff)
	}
	msg := errors.Join(problems...).Error()
	for _, w := range []string{
		`pod inference/bad left out: kvroute.io/engine "vlm" is not an engine kind: use one of vllm`,
		`kvroute.io/models is empty`,
		`kvroute.io/kv-events "udp://x:1": give the engine's KV-event port`,
		`pod inference/bad-port left out: kvroute.io/kv-events "70000"`,
	} {
		if !strings.Contains(msg, w) {
			t.Errorf("problems lack %q:\n%s", w, msg)
		}
	}
	if len(problems) != 2 {
		t.Errorf("%d problems, want one per bad pod: %v", len(problems), problems)
	}
	if s.Config.Endpoint.Engine != "" || s.Config.Endpoint.CacheSalt != nil {
		t.Errorf("the template was changed: %+v", s.Config.Endpoint)
	}
}

// run starts src and returns a function that waits for its next set, and one that waits for
// its next reported problem (nil, at once, with pending false: whether one is waiting). The
// source is stopped, and must return, when the test ends.
func run(t *testing.T, src *Source) (next func() []string, nextErr func(pending bool) error) {
	t.Helper()
	sets := make(chan []endpoint.Spec, 100)
	errs := make(chan error, 100)
	src.OnError = func(err error) { errs <- err }
	testkube.RunUntilCleanup(t, func(ctx context.Context) error {
		return src.Run(ctx, func(s []endpoint.Spec) error { sets <- s; return nil })
	})
	next = func() []string {
		t.Helper()
		select {
		case s := <-sets:
			out := []string{}
			for _, e := range s {
				out = append(out, e.Name+" "+e.Engine)
			}
			return out
		case <-time.After(10 * time.Second):
			t.Fatal("no endpoint set within 10s")
			return nil
		}
	}
	nextErr = func(pending bool) error {
		t.Helper()
		if !pending {
			select {
			case err := <-errs:
				return err
			default:
				return nil
			}
		}
		select {
		case err := <-errs:
			return err
		case <-time.After(10 * time.Second):
			t.Fatal("no problem reported within 10s")
			return nil
		}
	}
	return next, nextErr
}

// k8s is the fake API server of a scenario.
type k8s struct {
	t      *testing.T
	client *fake.Clientset
}

func (k *k8s) applySlice(s *discoveryv1.EndpointSlice) {
	k.t.Helper()
	ctx := context.Background()
	c := k.client.DiscoveryV1().EndpointSlices(ns)
	if _, err := c.Get(ctx, s.Name, metav1.GetOptions{}); err == nil {
		_, err = c.Update(ctx, s, metav1.UpdateOptions{})
		if err != nil {
			k.t.Fatal(err)
		}
		return
	}
	if _, err := c.Create(ctx, s, metav1.CreateOptions{}); err != nil {
		k.t.Fatal(err)
	}
}

func (k *k8s) applyPod(p *corev1.Pod) {
	k.t.Helper()
	ctx := context.Background()
	c := k.client.CoreV1().Pods(ns)
	if _, err := c.Get(ctx, p.Name, metav1.GetOptions{}); err == nil {
		if _, err = c.Update(ctx, p, metav1.UpdateOptions{}); err != nil {
			k.t.Fatal(err)
		}
		return
	}
	if _, err := c.Create(ctx, p, metav1.CreateOptions{}); err != nil {
		k.t.Fatal(err)
	}
}

func (k *k8s) deleteSlice(name string) {
	k.t.Helper()
	if err := k.client.DiscoveryV1().EndpointSlices(ns).Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
		k.t.Fatal(err)
	}
}

// TestSource_Churn follows a Service through the life of its pods: each step is one change
// of one API object, and the source's next set must be the right one.
func TestSource_Churn(t *testing.T) {
	v4 := discoveryv1.AddressTypeIPv4
	client := fake.NewClientset(
		pod("a", nil), pod("b", map[string]string{KeyEngine: "sglang"}),
		slice("vllm-1", "vllm", v4, httpPort, nil, ep("10.0.0.1", "a", "ready"), ep("10.0.0.2", "b", "ready")),
		// Another Service's slice in the namespace: never selected.
		slice("other-1", "other", v4, httpPort, nil, ep("10.0.1.1", "x", "ready")),
	)
	k := &k8s{t: t, client: client}
	next, _ := run(t, source(client, config.KubernetesDiscovery{Service: "vllm", PortName: "http", PodMetadata: true,
		Endpoint: config.Endpoint{Engine: "vllm"}}))
	step := func(what string, want ...string) {
		t.Helper()
		if diff := cmp.Diff(append([]string{}, want...), next()); diff != "" {
			t.Errorf("%s: endpoints (-want +got):\n%s", what, diff)
		}
	}
	step("start", "http://10.0.0.1:8000 vllm", "http://10.0.0.2:8000 sglang")

	// A new pod: its pod object first (no change to the set), then its endpoint, not ready
	// (no change either), then ready.
	k.applyPod(pod("c", nil))
	k.applySlice(slice("vllm-1", "vllm", v4, httpPort, nil, ep("10.0.0.1", "a", "ready"), ep("10.0.0.2", "b", "ready"), ep("10.0.0.3", "c", "not-ready")))
	k.applySlice(slice("vllm-1", "vllm", v4, httpPort, nil, ep("10.0.0.1", "a", "ready"), ep("10.0.0.2", "b", "ready"), ep("10.0.0.3", "c", "ready")))
	step("pod c ready", "http://10.0.0.1:8000 vllm", "http://10.0.0.2:8000 sglang", "http://10.0.0.3:8000 vllm")

	k.applySlice(slice("vllm-1", "vllm", v4, httpPort, nil, ep("10.0.0.1", "a", "ready"), ep("10.0.0.2", "b", "not-ready"), ep("10.0.0.3", "c", "ready")))
	step("pod b not ready", "http://10.0.0.1:8000 vllm", "http://10.0.0.3:8000 vllm")

	k.applySlice(slice("vllm-1", "vllm", v4, httpPort, nil, ep("10.0.0.1", "a", "ready"), ep("10.0.0.2", "b", "ready"), ep("10.0.0.3", "c", "terminating")))
	step("pod b ready again, pod c terminating", "http://10.0.0.1:8000 vllm", "http://10.0.0.2:8000 sglang")

	// A second slice of the same Service (Kubernetes splits large ones).
	k.applyPod(pod("d", nil))
	k.applySlice(slice("vllm-2", "vllm", v4, httpPort, nil, ep("10.0.0.4", "d", "unset")))
	step("pod d in a second slice", "http://10.0.0.1:8000 vllm", "http://10.0.0.2:8000 sglang", "http://10.0.0.4:8000 vllm")

	// A pod's annotation changes what it is.
	k.applyPod(pod("d", map[string]string{KeyEngine: "tgi"}))
	step("pod d re-annotated", "http://10.0.0.1:8000 vllm", "http://10.0.0.2:8000 sglang", "http://10.0.0.4:8000 tgi")

	k.applySlice(slice("vllm-1", "vllm", v4, httpPort, nil, ep("10.0.0.2", "b", "ready")))
	step("pods a and c removed", "http://10.0.0.2:8000 sglang", "http://10.0.0.4:8000 tgi")

	k.deleteSlice("vllm-2")
	step("second slice deleted", "http://10.0.0.2:8000 sglang")

	k.deleteSlice("vllm-1")
	step("every slice deleted")
}

// TestSource_ServiceRelabelled selects Services by label. Kubernetes copies a Service's labels
// onto its slices; the fake API server has no controller, so the test re-labels the slices as
// that controller would.
func TestSource_ServiceRelabelled(t *testing.T) {
	v4 := discoveryv1.AddressTypeIPv4
	vllm := map[string]string{"app.kubernetes.io/name": "vllm"}
	client := fake.NewClientset(
		slice("blue-1", "blue", v4, httpPort, vllm, ep("10.0.0.1", "a", "ready")),
		slice("green-1", "green", v4, httpPort, map[string]string{"app.kubernetes.io/name": "staging"}, ep("10.0.0.2", "b", "ready")),
	)
	k := &k8s{t: t, client: client}
	next, _ := run(t, source(client, config.KubernetesDiscovery{Selector: "app.kubernetes.io/name=vllm", PortName: "http"}))
	if diff := cmp.Diff([]string{"http://10.0.0.1:8000 openai"}, next()); diff != "" {
		t.Errorf("start (-want +got):\n%s", diff)
	}
	k.applySlice(slice("green-1", "green", v4, httpPort, vllm, ep("10.0.0.2", "b", "ready")))
	if diff := cmp.Diff([]string{"http://10.0.0.1:8000 openai", "http://10.0.0.2:8000 openai"}, next()); diff != "" {
		t.Errorf("green labelled in (-want +got):\n%s", diff)
	}
	k.applySlice(slice("blue-1", "blue", v4, httpPort, map[string]string{"app.kubernetes.io/name": "retired"}, ep("10.0.0.1", "a", "ready")))
	if diff := cmp.Diff([]string{"http://10.0.0.2:8000 openai"}, next()); diff != "" {
		t.Errorf("blue labelled out (-want +got):\n%s", diff)
	}
}

// TestSource_ProblemsReportedOnce: a bad pod annotation and a missing port are reported
// (once, not on every event), the rest of the set still counts, and fixing them brings the
// endpoints in.
func TestSource_ProblemsReportedOnce(t *testing.T) {
	v4 := discoveryv1.AddressTypeIPv4
	client := fake.NewClientset(
		pod("a", map[string]string{KeyEngine: "vlm"}), pod("b", nil),
		slice("vllm-1", "vllm", v4, httpPort, nil, ep("10.0.0.1", "a", "ready"), ep("10.0.0.2", "b", "ready")),
		slice("vllm-2", "vllm", v4, []port{{"grpc", 9000}}, nil, ep("10.0.0.3", "", "ready")),
	)
	k := &k8s{t: t, client: client}
	src := source(client, config.KubernetesDiscovery{Service: "vllm", PortName: "http", PodMetadata: true})
	next, nextErr := run(t, src)
	if diff := cmp.Diff([]string{"http://10.0.0.2:8000 openai"}, next()); diff != "" {
		t.Errorf("start (-want +got):\n%s", diff)
	}
	got := []string{nextErr(true).Error(), nextErr(true).Error()}
	for _, want := range []string{`endpointslice vllm-2 has no port named "http"`, `pod inference/a left out: kvroute.io/engine "vlm"`} {
		if !strings.Contains(strings.Join(got, "\n"), want) {
			t.Errorf("problems %q lack %q", got, want)
		}
	}
	// An unrelated change: the problems stand, and are not reported again.
	k.applyPod(pod("b", map[string]string{"note": "x"}))
	k.applyPod(pod("a", map[string]string{KeyEngine: "vllm"}))
	if diff := cmp.Diff([]string{"http://10.0.0.1:8000 vllm", "http://10.0.0.2:8000 openai"}, next()); diff != "" {
		t.Errorf("after the fix (-want +got):\n%s", diff)
	}
	k.applySlice(slice("vllm-2", "vllm", v4, []port{{"http", 8001}}, nil, ep("10.0.0.3", "", "ready")))
	if diff := cmp.Diff([]string{"http://10.0.0.1:8000 vllm", "http://10.0.0.2:8000 openai", "http://10.0.0.3:8001 openai"}, next()); diff != "" {
		t.Errorf("after the port fix (-want +got):\n%s", diff)
	}
	if err := nextErr(false); err != nil {
		t.Errorf("a problem was reported again: %v", err)
	}
}

// TestSource_RejectedSetTriedAgain: a set the receiver rejects is reported, and the same set
// is offered again at the next change rather than being taken as delivered.
func TestSource_RejectedSetTriedAgain(t *testing.T) {
	v4 := discoveryv1.AddressTypeIPv4
	client := fake.NewClientset(slice("vllm-1", "vllm", v4, httpPort, nil, ep("10.0.0.1", "a", "ready")))
	k := &k8s{t: t, client: client}
	src := source(client, config.KubernetesDiscovery{Service: "vllm"})
	var mu sync.Mutex
	refuse := true
	sets := make(chan int, 10)
	errs := make(chan error, 10)
	src.OnError = func(err error) { errs <- err }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = src.Run(ctx, func(s []endpoint.Spec) error {
			mu.Lock()
			defer mu.Unlock()
			if refuse {
				return errors.New("pool says no")
			}
			sets <- len(s)
			return nil
		})
	}()
	defer func() { cancel(); <-done }()
	select {
	case err := <-errs:
		if !strings.Contains(err.Error(), "kubernetes:inference/vllm: pool says no") {
			t.Errorf("error = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the refusal was not reported")
	}
	mu.Lock()
	refuse = false
	mu.Unlock()
	// A change that leaves the set as it was: the set is offered again since it never landed.
	k.applySlice(slice("vllm-1", "vllm", v4, httpPort, map[string]string{"touched": "yes"}, ep("10.0.0.1", "a", "ready")))
	select {
	case n := <-sets:
		if n != 1 {
			t.Errorf("set of %d, want 1", n)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the set was not offered again")
	}
}

func TestNewClient(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	t.Setenv("KUBECONFIG", "")
	t.Setenv("HOME", t.TempDir())
	if _, _, err := NewClient("", "kvroute/test"); err == nil || !strings.Contains(err.Error(), "no cluster to talk to") {
		t.Errorf("no cluster: %v, want it said", err)
	}
	kc := testkube.Kubeconfig(t, "gpu-a")
	c, ns, err := NewClient(kc, "kvroute/test")
	if err != nil || c == nil || ns != "gpu-a" {
		t.Errorf("NewClient = %v, %q, %v; want a client for namespace gpu-a", c, ns, err)
	}
	cfg, err := config.Parse(fmt.Appendf(nil, "auth: {mode: none}\ndiscovery: {kubernetes: [{service: vllm, kubeconfig: %q}, {namespace: other, selector: app=x, kubeconfig: %q}]}\n", kc, kc))
	if err != nil {
		t.Fatal(err)
	}
	srcs, err := FromConfig(cfg, "kvroute/test", nil)
	if err != nil || len(srcs) != 2 || srcs[0].Key() != "kubernetes:gpu-a/vllm" || srcs[1].Key() != "kubernetes:other/app=x" {
		t.Errorf("FromConfig = %v, %v", srcs, err)
	}
	if _, _, err := NewClient(t.TempDir()+"/missing", "kvroute/test"); err == nil {
		t.Error("a missing kubeconfig: no error")
	}
}

// FuzzSpecs: whatever a pod's labels and annotations say, Specs answers without panicking,
// and every endpoint it gives has a known engine, models without blanks and a tcp KV-event
// address or none; a pod it leaves out is reported.
func FuzzSpecs(f *testing.F) {
	f.Add("vllm", "a,b", "5557")
	f.Add("vlm", " , ", "tcp://x:1")
	f.Add("", "meta-llama/Llama-3.1-8B", "tcp://[fd00::1]:65535")
	f.Add("sglang", "", "udp://x:0")
	f.Fuzz(func(t *testing.T, engine, models, kv string) {
		s := source(nil, config.KubernetesDiscovery{Service: "vllm", PodMetadata: true})
		tg := Target{Addr: netip.MustParseAddr("10.0.0.1"), Port: 8000, Pod: "inference/p",
			Annotations: map[string]string{KeyEngine: engine, KeyModels: models, KeyKVEvents: kv}}
		specs, problems := s.Specs([]Target{tg})
		if len(specs)+len(problems) != 1 {
			t.Fatalf("%d specs and %d problems for one pod", len(specs), len(problems))
		}
		for _, sp := range specs {
			if !slices.Contains(config.Engines(), sp.Engine) || sp.Name != "http://10.0.0.1:8000" {
				t.Errorf("spec %+v", sp)
			}
			for _, m := range sp.Models {
				if strings.TrimSpace(m) == "" || m != strings.TrimSpace(m) {
					t.Errorf("model %q", m)
				}
			}
			if sp.KVEvents != "" && !strings.HasPrefix(sp.KVEvents, "tcp://") {
				t.Errorf("kv events %q", sp.KVEvents)
			}
		}
	})
}

// kvroute.io/step-tokens sets the pod's configured step budget over the template's; a value
// that does not parse is reported, naming the pod and the fix, and ignored: the pod stays,
// with the template's budget.
func TestSource_SpecsStepTokens(t *testing.T) {
	s := source(nil, config.KubernetesDiscovery{Service: "sglang", PortName: "http", PodMetadata: true,
		Endpoint: config.Endpoint{Models: []string{"m"}, Engine: "sglang", StepTokens: 4096}})
	a := netip.MustParseAddr("10.0.0.1")
	specs, problems := s.Specs([]Target{
		{Addr: a, Port: 8000, Pod: "inference/a"},
		{Addr: a, Port: 8001, Pod: "inference/b", Annotations: map[string]string{KeyStepTokens: " 16384 "}},
		{Addr: a, Port: 8002, Pod: "inference/c", Labels: map[string]string{KeyStepTokens: "2048"}},
		{Addr: a, Port: 8003, Pod: "inference/d", Annotations: map[string]string{KeyStepTokens: "0"}},
		{Addr: a, Port: 8004, Pod: "inference/e", Annotations: map[string]string{KeyStepTokens: "8k"}},
		{Addr: a, Port: 8005, Pod: "inference/f", Annotations: map[string]string{KeyStepTokens: "-1"}},
	})
	got := map[string]int{}
	for _, sp := range specs {
		got[sp.Name] = sp.StepTokens
	}
	want := map[string]int{
		"http://10.0.0.1:8000": 4096, "http://10.0.0.1:8001": 16384, "http://10.0.0.1:8002": 2048,
		"http://10.0.0.1:8003": 0, "http://10.0.0.1:8004": 4096, "http://10.0.0.1:8005": 4096,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("step budgets by endpoint (-want +got):\n%s", diff)
	}
	if len(problems) != 2 {
		t.Fatalf("%d problems, want 2 (pods e and f): %v", len(problems), problems)
	}
	msg := errors.Join(problems...).Error()
	for _, w := range []string{
		`pod inference/e: kvroute.io/step-tokens "8k" ignored: give the engine's tokens per step`,
		`pod inference/f: kvroute.io/step-tokens "-1" ignored`,
	} {
		if !strings.Contains(msg, w) {
			t.Errorf("problems lack %q:\n%s", w, msg)
		}
	}
	if strings.Contains(msg, "left out") {
		t.Errorf("a bad step budget left a pod out:\n%s", msg)
	}
}

// TestWatch_PodKeys: of a pod's labels and annotations, a watch keeps those of PodKeys only:
// a namespace's pods carry many, some large (kubectl's last-applied-configuration), and all of
// them used to be kept for every pod.
func TestWatch_PodKeys(t *testing.T) {
	p := pod("a", map[string]string{
		KeyModels: "m",
		"kubectl.kubernetes.io/last-applied-configuration": strings.Repeat("x", 16<<10),
		"sidecar.istio.io/status":                          `{"initContainers":["istio-init"]}`,
	})
	p.Labels = map[string]string{"app": "vllm", "pod-template-hash": "5d9c", KeyEngine: "sglang"}
	client := fake.NewClientset(p, slice("vllm-1", "vllm", discoveryv1.AddressTypeIPv4, httpPort, nil, ep("10.0.0.1", "a", "ready")))
	targets := make(chan []Target, 10)
	w := &Watch{Client: client, Namespace: ns, PortName: "http", Pods: true, PodKeys: []string{KeyEngine, KeyModels}, Name: "test"}
	testkube.RunUntilCleanup(t, func(ctx context.Context) error {
		return w.Run(ctx, func(ts []Target) { targets <- ts })
	})
	var got []Target
	select {
	case got = <-targets:
	case <-time.After(10 * time.Second):
		t.Fatal("no targets within 10s")
	}
	if len(got) != 1 {
		t.Fatalf("targets %v, want pod a's", addrs(got))
	}
	if diff := cmp.Diff(map[string]string{KeyEngine: "sglang"}, got[0].Labels); diff != "" {
		t.Errorf("labels kept (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]string{KeyModels: "m"}, got[0].Annotations); diff != "" {
		t.Errorf("annotations kept (-want +got):\n%s", diff)
	}
}

// TestSource_PodKeys: a Source's watch keeps each pod key it reads, from a label or an
// annotation.
func TestSource_PodKeys(t *testing.T) {
	p := pod("a", map[string]string{KeyModels: "llama3-8b", KeyKVEvents: "5557", "unrelated": "x"})
	p.Labels = map[string]string{KeyEngine: "sglang", KeyStepTokens: "2048", "app": "vllm"}
	client := fake.NewClientset(p, slice("vllm-1", "vllm", discoveryv1.AddressTypeIPv4, httpPort, nil, ep("10.0.0.1", "a", "ready")))
	src := source(client, config.KubernetesDiscovery{Service: "vllm", PortName: "http", PodMetadata: true})
	sets := make(chan []endpoint.Spec, 10)
	testkube.RunUntilCleanup(t, func(ctx context.Context) error {
		return src.Run(ctx, func(s []endpoint.Spec) error { sets <- s; return nil })
	})
	select {
	case got := <-sets:
		if len(got) != 1 {
			t.Fatalf("endpoints %+v, want pod a's", got)
		}
		e := got[0]
		if e.Engine != "sglang" || !slices.Equal(e.Models, []string{"llama3-8b"}) || e.KVEvents != "tcp://10.0.0.1:5557" || e.StepTokens != 2048 {
			t.Errorf("endpoint %+v: want engine sglang, models [llama3-8b], kv events tcp://10.0.0.1:5557 and 2048 step tokens from the pod", e)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no endpoints within 10s")
	}
}
