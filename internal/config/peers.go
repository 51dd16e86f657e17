package config

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/netip"
	"os"
	"regexp"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
)

// Peers makes this router one of several replicas that share what they learn: each one's
// routing decisions, requests in flight and corrections reach the others within milliseconds,
// and a replica that starts takes a running one's index before it reports ready. Absent: a
// lone router. Every replica lists the same secret; any one peer address alive is enough to
// join the group.
type Peers struct {
	// Listen is the address of the event stream server (HTTP) other replicas connect to,
	// host:port. Required.
	Listen string `json:"listen"`
	// GossipListen is the membership address (TCP and UDP), host:port. Default: listen's
	// host, port DefaultGossipPort.
	GossipListen string `json:"gossip_listen"`
	// Advertise is the host or IP the other replicas reach this one at. Default: the gossip
	// address, or this host's private address when that is 0.0.0.0.
	Advertise string `json:"advertise"`
	// AdvertiseEnv names an environment variable holding advertise's value instead, one per
	// replica under a config they share (on Kubernetes, the pod IP from the downward API:
	// valueFrom.fieldRef.fieldPath status.podIP). Read when the config is loaded and when the
	// replica starts (PeerAdvertise).
	AdvertiseEnv string `json:"advertise_env"`
	// Name is this replica's name among its peers, unique. Default: the host name and the
	// gossip port.
	Name string `json:"name"`
	// Static lists other replicas' gossip addresses, host:port (this replica's own may be
	// listed: the same list fits every replica).
	Static []string `json:"static"`
	// DNS finds the replicas behind a name (a headless Service, a scaled Compose service):
	// one per address, at port.
	DNS *PeersDNS `json:"dns"`
	// Kubernetes finds the replicas in their Service's EndpointSlices through the Kubernetes
	// API. Static, dns and kubernetes may be combined: the addresses of all of them are joined.
	Kubernetes *PeersKubernetes `json:"kubernetes"`
	// SecretFile holds the shared secret (at least 32 bytes, the same on every replica):
	// messages are signed and gossip encrypted with keys derived from it.
	SecretFile string `json:"secret_file"`
	// SecretEnv names an environment variable holding the secret instead.
	SecretEnv string `json:"secret_env"`
	// AcceptSecretFile holds a second secret accepted from peers but never used to send: a
	// rotation's other secret (docs/replicas.md, "Rotating the secret"). Optional.
	AcceptSecretFile string `json:"accept_secret_file"`
	// AcceptSecretEnv names an environment variable holding it instead.
	AcceptSecretEnv string `json:"accept_secret_env"`
	// TLS, when set, carries the event streams and snapshots over TLS with mutual
	// verification; messages are signed with the secret all the same.
	TLS *PeersTLS `json:"tls"`
	// BatchInterval is how long events wait to be sent together: shorter is fresher, longer
	// costs less CPU (docs/replicas.md). Default 10ms.
	BatchInterval Duration `json:"batch_interval"`
	// WarmStartTimeout bounds the wait for a peer's snapshot at start: /readyz says ready
	// then, with or without one. Default 10s.
	WarmStartTimeout Duration `json:"warm_start_timeout"`
	// SnapshotMaxBytes bounds a snapshot (the newest index entries are kept). Default 64 MiB.
	SnapshotMaxBytes int64 `json:"snapshot_max_bytes"`
	// MaxMessageBytes bounds one message either way; larger ones are refused. Default 4 MiB.
	MaxMessageBytes int `json:"max_message_bytes"`
	// Queue is the batches queued for one peer; a peer further behind loses its stream and
	// catches up on what is in flight when it reconnects. Default 1024.
	Queue int `json:"queue"`
	// RequestTTL is how long another replica's request counts here without its end arriving.
	// Default 5m.
	RequestTTL Duration `json:"request_ttl"`
	// MaxRemoteRequests bounds the other replicas' requests counted here. Default 100000.
	MaxRemoteRequests int `json:"max_remote_requests"`
	// RejoinInterval is how often the static list, DNS name and EndpointSlices are tried again for replicas
	// not known alive (this heals a partition). Default 10s.
	RejoinInterval Duration `json:"rejoin_interval"`
	// FaultInjection serves POST /debug/peers/isolate on the admin listener, which cuts this
	// replica off from its peers and back. For tests only.
	FaultInjection bool `json:"fault_injection"`
	// TenantLimits says whose tenants[].limits are: TenantLimitsFleet (the default), the
	// whole fleet's, each replica enforcing an equal share of them among the replicas alive
	// (limit / replicas, rounded up, at least 1; recomputed as replicas come and go), so that
	// behind a balancer spreading a tenant evenly the fleet admits about its limits;
	// TenantLimitsReplica, each replica's, every one enforcing the whole limits (a tenant
	// spread over n replicas gets up to n times them).
	TenantLimits string `json:"tenant_limits"`
}

