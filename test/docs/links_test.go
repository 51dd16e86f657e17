package docs_test

import (
	"fmt"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// The link check. Rules:
//   - Links are [text](target) and ![alt](target) in prose, and reference definitions
//     "[name]: target"; nothing inside fenced blocks or inline code is a link.
//   - Targets with a scheme (https:, mailto:) are not checked (no network here).
//   - A relative target is resolved against the linking file's directory and must exist
//     inside the repository (GitHub renders nothing outside it).
//   - An #anchor on a .md target (or on a bare #anchor, the same file) must be one of that
//     file's heading anchors by GitHub's rules (see slug), or an <a name|id> in it.

var (
	linkTarget = regexp.MustCompile(`\]\(\s*(<[^>]*>|[^()\s]*)(?:\s+"[^"]*")?\s*\)`)
	refDef     = regexp.MustCompile(`(?m)^ {0,3}\[[^\]]+\]:\s*(\S+)`)
	hasScheme  = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*:`)
)

// link is one link found in a document.
type link struct {
	line   int
	target string
}

func (d *doc) links() []link {
	text := d.prose()
	var out []link
	for _, re := range []*regexp.Regexp{linkTarget, refDef} {
		for _, m := range re.FindAllStringSubmatchIndex(text, -1) {
			target := strings.Trim(text[m[2]:m[3]], "<>")
			out = append(out, link{line: lineOf(text, m[0]), target: target})
		}
	}
	return out
}

// checkLinks returns one message per broken relative link of d. read loads another document
// by its path relative to the repository root (nil, false when there is none).
func checkLinks(d *doc, exists func(rel string) (isDir bool, ok bool), read func(rel string) *doc) []string {
	var probs []string
	fail := func(l link, format string, args ...any) {
		probs = append(probs, fmt.Sprintf("%s:%d: link (%s): %s", d.name, l.line, l.target, fmt.Sprintf(format, args...)))
	}
	for _, l := range d.links() {
		if l.target == "" {
			fail(l, "empty target: write the file or #anchor it should go to")
			continue
		}
		if hasScheme.MatchString(l.target) || strings.HasPrefix(l.target, "//") {
			continue
		}
		p, anchor, _ := strings.Cut(l.target, "#")
		if dec, err := url.PathUnescape(p); err == nil {
			p = dec
		}
		rel := d.name
		if p != "" {
			if strings.HasPrefix(p, "/") {
				fail(l, "an absolute path: make it relative to %s", path.Dir(d.name))
				continue
			}
			rel = path.Clean(path.Join(path.Dir(d.name), p))
			if rel == ".." || strings.HasPrefix(rel, "../") {
				fail(l, "points outside the repository (%s): link inside it, or give a URL", rel)
				continue
			}
			isDir, ok := exists(rel)
			if !ok {
				fail(l, "%s does not exist: fix the path (relative to %s) or drop the link", rel, path.Dir(d.name)+"/")
				continue
			}
			if isDir {
				continue
			}
		}
		if anchor == "" || !strings.HasSuffix(rel, ".md") {
			continue
		}
		target := d
		if rel != d.name {
			target = read(rel)
		}
		if target == nil {
			fail(l, "cannot read %s", rel)
			continue
		}
		if !target.anchors()[anchor] {
			fail(l, "%s has no heading with anchor #%s: use the anchor of an existing heading (lower case, spaces as hyphens, punctuation dropped)%s",
				rel, anchor, nearAnchor(anchor, target.anchors()))
		}
	}
	return probs
}

// nearAnchor suggests the anchors that share a word with want.
func nearAnchor(want string, have map[string]bool) string {
	var near []string
	for a := range have {
		for _, w := range strings.Split(want, "-") {
			if len(w) > 3 && strings.Contains(a, w) {
				near = append(near, "#"+a)
				break
			}
		}
	}
	if len(near) == 0 || len(near) > 8 {
		return ""
	}
	return "; near ones: " + strings.Join(near, ", ")
}

func repoExists(rel string) (bool, bool) {
	fi, err := os.Stat(filepath.Join(root, filepath.FromSlash(rel)))
	if err != nil {
		return false, false
	}
	return fi.IsDir(), true
}

func TestLinks(t *testing.T) {
	cache := map[string]*doc{}
	read := func(rel string) *doc {
		if d, ok := cache[rel]; ok {
			return d
		}
		b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(rel)))
		if err != nil {
			return nil
		}
		cache[rel] = parseDoc(rel, string(b))
		return cache[rel]
	}
	checked := 0
	for _, name := range docFiles(t) {
		d := readDoc(t, name)
		checked += len(d.links())
		for _, p := range checkLinks(d, repoExists, read) {
			t.Error(p)
		}
	}
	t.Logf("%d links checked", checked)
}

// TestLinkRules runs the link check on made-up documents, each with one kind of mistake.
func TestLinkRules(t *testing.T) {
	files := map[string]string{
		"README.md":        "# Kvroute\n## Quick start\n",
		"docs/policy.md":   "# Policy\n## What it computes: `ttft` (v2)\n## Limits\n## Limits\n",
		"docs/other.md":    "x",
		"deploy/helm/x.md": "y",
	}
	exists := func(rel string) (bool, bool) {
		if _, ok := files[rel]; ok {
			return false, true
		}
		if rel == "deploy/helm" || rel == "deploy" || rel == "docs" {
			return true, true
		}
		return false, false
	}
	read := func(rel string) *doc {
		s, ok := files[rel]
		if !ok {
			return nil
		}
		return parseDoc(rel, s)
	}
	for _, tc := range []struct {
		text string
		want string // "" when the text has no broken link
	}{
		{"see [policy](policy.md)", ""},
		{"see [policy](policy.md#what-it-computes-ttft-v2)", ""},
		{"see [limits](policy.md#limits-1) and [back](../README.md#quick-start)", ""},
		{"see [chart](../deploy/helm) and [self](#heading)\n\n## Heading", ""},
		{"see [web](https://example.com/x#y) and `[code](nope.md)`", ""},
		{"```\n[in a fence](nope.md)\n```", ""},
		{"see [the\npolicy](policy.md#nope)", "docs/x.md:2: link (policy.md#nope): docs/policy.md has no heading with anchor #nope"},
		{"line one\nsee [x](polcy.md)", "docs/x.md:2: link (polcy.md): docs/polcy.md does not exist"},
		{"[ref]: ../../outside.md", "docs/x.md:1: link (../../outside.md): points outside the repository"},
		{"see [self](#absent)", "docs/x.md:1: link (#absent): docs/x.md has no heading with anchor #absent"},
	} {
		got := checkLinks(parseDoc("docs/x.md", tc.text), exists, read)
		switch {
		case tc.want == "" && len(got) > 0:
			t.Errorf("%q: want no problem, got %q", tc.text, got)
		case tc.want != "" && (len(got) != 1 || !strings.HasPrefix(got[0], tc.want)):
			t.Errorf("%q: want one problem starting %q, got %q", tc.text, tc.want, got)
		}
	}
}

func TestSlug(t *testing.T) {
	for in, want := range map[string]string{
		"Quick start":                            "quick-start",
		"What it computes: `ttft` (v2)":          "what-it-computes-ttft-v2",
		"Router replicas (`peers:`)":             "router-replicas-peers",
		"[Link](x.md) and *emphasis*":            "link-and-emphasis",
		"Simulated: what outlier detection buys": "simulated-what-outlier-detection-buys",
		"p50/p90 -- figures, 5.2":                "p50p90----figures-52",
		"snake_case stays":                       "snake_case-stays",
	} {
		if got := slug(in); got != want {
			t.Errorf("slug(%q) = %q, want %q", in, got, want)
		}
	}
}

// The path check. An inline code span in prose that is a path in the repository, one word
// starting with a top-level source directory (docs/, examples/, deploy/, internal/, cmd/,
// test/, scripts/, tools/; `docs/replicas.md`, `deploy/helm/kvroute`), must exist, taken from
// the repository root as the docs write them. Spans with a wildcard, a placeholder or a
// variable (*, <, $, {) are not paths, nor is a Go name (`internal/h1.Server`: a dot before a
// capital); a path may end in :LINE or #anchor, which is not checked.

var repoPath = regexp.MustCompile(`^(docs|examples|deploy|internal|cmd|test|scripts|tools)/[A-Za-z0-9_./-]*$`)

var goName = regexp.MustCompile(`\.[A-Z][A-Za-z0-9]*$`)

// repoPaths returns d's inline spans that are repository paths, with :LINE and #anchor cut.
func (d *doc) repoPaths() []span {
	var out []span
	for _, s := range d.codeSpans() {
		p, _, _ := strings.Cut(s.text, "#")
		p, _, _ = strings.Cut(p, ":")
		if repoPath.MatchString(p) && !strings.Contains(p, "..") && !goName.MatchString(p) {
			out = append(out, span{line: s.line, text: p})
		}
	}
	return out
}

func TestPaths(t *testing.T) {
	n := 0
	for _, name := range docFiles(t) {
		for _, s := range readDoc(t, name).repoPaths() {
			n++
			if _, ok := repoExists(s.text); !ok {
				t.Errorf("%s:%d: `%s` does not exist in the repository: write its current path", name, s.line, s.text)
			}
		}
	}
	if n == 0 {
		t.Fatal("found no repository path in the docs' prose: is the span finder broken?")
	}
	t.Logf("%d paths checked", n)
}

func TestPathRules(t *testing.T) {
	d := parseDoc("x.md", "`docs/policy.md`, `internal/x/y.go:12`, `docs/*.md`, `deploy/<name>`, `bin/kvroute`, `docs/a.md#b`, `go test ./...`, `internal/h1.Server`")
	var got []string
	for _, s := range d.repoPaths() {
		got = append(got, s.text)
	}
	if diff := cmp.Diff([]string{"docs/policy.md", "internal/x/y.go", "docs/a.md"}, got); diff != "" {
		t.Errorf("paths found (-want +got):\n%s", diff)
	}
}
