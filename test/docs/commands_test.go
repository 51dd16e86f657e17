package docs_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/internal/experiment"
)

// The command check. The truth is the binary: the first test that needs it builds cmd/kvroute, `kvroute help` lists
// its verbs and `kvroute VERB -h` each verb's flags. Rules:
//   - Only fenced blocks marked sh, bash, shell or console, or not marked at all, hold commands
//     (yaml, json and the like do not); a line ending in \ goes on on the next; a leading "$ "
//     prompt and everything from a # that starts a word are dropped.
//   - An inline code span in prose is a command when it starts with the word kvroute (or with
//     go run ./cmd/kvroute) and then a word of lower-case letters and hyphens, or a flag:
//     `kvroute simulate --routers 3`, not `kvroute serve: listening` (output) nor
//     `kvroute <version>`.
//   - A command starts a line or follows |, ||, &&, ;, &, ( or $( ; VAR=value words, time and
//     nohup before it are skipped. It is kvroute's when its program is named kvroute (any
//     directory: bin/kvroute, ./kvroute), is `go run ./cmd/kvroute`, or is a path the same
//     document built with `go build -o PATH ./cmd/kvroute`.
//   - Its first argument must be a verb (or help, -h, --help, --version); every later word that
//     looks like a flag (-name, --name, --name=value) must be a flag of that verb. A lone --
//     ends the flags.

// binDir is where readCLI builds the binary: a temporary directory TestMain removes at the end.
var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "kvroute-docs-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// buildKvroute builds cmd/kvroute into binDir. With a warm build cache it takes seconds; from
// an empty one, minutes on two cores (the test/e2e build of the same binary shares the cache).
func buildKvroute() (string, error) {
	bin := filepath.Join(binDir, "kvroute")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/kvroute/kvroute/cmd/kvroute")
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/kvroute: %w\n%s", err, out)
	}
	return bin, nil
}

// cli is what the binary says it accepts: verb name -> its flag names.
type cli map[string]map[string]bool

var flagLine = regexp.MustCompile(`^ {2}-([A-Za-z0-9][A-Za-z0-9_.-]*)`)

var (
	cliOnce sync.Once
	cliSeen cli
	cliErr  error
)

// readCLI builds the binary and asks it for its verbs and their flags (once per test binary).
func readCLI(t *testing.T) cli {
	t.Helper()
	cliOnce.Do(func() { cliSeen, cliErr = askCLI() })
	if cliErr != nil {
		t.Fatal(cliErr)
	}
	return cliSeen
}

func askCLI() (cli, error) {
	kvrouteBin, err := buildKvroute()
	if err != nil {
		return nil, err
	}
	out, err := exec.Command(kvrouteBin, "help").Output()
	if err != nil {
		return nil, fmt.Errorf("kvroute help: %w", err)
	}
	verbs := commandList(string(out))
	if len(verbs) < 5 {
		return nil, fmt.Errorf("kvroute help lists %d verbs (%v): has its format changed?\n%s", len(verbs), verbs, out)
	}
	c := cli{}
	for _, v := range verbs {
		out, err := exec.Command(kvrouteBin, v, "-h").Output()
		if err != nil {
			return nil, fmt.Errorf("kvroute %s -h: %w\n%s", v, err, out)
		}
		c[v] = flagNames(string(out))
		if len(c[v]) == 0 {
			return nil, fmt.Errorf("kvroute %s -h lists no flags: has its format changed?\n%s", v, out)
		}
	}
	return c, nil
}

// commandList reads the verbs from kvroute help: the lines under "commands:", each "  NAME  summary".
func commandList(help string) []string {
	var verbs []string
	in := false
	sc := bufio.NewScanner(strings.NewReader(help))
	for sc.Scan() {
		l := sc.Text()
		if strings.TrimSpace(l) == "commands:" {
			in = true
			continue
		}
		if in && strings.HasPrefix(l, "  ") {
			if f := strings.Fields(l); len(f) > 0 {
				verbs = append(verbs, f[0])
			}
		}
	}
	return verbs
}

// flagNames reads the flags from -h: the lines of flag.PrintDefaults, "  -name type".
func flagNames(help string) map[string]bool {
	names := map[string]bool{}
	_, after, ok := strings.Cut(help, "\nflags:\n")
	if !ok {
		return names
	}
	for _, l := range strings.Split(after, "\n") {
		if m := flagLine.FindStringSubmatch(l); m != nil {
			names[m[1]] = true
		}
	}
	return names
}

