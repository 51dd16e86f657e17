package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/testlog"
)

var addrLine = regexp.MustCompile(`api (http://\S+) admin (http://\S+)`)

// startServe runs `kvroute serve args...` and returns its API and admin base URLs.
func startServe(t *testing.T, args ...string) (api, admin string, stderr *testlog.Buffer, stop func() int) {
	t.Helper()
	api, admin, _, stderr, stop = startServeOut(t, args...)
	return api, admin, stderr, stop
}

// startServeOut is startServe that also returns what serve printed.
func startServeOut(t *testing.T, args ...string) (api, admin string, stdout, stderr *testlog.Buffer, stop func() int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var out testlog.Buffer
	stderr = &testlog.Buffer{}
	code := make(chan int, 1)
	go func() { code <- runServe(ctx, args, &out, stderr) }()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if m := addrLine.FindStringSubmatch(out.String()); m != nil {
			api, admin = m[1], m[2]
			break
		}
		select {
		case c := <-code:
			cancel()
			t.Fatalf("serve exited with %d: %s", c, stderr)
		case <-time.After(10 * time.Millisecond):
		}
	}
	if api == "" {
		cancel()
		t.Fatalf("serve did not start: %s", stderr)
	}
	var once sync.Once
	var rc int
	stop = func() int {
		once.Do(func() {
			cancel()
			select {
			case rc = <-code:
			case <-time.After(30 * time.Second):
				t.Fatal("serve did not stop")
			}
		})
		return rc
	}
	t.Cleanup(func() { stop() })
	return api, admin, &out, stderr, stop
}

// fakeVLLM answers every path with a chat completion, and /metrics with a vLLM name (what
// tells a quick start's auto-detection it is vLLM).
func fakeVLLM(t *testing.T) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.URL.Path == "/metrics" {
			_, _ = io.WriteString(w, "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0\n")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"x","choices":[{"message":{"role":"assistant","content":"ok"}}],"usage":{"prompt_tokens":3,"completion_tokens":1}}`)
	}))
	t.Cleanup(srv.Close)
	return srv
}

func TestServeQuickStart(t *testing.T) {
	eng := fakeVLLM(t)
	api, admin, stderr, stop := startServe(t, "--endpoint", eng.URL, "--model", "m", "--listen", "127.0.0.1:0",
		"--admin-listen", "127.0.0.1:0", "--policy", "round-robin")
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	resp, err := client.Post(api+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"secret prompt text"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"ok"`) {
		t.Errorf("chat: %d %s", resp.StatusCode, body)
	}
	// The request is counted once its last byte is sent: poll with a deadline.
	want := `kvroute_requests_total{endpoint="` + eng.URL + `",model="m",status="200"} 1`
	if !waitFor(10*time.Second, func() bool { return strings.Contains(get(t, client, admin+"/metrics"), want) }) {
		t.Errorf("metrics lack %s", want)
	}
	if rc := stop(); rc != 0 {
		t.Errorf("exit code %d, stderr:\n%s", rc, stderr)
	}
	logs := stderr.String()
	if !strings.Contains(logs, `"msg":"request"`) || strings.Contains(logs, "secret prompt text") {
		t.Errorf("want a JSON access line and no prompt text in the logs:\n%s", logs)
	}
	if strings.Contains(logs, "auth") {
		t.Errorf("a quick start logs an auth warning:\n%s", logs)
	}
}

