package config

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

const peersBase = "endpoints: [{url: http://127.0.0.1:8000, engine: vllm}]\nauth: {mode: none}\n"

func TestPeersDefaults(t *testing.T) {
	c, err := Parse([]byte(peersBase + "peers: {listen: '10.0.0.1:7947', dns: {name: kvroute-peers}, secret_env: KVROUTE_PEERS}\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := &Peers{
		Listen: "10.0.0.1:7947", GossipListen: "10.0.0.1:7946", DNS: &PeersDNS{Name: "kvroute-peers", Port: 7946},
		SecretEnv: "KVROUTE_PEERS", BatchInterval: Duration(10 * time.Millisecond), WarmStartTimeout: Duration(10 * time.Second),
		SnapshotMaxBytes: 64 << 20, MaxMessageBytes: 4 << 20, Queue: 1024, RequestTTL: Duration(5 * time.Minute),
		MaxRemoteRequests: 100_000, RejoinInterval: Duration(10 * time.Second), TenantLimits: TenantLimitsFleet,
	}
	if diff := cmp.Diff(want, c.Peers); diff != "" {
		t.Errorf("defaults (-want +got):\n%s", diff)
	}
	// Absent: a lone router, no warning.
	c, err = Parse([]byte(peersBase))
	if err != nil || c.Peers != nil {
		t.Fatalf("no peers section: %+v, %v", c.Peers, err)
	}
	c, err = Parse([]byte(peersBase + "peers: {listen: ':7947', secret_env: X}\n"))
	if err != nil || !strings.Contains(strings.Join(c.Warnings, "\n"), "no static list, dns name or kubernetes watch") {
		t.Errorf("no static list and no dns: warnings %q, err %v", c.Warnings, err)
	}
}

// TestPeersTenantLimits: peers.tenant_limits is fleet by default, replica on request, and any
// other value is refused with an error that names the field, the value and both choices.
func TestPeersTenantLimits(t *testing.T) {
	for _, tc := range []struct{ line, want string }{
		{"", TenantLimitsFleet},
		{", tenant_limits: fleet", TenantLimitsFleet},
		{", tenant_limits: replica", TenantLimitsReplica},
	} {
		c, err := Parse([]byte(peersBase + "peers: {listen: ':7947', static: ['10.0.0.2:7946'], secret_env: X" + tc.line + "}\n"))
		if err != nil {
			t.Errorf("%q: %v", tc.line, err)
			continue
		}
		if c.Peers.TenantLimits != tc.want {
			t.Errorf("%q: tenant_limits %q, want %q", tc.line, c.Peers.TenantLimits, tc.want)
		}
	}
	for _, bad := range []string{"Fleet", "per_replica", "shared"} {
		_, err := Parse([]byte(peersBase + "peers: {listen: ':7947', static: ['10.0.0.2:7946'], secret_env: X, tenant_limits: " + bad + "}\n"))
		if err == nil {
			t.Errorf("tenant_limits %q: no error", bad)
			continue
		}
		for _, want := range []string{"peers.tenant_limits", fmt.Sprintf("%q", bad), "fleet", "replica"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("tenant_limits %q: error %q does not say %s", bad, err, want)
			}
		}
	}
}

func TestPeersErrors(t *testing.T) {
	_, err := Parse([]byte(peersBase + `peers:
  gossip_listen: "7946"
  advertise: "10.0.0.1:7946"
  static: ["10.0.0.2", "10.0.0.3:7946"]
  dns: {name: "http://x", port: 70000}
  secret_file: a
  secret_env: B
  accept_secret_file: c
  accept_secret_env: D
  batch_interval: 2s
  request_ttl: 10ms
  snapshot_max_bytes: 10
  max_message_bytes: 10
  queue: -1
  max_remote_requests: -5
`))
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{
		"peers.listen: missing", "peers.gossip_listen: \"7946\" is not host:port", "peers.advertise", "peers.static[0]",
		"peers.dns.name", "peers.dns.port", "both secret_file and secret_env", "both accept_secret_file and accept_secret_env", "peers.batch_interval", "peers.request_ttl",
		"peers.snapshot_max_bytes", "peers.max_message_bytes", "peers.queue", "peers.max_remote_requests",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
	if strings.Contains(err.Error(), "peers.static[1]") {
		t.Errorf("a good static address refused:\n%v", err)
	}
	_, err = Parse([]byte(peersBase + "peers: {listen: ':7947', gossip_listen: ':7947', static: ['a:1']}\n"))
	for _, want := range []string{"also peers.listen", "no shared secret"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("err %v, want one saying %q", err, want)
		}
	}
}

