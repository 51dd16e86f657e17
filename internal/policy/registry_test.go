package policy

import (
	"strings"
	"testing"
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
