package kube

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"

	"k8s.io/apimachinery/pkg/labels"
	coreclient "k8s.io/client-go/kubernetes/typed/core/v1"
	discoveryclient "k8s.io/client-go/kubernetes/typed/discovery/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/discovery"
	"github.com/kvroute/kvroute/internal/endpoint"
)

// The pod labels and annotations a Source reads (with discovery.kubernetes[].pod_metadata). An
// annotation wins over a label of the same key; model names with a slash fit only annotations.
const (
	// KeyEngine is the engine kind (vllm, sglang, ...), like endpoints[].engine.
	KeyEngine = "kvroute.io/engine"
	// KeyModels is the comma-separated list of models the pod serves.
	KeyModels = "kvroute.io/models"
	// KeyKVEvents is the engine's KV-event publisher: tcp://host:port, or a port alone for
	// tcp://<pod address>:<port>.
	KeyKVEvents = "kvroute.io/kv-events"
	// KeyStepTokens is the engine's step budget under chunked prefill, in its tokens, like
	// endpoints[].step_tokens (vLLM's max_num_batched_tokens). A value that does not parse is
	// reported and ignored, not a reason to leave the pod out: a wrong budget costs estimates,
	// not requests.
	KeyStepTokens = "kvroute.io/step-tokens"
)

// ServiceNameLabel is the label Kubernetes puts on a Service's EndpointSlices.
const ServiceNameLabel = "kubernetes.io/service-name"

// Source finds engine endpoints in EndpointSlices: one discovery.kubernetes entry. Each ready
// address becomes an endpoint with the entry's template, overridden per pod by its labels and
// annotations when pod_metadata is on. It gives its sets to the router the way the file and
// DNS sources do.
type Source struct {
	// Config is the entry: what to watch, the port, the scheme and the endpoint template.
	Config config.KubernetesDiscovery
	// Namespace is where to watch: Config.Namespace, or the one the client config names.
	Namespace string
	// Client talks to the API server.
	Client Client
	// Log receives watch failures, pods left out and changes (discarded when nil).
	Log *slog.Logger
	// OnError, when set, also receives each failure (for a metric or a test).
	OnError func(error)
	// Exclude, when set, leaves out each address it returns true for: the router's own listen
	// addresses (Watch.Exclude).
	Exclude func(netip.AddrPort) bool

	pods atomic.Pointer[map[string]string] // the last set given: endpoint name -> pod (Pods)
}

// Key names the source in logs and metrics: "kubernetes:" and the namespace and the service or
// selector.
func (s *Source) Key() string {
	c := s.Config
	c.Namespace = s.Namespace
	return "kubernetes:" + c.Key()
}

// Selector returns the label selector the source watches slices with.
func (s *Source) Selector() (labels.Selector, error) {
	if s.Config.Service != "" {
		return labels.SelectorFromSet(labels.Set{ServiceNameLabel: s.Config.Service}), nil
	}
	sel, err := labels.Parse(s.Config.Selector)
	if err != nil {
		return nil, fmt.Errorf("%s: selector: %w", s.Key(), err)
	}
	return sel, nil
}