func TestPeersPortClash(t *testing.T) {
	const others = "listen: 127.0.0.1:20410\nadmin_listen: 127.0.0.1:20411\nextproc: {listen: 127.0.0.1:20412, health_listen: 127.0.0.1:20413}\n"
	for _, tc := range []struct{ peers, want string }{
		{"{listen: 127.0.0.1:20410, gossip_listen: 127.0.0.1:20420}", `peers.listen: "127.0.0.1:20410" is also listen: give each its own port`},
		{"{listen: 127.0.0.1:20411, gossip_listen: 127.0.0.1:20420}", `peers.listen: "127.0.0.1:20411" is also admin_listen`},
		{"{listen: 127.0.0.1:20412, gossip_listen: 127.0.0.1:20420}", `peers.listen: "127.0.0.1:20412" is also extproc.listen`},
		{"{listen: 127.0.0.1:20413, gossip_listen: 127.0.0.1:20420}", `peers.listen: "127.0.0.1:20413" is also extproc.health_listen`},
		{"{listen: 127.0.0.1:20420, gossip_listen: 127.0.0.1:20410}", `peers.gossip_listen: "127.0.0.1:20410" is also listen: give each its own port`},
		{"{listen: 127.0.0.1:20420, gossip_listen: 127.0.0.1:20411}", `peers.gossip_listen: "127.0.0.1:20411" is also admin_listen`},
		{"{listen: 127.0.0.1:20420, gossip_listen: 127.0.0.1:20412}", `peers.gossip_listen: "127.0.0.1:20412" is also extproc.listen`},
		{"{listen: 127.0.0.1:20420, gossip_listen: 127.0.0.1:20413}", `peers.gossip_listen: "127.0.0.1:20413" is also extproc.health_listen`},
		{"{listen: 127.0.0.1:20420, gossip_listen: 127.0.0.1:20420}", `peers.gossip_listen: "127.0.0.1:20420" is also peers.listen`},
	} {
		_, err := Parse([]byte(peersBase + others + "peers: " + strings.TrimSuffix(tc.peers, "}") + ", static: ['a:1'], secret_env: X}\n"))
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Count(err.Error(), "is also") != 1 {
			t.Errorf("peers: %s: err %v, want one clash, %q", tc.peers, err, tc.want)
		}
	}
	// The gossip port's default (peers.listen's host, port 7946) is checked too.
	_, err := Parse([]byte(peersBase + "listen: 127.0.0.1:7946\npeers: {listen: 127.0.0.1:7947, static: ['a:1'], secret_env: X}\n"))
	if want := `peers.gossip_listen: "127.0.0.1:7946" is also listen`; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("default gossip_listen on listen's port: err %v, want %q", err, want)
	}
	// Port 0 is a free port each time: no clash.
	if _, err := Parse([]byte(peersBase + "listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\npeers: {listen: 127.0.0.1:0, gossip_listen: 127.0.0.1:0, static: ['a:1'], secret_env: X}\n")); err != nil {
		t.Errorf("port 0 everywhere: %v", err)
	}
	// A command-line override (serve's --listen, --admin-listen) is checked as well.
	path := filepath.Join(t.TempDir(), "kvroute.yaml")
	if err := os.WriteFile(path, []byte(peersBase+"peers: {listen: 127.0.0.1:20420, static: ['a:1'], secret_env: X}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = LoadWith(path, func(c *Config) { c.AdminListen = "127.0.0.1:20420" }, Checks{})
	if want := `peers.listen: "127.0.0.1:20420" is also admin_listen`; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("--admin-listen on peers.listen: err %v, want %q", err, want)
	}
}

