package experiment

import (
	"errors"
	"fmt"
	"strings"

	"github.com/kvroute/kvroute/internal/policy"
)

// Policy is one policy to compare: its label in reports, its name and its parameters.
type Policy struct {
	Label, Name string
	Params      policy.Params
}

// ParsePolicies splits "a,b:k=v,k2=v2,c" into policies: a comma-separated piece that holds "="
// but no ":" continues the previous policy's parameters. Every policy is built once here so that
// an unknown name or a bad parameter is reported before any work. Empty means every registered
// policy.
func ParsePolicies(s string) ([]Policy, error) {
	var pieces []string
	if strings.TrimSpace(s) == "" {
		pieces = policy.Names()
	} else {
		for p := range strings.SplitSeq(s, ",") {
			if n := len(pieces); n > 0 && strings.Contains(p, "=") && !strings.Contains(p, ":") {
				pieces[n-1] += "," + p
				continue
			}
			pieces = append(pieces, p)
		}
	}
	out := make([]Policy, 0, len(pieces))
	seen := map[string]bool{}
	var errs []error
	for _, p := range pieces {
		name, params, err := policy.ParseSpec(p)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		label := strings.TrimSpace(p)
		if seen[label] {
			errs = append(errs, fmt.Errorf("policy %q given twice", label))
			continue
		}
		seen[label] = true
		if err := policy.Check(name, params); err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, Policy{Label: label, Name: name, Params: params})
	}
	return out, errors.Join(errs...)
}
