package kube_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kvroute/kvroute/internal/discovery/kube"
	"github.com/kvroute/kvroute/internal/simserver"
)

const namespace = "inference"

// simPod is a pod of the scenario: a simulated engine on loopback behind an EndpointSlice of
// its own (all pods share 127.0.0.1, so each needs its own port, and a slice has one port). Its
// port is a relay in front of the engine's server that records the x-request-id of every
// request whose bytes reach it, so that a failed request can be traced to the pod it was sent to
// even when the router could not say and the engine never read it (killed with the request
// waiting in its socket).
type simPod struct {
	name  string
	srv   *http.Server
	url   string
	port  int32
	relay net.Listener

	mu      sync.Mutex
	reached map[string]bool // requests whose bytes reached the pod
	handled map[string]bool // requests its engine read
	wg      sync.WaitGroup  // the relay's goroutines
}

func startPod(t *testing.T, name string) *simPod {
	t.Helper()
	in, err := simserver.New(simserver.Options{Profile: "llama3-8b-h100-tp1", Model: "m", Seed: 1, Name: name})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	relay, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &simPod{name: name, url: "http://" + relay.Addr().String(), port: int32(relay.Addr().(*net.TCPAddr).Port),
		relay: relay, reached: map[string]bool{}, handled: map[string]bool{}}
	p.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		p.handled[r.Header.Get("X-Request-Id")] = true
		p.mu.Unlock()
		in.Handler().ServeHTTP(w, r)
	})}
	done := make(chan struct{})
	go func() { defer close(done); _ = p.srv.Serve(ln) }()
	p.wg.Go(func() { p.serveRelay(ln.Addr().String()) })
	t.Cleanup(func() {
		p.kill()
		<-done
		p.wg.Wait()
		_ = in.Close()
	})
	return p
}

// serveRelay forwards each connection to the relay to the engine at target, noting the
// x-request-id of each request on the way, until the relay is closed.
func (p *simPod) serveRelay(target string) {
	for {
		c, err := p.relay.Accept()
		if err != nil {
			return
		}
		u, err := net.Dial("tcp", target)
		if err != nil {
			c.Close()
			continue
		}
		p.wg.Go(func() {
			_, _ = io.Copy(c, u) // until the engine closes the connection
			// The router is told at once, as by the engine; what it still sends is read for a
			// while, so that a request written as the engine died is known to have reached it.
			_ = c.(*net.TCPConn).CloseWrite()
			_ = c.SetReadDeadline(time.Now().Add(time.Second))
			u.Close()
		})
		p.wg.Go(func() {
			p.forward(c, u)
			c.Close()
			u.Close()
		})
	}
}

// forward copies what the router sends to the engine, noting each X-Request-Id header (a line
// longer than 4 KB, a body's, is not looked into), until the router's side ends; once the
// engine's is gone, it reads on without copying.
func (p *simPod) forward(c, u net.Conn) {
	var line []byte
	buf := make([]byte, 32<<10)
	engine := true
	for {
		n, err := c.Read(buf)
		for _, b := range buf[:n] {
			if b != '\n' {
				if len(line) < 4<<10 {
					line = append(line, b)
				}
				continue
			}
			if k, v, ok := strings.Cut(strings.TrimSpace(string(line)), ":"); ok && strings.EqualFold(k, "X-Request-Id") {
				p.mu.Lock()
				p.reached[strings.TrimSpace(v)] = true
				p.mu.Unlock()
			}
			line = line[:0]
		}
		if engine {
			if _, werr := u.Write(buf[:n]); werr != nil {
				engine = false
			}
		}
		if err != nil {
			return
		}
	}
}

// shutdown stops the pod gracefully: no new connection, open ones closed once idle.
func (p *simPod) shutdown(ctx context.Context) error {
	_ = p.relay.Close() // as the engine's listener: a new connection is refused, not accepted and dropped
	return p.srv.Shutdown(ctx)
}

// kill stops the pod at once: the engine's server closes, and with it every connection (the
// relay passes each close on to the router), whatever they were carrying.
func (p *simPod) kill() {
	_ = p.relay.Close() // first: a connection accepted now could not reach the engine
	_ = p.srv.Close()
}

// received reports whether the request with x-request-id id reached the pod, and whether its
// engine read it.
func (p *simPod) received(id string) (reached, handled bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.reached[id], p.handled[id]
}

// slice is the pod's EndpointSlice in the state given: "ready", "not-ready" or "terminating".
func (p *simPod) slice(state string) *discoveryv1.EndpointSlice {
	yes, no := true, false
	c := discoveryv1.EndpointConditions{Ready: &yes, Serving: &yes, Terminating: &no}
	switch state {
	case "not-ready":
		c = discoveryv1.EndpointConditions{Ready: &no, Serving: &no, Terminating: &no}
	case "terminating":
		c = discoveryv1.EndpointConditions{Ready: &no, Serving: &yes, Terminating: &yes}
	}
	name, tcp := "http", corev1.ProtocolTCP
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "vllm-" + p.name, Namespace: namespace, Labels: map[string]string{kube.ServiceNameLabel: "vllm"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"127.0.0.1"}, Conditions: c,
			TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: namespace, Name: p.name}}},
		Ports: []discoveryv1.EndpointPort{{Name: &name, Port: &p.port, Protocol: &tcp}},
	}
}

