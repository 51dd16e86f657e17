package config

import (
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
)

// InferencePoolDiscovery follows one InferencePool of the Gateway API Inference Extension
// (inference.networking.k8s.io/v1): the ready pods its selector picks, one endpoint per pod and
// target port. It is how kvroute, as the pool's endpoint picker (extproc), learns the pool's
// model servers; the HTTP proxy routes among them too.
type InferencePoolDiscovery struct {
	// Name of the InferencePool. Required.
	Name string `json:"name"`
	// Namespace of the pool (and of its pods). Empty: the router's own (read from its service
	// account, or the kubeconfig's context outside a cluster).
	Namespace string `json:"namespace"`
	// Scheme of the endpoints' URLs: http (default) or https.
	Scheme string `json:"scheme"`
	// Kubeconfig is a kubeconfig file, relative to the config file, for a router that runs
	// outside the cluster. Empty: the in-cluster service account.
	Kubeconfig string `json:"kubeconfig"`
	// Endpoint gives every endpoint found the keys of endpoints[] but url (models, engine,
	// labels, kv_tokens, step_tokens, cache_salt, health_path, metrics_path); its defaults are applied per
	// pod.
	Endpoint Endpoint `json:"endpoint"`
	// Grace is how long the endpoints of a pool that vanished from the API (deleted, or
	// briefly missing, as in a delete and create of an upgrade) stay in force, its pods still
	// followed, before they are dropped. Default 5m.
	Grace Duration `json:"grace"`
}

// DefaultInferencePoolGrace is discovery.inference_pool.grace's default.
const DefaultInferencePoolGrace = 5 * time.Minute

func (d *Discovery) setInferencePoolDefaults() {
	ip := d.InferencePool
	if ip == nil {
		return
	}
	ip.Name = strings.TrimSpace(ip.Name)
	ip.Namespace = strings.TrimSpace(ip.Namespace)
	if ip.Scheme == "" {
		ip.Scheme = "http"
	}
	if ip.Grace == 0 {
		ip.Grace = Duration(DefaultInferencePoolGrace)
	}
}

func (d *Discovery) validateInferencePool(p *problems) {
	ip := d.InferencePool
	if ip == nil {
		return
	}
	const at = "discovery.inference_pool"
	if ip.Name == "" {
		p.add(at+".name", "missing: give the InferencePool's name, like llama3-70b")
	}
	for _, msg := range validation.IsDNS1123Subdomain(ip.Name) {
		if ip.Name != "" {
			p.add(at+".name", "%q is not an InferencePool name (%s): give the name only, like llama3-70b", ip.Name, msg)
		}
	}
	if ip.Namespace != "" {
		for _, msg := range validation.IsDNS1123Label(ip.Namespace) {
			p.add(at+".namespace", "%q is not a namespace name (%s): give one like inference, or leave it out for the router's own", ip.Namespace, msg)
		}
	}
	if ip.Grace < 0 {
		p.add(at+".grace", "%s is negative: give how long a vanished pool's endpoints stay, like 1m, or leave it out for %s", ip.Grace.D(), DefaultInferencePoolGrace)
	}
	if ip.Scheme != "http" && ip.Scheme != "https" {
		p.add(at+".scheme", "%q: use http or https", ip.Scheme)
	}
	tmpl := ip.Endpoint
	tmpl.SetDefaults()
	validateTemplate(at+".endpoint", tmpl, p)
}
