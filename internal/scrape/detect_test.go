package scrape

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/testlog"
)

// answer is one canned response of a mimicked engine.
type answer struct {
	code int
	body string
}

// mimic is an httptest server that answers like one engine kind, on the paths that kind has
// (everything else is 404, as the engines answer), and counts the requests per path. Its
// answers can be swapped mid-test (an engine restarted as another).
type mimic struct {
	srv *httptest.Server

	mu      sync.Mutex
	answers map[string]answer
	hits    map[string]int
}

func newMimic(t *testing.T, answers map[string]answer) *mimic {
	t.Helper()
	m := &mimic{answers: answers, hits: map[string]int{}}
	m.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.mu.Lock()
		a, ok := m.answers[r.URL.Path]
		m.hits[r.URL.Path]++
		m.mu.Unlock()
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.WriteHeader(a.code)
		_, _ = w.Write([]byte(a.body))
	}))
	t.Cleanup(m.srv.Close)
	return m
}

func (m *mimic) set(answers map[string]answer) {
	m.mu.Lock()
	m.answers = answers
	m.mu.Unlock()
}

func (m *mimic) count(path string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.hits[path]
}

func fixture(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// Engines as they answer (REFERENCE.md section 4 and each engine's server code): vLLM always
// exports /metrics; SGLang and llama.cpp only with metrics on; ollama has /api/version and
// /v1/models (owned_by its namespace, "library") and neither /health nor /metrics.
func ollamaAnswers() map[string]answer {
	return map[string]answer{
		"/api/version": {200, `{"version":"0.17.4"}`},
		"/v1/models":   {200, `{"object":"list","data":[{"id":"tiny:latest","object":"model","created":1,"owned_by":"library"}]}`},
		"/":            {200, "Ollama is running"},
	}
}

func llamacppAnswers(metrics string) map[string]answer {
	a := map[string]answer{
		"/health":    {200, `{"status":"ok"}`},
		"/v1/models": {200, `{"object":"list","data":[{"id":"tiny.gguf","object":"model","created":1,"owned_by":"llamacpp","meta":{}}]}`},
	}
	if metrics != "" {
		a["/metrics"] = answer{200, metrics}
	}
	return a
}

func TestDetect_Engines(t *testing.T) {
	vllmMetrics, tgiMetrics, sglangMetrics := fixture(t, "vllm.txt"), fixture(t, "tgi.txt"), fixture(t, "sglang.txt")
	cases := []struct {
		name     string
		answers  map[string]answer
		want     string
		evidence string // a part of the evidence
	}{
		{"vllm", map[string]answer{
			"/metrics":   {200, vllmMetrics},
			"/health":    {200, ""},
			"/v1/models": {200, `{"object":"list","data":[{"id":"m","object":"model","owned_by":"vllm"}]}`},
		}, "vllm", "vllm:*"},
		{"vllm with /metrics behind a proxy that hides it", map[string]answer{
			"/health":    {200, ""},
			"/v1/models": {200, `{"object":"list","data":[{"id":"m","object":"model","owned_by":"vllm"}]}`},
		}, "vllm", `owned_by "vllm"`},
		{"sglang with metrics", map[string]answer{"/metrics": {200, sglangMetrics}, "/health": {200, ""}}, "sglang", "sglang:*"},
		{"sglang without metrics", map[string]answer{
			"/health":    {200, ""},
			"/v1/models": {200, `{"object":"list","data":[{"id":"m","object":"model","owned_by":"sglang"}]}`},
		}, "sglang", `owned_by "sglang"`},
		{"tgi", map[string]answer{"/metrics": {200, tgiMetrics}, "/health": {200, ""}}, "tgi", "tgi_*"},
		{"llama.cpp with --metrics", llamacppAnswers(fixture(t, "llamacpp.txt")), "llamacpp", "llamacpp:*"},
		{"llama.cpp without --metrics", llamacppAnswers(""), "llamacpp", `{"status":"ok"}`},
		{"llama.cpp loading its model", map[string]answer{
			"/health":    {503, `{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}`},
			"/v1/models": {503, `{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}`},
		}, "llamacpp", "Loading model"},
		{"ollama", ollamaAnswers(), "ollama", `version "0.17.4"`},
		{"a generic OpenAI server", map[string]answer{
			"/v1/models": {200, `{"object":"list","data":[{"id":"gpt-x","object":"model","owned_by":"openai"}]}`},
		}, "openai", "model list"},
		{"an OpenAI server with no models yet", map[string]answer{"/v1/models": {200, `{"object":"list","data":[]}`}}, "openai", "model list"},
		{"/metrics of some other program", map[string]answer{
			"/metrics":   {200, "# TYPE go_goroutines gauge\ngo_goroutines 7\n"},
			"/v1/models": {200, `{"object":"list","data":[]}`},
		}, "openai", "model list"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := newMimic(t, c.answers)
			pr := New(endpoint.NewPool(), m.srv.Client(), Options{}, nil)
			d, err := pr.Detect(context.Background(), m.srv.URL)
			if err != nil {
				t.Fatalf("Detect: %v", err)
			}
			if d.Kind != c.want || !strings.Contains(d.Evidence, c.evidence) {
				t.Errorf("Detect = %+v, want kind %s, evidence with %q", d, c.want, c.evidence)
			}
		})
	}
}

