package config

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

const minimal = `
endpoints:
  - url: http://127.0.0.1:8001/
    models: [llama3-70b]
    engine: vllm
`

func TestParse_Defaults(t *testing.T) {
	c, err := Parse([]byte(minimal))
	if err != nil {
		t.Fatal(err)
	}
	tru := true
	two := 2
	drain := Duration(DefaultDrainDelay)
	want := &Config{
		Listen:      "127.0.0.1:8080",
		AdminListen: "127.0.0.1:9090",
		Policy:      Policy{Name: "prefix-aware"},
		Endpoints: []Endpoint{{
			URL: "http://127.0.0.1:8001", Models: []string{"llama3-70b"}, Engine: "vllm",
			CacheSalt: &tru, MetricsPath: "/metrics",
		}},
		Discovery: Discovery{PollInterval: Duration(30 * time.Second)},
		Health: Health{Interval: Duration(5 * time.Second), Timeout: Duration(2 * time.Second), UnhealthyInterval: Duration(time.Second),
			HealthyThreshold: 1, UnhealthyThreshold: 2, PassiveFailures: 3,
			EjectionTime: Duration(30 * time.Second), MaxEjectionTime: Duration(5 * time.Minute), MaxEjectedPercent: 50,
			RefusalPercent: 85, RefusalVolume: 20, RefusalWindow: Duration(time.Minute)},
		Scrape: Scrape{Interval: Duration(time.Second), Timeout: Duration(time.Second)},
		Prefix: Prefix{BlockTokens: 16},
		Limits: Limits{MaxBodyBytes: 16 << 20, MaxRetries: &two, ConnectTimeout: Duration(5 * time.Second),
			FirstTokenTimeout: Duration(2 * time.Minute), StallTimeout: Duration(10 * time.Second), ResponseTimeout: Duration(10 * time.Minute), StreamIdleTimeout: Duration(time.Minute)},
		Server: Server{ReadHeaderTimeout: Duration(10 * time.Second), IdleTimeout: Duration(120 * time.Second),
			ShutdownTimeout: Duration(30 * time.Second), DrainDelay: &drain, HTTPServer: HTTPServerBuiltin,
			BodyReadTimeout: Duration(30 * time.Second), BodyMinRate: 64 << 10, WriteStallTimeout: Duration(60 * time.Second)},
		Log:       Log{Format: "json", Level: "info", Access: &tru},
		Auth:      &Auth{Mode: AuthNone},
		Overload:  Overload{QueueSize: 1024, MaxWait: Duration(30 * time.Second)},
		Autoscale: Autoscale{Window: Duration(time.Minute), PodDeletionCost: PodDeletionCost{Interval: Duration(time.Minute), PatchesPerSecond: 1}},
		Warnings:  c.Warnings,
	}
	if diff := cmp.Diff(want, c); diff != "" {
		t.Errorf("defaults (-want +got):\n%s", diff)
	}
	if len(c.Warnings) != 1 || !strings.Contains(c.Warnings[0], "auth") {
		t.Errorf("warnings = %q, want one about auth", c.Warnings)
	}
}

// TestParse_LogAccess: log.access is on unless the config turns it off, and a value that is
// not a boolean is refused with its key. Before, the key did not exist.
func TestParse_LogAccess(t *testing.T) {
	for in, want := range map[string]bool{"": true, "log: {access: true}\n": true, "log: {access: false}\n": false} {
		c, err := Parse([]byte(in + minimal))
		if err != nil {
			t.Fatalf("%q: %v", in, err)
		}
		if got := c.Log.AccessLog(); got != want {
			t.Errorf("%q: AccessLog() = %v, want %v", in, got, want)
		}
	}
	if got := (Log{}).AccessLog(); !got {
		t.Error("unset (before defaults): AccessLog() = false, want true")
	}
	_, err := Parse([]byte("log: {access: sometimes}\n" + minimal))
	if err == nil || !strings.Contains(err.Error(), `log.access: got the text "sometimes", want true or false`) {
		t.Errorf("err = %v, want the mistyped log.access named", err)
	}
}

