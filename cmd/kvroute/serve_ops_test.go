package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/testlog"
)

// TestMain lets a test run this binary as kvroute itself (asMain), for what only a process can
// show: how it ends on signals.
func TestMain(m *testing.M) {
	if os.Getenv("KVROUTE_TEST_AS_MAIN") == "1" {
		main()
		return
	}
	os.Exit(m.Run())
}

// TestServeCheck: serve --check judges the config as serve does at start (the policy's
// parameters, the secrets, the discovery file, the flags), prints the problems or "config OK"
// and a summary, exits 0, 1 or 2 as serve would, and binds nothing: the address the config
// names is taken, and the check passes all the same.
func TestServeCheck(t *testing.T) {
	dir := t.TempDir()
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	write := func(name, doc string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	write("secret", strings.Repeat("s", 64))
	base := "listen: " + taken.Addr().String() + "\nendpoints: [{url: http://127.0.0.1:1, engine: vllm}, {url: http://127.0.0.1:2, engine: vllm}]\n"
	write("eps.yaml", "- {url: http://127.0.0.1:3, engine: vllm}\n- {url: http://127.0.0.1:4, engine: vllm}\n- {url: http://127.0.0.1:5, engine: vllm}\n")
	write("bad-eps.yaml", "- {url: 127.0.0.1:3}\n")
	full := write("full.yaml", base+`discovery:
  file: eps.yaml
  dns: [{name: kvroute-check.invalid, port: 8000}]
policy: {name: round-robin}
auth: {mode: api_key, secret_file: secret}
tenants:
  - {name: a, api_keys: [sha256:39247eee4cd68d9e0e601a1a7c2f5ab7025261abd30be4cce7a4b7bdd146fe3d]}
  - {name: b, api_keys: [sha256:709cbcce181048c19e11dae761a11a212b2b5dcf67745104b7512486a5b588d4]}
`)
	capped := write("capped.yaml", base+`auth: {mode: api_key, secret_file: secret}
tenants:
  - {name: a, api_keys: [sha256:39247eee4cd68d9e0e601a1a7c2f5ab7025261abd30be4cce7a4b7bdd146fe3d], limits: {max_output_tokens: 4096}}
  - {name: b, api_keys: [sha256:709cbcce181048c19e11dae761a11a212b2b5dcf67745104b7512486a5b588d4]}
`)
	noAuth := write("noauth.yaml", base)
	badPolicy := write("badpolicy.yaml", base+"auth: {mode: none}\npolicy: {name: round-robin, params: {alpha: 1}}\n")
	noSecret := write("nosecret.yaml", base+"auth: {mode: api_key, secret_file: missing}\ntenants: [{name: a, api_keys: [sha256:39247eee4cd68d9e0e601a1a7c2f5ab7025261abd30be4cce7a4b7bdd146fe3d]}]\n")
	badDisc := write("baddisc.yaml", base+"auth: {mode: none}\ndiscovery: {file: bad-eps.yaml}\n")
	badHealth := write("badhealth.yaml", base+"auth: {mode: none}\nhealth: {interval: -5s}\n")
	unsetEps := write("unset-eps.yaml", "- {url: http://127.0.0.1:3, engine: vllm}\n- {url: http://127.0.0.1:4/}\n")
	unsetDisc := write("unsetdisc.yaml", base+"discovery: {file: unset-eps.yaml}\n")
	missingDisc := write("missingdisc.yaml", base+"auth: {mode: none}\ndiscovery: {file: missing-eps.yaml}\n")
	for _, tt := range []struct {
		name     string
		args     []string
		rc       int
		out, err []string // in stdout, stderr
	}{
		{"full", []string{"--config", full}, 0,
			[]string{"config OK: " + full + ": 2 endpoint(s); discovery: file eps.yaml (3 endpoint(s)), 1 DNS name(s); policy round-robin; 2 tenant(s), auth api_key\n"}, nil},
		{"max_output_tokens", []string{"--config", capped}, 0,
			[]string{"config OK: " + capped + ": 2 endpoint(s); discovery: none; policy prefix-aware; 2 tenant(s), 1 with max_output_tokens, auth api_key\n"}, nil},
		{"warning", []string{"--config", noAuth}, 0,
			[]string{"config OK: " + noAuth + ": 2 endpoint(s); discovery: none; policy prefix-aware; 0 tenant(s), auth none"},
			[]string{"kvroute serve: warning: auth: no tenants and no auth section"}},
		{"quick start", []string{"--endpoint", "http://127.0.0.1:1", "--policy", "least-request", "--listen", taken.Addr().String()}, 0,
			[]string{"config OK: --endpoint: 1 endpoint(s); discovery: none; policy least-request; 0 tenant(s), auth none"}, nil},
		{"policy parameter", []string{"--config", badPolicy}, 1, nil, []string{`policy.params: policy round-robin: unknown parameter "alpha"`}},
		{"secret", []string{"--config", noSecret}, 1, nil, []string{"auth.secret_file: " + filepath.Join(dir, "missing"), "no such file"}},
		{"discovery file", []string{"--config", badDisc}, 1, nil, []string{"discovery.file", "bad-eps.yaml", "is not an http(s) base URL"}},
		{"validation", []string{"--config", badHealth}, 1, nil, []string{"health.interval: must be positive"}},
		// The discovery file's warnings, after the config's, as serve logs them at start.
		{"discovery file warning", []string{"--config", unsetDisc}, 0,
			[]string{"config OK: " + unsetDisc + ": 2 endpoint(s); discovery: file unset-eps.yaml (2 endpoint(s)); policy prefix-aware; 0 tenant(s), auth none\n"},
			[]string{"kvroute serve: warning: auth: no tenants and no auth section",
				"\nkvroute serve: warning: discovery.file " + unsetEps + ": endpoints[1] (http://127.0.0.1:4): no engine, so openai", "set engine: "}},
		{"discovery file missing", []string{"--config", missingDisc}, 1, nil,
			[]string{"kvroute serve: discovery.file: open " + filepath.Join(dir, "missing-eps.yaml") + ": no such file"}},
		{"flag", []string{"--config", noAuth, "--log-format", "yaml"}, 2, nil, []string{`--log-format yaml: "yaml": use json or text`}},
		{"no file", []string{"--config", filepath.Join(dir, "none.yaml")}, 1, nil, []string{"none.yaml", "no such file"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			rc := runServe(context.Background(), append([]string{"--check"}, tt.args...), &out, &errb)
			if rc != tt.rc {
				t.Errorf("rc %d, want %d; stdout %q stderr %q", rc, tt.rc, out.String(), errb.String())
			}
			for _, w := range tt.out {
				if !strings.Contains(out.String(), w) {
					t.Errorf("stdout %q lacks %q", out.String(), w)
				}
			}
			for _, w := range tt.err {
				if !strings.Contains(errb.String(), w) {
					t.Errorf("stderr %q lacks %q", errb.String(), w)
				}
			}
			if tt.rc != 0 && out.Len() > 0 {
				t.Errorf("stdout %q, want nothing when the config has problems", out.String())
			}
			if tt.rc == 0 && strings.Count(out.String(), "\n") != 1 {
				t.Errorf("stdout %q, want one line", out.String())
			}
		})
	}
}

// TestServeLogsAsJSON: serve's first log line names the version, and the line that says where
// it listens is, when stdout is no terminal, a JSON record too (with the version), that keeps
// the words scripts look for: stdout and stderr collected into one stream parse line by line.
func TestServeLogsAsJSON(t *testing.T) {
	eng := fakeVLLM(t)
	api, admin, stdout, stderr, stop := startServeOut(t, "--endpoint", eng.URL, "--model", "m",
		"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--policy", "round-robin")
	if rc := stop(); rc != 0 {
		t.Fatalf("exit code %d: %s", rc, stderr)
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()+stderr.String()), "\n")
	for _, l := range lines {
		if !json.Valid([]byte(l)) {
			t.Errorf("not JSON: %q", l)
		}
	}
	var banner map[string]any
	if err := json.Unmarshal([]byte(strings.TrimSpace(stdout.String())), &banner); err != nil {
		t.Fatalf("stdout %q: %v", stdout, err)
	}
	if banner["msg"] != "kvroute serve: api "+api+" admin "+admin+" policy round-robin, 1 endpoint(s)" ||
		banner["api"] != api || banner["admin"] != admin || banner["version"] == nil || banner["endpoints"] != 1.0 {
		t.Errorf("the address line is %v, want its words, its fields and the version", banner)
	}
	var first map[string]any
	if err := json.Unmarshal([]byte(strings.SplitN(stderr.String(), "\n", 2)[0]), &first); err != nil {
		t.Fatalf("first log line: %v", err)
	}
	if first["msg"] != "kvroute serve starting" || first["version"] == nil || first["revision"] == nil || first["config"] != "--endpoint" {
		t.Errorf("the first log line is %v, want the version, revision and config source", first)
	}
}

