package experiment

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/internal/policy"
)

func TestParsePolicies(t *testing.T) {
	specs, err := ParsePolicies("round-robin, random,power-of-two")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range specs {
		got = append(got, s.Label+"="+s.Name)
	}
	if diff := cmp.Diff([]string{"round-robin=round-robin", "random=random", "power-of-two=power-of-two"}, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	// Parameters after a colon continue across commas: the error names both parameters.
	_, err = ParsePolicies("round-robin:a=1,b=2,random")
	if err == nil || !strings.Contains(err.Error(), `"a"`) || !strings.Contains(err.Error(), `"b"`) {
		t.Errorf("err %v, want round-robin rejecting a and b", err)
	}
	// The label is the policy as written; the parameters are parsed.
	specs, err = ParsePolicies("consistent-hash:load_factor=1.5,random")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]Policy{{Label: "consistent-hash:load_factor=1.5", Name: "consistent-hash", Params: policy.Params{"load_factor": "1.5"}},
		{Label: "random", Name: "random", Params: policy.Params{}}}, specs); diff != "" {
		t.Errorf("with parameters (-want +got):\n%s", diff)
	}
	if _, err := ParsePolicies("random,random"); err == nil {
		t.Error("a policy given twice: no error")
	}
	all, err := ParsePolicies("")
	if err != nil || len(all) != len(policy.Names()) {
		t.Errorf("default: %d policies, err %v; want every registered one (%d)", len(all), err, len(policy.Names()))
	}
}

func TestDemoPolicies(t *testing.T) {
	labels := func(s string) []string {
		t.Helper()
		specs, err := demoPolicies(s)
		if err != nil {
			t.Fatalf("%q: %v", s, err)
		}
		var out []string
		for _, sp := range specs {
			out = append(out, sp.Label)
		}
		return out
	}
	if diff := cmp.Diff([]string{"round-robin", "least-request", "prefix-aware"}, labels(DemoPolicies)); diff != "" {
		t.Errorf("default list (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(policy.Names(), labels(" all ")); diff != "" {
		t.Errorf("all (-want +got):\n%s", diff)
	}
	if _, err := demoPolicies("round-robin,nope"); err == nil || !strings.Contains(err.Error(), `"nope"`) {
		t.Errorf("unknown policy: err %v, want it named", err)
	}
}

// FuzzParsePolicies: any --policies value gives policies or an error, never a panic, and every
// policy given builds.
func FuzzParsePolicies(f *testing.F) {
	for _, s := range []string{"", "round-robin", "random,power-of-two", "round-robin:a=1,b=2,random", ",", ":=,", "a:b:c=d,=,"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		specs, err := ParsePolicies(s)
		if err != nil {
			return
		}
		for _, sp := range specs {
			if _, err := policy.New(sp.Name, sp.Params, policy.Env{}); err != nil {
				t.Errorf("spec %+v accepted but does not build: %v", sp, err)
			}
		}
	})
}
