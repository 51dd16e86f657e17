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

// A singular for a plural, or the plural for a singular, is three edits away when the word
// ends in y (policy, policies); the start of a longer name is more.
func TestNearest_PluralsAndStarts(t *testing.T) {
	for _, tt := range []struct {
		key   string
		names []string
		want  string
	}{
		{"policy", []string{"policies", "seeds", "html"}, "policies"},
		{"policies", []string{"policy", "config", "endpoint"}, "policy"},
		{"inst", []string{"instances", "load", "seed"}, "instances"},
		{"in", []string{"instances", "load"}, ""},                             // too short to guess from
		{"lo", []string{"instances", "load"}, "load"},                         // two edits
		{"rout", []string{"routers", "route-every", "seed"}, ""},              // two names begin so
		{"replica", []string{"replica-sync", "replicas", "seed"}, "replicas"}, // one edit wins
		{"class", []string{"clas", "html"}, "clas"},                           // one edit
		{"glass", []string{"load", "html"}, ""},                               // ss is no plural
	} {
		if got := Nearest(tt.key, tt.names); got != tt.want {
			t.Errorf("Nearest(%q, %q) = %q, want %q", tt.key, tt.names, got, tt.want)
		}
	}
}