// Run watches the slices (and pods, with pod_metadata) and calls emit with the endpoints every
// time they change, the first time once the informers have listed everything. A set emit
// rejects is logged and reported, and the next change is tried again. A set of more than
// max_endpoints is refused, said once, and the set in force stays. It blocks until ctx ends.
func (s *Source) Run(ctx context.Context, emit func([]endpoint.Spec) error) error {
	sel, err := s.Selector()
	if err != nil {
		return err
	}
	log := s.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	fail := func(err error) {
		log.Warn("kubernetes discovery", "source", s.Key(), "err", err)
		if s.OnError != nil {
			s.OnError(err)
		}
	}
	w := &Watch{
		Client: s.Client, Namespace: s.Namespace, Selector: sel,
		PortName: s.Config.PortName, Port: s.Config.Port, Pods: s.Config.PodMetadata,
		PodKeys: []string{KeyEngine, KeyModels, KeyKVEvents, KeyStepTokens}, // what spec reads
		OnError: fail, Name: s.Key(), Exclude: s.Exclude,
	}
	limit := cmp.Or(s.Config.MaxEndpoints, config.DefaultMaxEndpoints)
	var last []endpoint.Spec
	var lastNames []string
	first, over := true, false
	problems := reporter{fail: fail}
	return w.Run(ctx, func(targets []Target) {
		specs, errs := s.Specs(targets)
		problems.report(errs)
		if len(specs) > limit {
			if !over {
				fail(fmt.Errorf("%s: %d endpoints, more than max_endpoints (%d): the %d in force stay; raise max_endpoints if the watch really selects that many engines, or narrow its selector",
					s.Key(), len(specs), limit, len(last)))
			}
			over = true
			return
		}
		over = false
		s.keepPods(targets)
		if !first && reflect.DeepEqual(specs, last) {
			return
		}
		if err := emit(specs); err != nil {
			fail(fmt.Errorf("%s: %w", s.Key(), err))
			return
		}
		names := make([]string, len(specs))
		for i := range specs {
			names[i] = specs[i].Name
		}
		added, removed := discovery.Changes(lastNames, names)
		first, last, lastNames = false, specs, names
		log.Info("endpoints found in Kubernetes changed", "source", s.Key(), "endpoints", len(names), "added", added, "removed", removed)
	})
}

// Specs turns targets into endpoints: the template with each target's URL and, with
// pod_metadata, its pod's engine, models, KV-event address and step budget. A pod whose keys
// do not parse is left out (a wrong engine kind would get the wrong health checks and
// requests), and the problem, naming the pod, the key and the fix, is returned; a step budget
// that does not parse is returned as a problem too, but only it is left aside.
func (s *Source) Specs(targets []Target) ([]endpoint.Spec, []error) {
	specs := make([]endpoint.Spec, 0, len(targets))
	var problems []error
	for _, t := range targets {
		spec, ignored, err := s.spec(t)
		if err != nil {
			problems = append(problems, fmt.Errorf("%s: pod %s left out: %w", s.Key(), cmp.Or(t.Pod, t.HostPort()), err))
			continue
		}
		if ignored != nil {
			problems = append(problems, fmt.Errorf("%s: pod %s: %w", s.Key(), cmp.Or(t.Pod, t.HostPort()), ignored))
		}
		specs = append(specs, spec)
	}
	return specs, problems
}

// spec makes t's endpoint; ignored is a key that did not parse and was left aside, err one
// that leaves the pod out.
func (s *Source) spec(t Target) (spec endpoint.Spec, ignored, err error) {
	e := s.Config.Endpoint
	e.Models = slices.Clone(e.Models)
	e.URL = s.Config.Scheme + "://" + t.HostPort()
	meta := func(key string) (string, bool) {
		if v, ok := t.Annotations[key]; ok {
			return strings.TrimSpace(v), true
		}
		v, ok := t.Labels[key]
		return strings.TrimSpace(v), ok
	}
	var errs []error
	if v, ok := meta(KeyEngine); ok {
		if !slices.Contains(config.Engines(), v) {
			errs = append(errs, fmt.Errorf("%s %q is not an engine kind: use one of %s", KeyEngine, v, strings.Join(config.Engines(), ", ")))
		}
		e.Engine = v
	}
	if v, ok := meta(KeyModels); ok {
		e.Models = nil
		for m := range strings.SplitSeq(v, ",") {
			if m = strings.TrimSpace(m); m != "" {
				e.Models = append(e.Models, m)
			}
		}
		if len(e.Models) == 0 {
			errs = append(errs, fmt.Errorf("%s is empty: list the models the pod serves, like llama3-70b,llama3-8b, or remove it for the template's", KeyModels))
		}
	}
	var kv string
	if v, ok := meta(KeyKVEvents); ok {
		var err error
		if kv, err = kvEventsAddr(v, t.Addr); err != nil {
			errs = append(errs, err)
		}
	}
	if v, ok := meta(KeyStepTokens); ok {
		if n, err := strconv.Atoi(v); err != nil || n < 0 {
			ignored = fmt.Errorf("%s %q ignored: give the engine's tokens per step under chunked prefill, like 8192 (vLLM's max_num_batched_tokens), or 0 for what the engine reports or its kind's default", KeyStepTokens, v)
		} else {
			e.StepTokens = n
		}
	}
	if len(errs) > 0 {
		return endpoint.Spec{}, nil, errors.Join(errs...)
	}
	e.SetDefaults()
	spec = discovery.Spec(&e)
	spec.KVEvents = kv
	return spec, ignored, nil
}

