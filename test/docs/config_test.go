package docs_test

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/policy"
)

// The config check. Rules:
//   - Only fenced blocks marked yaml or yml are read.
//   - A block is a kvroute config when its first key at column 0 is one of the top-level keys
//     of internal/config's Config (listen:, policy:, endpoints:, peers:, ...). Blocks whose
//     first key is anything else (Helm values, Kubernetes manifests, Prometheus and Envoy
//     configs) or that start indented (a piece of a section) are not configs and are skipped.
//   - Every config block is loaded with config.LoadWith and the checks kvroute serve makes
//     (policy names and parameters). It must decode: valid YAML, no unknown key, no value of
//     the wrong type.
//   - A block with endpoints: or discovery: is a whole config: every problem the validation
//     finds counts too.
//   - A block with neither shows a section or two on their own. It is given one endpoint
//     (http://127.0.0.1:8000) before validation, and a validation problem counts only when it
//     is about a value the block sets (its path, such as policy.name or tenants[0].api_keys[0],
//     is a leaf of the block) or about a mapping whose own keys the block sets (policy.params):
//     problems about keys the block leaves out are the rest of the config's business.
//   - Validation that opens a file the example names (peers.tls.cert_file, say) finds none on
//     this machine: a problem whose message says the file does not exist is not counted.

// notThere is how an error says that a file does not exist (fs.ErrNotExist from the system).
var notThere = syscall.ENOENT.Error()

var topKey = regexp.MustCompile(`^([A-Za-z_][A-Za-z0-9_-]*)\s*:`)

// configKeys are Config's top-level keys, from its json tags.
func configKeys() []string {
	var keys []string
	for f := range reflect.TypeFor[config.Config]().Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name != "" && name != "-" {
			keys = append(keys, name)
		}
	}
	return keys
}

// configBlock is a YAML block that is a kvroute config.
type configBlock struct {
	line int // of its first content line
	text string
	keys []string // its top-level keys, in order
}

// configBlocks returns d's config blocks, by the rules above.
func (d *doc) configBlocks(known []string) []configBlock {
	var out []configBlock
	for _, f := range d.fences {
		if f.skip || f.info != "yaml" && f.info != "yml" {
			continue
		}
		var keys []string
		first := true
		for _, l := range f.lines {
			s := strings.TrimSpace(l)
			if s == "" || strings.HasPrefix(s, "#") {
				continue
			}
			if l == "---" || l == "..." {
				break // one document: the first
			}
			m := topKey.FindStringSubmatch(l)
			if first && m == nil {
				break // starts indented or is not a mapping: a piece, not a config
			}
			first = false
			if m != nil {
				keys = append(keys, m[1])
			}
		}
		if len(keys) == 0 || !slices.Contains(known, keys[0]) {
			continue
		}
		out = append(out, configBlock{line: f.line, text: strings.Join(f.lines, "\n"), keys: keys})
	}
	return out
}

// checkConfig returns one message per problem in b, each "LINE: problem" with LINE the line
// in the document; dir is a directory for the file LoadWith reads.
func checkConfig(b configBlock, dir string) []string {
	file := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(file, []byte(b.text), 0o600); err != nil {
		return []string{fmt.Sprintf("%d: %v", b.line, err)}
	}
	whole := slices.Contains(b.keys, "endpoints") || slices.Contains(b.keys, "discovery")
	decoded := false
	_, err := config.LoadWith(file, func(c *config.Config) {
		decoded = true
		if !whole {
			c.Endpoints = append(c.Endpoints, config.Endpoint{URL: "http://127.0.0.1:8000"})
		}
	}, config.Checks{PolicyNames: policy.Names(), Policy: policy.Check})
	if err == nil {
		return nil
	}
	var leaves map[string]bool
	if decoded && !whole {
		leaves = leafPaths(b.text)
	}
	var probs []string
	for _, e := range strings.Split(err.Error(), "\n") {
		e = strings.TrimPrefix(e, "config "+file+": ")
		if strings.Contains(e, notThere) {
			continue // a file on the reader's machine
		}
		m := errPath.FindStringSubmatch(e)
		if leaves != nil && (m == nil || !leaves[m[1]]) {
			continue // about a key the fragment leaves out
		}
		probs = append(probs, fmt.Sprintf("%d: %s", b.line+keyLine(b.text, e), e))
	}
	return probs
}

// leafPaths returns the paths of the scalar values a YAML text sets, and of the mappings and
// lists that hold them directly, written as config's errors write them: peers.tls.cert_file,
// peers.tls, tenants[0].api_keys[0], tenants[0].api_keys.
func leafPaths(text string) map[string]bool {
	var v any
	if err := yaml.Unmarshal([]byte(text), &v); err != nil {
		return map[string]bool{}
	}
	out := map[string]bool{}
	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, e := range v {
				p := k
				if path != "" {
					p = path + "." + k
				}
				walk(p, e)
			}
		case []any:
			for i, e := range v {
				walk(fmt.Sprintf("%s[%d]", path, i), e)
			}
		default:
			out[path] = true
			if i := strings.LastIndexAny(path, ".["); i > 0 {
				out[path[:i]] = true
			}
		}
	}
	walk("", v)
	return out
}

