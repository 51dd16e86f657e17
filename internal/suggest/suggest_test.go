package suggest

import "testing"

func TestNearest(t *testing.T) {
	names := []string{"max_load_factor", "index_blocks", "step_tokens"}
	for _, tt := range []struct{ key, want string }{
		{"max_load_factr", "max_load_factor"}, // one edit
		{"index_blcks", "index_blocks"},
		{"step_tokenz", "step_tokens"},
		{"stp_tokenz", "step_tokens"}, // two
		{"sp_tokez", ""},              // three: too far
		{"learn", ""},
		{"", ""},
	} {
		if got := Nearest(tt.key, names); got != tt.want {
			t.Errorf("Nearest(%q) = %q, want %q", tt.key, got, tt.want)
		}
	}
}
