// Package prometheus holds the router's alerting rules (alerts.yaml) and their promtool unit
// tests (alerts_test.yaml). Its test checks that every alert queries metrics the router
// exports (those internal/metrics makes and those a router started on loopback serves), has a
// runbook section in docs/operations.md and a promtool case that fires and one that does not,
// and runs promtool check rules and promtool test rules when promtool is installed (CI
// installs it with Debian's prometheus package).
package prometheus

import (
	"context"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/kvroute/kvroute/deploy/internal/routermetrics"
	"github.com/kvroute/kvroute/internal/metrics"
	"github.com/kvroute/kvroute/internal/route"
)

type ruleFile struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []struct {
			Alert       string            `json:"alert"`
			Expr        string            `json:"expr"`
			For         string            `json:"for"`
			Labels      map[string]string `json:"labels"`
			Annotations map[string]string `json:"annotations"`
		} `json:"rules"`
	} `json:"groups"`
}

type testFile struct {
	RuleFiles []string `json:"rule_files"`
	Tests     []struct {
		Name          string `json:"name"`
		AlertRuleTest []struct {
			EvalTime  string `json:"eval_time"`
			Alertname string `json:"alertname"`
			ExpAlerts []struct {
				ExpLabels map[string]string `json:"exp_labels"`
			} `json:"exp_alerts"`
		} `json:"alert_rule_test"`
	} `json:"tests"`
}

// pending are the metrics rules may query before the router exports them, each with the issue
// that will add it; docs/operations.md says so in the alert's runbook.
var pending = map[string]string{}

// runbookPending are the alerts whose runbook section docs/operations.md does not have yet,
// each with where its text waits; the test fails once the section is there, so that the entry
// goes.
var runbookPending = map[string]string{}

var metricName = regexp.MustCompile(`\bkvroute_[a-z_]+`)

// readYAML decodes the parts of a YAML file that v names (strict: v must name every field).
func readYAML(t *testing.T, path string, v any, strict bool) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	decode := func(b []byte, v any) error { return yaml.Unmarshal(b, v) }
	if strict {
		decode = func(b []byte, v any) error { return yaml.UnmarshalStrict(b, v) }
	}
	if err := decode(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

func TestAlerts(t *testing.T) {
	var rules ruleFile
	readYAML(t, "alerts.yaml", &rules, true)
	var tests testFile
	readYAML(t, "alerts_test.yaml", &tests, false)
	exported, err := routermetrics.Names(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	runbook, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]bool{} // GitHub's anchors of the runbook's headings
	for l := range strings.SplitSeq(string(runbook), "\n") {
		if h, ok := strings.CutPrefix(l, "#"); ok {
			h = strings.ToLower(strings.TrimSpace(strings.TrimLeft(h, "#")))
			h = regexp.MustCompile(`[^a-z0-9 _-]`).ReplaceAllString(h, "")
			anchors[strings.ReplaceAll(h, " ", "-")] = true
		}
	}

	var alerts []string
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			alerts = append(alerts, r.Alert)
			if s := r.Labels["severity"]; s != "warning" && s != "critical" {
				t.Errorf("%s: severity %q, want warning or critical", r.Alert, s)
			}
			for _, a := range []string{"summary", "description", "runbook_url"} {
				if r.Annotations[a] == "" {
					t.Errorf("%s: no %s annotation", r.Alert, a)
				}
			}
			_, anchor, _ := strings.Cut(r.Annotations["runbook_url"], "docs/operations.md#")
			waits := runbookPending[r.Alert]
			switch {
			case anchor != strings.ToLower(r.Alert) || !anchors[anchor] && waits == "":
				t.Errorf("%s: runbook_url %q: want docs/operations.md#%s, a heading there", r.Alert, r.Annotations["runbook_url"], strings.ToLower(r.Alert))
			case anchors[anchor] && waits != "":
				t.Errorf("%s: docs/operations.md has its runbook section now: remove it from runbookPending", r.Alert)
			case waits != "":
				t.Logf("%s: no runbook section in docs/operations.md yet (its text: %s)", r.Alert, waits)
			}
			names := metricName.FindAllString(r.Expr, -1)
			if len(names) == 0 {
				t.Errorf("%s: expression reads no kvroute metric", r.Alert)
			}
			for _, n := range names {
				if !slices.Contains(exported, n) && pending[n] == "" {
					t.Errorf("%s queries %s, which the router does not export", r.Alert, n)
				}
			}
		}
	}
	if len(alerts) < 6 {
		t.Errorf("%d alerts (%v), want at least the six of issue #17", len(alerts), alerts)
	}

	// Every alert: a case where it fires, and a test group where it never fires (a case with no
	// alert expected, in a scenario built not to fire, not just before its for: has passed).
	fires, quiet := map[string]bool{}, map[string]bool{}
	for _, tc := range tests.Tests {
		firesHere := map[string]bool{}
		checked := map[string]bool{}
		for _, a := range tc.AlertRuleTest {
			if !slices.Contains(alerts, a.Alertname) {
				t.Errorf("test %q checks %q, which alerts.yaml does not define", tc.Name, a.Alertname)
			}
			checked[a.Alertname] = true
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname], firesHere[a.Alertname] = true, true
			}
		}
		for a := range checked {
			if !firesHere[a] {
				quiet[a] = true
			}
		}
	}
	for _, a := range alerts {
		if !fires[a] || !quiet[a] {
			t.Errorf("%s: a case that fires %v, a scenario where it does not %v: want both in alerts_test.yaml", a, fires[a], quiet[a])
		}
	}
	if !slices.Equal(tests.RuleFiles, []string{"alerts.yaml"}) {
		t.Errorf("alerts_test.yaml tests %v, want alerts.yaml", tests.RuleFiles)
	}
}

// TestPromtool runs promtool's own checks: the rules are valid, and the cases of
// alerts_test.yaml give the alerts they expect.
func TestPromtool(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool not installed (Debian package prometheus)")
	}
	for _, args := range [][]string{{"check", "rules", "alerts.yaml"}, {"test", "rules", "alerts_test.yaml"}} {
		out, err := exec.Command(promtool, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// TestPeerDropsAlertSkipsLateNews: KVRoutePeerMessagesRejected leaves out exactly the reasons
// of kvroute_peer_dropped_total that internal/route calls expected (route.Drop.Expected),
// so that a reason added there, or one that stops being late news, cannot fall on the wrong
// side of the alert unnoticed.
func TestPeerDropsAlertSkipsLateNews(t *testing.T) {
	var rules ruleFile
	readYAML(t, "alerts.yaml", &rules, true)
	var expr string
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert == "KVRoutePeerMessagesRejected" {
				expr = r.Expr
			}
		}
	}
	m := regexp.MustCompile(`kvroute_peer_dropped_total\{reason!~"([a-z_|]+)"\}`).FindStringSubmatch(expr)
	if m == nil {
		t.Fatalf("KVRoutePeerMessagesRejected: %q, want kvroute_peer_dropped_total{reason!~\"...\"}", expr)
	}
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
	exported := metrics.DropReasons()
	for _, r := range want {
		if !slices.Contains(exported, r) {
			t.Errorf("reason %q: internal/metrics does not make its series (%v)", r, exported)
		}
	}
	got := strings.Split(m[1], "|")
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("KVRoutePeerMessagesRejected leaves out %v, want the expected drops %v", got, want)
	}
}