var errPath = regexp.MustCompile(`^([A-Za-z0-9_.\[\]]+):`)

// keyLine guesses the line of the block that an error message is about (0: the block's first):
// the line holding the last key of the path the message starts with, its (n+1)-th occurrence
// when the path goes through item n of a list (tenants[1].api_keys: the second api_keys).
func keyLine(text, msg string) int {
	m := errPath.FindStringSubmatch(msg)
	if m == nil {
		return 0
	}
	parts := strings.Split(m[1], ".")
	key := parts[len(parts)-1]
	if i := strings.IndexByte(key, '['); i >= 0 {
		key = key[:i]
	}
	skip := 0
	if im := listIndex.FindStringSubmatch(strings.Join(parts[:len(parts)-1], ".")); im != nil {
		skip, _ = strconv.Atoi(im[1])
	}
	re := regexp.MustCompile(`(^|[\s{,])` + regexp.QuoteMeta(key) + `\s*:`)
	first := -1
	for i, l := range strings.Split(text, "\n") {
		if !re.MatchString(l) {
			continue
		}
		if first < 0 {
			first = i
		}
		if skip == 0 {
			return i
		}
		skip--
	}
	return max(first, 0)
}

var listIndex = regexp.MustCompile(`\[(\d+)\]`)

func TestConfigExamples(t *testing.T) {
	known := configKeys()
	if !slices.Contains(known, "endpoints") || !slices.Contains(known, "listen") {
		t.Fatalf("config.Config's top-level keys %v lack endpoints or listen: is configKeys broken?", known)
	}
	n := 0
	for _, name := range docFiles(t) {
		d := readDoc(t, name)
		for _, b := range d.configBlocks(known) {
			n++
			for _, p := range checkConfig(b, t.TempDir()) {
				t.Errorf("%s:%s (the yaml block at line %d does not load: fix the example, or mark it %s if it is meant to fail)",
					name, p, b.line, skipMarker)
			}
		}
	}
	if n == 0 {
		t.Fatal("found no config example in the docs: is the block finder broken?")
	}
	t.Logf("%d config examples loaded", n)
}

// TestConfigRules runs the config check on made-up blocks.
func TestConfigRules(t *testing.T) {
	known := configKeys()
	for _, tc := range []struct {
		block string
		want  []string // problems' starts
	}{
		{"```yaml\nlisten: \":8080\"\nendpoints:\n  - url: http://10.0.0.1:8000\n```", nil},
		{"```yaml\npolicy:\n  name: prefix-aware\n```", nil},           // a section alone: an endpoint is added
		{"```yaml\nreplicaCount: 3\npeers: {enabled: true}\n```", nil}, // Helm values
		{"```yaml\n  listen: nonsense\n```", nil},                      // a piece
		{"```yaml\napiVersion: v1\n---\nlisten: x\n```", nil},          // a manifest
		{"<!-- docs-test: skip -->\n```yaml\nlisten: 1\n```", nil},     // marked
		{"```yaml\nlisten: \":8080\"\nendpoint:\n  - url: http://x:1\n```", []string{`3: endpoint: unknown key "endpoint"`}},
		{"```yaml\nscrape:\n  interval: 5\n```", []string{`3: scrape.interval: got the number 5, want a duration`}},
		{"```yaml\npolicy:\n  name: prefix-awar\n```", []string{`3: policy.name:`}},
		{"```yaml\npeers:\n  tls: {server_name: kvroute-peers}\n```", nil}, // peers.listen and the rest: elsewhere
		{"```yaml\ntenants:\n  - name: a\n    api_keys: [\"sha256:...\"]\n```", []string{`4: tenants[0].api_keys[0]: sha256:... has 3 hex digits`}},
		{"```yaml\nendpoints: []\npolicy: {name: round-robin}\n```", []string{`2: endpoints: no endpoints`}},
		{"```yaml\nlisten: [\n```", []string{`2: yaml:`}},
		{"```yaml\nlimits: {max_body_bytes: 1}\n# x\npolicy:\n  name: prefix-aware\n  params: {no_such_param: 1}\n```", []string{`6: policy.params: policy prefix-aware: unknown parameter "no_such_param"`}},
	} {
		d := parseDoc("x.md", tc.block)
		var got []string
		for _, b := range d.configBlocks(known) {
			got = append(got, checkConfig(b, t.TempDir())...)
		}
		if len(got) != len(tc.want) {
			t.Errorf("%q: got %d problems %q, want %d %q", tc.block, len(got), got, len(tc.want), tc.want)
			continue
		}
		for i := range got {
			if !strings.HasPrefix(got[i], tc.want[i]) {
				t.Errorf("%q: problem %d is %q, want it to start %q", tc.block, i, got[i], tc.want[i])
			}
		}
	}
}
