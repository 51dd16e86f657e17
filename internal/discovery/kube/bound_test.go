package kube

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	discoveryclient "k8s.io/client-go/kubernetes/typed/discovery/v1"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/testkube"
	"github.com/kvroute/kvroute/internal/testlog"
)

// silentAPI is a fake API server whose first hang requests for EndpointSlices are accepted
// and never answered (they end only with their context), as an API server behind a stuck
// proxy does; it records every request's options.
type silentAPI struct {
	*fake.Clientset
	mu    sync.Mutex
	hang  int
	lists []metav1.ListOptions
	watch []metav1.ListOptions
}

func (a *silentAPI) DiscoveryV1() discoveryclient.DiscoveryV1Interface {
	return silentDiscovery{a.Clientset.DiscoveryV1(), a}
}

type silentDiscovery struct {
	discoveryclient.DiscoveryV1Interface
	a *silentAPI
}

func (d silentDiscovery) EndpointSlices(namespace string) discoveryclient.EndpointSliceInterface {
	return silentSlices{d.DiscoveryV1Interface.EndpointSlices(namespace), d.a}
}

type silentSlices struct {
	discoveryclient.EndpointSliceInterface
	a *silentAPI
}

// request records o and says whether to hang.
func (a *silentAPI) request(o metav1.ListOptions, watching bool) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if watching {
		a.watch = append(a.watch, o)
	} else {
		a.lists = append(a.lists, o)
	}
	a.hang--
	return a.hang >= 0
}

func (a *silentAPI) requests() (lists, watches []metav1.ListOptions) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]metav1.ListOptions(nil), a.lists...), append([]metav1.ListOptions(nil), a.watch...)
}

