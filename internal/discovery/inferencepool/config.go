package inferencepool

import (
	"cmp"
	"fmt"
	"log/slog"

	"k8s.io/client-go/dynamic"
	coreclient "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/discovery/kube"
)

// FromConfig returns the source of c's discovery.inference_pool (nil when there is none), with
// its clients (built from the section's kubeconfig, or the in-cluster service account) and its
// namespace. It fails when there is no cluster to talk to, so that a router misconfigured this
// way does not start; nothing is contacted yet.
func FromConfig(c *config.Config, userAgent string, log *slog.Logger) (*Source, error) {
	ip := c.Discovery.InferencePool
	if ip == nil {
		return nil, nil
	}
	rc, ns, err := kube.RESTConfig(c.Path(ip.Kubeconfig), userAgent)
	if err != nil {
		return nil, fmt.Errorf("discovery.inference_pool: %w", err)
	}
	pools, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("discovery.inference_pool: kubernetes client: %w", err)
	}
	core, err := coreclient.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("discovery.inference_pool: kubernetes client: %w", err)
	}
	return &Source{
		Namespace: cmp.Or(ip.Namespace, ns), Name: ip.Name,
		Pools: pools, Pods: corev1Client{core},
		Scheme: ip.Scheme, Endpoint: ip.Endpoint, Grace: ip.Grace.D(), Log: log,
	}, nil
}

// corev1Client is what Source.Pods asks of a clientset, from the typed client alone.
type corev1Client struct{ c coreclient.CoreV1Interface }

func (c corev1Client) CoreV1() coreclient.CoreV1Interface { return c.c }
