package peer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/discovery/kube"
)

// Kube finds replicas in EndpointSlices through the Kubernetes API (peers.kubernetes): the
// ready addresses of the replicas' Service, at the gossip port. It follows the slices with
// internal/discovery/kube's Watch, whose informers keep a cache; Addrs reads the last set the
// watch gave and never calls the API. Run (once) must be running for it to find anything.
//
// This replica's own address is in the set, as it is in a DNS name's: the node skips its own
// gossip address when it joins.
type Kube struct {
	// Watch says what to watch: client, namespace, selector and port. Its Log and OnError are
	// replaced by the source's own.
	Watch kube.Watch
	// Log receives a problem (the API failing, a slice without the port) once while it stands,
	// not at each retry, and the sets found (each change, and the first after a problem); nil:
	// discarded.
	Log *slog.Logger
	// OnError, when set, receives every failure (for a metric or a test).
	OnError func(error)

	addrs atomic.Pointer[[]string] // the last set; nil until the first list
	last  atomic.Pointer[error]    // the last failure, while nothing was listed

	mu      sync.Mutex
	failing string // the failure logged last; "" once a set came after it
}

// KubeFromConfig returns the source of c.Peers.Kubernetes, nil without one. Its client is
// built from the kubeconfig given (or the in-cluster service account), and its namespace
// defaults to the one that implies. Nothing is contacted yet.
func KubeFromConfig(c *config.Config, userAgent string, log *slog.Logger) (*Kube, error) {
	if c.Peers == nil || c.Peers.Kubernetes == nil {
		return nil, nil
	}
	k := c.Peers.Kubernetes
	client, ns, err := kube.NewClient(c.Path(k.Kubeconfig), userAgent)
	if err != nil {
		return nil, fmt.Errorf("peers.kubernetes: %w", err)
	}
	// The engines' source knows how a Service or a selector picks slices, and how to name it.
	src := &kube.Source{Config: config.KubernetesDiscovery{Service: k.Service, Selector: k.Selector}, Namespace: cmp.Or(k.Namespace, ns)}
	sel, err := src.Selector()
	if err != nil {
		return nil, fmt.Errorf("peers.kubernetes: %w", err)
	}
	return &Kube{
		Watch: kube.Watch{Client: client, Namespace: src.Namespace, Selector: sel, PortName: k.PortName, Port: k.Port,
			Name: "peers:" + src.Key()},
		Log: log,
	}, nil
}

// Run watches the slices until ctx ends, and returns ctx's error. A failure of the API keeps
// the last set in force (the informers retry with back-off).
func (k *Kube) Run(ctx context.Context) error {
	w := k.Watch
	w.Log = nil
	w.OnError = k.fail
	return w.Run(ctx, func(ts []kube.Target) {
		addrs := make([]string, len(ts))
		for i, t := range ts {
			addrs[i] = t.HostPort()
		}
		k.mu.Lock()
		recovered := k.failing != ""
		k.failing = ""
		k.mu.Unlock()
		// Logged before the set is in force, so that whoever sees the set finds the line written.
		// Only this goroutine stores the set.
		if old := k.addrs.Load(); recovered || old == nil || !slices.Equal(*old, addrs) {
			k.log().Info("peer replicas found in Kubernetes", "source", k.String(), "addrs", addrs, "after_problem", recovered)
		}
		k.addrs.Store(&addrs)
	})
}

// fail logs a failure when it differs from the one logged last, and passes every one on.
func (k *Kube) fail(err error) {
	if k.addrs.Load() == nil {
		k.last.Store(&err)
	}
	if k.OnError != nil {
		k.OnError(err)
	}
	k.mu.Lock()
	repeated := err.Error() == k.failing
	k.failing = err.Error()
	k.mu.Unlock()
	if !repeated {
		var known []string
		if a := k.addrs.Load(); a != nil {
			known = *a
		}
		k.log().Warn("peer replicas: Kubernetes watch problem; joining the replicas last found (the informer retries with back-off; logged again only if the problem changes)",
			"source", k.String(), "known", known, "err", err)
	}
}

func (k *Kube) log() *slog.Logger {
	if k.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return k.Log
}

var (
	// errNotListed is Addrs's answer before the watch first listed the slices.
	errNotListed = errors.New("the EndpointSlices are not listed yet")
	// errWatchStarting is that answer before the watch failed too: it is starting (its first
	// list takes a moment), which the node neither counts nor warns of.
	errWatchStarting = fmt.Errorf("%w (the watch is starting)", errNotListed)
)

// Addrs returns the addresses of the last set the watch gave, from its cache. Before the first
// one, it fails (with the watch's failure, if one came).
func (k *Kube) Addrs(context.Context) ([]string, error) {
	if a := k.addrs.Load(); a != nil {
		return slices.Clone(*a), nil
	}
	if err := k.last.Load(); err != nil {
		return nil, fmt.Errorf("%w: %w", errNotListed, *err) // which names the source
	}
	return nil, fmt.Errorf("%s: %w", k, errWatchStarting)
}

func (k *Kube) String() string { return cmp.Or(k.Watch.Name, "peers:kubernetes:"+k.Watch.Namespace) }