func TestDetect_NothingDecides(t *testing.T) {
	for name, answers := range map[string]map[string]answer{
		"404 everywhere":          {},
		"HTML on every path":      {"/metrics": {200, "<html>"}, "/api/version": {200, "<html>"}, "/health": {200, "<html>"}, "/v1/models": {200, "<html>"}},
		"JSON without the fields": {"/api/version": {200, `{"v":1}`}, "/v1/models": {200, `{"models":[]}`}},
	} {
		t.Run(name, func(t *testing.T) {
			m := newMimic(t, answers)
			pr := New(endpoint.NewPool(), m.srv.Client(), Options{}, nil)
			d, err := pr.Detect(context.Background(), m.srv.URL)
			if err == nil {
				t.Fatalf("Detect = %+v, want an error", d)
			}
			for _, path := range []string{"/api/version", "/health", "/v1/models"} {
				if !strings.Contains(err.Error(), path) {
					t.Errorf("error %q does not say what %s answered", err, path)
				}
			}
		})
	}
}

func TestProber_AutoDetectsOllama(t *testing.T) {
	m := newMimic(t, ollamaAnswers())
	pool, ep := onePool(t, endpoint.Spec{Name: m.srv.URL, Engine: Auto, MetricsPath: "/metrics"})
	pr := New(pool, m.srv.Client(), Options{}, nil)
	if err := pr.Check(context.Background(), ep); err != nil {
		t.Fatalf("check: %v", err)
	}
	if !ep.Healthy() || ep.Kind() != "ollama" || ep.Engine != Auto {
		t.Fatalf("healthy %v kind %q engine %q, want healthy, ollama, auto", ep.Healthy(), ep.Kind(), ep.Engine)
	}
	if d := pr.Status(ep).Detected; d == nil || d.Kind != "ollama" {
		t.Errorf("status detected = %+v, want ollama", d)
	}
	// Detected once; later checks use ollama's health path and probe nothing else.
	before := m.count("/metrics")
	for range 3 {
		if err := pr.Check(context.Background(), ep); err != nil {
			t.Fatal(err)
		}
	}
	if got := m.count("/metrics"); got != before {
		t.Errorf("/metrics asked %d more times after detection, want 0", got-before)
	}
	if got := m.count("/api/version"); got != 1+1+3 {
		t.Errorf("/api/version asked %d times, want 5 (detection, then every check)", got)
	}
}