// outcome is one client request through the router.
type outcome struct {
	id       string // its x-request-id
	endpoint string // the X-Kvroute-Endpoint the router answered with ("" if none)
	ok       bool   // 200 and the stream reached [DONE]
	detail   string
	stages   string // the scenario's stages when it started and ended
}

// TestRouterUnderChurn runs a router whose only endpoints come from a Service's EndpointSlices
// (a fake API server) in front of simulated engines, with clients streaming through it, while
// the pods come and go: a pod added, one terminating gracefully (its streams finish, then it
// stops), one not ready and back, one killed outright. No request may fail unless it was on
// the killed pod, and each new pod must serve requests once its slice says it is ready. The
// policy is least-request, so that an idle new pod gets the next request whatever the caches
// hold: what is tested is discovery, not placement.
func TestRouterUnderChurn(t *testing.T) {
	pods := map[string]*simPod{}
	for _, n := range []string{"p0", "p1", "p2", "p3"} {
		pods[n] = startPod(t, n)
	}
	client := fake.NewClientset(pods["p0"].slice("ready"), pods["p1"].slice("ready"))
	sliceAPI := client.DiscoveryV1().EndpointSlices(namespace)
	apply := func(s *discoveryv1.EndpointSlice) {
		t.Helper()
		if _, err := sliceAPI.Update(context.Background(), s, metav1.UpdateOptions{}); err == nil {
			return
		}
		if _, err := sliceAPI.Create(context.Background(), s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	r, api, _ := runRouter(t, client, `
auth: {mode: none}
policy: {name: least-request}
scrape: {disabled: true}
health: {interval: 1h}
server: {endpoint_header: X-Kvroute-Endpoint}
discovery:
  kubernetes:
    - {service: vllm, port_name: http, kubeconfig: %q, endpoint: {engine: vllm, models: [m]}}
`)

	poolIs := func(what string, want ...string) {
		t.Helper()
		slices.Sort(want)
		var got []string
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
			got = got[:0]
			for _, e := range r.Pool().All() {
				got = append(got, e.Name)
			}
			slices.Sort(got)
			if slices.Equal(got, want) {
				return
			}
		}
		t.Fatalf("%s: pool %v, want %v within 10s", what, got, want)
	}
	poolIs("start", pods["p0"].url, pods["p1"].url)

	// The load: streaming chat requests with a shared system prompt, from 6 clients, until
	// the scenario ends (at most 20,000 requests or 60 s).
	var mu sync.Mutex
	var outcomes []outcome
	// epoch is read by each client as a request starts; lastEpoch[w] is the latest epoch of a
	// request client w has finished. Once every client has finished one started in an epoch,
	// every request started before it has ended (each client sends one at a time).
	var epoch atomic.Int64
	var stage atomic.Value // what the scenario is doing, for the report of a failure
	stage.Store("start")
	var lastEpoch [6]int64
	served := map[string]int{}
	stop := make(chan struct{})
	var clients sync.WaitGroup
	hc := &http.Client{Timeout: 30 * time.Second}
	system := strings.Repeat("You are a helpful assistant for the catalogue. ", 20)
	deadline := time.Now().Add(60 * time.Second)
	for w := range 6 {
		clients.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				mu.Lock()
				n := len(outcomes)
				mu.Unlock()
				if n >= 20000 || time.Now().After(deadline) {
					return
				}
				epoch := epoch.Load() // before the request starts
				began := stage.Load()
				o := send(hc, api.URL, fmt.Sprintf("c%d-%d", w, i), fmt.Sprintf(`{"model":"m","stream":true,"max_tokens":12,"messages":[{"role":"system","content":%q},{"role":"user","content":"question %d from client %d"}]}`, system, i, w))
				o.stages = fmt.Sprintf("%v to %v", began, stage.Load())
				mu.Lock()
				outcomes = append(outcomes, o)
				if epoch > lastEpoch[w] {
					lastEpoch[w] = epoch
				}
				if o.ok {
					served[o.endpoint]++
				}
				mu.Unlock()
			}
		})
	}
	stopLoad := sync.OnceFunc(func() { close(stop); clients.Wait() })
	defer stopLoad()
	servedBy := func(what, url string) {
		t.Helper()
		for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(2 * time.Millisecond) {
			mu.Lock()
			n := served[url]
			mu.Unlock()
			if n > 0 {
				return
			}
		}
		t.Fatalf("%s: %s served no request within 10s", what, url)
	}
	servedBy("start", pods["p0"].url)

	// A new pod turns ready: in the pool at the next event, and used.
	stage.Store("p2 added")
	apply(pods["p2"].slice("not-ready"))
	apply(pods["p2"].slice("ready"))
	poolIs("p2 ready", pods["p0"].url, pods["p1"].url, pods["p2"].url)
	servedBy("p2 added", pods["p2"].url)

	// p0 is terminating: no new requests, its streams finish; then it stops and leaves.
	p0 := r.Pool().ByName(pods["p0"].url)
	stage.Store("p0 terminating")
	apply(pods["p0"].slice("terminating"))
	poolIs("p0 terminating", pods["p1"].url, pods["p2"].url)
	// A request that had read the pool before p0 left it may not have counted itself on p0 yet:
	// p0's in-flight count alone may read 0 while such a request is on its way there. Once each
	// client has finished a request started after p0 left the pool, none can be.
	epoch.Store(1)
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(2 * time.Millisecond) {
		mu.Lock()
		done := slices.Min(lastEpoch[:]) >= 1
		mu.Unlock()
		if done {
			break
		}
		if time.Now().After(end) {
			t.Fatal("not every client finished a request started after p0 left the pool within 10s")
		}
	}
	if n := p0.InFlight(); n > 0 {
		t.Fatalf("p0 has %d requests in flight after every request started before it left the pool ended", n)
	}
	stage.Store("p0 shut down")
	sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
	if err := pods["p0"].shutdown(sctx); err != nil {
		t.Errorf("p0 shutdown: %v", err)
	}
	scancel()
	if err := sliceAPI.Delete(context.Background(), "vllm-p0", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	// p1 fails its readiness probe, then passes it again.
	stage.Store("p1 not ready")
	apply(pods["p1"].slice("not-ready"))
	poolIs("p1 not ready", pods["p2"].url)
	stage.Store("p1 ready again")
	apply(pods["p1"].slice("ready"))
	poolIs("p1 ready again", pods["p1"].url, pods["p2"].url)
	servedBy("p1 back", pods["p1"].url)

	// p3 joins, then p2 is killed outright: its slice goes and the engine dies at once,
	// cutting what it was streaming (the only failures allowed).
	stage.Store("p3 added")
	apply(pods["p3"].slice("ready"))
	poolIs("p3 ready", pods["p1"].url, pods["p2"].url, pods["p3"].url)
	servedBy("p3 added", pods["p3"].url)
	stage.Store("p2 killed")
	if err := sliceAPI.Delete(context.Background(), "vllm-p2", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	pods["p2"].kill()
	poolIs("p2 killed", pods["p1"].url, pods["p3"].url)
	mu.Lock()
	mark := len(outcomes)
	mu.Unlock()
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(2 * time.Millisecond) {
		mu.Lock()
		n := len(outcomes)
		mu.Unlock()
		if n >= mark+50 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("only %d requests completed after p2 was killed", n-mark)
		}
	}
	stopLoad()

	// A failed request is allowed only if it was on the killed pod: the router says so in its
	// endpoint header, or, when the engine died before the router could answer, it reached p2
	// (maybe unread: the engine may die with a request waiting in its socket, which the router
	// wrote on a connection it had used a moment before, and so does not send again).
	failed, unread := 0, 0
	for _, o := range outcomes {
		if o.ok {
			continue
		}
		failed++
		reached, handled := pods["p2"].received(o.id)
		if reached && !handled {
			unread++
		}
		if o.endpoint != pods["p2"].url && (o.endpoint != "" || !reached) {
			var on []string // the pods it reached, to say where it was lost
			for _, n := range []string{"p0", "p1", "p2", "p3"} {
				if r, h := pods[n].received(o.id); r {
					on = append(on, fmt.Sprintf("%s (read: %v)", n, h))
				}
			}
			t.Errorf("request %s (%s) failed and was not on the killed pod: endpoint %q, reached %v: %s", o.id, o.stages, o.endpoint, on, o.detail)
		}
	}
	t.Logf("%d requests; served: p0 %d, p1 %d, p2 %d, p3 %d; failed (on the killed p2): %d, of which its engine never read %d",
		len(outcomes), served[pods["p0"].url], served[pods["p1"].url], served[pods["p2"].url], served[pods["p3"].url], failed, unread)
	if len(outcomes) < 50 {
		t.Errorf("only %d requests: the load did not flow", len(outcomes))
	}
}

// send makes one streaming request and reads it to its end.
func send(hc *http.Client, base, id, body string) outcome {
	o := outcome{id: id}
	req, err := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		o.detail = err.Error()
		return o
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Request-Id", id)
	resp, err := hc.Do(req)
	if err != nil {
		o.detail = err.Error()
		return o
	}
	defer resp.Body.Close()
	o.endpoint = resp.Header.Get("X-Kvroute-Endpoint")
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		o.detail = fmt.Sprintf("status %d: %s", resp.StatusCode, b)
		return o
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if sc.Text() == "data: [DONE]" {
			o.ok = true
		}
	}
	if err := sc.Err(); err != nil {
		o.ok, o.detail = false, "stream: "+err.Error()
	} else if !o.ok {
		o.detail = "stream ended without [DONE]"
	}
	return o
}
