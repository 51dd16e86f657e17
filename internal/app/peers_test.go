package app

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sfake "k8s.io/client-go/kubernetes/fake"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/route"
	"github.com/kvroute/kvroute/internal/testcert"
	"github.com/kvroute/kvroute/internal/testkube"
	"github.com/kvroute/kvroute/internal/testlog"
)

const peerSecret = "0123456789abcdef0123456789abcdef"

// TestRouterPeers: two routers built from configs with a peers section share their routing:
// the other replays a request through one, its start and its end; /readyz waits for the warm
// start; /debug/peers shows whom each follows.
func TestRouterPeers(t *testing.T) {
	t.Setenv("KVROUTE_TEST_PEERS", peerSecret)
	eng, eng2 := newFakeEngine(t), newFakeEngine(t)
	mk := func(name, seed string) *Router {
		static := ""
		if seed != "" {
			static = fmt.Sprintf(", static: [%q]", seed)
		}
		return routerFromYAML(t, fmt.Sprintf("scrape: {disabled: true}\nhealth: {interval: 1h}\nauth: {mode: none}\n"+
			"endpoints: [{url: %q, models: [m], engine: vllm}, {url: %q, models: [m], engine: vllm}]\n"+
			"peers: {name: %s, listen: '127.0.0.1:0', gossip_listen: '127.0.0.1:0', secret_env: KVROUTE_TEST_PEERS, warm_start_timeout: 5s, batch_interval: 1ms%s}\n",
			eng.srv.URL, eng2.srv.URL, name, static))
	}
	a := mk("a", "")
	runRouter(t, a)
	waitUntil(t, "a's gossip address", func() bool { return a.peers.node.GossipAddr() != "" })
	b := mk("b", a.peers.node.GossipAddr())
	admin := b.AdminHandler()
	if code, body := get(t, admin, "/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "warming up") {
		t.Errorf("b's /readyz before its warm start: %d %q", code, body)
	}
	runRouter(t, b)
	waitUntil(t, "b ready", func() bool { code, _ := get(t, admin, "/readyz"); return code == http.StatusOK })
	waitUntil(t, "a's stream to b", func() bool { return testutil.ToFloat64(b.peers.node.Metrics().Streams) == 1 })

	body := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("a shared prefix ", 60) + `"}]}`
	rec := httptest.NewRecorder()
	a.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body)))
	if rec.Code != 200 {
		t.Fatalf("chat through a: %d %s", rec.Code, rec.Body)
	}
	waitUntil(t, "b hearing a's request end", func() bool {
		return testutil.ToFloat64(b.peers.node.Metrics().Events.WithLabelValues("in")) >= 2 // routed, done
	})
	// The events are counted as they arrive, before their batch is replayed: wait for the
	// replay too (a CI run once read the share in between: 0 applied, 1 in flight).
	waitUntil(t, "b replaying a's request end", func() bool {
		st := b.peers.share.Stats()
		return st.Applied >= 2 && st.Remote == 0
	})
	if st := b.peers.share.Stats(); st.Applied != 2 || st.Remote != 0 {
		t.Errorf("b applied %d events, %d remote in flight", st.Applied, st.Remote)
	}
	// A stall found at a, silent since after the last answer b heard of (a's request's end),
	// crosses the wire: b marks the engine stalled too (route's TestShareStalls checks the rest).
	time.Sleep(50 * time.Millisecond)
	a.peers.node.Publish(&route.Event{Kind: route.EventStalled, Endpoint: b.Endpoints()[0].Name, Silent: 10 * time.Millisecond})
	waitUntil(t, "b marking the engine stalled", func() bool { return b.Endpoints()[0].StalledSince != nil })
	if st := b.peers.share.Stats(); st.Applied != 3 {
		t.Errorf("b applied %d events, want 3", st.Applied)
	}
	// Three failed attempts at a on the second engine (500s), with no success between, cross
	// the wire with their failure: b ejects that engine (health.passive_failures, 3), which
	// it never sent a request (route's TestShareFailures checks the rest).
	second := b.Endpoints()[1].Name
	for id := uint64(1 << 40); id < 1<<40+3; id++ {
		a.peers.node.Publish(&route.Event{Kind: route.EventRouted, ID: id, Endpoint: second, Model: "m", PromptTokens: 10})
		a.peers.node.Publish(&route.Event{Kind: route.EventDone, ID: id, Failure: route.FailStatus, CachedTokens: -1})
	}
	waitUntil(t, "b ejecting the engine that failed at a", func() bool { return b.Endpoints()[1].EjectedUntil != nil })
	// The ejection reset the counts; a fourth failure at a is the fleet's first, not b's.
	a.peers.node.Publish(&route.Event{Kind: route.EventRouted, ID: 1<<40 + 3, Endpoint: second, Model: "m", PromptTokens: 10})
	a.peers.node.Publish(&route.Event{Kind: route.EventDone, ID: 1<<40 + 3, Failure: route.FailTimeout, CachedTokens: -1})
	waitUntil(t, "b counting a's fourth failure", func() bool { return b.Endpoints()[1].Failures.Fleet == 1 })
	if f := b.Endpoints()[1].Failures; f.Here != 0 {
		t.Errorf("b's own consecutive failures %d, want 0: it sent the engine nothing", f.Here)
	}
	code, out := get(t, admin, "/debug/peers")
	var st struct {
		Members   []string `json:"members"`
		Following []string `json:"following"`
	}
	if err := json.Unmarshal([]byte(out), &st); code != 200 || err != nil || len(st.Following) != 1 || st.Following[0] != "a" {
		t.Errorf("/debug/peers: %d %s (%v)", code, out, err)
	}
	if code, _ := get(t, admin, "/metrics"); code != 200 {
		t.Errorf("/metrics: %d", code)
	}
	if _, m := get(t, admin, "/metrics"); !strings.Contains(m, `kvroute_peer_warm_starts_total{result="ok"} 1`) {
		t.Errorf("b's metrics lack its warm start")
	}
	// Fault injection is off unless configured.
	rec = httptest.NewRecorder()
	admin.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/debug/peers/isolate?on=true", nil))
	if rec.Code == 200 {
		t.Error("fault injection served without peers.fault_injection")
	}
}

