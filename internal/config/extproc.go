package config

import "net"

// ExtProc serves kvroute as the endpoint picker of an Envoy-based gateway: the Gateway API
// Inference Extension's protocol over Envoy's ext_proc gRPC service (docs/kubernetes.md), beside
// the HTTP API and on the same endpoints, policy and tenants.
type ExtProc struct {
	// Listen is the ext_proc gRPC address (host:port), like :9002. Empty (the default): the
	// picker is not served.
	Listen string `json:"listen"`
	// HealthListen serves the gRPC health service alone (liveness, readiness and the ext_proc
	// service's name), like :9003, for Kubernetes probes and the gateway. Empty: health is
	// served on Listen only.
	HealthListen string `json:"health_listen"`
	// MaxEndpoints bounds the endpoint list given to the gateway (the first choice, then the
	// fallbacks it may retry on). 0 (the default): 1 + limits.max_retries. 1 for a data plane
	// that takes one address, such as Envoy's ORIGINAL_DST cluster reading the header.
	MaxEndpoints int `json:"max_endpoints"`
	// TLS serves the picker (not health: Kubernetes' gRPC probes speak plain gRPC) over TLS,
	// as the Inference Extension's own picker does by default: gateways connect to it with
	// TLS and do not verify its certificate.
	TLS ExtProcTLS `json:"tls"`
}

// ExtProcTLS is the picker's certificate: PEM files (relative to the config file's directory,
// read again when they change), or one made at start (SelfSigned).
type ExtProcTLS struct {
	CertFile   string `json:"cert_file"`
	KeyFile    string `json:"key_file"`
	SelfSigned bool   `json:"self_signed"`
}

// Enabled reports whether the picker is served over TLS.
func (t ExtProcTLS) Enabled() bool { return t.SelfSigned || t.CertFile != "" || t.KeyFile != "" }

// Enabled reports whether the picker is served.
func (e ExtProc) Enabled() bool { return e.Listen != "" }

func (e *ExtProc) setDefaults(*Config) {}

func (e *ExtProc) validate(c *Config, p *problems) {
	if e.Listen == "" {
		if e.HealthListen != "" {
			p.add("extproc.health_listen", "set without extproc.listen: give the ext_proc address too, like :9002, or remove it")
		}
		return
	}
	checkAddr(p, "extproc.listen", e.Listen)
	if e.MaxEndpoints < 0 {
		p.add("extproc.max_endpoints", "%d is negative: give how many endpoints the gateway may be told, like 1, or 0 for 1 + limits.max_retries", e.MaxEndpoints)
	}
	switch t := e.TLS; {
	case t.SelfSigned && (t.CertFile != "" || t.KeyFile != ""):
		p.add("extproc.tls", "self_signed and certificate files both set: keep one")
	case !t.SelfSigned && t.CertFile == "" && t.KeyFile != "":
		p.add("extproc.tls.cert_file", "missing: give the certificate's PEM file beside key_file")
	case !t.SelfSigned && t.KeyFile == "" && t.CertFile != "":
		p.add("extproc.tls.key_file", "missing: give the private key's PEM file beside cert_file")
	}
	if e.HealthListen != "" {
		checkAddr(p, "extproc.health_listen", e.HealthListen)
	}
	// Port 0 anywhere is a free port of its own, not a clash.
	taken := map[string]string{c.Listen: "listen", c.AdminListen: "admin_listen"}
	for _, a := range []struct{ path, addr string }{{"extproc.listen", e.Listen}, {"extproc.health_listen", e.HealthListen}} {
		if _, port, err := net.SplitHostPort(a.addr); a.addr == "" || err != nil || port == "0" {
			continue
		}
		if other, ok := taken[a.addr]; ok {
			p.add(a.path, "%q is also %s: give it a port of its own (usually :9002 for ext_proc, :9003 for health)", a.addr, other)
			continue
		}
		taken[a.addr] = a.path
	}
}