// kvEventsAddr reads a kvroute.io/kv-events value: a port (on the pod's address) or tcp://host:port.
func kvEventsAddr(v string, addr netip.Addr) (string, error) {
	bad := fmt.Errorf("%s %q: give the engine's KV-event port, like 5557, or tcp://host:port", KeyKVEvents, v)
	if p, err := strconv.Atoi(v); err == nil {
		if p < 1 || p > 65535 {
			return "", bad
		}
		return "tcp://" + netip.AddrPortFrom(addr, uint16(p)).String(), nil
	}
	u, err := url.Parse(v)
	if err != nil || u.Scheme != "tcp" || u.Hostname() == "" || u.Path != "" {
		return "", bad
	}
	if p, err := strconv.Atoi(u.Port()); err != nil || p < 1 || p > 65535 {
		return "", bad
	}
	return "tcp://" + net.JoinHostPort(u.Hostname(), u.Port()), nil
}

// FromConfig returns a source for each discovery.kubernetes entry of c, each with its client
// (built from the entry's kubeconfig, or the in-cluster service account) and its namespace. It
// fails when there is no cluster to talk to, so that a router misconfigured this way does not
// start; nothing is contacted yet.
func FromConfig(c *config.Config, userAgent string, log *slog.Logger) ([]*Source, error) {
	out := make([]*Source, 0, len(c.Discovery.Kubernetes))
	var errs []error
	for i, k := range c.Discovery.Kubernetes {
		client, ns, err := NewClient(c.Path(k.Kubeconfig), userAgent)
		if err != nil {
			errs = append(errs, fmt.Errorf("discovery.kubernetes[%d]: %w", i, err))
			continue
		}
		out = append(out, &Source{Config: k, Namespace: cmp.Or(k.Namespace, ns), Client: client, Log: log})
	}
	return out, errors.Join(errs...)
}

// NewClient returns a client for the cluster that kubeconfig names ("": KUBECONFIG or
// ~/.kube/config when there is one, else the in-cluster service account) and the namespace it
// implies (the context's, or the service account's).
func NewClient(kubeconfig, userAgent string) (Client, string, error) {
	rc, ns, err := RESTConfig(kubeconfig, userAgent)
	if err != nil {
		return nil, "", err
	}
	var c clients
	if c.discovery, err = discoveryclient.NewForConfig(rc); err == nil {
		c.core, err = coreclient.NewForConfig(rc)
	}
	if err != nil {
		return nil, "", fmt.Errorf("kubernetes client: %w", err)
	}
	return c, ns, nil
}

// RESTConfig returns the client config NewClient builds its clients from, and the namespace
// it implies, for the sources that need other clients (the InferencePool's dynamic one).
func RESTConfig(kubeconfig, userAgent string) (*rest.Config, string, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{})
	rc, err := cc.ClientConfig()
	if err != nil {
		if clientcmd.IsEmptyConfig(err) {
			return nil, "", errors.New("no cluster to talk to: not running in a pod (KUBERNETES_SERVICE_HOST is unset) and no kubeconfig: set kubeconfig, or run the router in the cluster")
		}
		return nil, "", fmt.Errorf("kubernetes client config: %w", err)
	}
	rc.UserAgent = userAgent
	ns, _, err := cc.Namespace()
	if err != nil {
		return nil, "", fmt.Errorf("kubernetes namespace: %w", err)
	}
	return rc, ns, nil
}

// clients is a Client of the two API groups a Watch reads.
type clients struct {
	discovery discoveryclient.DiscoveryV1Interface
	core      coreclient.CoreV1Interface
}

func (c clients) DiscoveryV1() discoveryclient.DiscoveryV1Interface { return c.discovery }
func (c clients) CoreV1() coreclient.CoreV1Interface                { return c.core }
