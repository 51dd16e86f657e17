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

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/yaml"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/policy"
)

// The config check. Rules:
//   - Only fenced blocks marked yaml or yml are read.
//   - A block is a kvroute config when its first key at column 0 is one of the top-level keys
//     of internal/config's Config (listen:, policy:, endpoints:, peers:, ...). Blocks whose
//     first key is anything else (Helm values, Kubernetes manifests, Prometheus and Envoy
//     configs) or that start indented (a piece of a section) are not configs and are skipped,
//     with one exception: Helm values (a block whose first key is a top-level key of
//     deploy/helm/kvroute/values.yaml) with a config: mapping; what is under it is a config.
//   - Every config block is loaded with config.LoadWith and the checks kvroute serve makes
//     (policy names and parameters). It must decode: valid YAML, no unknown key, no value of
//     the wrong type.
//   - A block with endpoints: or discovery: is a whole config: every problem the validation
//     finds counts too.
//   - A block with neither shows a section or two on their own. It is given one endpoint
//     (http://127.0.0.1:8000) before validation, and a validation problem counts only when it
//     is about a value the block sets (its path, such as policy.name or tenants[0].api_keys[0],
//     is a leaf of the block) or about a map-typed key whose entries the block sets
//     (policy.params): problems about keys the block leaves out are the rest of the config's
//     business (the Helm chart's, for a config: under Helm values).
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

// configBlocks returns d's config blocks, by the rules above; helmTop are the top-level keys of
// the Helm chart's values.
func (d *doc) configBlocks(known, helmTop []string) []configBlock {
	var out []configBlock
	for _, f := range d.fences {
		if f.skip || f.info != "yaml" && f.info != "yml" {
			continue
		}
		keys := topKeys(f.lines)
		switch {
		case len(keys) == 0:
		case slices.Contains(known, keys[0]):
			out = append(out, configBlock{line: f.line, text: strings.Join(f.lines, "\n"), keys: keys})
		case slices.Contains(helmTop, keys[0]) && slices.Contains(keys, "config"):
			if b, ok := helmConfig(f); ok && len(b.keys) > 0 && slices.Contains(known, b.keys[0]) {
				out = append(out, b)
			}
		}
	}
	return out
}

// topKeys returns the keys at column 0 of the first YAML document in lines, none when it starts
// indented or is not a mapping.
func topKeys(lines []string) []string {
	var keys []string
	for _, l := range lines {
		s := strings.TrimSpace(l)
		if s == "" || strings.HasPrefix(s, "#") {
			continue
		}
		if l == "---" || l == "..." {
			break // one document: the first
		}
		m := topKey.FindStringSubmatch(l)
		if len(keys) == 0 && m == nil {
			return nil // starts indented or is not a mapping: a piece, not a config
		}
		if m != nil {
			keys = append(keys, m[1])
		}
	}
	return keys
}

// helmConfig returns the block under the config: key of Helm values, dedented.
func helmConfig(f fence) (configBlock, bool) {
	start := -1
	for i, l := range f.lines {
		if strings.HasPrefix(l, "config:") && strings.TrimSpace(strings.TrimPrefix(l, "config:")) == "" {
			start = i + 1
			break
		}
	}
	if start < 0 {
		return configBlock{}, false // config: {...} on one line: not read
	}
	end := start
	indent := -1
	for end < len(f.lines) {
		l := f.lines[end]
		if strings.TrimSpace(l) != "" {
			n := len(l) - len(strings.TrimLeft(l, " "))
			if n == 0 {
				break
			}
			if indent < 0 || n < indent {
				indent = n
			}
		}
		end++
	}
	var lines []string
	for _, l := range f.lines[start:end] {
		if len(l) >= indent && indent > 0 {
			l = l[indent:]
		}
		lines = append(lines, l)
	}
	return configBlock{line: f.line + start, text: strings.Join(lines, "\n"), keys: topKeys(lines)}, true
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
	var leaves, parents map[string]bool
	if decoded && !whole {
		leaves, parents = leafPaths(b.text)
	}
	var probs []string
	for _, e := range strings.Split(err.Error(), "\n") {
		e = strings.TrimPrefix(e, "config "+file+": ")
		if strings.Contains(e, notThere) {
			continue // a file on the reader's machine
		}
		m := errPath.FindStringSubmatch(e)
		// A key the loader does not know is the fragment's own (the loader decodes the rest
		// and judges it too, so the adjust function runs with it).
		if leaves != nil && !strings.Contains(e, "unknown key") && (m == nil || !leaves[m[1]] && !(parents[m[1]] && isMap(m[1]))) {
			continue // about a key the fragment leaves out
		}
		probs = append(probs, fmt.Sprintf("%d: %s", b.line+keyLine(b.text, e), e))
	}
	return probs
}