// Values of peers.tenant_limits.
const (
	TenantLimitsFleet   = "fleet"
	TenantLimitsReplica = "replica"
)

// PeersDNS is a name whose addresses are replicas.
type PeersDNS struct {
	// Name is the host name, like kvroute-peers.inference.svc.cluster.local.
	Name string `json:"name"`
	// Port is the replicas' gossip port. Default: gossip_listen's.
	Port int `json:"port"`
}

// PeersKubernetes is a watch of the replicas' EndpointSlices, with discovery.kubernetes[]'s
// fields for what to watch: the ready addresses of a Service (or of the Services a label
// selector picks) in one namespace, at the gossip port.
type PeersKubernetes struct {
	// Namespace to watch. Empty: the router's own (its service account's, or the kubeconfig
	// context's outside a cluster).
	Namespace string `json:"namespace"`
	// Service is the name of the replicas' Service, like kvroute-peers. Give service or
	// selector, not both.
	Service string `json:"service"`
	// Selector is a label selector on EndpointSlices (Kubernetes copies a Service's labels onto
	// its slices), like app.kubernetes.io/name=kvroute.
	Selector string `json:"selector"`
	// PortName is the name of the slices' port the replicas gossip on (the Service port's name).
	PortName string `json:"port_name"`
	// Port is the gossip port number instead of a named one. Neither: gossip_listen's port.
	Port int `json:"port"`
	// Kubeconfig is a kubeconfig file, relative to the config file, for a router outside the
	// cluster. Empty: the in-cluster service account.
	Kubeconfig string `json:"kubeconfig"`
}

// Key names the watch in logs: namespace (when set) and service or selector.
func (k *PeersKubernetes) Key() string { return watchKey(k.Namespace, k.Service, k.Selector) }

var peerExamples = watchExamples{service: "kvroute-peers", selector: "app.kubernetes.io/name=kvroute", port: fmt.Sprintf("the replicas' gossip port, like %d", DefaultGossipPort)}

// PeersTLS is the replicas' TLS: each one's certificate, and the CA that signed every
// replica's. PEM files, relative to the config file's directory. The server asks every replica
// that connects for its certificate and verifies it against CAFile; the client verifies the
// server's against CAFile and ServerName. Use a CA that signs the replicas' certificates only:
// any certificate it signed is a replica.
type PeersTLS struct {
	// CertFile is this replica's certificate (chain), for both ends of a connection: it must
	// allow server and client authentication (extended key usages serverAuth and clientAuth).
	CertFile string `json:"cert_file"`
	// KeyFile is its private key.
	KeyFile string `json:"key_file"`
	// CAFile holds the certificates of the CA (or CAs) that signed the replicas' certificates.
	CAFile string `json:"ca_file"`
	// ServerName is the name a replica's certificate must carry (a DNS name in its subject
	// alternative names), like kvroute-peers. Empty: the address dialled, so each certificate
	// must list its replica's IP address.
	ServerName string `json:"server_name"`
}

// Defaults of the peers section.
const (
	DefaultGossipPort        = 7946
	DefaultPeerBatchInterval = 10 * time.Millisecond
)

