// Package grafana holds the router's Grafana dashboard (kvroute.json); its test checks that the
// dashboard is valid JSON and queries only metrics the router exports.
package grafana

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

type dashboard struct {
	UID    string  `json:"uid"`
	Title  string  `json:"title"`
	Panels []panel `json:"panels"`
}

type panel struct {
	ID      int    `json:"id"`
	Type    string `json:"type"`
	Title   string `json:"title"`
	GridPos struct {
		X, Y, W, H int
	} `json:"gridPos"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
}

var metricName = regexp.MustCompile(`kvroute_[a-z_]+`)

func TestDashboard(t *testing.T) {
	data, err := os.ReadFile("kvroute.json")
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	dec := json.NewDecoder(strings.NewReader(string(data)))
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("kvroute.json is not valid JSON: %v", err)
	}
	if d.UID == "" || d.Title == "" {
		t.Errorf("uid %q title %q: both must be set", d.UID, d.Title)
	}

	// The names the router exports, read from its metrics package source.
	files, err := filepath.Glob(filepath.Join("..", "..", "internal", "metrics", "*.go"))
	if err != nil || len(files) == 0 {
		t.Fatalf("internal/metrics sources not found: %v", err)
	}
	exported := map[string]bool{}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range regexp.MustCompile(`"(kvroute_[a-z_]+)"`).FindAllStringSubmatch(string(src), -1) {
			exported[m[1]] = true
		}
	}

	ids := map[int]bool{}
	var titles []string
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d used twice", p.ID)
		}
		ids[p.ID] = true
		if p.GridPos.X < 0 || p.GridPos.W < 1 || p.GridPos.X+p.GridPos.W > 24 {
			t.Errorf("panel %q: gridPos %+v does not fit 24 columns", p.Title, p.GridPos)
		}
		if p.Type == "row" {
			continue
		}
		titles = append(titles, p.Title)
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			names := metricName.FindAllString(tg.Expr, -1)
			if len(names) == 0 {
				t.Errorf("panel %q: query %q reads no kvroute metric", p.Title, tg.Expr)
			}
			for _, n := range names {
				base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(n, "_bucket"), "_sum"), "_count")
				if !exported[base] {
					t.Errorf("panel %q queries %s, which internal/metrics does not export", p.Title, n)
				}
			}
			if strings.Count(tg.Expr, "(") != strings.Count(tg.Expr, ")") {
				t.Errorf("panel %q: unbalanced parentheses in %q", p.Title, tg.Expr)
			}
		}
	}
	for _, want := range []string{"Prefix-cache hit rate", "Time to first token", "Requests/s by status",
		"In-flight requests per endpoint", "Endpoint health"} {
		if !slices.Contains(titles, want) {
			t.Errorf("no panel %q (panels: %q)", want, titles)
		}
	}
}
