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
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/deploy/internal/routermetrics"
	"github.com/kvroute/kvroute/internal/route"
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

// unsuffixed are the metrics whose names carry no base-unit suffix but whose values have a
// unit: kvroute_model_saturation is a share (0 to 1) of the fleet in use.
var unsuffixed = map[string]string{"kvroute_model_saturation": "ratio"}

// family is what a metric counts, from its name's base-unit suffix.
func family(name string) string {
	name = strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(name, "_bucket"), "_sum"), "_count")
	name = strings.TrimSuffix(name, "_total")
	if f, ok := unsuffixed[name]; ok {
		return f
	}
	for _, f := range []string{"tokens_per_second", "seconds", "bytes", "tokens", "ratio"} {
		if strings.HasSuffix(name, "_"+f) {
			return f
		}
	}
	return "count" // requests, retries, ejections, reloads, entries, endpoints, a 0/1 state
}

// kind is what a query computes: a quantile, a mean duration (a rate of seconds over a rate
// of events), a ratio of two rates, a rate, a count per window (increase) or a gauge's value.
func kind(expr string) string {
	switch {
	case strings.Contains(expr, "histogram_quantile("):
		return "quantile"
	case strings.Contains(expr, ") / "):
		num, den, _ := strings.Cut(expr, ") / ")
		if slices.Equal(families(num), []string{"seconds"}) && slices.Equal(families(den), []string{"count"}) {
			return "mean"
		}
		return "ratio"
	case strings.Contains(expr, "increase("):
		return "count"
	case strings.Contains(expr, "rate("):
		return "rate"
	}
	return "gauge"
}

// families are the families of the metrics expr reads, sorted, each once.
func families(expr string) []string {
	var fs []string
	for _, n := range metricName.FindAllString(expr, -1) {
		fs = append(fs, family(n))
	}
	slices.Sort(fs)
	return slices.Compact(fs)
}

// valueFamilies are the families a query's value is in: those of the metrics it reads, but for
// a mean duration, whose value is in seconds (its numerator's) though it reads a count too.
func valueFamilies(kind, expr string) []string {
	if kind == "mean" {
		return []string{"seconds"}
	}
	return families(expr)
}

// unitFor is the unit a panel of this kind over metrics of this family must have.
func unitFor(kind, family string) string {
	switch {
	case kind == "quantile", kind == "mean", kind == "gauge" && family == "seconds":
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
	shown := map[string]bool{}       // the families some panel reads
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
				shown[base] = true
			}
			k := kind(tg.Expr)
			kinds[k] = true
			for _, f := range valueFamilies(k, tg.Expr) {
				families[f] = true
			}
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
		"Traffic and latency": {"Requests held before picking/s", "Mean hold before picking"},
		"Prefix cache":        {"Cache value per endpoint", "Cache-blind verdicts per endpoint", "Prompts rewritten by normalisation/s"},
		"Engines": {"KV capacity per endpoint", "Load per model (engines' worth of work)", "Saturation per model",
			"Prefill demand per model"},
		"Endpoints": {"Ejections per endpoint"},
		"Router": {"Config reload status", "Time since the config in force was applied", "Router version per pod",
			"Routers per version"},
		"Tenants": {"Requests in flight and queued per tenant"},
		"Client connections and request bodies": {"API connections: open and cap", "Connections dropped at the cap, by reason",
			"Request bodies being received: bytes and cap", "Requests refused for the bodies being received",
			"Admin connections: open and cap", "Admin connections dropped at the cap, by reason"},
		"Replicas": {"Peer drops/s: late news (expected)", "Peer drops/s: losses, refusals and hostile input",
			"Peer messages and events/s", "Other replicas' requests ended here without their end", "Warm starts by result",
			"Stream resumes by result, and batches resent", "Peer source errors"},
	})
	checkPeerDrops(t, d.Panels)
	checkEveryMetricShown(t, exported, shown)
}

// leftOffPrefixes are the exported families that no panel shows, by prefix, and why:
// client_golang's standard collectors, the same in every Go service, which a Go runtime or
// process dashboard shows better than this one can.
var leftOffPrefixes = map[string]string{
	"go_":       "the Go runtime's collector (goroutines, GC, heap): any Go service dashboard",
	"process_":  "the process collector (CPU, resident memory, open files): any process or pod dashboard; the index's own memory has its panel",
	"promhttp_": "the /metrics handler's own errors: Prometheus's up and scrape errors say more",
}