// peersSection is the peers section, absent or not.
type peersSection struct{ c *Config }

func (s peersSection) setDefaults(*Config) {
	p := s.c.Peers
	if p == nil {
		return
	}
	if p.GossipListen == "" {
		if host, _, err := net.SplitHostPort(p.Listen); err == nil {
			p.GossipListen = net.JoinHostPort(host, fmt.Sprint(DefaultGossipPort))
		}
	}
	if p.DNS != nil && p.DNS.Port == 0 {
		if _, port, err := net.SplitHostPort(p.GossipListen); err == nil {
			fmt.Sscan(port, &p.DNS.Port)
		}
	}
	if k := p.Kubernetes; k != nil {
		k.Namespace = strings.TrimSpace(k.Namespace)
		k.Service = strings.TrimSpace(k.Service)
		k.Selector = strings.TrimSpace(k.Selector)
		if k.PortName == "" && k.Port == 0 {
			if _, port, err := net.SplitHostPort(p.GossipListen); err == nil {
				fmt.Sscan(port, &k.Port)
			}
		}
	}
	setDuration(&p.BatchInterval, DefaultPeerBatchInterval)
	setDuration(&p.WarmStartTimeout, 10*time.Second)
	setDuration(&p.RequestTTL, 5*time.Minute)
	setDuration(&p.RejoinInterval, 10*time.Second)
	if p.SnapshotMaxBytes == 0 {
		p.SnapshotMaxBytes = 64 << 20
	}
	if p.MaxMessageBytes == 0 {
		p.MaxMessageBytes = 4 << 20
	}
	if p.Queue == 0 {
		p.Queue = 1024
	}
	if p.MaxRemoteRequests == 0 {
		p.MaxRemoteRequests = 100_000
	}
	if p.TenantLimits == "" {
		p.TenantLimits = TenantLimitsFleet
	}
	if len(p.Static) == 0 && p.DNS == nil && p.Kubernetes == nil {
		s.c.Warnings = append(s.c.Warnings, "peers: no static list, dns name or kubernetes watch: this replica only joins the replicas that list it")
	}
}

func setDuration(d *Duration, def time.Duration) {
	if *d == 0 {
		*d = Duration(def)
	}
}