// shellish are the fence infos whose blocks hold commands.
var shellish = []string{"", "sh", "bash", "shell", "console", "zsh"}

// command is one kvroute invocation found in a document.
type command struct {
	line int
	args []string // after the program
}

// commands returns d's kvroute commands.
func (d *doc) commands() []command {
	var out []command
	built := map[string]bool{} // paths that go build -o made kvroute
	for _, f := range d.fences {
		if f.skip || !slices.Contains(shellish, f.info) {
			continue
		}
		for i := 0; i < len(f.lines); i++ {
			start := f.line + i
			l := strings.TrimSpace(f.lines[i])
			for strings.HasSuffix(l, `\`) && i+1 < len(f.lines) {
				i++
				l = strings.TrimSuffix(l, `\`) + " " + strings.TrimSpace(f.lines[i])
			}
			l = strings.TrimPrefix(l, "$ ")
			for _, words := range simpleCommands(shellWords(l)) {
				if args, ok := kvrouteArgs(words, built); ok {
					out = append(out, command{line: start, args: args})
				}
			}
		}
	}
	for _, s := range d.codeSpans() {
		if !inlineCommand.MatchString(s.text) {
			continue
		}
		for _, words := range simpleCommands(shellWords(s.text)) {
			if args, ok := kvrouteArgs(words, built); ok {
				out = append(out, command{line: s.line, args: args})
			}
		}
	}
	slices.SortStableFunc(out, func(a, b command) int { return a.line - b.line })
	return out
}

// shellWords splits a command line into words and operators, honouring quotes, up to a comment.
func shellWords(l string) []string {
	var words []string
	var cur strings.Builder
	inWord := false
	flush := func() {
		if inWord {
			words = append(words, cur.String())
			cur.Reset()
			inWord = false
		}
	}
	for i := 0; i < len(l); i++ {
		c := l[i]
		switch {
		case c == '\'' || c == '"':
			j := strings.IndexByte(l[i+1:], c)
			if j < 0 {
				j = len(l) - i - 1
			}
			cur.WriteString(l[i+1 : i+1+j])
			inWord = true
			i += j + 1
		case c == ' ' || c == '\t':
			flush()
		case c == '#' && !inWord:
			flush()
			return words
		case c == '$' && i+1 < len(l) && l[i+1] == '(':
			flush()
			words = append(words, "$(")
			i++
		case strings.IndexByte("|&;()<>", c) >= 0:
			flush()
			op := string(c)
			if i+1 < len(l) && (l[i+1] == c || c == '>' && l[i+1] == '&') {
				op += string(l[i+1])
				i++
			}
			words = append(words, op)
		default:
			cur.WriteByte(c)
			inWord = true
		}
	}
	flush()
	return words
}

// simpleCommands splits words at the operators that start a new command, and drops
// redirections (an operator of < or > and the word after it).
func simpleCommands(words []string) [][]string {
	var out [][]string
	var cur []string
	for i := 0; i < len(words); i++ {
		w := words[i]
		switch {
		case w == "|" || w == "||" || w == "&&" || w == ";" || w == "&" || w == "(" || w == ")" || w == "$(":
			if len(cur) > 0 {
				out = append(out, cur)
			}
			cur = nil
		case strings.HasPrefix(w, "<") || strings.HasPrefix(w, ">"):
			i++ // its target
		default:
			cur = append(cur, w)
		}
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}

var inlineCommand = regexp.MustCompile(`^(go run \./cmd/)?kvroute (-{0,2}[a-z][a-z-]*)( |$)`)

var envAssign = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*=`)

// kvrouteArgs returns the arguments of words when they run kvroute. built collects the paths
// that `go build -o PATH ./cmd/kvroute` writes, for later commands of the same document.
func kvrouteArgs(words []string, built map[string]bool) ([]string, bool) {
	for len(words) > 0 && (envAssign.MatchString(words[0]) || words[0] == "time" || words[0] == "nohup") {
		words = words[1:]
	}
	if len(words) == 0 {
		return nil, false
	}
	isPkg := func(w string) bool {
		return w == "./cmd/kvroute" || w == "github.com/kvroute/kvroute/cmd/kvroute"
	}
	switch {
	case path.Base(words[0]) == "kvroute" || built[words[0]]:
		return words[1:], true
	case words[0] == "go" && len(words) > 2 && words[1] == "run":
		for i := 2; i < len(words); i++ {
			if isPkg(words[i]) {
				return words[i+1:], true
			}
		}
	case words[0] == "go" && len(words) > 2 && words[1] == "build":
		if i := slices.Index(words, "-o"); i > 0 && i+1 < len(words) && slices.ContainsFunc(words, isPkg) {
			built[words[i+1]] = true
		}
	}
	return nil, false
}

var flagWord = regexp.MustCompile(`^--?([A-Za-z][A-Za-z0-9_.-]*)(?:=.*)?$`)

// checkCommand returns what is wrong with one kvroute command line, as messages without a place.
func checkCommand(c cli, args []string) []string {
	if len(args) == 0 {
		return nil
	}
	verb := args[0]
	switch verb {
	case "help", "-h", "--help", "-help", "--version", "-version":
		return nil
	}
	flags, ok := c[verb]
	if !ok {
		verbs := make([]string, 0, len(c))
		for v := range c {
			verbs = append(verbs, v)
		}
		slices.Sort(verbs)
		return []string{fmt.Sprintf("kvroute has no command %q: use one of %s", verb, strings.Join(verbs, ", "))}
	}
	var probs []string
	for i, w := range args[1:] {
		if w == "--" {
			break
		}
		m := flagWord.FindStringSubmatch(w)
		if m != nil && (m[1] == "policy" || m[1] == "policies") && flags[m[1]] {
			if p := checkPolicies(w, args[1:], i); p != "" {
				probs = append(probs, p)
			}
			continue
		}
		if m == nil || m[1] == "h" || m[1] == "help" || flags[m[1]] {
			continue
		}
		probs = append(probs, fmt.Sprintf("kvroute %s has no flag %s%s: rename or drop it (kvroute %s -h lists its flags)",
			verb, strings.SplitN(w, "=", 2)[0], nearFlag(m[1], flags), verb))
	}
	return probs
}

// placeholder matches a value written for the reader to fill in (NAME, PARAM, $p, [...]).
var placeholder = regexp.MustCompile(`[A-Z]{2,}|[$\[\]<>{}]`)

// checkPolicies checks the value of a --policy or --policies flag (args[i], its value after
// "=" or in args[i+1]) as kvroute parses it: every policy known, every parameter one the
// policy takes (internal/experiment.ParsePolicies, policy.Check). "" when it parses, or when
// the value is a placeholder.
func checkPolicies(w string, args []string, i int) string {
	flag, v, ok := strings.Cut(w, "=")
	if !ok {
		if i+1 >= len(args) {
			return ""
		}
		v = args[i+1]
	}
	v = strings.Trim(v, "'\"")
	if v == "" || placeholder.MatchString(v) {
		return ""
	}
	if _, err := experiment.ParsePolicies(v); err != nil {
		return fmt.Sprintf("%s %s: %v: fix the policy spec (docs/policy.md lists each policy's parameters)", flag, v,
			strings.ReplaceAll(err.Error(), "\n", "; "))
	}
	return ""
}

// nearFlag suggests the flags that contain want's longest word, or are contained in it.
func nearFlag(want string, flags map[string]bool) string {
	var near []string
	for f := range flags {
		if strings.Contains(f, want) || strings.Contains(want, f) && len(f) > 3 || sharesWord(f, want) {
			near = append(near, "--"+f)
		}
	}
	slices.Sort(near)
	if len(near) == 0 || len(near) > 5 {
		return ""
	}
	return " (did you mean " + strings.Join(near, " or ") + "?)"
}

func sharesWord(a, b string) bool {
	for _, w := range strings.Split(b, "-") {
		if len(w) > 3 && slices.Contains(strings.Split(a, "-"), w) {
			return true
		}
	}
	return false
}

func TestCommands(t *testing.T) {
	c := readCLI(t)
	n := 0
	for _, name := range docFiles(t) {
		d := readDoc(t, name)
		for _, cmd := range d.commands() {
			n++
			for _, p := range checkCommand(c, cmd.args) {
				t.Errorf("%s:%d: %s", name, cmd.line, p)
			}
		}
	}
	if n == 0 {
		t.Fatal("found no kvroute command in the docs: is the command finder broken?")
	}
	t.Logf("%d kvroute commands checked against %d verbs", n, len(c))
}

// TestCommandRules runs the command finder and check on made-up blocks, against the real binary.
func TestCommandRules(t *testing.T) {
	c := readCLI(t)
	for _, tc := range []struct {
		block string
		want  []string // the problems' starts, one per problem
	}{
		{"```sh\nkvroute simulate --workload multi-turn --routers 3 --replica-sync 1ms\n```", nil},
		{"```\n$ go run ./cmd/kvroute demo --quick   # --not-a-flag in a comment\n```", nil},
		{"```sh\nkvroute simulate --workload x \\\n  --replicas 3\n```",
			[]string{`x.md:2: kvroute simulate has no flag --replicas`}},
		{"```\nkvroute sim --port 1 & kvroute bench --target=http://x --rps 5\n```",
			[]string{`x.md:2: kvroute bench has no flag --rps`}},
		{"```\ngo build -o /tmp/kv ./cmd/kvroute && /tmp/kv serve --config x.yaml --polcy y\n```",
			[]string{`x.md:2: kvroute serve has no flag --polcy`}},
		{"```bash\nKVROUTE_X=1 bin/kvroute simulat --trace t\n```", []string{`x.md:2: kvroute has no command "simulat"`}},
		{"```\necho $(kvroute hash-key --key 'a b' --hash)\n```", []string{`x.md:2: kvroute hash-key has no flag --hash`}},
		{"```yaml\nkvroute serve --bogus\n```", nil},
		{"<!-- docs-test: skip -->\n\n```sh\nkvroute serve --bogus\n```", nil},
		{"```\nclient --HTTP--> kvroute serve --parse--> blocks\n```", nil},
		{"```sh\nkvroute analyze -- --not-a-flag.jsonl\n```", nil},
		{"run `kvroute simulate --routers 3` or\n`kvroute simulate\n--replicas 3`, not `kvroute_model_load --x`", []string{`x.md:2: kvroute simulate has no flag --replicas`}},
		{"`kvroute serve`'s flags, `kvroute plan --trace ... --slo-ttft-p90 2s`", nil},
		{"prints `kvroute serve: listening on :8080` and `kvroute <version> revision <commit>`", nil},
		{"`kvroute simulat --x`", []string{`x.md:1: kvroute has no command "simulat"`}},
		{"```sh\nkvroute simulate --policies prefix-aware:max_load_factor=1.5,cache_weight=4,least-request --json\n```", nil},
		{"```sh\nkvroute simulate --policies=prefix-aware:snapshot_load=true\n```",
			[]string{`x.md:2: --policies prefix-aware:snapshot_load=true: policy prefix-aware: parameter snapshot_load was removed`}},
		{"`kvroute serve --endpoint http://a:1 --policy prefix-awre`", []string{`x.md:1: --policy prefix-awre: `}},
		{"`kvroute serve --policy NAME[:key=value,...]`, `kvroute simulate --policies prefix-aware:PARAM=$v`", nil},
	} {
		d := parseDoc("x.md", tc.block)
		var got []string
		for _, cmd := range d.commands() {
			for _, p := range checkCommand(c, cmd.args) {
				got = append(got, fmt.Sprintf("%s:%d: %s", d.name, cmd.line, p))
			}
		}
		wantProblems(t, tc.block, got, tc.want)
	}
}

// TestReadCLI checks the parsing of the binary's help against what two verbs are known to have,
// so that a change in the help's format fails here rather than passing every command.
func TestReadCLI(t *testing.T) {
	c := readCLI(t)
	for verb, flag := range map[string]string{"simulate": "replica-sync", "serve": "config", "sim": "v", "bench": "target"} {
		if !c[verb][flag] {
			t.Errorf("kvroute %s -h: flag %q not found among %d flags", verb, flag, len(c[verb]))
		}
	}
	// Flag names are read from the lines of flag.PrintDefaults only, not from the usage text
	// around them: "kvroute bench -h" mentions --trace FILE in its usage line and has it as a
	// flag, but "simulate" names --autoscale's keys (start=N) in prose, never as flags.
	if c["simulate"]["start"] || c["bench"]["flags"] {
		t.Errorf("words of the usage text taken for flags: simulate start=%v, bench flags=%v", c["simulate"]["start"], c["bench"]["flags"])
	}
}

func TestFlagNames(t *testing.T) {
	help := "usage: kvroute x --config FILE [flags]\n  -not-a-flag in the usage\n\nflags:\n" +
		"  -config file\n    \tYAML config\n  -quick\n    \ta smaller workload\n  -v\tlog every request\n" +
		"  -time-scale float\n    \twall seconds per model second\n\nworkloads (--workload NAME):\n  groups=64\tsystem prompts\n"
	got := flagNames(help)
	want := map[string]bool{"config": true, "quick": true, "v": true, "time-scale": true}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("flagNames (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"demo", "hash-key"}, commandList("kvroute: x\n\nusage: kvroute <command>\n\ncommands:\n  demo      a demo\n  hash-key  a key\n")); diff != "" {
		t.Errorf("commandList (-want +got):\n%s", diff)
	}
}