// leftOff are the kvroute families deliberately left off the dashboard, each with why. There
// are none now: every kvroute family the router exports has a panel.
var leftOff = map[string]string{}

// checkEveryMetricShown: every family the router exports (shown: those the panels read) is on
// the dashboard or left off on purpose, in leftOff or leftOffPrefixes, so that a new metric
// does not go unseen because nobody drew it; and leftOff names only families that are exported
// and still not shown.
func checkEveryMetricShown(t *testing.T, exported []string, shown map[string]bool) {
	t.Helper()
	for _, n := range exported {
		if shown[n] {
			continue
		}
		prefix, _, _ := strings.Cut(n, "_")
		if leftOff[n] != "" || leftOffPrefixes[prefix+"_"] != "" {
			continue
		}
		t.Errorf("%s: the router exports it and no panel shows it: add a panel, or put it in leftOff with why", n)
	}
	for n := range leftOff {
		if !slices.Contains(exported, n) || shown[n] {
			t.Errorf("leftOff names %s, which is not exported or has a panel: remove it", n)
		}
	}
}

// expectedDrops are the reasons of kvroute_peer_dropped_total that are late news of what a
// replica settled already (docs/replicas.md; route.Drop.Expected in code, which
// TestExpectedDrops compares it with).
const expectedDrops = "duplicate|ended_here|before_stream|endpoint_left"

// TestExpectedDrops: expectedDrops are exactly the drops internal/route calls expected, so
// that a reason added there lands in the right one of the two peer drop panels.
func TestExpectedDrops(t *testing.T) {
	var want []string
	for i, name := range route.DropReasons() {
		d := route.Drop(i + 1) // DropReasons leaves out DropNone, the first
		if d.String() != name {
			t.Fatalf("route.DropReasons()[%d] is %q, route.Drop(%d) is %q", i, name, i+1, d)
		}
		if d.Expected() {
			want = append(want, name)
		}
	}
	got := strings.Split(expectedDrops, "|")
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("expectedDrops %v, want route's expected drops %v", got, want)
	}
}

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

// TestUnitRules: the old dashboard's two mixed panels are caught, a mean duration reads in
// seconds though it reads a count too, and a share named without _ratio is a share.
func TestUnitRules(t *testing.T) {
	for _, c := range []struct {
		exprs []string
		mixed bool
		unit  string // when not mixed
	}{
		{[]string{"sum(rate(kvroute_retries_total[5m]))", "sum(increase(kvroute_endpoint_ejections_total[5m]))"}, true, ""},
		{[]string{"kvroute_index_entries", "kvroute_index_bytes"}, true, ""},
		{[]string{"kvroute_endpoint_engine_waiting_requests", "kvroute_endpoint_engine_running_requests"}, false, "short"},
		{[]string{"sum(rate(kvroute_replica_held_seconds_total[5m])) / clamp_min(sum(rate(kvroute_replica_held_total[5m])), 1e-9)"}, false, "s"},
		{[]string{"sum(rate(kvroute_replica_held_total[5m])) / sum(rate(kvroute_requests_total[5m]))"}, false, "percentunit"},
		{[]string{"sum(rate(kvroute_endpoint_ejected_seconds_total[5m])) / sum(rate(kvroute_requests_total[5m]))", "sum(rate(kvroute_replica_held_total[5m]))"}, true, ""},
		{[]string{"max(kvroute_model_saturation)"}, false, "percentunit"},
		{[]string{"max(kvroute_model_load)"}, false, "short"},
		{[]string{"time() - max(kvroute_config_last_reload_success_timestamp_seconds)"}, false, "s"},
	} {
		kinds, fams := map[string]bool{}, map[string]bool{}
		for _, e := range c.exprs {
			k := kind(e)
			kinds[k] = true
			for _, f := range valueFamilies(k, e) {
				fams[f] = true
			}
		}
		mixed := len(kinds) > 1 || len(fams) > 1
		if mixed != c.mixed {
			t.Errorf("%q: mixed %v (%v over %v), want %v", c.exprs, mixed, keys(kinds), keys(fams), c.mixed)
			continue
		}
		if !mixed {
			if got := unitFor(keys(kinds)[0], keys(fams)[0]); got != c.unit {
				t.Errorf("%q: unit %q, want %q", c.exprs, got, c.unit)
			}
		}
	}
}