func TestPeerSecret(t *testing.T) {
	dir := t.TempDir()
	good := strings.Repeat("s", 32)
	if err := os.WriteFile(filepath.Join(dir, "peers.key"), []byte(good+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "short.key"), []byte("short"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		section, env, want, err string
	}{
		{"{listen: ':1', secret_file: peers.key}", "", good, ""},
		{"{listen: ':1', secret_env: K}", good, good, ""},
		{"{listen: ':1', secret_file: short.key}", "", "", "want at least 32"},
		{"{listen: ':1', secret_file: missing.key}", "", "", "peers.secret_file"},
		{"{listen: ':1', secret_env: K}", "", "", "peers.secret_env K: the variable is not set, or empty"},
		{"{listen: ':1', secret_env: K}", "short", "", "peers.secret_env K: the secret is 5 bytes"},
	} {
		path := filepath.Join(dir, "kvroute.yaml")
		if err := os.WriteFile(path, []byte(peersBase+"peers: "+c.section+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg, err := Load(path)
		if err != nil {
			t.Fatal(err)
		}
		got, err := cfg.PeerSecret(func(string) string { return c.env })
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: err %v, want one saying %q", c.section, err, c.err)
			}
			continue
		}
		if err != nil || string(got) != c.want {
			t.Errorf("%s: %q, %v", c.section, got, err)
		}
	}
}

func TestPeersKubernetes(t *testing.T) {
	c, err := Parse([]byte(peersBase + "peers: {listen: ':7947', gossip_listen: ':7950', kubernetes: {service: ' kvroute-peers '}, secret_env: X}\n"))
	if err != nil {
		t.Fatal(err)
	}
	// Neither port_name nor port: the gossip port, as for dns.
	if diff := cmp.Diff(&PeersKubernetes{Service: "kvroute-peers", Port: 7950}, c.Peers.Kubernetes); diff != "" {
		t.Errorf("peers.kubernetes (-want +got):\n%s", diff)
	}
	if len(c.Warnings) != 0 {
		t.Errorf("warnings %q, want none: the watch finds the replicas", c.Warnings)
	}
	c, err = Parse([]byte(peersBase + "peers: {listen: ':7947', kubernetes: {namespace: serving, selector: app.kubernetes.io/name=kvroute, port_name: gossip}, static: ['10.0.0.2:7946'], secret_env: X}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if k := c.Peers.Kubernetes; k.Port != 0 || k.PortName != "gossip" || k.Key() != "serving/app.kubernetes.io/name=kvroute" {
		t.Errorf("peers.kubernetes = %+v, key %q", k, k.Key())
	}

	for _, tc := range []struct{ section, want string }{
		{"{}", "peers.kubernetes: give service (a Service name, like kvroute-peers) or selector (a label selector, like app.kubernetes.io/name=kvroute)"},
		{"{service: a, selector: app=a}", "peers.kubernetes: give service or selector, not both"},
		{"{service: Peers_svc}", `peers.kubernetes.service: "Peers_svc" is not a Service name`},
		{"{service: a, namespace: 'Bad NS'}", `peers.kubernetes.namespace: "Bad NS" is not a namespace name`},
		{"{selector: 'app in ('}", `peers.kubernetes.selector: "app in (" does not parse`},
		{"{service: a, port_name: gossip, port: 7946}", "peers.kubernetes.port: give port_name or port, not both"},
		{"{service: a, port_name: 'gossip port'}", `peers.kubernetes.port_name: "gossip port" is not a port name`},
		{"{service: a, port: 70000}", "peers.kubernetes.port: 70000 is not a port: give the replicas' gossip port, like 7946"},
		{"{service: a, scheme: https}", `peers.kubernetes.scheme: unknown key "scheme"`},
	} {
		_, err := Parse([]byte(peersBase + "peers: {listen: ':7947', secret_env: X, kubernetes: " + tc.section + "}\n"))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want one saying %q", tc.section, err, tc.want)
		}
	}
}

func TestPeersTLSErrors(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "not-pem.txt"), []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		section string
		want    []string
	}{
		{"{cert_file: c.pem}", []string{"peers.tls.key_file: missing", "peers.tls.ca_file: missing: give the CA certificate"}},
		{"{ca_file: ca.pem}", []string{"peers.tls.cert_file: missing", "peers.tls.key_file: missing"}},
		{"{cert_file: c.pem, key_file: k.pem, ca_file: not-pem.txt}", []string{"peers.tls: cannot load the certificate and key", "peers.tls.ca_file: " + filepath.Join(dir, "not-pem.txt") + ": no PEM certificate"}},
		{"{cert_file: c.pem, key_file: k.pem, ca_file: ca.pem, server_name: 'kvroute peers'}", []string{`peers.tls.server_name: "kvroute peers" is not a DNS name`, "peers.tls.ca_file: open"}},
	} {
		path := filepath.Join(dir, "kvroute.yaml")
		if err := os.WriteFile(path, []byte(peersBase+"peers: {listen: ':7947', secret_env: X, tls: "+tc.section+"}\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := Load(path)
		for _, want := range tc.want {
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("%s: err %v, want one saying %q", tc.section, err, want)
			}
		}
	}
}

