package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// What a new user's first configs got wrong without a word from the config, each found only
// when the router started, or never.

func TestCheckAddr_Port(t *testing.T) {
	cases := []struct {
		addr string
		want string // "" for none
	}{
		{"127.0.0.1:8080", ""},
		{":0", ""},
		{"[::1]:65535", ""},
		{"127.0.0.1:http", ""}, // net.Listen takes a service name
		{"127.0.0.1:99999", `listen: "127.0.0.1:99999": port 99999 is not 0 to 65535: write it like 127.0.0.1:8080`},
		{":65536", `listen: ":65536": port 65536 is not 0 to 65535`},
		{":123456789012345678901234567890", `port 123456789012345678901234567890 is not 0 to 65535`},
		{"127.0.0.1:-1", `listen: "127.0.0.1:-1": port "-1" is neither a number from 0 to 65535 nor a known service name`},
		{"127.0.0.1:nosuchservice", `port "nosuchservice" is neither a number from 0 to 65535 nor a known service name`},
		{"127.0.0.1", `listen: "127.0.0.1" is not host:port`},
	}
	for _, c := range cases {
		var p problems
		checkAddr(&p, "listen", c.addr)
		err := p.err()
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: %v, want no problem", c.addr, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: %v, want %q", c.addr, err, c.want)
		case c.want != "" && len(p.errs) != 1:
			t.Errorf("%s: %d problems, want 1: %v", c.addr, len(p.errs), err)
		}
	}
	// Every listen address is checked alike: the admin listener's too.
	_, err := Parse([]byte(minimal + "admin_listen: 127.0.0.1:70000\n"))
	if err == nil || !strings.Contains(err.Error(), `admin_listen: "127.0.0.1:70000": port 70000 is not 0 to 65535`) {
		t.Errorf("admin_listen :70000: %v, want the port named", err)
	}
}

func TestParse_EngineUnsetWarned(t *testing.T) {
	c, err := Parse([]byte(`
auth: {mode: none}
endpoints:
  - url: http://127.0.0.1:8001/
  - {url: http://127.0.0.1:8002, engine: vllm}
  - {url: http://127.0.0.1:8003, engine: auto}
  - url: http://127.0.0.1:8004
discovery:
  dns: [{name: vllm.example, port: 8000}, {name: sglang.example, port: 8000, endpoint: {engine: sglang}}]
  kubernetes:
    - {service: vllm}
    - {service: vllm-pods, pod_metadata: true}
    - {service: sglang, endpoint: {engine: sglang}}
  inference_pool: {name: pool}
`))
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Warnings) != 1 {
		t.Fatalf("warnings = %q, want one", c.Warnings)
	}
	w := c.Warnings[0]
	// At most five named, then how many more: a fleet of hundreds would bury the fix.
	for _, want := range []string{
		"endpoints[0] (http://127.0.0.1:8001), endpoints[3] (http://127.0.0.1:8004), discovery.dns[0].endpoint (vllm.example), discovery.kubernetes[0].endpoint, discovery.inference_pool.endpoint: no engine, so openai",
		"set engine: vllm, sglang, tgi, llamacpp, ollama, openai or auto",
	} {
		if !strings.Contains(w, want) {
			t.Errorf("warning %q lacks %q", w, want)
		}
	}
	// The default stays.
	if c.Endpoints[0].Engine != "openai" {
		t.Errorf("endpoints[0].engine = %q, want the default, openai", c.Endpoints[0].Engine)
	}

	var many strings.Builder
	many.WriteString("auth: {mode: none}\nendpoints:\n")
	for i := range 8 {
		many.WriteString("  - url: http://127.0.0.1:" + string(rune('1'+i)) + "000\n")
	}
	c, err = Parse([]byte(many.String()))
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Warnings) != 1 || !strings.HasPrefix(c.Warnings[0], "endpoints[0] (http://127.0.0.1:1000), endpoints[1] (http://127.0.0.1:2000), endpoints[2] (http://127.0.0.1:3000), endpoints[3] (http://127.0.0.1:4000), endpoints[4] (http://127.0.0.1:5000), 3 more: no engine") {
		t.Errorf("8 endpoints without an engine: warnings %q, want five named and 3 more", c.Warnings)
	}

	// Every endpoint's kind said, openai included: no warning.
	c, err = Parse([]byte("auth: {mode: none}\nendpoints: [{url: http://127.0.0.1:1, engine: openai}, {url: http://127.0.0.1:2, engine: vllm}]\n"))
	if err != nil || len(c.Warnings) != 0 {
		t.Errorf("engines set: warnings %q, err %v, want none", c.Warnings, err)
	}
	// SetDefaults again (as a caller may) keeps the load's warning out of it but does not
	// invent one either.
	c.SetDefaults()
	if len(c.Warnings) != 0 {
		t.Errorf("after SetDefaults: warnings %q, want none", c.Warnings)
	}
}

func TestParse_ListAtTopLevel(t *testing.T) {
	// An endpoints list, as a discovery file holds, given where a config is wanted.
	_, err := Parse([]byte("- url: http://127.0.0.1:8001\n- url: http://127.0.0.1:8002\n"))
	want := "the top level: got a list, want a mapping of keys (a list of endpoints is a discovery.file, not a config)"
	if err == nil || err.Error() != want {
		t.Errorf("err = %v, want %q", err, want)
	}
	// Any other wrong top level is not taken for one.
	for _, data := range []string{"just text\n", "- a\n- b\n", "[{name: x}]\n"} {
		_, err = Parse([]byte(data))
		if err == nil || strings.Contains(err.Error(), "discovery.file") {
			t.Errorf("%q: %v, want an error that does not mention discovery.file", data, err)
		}
	}
	// A discovery file may still be a list.
	eps, err := ParseEndpoints([]byte("- url: http://127.0.0.1:8001\n"))
	if err != nil || len(eps) != 1 {
		t.Errorf("discovery list: %v, %v", eps, err)
	}
}

func TestLoad_ResolvedDir(t *testing.T) {
	// A config given by a relative path resolves its relative paths to absolute ones, so that
	// a message about a file (a missing discovery.file) names where it was looked for.
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "kvroute.yaml"), []byte("auth: {mode: none}\ndiscovery: {file: eps.yaml}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Chdir(dir)
	c, err := Load("kvroute.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := c.Path(c.Discovery.File), filepath.Join(dir, "eps.yaml"); got != want {
		t.Errorf("discovery path = %q, want %q", got, want)
	}
	if !filepath.IsAbs(c.Dir) {
		t.Errorf("Dir = %q, want an absolute path", c.Dir)
	}
}