// TestRouterPeersKubernetes: a router whose peers.kubernetes watch (on a fake API server) finds
// another replica in the replicas' Service's EndpointSlice joins it, follows it and takes its
// snapshot; a slice without the port is counted as a discovery error of the peer source.
func TestRouterPeersKubernetes(t *testing.T) {
	t.Setenv("KVROUTE_TEST_PEERS", peerSecret)
	eng := newFakeEngine(t)
	base := fmt.Sprintf("scrape: {disabled: true}\nhealth: {interval: 1h}\nauth: {mode: none}\n"+
		"endpoints: [{url: %q, models: [m], engine: vllm}]\n", eng.srv.URL)
	a := routerFromYAML(t, base+"peers: {name: a, listen: '127.0.0.1:0', gossip_listen: '127.0.0.1:0', secret_env: KVROUTE_TEST_PEERS, batch_interval: 1ms}\n")
	runRouter(t, a)
	waitUntil(t, "a's gossip address", func() bool { return a.peers.node.GossipAddr() != "" })
	host, port, _ := net.SplitHostPort(a.peers.node.GossipAddr())
	gossip, _ := strconv.Atoi(port)

	// The kubeconfig names an API server nobody listens on: the fake replaces it.
	kubeconfig := testkube.Kubeconfig(t, "serving")
	b := routerFromYAML(t, base+fmt.Sprintf("peers: {name: b, listen: '127.0.0.1:0', gossip_listen: '127.0.0.1:0', secret_env: KVROUTE_TEST_PEERS, "+
		"batch_interval: 1ms, kubernetes: {service: kvroute-peers, port_name: gossip, kubeconfig: %q}}\n", kubeconfig))
	tcp := corev1.ProtocolTCP
	slice := func(name, portName string, portNum int32) *discoveryv1.EndpointSlice {
		return &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: name, Namespace: "serving", Labels: map[string]string{"kubernetes.io/service-name": "kvroute-peers"}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: &portName, Port: &portNum, Protocol: &tcp}},
			Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{host}}},
		}
	}
	b.KubeClient = k8sfake.NewClientset(slice("kvroute-peers-a", "gossip", int32(gossip)), slice("kvroute-peers-x", "peers", 7947))
	runRouter(t, b)
	followsWarm(t, b, "a")
	const source = "peers:kubernetes:serving/kvroute-peers"
	waitUntil(t, "the slice without the port counted", func() bool {
		return testutil.ToFloat64(b.Metrics().DiscoveryErrors.WithLabelValues(source)) == 1
	})
	if _, err := b.peers.kube.Addrs(context.Background()); err != nil {
		t.Errorf("b's peer source: %v", err)
	}
}

