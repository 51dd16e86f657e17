package docs_test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The fence check. Rules:
//   - Outside a fenced block, a line that starts (after its indentation) with ``` or ~~~ opens
//     one, and may carry only an info string after the fence: one word such as yaml or sh.
//     Anything more ("``` A single replica", "```yaml x") is a mistake: GitHub either opens a
//     block there anyway or shows the backticks as text.
//   - Inside a block, a line of the opening fence's character, at least as long as the
//     opening fence, and nothing else closes it. The same fence followed by text does not
//     close it (a closing fence carries no text): it is reported, since the block would run
//     on over the prose and headings below (and the check goes on as if it closed the block).
//   - Every block is closed before the end of the file.
//
// Unlike the other checks, this one reads the measurement logs as well: an unclosed block
// hides their text as much as any other document's.

var (
	fenceStart = regexp.MustCompile("^[ \t]*(`{3,}|~{3,})(.*)$")
	infoString = regexp.MustCompile(`^[A-Za-z0-9_+.#-]*$`)
)

// checkFences returns one message per broken fence of the document name with text.
func checkFences(name, text string) []string {
	var probs []string
	fail := func(line int, format string, args ...any) {
		probs = append(probs, fmt.Sprintf("%s:%d: %s", name, line, fmt.Sprintf(format, args...)))
	}
	lines := strings.Split(strings.ReplaceAll(text, "\r\n", "\n"), "\n")
	open, openLine := "", 0 // the fence of the block we are in, and the line it opened on
	for i, l := range lines {
		m := fenceStart.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		marker, rest := m[1], strings.TrimSpace(m[2])
		if open == "" {
			if !infoString.MatchString(rest) || marker[0] == '`' && strings.Contains(rest, "`") {
				fail(i+1, "%q: an opening fence carries one word at most (the info string: yaml, sh), nothing else", l)
			}
			open, openLine = marker, i+1
			continue
		}
		if marker[0] != open[0] || len(marker) < len(open) {
			continue // shorter, or of the other character: the block's content
		}
		if rest != "" {
			fail(i+1, "%q: a closing fence carries no text: put the fence alone on its line (the block opened on line %d runs on past it)", l, openLine)
		}
		open = "" // as the writer meant, so that one mistake is reported once
	}
	if open != "" {
		fail(openLine, "the block opened here is never closed: end it with a line of %s alone", open)
	}
	return probs
}

func TestFences(t *testing.T) {
	files := []string{"README.md"}
	more, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range more {
		files = append(files, "docs/"+filepath.Base(m))
	}
	if len(files) < 5 {
		t.Fatalf("found only %v under %s: is the test running in test/docs?", files, root)
	}
	for _, name := range files {
		b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(name)))
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range checkFences(name, string(b)) {
			t.Error(p)
		}
	}
}

// TestFenceRules runs the fence check on made-up documents, each with one kind of mistake.
func TestFenceRules(t *testing.T) {
	for _, tc := range []struct {
		text string
		want string // "" when the text has no broken fence
	}{
		{"text\n```yaml\na: 1\n```\n\n```\nplain\n```\n", ""},
		{"- item\n\n  ```sh\n  kvroute serve\n  ```\n", ""},
		{"````md\n```yaml\na: 1\n```\n````\n", ""},
		{"~~~\n```\n~~~\n", ""},
		{"```yaml\na: 1\n``` A single replica\n\n## Heading\n```\n", "x.md:3: \"``` A single replica\": a closing fence carries no text"},
		{"```yaml\na: 1\n", "x.md:1: the block opened here is never closed"},
		{"```yaml\na: 1\n```\ntext\n```sh\n", "x.md:5: the block opened here is never closed"},
		{"```yaml config\na: 1\n```\n", "x.md:1: \"```yaml config\": an opening fence carries one word at most"},
		{"```inline``` in prose\n", "x.md:1: \"```inline``` in prose\": an opening fence carries one word at most"},
	} {
		got := checkFences("x.md", tc.text)
		switch {
		case tc.want == "" && len(got) > 0:
			t.Errorf("%q: want no problem, got %q", tc.text, got)
		case tc.want != "" && (len(got) == 0 || !strings.HasPrefix(got[0], tc.want)):
			t.Errorf("%q: want a problem starting %q, got %q", tc.text, tc.want, got)
		}
	}
}