func TestParse_CacheSaltDefaultByEngine(t *testing.T) {
	c, err := Parse([]byte(`
auth: {mode: none}
endpoints:
  - {url: "http://127.0.0.1:1", engine: sglang}
  - {url: "http://127.0.0.1:2", engine: vllm, cache_salt: false}
  - {url: "http://127.0.0.1:3", metrics_path: "-"}
`))
	if err != nil {
		t.Fatal(err)
	}
	got := c.Endpoints
	if *got[0].CacheSalt || *got[1].CacheSalt || *got[2].CacheSalt {
		t.Errorf("cache salts = %v %v %v, want all false", *got[0].CacheSalt, *got[1].CacheSalt, *got[2].CacheSalt)
	}
	if got[2].Engine != "openai" || got[2].MetricsPath != "-" {
		t.Errorf("endpoint 3 = %+v, want engine openai, metrics path - (none)", got[2])
	}
	// Auth said explicitly draws no warning; the endpoint left without an engine does.
	if len(c.Warnings) != 1 || !strings.HasPrefix(c.Warnings[0], "endpoints[2] (http://127.0.0.1:3): no engine") {
		t.Errorf("warnings = %q, want only the one about endpoints[2]'s engine", c.Warnings)
	}
	// A secret without tenants asks for authentication that nothing provides: said.
	c, err = Parse([]byte(minimal + "auth: {secret_env: K}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Warnings) != 1 || !strings.Contains(c.Warnings[0], "no tenant is listed") {
		t.Errorf("a secret, no tenants: warnings = %q, want one that every client is accepted", c.Warnings)
	}
}

func TestParse_UnknownKeysNamed(t *testing.T) {
	_, err := Parse([]byte(`
listen: 127.0.0.1:8080
lisen: 127.0.0.1:8081
endpoints:
  - url: http://127.0.0.1:8001
    modles: [x]
health: {intervall: 5s}
`))
	if err == nil {
		t.Fatal("want an error")
	}
	msg := err.Error()
	for _, want := range []string{`lisen: unknown key "lisen" in the top level (did you mean "listen"?`,
		`endpoints[0].modles: unknown key "modles" in endpoints[0] (did you mean "models"?`,
		`health.intervall: unknown key "intervall"`, "known keys:"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not contain %q", msg, want)
		}
	}
}

func TestParse_AllProblemsAtOnce(t *testing.T) {
	_, err := Parse([]byte(`
listen: nonsense
policy: {name: nosuch}
endpoints:
  - url: ftp://x
    engine: vlm
  - url: ftp://x
  - url: ""
health: {interval: 5 seconds, unhealthy_threshold: -1}
log: {format: xml}
normalize: {rules: [{pattern: "(", replace: ""}]}
`))
	if err == nil {
		t.Fatal("want an error")
	}
	// A type problem (the duration) is reported by the decoder before validation.
	if !strings.Contains(err.Error(), `health.interval: "5 seconds" is not a duration`) {
		t.Fatalf("error %q lacks the duration problem", err)
	}

	_, err = parse([]byte(`
listen: nonsense
policy: {name: nosuch}
endpoints:
  - url: ftp://x
    engine: vlm
  - url: ftp://x
  - url: ""
  - url: http://127.0.0.1:9/v1
health: {unhealthy_threshold: -1}
log: {format: xml}
normalize: {rules: [{pattern: "(", replace: ""}]}
`), "", nil, testChecks)
	if err == nil {
		t.Fatal("want an error")
	}
	msg := err.Error()
	for _, want := range []string{
		`listen: "nonsense" is not host:port`,
		`policy.name: unknown policy "nosuch": use one of prefix-aware, round-robin`,
		`endpoints[0].url: "ftp://x" is not an http(s) base URL`,
		`endpoints[0].engine: unknown engine "vlm"`,
		`endpoints[1].url: "ftp://x" is listed twice (also endpoints[0])`,
		`endpoints[2].url: missing`,
		`endpoints[3].url: "http://127.0.0.1:9/v1": give the base URL without /v1`,
		`health.unhealthy_threshold: -1: must be at least 1`,
		`log.format: "xml"`,
		`normalize.rules[0].pattern: "(" does not compile`,
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("error lacks %q; got:\n%s", want, msg)
		}
	}
	if n := strings.Count(msg, "\n") + 1; n != 11 {
		t.Errorf("got %d problems, want 11:\n%s", n, msg)
	}
}