// TestRouterPeersTLS: routers whose peers section has tls (certificates of one CA) share over
// mutual TLS: the second takes the first's snapshot and follows it; the first's event stream
// server does not answer cleartext.
func TestRouterPeersTLS(t *testing.T) {
	t.Setenv("KVROUTE_TEST_PEERS", peerSecret)
	eng := newFakeEngine(t)
	ca := testcert.NewCA(t, "peers")
	mk := func(name, static string) *Router {
		cert, key := ca.Issue(name, "kvroute-peers")
		return routerFromYAML(t, fmt.Sprintf("scrape: {disabled: true}\nhealth: {interval: 1h}\nauth: {mode: none}\n"+
			"endpoints: [{url: %q, models: [m], engine: vllm}]\n"+
			"peers: {name: %s, listen: '127.0.0.1:0', gossip_listen: '127.0.0.1:0', secret_env: KVROUTE_TEST_PEERS, batch_interval: 1ms, static: [%s], "+
			"tls: {cert_file: %q, key_file: %q, ca_file: %q, server_name: kvroute-peers}}\n", eng.srv.URL, name, static, cert, key, ca.File))
	}
	a := mk("a", "")
	runRouter(t, a)
	waitUntil(t, "a's gossip address", func() bool { return a.peers.node.GossipAddr() != "" })
	b := mk("b", fmt.Sprintf("%q", a.peers.node.GossipAddr()))
	runRouter(t, b)
	followsWarm(t, b, "a")
	resp, err := http.Get("http://" + a.peers.node.Addr().String() + "/peer/v1/snapshot")
	if err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("cleartext to a TLS peer: %s, want 400", resp.Status)
		}
	}
}

// followsWarm waits until r follows the peer named only, and is ready after taking its snapshot.
func followsWarm(t *testing.T, r *Router, peer string) {
	t.Helper()
	waitUntil(t, "following "+peer+", ready", func() bool {
		st := r.peers.node.Status()
		return len(st.Following) == 1 && st.Following[0] == peer && st.Ready
	})
	if got := testutil.ToFloat64(r.peers.node.Metrics().WarmStarts.WithLabelValues("ok")); got != 1 {
		t.Errorf("warm starts ok = %v, want 1", got)
	}
}

