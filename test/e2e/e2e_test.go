package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/kvroute/kvroute/internal/app"
	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/simserver"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const model = "e2e-model"

// stack is a simulated fleet with the router in front.
type stack struct {
	fleet  *simserver.Fleet
	router *app.Router
	api    string // router base URL
	admin  string
}

// startStack starts n simulated instances and a router whose endpoints are extra (listed
// first) and then the instances.
func startStack(t *testing.T, n int, profile, policyName string, extra ...string) *stack {
	t.Helper()
	return startStackOpts(t, n, profile, policyName, 0, extra...)
}

// startStackOpts is startStack with the simulator's stream interval.
func startStackOpts(t *testing.T, n int, profile, policyName string, streamInterval time.Duration, extra ...string) *stack {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	opts := simserver.Options{Profile: profile, Model: model, DefaultMaxTokens: 16, StreamInterval: streamInterval}
	fleet, err := simserver.StartFleet(ctx, opts, n, "127.0.0.1", 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fleet.Close() })
	var y strings.Builder
	fmt.Fprintf(&y, "policy: {name: %s}\nhealth: {interval: 1h, unhealthy_threshold: 5}\nscrape: {interval: 100ms}\nserver: {shutdown_timeout: 5s}\nendpoints:\n", policyName)
	for _, u := range append(extra, fleet.URLs()...) {
		fmt.Fprintf(&y, "  - {url: %q, models: [%s], engine: vllm}\n", u, model)
	}
	cfg, err := config.Parse([]byte(y.String()))
	if err != nil {
		t.Fatal(err)
	}
	r, api, admin := startRouter(t, cfg)
	return &stack{fleet: fleet, router: r, api: api, admin: admin}
}

// startRouter builds a router from cfg as kvroute serve does (logs discarded) and serves it
// with its admin listener, as serveRouter does.
func startRouter(t *testing.T, cfg *config.Config) (r *app.Router, api, admin string) {
	t.Helper()
	r, err := app.NewRouter(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	api, admin = serveRouter(t, r, true)
	return r, api, admin
}

// serveRouter runs r on loopback until the test ends (then checks that it drained and
// stopped) and returns its API base URL and, withAdmin, its admin base URL ("" otherwise).
func serveRouter(t *testing.T, r *app.Router, withAdmin bool) (api, admin string) {
	t.Helper()
	apiLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var adminLn net.Listener
	if withAdmin {
		if adminLn, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			apiLn.Close()
			t.Fatal(err)
		}
		admin = "http://" + adminLn.Addr().String()
	}
	sctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Serve(sctx, apiLn, adminLn) }()
	t.Cleanup(func() {
		stop()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("router Serve: %v", err)
			}
		case <-time.After(20 * time.Second):
			t.Error("router did not stop")
		}
	})
	return "http://" + apiLn.Addr().String(), admin
}

// needNode skips unless node and the npm client are installed (make test runs npm ci here).
func needNode(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("node"); err != nil {
		t.Skip("node not installed")
	}
	if _, err := os.Stat(filepath.Join("node_modules", "openai")); err != nil {
		t.Skip("test/e2e/node_modules missing: run make test with npm installed, or npm ci in test/e2e")
	}
}

// node runs one client.mjs scenario against the stack and decodes what it printed.
func (s *stack) node(t *testing.T, scenario string, out any) {
	t.Helper()
	res := s.nodeAll(t, scenario)
	if err := json.Unmarshal(res[scenario], out); err != nil {
		t.Fatalf("node %s printed %s: %v", scenario, res[scenario], err)
	}
}

// nodeAll runs client.mjs scenarios in one node process (node takes a while to start) and
// returns what each printed.
func (s *stack) nodeAll(t *testing.T, scenarios ...string) map[string]json.RawMessage {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", append([]string{"client.mjs"}, scenarios...)...)
	cmd.Env = append(os.Environ(), "KVROUTE_BASE_URL="+s.api+"/v1", "KVROUTE_MODEL="+model)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	b, err := cmd.Output()
	if err != nil {
		t.Fatalf("node %v: %v\nstdout: %s\nstderr: %s", scenarios, err, b, stderr.String())
	}
	res := map[string]json.RawMessage{}
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatalf("node %v printed %q: %v", scenarios, b, err)
	}
	return res
}

type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
}

type clientError struct {
	Error   string `json:"error"`
	Status  int    `json:"status"`
	Message string `json:"message"`
}