// leafPaths returns the paths of the scalar values a YAML text sets, and of the mappings and
// lists that hold them directly, written as config's errors write them: peers.tls.cert_file,
// tenants[0].api_keys[0]; peers.tls, tenants[0].api_keys.
func leafPaths(text string) (leaves, parents map[string]bool) {
	leaves, parents = map[string]bool{}, map[string]bool{}
	var v any
	if err := yaml.Unmarshal([]byte(text), &v); err != nil {
		return leaves, parents
	}
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
			leaves[path] = true
			if i := strings.LastIndexAny(path, ".["); i > 0 {
				parents[path[:i]] = true
			}
		}
	}
	walk("", v)
	return leaves, parents
}

// isMap reports whether the config path p (policy.params) is a map in config.Config.
func isMap(p string) bool {
	t, ok := typeAt(p)
	return ok && t.Kind() == reflect.Map
}

// typeAt returns the type of the field at config path p, list items ([N], []) taken as their
// element; false when there is no such field (below a map or an interface there is none).
func typeAt(p string) (reflect.Type, bool) {
	t := reflect.TypeFor[config.Config]()
	for _, k := range strings.Split(p, ".") {
		k, _, _ = strings.Cut(k, "[")
		for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice {
			t = t.Elem()
		}
		if t.Kind() != reflect.Struct {
			return nil, false
		}
		var next reflect.Type
		for f := range t.Fields() {
			if name, _, _ := strings.Cut(f.Tag.Get("json"), ","); name == k {
				next = f.Type
			}
		}
		if next == nil {
			return nil, false
		}
		t = next
	}
	return t, true
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
	helmTop := helmTopKeys(t)
	if !slices.Contains(known, "endpoints") || !slices.Contains(known, "listen") {
		t.Fatalf("config.Config's top-level keys %v lack endpoints or listen: is configKeys broken?", known)
	}
	n := 0
	for _, name := range docFiles(t) {
		d := readDoc(t, name)
		for _, b := range d.configBlocks(known, helmTop) {
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
	helmTop := helmTopKeys(t)
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
		{"```yaml\nreplicaCount: 3\nconfig:\n  peers: {batch_interval: 10ms}\n```", nil},
		{"```yaml\nreplicaCount: 3\nconfig:\n\n  policy:\n    name: round-robin\n    prams: {}\nmode: x\n```", []string{`7: policy.prams: unknown key "prams"`}},
		{"```yaml\nlimits: {max_body_bytes: 1}\n# x\npolicy:\n  name: prefix-aware\n  params: {no_such_param: 1}\n```", []string{`6: policy.params: policy prefix-aware: unknown parameter "no_such_param"`}},
	} {
		d := parseDoc("x.md", tc.block)
		var got []string
		for _, b := range d.configBlocks(known, helmTop) {
			got = append(got, checkConfig(b, t.TempDir())...)
		}
		wantProblems(t, tc.block, got, tc.want)
	}
}

// The key check. An inline code span in prose that is a dotted path of lower-case keys whose
// first key is one of Config's top-level keys (`peers.batch_interval`,
// `discovery.kubernetes[].service`, `tenants[].api_keys`) names a config key: every key of the
// path must exist at its place in config.Config (below a map, such as policy.params, anything
// goes). A path may end in "[]" or "[N]" on a list. Two kinds of span are not config keys: a
// file name (`server.go`: the last key is a file extension) and a key of the Helm chart's
// values (deploy/helm/kvroute/values.yaml: `peers.enabled`), which docs/kubernetes.md uses
// beside the config's; a path that is either is not checked.

// fileExts are the last "keys" that make a span a file name.
var fileExts = []string{"go", "md", "yaml", "yml", "json", "jsonl", "txt", "sh", "html", "mjs"}

// helmTopKeys returns the top-level keys of the Helm chart's values.
func helmTopKeys(t *testing.T) []string {
	var keys []string
	for p := range helmPaths(t) {
		if !strings.ContainsAny(p, ".[") {
			keys = append(keys, p)
		}
	}
	if !slices.Contains(keys, "replicaCount") || !slices.Contains(keys, "config") {
		t.Fatalf("the Helm chart's values have no replicaCount or config at the top (%v): update this test", keys)
	}
	return keys
}

// helmPaths returns the dotted paths of the Helm chart's values (lists as []).
func helmPaths(t *testing.T) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "deploy", "helm", "kvroute", "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var v any
	if err := yaml.Unmarshal(b, &v); err != nil {
		t.Fatalf("deploy/helm/kvroute/values.yaml: %v", err)
	}
	out := map[string]bool{}
	var walk func(path string, v any)
	walk = func(path string, v any) {
		if path != "" {
			out[path] = true
		}
		switch v := v.(type) {
		case map[string]any:
			for k, e := range v {
				walk(strings.TrimPrefix(path+"."+k, "."), e)
			}
		case []any:
			for _, e := range v {
				walk(path+"[]", e)
			}
		}
	}
	walk("", v)
	return out
}