func TestProber_AutoUndecidedIsUnhealthy(t *testing.T) {
	m := newMimic(t, map[string]answer{})
	pool, ep := onePool(t, endpoint.Spec{Name: m.srv.URL, Engine: Auto})
	pr := New(pool, m.srv.Client(), Options{}, nil)
	err := pr.Check(context.Background(), ep)
	if err == nil || !strings.Contains(err.Error(), "detect the engine kind") || ep.Healthy() || ep.Kind() != Auto {
		t.Fatalf("err %v healthy %v kind %q: want a detection error, unhealthy, still auto", err, ep.Healthy(), ep.Kind())
	}
	// The engine comes up: the next check detects it.
	m.set(llamacppAnswers(""))
	if err := pr.Check(context.Background(), ep); err != nil || !ep.Healthy() || ep.Kind() != "llamacpp" {
		t.Fatalf("err %v healthy %v kind %q: want healthy llamacpp", err, ep.Healthy(), ep.Kind())
	}
}

// The quick start with nothing listening (kvroute serve --endpoint URL, engine auto): the
// endpoint starts out of rotation (its cache salt waits for the kind), so its failed checks
// change no health, and before, nothing was logged at all: only /debug/endpoints said why.
// Now the first failure of the streak is said once, as a warning naming the endpoint and the
// error, and the detection that ends it says how many checks failed before it. An auto
// endpoint that starts healthy (its cache salt given) is said once too, not twice.
func TestProber_AutoUndetectedSaidOncePerStreak(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// Nothing listens at closed (connection refused); m answers 404 to everything (nothing
	// tells the kind).
	closed := "http://" + ln.Addr().String()
	ln.Close()
	m := newMimic(t, map[string]answer{})
	for _, tt := range []struct {
		name     string
		url      string
		saltAuto bool
		want     string // in the warning's error
	}{
		{"refused", closed, true, "connection refused"},
		{"undecided", m.srv.URL, true, "no answer tells the engine kind"},
		{"salt given", m.srv.URL, false, "no answer tells the engine kind"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m.set(map[string]answer{})
			pool, ep := onePool(t, endpoint.Spec{Name: tt.url, Engine: Auto, CacheSaltAuto: tt.saltAuto, MetricsPath: "/metrics"})
			var log testlog.Buffer
			pr := New(pool, m.srv.Client(), Options{}, slog.New(slog.NewJSONHandler(&log, nil)))
			ctx := context.Background()
			for i := range 3 {
				if err := pr.Check(ctx, ep); err == nil || !strings.Contains(err.Error(), "detect the engine kind") {
					t.Fatalf("check %d: err = %v, want a detection error", i, err)
				}
			}
			if ep.Healthy() || pr.Status(ep).ConsecutiveFailures != 3 {
				t.Fatalf("healthy %v, %d failures: want out, 3", ep.Healthy(), pr.Status(ep).ConsecutiveFailures)
			}
			var said []map[string]any
			for _, l := range log.JSONLines(t) {
				if l["level"] == "WARN" {
					said = append(said, l)
				}
			}
			if len(said) != 1 || said[0]["msg"] != "endpoint unhealthy" || said[0]["endpoint"] != tt.url ||
				said[0]["consecutive_failures"] != 1.0 || !strings.Contains(fmt.Sprint(said[0]["err"]), tt.want) {
				t.Fatalf("warnings %v: want one endpoint unhealthy naming %s and an error with %q", said, tt.url, tt.want)
			}
			if tt.url == closed {
				return
			}
			// The engine comes up: detected, and back, each said once.
			m.set(llamacppAnswers(""))
			if err := pr.Check(ctx, ep); err != nil || !ep.Healthy() {
				t.Fatalf("err %v healthy %v: want the engine detected and healthy", err, ep.Healthy())
			}
			var detected []map[string]any
			for _, l := range log.JSONLines(t) {
				if l["msg"] == "engine kind detected" {
					detected = append(detected, l)
				}
			}
			if len(detected) != 1 || detected[0]["after_failed_checks"] != 3.0 || detected[0]["engine"] != "llamacpp" {
				t.Errorf("detection lines %v: want one, of llamacpp, after 3 failed checks", detected)
			}
			if got := log.Count(`"msg":"endpoint healthy"`); got != 1 {
				t.Errorf("endpoint healthy said %d times, want 1", got)
			}
			if got := len(warnings(t, &log)); got != 1 {
				t.Errorf("%d warnings in all, want 1", got)
			}
		})
	}
}