// TestServeSecondSignalExits: the first SIGTERM is logged before the drain's lines; a second
// SIGTERM during the drain ends the process at once, logged, with status 143, while a request still holds the drain (it would wait for
// server.shutdown_timeout, 30s by default).
func TestServeSecondSignalExits(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the binary")
	}
	arrived := make(chan struct{}, 1)
	release := make(chan struct{})
	eng := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/metrics":
			_, _ = io.WriteString(w, "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0\n")
			return
		case "/v1/models":
			_, _ = io.WriteString(w, `{"object":"list","data":[{"id":"m","object":"model"}]}`)
			return
		case "/v1/chat/completions":
		default: // /health
			return
		}
		select {
		case arrived <- struct{}{}:
		default:
		}
		select { // held until the test ends
		case <-release:
		case <-r.Context().Done():
		case <-time.After(30 * time.Second):
		}
	}))
	t.Cleanup(eng.Close)
	t.Cleanup(func() { close(release) }) // before eng.Close: cleanups run last first

	cmd := exec.Command(os.Args[0], "serve", "--endpoint", eng.URL, "--model", "m", "--engine", "vllm",
		"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0")
	cmd.Env = append(os.Environ(), "KVROUTE_TEST_AS_MAIN=1")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	logs := make(chan string, 1000)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			select {
			case logs <- sc.Text():
			default:
			}
		}
		close(logs)
	}()
	apiURL := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if m := addrLine.FindStringSubmatch(sc.Text()); m != nil {
				apiURL <- m[1]
			}
		}
		exited <- cmd.Wait() // after the pipes are read to their end
	}()
	ended := false // set once exited has been received from
	t.Cleanup(func() {
		if !ended {
			_ = cmd.Process.Kill()
			select {
			case <-exited:
			case <-time.After(10 * time.Second):
			}
		}
	})
	var api string
	select {
	case api = <-apiURL:
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not start")
	}
	// A request held by the engine: the drain waits for it. Sent again until one arrives (the
	// router may refuse the first while the endpoint's first health check is on its way).
	client := &http.Client{Timeout: 30 * time.Second}
	send := func() {
		resp, err := client.Post(api+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
		if err == nil {
			resp.Body.Close()
		}
	}
	deadline := time.After(10 * time.Second)
	for held := false; !held; {
		go send()
		select {
		case <-arrived:
			held = true
		case <-time.After(500 * time.Millisecond):
		case <-deadline:
			t.Fatal("no request reached the engine within 10s")
		}
	}
	waitLog := func(what string) {
		t.Helper()
		deadline := time.After(10 * time.Second)
		for {
			select {
			case l, ok := <-logs:
				if !ok {
					t.Fatalf("stderr ended before %q", what)
				}
				if strings.Contains(l, what) {
					return
				}
			case <-deadline:
				t.Fatalf("no %q logged within 10s", what)
			}
		}
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// The signal is said first, then the drain (waitLog reads the lines in order).
	waitLog(`"msg":"signal received: draining requests in flight`)
	waitLog("shutting down: draining requests in flight")
	start := time.Now()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitLog(`"msg":"second signal: exiting at once`)
	select {
	case <-exited:
		ended = true
	case <-time.After(10 * time.Second):
		t.Fatal("serve still draining 10s after the second SIGTERM")
	}
	if code := cmd.ProcessState.ExitCode(); code != 143 {
		t.Errorf("exit status %d, want 143 (128+SIGTERM)", code)
	}
	t.Logf("exited %v after the second signal", time.Since(start).Round(time.Millisecond))
}

// TestBlameFlagsKeepsOtherErrors: a config's error that joins a flag's problem with problems
// that are no config.Problem (decoding's: an unknown key) keeps those, under the file, and is
// no usage error: before, the unknown key was dropped and only the flag's problem was said.
func TestBlameFlagsKeepsOtherErrors(t *testing.T) {
	unknown := errors.New(`bogus_key: unknown key "bogus_key" in the top level`)
	flagProblem := &config.Problem{Key: "log.format", Msg: `"yaml": use json or text`}
	fileProblem := &config.Problem{Key: "health.interval", Msg: "must be positive, like 5s"}
	setBy := map[string]string{"log.format": "--log-format yaml"}
	for _, tt := range []struct {
		name  string
		err   error
		want  string
		usage bool
	}{
		{"decoding and flag", fmt.Errorf("config f.yaml: %w", errors.Join(unknown, flagProblem)),
			"--log-format yaml: \"yaml\": use json or text\nconfig f.yaml: " + unknown.Error(), false},
		{"all three", fmt.Errorf("config f.yaml: %w", errors.Join(unknown, flagProblem, fileProblem)),
			"--log-format yaml: \"yaml\": use json or text\nconfig f.yaml: " + unknown.Error() + "\nhealth.interval: must be positive, like 5s", false},
		{"flag alone", fmt.Errorf("config f.yaml: %w", errors.Join(flagProblem)), "--log-format yaml: \"yaml\": use json or text", true},
		{"no problem", fmt.Errorf("config: %w", os.ErrNotExist), "config: file does not exist", false},
	} {
		err := blameFlags(tt.err, setBy, "f.yaml")
		if err.Error() != tt.want {
			t.Errorf("%s: %q, want %q", tt.name, err, tt.want)
		}
		if got := errors.As(err, new(usageError)); got != tt.usage {
			t.Errorf("%s: usage error %v, want %v", tt.name, got, tt.usage)
		}
	}
}

// TestServeListenInUse: an address another process holds stops serve with exit status 1 and
// a last line that says so with the fix (the flag to change); the log lines written before it
// (batched by logbuf) come first, not after it.
func TestServeListenInUse(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	for _, tt := range []struct {
		flag string
		want string
	}{
		{"--listen", "kvroute serve: listen: listen tcp " + taken.Addr().String() + ": bind: address already in use (another process listens there: stop it or give --listen another port)"},
		{"--admin-listen", "kvroute serve: admin listen: listen tcp " + taken.Addr().String() + ": bind: address already in use (another process listens there: stop it or give --admin-listen another port)"},
	} {
		t.Run(tt.flag, func(t *testing.T) {
			args := []string{"--endpoint", "http://127.0.0.1:1", "--engine", "vllm", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", tt.flag, taken.Addr().String()}
			var out, errb bytes.Buffer
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if rc := runServe(ctx, args, &out, &errb); rc != 1 {
				t.Fatalf("rc %d, want 1; stderr:\n%s", rc, errb.String())
			}
			lines := strings.Split(strings.TrimSpace(errb.String()), "\n")
			if len(lines) < 3 || !strings.Contains(lines[0], "kvroute serve starting") || lines[len(lines)-1] != tt.want {
				t.Errorf("stderr:\n%s\nwant the log lines, then last:\n%s", errb.String(), tt.want)
			}
		})
	}
}

// TestServeSignalLoggedFirst: when a signal ends serve's context (main's signal.NotifyContext
// gives the signal as the cause), "signal received" is logged before the shutdown's own lines.
// Before, forceExit logged it from its own goroutine, after the drain had started, and
// sometimes after the shutdown's lines; a context merely cancelled (a test) logs no signal.
func TestServeSignalLoggedFirst(t *testing.T) {
	eng := fakeVLLM(t)
	args := []string{"--endpoint", eng.URL, "--model", "m", "--engine", "vllm", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"}
	for _, tt := range []struct {
		name  string
		cause error // nil: a plain cancel
	}{
		{"signal", errors.New("terminated signal received")}, // as signal.NotifyContext words it
		{"cancel", nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithCancelCause(context.Background())
			var out testlog.Buffer
			stderr := &testlog.Buffer{}
			code := make(chan int, 1)
			go func() { code <- runServe(ctx, args, &out, stderr) }()
			if !waitFor(10*time.Second, func() bool { return addrLine.MatchString(out.String()) }) {
				cancel(nil)
				t.Fatalf("serve did not start: %s", stderr.String())
			}
			cancel(tt.cause)
			select {
			case rc := <-code:
				if rc != 0 {
					t.Fatalf("rc %d: %s", rc, stderr.String())
				}
			case <-time.After(30 * time.Second):
				t.Fatal("serve did not stop")
			}
			var msgs []string
			for _, l := range strings.Split(strings.TrimSpace(stderr.String()), "\n") {
				var rec struct{ Msg, Signal string }
				if err := json.Unmarshal([]byte(l), &rec); err != nil {
					t.Fatalf("not JSON: %q", l)
				}
				if strings.HasPrefix(rec.Msg, "signal received") || strings.HasPrefix(rec.Msg, "shutting down") {
					msgs = append(msgs, rec.Msg+" "+rec.Signal)
				}
			}
			first := "signal received: draining requests in flight; send it again to exit at once terminated"
			if tt.cause == nil {
				if len(msgs) == 0 || strings.HasPrefix(msgs[0], "signal received") {
					t.Errorf("lines %q: want the shutdown's and no signal", msgs)
				}
				return
			}
			if len(msgs) < 2 || msgs[0] != first || strings.Count(strings.Join(msgs, "\n"), "signal received") != 1 {
				t.Errorf("lines %q: want %q once, first", msgs, first)
			}
		})
	}
}
