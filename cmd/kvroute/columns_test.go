package main

import (
	"regexp"
	"strings"
	"testing"
)

// columnNames reads the column names from a table's header line: the names are separated by
// two spaces or more ("  policy  hit rate  TTFT mean ms ..."); the first, the row's name
// ("policy", "time"), is left out where skipFirst.
func columnNames(header string, skipFirst bool) []string {
	names := regexp.MustCompile(`\s{2,}`).Split(strings.TrimSpace(header), -1)
	if skipFirst {
		names = names[1:]
	}
	return names
}

// headerLine is the first line of out that starts (after spaces) with first and holds next.
func headerLine(t *testing.T, out, first, next string) string {
	t.Helper()
	for l := range strings.SplitSeq(out, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), first+" ") && strings.Contains(l, next) {
			return l
		}
	}
	t.Fatalf("no header line starting %q in:\n%s", first, out)
	return ""
}

// TestHelpExplainsColumns: the -h of every verb that prints a table says what each of its
// columns means (they were explained only in docs/results.md). The columns are read from the
// tables the verbs print, so that a column added later without a word in -h fails here.
func TestHelpExplainsColumns(t *testing.T) {
	help := map[string]string{}
	for _, v := range []string{"simulate", "bench", "demo", "plan"} {
		code, out, errOut := runVerb(v, "-h")
		if code != 0 {
			t.Fatalf("%s -h: exit %d, %s", v, code, errOut)
		}
		help[v] = out
	}
	legend := func(v, heading string) string {
		_, after, ok := strings.Cut(help[v], "\n"+heading)
		if !ok {
			t.Fatalf("%s -h has no %q:\n%s", v, heading, help[v])
		}
		text, _, _ := strings.Cut(after, "\n\n")
		return text
	}
	explains := func(what, text string, columns []string) {
		t.Helper()
		for _, c := range columns {
			if !strings.Contains(text, c) {
				t.Errorf("%s does not explain the column %q:\n%s", what, c, text)
			}
		}
	}

	code, out, errOut := runVerb("simulate", "--workload", "shared-prefix:groups=2,prompts=4,n=8", "--instances", "2",
		"--policies", "prefix-aware,round-robin", "--autoscale", "start=1,interval=1s")
	if code != 0 {
		t.Fatalf("simulate: exit %d, %s", code, errOut)
	}
	summary := columnNames(headerLine(t, out, "policy", "hit rate"), true)
	timeline := columnNames(headerLine(t, out, "time", "engines"), false)
	for _, v := range []string{"simulate", "bench", "demo"} {
		explains(v+" -h", legend(v, "columns of the table"), summary)
		if !strings.Contains(help[v], "hit-rate bounds (above the table)") {
			t.Errorf("%s -h does not explain the hit-rate bounds", v)
		}
	}
	explains("simulate -h on --autoscale", legend("simulate", "with --autoscale"), timeline)
	// internal/scorecard's cell table (a scorecard takes minutes to print one).
	explains("simulate -h on --scorecard", legend("simulate", "with --scorecard"),
		[]string{"of bound", "mean/best", "p50/best", "p99/best", "imbalance"})
	explains("bench -h on the lines under the table", legend("bench", "under the table"), []string{"sent", "send lag ms", "ITL ms", "errors"})
	explains("demo -h on --compare-simulate", legend("demo", "with --compare-simulate"),
		[]string{"hit live", "hit sim", "delta", "TTFT p50 live", "sim", "ratio", "agree"})

	code, out, errOut = runVerb("plan", "--workload", "shared-prefix:groups=2,prompts=4,n=8", "--slo-ttft-p90", "2s",
		"--max-instances", "2", "--policies", "prefix-aware,round-robin", "--quiet")
	if code != 0 {
		t.Fatalf("plan: exit %d, %s", code, errOut)
	}
	explains("plan -h", legend("plan", "columns of the table"), columnNames(headerLine(t, out, "policy", "instances"), true))
}

// TestColumnsHelpReadsAsNoFlag: no line of the column legends reads as a flag in -h ("  -x"),
// which test/docs takes for one when it checks the docs' commands against -h.
func TestColumnsHelpReadsAsNoFlag(t *testing.T) {
	flagLike := regexp.MustCompile(`(?m)^ {2}-[A-Za-z0-9]`)
	for _, text := range []string{summaryColumns, simulateColumns, benchColumns, demoColumns, planColumns} {
		if l := flagLike.FindString(text); l != "" {
			t.Errorf("a legend line reads as a flag (%q):\n%s", l, text)
		}
	}
}
