package config

import (
	"fmt"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
)

// KubernetesDiscovery is one watch of EndpointSlices through the Kubernetes API: the ready
// endpoints of one Service (or of every Service a label selector picks) in one namespace.
type KubernetesDiscovery struct {
	// Namespace to watch. Empty: the router's own (read from its service account, or the
	// kubeconfig's context outside a cluster).
	Namespace string `json:"namespace"`
	// Service is the name of the Service whose EndpointSlices are watched. Give service or
	// selector, not both.
	Service string `json:"service"`
	// Selector is a label selector on EndpointSlices, like app.kubernetes.io/name=vllm.
	// Kubernetes copies a Service's labels onto its slices, so this picks Services by label.
	Selector string `json:"selector"`
	// PortName is the name of the slices' port (the Service port's name) the engines listen
	// on. Empty with port 0: the slices' only port.
	PortName string `json:"port_name"`
	// Port is a port number to use instead of a named one (0: by name).
	Port int `json:"port"`
	// Scheme of the endpoints' URLs: http (default) or https.
	Scheme string `json:"scheme"`
	// PodMetadata reads each pod's labels and annotations (kvroute.io/engine, kvroute.io/models,
	// kvroute.io/kv-events) over the endpoint template; it needs list and watch on pods.
	PodMetadata bool `json:"pod_metadata"`
	// Kubeconfig is a kubeconfig file, relative to the config file, for a router that runs
	// outside the cluster. Empty: the in-cluster service account.
	Kubeconfig string `json:"kubeconfig"`
	// MaxEndpoints refuses a set of more endpoints than this (the set in force stays, and the
	// refusal is logged once). Default DefaultMaxEndpoints.
	MaxEndpoints int `json:"max_endpoints"`
	// Endpoint gives every endpoint found the keys of endpoints[] but url (models, engine,
	// labels, kv_tokens, step_tokens, cache_salt, health_path, metrics_path). Its defaults are applied per
	// pod, after the pod's own labels and annotations, so cache_salt follows the pod's engine.
	Endpoint Endpoint `json:"endpoint"`
}

// Key names the watch in logs and metrics: namespace (when set) and service or selector.
func (k *KubernetesDiscovery) Key() string { return watchKey(k.Namespace, k.Service, k.Selector) }

// watchKey names a watch: namespace/ (when set) and the service, else the selector.
func watchKey(namespace, service, selector string) string {
	what := service
	if what == "" {
		what = selector
	}
	if namespace != "" {
		what = namespace + "/" + what
	}
	return what
}

func (d *Discovery) setKubernetesDefaults() {
	for i := range d.Kubernetes {
		k := &d.Kubernetes[i]
		k.Namespace = strings.TrimSpace(k.Namespace)
		k.Service = strings.TrimSpace(k.Service)
		k.Selector = strings.TrimSpace(k.Selector)
		if k.Scheme == "" {
			k.Scheme = "http"
		}
		if k.MaxEndpoints == 0 {
			k.MaxEndpoints = DefaultMaxEndpoints
		}
		// The template keeps its unset fields: they are filled per pod (see Endpoint).
	}
}

func (d *Discovery) validateKubernetes(p *problems) {
	seen := map[string]int{}
	for i, k := range d.Kubernetes {
		at := fmt.Sprintf("discovery.kubernetes[%d]", i)
		validateWatch(at, watchFields{k.Namespace, k.Service, k.Selector, k.PortName, k.Port}, engineExamples, p)
		if k.Scheme != "http" && k.Scheme != "https" {
			p.add(at+".scheme", "%q: use http or https", k.Scheme)
		}
		if k.MaxEndpoints < 1 {
			p.add(at+".max_endpoints", "%d: give the most endpoints the watch may give, like %d", k.MaxEndpoints, DefaultMaxEndpoints)
		}
		key := k.Namespace + "\x00" + k.Service + "\x00" + k.Selector + "\x00" + k.PortName + "\x00" + strconv.Itoa(k.Port)
		if j, dup := seen[key]; dup {
			p.add(at, "watches the same slices and port as discovery.kubernetes[%d]: remove one", j)
		} else {
			seen[key] = i
		}
		tmpl := k.Endpoint
		tmpl.SetDefaults()
		validateTemplate(at+".endpoint", tmpl, p)
	}
}

// watchFields are what a watch of EndpointSlices selects, as discovery.kubernetes[] and
// peers.kubernetes name them.
type watchFields struct {
	namespace, service, selector, portName string
	port                                   int
}

// watchExamples are the examples a section's messages give.
type watchExamples struct{ service, selector, port string }

var engineExamples = watchExamples{service: "vllm", selector: "app.kubernetes.io/name=vllm", port: "the engines' port, like 8000"}

// validateWatch checks the fields of a watch at path at: the namespace, service or selector
// (one of the two), and port_name or port (at most one).
func validateWatch(at string, k watchFields, ex watchExamples, p *problems) {
	if k.namespace != "" {
		for _, msg := range validation.IsDNS1123Label(k.namespace) {
			p.add(at+".namespace", "%q is not a namespace name (%s): give one like inference, or leave it out for the router's own", k.namespace, msg)
		}
	}
	switch {
	case k.service == "" && k.selector == "":
		p.add(at, "give service (a Service name, like %s) or selector (a label selector, like %s)", ex.service, ex.selector)
	case k.service != "" && k.selector != "":
		p.add(at, "give service or selector, not both: a Service's slices are already selected by its name")
	case k.service != "":
		for _, msg := range validation.IsDNS1035Label(k.service) {
			p.add(at+".service", "%q is not a Service name (%s): give the name only, like %s", k.service, msg, ex.service)
		}
	default:
		if _, err := labels.Parse(k.selector); err != nil {
			p.add(at+".selector", "%q does not parse (%v): write it as kubectl does, like %s,tier!=canary", k.selector, err, ex.selector)
		}
	}
	if k.portName != "" && k.port != 0 {
		p.add(at+".port", "give port_name or port, not both")
	}
	if k.portName != "" {
		for _, msg := range validation.IsValidPortName(k.portName) {
			p.add(at+".port_name", "%q is not a port name (%s): give the Service port's name, like http", k.portName, msg)
		}
	}
	if k.port < 0 || k.port > 65535 {
		p.add(at+".port", "%d is not a port: give %s, or use port_name", k.port, ex.port)
	}
}

// validateTemplate checks an endpoint template of a discovery source: the keys of endpoints[]
// without url, which each endpoint found gets from its address.
func validateTemplate(at string, tmpl Endpoint, p *problems) {
	if tmpl.URL != "" {
		p.add(at+".url", "remove it: each endpoint's URL is made from an address found")
	}
	tmpl.URL = "http://192.0.2.1:8000" // a stand-in, so that only the template's own keys are judged
	var tp problems
	validateEndpoints([]Endpoint{tmpl}, at, &tp)
	for _, e := range tp.errs {
		pe := *e.(*Problem)
		pe.Key = strings.Replace(pe.Key, at+"[0]", at, 1)
		p.errs = append(p.errs, &pe)
	}
}