// --model is repeatable and takes a comma-separated list: every name given is served (not the
// last one alone, nor one model called "m, x"); an empty name is refused.
func TestServeQuickStartModels(t *testing.T) {
	eng := fakeVLLM(t)
	api, _, stderr, stop := startServe(t, "--endpoint", eng.URL, "--model", "m, x", "--model", "y", "--listen", "127.0.0.1:0",
		"--admin-listen", "127.0.0.1:0", "--policy", "round-robin")
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	for model, want := range map[string]int{"m": 200, "x": 200, "y": 200, "m, x": 404, "z": 404} {
		resp, err := client.Post(api+"/v1/chat/completions", "application/json",
			strings.NewReader(`{"model":"`+model+`","messages":[{"role":"user","content":"hi"}]}`))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("model %q: %d %s, want %d", model, resp.StatusCode, body, want)
		}
	}
	if rc := stop(); rc != 0 {
		t.Errorf("exit code %d, stderr:\n%s", rc, stderr)
	}

	// A router that starts anyway meets a cancelled context and returns at once.
	done, cancel := context.WithCancel(context.Background())
	cancel()
	for _, bad := range []string{"", "m,,x", "m, "} {
		var out, errb bytes.Buffer
		args := []string{"--endpoint", eng.URL, "--model", bad, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"}
		if rc := runServe(done, args, &out, &errb); rc != 2 ||
			!strings.Contains(errb.String(), "-model") || !strings.Contains(errb.String(), "empty name") {
			t.Errorf("--model %q: rc %d, %q; want 2 and the empty name refused", bad, rc, errb.String())
		}
	}
}

// The quick start in front of ollama (no /health, no /metrics): with the default
// engine auto the endpoint is detected as ollama, checked on /api/version and serves; /debug/
// endpoints says what was found.
func TestServeQuickStartDetectsOllama(t *testing.T) {
	eng := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		switch r.URL.Path {
		case "/api/version":
			_, _ = io.WriteString(w, `{"version":"0.17.4"}`)
		case "/v1/models":
			_, _ = io.WriteString(w, `{"object":"list","data":[{"id":"tiny:latest","object":"model","owned_by":"library"}]}`)
		case "/v1/chat/completions":
			_, _ = io.WriteString(w, `{"id":"x","choices":[{"message":{"role":"assistant","content":"ok"}}],"usage":{"prompt_tokens":3,"completion_tokens":1}}`)
		default:
			http.NotFound(w, r)
		}
	}))
	defer eng.Close()
	api, admin, stderr, stop := startServe(t, "--endpoint", eng.URL, "--model", "tiny", "--listen", "127.0.0.1:0",
		"--admin-listen", "127.0.0.1:0", "--log-format", "text")
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	var info string
	for deadline := time.Now().Add(10 * time.Second); ; {
		resp, err := client.Get(admin + "/debug/endpoints")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		info = string(b)
		if strings.Contains(info, `"kind": "ollama"`) && strings.Contains(info, `"healthy": true`) &&
			!strings.Contains(info, "last_check_error") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the endpoint was not detected as a healthy ollama:\n%s\n%s", info, stderr)
		}
		time.Sleep(10 * time.Millisecond) // polling with a deadline
	}
	resp, err := client.Post(api+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"tiny","messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("chat: %d %s", resp.StatusCode, body)
	}
	if rc := stop(); rc != 0 {
		t.Errorf("exit code %d", rc)
	}
	if logs := stderr.String(); !strings.Contains(logs, "engine kind detected") || !strings.Contains(logs, "engine=ollama") {
		t.Errorf("want the detection logged:\n%s", logs)
	}
}

