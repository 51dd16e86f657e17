package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	pmodel "github.com/prometheus/common/model"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/simserver"
	"github.com/kvroute/kvroute/internal/tenant"
)

// The metrics tests' router: three instances, the third from a discovery file; alice is
// unlimited, bob may send one request a minute; passive_failures 1 ejects an endpoint at its
// first counted failure (a 503 here), for the ejection interval (30 s, longer than a test).
const metricsConfig = `listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
policy: {name: prefix-aware}
health: {interval: 1h, passive_failures: 1}
scrape: {interval: 250ms}
limits: {max_retries: 2}
server: {endpoint_header: X-Kvroute-Endpoint, shutdown_timeout: 5s}
discovery: {file: %q}
auth: {mode: api_key, secret_file: %q}
tenants:
  - {name: alice, api_keys: [%q]}
  - {name: bob, api_keys: [%q], limits: {requests_per_minute: 1}}
endpoints:
  - {url: %q, models: [%s], engine: vllm}
  - {url: %q, models: [%s], engine: vllm}
`

// writeMetricsConfig writes the router's config, discovery file and secret into a temporary
// directory for the three instances at urls, and returns the config's path.
func writeMetricsConfig(t *testing.T, urls []string) string {
	t.Helper()
	if len(urls) != 3 {
		t.Fatalf("%d instances, want 3", len(urls))
	}
	dir := t.TempDir()
	disc, secret, path := filepath.Join(dir, "endpoints.yaml"), filepath.Join(dir, "secret"), filepath.Join(dir, "kvroute.yaml")
	files := map[string]string{
		disc:   fmt.Sprintf("- {url: %q, models: [%s], engine: vllm}\n", urls[2], model),
		secret: tenantSecret,
		path: fmt.Sprintf(metricsConfig, disc, secret, tenant.HashKey("sk-alice"), tenant.HashKey("sk-bob"),
			urls[0], model, urls[1], model),
	}
	for name, content := range files {
		if err := os.WriteFile(name, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return path
}

// peeredConfigs returns two copies of the router config at path, each a replica of the other
// (peers: on loopback, the tenants' secret shared).
func peeredConfigs(t *testing.T, path string) [2]string {
	t.Helper()
	base, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	ports := freePorts(t, 2)
	secret := filepath.Join(filepath.Dir(path), "secret")
	var out [2]string
	for i, name := range []string{"a", "b"} {
		out[i] = filepath.Join(filepath.Dir(path), name+".yaml")
		peers := fmt.Sprintf("peers: {name: %s, listen: '127.0.0.1:0', gossip_listen: '127.0.0.1:%d', static: ['127.0.0.1:%d'], secret_file: %q, warm_start_timeout: 3s}\n",
			name, ports[i], ports[0], secret)
		if err := os.WriteFile(out[i], append(base, peers...), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// series is one series the first events must move from 0 to 1.
type series struct {
	name   string
	labels map[string]string
}

func (s series) String() string {
	var ls []string
	for _, k := range []string{"model", "tenant", "reason", "status", "result", "endpoint"} {
		if v, ok := s.labels[k]; ok {
			ls = append(ls, k+"="+strconv.Quote(v))
		}
	}
	return s.name + "{" + strings.Join(ls, ",") + "}"
}

// firstSeries are the series of the first events of firstEvents, on endpoint ep.
func firstSeries(ep string) []series {
	return []series{
		{"kvroute_config_reloads_total", map[string]string{"result": "ok"}},
		{"kvroute_tenant_rejections_total", map[string]string{"tenant": "", "reason": "missing_api_key"}},
		{"kvroute_tenant_requests_total", map[string]string{"tenant": "", "status": "401"}},
		{"kvroute_tenant_requests_total", map[string]string{"tenant": "bob", "status": "429"}},
		{"kvroute_tenant_rejections_total", map[string]string{"tenant": "bob", "reason": "requests_per_minute"}},
		// The refusals by status with every other answer: no endpoint, the model unknown before
		// authentication, known when a limit refuses.
		{"kvroute_requests_total", map[string]string{"model": "unknown", "endpoint": "none", "status": "401"}},
		{"kvroute_requests_total", map[string]string{"model": model, "endpoint": "none", "status": "429"}},
		{"kvroute_retries_total", map[string]string{"endpoint": ep, "reason": "unavailable"}},
		{"kvroute_endpoint_ejections_total", map[string]string{"endpoint": ep, "reason": "failures"}},
	}
}

// firstEvents makes one of each event whose first occurrence must show: a config reload (by
// reload), a refusal without API key (401), a 429 (bob's second request), and a retry with an
// ejection: alice's prompt is sent again after the endpoint that cached it began to answer
// 503 to everything, so that endpoint is ranked first, fails, is ejected, and the
// request goes on to the next. It returns that endpoint.
func firstEvents(t *testing.T, api string, reload func()) string {
	t.Helper()
	reload()
	if r := post(t, api, "", chatJSON("hello", "")); r.status != http.StatusUnauthorized {
		t.Fatalf("no API key: %d, want 401", r.status)
	}
	for i, want := range []int{http.StatusOK, http.StatusTooManyRequests} {
		if r := post(t, api, "sk-bob", chatJSON("hello from bob", "")); r.status != want {
			t.Fatalf("bob's request %d: %d, want %d", i, r.status, want)
		}
	}
	prompt := chatJSON(strings.Repeat("Summarise the incident report of the storage cluster, section by section. ", 40), "")
	r := post(t, api, "sk-alice", prompt)
	ep := r.header.Get("X-Kvroute-Endpoint")
	if r.status != http.StatusOK || ep == "" {
		t.Fatalf("alice: %d, endpoint %q", r.status, ep)
	}
	resp, err := http.Post(ep+"/admin/faults", "application/json", strings.NewReader(`{"fail_rate": 1, "fail_status": 503}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("setting the fault on %s: %d", ep, resp.StatusCode)
	}
	r = post(t, api, "sk-alice", prompt)
	if got := r.header.Get("X-Kvroute-Endpoint"); r.status != http.StatusOK || got == ep || got == "" {
		t.Fatalf("alice again, %s answering 503: %d from %q, want 200 from another endpoint", ep, r.status, got)
	}
	return ep
}

// scrapeValues reads the router's /metrics (text format) and returns the value of each of
// want (NaN for one that is absent).
func scrapeValues(t *testing.T, admin string, want []series) []float64 {
	t.Helper()
	resp, err := http.Get(admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(pmodel.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]float64, len(want))
	for i, s := range want {
		out[i] = math.NaN()
		for _, m := range fams[s.name].GetMetric() {
			if labelsMatch(m, s.labels) {
				out[i] = m.GetCounter().GetValue()
			}
		}
	}
	return out
}

func labelsMatch(m *dto.Metric, want map[string]string) bool {
	n := 0
	for _, l := range m.GetLabel() {
		if v, ok := want[l.GetName()]; ok {
			if v != l.GetValue() {
				return false
			}
			n++
		}
	}
	return n == len(want)
}

// learntModel is the model of the first-events test's endpoint without models:, which the
// router learns from its engine's GET /v1/models.
const learntModel = "e2e-learnt-model"

// TestFirstEventsScraped: the series of the first reload, refusal, 429, retry and ejection
// are on /metrics at 0 before they happen, and at 1 after (an in-process router, as kvroute
// serve builds it; TestDashboardQueriesAgainstPrometheus checks the same through Prometheus).
// So are those of a model the router learns from an engine, on an endpoint without models:
// its first 503.
func TestFirstEventsScraped(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	fleet, err := simserver.StartFleet(ctx, simserver.Options{Profile: "instant", Model: model, DefaultMaxTokens: 4, Admin: true}, 3, "127.0.0.1", 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fleet.Close() })
	learnt, err := simserver.StartFleet(ctx, simserver.Options{Profile: "instant", Model: learntModel, DefaultMaxTokens: 4, Admin: true}, 1, "127.0.0.1", 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { learnt.Close() })
	lu := learnt.URLs()[0]
	path := writeMetricsConfig(t, fleet.URLs())
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = fmt.Fprintf(f, "  - {url: %q, engine: vllm}\n", lu) // no models: its engine says
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	r, api, admin := startRouter(t, cfg)

	// The learnt model's series come once the prober has read the engine's list.
	learntSeries := []series{
		{"kvroute_requests_total", map[string]string{"model": learntModel, "endpoint": lu, "status": "503"}},
		{"kvroute_requests_total", map[string]string{"model": learntModel, "endpoint": "none", "status": "503"}},
	}
	waitFor(t, 10*time.Second, "the series of "+learntModel+" at 0", func() bool {
		v := scrapeValues(t, admin, learntSeries)
		return v[0] == 0 && v[1] == 0
	})

	// Before: the series of every endpoint, since any of them may be the one that fails.
	var before []series
	for _, u := range fleet.URLs() {
		before = append(before, firstSeries(u)...)
	}
	for i, v := range scrapeValues(t, admin, before) {
		if v != 0 {
			t.Errorf("before: %s = %v, want a series at 0", before[i], v)
		}
	}
	ep := firstEvents(t, api, func() {
		if err := r.Reload(cfg); err != nil {
			t.Fatal(err)
		}
	})
	after := scrapeValues(t, admin, before)
	for i, s := range before {
		want := 1.0
		if u := s.labels["endpoint"]; u != "" && u != "none" && u != ep {
			want = 0 // the other endpoints did not fail
		}
		if after[i] != want {
			t.Errorf("after: %s = %v, want %v", s, after[i], want)
		}
	}

	// The learnt model's endpoint answers 503 to everything: its first 503 reaches the client
	// (no other endpoint serves the model) and is counted on it.
	resp, err := http.Post(lu+"/admin/faults", "application/json", strings.NewReader(`{"fail_rate": 1, "fail_status": 503}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("setting the fault on %s: %d", lu, resp.StatusCode)
	}
	body := strings.Replace(chatJSON("hello, learnt model", ""), `"model":"`+model+`"`, `"model":"`+learntModel+`"`, 1)
	if r := post(t, api, "sk-alice", body); r.status != http.StatusServiceUnavailable {
		t.Fatalf("alice to %s: %d, want 503", learntModel, r.status)
	}
	if diff := cmp.Diff([]float64{1, 0}, scrapeValues(t, admin, learntSeries)); diff != "" {
		t.Errorf("after the first 503 of %s, %v (-want +got):\n%s", learntModel, learntSeries, diff)
	}
}

// promServer is a Prometheus process (Debian package prometheus) on loopback.
type promServer struct {
	base string
	log  string
}

// startPrometheus runs prometheus scraping target (host:port) every second, with alert rules
// rules loaded, until the test ends.
func startPrometheus(t *testing.T, bin, target, rules string) *promServer {
	t.Helper()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "prometheus.yml")
	y := fmt.Sprintf("global: {scrape_interval: 1s, scrape_timeout: 1s, evaluation_interval: 1s}\n"+
		"rule_files: [%q]\nscrape_configs:\n  - job_name: kvroute\n    static_configs: [{targets: [%q]}]\n", rules, target)
	if err := os.WriteFile(cfg, []byte(y), 0o600); err != nil {
		t.Fatal(err)
	}
	// A free port, taken again by Prometheus a moment later: tried up to three times.
	for attempt := 0; attempt < 3; attempt++ {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		p := &promServer{base: "http://" + addr, log: filepath.Join(dir, fmt.Sprintf("prometheus-%d.log", attempt))}
		logf, err := os.Create(p.log)
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(bin, "--config.file="+cfg, "--storage.tsdb.path="+filepath.Join(dir, fmt.Sprintf("data-%d", attempt)),
			"--web.listen-address="+addr, "--log.level=warn")
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			logf.Close()
			t.Fatal(err)
		}
		exited := make(chan struct{})
		go func() { _ = cmd.Wait(); logf.Close(); close(exited) }()
		stop := func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-exited:
			case <-time.After(15 * time.Second):
				_ = cmd.Process.Kill()
				<-exited
			}
		}
		ready := false
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline) && !ready; {
			select {
			case <-exited:
				deadline = time.Time{} // it stopped (the port was taken?): try again
			case <-time.After(100 * time.Millisecond):
				if resp, err := http.Get(p.base + "/-/ready"); err == nil {
					resp.Body.Close()
					ready = resp.StatusCode == http.StatusOK
				}
			}
		}
		if ready {
			t.Cleanup(stop)
			return p
		}
		stop()
		b, _ := os.ReadFile(p.log)
		t.Logf("prometheus attempt %d did not become ready:\n%s", attempt, tail(b, 2000))
	}
	t.Fatal("prometheus did not start")
	return nil
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// promSeries is one series of a Prometheus answer: Value for an instant query, Values for a
// range.
type promSeries struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
	Values [][2]any          `json:"values"`
}

// query runs an instant (end zero: now) or range query and returns the series.
func (p *promServer) query(t *testing.T, q string, start, end time.Time) []promSeries {
	t.Helper()
	v := url.Values{"query": {q}}
	path := "/api/v1/query"
	if !start.IsZero() {
		path = "/api/v1/query_range"
		v.Set("start", strconv.FormatFloat(float64(start.UnixMilli())/1000, 'f', 3, 64))
		v.Set("end", strconv.FormatFloat(float64(end.UnixMilli())/1000, 'f', 3, 64))
		v.Set("step", "1")
	}
	resp, err := http.Get(p.base + path + "?" + v.Encode())
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			ResultType string          `json:"resultType"`
			Result     json.RawMessage `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatalf("query %q: %v", q, err)
	}
	if out.Status != "success" {
		t.Fatalf("query %q: %s", q, out.Error)
	}
	var res []promSeries
	if out.Data.ResultType == "scalar" {
		var v [2]any
		if err := json.Unmarshal(out.Data.Result, &v); err != nil {
			t.Fatalf("query %q: %v", q, err)
		}
		return []promSeries{{Value: v}}
	}
	if err := json.Unmarshal(out.Data.Result, &res); err != nil {
		t.Fatalf("query %q: %v", q, err)
	}
	return res
}

func sampleValue(v [2]any) float64 {
	s, _ := v[1].(string)
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return math.NaN()
	}
	return f
}

// scalar runs an instant query that must give one series and returns its value (NaN: none).
func (p *promServer) scalar(t *testing.T, q string) float64 {
	t.Helper()
	res := p.query(t, q, time.Time{}, time.Time{})
	if len(res) != 1 {
		return math.NaN()
	}
	return sampleValue(res[0].Value)
}

// waitFor polls until cond holds, for at most d.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(d); ; {
		if cond() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s", d, what)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// dashboardTargets reads every panel's queries from the dashboard.
func dashboardTargets(t *testing.T) (titles, exprs []string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "deploy", "grafana", "kvroute.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Type    string `json:"type"`
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			titles, exprs = append(titles, p.Title), append(exprs, tg.Expr)
		}
	}
	return titles, exprs
}

// grafanaVars replaces the dashboard's variables as Grafana sends them with "All" selected and
// a scrape interval of 1 s ($__rate_interval: four scrape intervals, and a little more).
var grafanaVars = strings.NewReplacer("$__rate_interval", "5s", "$model", ".*", "$endpoint", ".*", "$tenant", ".*")

// TestDashboardQueriesAgainstPrometheus runs a real Prometheus against `kvroute serve` in front
// of `kvroute sim` instances (all built from this tree, on loopback): the first reload,
// refusal, 429, retry and ejection each read 1 in increase(), every query of the Grafana
// dashboard returns data under load, and every alerting rule evaluates without error. It
// skips when prometheus (Debian package prometheus) is not installed; CI installs it.
func TestDashboardQueriesAgainstPrometheus(t *testing.T) {
	promBin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Skip("prometheus not installed (Debian package prometheus)")
	}
	bin := kvrouteBinary(t)
	var urls []string
	startProcess(t, bin, nil, func(f []string) (string, bool) {
		if len(f) > 2 && f[0] == "instance" {
			urls = append(urls, f[2]) // instance N: http://127.0.0.1:PORT model=...
		}
		return "", len(urls) == 3
	}, "sim", "--profile", "instant", "--instances", "3", "--port", "0", "--model", model, "--admin", "--default-max-tokens", "4")
	// Two replicas sharing what they learn (peers:), so that the dashboard's replica panels
	// have data; Prometheus scrapes the first, which takes most of the load.
	cfgs := peeredConfigs(t, writeMetricsConfig(t, urls))
	var admin string
	router := startProcess(t, bin, nil, func(f []string) (string, bool) {
		if len(f) > 5 && f[2] == "api" {
			admin = f[5]
			return f[3], true // kvroute serve: api http://127.0.0.1:PORT admin http://127.0.0.1:PORT ...
		}
		return "", false
	}, "serve", "--config", cfgs[0])
	var admin2 string
	router2 := startProcess(t, bin, nil, func(f []string) (string, bool) {
		if len(f) > 5 && f[2] == "api" {
			admin2 = f[5]
			return f[3], true
		}
		return "", false
	}, "serve", "--config", cfgs[1])
	waitFollowing(t, admin, 1, 30*time.Second)
	waitFollowing(t, admin2, 1, 30*time.Second)
	rules, err := filepath.Abs(filepath.Join("..", "..", "deploy", "prometheus", "alerts.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	prom := startPrometheus(t, promBin, strings.TrimPrefix(admin, "http://"), rules)
	dump := func() {
		b, _ := os.ReadFile(prom.log)
		t.Logf("prometheus log:\n%s", tail(b, 4000))
	}

	// The series at 0 scraped twice before anything happens.
	waitFor(t, 30*time.Second, "two scrapes of the router", func() bool {
		return prom.scalar(t, `count_over_time(kvroute_config_reloads_total{result="ok"}[1m])`) >= 2
	})
	eventsAt := time.Now()
	ep := firstEvents(t, router.addr, func() {
		if err := router.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
	})
	watched := firstSeries(ep)
	// Then at 1 for at least two scrapes.
	for _, s := range watched {
		waitFor(t, 30*time.Second, s.String()+" at 1 in two scrapes", func() bool {
			return prom.scalar(t, `min_over_time(`+s.String()+`[1500ms]) == 1 and count_over_time(`+s.String()+`[1500ms]) >= 2`) == 1
		})
	}
	window := time.Since(eventsAt).Round(time.Second) + 5*time.Second
	for _, s := range watched {
		inc := prom.scalar(t, fmt.Sprintf("increase(%s[%ds])", s, int(window.Seconds())))
		raw := prom.query(t, fmt.Sprintf("%s[%ds]", s, int(window.Seconds())), time.Time{}, time.Time{})
		var first, last float64 = math.NaN(), math.NaN()
		if len(raw) == 1 && len(raw[0].Values) > 0 {
			first, last = sampleValue(raw[0].Values[0]), sampleValue(raw[0].Values[len(raw[0].Values)-1])
		}
		t.Logf("first event: increase(%s[%v]) = %.3f; samples %v ... %v", s, window, inc, first, last)
		if first != 0 || last != 1 || math.Abs(inc-1) > 0.25 {
			t.Errorf("%s: increase() = %v, samples from %v to %v: want 1, from 0 to 1", s, inc, first, last)
		}
	}

	// Load: alice streams chats sharing a few long prefixes (cache hits), some not streamed;
	// bob is over his limit; an unknown key and an unknown model now and then.
	loadStart := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Second)
	defer cancel()
	tr := &http.Transport{MaxIdleConnsPerHost: 8}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	var mu sync.Mutex
	statuses := map[int]int{}
	var wg sync.WaitGroup
	for g := range 3 {
		wg.Go(func() {
			tick := time.NewTicker(50 * time.Millisecond) // 20 requests/s per client
			defer tick.Stop()
			for i := 0; ; i++ {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				key, body := "sk-alice", chatJSON(fmt.Sprintf("%s question %d-%d", strings.Repeat(fmt.Sprintf("Context of group %d. ", i%4), 60), g, i), `,"stream":true`)
				switch {
				case i%10 == 3:
					body = chatJSON(fmt.Sprintf("plain %d-%d", g, i), "")
				case i%10 == 5:
					key = "sk-bob"
				case i%20 == 7:
					key = "sk-unknown"
				case i%20 == 9:
					body = strings.Replace(body, model, "no-such-model", 1)
				}
				target := router.addr
				if i%4 == 2 { // a share to the other replica (none of the refusals above)
					target = router2.addr
				}
				req, err := http.NewRequestWithContext(ctx, http.MethodPost, target+"/v1/chat/completions", strings.NewReader(body))
				if err != nil {
					t.Error(err)
					return
				}
				req.Header.Set("Authorization", "Bearer "+key)
				resp, err := client.Do(req)
				if err != nil {
					continue // the load's deadline
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				mu.Lock()
				statuses[resp.StatusCode]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	loadEnd := time.Now()
	t.Logf("load %v: statuses %v", loadEnd.Sub(loadStart).Round(time.Millisecond), statuses)
	if statuses[http.StatusOK] < 100 {
		t.Fatalf("only %d requests answered 200 under load", statuses[http.StatusOK])
	}
	waitFor(t, 30*time.Second, "a scrape after the load", func() bool {
		return prom.scalar(t, `max(timestamp(kvroute_config_reloads_total))`) > float64(loadEnd.Add(1500*time.Millisecond).Unix())
	})

	titles, exprs := dashboardTargets(t)
	for i, e := range exprs {
		q := grafanaVars.Replace(e)
		res := prom.query(t, q, loadStart, loadEnd.Add(2*time.Second))
		if titles[i] == "Requests/s by status" {
			// The refusals are there beside the answers of the engines.
			seen := map[string]bool{}
			for _, s := range res {
				for _, v := range s.Values {
					seen[s.Metric["status"]] = seen[s.Metric["status"]] || sampleValue(v) > 0
				}
			}
			for _, st := range []string{"200", "401", "404", "429"} {
				if !seen[st] {
					t.Errorf("panel %q: no %s under a load that had them (%v)", titles[i], st, seen)
				}
			}
		}
		points, top := 0, math.Inf(-1)
		for _, s := range res {
			for _, v := range s.Values {
				if f := sampleValue(v); !math.IsNaN(f) && !math.IsInf(f, 0) {
					points++
					top = max(top, f)
				}
			}
		}
		t.Logf("panel %q: %d series, %d points, max %.4g: %s", titles[i], len(res), points, top, q)
		if points == 0 {
			t.Errorf("panel %q: no data for %s", titles[i], q)
		}
		// Nothing waited for admission here (no overload limits): a quantile of the waits is
		// 0, not an interpolation inside the first bucket (0.99 ms before the 0 bucket).
		if strings.Contains(q, "kvroute_tenant_queue_wait_seconds_bucket") && points > 0 && top != 0 {
			t.Errorf("panel %q: %s reads up to %v with no request queued, want 0", titles[i], q, top)
		}
	}

	// The alerting rules run against the router's real series without errors.
	waitFor(t, 10*time.Second, "the alerting rules evaluated", func() bool {
		resp, err := http.Get(prom.base + "/api/v1/rules")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var out struct {
			Data struct {
				Groups []struct {
					Rules []struct {
						Name      string `json:"name"`
						Health    string `json:"health"`
						LastError string `json:"lastError"`
					} `json:"rules"`
				} `json:"groups"`
			} `json:"data"`
		}
		if json.NewDecoder(resp.Body).Decode(&out) != nil || len(out.Data.Groups) == 0 {
			return false
		}
		ok := 0
		for _, r := range out.Data.Groups[0].Rules {
			switch r.Health {
			case "ok":
				ok++
			case "err":
				t.Errorf("rule %s: %s", r.Name, r.LastError)
				return true
			}
		}
		return ok == len(out.Data.Groups[0].Rules) && ok >= 6
	})
	if t.Failed() {
		dump()
	}
}
