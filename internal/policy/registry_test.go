package policy

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
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