func (s peersSection) validate(_ *Config, pr *problems) {
	p := s.c.Peers
	if p == nil {
		return
	}
	if p.Listen == "" {
		pr.add("peers.listen", "missing: give the address the other replicas stream events from, like :7947")
	} else {
		checkAddr(pr, "peers.listen", p.Listen)
	}
	checkAddr(pr, "peers.gossip_listen", p.GossipListen)
	// Each listener needs a port of its own: the one that binds second fails, and its error
	// blames it, not the listener that took its port. The checks of listen, admin_listen and
	// extproc name the clashes among those; port 0 anywhere is a free port, not a clash.
	taken := map[string]string{}
	for _, a := range []struct{ path, addr string }{
		{"listen", s.c.Listen}, {"admin_listen", s.c.AdminListen},
		{"extproc.listen", s.c.ExtProc.Listen}, {"extproc.health_listen", s.c.ExtProc.HealthListen},
		{"peers.listen", p.Listen}, {"peers.gossip_listen", p.GossipListen},
	} {
		if _, port, err := net.SplitHostPort(a.addr); err != nil || port == "0" {
			continue
		}
		other, ok := taken[a.addr]
		switch {
		case !ok:
			taken[a.addr] = a.path
		case strings.HasPrefix(a.path, "peers."):
			pr.add(a.path, "%q is also %s: give each its own port", a.addr, other)
		}
	}
	if host, _, err := net.SplitHostPort(p.GossipListen); err == nil {
		if ip, err := netip.ParseAddr(host); err == nil {
			if err := AdvertisableIP(ip); err != nil {
				pr.add("peers.gossip_listen", "%q: %v; or bind every address, like :%d, and set peers.advertise", p.GossipListen, err, DefaultGossipPort)
			}
		}
		if p.Advertise == "" && p.AdvertiseEnv == "" && AdvertisesUnspecified(host) {
			pr.add("peers.advertise", "missing, with peers.gossip_listen %q: the gossip would advertise the unspecified address (::), which each peer dials as its own host; give this replica's address or host name, or bind gossip_listen to one (or to 0.0.0.0:%d, for which this host's private IPv4 address is advertised)", p.GossipListen, DefaultGossipPort)
		}
	}
	if p.Advertise != "" {
		if err := checkAdvertise(p.Advertise, p.GossipListen); err != nil {
			pr.add("peers.advertise", "%q: %v", p.Advertise, err)
		}
	}
	switch {
	case p.AdvertiseEnv == "":
	case p.Advertise != "":
		pr.add("peers", "both advertise and advertise_env are set: keep one")
	case !envName.MatchString(p.AdvertiseEnv):
		pr.add("peers.advertise_env", "%q is not a variable's name: give the name alone, like POD_IP (the router reads the variable; the config expands none)", p.AdvertiseEnv)
	}
	for i, a := range p.Static {
		if _, port, err := net.SplitHostPort(a); err != nil || port == "" {
			pr.add(fmt.Sprintf("peers.static[%d]", i), "%q is not host:port: give a replica's gossip address, like 10.0.0.2:%d", a, DefaultGossipPort)
		}
	}
	if d := p.DNS; d != nil {
		if d.Name == "" || strings.ContainsAny(d.Name, ":/ ") {
			pr.add("peers.dns.name", "%q is not a host name: give the name only, like kvroute-peers.inference.svc.cluster.local", d.Name)
		}
		if d.Port < 1 || d.Port > 65535 {
			pr.add("peers.dns.port", "%d is not a port: give the replicas' gossip port, like %d", d.Port, DefaultGossipPort)
		}
	}
	if t := p.TLS; t != nil {
		validatePeersTLS(s.c, t, pr)
	}
	if k := p.Kubernetes; k != nil {
		validateWatch("peers.kubernetes", watchFields{k.Namespace, k.Service, k.Selector, k.PortName, k.Port}, peerExamples, pr)
	}
	switch {
	case p.SecretFile == "" && p.SecretEnv == "":
		pr.add("peers", "no shared secret: set secret_file (a file of at least %d random bytes, the same on every replica) or secret_env", MinSecretBytes)
	case p.SecretFile != "" && p.SecretEnv != "":
		pr.add("peers", "both secret_file and secret_env are set: keep one")
	}
	if p.AcceptSecretFile != "" && p.AcceptSecretEnv != "" {
		pr.add("peers", "both accept_secret_file and accept_secret_env are set: keep one")
	}
	if b := p.BatchInterval.D(); b < 100*time.Microsecond || b > time.Second {
		pr.add("peers.batch_interval", "%v: want from 100µs to 1s, like 10ms", b)
	}
	for _, c := range []struct {
		path string
		d    Duration
		min  time.Duration
	}{
		{"peers.warm_start_timeout", p.WarmStartTimeout, 0},
		{"peers.request_ttl", p.RequestTTL, time.Second},
		{"peers.rejoin_interval", p.RejoinInterval, 100 * time.Millisecond},
	} {
		if c.d.D() < c.min || c.d < 0 {
			pr.add(c.path, "%v is too short: at least %v", c.d.D(), c.min)
		}
	}
	if p.SnapshotMaxBytes < 1<<20 {
		pr.add("peers.snapshot_max_bytes", "%d: at least 1 MiB (%d)", p.SnapshotMaxBytes, 1<<20)
	}
	if p.MaxMessageBytes < 64<<10 || p.MaxMessageBytes > 1<<30 {
		pr.add("peers.max_message_bytes", "%d: from 64 KiB to 1 GiB", p.MaxMessageBytes)
	}
	if p.Queue < 1 {
		pr.add("peers.queue", "%d: at least 1 batch", p.Queue)
	}
	if p.MaxRemoteRequests < 1 {
		pr.add("peers.max_remote_requests", "%d: at least 1", p.MaxRemoteRequests)
	}
	if p.TenantLimits != TenantLimitsFleet && p.TenantLimits != TenantLimitsReplica {
		pr.add("peers.tenant_limits", "%q: want %s (each replica enforces an equal share of every tenant's limits among the replicas alive) or %s (each enforces the whole limits)",
			p.TenantLimits, TenantLimitsFleet, TenantLimitsReplica)
	}
}