// TestServeEndsWhenPeersCannotStart: a replica whose gossip port is taken stops serving with
// that error (and logs it as it happens), rather than serve on, never ready, saying nothing.
func TestServeEndsWhenPeersCannotStart(t *testing.T) {
	t.Setenv("KVROUTE_TEST_PEERS", peerSecret)
	// A port taken for both UDP and TCP (memberlist binds both); the TCP twin of a free UDP
	// port may be another process's: tried again then, a few times.
	var taken net.PacketConn
	for try := 0; taken == nil; try++ {
		udp, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		tcp, err := net.Listen("tcp", udp.LocalAddr().String())
		if err != nil {
			udp.Close()
			if try == 9 {
				t.Fatal(err)
			}
			continue
		}
		defer udp.Close()
		defer tcp.Close()
		taken = udp
	}
	eng := newFakeEngine(t)
	r := routerFromYAML(t, fmt.Sprintf("scrape: {disabled: true}\nhealth: {interval: 1h}\nauth: {mode: none}\n"+
		"endpoints: [{url: %q, models: [m], engine: vllm}]\n"+
		"peers: {name: a, listen: '127.0.0.1:0', gossip_listen: %q, secret_env: KVROUTE_TEST_PEERS}\n",
		eng.srv.URL, taken.LocalAddr().String()))
	api, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.Serve(ctx, api, nil) }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "peers") || !strings.Contains(err.Error(), "address already in use") {
			t.Errorf("Serve returned %v, want the peers' bind error", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve still running 10 s after its peers failed to start")
	}
}

