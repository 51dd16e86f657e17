// Package grafana holds the router's Grafana dashboard (kvroute.json); its test checks that the
// dashboard is valid JSON, queries only metrics the router exports (those internal/metrics
// makes and those a router started on loopback serves), and puts one unit on each panel's
// axis. test/e2e's TestDashboardQueriesAgainstPrometheus runs every query against a real
// Prometheus scraping a router under load.
package grafana

import (
	"context"
	"encoding/json"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/deploy/internal/routermetrics"
)

type dashboard struct {
	UID        string  `json:"uid"`
	Title      string  `json:"title"`
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name string `json:"name"`
		} `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID          int    `json:"id"`
	Type        string `json:"type"`
	Title       string `json:"title"`
	Description string `json:"description"`
	GridPos     struct {
		X, Y, W, H int
	} `json:"gridPos"`
	FieldConfig struct {
		Defaults struct {
			Unit string `json:"unit"`
		} `json:"defaults"`
		Overrides []struct {
			Properties []struct {
				ID string `json:"id"`
			} `json:"properties"`
		} `json:"overrides"`
	} `json:"fieldConfig"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
}

var metricName = regexp.MustCompile(`\bkvroute_[a-z_]+`)

// Units of the panels that plot tokens, which Grafana has no unit for.
const (
	unitTokens       = "suffix: tokens"
	unitTokensPerSec = "suffix: tok/s"
)

// family is what a metric counts, from its name's base-unit suffix.
func family(name string) string {
	name = strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(name, "_bucket"), "_sum"), "_count")
	name = strings.TrimSuffix(name, "_total")
	for _, f := range []string{"tokens_per_second", "seconds", "bytes", "tokens", "ratio"} {
		if strings.HasSuffix(name, "_"+f) {
			return f
		}
	}
	return "count" // requests, retries, ejections, reloads, entries, endpoints, a 0/1 state
}

// kind is what a query computes: a quantile, a ratio of two rates, a rate, a count per
// window (increase) or a gauge's value.
func kind(expr string) string {
	switch {
	case strings.Contains(expr, "histogram_quantile("):
		return "quantile"
	case strings.Contains(expr, ") / "):
		return "ratio"
	case strings.Contains(expr, "increase("):
		return "count"
	case strings.Contains(expr, "rate("):
		return "rate"
	}
	return "gauge"
}

