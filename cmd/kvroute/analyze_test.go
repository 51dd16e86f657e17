package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const analyzeTrace = `{"timestamp": 0, "input_length": 1024, "output_length": 10, "hash_ids": [0, 1]}
{"timestamp": 1000, "input_length": 1500, "output_length": 20, "hash_ids": [0, 1, 2]}
{"timestamp": 2000, "input_length": 600, "output_length": 30, "hash_ids": [0, 3]}
`

// runAnalyzeForTest runs the verb and returns its exit status, stdout and stderr.
func runAnalyzeForTest(t *testing.T, stdin string, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := analyzeMain(context.Background(), args, strings.NewReader(stdin), &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestAnalyzeText(t *testing.T) {
	path := writeTempFile(t, "trace.jsonl", analyzeTrace)
	// Flags after the file work too.
	code, out, errOut := runAnalyzeForTest(t, "", path, "--instances", "2")
	if code != 0 || errOut != "" {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	// Infinite cache at 16-token blocks: request 2 hits 1024 of 1500 tokens, request 3 hits 512
	// of 600: 1536 of 3124 tokens.
	for _, want := range []string{
		"requests        3 over 2 s (1.50 requests/s)",
		"prompt tokens   p50 1,024  p90 1,024  p99 1,024  max 1,500  mean 1,041  (total 3,124)",
		"blocks          4 distinct (512 tokens); working set 1,588 tokens",
		"common prefix   1 block(s) shared by every request",
		">= 1: 66.7%  >= 2: 33.3%  >= 4: 0.0%",
		"unbounded cache 0.492; pooled LRU of 2 x 2,500,000 tokens (llama3-70b-h200-tp8) 0.492; random over 2 instances 0.",
		"verdict         prefix-aware routing is",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	// --trace FILE, as simulate, bench and plan take it, says the same.
	code, outFlag, errOut := runAnalyzeForTest(t, "", "--trace", path, "--instances", "2")
	if code != 0 || errOut != "" || outFlag != out {
		t.Errorf("--trace: exit %d, stderr %q, output:\n%s\nwant FILE's:\n%s", code, errOut, outFlag, out)
	}
}

func TestAnalyzeJSONFromStdin(t *testing.T) {
	code, out, errOut := runAnalyzeForTest(t, analyzeTrace, "--json", "--profile", "llama3-70b-h100-tp4", "-")
	if code != 0 {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	var got struct {
		Source    string  `json:"source"`
		Requests  int     `json:"requests"`
		Duration  float64 `json:"duration_s"`
		KVTokens  int     `json:"kv_tokens_per_instance"`
		Capacity  int     `json:"capacity_tokens"`
		Infinite  float64 `json:"infinite_hit_rate"`
		Verdict   string  `json:"verdict"`
		Instances int     `json:"instances"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, out)
	}
	if got.Source != "standard input" || got.Requests != 3 || got.Duration != 2 || got.KVTokens != 461376 ||
		got.Instances != 8 || got.Capacity != 8*461376 || got.Infinite < 0.49 || got.Infinite > 0.50 || got.Verdict == "" {
		t.Errorf("JSON report: %+v", got)
	}
}

func TestAnalyzeWorkload(t *testing.T) {
	code, out, errOut := runAnalyzeForTest(t, "", "--workload", "shared-prefix:groups=2,prompts=4", "--seed", "3")
	if code != 0 || !strings.Contains(out, "source          shared-prefix:groups=2,prompts=4 (generated)") ||
		!strings.Contains(out, "requests        8 over") {
		t.Errorf("exit %d, stderr %q, output:\n%s", code, errOut, out)
	}
}

func TestAnalyzeBadInput(t *testing.T) {
	bad := writeTempFile(t, "trace.jsonl", analyzeTrace+`{"timestamp": 3000, "input_length": -5, "output_length": 1, "hash_ids": []}`+"\n")
	tests := []struct {
		name  string
		stdin string
		args  []string
		code  int
		want  string
	}{
		{"bad line", "", []string{bad}, 2, "line 4: field input_length: -5"},
		{"bad json on stdin", "{", []string{"-"}, 2, "standard input: line 1: invalid JSON"},
		{"missing file", "", []string{filepath.Join(t.TempDir(), "none.jsonl")}, 2, "open trace"},
		{"no file", "", nil, 2, "want one trace FILE"},
		{"two files", "", []string{"a", "b"}, 2, "got 2"},
		{"file and workload", "", []string{"a", "--workload", "multi-turn"}, 2, "not both"},
		{"file and --trace", "", []string{"a", "--trace", "b"}, 2, "as FILE or as --trace FILE, not both"},
		{"--trace and workload", "", []string{"--trace", "a", "--workload", "multi-turn"}, 2, "--trace or --workload, not both"},
		{"missing --trace file", "", []string{"--trace", filepath.Join(t.TempDir(), "none.jsonl")}, 2, "open trace"},
		{"unknown flag", "", []string{"--colour", "x"}, 2, "flag provided but not defined"},
		{"bad instances", "", []string{"--instances", "0", "x"}, 2, "--instances 0: want 1 to 10000"},
		{"too many instances", "", []string{"--instances", "9223372036854775807", "x"}, 2, "--instances 9223372036854775807: want 1 to 10000"},
		{"bad profile", "", []string{"--profile", "nope", "x"}, 2, `--profile: engine: unknown profile "nope"`},
		{"bad format", "", []string{"--format", "csv", "x"}, 2, `--format "csv": unknown, want mooncake`},
		{"bad workload", "", []string{"--workload", "nope"}, 2, `--workload: workload "nope": unknown name`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out, errOut := runAnalyzeForTest(t, tt.stdin, tt.args...)
			if code != tt.code || !strings.Contains(errOut, tt.want) || out != "" {
				t.Errorf("exit %d (want %d), stderr %q (want %q), stdout %q", code, tt.code, errOut, tt.want, out)
			}
			if strings.Count(errOut, "\n") != 1 {
				t.Errorf("stderr is not one line: %q", errOut)
			}
		})
	}
}

func TestAnalyzeHelp(t *testing.T) {
	code, out, _ := runAnalyzeForTest(t, "", "-h")
	if code != 0 || !strings.Contains(out, "usage: kvroute analyze") || !strings.Contains(out, "-instances") || !strings.Contains(out, "multi-turn:") {
		t.Errorf("exit %d, help:\n%s", code, out)
	}
}

func TestAnalyzeRealTrace(t *testing.T) {
	path := "../../../shared/traces/mooncake/conversation_trace.jsonl"
	if _, err := os.Stat(path); err != nil {
		t.Skipf("trace not available: %v", err)
	}
	code, out, errOut := runAnalyzeForTest(t, "", path)
	if code != 0 {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	for _, want := range []string{"12,031 over 3,537 s (3.40 requests/s)", "p50 6,909  p90 27,367  p99 85,399", "182,790 distinct", "unbounded cache 0.374", "likely to pay off"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}