func TestProber_AutoFollowsAnEngineRestartedAsAnother(t *testing.T) {
	m := newMimic(t, llamacppAnswers(""))
	pool, ep := onePool(t, endpoint.Spec{Name: m.srv.URL, Engine: Auto})
	pr := New(pool, m.srv.Client(), Options{UnhealthyThreshold: 1}, nil)
	if err := pr.Check(context.Background(), ep); err != nil || ep.Kind() != "llamacpp" {
		t.Fatalf("err %v kind %q, want llamacpp", err, ep.Kind())
	}
	m.set(ollamaAnswers())
	if err := pr.Check(context.Background(), ep); err == nil {
		t.Fatal("/health is gone: the check should fail")
	}
	if ep.Kind() != "ollama" {
		t.Fatalf("kind %q after the 404, want ollama (detected again)", ep.Kind())
	}
	if err := pr.Check(context.Background(), ep); err != nil || !ep.Healthy() {
		t.Fatalf("err %v healthy %v: the next check should use /api/version and pass", err, ep.Healthy())
	}
}

// The quick start: kvroute serve --endpoint URL with engine vllm in front of ollama.
func TestProber_WrongKindSaysWhatItLooksLike(t *testing.T) {
	m := newMimic(t, ollamaAnswers())
	pool, ep := onePool(t, endpoint.Spec{Name: m.srv.URL, Engine: "vllm", MetricsPath: "/metrics"})
	pr := New(pool, m.srv.Client(), Options{UnhealthyThreshold: 1}, nil)
	for i := range 3 {
		err := pr.Check(context.Background(), ep)
		if err == nil || !strings.Contains(err.Error(), "status 404") ||
			!strings.Contains(err.Error(), "looks like ollama, not vllm") || !strings.Contains(err.Error(), "set engine: ollama") {
			t.Fatalf("check %d: err = %v, want the 404 and the hint", i, err)
		}
	}
	if ep.Healthy() || ep.Kind() != "vllm" {
		t.Errorf("healthy %v kind %q: a named kind stays as configured (and unhealthy)", ep.Healthy(), ep.Kind())
	}
	st := pr.Status(ep)
	if st.Detected == nil || st.Detected.Kind != "ollama" || !strings.Contains(st.LastCheckError, "looks like ollama") {
		t.Errorf("status = %+v, want detected ollama and the hint in the error", st)
	}
	if got := m.count("/api/version"); got != 1 {
		t.Errorf("/api/version asked %d times in one failure streak, want 1", got)
	}
}

