package kube_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kvroute/kvroute/internal/app"
	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/discovery/kube"
	"github.com/kvroute/kvroute/internal/testkube"
)

// TestRouterDeletionCost runs a router with autoscale.pod_deletion_cost on, in front of two
// simulated engines found through EndpointSlices (a fake API server). p0 is alone at first and
// takes eight conversations, then p1 joins and takes (some of) the next four: p0's cache holds
// more that p1's does not, so p0 gets the higher pod-deletion-cost, the value /debug/endpoints
// and /metrics show; the model's load is exported.
func TestRouterDeletionCost(t *testing.T) {
	p0, p1 := startPod(t, "p0"), startPod(t, "p1")
	client := fake.NewClientset(p0.slice("ready"),
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p0", Namespace: namespace}},
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p1", Namespace: namespace}})
	r, api, admin := runRouter(t, client, `
auth: {mode: none}
policy: {name: prefix-aware}
scrape: {interval: 100ms}
health: {interval: 1h, warm_up: 0s}
server: {endpoint_header: X-Kvroute-Endpoint}
discovery:
  kubernetes:
    - {service: vllm, port_name: http, kubeconfig: %q, endpoint: {engine: vllm, models: [m]}}
autoscale:
  window: 1s
  pod_deletion_cost: {enabled: true, interval: 1s, min_change: 0}
`)
	poolLen := func(n int) {
		t.Helper()
		for end := time.Now().Add(10 * time.Second); r.Pool().Len() < n; time.Sleep(2 * time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("pool has %d endpoints after 10s, want %d", r.Pool().Len(), n)
			}
		}
	}
	poolLen(1)

	// Conversations of long private histories: each stays where it started.
	hc := &http.Client{Timeout: 30 * time.Second}
	on := map[string]int{}
	for i := range 12 {
		if i == 8 {
			if _, err := client.DiscoveryV1().EndpointSlices(namespace).Create(context.Background(), p1.slice("ready"), metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			poolLen(2)
		}
		history := strings.Repeat(fmt.Sprintf("conversation %d remembers this line. ", i), 60)
		for turn := range 2 {
			o := send(hc, api.URL, fmt.Sprintf("c%d-%d", i, turn), fmt.Sprintf(`{"model":"m","stream":true,"max_tokens":4,"messages":[{"role":"user","content":%q},{"role":"user","content":"turn %d"}]}`, history, turn))
			if !o.ok {
				t.Fatalf("request c%d-%d: %s", i, turn, o.detail)
			}
			on[o.endpoint]++
		}
	}
	richer, poorer := p0, p1
	if on[p1.url] == 0 {
		t.Fatalf("p1 took no request after it joined: the test cannot compare the pods (%v)", on)
	}

	// The pods' annotations follow, within a few passes.
	cost := func(p *simPod) int {
		got, err := client.CoreV1().Pods(namespace).Get(context.Background(), p.name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		v := got.Annotations[kube.DeletionCostAnnotation]
		if v == "" {
			return -1
		}
		n, err := strconv.Atoi(v)
		if err != nil {
			t.Fatalf("pod %s: annotation %q is not an integer", p.name, v)
		}
		return n
	}
	end := time.Now().Add(10 * time.Second)
	for cost(richer) <= 0 || cost(poorer) < 0 {
		if time.Now().After(end) {
			t.Fatalf("after 10s: pod-deletion-cost %s %d, %s %d; want both written, the richer above 0", richer.name, cost(richer), poorer.name, cost(poorer))
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("requests: %s %d, %s %d; pod-deletion-cost %d, %d", richer.name, on[richer.url], poorer.name, on[poorer.url], cost(richer), cost(poorer))
	if cost(richer) <= cost(poorer) {
		t.Errorf("pod-deletion-cost: %s (%d requests) %d, %s (%d requests) %d; want the one holding more alone higher",
			richer.name, on[richer.url], cost(richer), poorer.name, on[poorer.url], cost(poorer))
	}

	// /debug/endpoints shows the value.
	var dbg struct {
		Endpoints []app.EndpointInfo `json:"endpoints"`
	}
	get(t, admin.URL+"/debug/endpoints", &dbg)
	for _, e := range dbg.Endpoints {
		if e.CacheValueTokens == nil || (e.Name == richer.url && *e.CacheValueTokens <= 0) {
			t.Errorf("/debug/endpoints %s: cache_value_tokens %v, want set (above 0 on the richer pod)", e.Name, e.CacheValueTokens)
		}
	}
	// /metrics: each scrape samples the engines; two of them make the model's load.
	var text string
	for end := time.Now().Add(10 * time.Second); !strings.Contains(text, `kvroute_model_load{model="m"}`); time.Sleep(150 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("no kvroute_model_load after 10s of scrapes:\n%s", grepLines(text, "kvroute_model_", "kvroute_endpoint_cache_value"))
		}
		text = getText(t, admin.URL+"/metrics")
	}
	for _, want := range []string{`kvroute_model_saturation{model="m"}`, `kvroute_model_prefill_demand_tokens_per_second{model="m"}`,
		`kvroute_endpoint_cache_value_tokens{endpoint="` + richer.url + `"}`} {
		if !strings.Contains(text, want) {
			t.Errorf("/metrics lacks %s:\n%s", want, grepLines(text, "kvroute_model_", "kvroute_endpoint_cache_value"))
		}
	}
}

// runRouter parses cfg (a config whose %q is the kubeconfig's path) and runs a router on it with
// client for its Kubernetes API, its API and admin handlers served, until the test ends.
func runRouter(t *testing.T, client kube.Client, cfg string) (r *app.Router, api, admin *httptest.Server) {
	t.Helper()
	// The router's kubeconfig names an API server nobody listens on: client replaces it.
	kc := testkube.Kubeconfig(t, "inference")
	c, err := config.Parse(fmt.Appendf(nil, cfg, kc))
	if err != nil {
		t.Fatal(err)
	}
	r, err = app.NewRouter(c, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	r.KubeClient = client
	ctx, cancel := context.WithCancel(context.Background())
	runDone := make(chan error, 1)
	go func() { runDone <- r.Run(ctx) }()
	api, admin = httptest.NewServer(r.Handler()), httptest.NewServer(r.AdminHandler())
	t.Cleanup(func() {
		api.Close()
		admin.Close()
		cancel()
		if err := <-runDone; err != nil {
			t.Errorf("router Run: %v", err)
		}
		r.Close()
	})
	return r, api, admin
}

func getText(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func get(t *testing.T, url string, v any) {
	t.Helper()
	if err := json.Unmarshal([]byte(getText(t, url)), v); err != nil {
		t.Fatalf("%s: %v", url, err)
	}
}

func grepLines(text string, prefixes ...string) string {
	var out []string
	for l := range strings.SplitSeq(text, "\n") {
		for _, p := range prefixes {
			if strings.HasPrefix(l, p) {
				out = append(out, l)
			}
		}
	}
	return strings.Join(out, "\n")
}