func TestOpenAIClient(t *testing.T) {
	needNode(t)
	s := startStack(t, 2, "instant", "least-request")
	res := s.nodeAll(t, "chat", "stream", "streamUsage", "completion", "models", "badJSON", "badRequest", "unknownModel")
	decode := func(name string, v any) {
		t.Helper()
		if err := json.Unmarshal(res[name], v); err != nil {
			t.Fatalf("%s: %s: %v", name, res[name], err)
		}
	}

	var chat struct {
		Content string `json:"content"`
		Usage   usage  `json:"usage"`
	}
	decode("chat", &chat)
	if chat.Content == "" || chat.Usage.PromptTokens == 0 || chat.Usage.CompletionTokens == 0 {
		t.Errorf("chat: %+v", chat)
	}

	var stream struct {
		Chunks      int    `json:"chunks"`
		Text        string `json:"text"`
		UsageChunks int    `json:"usageChunks"`
	}
	decode("stream", &stream)
	if stream.Chunks < 2 || stream.Text == "" || stream.UsageChunks != 0 {
		t.Errorf("stream: %+v, want chunks with text and no usage chunk (the client did not ask)", stream)
	}
	var su struct {
		Usage *usage `json:"usage"`
	}
	decode("streamUsage", &su)
	if su.Usage == nil || su.Usage.PromptTokens == 0 {
		t.Errorf("stream with include_usage: %+v", su)
	}

	var comp struct {
		Text  string `json:"text"`
		Usage usage  `json:"usage"`
	}
	decode("completion", &comp)
	if comp.Text == "" || comp.Usage.PromptTokens == 0 {
		t.Errorf("completion: %+v", comp)
	}

	var models struct {
		IDs []string `json:"ids"`
	}
	decode("models", &models)
	if len(models.IDs) != 1 || models.IDs[0] != model {
		t.Errorf("models: %v", models.IDs)
	}

	for _, tt := range []struct {
		scenario, class string
		status          int
	}{
		{"badJSON", "BadRequestError", 400},
		{"badRequest", "BadRequestError", 400},
		{"unknownModel", "NotFoundError", 404},
	} {
		var e clientError
		decode(tt.scenario, &e)
		if e.Error != tt.class || e.Status != tt.status {
			t.Errorf("%s: %+v, want %s %d", tt.scenario, e, tt.class, tt.status)
		}
	}
}

func TestFallbackWhenFirstRankedIsDown(t *testing.T) {
	needNode(t)
	// round-robin over two endpoints, the first of which is a server that has died (nothing
	// listens: connections are refused) while the health checks have not caught it yet: the
	// request that ranks it first must succeed through the second. A connection refused means
	// the engine never saw the request, so it is safe to send it elsewhere.
	checked := make(chan struct{}, 1)
	dying := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case checked <- struct{}{}:
		default:
		}
	}))
	down := dying.URL
	s := startStack(t, 1, "instant", "round-robin", down)
	select {
	case <-checked:
	case <-time.After(10 * time.Second):
		t.Fatal("no health check reached the endpoint")
	}
	// Once the router has recorded that first check as passed, the endpoint dies.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		ok := false
		for _, e := range s.router.Endpoints() {
			ok = ok || (e.Name == down && !e.Probe.LastCheck.IsZero() && e.Healthy)
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the router did not record a passing health check of the endpoint")
		}
	}
	dying.Close()
	// Two requests in one node process: round-robin ranks the dropping instance first for one.
	res := s.nodeAll(t, "chat", "chat2")
	for _, name := range []string{"chat", "chat2"} {
		var chat struct {
			Content string `json:"content"`
		}
		if err := json.Unmarshal(res[name], &chat); err != nil || chat.Content == "" {
			t.Errorf("%s through the fallback: %s (%v)", name, res[name], err)
		}
	}
	if m := metricsText(t, s.admin); !strings.Contains(m, `kvroute_retries_total{endpoint="`+down+`",reason="connect_error"} 1`) {
		t.Errorf("no retry counted for the endpoint that is down:\n%s", grep(m, "kvroute_retries"))
	}
}

func TestClientAbortFreesUpstream(t *testing.T) {
	needNode(t)
	// A real-speed profile: 4000 output tokens take far longer than the test.
	s := startStack(t, 1, "llama3-8b-h100-tp1", "least-request")
	var ab struct {
		Chunks  int  `json:"chunks"`
		Aborted bool `json:"aborted"`
	}
	s.node(t, "abort", &ab)
	if !ab.Aborted || ab.Chunks < 2 {
		t.Fatalf("abort: %+v", ab)
	}
	in := s.fleet.Instances()[0]
	ep := s.router.Pool().All()[0]
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) && (in.Stats().Running+in.Stats().Waiting > 0 || ep.InFlight() > 0) {
		time.Sleep(20 * time.Millisecond)
	}
	if st := in.Stats(); st.Running+st.Waiting > 0 || ep.InFlight() > 0 {
		t.Errorf("after the client aborted: engine running %d waiting %d, router in flight %d", st.Running, st.Waiting, ep.InFlight())
	}
}