// TestPeersLinkLocal: a link-local IPv6 address, or any with a zone, in peers.advertise or
// peers.gossip_listen is refused at load with the field and the fix: the gossip carries no
// zone, and the peers cannot dial fe80::/10 without one. Before, "fe80::1%eth0" was told to
// be "an IP address, without a port", and fe80::1 was taken. So is a gossip_listen on [::] or
// at a name without peers.advertise: memberlist advertised "::" for it.
func TestPeersLinkLocal(t *testing.T) {
	for _, tc := range []struct {
		name, peers string
		errHas      []string // nil: loads
	}{
		{"advertise with a zone", "advertise: 'fe80::1%eth0'",
			[]string{`peers.advertise: "fe80::1%eth0": a link-local IPv6 address`, "global or unique local"}},
		{"advertise link-local", "advertise: 'fe80::1'", []string{`peers.advertise: "fe80::1": a link-local IPv6 address`}},
		{"advertise, a zone on another address", "advertise: 'fd00::1%eth0'",
			[]string{`peers.advertise: "fd00::1%eth0": an IPv6 zone (%eth0)`, "without it, fd00::1"}},
		{"gossip_listen link-local", "gossip_listen: '[fe80::1%eth0]:7946'",
			[]string{`peers.gossip_listen: "[fe80::1%eth0]:7946": a link-local IPv6 address`, "like :7946, and set peers.advertise"}},
		{"advertise a unique local address", "advertise: 'fd00::1'", nil},
		{"advertise an IPv4 link-local address", "advertise: '169.254.1.2'", nil},
		{"advertise a host name", "advertise: 'kvroute-0.kvroute-peers.inference.svc.cluster.local'", nil},
		{"gossip_listen at a unique local address", "gossip_listen: '[fd00::1]:7946'", nil},
		// memberlist advertises "::" for a listener on every IPv6 address or at a name, without
		// an address to advertise given; 0.0.0.0 it replaces with this host's private address.
		{"gossip_listen on every IPv6 address", "gossip_listen: '[::]:7946'",
			[]string{`peers.advertise: missing, with peers.gossip_listen "[::]:7946": the gossip would advertise the unspecified address (::)`}},
		{"gossip_listen at a name", "gossip_listen: 'localhost:7946'", []string{"peers.advertise: missing, with peers.gossip_listen \"localhost:7946\""}},
		{"gossip_listen on every IPv6 address, advertise given", "gossip_listen: '[::]:7946', advertise: 'fd00::1'", nil},
		{"gossip_listen on every IPv4 address", "gossip_listen: '0.0.0.0:7946'", nil},
		// A loopback address reaches no peer on another host: taken only with the gossip on
		// loopback too (a name resolving to loopback is refused at start, internal/peer).
		{"advertise loopback, gossip on every address", "advertise: '127.0.0.1'",
			[]string{`peers.advertise: "127.0.0.1": loopback, which no peer on another host can reach (the gossip listens on ":7946")`, "status.podIP"}},
		{"advertise loopback, gossip at a private address", "advertise: '::1', gossip_listen: '10.0.0.1:7946'",
			[]string{`peers.advertise: "::1": loopback`}},
		{"advertise loopback, gossip on loopback", "advertise: '127.0.0.2', gossip_listen: '127.0.0.1:7946'", nil},
		{"advertise IPv6 loopback, gossip on loopback", "advertise: '::1', gossip_listen: '[::1]:7946'", nil},
		{"advertise the unspecified address", "advertise: '0.0.0.0'", []string{`peers.advertise: "0.0.0.0": the unspecified address, which each peer dials as its own host`}},
		{"advertise ::, gossip on every IPv6 address", "advertise: '::', gossip_listen: '[::]:7946'", []string{`peers.advertise: "::": the unspecified address`}},
		// advertise_env stands for advertise: no "missing" (its value is judged where it is read).
		{"gossip_listen on every IPv6 address, advertise_env given", "gossip_listen: '[::]:7946', advertise_env: POD_IP", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(peersBase + "peers: {listen: ':7947', static: ['a:7946'], secret_env: X, " + tc.peers + "}\n"))
			if tc.errHas == nil {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("loaded")
			}
			for _, s := range tc.errHas {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error lacks %q:\n%v", s, err)
				}
			}
		})
	}
}