func TestParse_TypeErrorsNamePaths(t *testing.T) {
	_, err := Parse([]byte(`
endpoints:
  - url: http://127.0.0.1:1
    models: 1.5
    kv_tokens: lots
    cache_salt: "maybe"
pprof: 1
`))
	if err == nil {
		t.Fatal("want an error")
	}
	msg := err.Error()
	for _, want := range []string{"endpoints[0].models: got the number 1.5, want a list",
		`endpoints[0].kv_tokens: got the text "lots", want a whole number`,
		`endpoints[0].cache_salt: got the text "maybe", want true or false`,
		"pprof: got the number 1, want true or false"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error lacks %q; got:\n%s", want, msg)
		}
	}
}

// testChecks stand for the policy package: two policies, of which round-robin takes no
// parameter.
var testChecks = Checks{
	PolicyNames: []string{"prefix-aware", "round-robin"},
	Policy: func(name string, params map[string]string) error {
		if name == "round-robin" && len(params) > 0 {
			return fmt.Errorf("policy %s: unknown parameter %q", name, slices.Sorted(maps.Keys(params))[0])
		}
		return nil
	},
}

func TestParse_PolicyChecks(t *testing.T) {
	// With checks, a bad parameter is one more problem of the config, named with the others.
	data := []byte(minimal + "listen: nonsense\npolicy: {name: round-robin, params: {alpha: 0.5}}\n")
	_, err := parse(data, "", nil, testChecks)
	if err == nil || !strings.Contains(err.Error(), `policy.params: policy round-robin: unknown parameter "alpha"`) ||
		!strings.Contains(err.Error(), `listen: "nonsense"`) {
		t.Errorf("err = %v, want the unknown parameter named beside the bad listen", err)
	}
	// Without them, config judges only what it knows: the listen address.
	_, err = Parse(data)
	if err == nil || strings.Contains(err.Error(), "policy") {
		t.Errorf("no checks: err = %v, want the listen problem alone", err)
	}
	if _, err := Parse([]byte(minimal + "policy: {name: nosuch}\n")); err != nil {
		t.Errorf("no checks: an unknown name is not config's to judge: %v", err)
	}
	// The checker sees the parameters as text, whatever their YAML type.
	var seen map[string]string
	checks := Checks{Policy: func(_ string, p map[string]string) error { seen = p; return nil }}
	if _, err := parse([]byte(minimal+"policy: {params: {a: x, b: true, size: 1000000, f: 0.25}}\n"), "", nil, checks); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]string{"a": "x", "b": "true", "size": "1000000", "f": "0.25"}, seen); diff != "" {
		t.Errorf("params given to the checker (-want +got):\n%s", diff)
	}
	// A parameter that is not a single value is config's own problem, checks or not.
	c, err := Parse([]byte(minimal + "policy: {params: {n: 1000000, f: 0.25, nested: {x: 1}}}\n"))
	if err == nil || !strings.Contains(err.Error(), "policy.params: nested: got a mapping, want a single value") {
		t.Errorf("err = %v (config %v), want the nested parameter named", err, c)
	}
}

func TestParse_NoEndpoints(t *testing.T) {
	_, err := Parse([]byte("listen: 127.0.0.1:1\n"))
	if err == nil || !strings.Contains(err.Error(), "endpoints: no endpoints") {
		t.Errorf("err = %v, want no endpoints", err)
	}
	if _, err := Parse([]byte("discovery: {file: eps.yaml}\n")); err != nil {
		t.Errorf("with a discovery file, no static endpoint is fine: %v", err)
	}
}

// TestParse_EmptyFile: a file with nothing in it is said to be empty, not said to lack
// endpoints only, as if the rest of it were there.
func TestParse_EmptyFile(t *testing.T) {
	for _, doc := range []string{"", "\n\n", "# kvroute\n# nothing yet\n", "---\n", "null\n"} {
		_, err := Parse([]byte(doc))
		if err == nil || !strings.Contains(err.Error(), "the file is empty") || strings.Contains(err.Error(), "no endpoints") {
			t.Errorf("%q: err = %v, want the file said to be empty", doc, err)
		}
	}
	// A mapping written empty is written: judged as the keys it leaves to their defaults.
	if _, err := Parse([]byte("{}\n")); err == nil || !strings.Contains(err.Error(), "endpoints: no endpoints") {
		t.Errorf("{}: err = %v, want no endpoints", err)
	}
}

