package docs_test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"
)

// root is the repository root, seen from this package's directory.
const root = "../.."

// skipped are the measurement logs of past builds: their commands and figures are kept as they
// were run, not rewritten when a flag is renamed.
var skipped = []string{"docs/results.md", "docs/sync-cost.md", "docs/experiments/"}

// skipMarker, on the last non-blank line above a fenced block, exempts that block from the
// command and config checks (an example that is meant to fail, say).
const skipMarker = "<!-- docs-test: skip -->"

// docFiles returns the documents under test, relative to root with forward slashes.
func docFiles(t *testing.T) []string {
	t.Helper()
	files := []string{"README.md"}
	more, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range more {
		rel := "docs/" + filepath.Base(m)
		if !isSkipped(rel) {
			files = append(files, rel)
		}
	}
	if len(files) < 5 {
		t.Fatalf("found only %v under %s: is the test running in test/docs?", files, root)
	}
	return files
}

func isSkipped(rel string) bool {
	for _, s := range skipped {
		if rel == s || strings.HasSuffix(s, "/") && strings.HasPrefix(rel, s) {
			return true
		}
	}
	return false
}

// doc is one Markdown file, split into lines.
type doc struct {
	name   string // relative to the repository root, for messages
	lines  []string
	fences []fence
	// inFence[i] is true when line i (0-based) opens, closes or lies inside a fenced block.
	inFence []bool
}

// fence is one fenced code block.
type fence struct {
	info  string   // the word after the opening fence: "yaml", "sh", ""
	line  int      // 1-based line number of its first content line
	lines []string // its content, without the fences
	skip  bool     // marked with skipMarker
}

var fenceOpen = regexp.MustCompile("^\\s*(`{3,}|~{3,})\\s*([^`\\s]*)")

func readDoc(t *testing.T, name string) *doc {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(name)))
	if err != nil {
		t.Fatal(err)
	}
	return parseDoc(name, string(b))
}

// parseDoc finds the fenced blocks of a Markdown text. An unclosed fence runs to the end, as
// GitHub renders it.
func parseDoc(name, text string) *doc {
	d := &doc{name: name, lines: strings.Split(strings.ReplaceAll(text, "\r\n", "\n"), "\n")}
	d.inFence = make([]bool, len(d.lines))
	for i := 0; i < len(d.lines); i++ {
		m := fenceOpen.FindStringSubmatch(d.lines[i])
		if m == nil {
			continue
		}
		f := fence{info: strings.ToLower(m[2]), line: i + 2, skip: markedSkip(d.lines, i)}
		d.inFence[i] = true
		marker := m[1]
		for i++; i < len(d.lines); i++ {
			d.inFence[i] = true
			s := strings.TrimSpace(d.lines[i])
			if strings.HasPrefix(s, marker) && strings.Trim(s, marker[:1]) == "" {
				break
			}
			f.lines = append(f.lines, d.lines[i])
		}
		d.fences = append(d.fences, f)
	}
	return d
}

// markedSkip reports whether the last non-blank line above line i is skipMarker.
func markedSkip(lines []string, i int) bool {
	for j := i - 1; j >= 0; j-- {
		if s := strings.TrimSpace(lines[j]); s != "" {
			return s == skipMarker
		}
	}
	return false
}

var (
	atxHeading  = regexp.MustCompile(`^ {0,3}#{1,6}(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$`)
	setextUnder = regexp.MustCompile(`^ {0,3}(=+|-+)[ \t]*$`)
	htmlAnchor  = regexp.MustCompile(`<a\s+(?:name|id)="([^"]+)"`)
)

// anchors returns the heading anchors GitHub gives the document, plus the ids of its
// <a name="..."> and <a id="..."> tags.
func (d *doc) anchors() map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	add := func(text string) {
		s := slug(text)
		n := seen[s]
		seen[s]++
		if n > 0 {
			s = fmt.Sprintf("%s-%d", s, n)
		}
		out[s] = true
	}
	for i, l := range d.lines {
		if d.inFence[i] {
			continue
		}
		for _, m := range htmlAnchor.FindAllStringSubmatch(l, -1) {
			out[m[1]] = true
		}
		if m := atxHeading.FindStringSubmatch(l); m != nil {
			add(m[1])
			continue
		}
		// A setext heading: a line of = or - under a paragraph line.
		if i > 0 && setextUnder.MatchString(l) && !d.inFence[i-1] && strings.TrimSpace(d.lines[i-1]) != "" &&
			!atxHeading.MatchString(d.lines[i-1]) && !strings.HasPrefix(strings.TrimSpace(d.lines[i-1]), "|") {
			add(d.lines[i-1])
		}
	}
	return out
}

var (
	inlineLink = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)
	htmlTag    = regexp.MustCompile(`<[^>]+>`)
)

// slug is GitHub's anchor for a heading: the rendered text (markup gone) in lower case, every
// character that is not a letter, digit, underscore, hyphen or space dropped, spaces made hyphens.
func slug(heading string) string {
	s := inlineLink.ReplaceAllString(heading, "$1")
	s = htmlTag.ReplaceAllString(s, "")
	s = strings.ToLower(strings.TrimSpace(s))
	var b strings.Builder
	for _, r := range s {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.Is(unicode.M, r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// prose returns the document's text with fenced blocks and inline code spans blanked out (line
// breaks kept, so offsets still give line numbers): what is left can hold links.
func (d *doc) prose() string {
	text, _ := d.split()
	return text
}

// span is one inline code span.
type span struct {
	line int    // 1-based, of its opening backticks
	text string // its content, line breaks made spaces
}

// codeSpans returns the inline code spans outside fenced blocks.
func (d *doc) codeSpans() []span {
	_, spans := d.split()
	return spans
}

// split blanks out fenced blocks and inline code spans and returns the text left and the spans.
func (d *doc) split() (string, []span) {
	lines := slices.Clone(d.lines)
	for i := range lines {
		if d.inFence[i] {
			lines[i] = ""
		}
	}
	orig := strings.Join(lines, "\n")
	text := []byte(orig)
	var spans []span
	// Inline code: a run of n backticks up to the next run of exactly n.
	for i := 0; i < len(text); {
		if text[i] != '`' {
			i++
			continue
		}
		n := runLen(text, i)
		end := -1
		for j := i + n; j < len(text); {
			if text[j] != '`' {
				j++
				continue
			}
			m := runLen(text, j)
			if m == n {
				end = j + m
				break
			}
			j += m
		}
		if end < 0 {
			i += n
			continue
		}
		content := strings.TrimSpace(strings.ReplaceAll(orig[i+n:end-n], "\n", " "))
		spans = append(spans, span{line: lineOf(orig, i), text: content})
		for k := i; k < end; k++ {
			if text[k] != '\n' {
				text[k] = ' '
			}
		}
		i = end
	}
	return string(text), spans
}

func runLen(b []byte, i int) int {
	n := 0
	for i+n < len(b) && b[i+n] == '`' {
		n++
	}
	return n
}

// lineOf is the 1-based line number of byte offset off in text.
func lineOf(text string, off int) int { return strings.Count(text[:off], "\n") + 1 }

// wantProblems checks the problems found in block against want, each by its start.
func wantProblems(t *testing.T, block string, got, want []string) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%q: got %d problems %q, want %d %q", block, len(got), got, len(want), want)
		return
	}
	for i := range got {
		if !strings.HasPrefix(got[i], want[i]) {
			t.Errorf("%q: problem %d is %q, want it to start %q", block, i, got[i], want[i])
		}
	}
}