// TestPeersAdvertiseEnv: peers.advertise_env names a variable holding the address to advertise,
// one per replica under a shared config (a pod's IP from the downward API). Its value is read
// at load (with Checks.ReadSecrets, as the router loads and reloads: what only its machine
// holds) and by PeerAdvertise at start, and checked as advertise is; unset or empty is an error
// naming the variable and the fix. Set with advertise, or not a name, it is refused at load.
func TestPeersAdvertiseEnv(t *testing.T) {
	const section = "peers: {listen: ':7947', static: ['a:7946'], secret_env: KVROUTE_TEST_PEERS_SECRET, %s}\n"
	t.Setenv("KVROUTE_TEST_PEERS_SECRET", strings.Repeat("s", 32))
	load := func(peers string, read bool) (*Config, error) {
		t.Helper()
		path := filepath.Join(t.TempDir(), "kvroute.yaml")
		if err := os.WriteFile(path, []byte(peersBase+fmt.Sprintf(section, peers)), 0o600); err != nil {
			t.Fatal(err)
		}
		return LoadWith(path, nil, Checks{ReadSecrets: read})
	}

	// Set: read at load and at start, trimmed.
	t.Setenv("KVROUTE_TEST_POD_IP", " 10.1.2.3\n")
	c, err := load("advertise_env: KVROUTE_TEST_POD_IP", true)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := c.PeerAdvertise(nil); got != "10.1.2.3" || err != nil {
		t.Errorf("PeerAdvertise: %q, %v; want 10.1.2.3", got, err)
	}
	// Without it, advertise as it is, or "" (memberlist's pick).
	for _, tc := range []struct{ peers, want string }{{"advertise: kvroute-0.kvroute-peers", "kvroute-0.kvroute-peers"}, {"name: a", ""}} {
		c, err := load(tc.peers, true)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := c.PeerAdvertise(func(string) string { t.Error("a variable read without advertise_env"); return "" }); got != tc.want || err != nil {
			t.Errorf("%s: PeerAdvertise %q, %v; want %q", tc.peers, got, err, tc.want)
		}
	}

	// Unset or empty: refused at a load that reads this machine's variables, naming the variable
	// and the fix; a load that does not (a config checked elsewhere) takes it, and the start
	// (PeerAdvertise) refuses it then.
	t.Setenv("KVROUTE_TEST_POD_IP", "")
	_, err = load("advertise_env: KVROUTE_TEST_POD_IP", true)
	var keys []string
	for _, p := range Problems(err) {
		keys = append(keys, p.Key)
	}
	const unset = "KVROUTE_TEST_POD_IP: the variable is not set, or empty: set it to this replica's own address or host name (on Kubernetes, its pod IP: env: [{name: KVROUTE_TEST_POD_IP, valueFrom: {fieldRef: {fieldPath: status.podIP}}}])"
	if diff := cmp.Diff([]string{"peers.advertise_env"}, keys); diff != "" || !strings.Contains(err.Error(), "peers.advertise_env: "+unset) {
		t.Errorf("variable empty: problems (-want +got):\n%s\n%v", diff, err)
	}
	c, err = load("advertise_env: KVROUTE_TEST_POD_IP", false)
	if err != nil {
		t.Fatalf("without ReadSecrets: %v", err)
	}
	if _, err := c.PeerAdvertise(func(string) string { return "" }); err == nil || !strings.Contains(err.Error(), "peers.advertise_env "+unset) {
		t.Errorf("PeerAdvertise with the variable unset: %v", err)
	}

	// Its value is checked as advertise is.
	for _, tc := range []struct{ value, gossip, want string }{
		{"fe80::1%eth0", "", "a link-local IPv6 address"},
		{"fd00::1%eth0", "", "an IPv6 zone (%eth0)"},
		{"10.1.2.3:7946", "", "give a host name or an IP address, without a port"},
		{"::", "gossip_listen: '[::]:7946'", "the unspecified address"},
		{"127.0.0.1", "", `loopback, which no peer on another host can reach (the gossip listens on ":7946")`},
		{"127.0.0.1", "gossip_listen: '127.0.0.1:7946'", ""},
		{"fd00::7", "gossip_listen: '[::]:7946'", ""},
		{"kvroute-0.kvroute-peers", "", ""}, // resolved at start (internal/peer)
	} {
		t.Setenv("KVROUTE_TEST_POD_IP", tc.value)
		peers := "advertise_env: KVROUTE_TEST_POD_IP"
		if tc.gossip != "" {
			peers += ", " + tc.gossip
		}
		_, err := load(peers, true)
		if tc.want == "" {
			if err != nil {
				t.Errorf("%q with %s: refused: %v", tc.value, peers, err)
			}
			continue
		}
		if at := fmt.Sprintf("peers.advertise_env: KVROUTE_TEST_POD_IP=%q: ", tc.value); err == nil || !strings.Contains(err.Error(), at+tc.want) {
			t.Errorf("%q with %s: %v, want an error saying %q", tc.value, peers, err, at+tc.want)
		}
		c, lerr := load(peers, false)
		if lerr != nil {
			t.Fatalf("%q without ReadSecrets: %v", tc.value, lerr)
		}
		want := fmt.Sprintf("peers.advertise_env KVROUTE_TEST_POD_IP=%q: %s", tc.value, tc.want)
		if _, err := c.PeerAdvertise(nil); err == nil || !strings.HasPrefix(err.Error(), want) {
			t.Errorf("%q: PeerAdvertise %v, want an error saying %q", tc.value, err, want)
		}
	}

	// Refused whatever the machine: both keys, and a name that is not one.
	for _, tc := range []struct{ peers, want string }{
		{"advertise: 10.0.0.1, advertise_env: KVROUTE_TEST_POD_IP", "peers: both advertise and advertise_env are set: keep one"},
		{"advertise_env: $POD_IP", `peers.advertise_env: "$POD_IP" is not a variable's name: give the name alone, like POD_IP`},
		{"advertise_env: '${POD_IP}'", `peers.advertise_env: "${POD_IP}" is not a variable's name`},
	} {
		_, err := load(tc.peers, false)
		if err == nil || !strings.Contains(err.Error(), tc.want) || len(Problems(err)) != 1 {
			t.Errorf("%s: %v, want one problem, %q", tc.peers, err, tc.want)
		}
	}
}
