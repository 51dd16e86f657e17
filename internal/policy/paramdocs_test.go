package policy

import (
	"bufio"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// paramRow is a row of docs/policy.md's parameter table: | `name` | default | what | why |.
var paramRow = regexp.MustCompile("^\\| `([a-z_]+)` \\| ([^|]+) \\|")

// TestParamDefaultsDocumented checks docs/policy.md's table of prefix-aware's parameters
// against the code: every parameter the policy reads is in the table, every row names one,
// and the default the table gives (thousands separators and a unit " s" allowed) is the one
// the code takes when the parameter is absent.
func TestParamDefaultsDocumented(t *testing.T) {
	defaults, err := Defaults("prefix-aware")
	if err != nil {
		t.Fatal(err)
	}
	if len(defaults) == 0 {
		t.Fatal("no parameter read")
	}
	f, err := os.Open("../../docs/policy.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	documented := map[string]bool{}
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for line := 1; sc.Scan(); line++ {
		m := paramRow.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		name, doc := m[1], strings.TrimSpace(m[2])
		d, ok := defaults[name]
		if !ok {
			continue // a table of removed parameters, or another policy's
		}
		documented[name] = true
		def := fmt.Sprint(d)
		num := strings.TrimSuffix(strings.ReplaceAll(doc, ",", ""), " s")
		want, err1 := strconv.ParseFloat(def, 64)
		got, err2 := strconv.ParseFloat(num, 64)
		if err1 != nil || err2 != nil || got != want {
			t.Errorf("docs/policy.md:%d: %s's default is %q, the code's %s: fix the table", line, name, doc, def)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	for name, def := range defaults {
		if !documented[name] {
			t.Errorf("docs/policy.md: prefix-aware's parameter %s (default %s) has no row in the parameter table", name, def)
		}
	}
}