func TestProber_NoHintForOverriddenPathOrServerErrors(t *testing.T) {
	m := newMimic(t, ollamaAnswers())
	pool, ep := onePool(t, endpoint.Spec{Name: m.srv.URL, Engine: "vllm", HealthPath: "/ping"})
	pr := New(pool, m.srv.Client(), Options{}, nil)
	if err := pr.Check(context.Background(), ep); err == nil || strings.Contains(err.Error(), "looks like") {
		t.Errorf("overridden health path: err = %v, want the plain 404", err)
	}
	m2 := newMimic(t, map[string]answer{"/health": {500, "boom"}, "/api/version": {200, `{"version":"1"}`}})
	pool2, ep2 := onePool(t, endpoint.Spec{Name: m2.srv.URL, Engine: "vllm"})
	pr2 := New(pool2, m2.srv.Client(), Options{}, nil)
	if err := pr2.Check(context.Background(), ep2); err == nil || strings.Contains(err.Error(), "looks like") {
		t.Errorf("a 500: err = %v, want the plain error", err)
	}
	if m2.count("/api/version") != 0 {
		t.Error("a 5xx health check should not start detection")
	}
	// The right kind answering 4xx on its health path is not told it looks like itself.
	m3 := newMimic(t, map[string]answer{"/metrics": {200, fixture(t, "vllm.txt")}})
	pool3, ep3 := onePool(t, endpoint.Spec{Name: m3.srv.URL, Engine: "vllm"})
	pr3 := New(pool3, m3.srv.Client(), Options{}, nil)
	if err := pr3.Check(context.Background(), ep3); err == nil || strings.Contains(err.Error(), "looks like") {
		t.Errorf("vllm without /health: err = %v, want the plain 404", err)
	}
}