// envName is what advertise_env may name: a portable environment variable name.
var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// checkAdvertise says why host (peers.advertise, or advertise_env's value) cannot be advertised
// with the gossip listener at gossip (peers.gossip_listen, defaulted); nil when it can, as far
// as the config tells: a host name is resolved, and its addresses checked, at start
// (internal/peer). The unspecified address (0.0.0.0, ::) is refused: memberlist would
// advertise it as it is. A loopback address is refused unless the listener is on loopback
// too, as a name resolving to loopback is at start: no peer on another host can reach it.
func checkAdvertise(host, gossip string) error {
	ip, err := netip.ParseAddr(host)
	if err != nil {
		if strings.ContainsAny(host, ":/ %") {
			return fmt.Errorf("give a host name or an IP address, without a port")
		}
		return nil
	}
	if err := AdvertisableIP(ip); err != nil {
		return err
	}
	if ip.IsUnspecified() {
		return fmt.Errorf("the unspecified address, which each peer dials as its own host: give this replica's own address or host name")
	}
	if ip.Unmap().IsLoopback() {
		bindHost, _, _ := net.SplitHostPort(gossip)
		if bind, err := netip.ParseAddr(bindHost); err != nil || !bind.Unmap().IsLoopback() {
			return fmt.Errorf("loopback, which no peer on another host can reach (the gossip listens on %q): give this replica's own address (on Kubernetes, its pod IP: peers.advertise_env, set from status.podIP), or bind peers.gossip_listen to loopback too for replicas of this host alone", gossip)
		}
	}
	return nil
}

// AdvertisableIP says why the other replicas cannot be given ip to reach this one at (in
// peers.advertise, or as the address peers.gossip_listen binds); nil when they can. memberlist
// carries a member's address as bare bytes, without an IPv6 zone (net.IP has none), and a zone
// names an interface of the host that dials anyway: this host's would mean nothing to a peer.
// A link-local IPv6 address (fe80::/10) cannot be dialled without one (connect: invalid
// argument). An IPv4 link-local address (169.254.0.0/16) needs no zone and is let through.
func AdvertisableIP(ip netip.Addr) error {
	ip = ip.Unmap()
	switch {
	case ip.Is6() && ip.IsLinkLocalUnicast():
		return fmt.Errorf("a link-local IPv6 address: the other replicas could dial it only with a zone naming their own interface, which the gossip cannot carry; give this replica's global or unique local (fd00::/8) IPv6 address, its IPv4 address, or a host name that resolves to one")
	case ip.Zone() != "":
		return fmt.Errorf("an IPv6 zone (%%%s) names an interface of this host, which the gossip cannot carry: give the address without it, %s", ip.Zone(), ip.WithZone(""))
	}
	return nil
}

// AdvertisesUnspecified says whether memberlist, its gossip listener bound to host (the host of
// peers.gossip_listen) and no peers.advertise given, advertises the unspecified address "::":
// for "::" (memberlist finds this host's private address for 0.0.0.0 alone, and "" is bound
// as 0.0.0.0) and for a host name (bound as every address, not as the name's).
func AdvertisesUnspecified(host string) bool {
	if host == "" {
		return false
	}
	ip, err := netip.ParseAddr(host)
	return err != nil || ip.IsUnspecified() && !ip.Unmap().Is4()
}