// TestProblems: the problems of a config come back with their keys, from the error Load
// returns, so that a caller that set a key itself can say where the value came from.
func TestProblems(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kvroute.yaml")
	if err := os.WriteFile(path, []byte("endpoints: [{url: ftp://x, engine: trt}]\nlog: {format: yaml}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Load(path)
	var keys []string
	for _, p := range Problems(err) {
		keys = append(keys, p.Key)
		if !strings.Contains(err.Error(), p.Error()) {
			t.Errorf("problem %q is not in the error %q", p, err)
		}
	}
	if diff := cmp.Diff([]string{"endpoints[0].url", "endpoints[0].engine", "log.format"}, keys); diff != "" {
		t.Errorf("keys (-want +got):\n%s", diff)
	}
	if got := Problems(fmt.Errorf("config: %w", os.ErrNotExist)); got != nil {
		t.Errorf("a file that does not read: problems %v, want none", got)
	}
}

func TestParse_DuplicateYAMLKey(t *testing.T) {
	_, err := Parse([]byte("listen: 127.0.0.1:1\nlisten: 127.0.0.1:2\n" + minimal))
	if err == nil || !strings.Contains(err.Error(), "listen") || strings.Contains(err.Error(), "yaml: yaml:") {
		t.Errorf("err = %v, want the duplicate key named, said once as a yaml error", err)
	}
	// A tab in the indentation: the parser's words, and what they usually mean.
	_, err = Parse([]byte("endpoints:\n\t- url: http://127.0.0.1:1\n"))
	if err == nil || !strings.Contains(err.Error(), "a tab in the indentation") {
		t.Errorf("tab-indented: err = %v, want the tab named", err)
	}
}

// TestParse_OneDocument: a file of two YAML documents is refused (only the first was read);
// one that starts with --- is one document.
func TestParse_OneDocument(t *testing.T) {
	if _, err := Parse([]byte(minimal + "---\nlisten: 127.0.0.1:2\n")); err == nil || !strings.Contains(err.Error(), "2 documents") {
		t.Errorf("two documents: err = %v, want them refused", err)
	}
	if _, err := Parse([]byte("---\n" + minimal)); err != nil {
		t.Errorf("one document after ---: %v", err)
	}
}

// TestParse_EndpointURLs: a port out of range is refused at load, not at the first health
// check; the same engine written in another case is listed twice.
func TestParse_EndpointURLs(t *testing.T) {
	for yaml, want := range map[string]string{
		"endpoints: [{url: 'http://127.0.0.1:99999', models: [m]}]\n":                               `port "99999" is not a port`,
		"endpoints: [{url: 'http://127.0.0.1:0', models: [m]}]\n":                                   `port "0" is not a port`,
		"endpoints: [{url: 'http://h:1', models: [m]}, {url: 'HTTP://H:1/', models: [m]}]\n":        "listed twice",
		"endpoints: [{url: 'http://h:1', models: [m]}, {url: 'http://h:1/engine2', models: [m]}]\n": "",
		"endpoints: [{url: 'http://h', models: [m]}, {url: 'https://h', models: [m]}]\n":            "",
	} {
		_, err := Parse([]byte(yaml))
		switch {
		case want == "" && err != nil:
			t.Errorf("%s: %v, want it accepted", yaml, err)
		case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
			t.Errorf("%s: err = %v, want %q", yaml, err, want)
		}
	}
}

func TestParse_Retries(t *testing.T) {
	c, err := Parse([]byte(minimal + "limits: {max_retries: 0}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Limits.Retries(); got != 0 {
		t.Errorf("retries = %d, want 0 when said explicitly", got)
	}
	_, err = Parse([]byte(minimal + "limits: {max_retries: -1, max_body_bytes: -5}\n"))
	if err == nil || !strings.Contains(err.Error(), "limits.max_retries") || !strings.Contains(err.Error(), "limits.max_body_bytes") {
		t.Errorf("err = %v, want both limits named", err)
	}
}

func TestLoad_RelativePaths(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "kvroute.yaml")
	if err := os.WriteFile(path, []byte("discovery: {file: eps.yaml}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := c.Path(c.Discovery.File), filepath.Join(dir, "eps.yaml"); got != want {
		t.Errorf("discovery path = %q, want %q", got, want)
	}
	if _, err := Load(filepath.Join(dir, "missing.yaml")); err == nil {
		t.Error("missing file: want an error")
	}
}

func TestParseEndpoints(t *testing.T) {
	for _, doc := range []string{
		"- url: http://10.0.0.1:8000\n  engine: sglang\n- url: http://10.0.0.2:8000\n",
		"endpoints:\n  - url: http://10.0.0.1:8000\n    engine: sglang\n  - url: http://10.0.0.2:8000\n",
	} {
		eps, err := ParseEndpoints([]byte(doc))
		if err != nil {
			t.Fatalf("%q: %v", doc, err)
		}
		if len(eps) != 2 || eps[0].Engine != "sglang" || eps[1].Engine != "openai" {
			t.Errorf("%q: got %+v", doc, eps)
		}
	}
	_, err := ParseEndpoints([]byte("- url: bad\n"))
	if err == nil || !strings.Contains(err.Error(), "endpoints[0].url") {
		t.Errorf("err = %v, want the bad url named", err)
	}
}

// TestParseEndpointsWarn: a discovery file's endpoints without an engine draw the warning the
// config's own draw (the same words, the same names), in both forms of the file; a file that
// sets every engine draws none, nor does one rejected.
func TestParseEndpointsWarn(t *testing.T) {
	c, err := Parse([]byte("auth: {mode: none}\nendpoints:\n  - url: http://10.0.0.1:8000\n    engine: sglang\n  - url: http://10.0.0.2:8000/\n"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		doc  string
		want []string
	}{
		{"- url: http://10.0.0.1:8000\n  engine: sglang\n- url: http://10.0.0.2:8000/\n", c.Warnings},
		{"endpoints:\n  - url: http://10.0.0.1:8000\n    engine: sglang\n  - url: http://10.0.0.2:8000/\n", c.Warnings},
		{"- url: http://10.0.0.1:8000\n  engine: sglang\n- url: http://10.0.0.2:8000\n  engine: auto\n", nil},
	} {
		eps, warnings, err := ParseEndpointsWarn([]byte(tc.doc))
		if err != nil || len(eps) != 2 {
			t.Fatalf("%q: %d endpoints, %v", tc.doc, len(eps), err)
		}
		if diff := cmp.Diff(tc.want, warnings); diff != "" {
			t.Errorf("%q: warnings (-want +got):\n%s", tc.doc, diff)
		}
	}
	if len(c.Warnings) != 1 || !strings.HasPrefix(c.Warnings[0], "endpoints[1] (http://10.0.0.2:8000): no engine, so openai") {
		t.Errorf("the config's warnings %q: want one naming endpoints[1]", c.Warnings)
	}
	if _, warnings, err := ParseEndpointsWarn([]byte("- url: bad\n")); err == nil || warnings != nil {
		t.Errorf("a rejected file: warnings %q, error %v; want none and an error", warnings, err)
	}
}

// TestParseEndpoints_EveryProblem: a discovery file's problems all come back at once, as the
// config's do (serve --check lists them all): unknown keys and mistyped values beside what
// validation finds in the rest, named alike in the list and the mapping form, a mistyped key
// once (not also as missing). Before, the first unknown key or mistyped value was the only
// problem reported.
func TestParseEndpoints_EveryProblem(t *testing.T) {
	const list = `- url: http://10.0.0.1:8000
  enigne: vllm
- url: bad
- url: 8000
- url: http://10.0.0.4:8000
  kv_tokens: -1
  step_tokens: lots
`
	want := []string{
		`endpoints[0].enigne: unknown key "enigne" in endpoints[0] (did you mean "engine"?`,
		`endpoints[2].url: got the number 8000, want text`,
		`endpoints[3].step_tokens: got the text "lots", want a whole number`,
		`endpoints[1].url: "bad" is not an http(s) base URL`,
		`endpoints[3].kv_tokens: -1 is negative`,
	}
	mapping := "endpoints:\n" + regexp.MustCompile(`(?m)^`).ReplaceAllString(list, "  ")
	for form, doc := range map[string]string{"list": list, "mapping": mapping} {
		_, err := ParseEndpoints([]byte(doc))
		if err == nil {
			t.Fatalf("%s: no error", form)
		}
		lines := strings.Split(err.Error(), "\n")
		if len(lines) != len(want) {
			t.Errorf("%s: %d problems, want %d:\n%v", form, len(lines), len(want), err)
		}
		for i, w := range want {
			if i >= len(lines) || !strings.HasPrefix(lines[i], w) {
				t.Errorf("%s: problem %d does not begin %q:\n%v", form, i, w, err)
			}
		}
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(minimal))
	f.Add([]byte("endpoints: [{url: 'http://a:1', labels: {x: y}}]\ntenants: [{name: a, api_keys: [x]}]\n"))
	f.Add([]byte("policy: {name: random, params: {a: [1]}}\nhealth: {interval: 1h}\n"))
	f.Add([]byte("- a\n- b\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data)
		if err == nil && c == nil {
			t.Fatal("nil config without error")
		}
		if err == nil {
			if verr := c.Validate(Checks{}); verr != nil {
				t.Fatalf("a parsed config fails Validate: %v", verr)
			}
		}
		_, _ = ParseEndpoints(data)
	})
}

// TestExamples loads the annotated examples, so that they never drift from the code.
func TestExamples(t *testing.T) {
	for _, name := range []string{"kvroute.yaml", "kvroute-tenants.yaml"} {
		c, err := Load(filepath.Join("..", "..", "examples", name))
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if len(c.Warnings) != 0 {
			t.Errorf("%s: warnings %q", name, c.Warnings)
		}
	}
	data, err := os.ReadFile(filepath.Join("..", "..", "examples", "endpoints.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	eps, err := ParseEndpoints(data)
	if err != nil || len(eps) != 2 {
		t.Errorf("endpoints.yaml: %d endpoints, %v", len(eps), err)
	}
}

func TestParse_ListenAndAdminListen(t *testing.T) {
	for _, tc := range []struct {
		listen, admin string
		wantErr       bool
	}{
		{"127.0.0.1:8080", "127.0.0.1:8080", true},
		{":9090", ":9090", true},
		{"127.0.0.1:0", "127.0.0.1:0", false}, // two free ports
		{":0", ":0", false},
		{"127.0.0.1:8080", "127.0.0.1:9090", false},
	} {
		_, err := Parse([]byte(fmt.Sprintf("listen: %q\nadmin_listen: %q\nendpoints: [{url: http://127.0.0.1:1}]\n", tc.listen, tc.admin)))
		if gotErr := err != nil; gotErr != tc.wantErr {
			t.Errorf("listen %s, admin_listen %s: err = %v, want error %v", tc.listen, tc.admin, err, tc.wantErr)
		}
		if err != nil && !strings.Contains(err.Error(), "admin_listen: ") {
			t.Errorf("error %q does not name admin_listen", err)
		}
	}
}

func TestLoadWith_AdjustBeforeValidate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kvroute.yaml")
	if err := os.WriteFile(path, []byte("listen: 127.0.0.1:8080\nendpoints: [{url: http://127.0.0.1:1}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := LoadWith(path, func(c *Config) { c.AdminListen = c.Listen }, Checks{})
	if err == nil || !strings.Contains(err.Error(), "is also listen") {
		t.Errorf("override to the same address: err = %v, want it caught", err)
	}
	c, err := LoadWith(path, func(c *Config) { c.Listen = "127.0.0.1:7000" }, Checks{})
	if err != nil || c.Listen != "127.0.0.1:7000" || c.AdminListen != DefaultAdminListen {
		t.Errorf("override: %+v, %v", c, err)
	}
}

func TestParse_EndpointHeader(t *testing.T) {
	c, err := Parse([]byte("endpoints: [{url: http://127.0.0.1:1}]\n"))
	if err != nil || c.Server.EndpointHeader != "" {
		t.Fatalf("default endpoint_header = %q, %v; want off", c.Server.EndpointHeader, err)
	}
	c, err = Parse([]byte("server: {endpoint_header: X-Kvroute-Endpoint}\nendpoints: [{url: http://127.0.0.1:1}]\n"))
	if err != nil || c.Server.EndpointHeader != SuggestedEndpointHeader {
		t.Errorf("endpoint_header = %q, %v", c.Server.EndpointHeader, err)
	}
	_, err = Parse([]byte("server: {endpoint_header: \"X Bad:\"}\nendpoints: [{url: http://127.0.0.1:1}]\n"))
	if err == nil || !strings.Contains(err.Error(), "server.endpoint_header") {
		t.Errorf("bad header name: err = %v, want it named", err)
	}
}

func TestParse_HTTPServer(t *testing.T) {
	for in, want := range map[string]string{"": HTTPServerBuiltin, "builtin": HTTPServerBuiltin, "net/http": HTTPServerNetHTTP} {
		c, err := Parse([]byte("server: {http_server: \"" + in + "\"}\nendpoints: [{url: http://127.0.0.1:1}]\n"))
		if err != nil || c.Server.HTTPServer != want {
			t.Errorf("http_server %q: got %q, %v; want %q", in, c.Server.HTTPServer, err, want)
		}
	}
	_, err := Parse([]byte("server: {http_server: fasthttp}\nendpoints: [{url: http://127.0.0.1:1}]\n"))
	if err == nil || !strings.Contains(err.Error(), "server.http_server") || !strings.Contains(err.Error(), "net/http") {
		t.Errorf("unknown server: err = %v, want the field named and the choices listed", err)
	}
}

func TestParse_TLS(t *testing.T) {
	for in, want := range map[string]string{
		"{cert_file: c.pem}":                  "server.tls.key_file: missing",
		"{key_file: k.pem}":                   "server.tls.cert_file: missing",
		"{cert_file: c.pem, key_file: k.pem}": "server.tls: cannot load the certificate and key",
	} {
		_, err := Parse([]byte("server: {tls: " + in + "}\nendpoints: [{url: http://127.0.0.1:1}]\n"))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("tls %s: err = %v, want %q", in, err, want)
		}
	}
	c, err := Parse([]byte("endpoints: [{url: http://127.0.0.1:1}]\n"))
	if err != nil || c.Server.TLS.Enabled() {
		t.Errorf("default: TLS enabled %v, %v; want off", c.Server.TLS.Enabled(), err)
	}
}

func TestQuick(t *testing.T) {
	c := Quick([]string{"http://127.0.0.1:1/", "http://127.0.0.1:2"}, "m", "vllm")
	c.SetDefaults()
	if err := c.Validate(testChecks); err != nil {
		t.Fatal(err)
	}
	if len(c.Warnings) != 0 || c.Auth.Mode != AuthNone {
		t.Errorf("auth %q, warnings %q: want authentication off without a warning", c.Auth.Mode, c.Warnings)
	}
	var got []string
	for _, e := range c.Endpoints {
		got = append(got, fmt.Sprintf("%s %v %s", e.URL, e.Models, e.Engine))
	}
	if diff := cmp.Diff([]string{"http://127.0.0.1:1 [m] vllm", "http://127.0.0.1:2 [m] vllm"}, got); diff != "" {
		t.Errorf("endpoints (-want +got):\n%s", diff)
	}
	if c := Quick([]string{"http://127.0.0.1:1"}, "", "openai"); c.Endpoints[0].Models != nil {
		t.Errorf("no model: models %v, want any (nil)", c.Endpoints[0].Models)
	}
}

func TestParse_ClientTimeouts(t *testing.T) {
	c, err := Parse([]byte("server: {body_read_timeout: 5s, body_min_rate: 1000, write_stall_timeout: 2m}\nendpoints: [{url: http://127.0.0.1:1}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	got := []any{c.Server.BodyReadTimeout.D(), c.Server.BodyMinRate, c.Server.WriteStallTimeout.D()}
	if diff := cmp.Diff([]any{5 * time.Second, int64(1000), 2 * time.Minute}, got); diff != "" {
		t.Errorf("body_read_timeout, body_min_rate, write_stall_timeout (-want +got):\n%s", diff)
	}
	_, err = Parse([]byte("server: {body_read_timeout: -1s, body_min_rate: -5, write_stall_timeout: -1s}\nendpoints: [{url: http://127.0.0.1:1}]\n"))
	for _, want := range []string{"server.body_read_timeout: -1s is negative", "server.body_min_rate: -5 is negative", "server.write_stall_timeout: -1s is negative"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v lacks %q", err, want)
		}
	}
}

// TestParse_DrainDelay: server.drain_delay is 5s when unset, 0 when set to 0 (none: not the
// default again), and a negative one is an error naming the key.
func TestParse_DrainDelay(t *testing.T) {
	for _, tc := range []struct {
		yaml string
		want time.Duration
	}{{"", DefaultDrainDelay}, {"server: {drain_delay: 0s}\n", 0}, {"server: {drain_delay: 12s}\n", 12 * time.Second}} {
		c, err := Parse([]byte(tc.yaml + "endpoints: [{url: http://127.0.0.1:1}]\n"))
		if err != nil {
			t.Fatal(err)
		}
		if got := c.Server.Drain(); got != tc.want {
			t.Errorf("%q: drain delay %v, want %v", tc.yaml, got, tc.want)
		}
	}
	_, err := Parse([]byte("server: {drain_delay: -1s}\nendpoints: [{url: http://127.0.0.1:1}]\n"))
	if want := "server.drain_delay: -1s is negative"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("error %v lacks %q", err, want)
	}
}

// TestExamplesLoad: every annotated example config decodes strictly and validates, so the
// documentation cannot drift from the code.
func TestExamplesLoad(t *testing.T) {
	paths, err := filepath.Glob("../../examples/*.yaml")
	if err != nil || len(paths) == 0 {
		t.Fatalf("no examples found: %v", err)
	}
	for _, p := range paths {
		if filepath.Base(p) == "endpoints.yaml" {
			if _, err := ParseEndpoints(mustRead(t, p)); err != nil {
				t.Errorf("%s: %v", p, err)
			}
			continue
		}
		if _, err := Load(p); err != nil {
			t.Errorf("%s: %v", p, err)
		}
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestParse_UnhealthyInterval: health.unhealthy_interval defaults to 1s, or to health.interval
// when that is shorter; longer than health.interval, or negative, is an error naming the key.
func TestParse_UnhealthyInterval(t *testing.T) {
	for _, tc := range []struct {
		health string
		want   time.Duration
	}{{"{}", time.Second}, {"{interval: 500ms, timeout: 200ms}", 500 * time.Millisecond}, {"{unhealthy_interval: 3s}", 3 * time.Second}} {
		c, err := Parse([]byte("health: " + tc.health + "\nendpoints: [{url: http://127.0.0.1:1}]\n"))
		if err != nil {
			t.Fatalf("health %s: %v", tc.health, err)
		}
		if got := c.Health.UnhealthyInterval.D(); got != tc.want {
			t.Errorf("health %s: unhealthy_interval %v, want %v", tc.health, got, tc.want)
		}
	}
	for health, want := range map[string]string{
		"{unhealthy_interval: 10s}": "health.unhealthy_interval: 10s is longer than health.interval 5s: make it at most that",
		"{unhealthy_interval: -1s}": "health.unhealthy_interval: must be positive, like 1s",
		"{refusal_percent: 101}":    "health.refusal_percent: 101: must be a percentage from 1 to 100, or -1 to turn the refusal rule off",
		"{refusal_volume: -2}":      "health.refusal_volume: -2 is negative",
		"{refusal_window: -1m}":     "health.refusal_window: must be positive, like 1m",
	} {
		_, err := Parse([]byte("health: " + health + "\nendpoints: [{url: http://127.0.0.1:1}]\n"))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("health %s: error %v, want %q", health, err, want)
		}
	}
	// Its default is not reported for the interval it was derived from: the key is not there.
	_, err := Parse([]byte("health: {interval: -5s}\nendpoints: [{url: http://127.0.0.1:1}]\n"))
	if err == nil || err.Error() != "health.interval: must be positive, like 5s" {
		t.Errorf("health {interval: -5s}: error %v, want health.interval's alone", err)
	}
}
