package policy

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// TestCheck: Check says what New would, without the caller keeping a policy.
func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		name   string
		params map[string]string
		want   string // substring of the error; "" for none
	}{
		{"round-robin", nil, ""},
		{"prefix-aware", map[string]string{}, ""},
		{"round-robin", map[string]string{"alpha": "1"}, `policy round-robin: unknown parameter "alpha"`},
		{"nosuch", nil, `unknown policy "nosuch"`},
	} {
		err := Check(tc.name, tc.params)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("Check(%s, %v) = %v, want nil", tc.name, tc.params, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("Check(%s, %v) = %v, want %q", tc.name, tc.params, err, tc.want)
		}
	}
}

// TestUnknownParam: an unknown parameter's error lists the parameters the policy takes, never
// the removed ones it reads only to refuse, and suggests the nearest.
func TestUnknownParam(t *testing.T) {
	const paKnown = "affinity_window, attention_weight, cache_weight, decode_cost, index_blocks, max_index_entries, max_load_factor, step_tokens"
	for _, tc := range []struct {
		name, key, want string
	}{
		{"prefix-aware", "max_load_factr", `policy prefix-aware: unknown parameter "max_load_factr" (did you mean "max_load_factor"? known: ` + paKnown + ")"},
		{"prefix-aware", "colour", `policy prefix-aware: unknown parameter "colour" (known: ` + paKnown + ")"},
		// Near a removed parameter only: that is not a suggestion.
		{"prefix-aware", "learnn", `policy prefix-aware: unknown parameter "learnn" (known: ` + paKnown + ")"},
		{"round-robin", "alpha", `policy round-robin: unknown parameter "alpha": the policy takes no parameters`},
	} {
		err := Check(tc.name, map[string]string{tc.key: "1"})
		if err == nil {
			t.Errorf("Check(%s, %s=1) = nil, want an error", tc.name, tc.key)
			continue
		}
		if diff := cmp.Diff(tc.want, err.Error()); diff != "" {
			t.Errorf("Check(%s, %s=1) (-want +got):\n%s", tc.name, tc.key, diff)
		}
	}
}

// TestDefaults: Defaults gives every parameter each policy takes, no other (the list its
// error for an unknown parameter names), each with a default the policy takes written out,
// typed as its getter reads it; some by hand as the constructors write them.
func TestDefaults(t *testing.T) {
	for _, name := range Names() {
		defs, err := Defaults(name)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var want []string
		switch err := Check(name, map[string]string{"zz_not_a_parameter": "1"}); {
		case err == nil:
			t.Fatalf("%s took an unknown parameter", name)
		case !strings.Contains(err.Error(), "takes no parameters"):
			_, list, ok := strings.Cut(err.Error(), "known: ")
			if !ok {
				t.Fatalf("%s: no list of parameters in %q", name, err)
			}
			want = strings.Split(strings.TrimSuffix(list, ")"), ", ")
		}
		if diff := cmp.Diff(want, slices.Sorted(maps.Keys(defs)), cmpopts.EquateEmpty()); diff != "" {
			t.Errorf("%s: Defaults' keys (-the policy's parameters +got):\n%s", name, diff)
		}
		text := Params{}
		for k, v := range defs {
			switch v.(type) {
			case int, float64, bool, time.Duration:
			default:
				t.Errorf("%s: %s's default %v is a %T", name, k, v, v)
			}
			text[k] = fmt.Sprint(v)
		}
		if err := Check(name, text); err != nil {
			t.Errorf("%s: its defaults written out: %v", name, err)
		}
	}
	for _, tc := range []struct {
		name, key string
		want      any
	}{
		{"prefix-aware", "cache_weight", 6.0},
		{"prefix-aware", "step_tokens", 8192},
		{"overlap-cost", "ttl", 120 * time.Second},
		{"consistent-hash", "virtual_nodes", 256},
	} {
		defs, _ := Defaults(tc.name)
		if got := defs[tc.key]; got != tc.want {
			t.Errorf("%s's %s: default %v (%T), want %v (%T)", tc.name, tc.key, got, got, tc.want, tc.want)
		}
	}
	if _, err := Defaults("nosuch"); err == nil || !strings.Contains(err.Error(), `unknown policy "nosuch"`) {
		t.Errorf("Defaults(nosuch) = %v, want an unknown policy", err)
	}
}