// TestPeersSecretReload: a reload reads the peers secrets again, also under the same file
// name, and puts changed ones in force (a rotation's steps: the new accepted, then signing,
// then alone); one that cannot read them is rejected, counted as an error, and the secrets in
// force stay.
func TestPeersSecretReload(t *testing.T) {
	eng := newFakeEngine(t)
	dir := t.TempDir()
	file, next := filepath.Join(dir, "secret"), filepath.Join(dir, "next")
	newSecret := strings.ToUpper(peerSecret)
	write := func(f, s string) {
		if err := os.WriteFile(f, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(file, peerSecret)
	write(next, newSecret)
	parse := func(accept string) *config.Config {
		if accept != "" {
			accept = fmt.Sprintf(", accept_secret_file: %q", accept)
		}
		cfg, err := config.Parse([]byte(fmt.Sprintf("scrape: {disabled: true}\nhealth: {interval: 1h}\nauth: {mode: none}\n"+
			"endpoints: [{url: %q, models: [m], engine: vllm}]\n"+
			"peers: {name: a, listen: '127.0.0.1:0', gossip_listen: '127.0.0.1:0', secret_file: %q%s}\n", eng.srv.URL, file, accept)))
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	logs := &testlog.Buffer{}
	r, err := NewRouter(parse(""), slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	for _, step := range []struct {
		name, secret, accept, want string
	}{
		{"nothing changed", peerSecret, "", ""},
		{"the new one accepted", peerSecret, next, "peers secrets changed\" replica=a accepting=2"},
		{"signing with the new one", newSecret, next + "-old", "peers secrets changed\" replica=a accepting=2"},
		{"the old one dropped", newSecret, "", "peers secrets changed\" replica=a accepting=1"},
		{"unreadable", "short", "", "the secret is 5 bytes, want at least 32"},
	} {
		write(file, step.secret)
		if step.accept != "" {
			write(next+"-old", peerSecret)
		}
		before := len(logs.String())
		errsBefore := testutil.ToFloat64(r.Metrics().Reloads.WithLabelValues("error"))
		err := r.Reload(parse(step.accept))
		rejected := testutil.ToFloat64(r.Metrics().Reloads.WithLabelValues("error")) - errsBefore
		if wantErr := step.name == "unreadable"; (err != nil) != wantErr || rejected != map[bool]float64{true: 1}[wantErr] {
			t.Fatalf("%s: reload: %v, counted as an error %v times", step.name, err, rejected)
		}
		got := logs.String()[before:]
		if step.want == "" && strings.Contains(got, "peers secret") || step.want != "" && !strings.Contains(got, step.want) ||
			strings.Contains(got, "changes only on restart") {
			t.Errorf("%s: logged %q, want %q", step.name, got, step.want)
		}
	}
}

// TestServeStopBounded: the last step of a shutdown, after the drain (discovery, health
// checks and peers stopping, the admin listener closing), is said as it starts, and is bounded:
// a replica leaving its peers waits up to a second for a peer that does not answer (frozen: its
// kernel takes the connection, nothing reads it), and here the bound is shorter, so Serve says
// it does not wait, returns, and logs "stopped" with the time the shutdown took; the peers' end
// is logged when it comes. Before, a second or more went by after "draining requests in
// flight" with nothing in the log.
//
// The frozen peer is b stopped unannounced (cut off first, so that its leave never reaches a)
// with a listener that never answers taken over on its gossip port: a takes b for alive
// until failure detection declares it dead, seconds later, so a's leave is handed to it.
func TestServeStopBounded(t *testing.T) {
	t.Setenv("KVROUTE_TEST_PEERS", peerSecret)
	eng := newFakeEngine(t)
	conf := func(name, seed string) string {
		more := ""
		if seed != "" { // b: it joins a, and can be cut off (Isolate)
			more = fmt.Sprintf(", static: [%q], fault_injection: true", seed)
		}
		return fmt.Sprintf("scrape: {disabled: true}\nhealth: {interval: 1h}\nauth: {mode: none}\n"+
			"endpoints: [{url: %q, models: [m], engine: vllm}]\n"+
			"peers: {name: %s, listen: '127.0.0.1:0', gossip_listen: '127.0.0.1:0', secret_env: KVROUTE_TEST_PEERS, warm_start_timeout: 5s%s}\n",
			eng.srv.URL, name, more)
	}
	cfg, err := config.Parse([]byte(conf("a", "")))
	if err != nil {
		t.Fatal(err)
	}
	logger, logs := jsonLogger()
	a, err := NewRouter(cfg, logger)
	if err != nil {
		t.Fatal(err)
	}
	a.stopWait = 200 * time.Millisecond
	api := loopback(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	served := make(chan error, 1)
	go func() { served <- a.Serve(ctx, api, nil) }()
	waitUntil(t, "a's gossip address", func() bool { return a.peers.node.GossipAddr() != "" })
	b := routerFromYAML(t, conf("b", a.peers.node.GossipAddr()))
	bctx, stopB := context.WithCancel(context.Background())
	defer stopB()
	bRan := make(chan error, 1)
	go func() { bRan <- b.Run(bctx) }()
	followsWarm(t, b, "a")
	waitUntil(t, "a following b", func() bool { return len(a.peers.node.Status().Following) == 1 })

	// b freezes: cut off, stopped, its gossip port taken by a listener that never answers.
	bGossip := b.peers.node.GossipAddr()
	b.peers.node.Isolate(true)
	stopB()
	select {
	case err := <-bRan:
		if err != nil {
			t.Fatalf("b's Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("b's Run did not return within 10 s")
	}
	frozen, err := net.Listen("tcp", bGossip)
	if err != nil {
		t.Fatalf("taking b's gossip port over: %v", err)
	}
	defer frozen.Close()
	if m := a.peers.node.Status().Members; len(m) != 1 || m[0] != "b" {
		t.Fatalf("a's members %v before it stops, want b, still taken for alive", m)
	}

	start := time.Now()
	cancel()
	select {
	case err := <-served:
		if err != nil {
			t.Errorf("Serve: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return within 10 s")
	}
	if took := time.Since(start); took > 800*time.Millisecond {
		t.Errorf("Serve took %v to return, past its 200 ms bound on stopping (leaving a frozen peer takes a second)", took)
	}
	waitUntil(t, "the peers' late end logged", func() bool { return len(messages(t, logs, "stopped, late")) == 1 })
	var msgs []string
	var stopped, late map[string]any
	for _, l := range logs.JSONLines(t) {
		msg := l["msg"].(string)
		if strings.HasPrefix(msg, "shutting down") || strings.Contains(msg, "stopped") {
			msgs = append(msgs, msg)
		}
		switch msg {
		case "stopped":
			stopped = l
		case "left the peers":
			late = l
		}
	}
	want := []string{
		"shutting down: no drain delay, as /readyz was never asked (nothing follows it)",
		"shutting down: draining requests in flight",
		"shutting down: stopping discovery, health checks, scrapes and peers",
		"shutting down: discovery, health checks, scrapes or peers did not stop in time: not waiting for them",
		"stopped",
		"discovery, health checks, scrapes and peers stopped, late",
	}
	if diff := cmp.Diff(want, msgs); diff != "" {
		t.Errorf("the shutdown's lines (-want +got):\n%s", diff)
	}
	if took, err := time.ParseDuration(fmt.Sprint(stopped["took"])); err != nil || took < 200*time.Millisecond || took > 800*time.Millisecond {
		t.Errorf("\"stopped\" took=%v (%v): want the shutdown's time, over the 200 ms waited", stopped["took"], err)
	}
	// What ran late: the leave, waiting for b.
	if late == nil || late["peers"] != 1.0 || late["told"] != 0.0 {
		t.Errorf("a's leave: %v, want 1 peer, none told", late)
	}
}

// TestRouterPeersAdvertiseEnv: with peers.advertise_env a replica advertises the value of the
// variable it names (a pod's IP, from the downward API), read when the router is built, so
// that a config loaded without reading this machine's variables is checked then: the variable
// unset, or holding a loopback address while the gossip is not on loopback, is an error naming
// it and the fix, and nothing starts.
func TestRouterPeersAdvertiseEnv(t *testing.T) {
	t.Setenv("KVROUTE_TEST_PEERS", peerSecret)
	eng := newFakeEngine(t)
	conf := func(gossip string) *config.Config {
		cfg, err := config.Parse([]byte(fmt.Sprintf("scrape: {disabled: true}\nhealth: {interval: 1h}\nauth: {mode: none}\n"+
			"endpoints: [{url: %q, models: [m], engine: vllm}]\n"+
			"peers: {name: a, listen: '127.0.0.1:0', gossip_listen: %q, secret_env: KVROUTE_TEST_PEERS, advertise_env: KVROUTE_TEST_POD_IP}\n",
			eng.srv.URL, gossip)))
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	// Another loopback address than the gossip's, so that the advertised one tells where it
	// came from (no peer dials it: this replica is alone).
	t.Setenv("KVROUTE_TEST_POD_IP", "127.0.0.2")
	r, err := NewRouter(conf("127.0.0.1:0"), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	runRouter(t, r)
	waitUntil(t, "the gossip address", func() bool { return r.peers.node.GossipAddr() != "" })
	if host, _, _ := net.SplitHostPort(r.peers.node.GossipAddr()); host != "127.0.0.2" {
		t.Errorf("advertised %s, want the variable's 127.0.0.2", r.peers.node.GossipAddr())
	}

	for _, tc := range []struct{ value, gossip, want string }{
		{"", "127.0.0.1:0", "peers.advertise_env KVROUTE_TEST_POD_IP: the variable is not set, or empty: set it to this replica's own address or host name (on Kubernetes, its pod IP: env: [{name: KVROUTE_TEST_POD_IP, valueFrom: {fieldRef: {fieldPath: status.podIP}}}])"},
		// The gossip never binds: the router is refused before it runs.
		{"127.0.0.1", "0.0.0.0:0", `peers.advertise_env KVROUTE_TEST_POD_IP="127.0.0.1": loopback, which no peer on another host can reach (the gossip listens on "0.0.0.0:0")`},
	} {
		t.Setenv("KVROUTE_TEST_POD_IP", tc.value)
		r, err := NewRouter(conf(tc.gossip), slog.New(slog.DiscardHandler))
		if err == nil {
			r.Close()
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("variable %q: NewRouter: %v, want an error saying %q", tc.value, err, tc.want)
		}
	}
}