func metricsText(t *testing.T, admin string) string {
	t.Helper()
	resp, err := http.Get(admin + "/metrics")
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

func grep(text, substr string) string {
	var out []string
	for l := range strings.SplitSeq(text, "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestPrefixAwareLearns sends conversations sharing a long system prompt through the
// prefix-aware policy and checks that the loop closes: the engines report cached tokens, the
// policy predicted hits, and its index is visible in the router's metrics.
// TestPrefixAwareLearnsFromEngineTTFTs sends answers that come whole ("stream": false), whose
// first tokens the router never sees, to engines that export vLLM's TTFT histogram: the
// scraped TTFTs (the instant profile's, near 0) calibrate the fleet's speed, and the TTFT
// /debug/explain predicts for a new prompt falls from the prior model's (69.7 ms) to near 0
// (1.1 ms; without the scraped TTFTs, 21.4 ms: the token scale learned meanwhile).
func TestPrefixAwareLearnsFromEngineTTFTs(t *testing.T) {
	s := startStack(t, 2, "instant", "prefix-aware")
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	post := func(url, body string) []byte {
		t.Helper()
		resp, err := client.Post(url, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			t.Fatalf("POST %s: status %d: %s", url, resp.StatusCode, b)
		}
		return b
	}
	chat := func(i int, stream bool) string {
		return fmt.Sprintf(`{"model":%q,"max_tokens":2,"stream":%v,"messages":[{"role":"user","content":"%s %d"}]}`,
			model, stream, strings.Repeat("a question about the weather in a city far away, ", 40), i)
	}
	predicted := func() float64 {
		t.Helper()
		var ex struct {
			Candidates []struct {
				PredictedTTFTms *float64 `json:"predicted_ttft_ms"`
			} `json:"candidates"`
		}
		b := post(s.admin+"/debug/explain", chat(-1, false))
		if err := json.Unmarshal(b, &ex); err != nil || len(ex.Candidates) != 2 || ex.Candidates[0].PredictedTTFTms == nil {
			t.Fatalf("/debug/explain: %s (%v)", b, err)
		}
		return *ex.Candidates[0].PredictedTTFTms
	}
	before := predicted()
	// Spread over several scrapes (100 ms apart): each window holds a few answers.
	for i := range 16 {
		post(s.api+"/v1/chat/completions", chat(i, false))
		time.Sleep(60 * time.Millisecond)
	}
	var after float64
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if after = predicted(); after < before/6 {
			break
		}
	}
	t.Logf("predicted TTFT of a new prompt: %.2f ms before, %.2f ms after", before, after)
	if after >= before/6 {
		t.Errorf("predicted TTFT of a new prompt %.2f ms before 16 whole answers, %.2f ms after; want under a sixth (the engines' TTFTs are near 0)", before, after)
	}
}

func TestPrefixAwareLearns(t *testing.T) {
	s := startStack(t, 4, "instant", "prefix-aware")
	sys := strings.Repeat("Answer as a careful librarian would. ", 60)
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	for i := range 12 {
		body := fmt.Sprintf(`{"model":%q,"max_tokens":2,"messages":[{"role":"system","content":%q},{"role":"user","content":"question number %d"}]}`, model, sys, i)
		resp, err := client.Post(s.api+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: status %d", i, resp.StatusCode)
		}
	}
	// value sums the samples of a metric (all its label sets).
	value := func(m, name string) float64 {
		var sum float64
		for l := range strings.SplitSeq(m, "\n") {
			if strings.HasPrefix(l, name+" ") || strings.HasPrefix(l, name+"{") {
				f := strings.Fields(l)
				var v float64
				fmt.Sscan(f[len(f)-1], &v)
				sum += v
			}
		}
		return sum
	}
	// The last request is counted once its response is written: poll with a deadline.
	var m string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if m = metricsText(t, s.admin); value(m, "kvroute_requests_total") == 12 {
			break
		}
	}
	for _, name := range []string{"kvroute_engine_cached_tokens_total", "kvroute_predicted_cached_tokens_total", "kvroute_index_entries"} {
		if value(m, name) <= 0 {
			t.Errorf("%s is %v, want > 0:\n%s", name, value(m, name), grep(m, "kvroute_"))
		}
	}
}