var keyPath = regexp.MustCompile(`^[a-z_]+(\[\d*\])?(\.[a-z_]+(\[\d*\])?)+$`)

// checkKeyPath returns what is wrong with a dotted config path ("" when nothing).
func checkKeyPath(p string) string {
	t := reflect.TypeFor[config.Config]()
	walked := ""
	for _, k := range strings.Split(p, ".") {
		k, _, _ = strings.Cut(k, "[")
		for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice {
			t = t.Elem()
		}
		if t.Kind() == reflect.Map || t.Kind() == reflect.Interface {
			return ""
		}
		if t.Kind() != reflect.Struct {
			return fmt.Sprintf("%s is a value, it has no key %q", walked, k)
		}
		var next reflect.Type
		var names []string
		for f := range t.Fields() {
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "" || name == "-" {
				continue
			}
			names = append(names, name)
			if name == k {
				next = f.Type
			}
		}
		if next == nil {
			where := walked
			if where == "" {
				where = "the top level"
			}
			return fmt.Sprintf("the config has no key %q in %s (known: %s)", k, where, strings.Join(names, ", "))
		}
		t = next
		walked = strings.TrimPrefix(walked+"."+k, ".")
	}
	return ""
}

// keyPaths returns d's inline spans that name config keys, by the rule above.
func (d *doc) keyPaths(known []string) []span {
	var out []span
	for _, s := range d.codeSpans() {
		first, _, _ := strings.Cut(s.text, ".")
		first, _, _ = strings.Cut(first, "[")
		last := s.text[strings.LastIndexByte(s.text, '.')+1:]
		if keyPath.MatchString(s.text) && slices.Contains(known, first) && !slices.Contains(fileExts, last) {
			out = append(out, s)
		}
	}
	return out
}

func TestConfigKeys(t *testing.T) {
	known := configKeys()
	helm := helmPaths(t)
	if !helm["peers.enabled"] {
		t.Fatalf("deploy/helm/kvroute/values.yaml has no peers.enabled: update this test's example")
	}
	n := 0
	for _, name := range docFiles(t) {
		d := readDoc(t, name)
		for _, s := range d.keyPaths(known) {
			n++
			if p := checkKeyPath(s.text); p != "" && !helm[s.text] {
				t.Errorf("%s:%d: `%s`: %s: write the key's current name (examples/kvroute.yaml has them all)", name, s.line, s.text, p)
			}
		}
	}
	if n == 0 {
		t.Fatal("found no config key in the docs' prose: is the span finder broken?")
	}
	t.Logf("%d config keys checked", n)
}

func TestConfigKeyRules(t *testing.T) {
	known := configKeys()
	d := parseDoc("x.md", "`peers.batch_interval`, `discovery.kubernetes[].service`, `tenants[0].api_keys`,\n"+
		"`policy.params.anything`, `policy.Pick`, `limits.first_token_timeout`, `scrape.intervall`, `peers.listen.port`, `foo.bar`, `server.go`")
	var got []string
	for _, s := range d.keyPaths(known) {
		if p := checkKeyPath(s.text); p != "" {
			got = append(got, s.text)
		}
	}
	if diff := cmp.Diff([]string{"scrape.intervall", "peers.listen.port"}, got); diff != "" {
		t.Errorf("paths refused (-want +got):\n%s", diff)
	}
}