// unitFor is the unit a panel of this kind over metrics of this family must have.
func unitFor(kind, family string) string {
	switch {
	case kind == "quantile", kind == "gauge" && family == "seconds":
		return "s"
	case kind == "ratio", kind == "rate" && family == "seconds", family == "ratio":
		return "percentunit" // a share of tokens, of requests, of time
	case kind == "rate" && family == "tokens", kind == "gauge" && family == "tokens_per_second":
		return unitTokensPerSec
	case kind == "rate" && family == "bytes":
		return "Bps"
	case kind == "rate":
		return "reqps"
	case family == "bytes":
		return "bytes"
	case family == "tokens":
		return unitTokens
	}
	return "short"
}

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
	exported, err := routermetrics.Names(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var vars []string
	for _, v := range d.Templating.List {
		vars = append(vars, v.Name)
	}

	ids := map[int]bool{}
	var titles []string
	queried := map[string][]string{} // panel title -> the metrics its queries read
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
		for _, o := range p.FieldConfig.Overrides {
			for _, prop := range o.Properties {
				if prop.ID == "unit" {
					t.Errorf("panel %q overrides the unit of some series: one unit per axis", p.Title)
				}
			}
		}
		kinds, families := map[string]bool{}, map[string]bool{}
		for _, tg := range p.Targets {
			names := metricName.FindAllString(tg.Expr, -1)
			if len(names) == 0 {
				t.Errorf("panel %q: query %q reads no kvroute metric", p.Title, tg.Expr)
			}
			queried[p.Title] = append(queried[p.Title], names...)
			for _, n := range names {
				base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(n, "_bucket"), "_sum"), "_count")
				if !slices.Contains(exported, base) {
					t.Errorf("panel %q queries %s, which the router does not export", p.Title, n)
				}
				families[family(n)] = true
			}
			kinds[kind(tg.Expr)] = true
			if strings.Count(tg.Expr, "(") != strings.Count(tg.Expr, ")") {
				t.Errorf("panel %q: unbalanced parentheses in %q", p.Title, tg.Expr)
			}
			for _, m := range regexp.MustCompile(`\$\{?([a-z_]+)`).FindAllStringSubmatch(tg.Expr, -1) {
				if !strings.HasPrefix(m[1], "__") && !slices.Contains(vars, m[1]) {
					t.Errorf("panel %q: query uses $%s, which is no dashboard variable (%v)", p.Title, m[1], vars)
				}
			}
		}
		// One unit per axis: every query of the panel computes the same kind of value over
		// metrics that count the same thing, and the panel's unit is that one.
		if len(kinds) != 1 || len(families) != 1 {
			t.Errorf("panel %q mixes %v over %v: one unit per axis", p.Title, keys(kinds), keys(families))
			continue
		}
		if want := unitFor(keys(kinds)[0], keys(families)[0]); p.FieldConfig.Defaults.Unit != want {
			t.Errorf("panel %q: unit %q, want %q for a %s of %s", p.Title, p.FieldConfig.Defaults.Unit, want, keys(kinds)[0], keys(families)[0])
		}
	}
	for _, want := range []string{"Prefix-cache hit rate", "Time to first token", "Requests/s by status",
		"In-flight requests per endpoint", "Endpoint health", "Share of time ejected", "Ejections per endpoint",
		"Cached tokens/s per engine: found vs predicted", "Cache-blind endpoints", "Engine KV-cache usage", "Engine requests: waiting and running"} {
		if !slices.Contains(titles, want) {
			t.Errorf("no panel %q (panels: %q)", want, titles)
		}
	}
	// The API and admin listeners' connection caps, the body limits, config reloads and
	// builds: each has its panel, which reads these metrics.
	for title, want := range map[string][]string{
		"API connections: open and cap":                   {"kvroute_server_connections", "kvroute_server_max_connections"},
		"Connections dropped at the cap, by reason":       {"kvroute_server_connections_dropped_total"},
		"Request bodies being received: bytes and cap":    {"kvroute_server_pending_body_bytes", "kvroute_server_max_pending_body_bytes"},
		"Requests refused for the bodies being received":  {"kvroute_server_body_refusals_total"},
		"Config reload status":                            {"kvroute_config_last_reload_successful"},
		"Router version per pod":                          {"kvroute_build_info"},
		"Routers per version":                             {"kvroute_build_info"},
		"Admin connections: open and cap":                 {"kvroute_admin_connections", "kvroute_admin_max_connections"},
		"Admin connections dropped at the cap, by reason": {"kvroute_admin_connections_dropped_total"},
	} {
		got, ok := queried[title]
		if !ok {
			t.Errorf("no panel %q", title)
			continue
		}
		for _, m := range want {
			if !slices.Contains(got, m) {
				t.Errorf("panel %q reads %v, want %s among them", title, got, m)
			}
		}
	}
	for _, p := range d.Panels {
		if p.Title == "Connections dropped at the cap, by reason" && (len(p.Targets) != 1 || !strings.Contains(p.Targets[0].Expr, "reason)")) {
			t.Errorf("panel %q: %+v, want the drops by reason (idle_closed, refused)", p.Title, p.Targets)
		}
	}
	checkRows(t, d.Panels, map[string][]string{
		"Router": {"Config reload status", "Router version per pod", "Routers per version"},
		"Client connections and request bodies": {"API connections: open and cap", "Connections dropped at the cap, by reason",
			"Request bodies being received: bytes and cap", "Requests refused for the bodies being received",
			"Admin connections: open and cap", "Admin connections dropped at the cap, by reason"},
		"Replicas": {"Peer drops/s: late news (expected)", "Peer drops/s: losses, refusals and hostile input"},
	})
	checkPeerDrops(t, d.Panels)
}

// expectedDrops are the reasons of kvroute_peer_dropped_total that are late news of what a
// replica settled already (docs/replicas.md; route.Drop.Expected in code).
const expectedDrops = "duplicate|ended_here|before_stream|endpoint_left"