// An auto endpoint's scrape loop waits for detection, then scrapes with the kind's names.
func TestProber_RunScrapesAutoOnceDetected(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	m := newMimic(t, llamacppAnswers(fixture(t, "llamacpp.txt")))
	m2 := newMimic(t, ollamaAnswers())
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	pool := endpoint.NewPool()
	if _, err := pool.Update([]endpoint.Spec{
		{Name: m.srv.URL, Engine: Auto, MetricsPath: "/metrics"},
		{Name: m2.srv.URL, Engine: Auto, MetricsPath: "/metrics"},
	}); err != nil {
		t.Fatal(err)
	}
	ep, ep2 := pool.ByName(m.srv.URL), pool.ByName(m2.srv.URL)
	pr := New(pool, client, Options{HealthInterval: 10 * time.Millisecond, ScrapeInterval: 10 * time.Millisecond}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- pr.Run(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for ep.Snapshot() == nil || ep2.Kind() != "ollama" || !ep2.Healthy() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out: llama.cpp snapshot %+v, ollama kind %q healthy %v", ep.Snapshot(), ep2.Kind(), ep2.Healthy())
		}
		time.Sleep(2 * time.Millisecond) // polling with a deadline
	}
	if s := ep.Snapshot(); s.Running != 2 {
		t.Errorf("llama.cpp running = %d, want the fixture's 2", s.Running)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
	// ollama has no metrics: after detection nothing asks for them again.
	if got := m2.count("/metrics"); got != 1 {
		t.Errorf("ollama's /metrics asked %d times, want once (detection)", got)
	}
	if ep2.Snapshot() != nil {
		t.Error("ollama has no metrics, yet a snapshot was stored")
	}
	m.srv.Close() // before goleak looks (t.Cleanup would run after it)
	m2.srv.Close()
	client.CloseIdleConnections()
}

// warnings returns the messages of the warning lines in log.
func warnings(t *testing.T, log *testlog.Buffer) []string {
	t.Helper()
	var out []string
	for _, l := range log.JSONLines(t) {
		if l["level"] == "WARN" {
			out = append(out, l["msg"].(string))
		}
	}
	return out
}

// The QA's case: engine sglang (tgi, llamacpp) in front of kvroute sim, which speaks vLLM. Its
// health check passes (all use GET /health), so only the scrapes say it: once, as a warning
// naming the kind it looks like and the fix, and in every error of the streak.
func TestProber_ScrapeOfAnotherKindSaysWhatItLooksLike(t *testing.T) {
	m := newMimic(t, map[string]answer{"/health": {200, ""}, "/metrics": {200, fixture(t, "vllm.txt")}})
	pool, ep := onePool(t, endpoint.Spec{Name: m.srv.URL, Engine: "sglang", MetricsPath: "/metrics"})
	var log testlog.Buffer
	pr := New(pool, m.srv.Client(), Options{}, slog.New(slog.NewJSONHandler(&log, &slog.HandlerOptions{Level: slog.LevelDebug})))
	ctx := context.Background()
	if err := pr.Check(ctx, ep); err != nil || !ep.Healthy() {
		t.Fatalf("check: %v, healthy %v: the health check passes", err, ep.Healthy())
	}
	for i := range 3 {
		err := pr.Scrape(ctx, ep)
		if err == nil || !strings.Contains(err.Error(), "none of the families") ||
			!strings.Contains(err.Error(), "looks like vllm, not sglang") || !strings.Contains(err.Error(), "set engine: vllm (--engine vllm), or auto") {
			t.Fatalf("scrape %d: err = %v, want the refusal and the hint", i, err)
		}
	}
	if diff := cmp.Diff([]string{"endpoint's engine kind looks wrong: its metrics are not read (said once while the scrapes fail; /debug/endpoints shows the last error)"},
		warnings(t, &log)); diff != "" {
		t.Errorf("warnings (-want +got):\n%s", diff)
	}
	st := pr.Status(ep)
	if st.Detected == nil || st.Detected.Kind != "vllm" || !strings.Contains(st.LastScrapeError, "set engine: vllm") {
		t.Errorf("status = %+v, want detected vllm and the hint in last_scrape_error", st)
	}
	if got := m.count("/metrics"); got != 4 {
		t.Errorf("/metrics asked %d times, want 4: three scrapes and one detection in the streak", got)
	}
	if ep.Kind() != "sglang" {
		t.Errorf("kind %q: a named kind stays as configured", ep.Kind())
	}

	// The engine is put right: the streak ends (said at info), and a new one is said again.
	m.set(map[string]answer{"/health": {200, ""}, "/metrics": {200, fixture(t, "sglang.txt")}})
	if err := pr.Scrape(ctx, ep); err != nil {
		t.Fatalf("scrape of an sglang page: %v", err)
	}
	if !strings.Contains(log.String(), "the endpoint's metrics are scraped again") {
		t.Error("the end of the streak is not said")
	}
	m.set(map[string]answer{"/health": {200, ""}, "/metrics": {500, "boom"}})
	if err := pr.Scrape(ctx, ep); err == nil || strings.Contains(err.Error(), "looks like") {
		t.Errorf("a 500: err = %v, want the plain error", err)
	}
	if got := len(warnings(t, &log)); got != 2 {
		t.Errorf("%d warnings, want 2: one per streak", got)
	}
}

// A streak of failed scrapes is said at its start, once more when it has lasted a minute, and
// not at all before the first health check or while the endpoint is unhealthy (its health
// checks say so).
func TestProber_ScrapeFailuresSaidOncePerStreak(t *testing.T) {
	m := newMimic(t, map[string]answer{"/health": {200, ""}, "/metrics": {500, "boom"}})
	pool, ep := onePool(t, endpoint.Spec{Name: m.srv.URL, Engine: "vllm", MetricsPath: "/metrics"})
	var log testlog.Buffer
	now := time.Unix(1000, 0)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	pr := New(pool, m.srv.Client(), Options{Now: clock}, slog.New(slog.NewJSONHandler(&log, &slog.HandlerOptions{Level: slog.LevelDebug})))
	ctx := context.Background()

	_ = pr.Scrape(ctx, ep) // before the first check: at debug
	if err := pr.Check(ctx, ep); err != nil {
		t.Fatal(err)
	}
	ep.SetHealthy(false)
	for range 3 {
		_ = pr.Scrape(ctx, ep)
	}
	if w := warnings(t, &log); len(w) != 0 {
		t.Fatalf("warnings %q while the endpoint is unhealthy, want none", w)
	}
	ep.SetHealthy(true)
	for range 10 {
		if err := pr.Scrape(ctx, ep); err == nil || !strings.Contains(err.Error(), "status 500") {
			t.Fatalf("err = %v, want the 500", err)
		}
		advance(time.Second)
	}
	if got := len(warnings(t, &log)); got != 1 {
		t.Fatalf("%d warnings after 10 failed scrapes, want 1", got)
	}
	advance(time.Minute)
	for range 10 {
		_ = pr.Scrape(ctx, ep)
		advance(time.Second)
	}
	want := []string{
		"scraping the endpoint's metrics failed: policies go on with its last snapshot, aging (said once while the scrapes fail; /debug/endpoints shows the last error)",
		"scraping the endpoint's metrics still fails",
	}
	if diff := cmp.Diff(want, warnings(t, &log)); diff != "" {
		t.Errorf("warnings (-want +got):\n%s", diff)
	}
	if got := log.Count(`"msg":"scrape failed"`); got != 22 {
		t.Errorf("%d failures at debug, want 22 (24 failures, 2 said as warnings)", got)
	}
	if m.count("/api/version") != 0 {
		t.Error("a scrape that failed for another reason than the families should not start detection")
	}
}

// An endpoint whose config names its models is asked for its list too (on first contact, then
// every modelsEvery), and a configured model the engine does not list is said once; routing
// follows the config all the same.
func TestProber_ConfiguredModelsComparedWithTheEngines(t *testing.T) {
	m := newMimic(t, map[string]answer{
		"/health":    {200, ""},
		"/v1/models": {200, `{"object":"list","data":[{"id":"Qwen/Qwen3-8B","object":"model","owned_by":"vllm"}]}`},
	})
	pool, ep := onePool(t, endpoint.Spec{Name: m.srv.URL, Engine: "vllm", Models: []string{"qwen3-8b"}})
	var log testlog.Buffer
	now := time.Unix(1000, 0)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	pr := New(pool, m.srv.Client(), Options{Now: clock}, slog.New(slog.NewJSONHandler(&log, nil)))
	ctx := context.Background()
	for range 3 {
		if err := pr.Check(ctx, ep); err != nil {
			t.Fatal(err)
		}
	}
	if got := m.count("/v1/models"); got != 1 {
		t.Errorf("/v1/models asked %d times in three checks within %v, want 1", got, modelsEvery)
	}
	advance(modelsEvery)
	if err := pr.Check(ctx, ep); err != nil {
		t.Fatal(err)
	}
	if got := m.count("/v1/models"); got != 2 {
		t.Errorf("/v1/models asked %d times after %v, want 2", got, modelsEvery)
	}
	w := warnings(t, &log)
	if len(w) != 1 || !strings.Contains(w[0], "does not list a model that endpoints[].models (--model) names") ||
		!strings.Contains(log.String(), `"missing":["qwen3-8b"]`) || !strings.Contains(log.String(), `"engine_lists":["Qwen/Qwen3-8B"]`) {
		t.Errorf("warnings %q, log %s: want one naming the model and the engine's list", w, log.String())
	}
	if !ep.Serves("qwen3-8b") || ep.Serves("Qwen/Qwen3-8B") || ep.ServedModels() != nil {
		t.Error("routing changed on the engine's list: it follows the config")
	}
	if diff := cmp.Diff([]string{"qwen3-8b"}, pool.Models()); diff != "" {
		t.Errorf("pool models (-want +got):\n%s", diff)
	}

	// The engine restarted with the configured name: said once at info.
	m.set(map[string]answer{
		"/health":    {200, ""},
		"/v1/models": {200, `{"object":"list","data":[{"id":"qwen3-8b","object":"model","owned_by":"vllm"}]}`},
	})
	advance(modelsEvery)
	if err := pr.Check(ctx, ep); err != nil {
		t.Fatal(err)
	}
	if got := log.Count("the engine lists every model that endpoints[].models (--model) names"); got != 1 {
		t.Errorf("the fix said %d times, want 1", got)
	}
	if got := len(warnings(t, &log)); got != 1 {
		t.Errorf("%d warnings, want still 1", got)
	}
}
