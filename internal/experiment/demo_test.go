package experiment

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A demo whose live runs would take hours says so, with the fix, before it starts them: the
// Mooncake trace replayed whole showed only an ETA of hours once its first policy had begun.
// A short one says nothing. (Interrupted at once: no policy runs.)
func TestDemoSaysALongRunFirst(t *testing.T) {
	for _, tt := range []struct {
		name, lastMillis, want string
	}{
		{"an hour", "3600000", "demo: the workload's 2 arrivals span 1h0m0s of model time: at --time-scale 2 each of the 2 policies takes at least 2h0m0s (4h0m0s in all); " +
			"--requests N or --speedup K shortens it, and Ctrl-C keeps the policies that finished\n"},
		{"a minute", "60000", ""},
	} {
		trace := filepath.Join(t.TempDir(), "trace.jsonl")
		lines := `{"timestamp":0,"input_length":100,"output_length":1,"hash_ids":[1]}` + "\n" +
			`{"timestamp":` + tt.lastMillis + `,"input_length":100,"output_length":1,"hash_ids":[2]}` + "\n"
		if err := os.WriteFile(trace, []byte(lines), 0o600); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		var log bytes.Buffer
		d, err := Demo(ctx, DemoOptions{
			Trace: trace, Policies: "round-robin,least-request", Instances: 1, Profile: "llama3-70b-h200-tp8", Log: &log,
		})
		if err != nil || d.InterruptedDuring != "round-robin" {
			t.Fatalf("%s: report %+v, error %v; want one interrupted during round-robin", tt.name, d, err)
		}
		said := strings.Contains(log.String(), "demo: the workload's")
		if tt.want != "" && !strings.HasPrefix(log.String(), tt.want) || tt.want == "" && said {
			t.Errorf("%s: log %q, want it to start with %q", tt.name, log.String(), tt.want)
		}
	}
}