func TestServeReloadsConfigFile(t *testing.T) {
	a, b := fakeVLLM(t), fakeVLLM(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "kvroute.yaml")
	write := func(urls ...string) {
		var s strings.Builder
		s.WriteString("# " + time.Now().String() + "\n")
		s.WriteString("scrape: {disabled: true}\nendpoints:\n")
		for _, u := range urls {
			s.WriteString("  - {url: " + u + ", models: [m]}\n")
		}
		if err := os.WriteFile(path, []byte(s.String()), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(a.URL)
	_, admin, _, _ := startServe(t, "--config", path, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0")
	// One write is enough: the watcher re-reads the file once its watch is in place.
	write(a.URL, b.URL)
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	if !waitFor(10*time.Second, func() bool { return strings.Contains(get(t, client, admin+"/debug/endpoints"), b.URL) }) {
		t.Error("the new endpoint did not appear after the config file changed")
	}
}

// waitFor asks done at once and then every 10 ms until it says yes (true) or timeout passes
// (false).
func waitFor(timeout time.Duration, done func() bool) bool {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !done() {
		select {
		case <-deadline.C:
			return false
		case <-tick.C:
		}
	}
	return true
}

// get returns the body of a GET of url ("" after an error).
func get(t *testing.T, client *http.Client, url string) string {
	t.Helper()
	resp, err := client.Get(url)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return string(body)
}

func TestServeFlags(t *testing.T) {
	var out, errb bytes.Buffer
	if rc := runServe(context.Background(), nil, &out, &errb); rc != 2 || !strings.Contains(errb.String(), "--config") {
		t.Errorf("no flags: rc %d, %q", rc, errb.String())
	}
	errb.Reset()
	if rc := runServe(context.Background(), []string{"--config", "/nonexistent.yaml"}, &out, &errb); rc != 1 {
		t.Errorf("missing config: rc %d", rc)
	}
	// Overrides are validated: the same address for both listeners is caught before listening.
	path := filepath.Join(t.TempDir(), "kvroute.yaml")
	if err := os.WriteFile(path, []byte("endpoints: [{url: http://127.0.0.1:1}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// The quick start's flags are refused with a config file rather than ignored. (A router
	// that starts anyway meets a cancelled context and returns at once.)
	done, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--config", path, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--policy", "round-robin"}, "--policy applies only with --endpoint"},
		{[]string{"--config", path, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--engine", "vllm", "--model", "m"}, "--engine, --model apply only with --endpoint"},
	} {
		errb.Reset()
		if rc := runServe(done, tt.args, &out, &errb); rc != 2 || !strings.Contains(errb.String(), tt.want) {
			t.Errorf("%q: rc %d, %q; want 2 and %q", tt.args, rc, errb.String(), tt.want)
		}
	}
	// --listen moved onto admin_listen's default: the flag is blamed, not the key nobody wrote.
	errb.Reset()
	if rc := runServe(context.Background(), []string{"--config", path, "--listen", "127.0.0.1:9090"}, &out, &errb); rc != 2 ||
		!strings.Contains(errb.String(), "--listen 127.0.0.1:9090: \"127.0.0.1:9090\" is the admin server's address") {
		t.Errorf("--listen on the admin default: rc %d, %q; want 2 and --listen named", rc, errb.String())
	}
	// The policy is judged with the rest of the config: every problem at once, each named.
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("endpoints: [{url: http://127.0.0.1:1}]\npolicy: {name: round-robin, params: {alpha: 1}}\nlog: {format: xml}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	errb.Reset()
	if rc := runServe(context.Background(), []string{"--config", bad}, &out, &errb); rc != 1 ||
		!strings.Contains(errb.String(), `policy.params: policy round-robin: unknown parameter "alpha"`) || !strings.Contains(errb.String(), `log.format: "xml"`) {
		t.Errorf("bad policy parameter: rc %d, %q; want 1, the parameter and the log format named", rc, errb.String())
	}
}

// TestServeFlagProblems: a value that a flag gave and the config's checks refuse is a bad
// command line (exit status 2), named by the flag and its value, not by a config key the user
// never wrote; a config file's own problems stay under their keys (exit status 1).
func TestServeFlagProblems(t *testing.T) {
	good := filepath.Join(t.TempDir(), "good.yaml")
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	for path, doc := range map[string]string{good: "endpoints: [{url: http://127.0.0.1:1}]\n", bad: "endpoints: [{url: http://127.0.0.1:1}]\nhealth: {interval: -5s}\n"} {
		if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	free := []string{"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"}
	for _, tt := range []struct {
		args []string
		rc   int
		want []string
		not  []string
	}{
		{[]string{"--endpoint", "127.0.0.1:47001"}, 2,
			[]string{`kvroute serve: --endpoint 127.0.0.1:47001: "127.0.0.1:47001" is not an http(s) base URL`}, []string{"endpoints[0]"}},
		{[]string{"--endpoint", "http://127.0.0.1:1", "--endpoint", "http://127.0.0.1:2/v1"}, 2,
			[]string{`kvroute serve: --endpoint http://127.0.0.1:2/v1: "http://127.0.0.1:2/v1": give the base URL without /v1`}, []string{"endpoints[1]", "127.0.0.1:1:"}},
		{[]string{"--endpoint", "http://127.0.0.1:1", "--policy", "bogus"}, 2,
			[]string{`kvroute serve: --policy bogus: unknown policy "bogus": use one of `, "prefix-aware"}, []string{"policy.name"}},
		{[]string{"--endpoint", "http://127.0.0.1:1", "--policy", "round-robin:alpha=1"}, 2,
			[]string{`--policy round-robin:alpha=1: policy round-robin: unknown parameter "alpha"`}, []string{"policy.params"}},
		{[]string{"--endpoint", "http://127.0.0.1:1", "--policy", ":x"}, 2, []string{"--policy :x: "}, nil},
		// --engine is every endpoint's: said once.
		{[]string{"--endpoint", "http://127.0.0.1:1", "--endpoint", "http://127.0.0.1:2", "--engine", "trt"}, 2,
			[]string{`kvroute serve: --engine trt: unknown engine "trt": use one of vllm`}, []string{"endpoints[", "; --engine"}},
		{append([]string{"--endpoint", "http://127.0.0.1:1", "--http-server", "nginx"}, free...), 2,
			[]string{`kvroute serve: --http-server nginx: "nginx" is not a server`}, []string{"server.http_server"}},
		{[]string{"--endpoint", "http://127.0.0.1:1", "--listen", "127.0.0.1:7000", "--admin-listen", "127.0.0.1:7000"}, 2,
			[]string{`--admin-listen 127.0.0.1:7000: "127.0.0.1:7000" is also listen`}, nil},
		{append([]string{"--config", good, "--log-format", "yaml"}, free...), 2,
			[]string{`kvroute serve: --log-format yaml: "yaml": use json or text`}, []string{"log.format", "config "}},
		// The file's problem stays the file's (and so exit 1); the flag's is named all the same.
		{append([]string{"--config", bad, "--log-format", "yaml"}, free...), 1,
			[]string{`--log-format yaml: "yaml": use json or text`, "config " + bad + ": health.interval: must be positive"}, []string{"log.format", "unhealthy_interval"}},
		{[]string{"--config", bad}, 1, []string{"config " + bad + ": health.interval: must be positive"}, nil},
	} {
		var out, errb bytes.Buffer
		rc := runServe(context.Background(), tt.args, &out, &errb)
		if rc != tt.rc {
			t.Errorf("%q: rc %d, want %d (%q)", tt.args, rc, tt.rc, errb.String())
		}
		for _, w := range tt.want {
			if !strings.Contains(errb.String(), w) {
				t.Errorf("%q: stderr %q lacks %q", tt.args, errb.String(), w)
			}
		}
		for _, n := range tt.not {
			if strings.Contains(errb.String(), n) {
				t.Errorf("%q: stderr %q has %q", tt.args, errb.String(), n)
			}
		}
		if tt.rc == 2 && strings.Count(errb.String(), "\n") != 1 {
			t.Errorf("%q: stderr %q, want one line", tt.args, errb.String())
		}
	}
}

// TestServeHelpDefaults: -h gives the addresses served when neither flag nor file sets them.
func TestServeHelpDefaults(t *testing.T) {
	var out, errb bytes.Buffer
	if rc := runServe(context.Background(), []string{"-h"}, &out, &errb); rc != 0 {
		t.Fatalf("rc %d: %s", rc, errb.String())
	}
	for _, want := range []string{"(default 127.0.0.1:8080)", "(default 127.0.0.1:9090)"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("-h lacks %q:\n%s", want, out.String())
		}
	}
}