// PeerAdvertise returns the host or IP this replica advertises to its peers: peers.advertise,
// or the value of the variable peers.advertise_env (via getenv, os.Getenv when nil, its
// surrounding white space trimmed), checked as advertise is at load; "" for neither
// (memberlist's pick). The variable unset or empty is an error naming it and the fix.
func (c *Config) PeerAdvertise(getenv func(string) string) (string, error) {
	p := c.Peers
	switch {
	case p == nil:
		return "", nil
	case p.AdvertiseEnv == "":
		return p.Advertise, nil
	}
	if getenv == nil {
		getenv = os.Getenv
	}
	v := strings.TrimSpace(getenv(p.AdvertiseEnv))
	if v == "" {
		return "", fmt.Errorf("peers.advertise_env %s: the variable is not set, or empty: set it to this replica's own address or host name (on Kubernetes, its pod IP: env: [{name: %s, valueFrom: {fieldRef: {fieldPath: status.podIP}}}]), or give peers.advertise instead", p.AdvertiseEnv, p.AdvertiseEnv)
	}
	if err := checkAdvertise(v, p.GossipListen); err != nil {
		return "", fmt.Errorf("peers.advertise_env %s=%q: %w", p.AdvertiseEnv, v, err)
	}
	return v, nil
}

// PeerSecret reads the replicas' shared secret from peers.secret_file or the variable
// peers.secret_env (via getenv, os.Getenv when nil), as Secret reads auth's.
func (c *Config) PeerSecret(getenv func(string) string) ([]byte, error) {
	if c.Peers == nil {
		return nil, fmt.Errorf("peers: not configured")
	}
	return readSecret(c, "peers", c.Peers.SecretFile, c.Peers.SecretEnv, getenv)
}

// PeerAcceptSecret reads the secret accepted besides (peers.accept_secret_file or
// accept_secret_env); nil when neither is set.
func (c *Config) PeerAcceptSecret(getenv func(string) string) ([]byte, error) {
	if c.Peers == nil || c.Peers.AcceptSecretFile == "" && c.Peers.AcceptSecretEnv == "" {
		return nil, nil
	}
	return readSecret(c, "peers.accept_", c.Peers.AcceptSecretFile, c.Peers.AcceptSecretEnv, getenv)
}

// readSecret reads a secret from file (relative to the config's directory) or the variable
// env, for the section named at ("auth", "peers", or "peers.accept_" for the keys
// accept_secret_file and accept_secret_env); surrounding white space is trimmed, and it must
// be at least MinSecretBytes long.
func readSecret(c *Config, at, file, env string, getenv func(string) string) ([]byte, error) {
	sep := "."
	if strings.HasSuffix(at, "_") {
		sep = ""
	}
	if file == "" && env == "" {
		return nil, fmt.Errorf("%s%ssecret_file or secret_env: neither is configured", at, sep)
	}
	var s []byte
	var from string
	if file != "" {
		from = at + sep + "secret_file " + c.Path(file)
		b, err := os.ReadFile(c.Path(file))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", from, err)
		}
		s = b
	} else {
		if getenv == nil {
			getenv = os.Getenv
		}
		from = at + sep + "secret_env " + env
		s = []byte(getenv(env))
	}
	s = []byte(strings.TrimSpace(string(s)))
	if len(s) == 0 && file == "" {
		return nil, fmt.Errorf("%s: the variable is not set, or empty: set it to a secret of at least %d bytes (for example: export %s=$(head -c 32 /dev/urandom | base64))", from, MinSecretBytes, env)
	}
	if len(s) < MinSecretBytes {
		return nil, fmt.Errorf("%s: the secret is %d bytes, want at least %d (for example: head -c 32 /dev/urandom | base64)", from, len(s), MinSecretBytes)
	}
	return s, nil
}

// secretsSection reads the secrets, the picker's certificate and key, and the variable
// peers.advertise_env names, when Checks.ReadSecrets asks it to (see there): what only the
// machine the router runs on holds. It only judges: the router reads them again when it starts
// or reloads.
type secretsSection struct {
	c    *Config
	read bool
}