func (s silentSlices) List(ctx context.Context, o metav1.ListOptions) (*discoveryv1.EndpointSliceList, error) {
	if s.a.request(o, false) {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return s.EndpointSliceInterface.List(ctx, o)
}

func (s silentSlices) Watch(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
	if s.a.request(o, true) {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return s.EndpointSliceInterface.Watch(ctx, o)
}

// TestWatch_APIThatNeverAnswers: a first list that gets no answer is said while it lasts,
// and ends at the request's deadline, so that the informer's next try finds the endpoints;
// client-go alone would wait for it as long as the connection stays up.
func TestWatch_APIThatNeverAnswers(t *testing.T) {
	api := &silentAPI{Clientset: fake.NewClientset(
		slice("vllm-1", "vllm", discoveryv1.AddressTypeIPv4, httpPort, nil, ep("10.0.0.1", "a", "ready")))}
	api.hang = 1
	errs := make(chan error, 100)
	sets := make(chan []string, 10)
	w := &Watch{Client: api, Namespace: ns, PortName: "http", Name: "test",
		RequestTimeout: time.Second, SyncWarn: 100 * time.Millisecond, OnError: func(err error) { errs <- err }}
	testkube.RunUntilCleanup(t, func(ctx context.Context) error {
		return w.Run(ctx, func(ts []Target) { sets <- addrs(ts) })
	})
	select {
	case err := <-errs:
		if !strings.Contains(err.Error(), "test: no answer from the API for") {
			t.Errorf("first problem %q, want the API's silence said", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a first list without an answer was not said within 10 s")
	}
	select {
	case got := <-sets:
		if diff := cmp.Diff([]string{"10.0.0.1:8000 inference/a"}, got); diff != "" {
			t.Errorf("first set (-want +got):\n%s", diff)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("no set within 15 s: the list that got no answer was never given up")
	}
	lists, _ := api.requests()
	if len(lists) < 2 {
		t.Errorf("%d lists, want the silent one and another", len(lists))
	}
}

// TestWatch_RequestTimeouts: each list and watch asks the API server to end it within a minute
// (client-go's own watches ask for 5 to 10).
func TestWatch_RequestTimeouts(t *testing.T) {
	api := &silentAPI{Clientset: fake.NewClientset(
		slice("vllm-1", "vllm", discoveryv1.AddressTypeIPv4, httpPort, nil, ep("10.0.0.1", "a", "ready")))}
	sets := make(chan []string, 10)
	w := &Watch{Client: api, Namespace: ns, PortName: "http", Name: "test"}
	testkube.RunUntilCleanup(t, func(ctx context.Context) error {
		return w.Run(ctx, func(ts []Target) { sets <- addrs(ts) })
	})
	select {
	case <-sets:
	case <-time.After(10 * time.Second):
		t.Fatal("no set within 10 s")
	}
	var lists, watches []metav1.ListOptions
	for deadline := time.Now().Add(10 * time.Second); len(watches) == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no watch within 10 s")
		}
		lists, watches = api.requests()
	}
	for _, o := range append(lists, watches...) {
		if o.TimeoutSeconds == nil || *o.TimeoutSeconds < 1 || *o.TimeoutSeconds > 60 {
			got := "none"
			if o.TimeoutSeconds != nil {
				got = fmt.Sprintf("%d s", *o.TimeoutSeconds)
			}
			t.Errorf("a request (watch %v) asks for a timeout of %s, want 1 to 60 s", o.Watch || o.ResourceVersion != "", got)
		}
	}
}

// TestSource_MaxEndpoints: a set over max_endpoints is refused, said once, and the set in
// force stays; a change is logged with counts and a bounded list; an address Exclude names is
// left out and reported.
func TestSource_MaxEndpoints(t *testing.T) {
	v4 := discoveryv1.AddressTypeIPv4
	eps := func(from, n int) []discoveryv1.Endpoint {
		var out []discoveryv1.Endpoint
		for i := from; i < from+n; i++ {
			out = append(out, ep(fmt.Sprintf("10.0.%d.%d", i/250, i%250+1), fmt.Sprintf("p%d", i), "ready"))
		}
		return out
	}
	client := fake.NewClientset(slice("vllm-1", "vllm", v4, httpPort, nil, eps(0, 20)...))
	k := &k8s{t: t, client: client}
	var logs testlog.Buffer
	src := source(client, config.KubernetesDiscovery{Service: "vllm", PortName: "http", MaxEndpoints: 30})
	src.Log = slog.New(slog.NewJSONHandler(&logs, nil))
	src.Exclude = func(a netip.AddrPort) bool { return a == netip.MustParseAddrPort("10.0.0.1:8000") }
	next, nextErr := run(t, src)
	if got := next(); len(got) != 19 || got[0] != "http://10.0.0.2:8000 openai" {
		t.Errorf("start: %d endpoints from %v, want 19, the router's own address left out", len(got), got[:min(len(got), 1)])
	}
	if err := nextErr(true); !strings.Contains(err.Error(), "address 10.0.0.1:8000 of pod inference/p0 left out: excluded") {
		t.Errorf("problem %v, want the excluded address named", err)
	}
	// The change is logged just after emit returns.
	var line string
	for deadline := time.Now().Add(10 * time.Second); line == "" && time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		line = lastLine(&logs, "endpoints found in Kubernetes changed")
	}
	if !strings.Contains(line, `"endpoints":19`) || !strings.Contains(line, "and 9 more") {
		t.Errorf("change logged as %.500s; want counts and a bounded list", line)
	}
	k.applySlice(slice("vllm-1", "vllm", v4, httpPort, nil, eps(0, 40)...))
	if err := nextErr(true); !strings.Contains(err.Error(), "39 endpoints, more than max_endpoints (30): the 19 in force stay") {
		t.Errorf("problem %v, want the refusal", err)
	}
	k.applySlice(slice("vllm-1", "vllm", v4, httpPort, nil, eps(0, 50)...))
	k.applySlice(slice("vllm-1", "vllm", v4, httpPort, nil, eps(1, 5)...))
	if got := next(); len(got) != 5 {
		t.Errorf("after the refusals: %d endpoints, want 5 (no set over max_endpoints given)", len(got))
	}
	if err := nextErr(false); err != nil {
		t.Errorf("a refusal was said again, or another problem: %v", err)
	}
}

// lastLine returns the last line of logs that has sub.
func lastLine(logs *testlog.Buffer, sub string) string {
	var out string
	for l := range strings.SplitSeq(logs.String(), "\n") {
		if strings.Contains(l, sub) {
			out = l
		}
	}
	return out
}