// checkPeerDrops: the peer drops are plotted in two panels, the expected late news and the
// rest, so that the rest is not buried under reasons that rise at every restart; every query
// of kvroute_peer_dropped_total selects one side, and each panel says what its reasons mean.
func checkPeerDrops(t *testing.T, panels []panel) {
	t.Helper()
	want := map[string]string{
		"Peer drops/s: late news (expected)":               `sum by (reason) (rate(kvroute_peer_dropped_total{reason=~"` + expectedDrops + `"}[$__rate_interval]))`,
		"Peer drops/s: losses, refusals and hostile input": `sum by (reason) (rate(kvroute_peer_dropped_total{reason!~"` + expectedDrops + `"}[$__rate_interval]))`,
	}
	// What each description must name: the reasons of its side (all of them for the
	// expected ones, a sample of the others), and where they are explained.
	mention := map[string][]string{
		"Peer drops/s: late news (expected)":               {"duplicate", "ended_here", "before_stream", "endpoint_left", "docs/replicas.md"},
		"Peer drops/s: losses, refusals and hostile input": {"unknown_request", "queue_full", "full", "forged", "unauthenticated", "tls_handshake", "docs/replicas.md"},
	}
	found := map[string]bool{}
	for _, p := range panels {
		for _, tg := range p.Targets {
			if !strings.Contains(tg.Expr, "kvroute_peer_dropped_total") {
				continue
			}
			w, ok := want[p.Title]
			if !ok || len(p.Targets) != 1 || tg.Expr != w {
				t.Errorf("panel %q queries %q: the peer drops belong in the two panels %q", p.Title, tg.Expr, slices.Sorted(maps.Keys(want)))
				continue
			}
			found[p.Title] = true
			for _, m := range mention[p.Title] {
				if !strings.Contains(p.Description, m) {
					t.Errorf("panel %q: description %q does not mention %s", p.Title, p.Description, m)
				}
			}
		}
	}
	for title := range want {
		if !found[title] {
			t.Errorf("no panel %q", title)
		}
	}
}

// checkRows: each titled panel lies in the named row (below the row's header and above the
// next row's), so that the panel is where docs/operations.md says it is.
func checkRows(t *testing.T, panels []panel, want map[string][]string) {
	t.Helper()
	type row struct {
		title  string
		top    int
		bottom int // the next row's y, or beyond every panel
	}
	var rows []row
	for _, p := range panels {
		if p.Type == "row" {
			rows = append(rows, row{title: p.Title, top: p.GridPos.Y, bottom: 1 << 30})
		}
	}
	slices.SortFunc(rows, func(a, b row) int { return a.top - b.top })
	for i := range rows[:max(len(rows)-1, 0)] {
		rows[i].bottom = rows[i+1].top
	}
	in := map[string]string{} // panel title -> row title
	for _, p := range panels {
		for _, r := range rows {
			if p.Type != "row" && p.GridPos.Y > r.top && p.GridPos.Y < r.bottom {
				in[p.Title] = r.title
			}
		}
	}
	for r, titles := range want {
		for _, title := range titles {
			if got, ok := in[title]; !ok || got != r {
				t.Errorf("panel %q is in row %q, want row %q", title, got, r)
			}
		}
	}
}

func keys(m map[string]bool) []string { return slices.Sorted(maps.Keys(m)) }

// TestUnitRules: the old dashboard's two mixed panels are caught.
func TestUnitRules(t *testing.T) {
	for _, c := range []struct {
		exprs []string
		mixed bool
	}{
		{[]string{"sum(rate(kvroute_retries_total[5m]))", "sum(increase(kvroute_endpoint_ejections_total[5m]))"}, true},
		{[]string{"kvroute_index_entries", "kvroute_index_bytes"}, true},
		{[]string{"kvroute_endpoint_engine_waiting_requests", "kvroute_endpoint_engine_running_requests"}, false},
	} {
		kinds, families := map[string]bool{}, map[string]bool{}
		for _, e := range c.exprs {
			kinds[kind(e)] = true
			for _, n := range metricName.FindAllString(e, -1) {
				families[family(n)] = true
			}
		}
		if mixed := len(kinds) > 1 || len(families) > 1; mixed != c.mixed {
			t.Errorf("%q: mixed %v, want %v", c.exprs, mixed, c.mixed)
		}
	}
}