// ejectionCases are the promtool cases of TestEjectionsByReason: kvroute_endpoint_ejections_total
// as two router replicas export it, with and without its reason label, and what the panel
// "Ejections per endpoint" must plot over the last 10 minutes (its rate interval). With the
// label, one line per endpoint and reason, each the most any replica counted; without it, one
// line per endpoint, as before the label.
const ejectionCases = `
  - name: ejections without a reason label
    interval: 1m
    input_series:
      - series: 'kvroute_endpoint_ejections_total{instance="r1:9090",endpoint="http://10.0.0.1:8000"}'
        values: '0 0 0 1 1 1 1 2 2 2 2'
      - series: 'kvroute_endpoint_ejections_total{instance="r2:9090",endpoint="http://10.0.0.1:8000"}'
        values: '0 0 0 0 0 0 1 1 1 1 1'
      - series: 'kvroute_endpoint_ejections_total{instance="r1:9090",endpoint="http://10.0.0.2:8000"}'
        values: '0x10'
    promql_expr_test:
      - expr: EXPR
        eval_time: 10m
        exp_samples:
          - labels: '{endpoint="http://10.0.0.1:8000"}'
            value: 2
          - labels: '{endpoint="http://10.0.0.2:8000"}'
            value: 0
  - name: ejections by reason
    interval: 1m
    input_series:
      - series: 'kvroute_endpoint_ejections_total{instance="r1:9090",endpoint="http://10.0.0.1:8000",reason="failures"}'
        values: '0 0 0 1 1 1 1 2 2 2 2'
      - series: 'kvroute_endpoint_ejections_total{instance="r1:9090",endpoint="http://10.0.0.1:8000",reason="refusals"}'
        values: '0x5 1x5'
      - series: 'kvroute_endpoint_ejections_total{instance="r2:9090",endpoint="http://10.0.0.1:8000",reason="peer_failures"}'
        values: '0 0 0 1x8'
      - series: 'kvroute_endpoint_ejections_total{instance="r2:9090",endpoint="http://10.0.0.1:8000",reason="failures"}'
        values: '0x10'
    promql_expr_test:
      - expr: EXPR
        eval_time: 10m
        exp_samples:
          - labels: '{endpoint="http://10.0.0.1:8000",reason="failures"}'
            value: 2
          - labels: '{endpoint="http://10.0.0.1:8000",reason="refusals"}'
            value: 1
          - labels: '{endpoint="http://10.0.0.1:8000",reason="peer_failures"}'
            value: 1
`

// TestEjectionsByReason runs the query of "Ejections per endpoint", the only panel that reads
// kvroute_endpoint_ejections_total, in promtool against the counter with and without its
// reason label (ejectionCases), with the dashboard's variables as Grafana sends them for
// "All" and a 10-minute rate interval. It skips when promtool is not installed (Debian
// package prometheus; CI installs it).
func TestEjectionsByReason(t *testing.T) {
	data, err := os.ReadFile("kvroute.json")
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatal(err)
	}
	var expr string
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			if !strings.Contains(tg.Expr, "kvroute_endpoint_ejections_total") {
				continue
			}
			if p.Title != "Ejections per endpoint" || len(p.Targets) != 1 {
				t.Errorf("panel %q reads kvroute_endpoint_ejections_total: check it with and without the reason label here", p.Title)
				continue
			}
			expr = tg.Expr
		}
	}
	if expr == "" {
		t.Fatal(`no panel "Ejections per endpoint" reading kvroute_endpoint_ejections_total`)
	}
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool not installed (Debian package prometheus)")
	}
	q := strings.NewReplacer("$__rate_interval", "10m", "$endpoint", ".*").Replace(expr)
	quoted, err := json.Marshal(q) // a JSON string is a YAML double-quoted scalar
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "ejections_test.yaml")
	tests := "rule_files: []\nevaluation_interval: 1m\ntests:" + strings.ReplaceAll(ejectionCases, "EXPR", string(quoted))
	if err := os.WriteFile(file, []byte(tests), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, promtool, "test", "rules", file).CombinedOutput(); err != nil {
		t.Errorf("promtool test rules, query %s: %v\n%s", q, err, out)
	}
}
