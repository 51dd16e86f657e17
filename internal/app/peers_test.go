package app

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

const peerSecret = "0123456789abcdef0123456789abcdef"

// TestRouterPeers: two routers built from configs with a peers section share their routing:
// the other replays a request through one, its start and its end; /readyz waits for the warm
// start; /debug/peers shows whom each follows.
func TestRouterPeers(t *testing.T) {
	t.Setenv("KVROUTE_TEST_PEERS", peerSecret)
	eng := newFakeEngine(t)
	mk := func(name, seed string) *Router {
		static := ""
		if seed != "" {
			static = fmt.Sprintf(", static: [%q]", seed)
		}
		return routerFromYAML(t, fmt.Sprintf("scrape: {disabled: true}\nhealth: {interval: 1h}\nauth: {mode: none}\n"+
			"endpoints: [{url: %q, models: [m], engine: vllm}]\n"+
			"peers: {name: %s, listen: '127.0.0.1:0', gossip_listen: '127.0.0.1:0', secret_env: KVROUTE_TEST_PEERS, warm_start_timeout: 5s, batch_interval: 1ms%s}\n",
			eng.srv.URL, name, static))
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
	if st := b.peers.share.Stats(); st.Applied != 2 || st.Remote != 0 {
		t.Errorf("b applied %d events, %d remote in flight", st.Applied, st.Remote)
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