func (s secretsSection) setDefaults(*Config) {}

func (s secretsSection) validate(c *Config, p *problems) {
	if !s.read {
		return
	}
	type source struct{ at, file, env string }
	var sources []source
	// Only a source set one way: none, or both, is reported by the section.
	one := func(file, env string) bool { return (file == "") != (env == "") }
	if c.AuthMode() == AuthAPIKey && one(c.Auth.SecretFile, c.Auth.SecretEnv) {
		sources = append(sources, source{"auth.", c.Auth.SecretFile, c.Auth.SecretEnv})
	}
	if pe := c.Peers; pe != nil {
		if one(pe.SecretFile, pe.SecretEnv) {
			sources = append(sources, source{"peers.", pe.SecretFile, pe.SecretEnv})
		}
		if one(pe.AcceptSecretFile, pe.AcceptSecretEnv) {
			sources = append(sources, source{"peers.accept_", pe.AcceptSecretFile, pe.AcceptSecretEnv})
		}
	}
	// server.tls and peers.tls are loaded by their sections, whoever asks.
	if t := c.ExtProc.TLS; c.ExtProc.Enabled() && !t.SelfSigned && t.CertFile != "" && t.KeyFile != "" {
		if _, err := tls.LoadX509KeyPair(c.Path(t.CertFile), c.Path(t.KeyFile)); err != nil {
			p.add("extproc.tls", "cannot load the certificate and key: %v", err)
		}
	}
	for _, src := range sources {
		if _, err := readSecret(c, strings.TrimSuffix(src.at, "."), src.file, src.env, nil); err != nil {
			key := src.at + "secret_file"
			if src.file == "" {
				key = src.at + "secret_env"
			}
			// readSecret names the key and its file or variable; the key goes first here.
			p.add(key, "%s", strings.TrimPrefix(err.Error(), key+" "))
		}
	}
	// Set with advertise, or not a name, it is reported by the section.
	if pe := c.Peers; pe != nil && pe.AdvertiseEnv != "" && pe.Advertise == "" && envName.MatchString(pe.AdvertiseEnv) {
		if _, err := c.PeerAdvertise(nil); err != nil {
			p.add("peers.advertise_env", "%s", strings.TrimPrefix(err.Error(), "peers.advertise_env "))
		}
	}
}

// validatePeersTLS checks peers.tls: all three files, loadable; a server name that is a name.
func validatePeersTLS(c *Config, t *PeersTLS, pr *problems) {
	missing := false
	for _, f := range []struct{ key, v, what string }{
		{"cert_file", t.CertFile, "this replica's certificate (PEM)"},
		{"key_file", t.KeyFile, "its private key (PEM)"},
		{"ca_file", t.CAFile, "the CA certificate that signed every replica's (PEM)"},
	} {
		if f.v == "" {
			pr.add("peers.tls."+f.key, "missing: give %s; peers.tls needs cert_file, key_file and ca_file (or remove the section)", f.what)
			missing = true
		}
	}
	if t.ServerName != "" {
		for _, msg := range validation.IsDNS1123Subdomain(t.ServerName) {
			pr.add("peers.tls.server_name", "%q is not a DNS name (%s): give the name the replicas' certificates carry, like kvroute-peers", t.ServerName, msg)
		}
	}
	if missing {
		return
	}
	if _, err := tls.LoadX509KeyPair(c.Path(t.CertFile), c.Path(t.KeyFile)); err != nil {
		pr.add("peers.tls", "cannot load the certificate and key: %v", err)
	}
	if _, err := CertPool(c.Path(t.CAFile)); err != nil {
		pr.add("peers.tls.ca_file", "%v", err)
	}
}

// CertPool reads the PEM certificates of file into a pool; a file without one is an error.
func CertPool(file string) (*x509.CertPool, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%s: no PEM certificate in it: give the CA's certificate, -----BEGIN CERTIFICATE-----", file)
	}
	return pool, nil
}
