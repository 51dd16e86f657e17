package workload

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

const tracePath = "../../../shared/traces/mooncake/conversation_trace.jsonl"

// loadTrace loads the real trace or skips the test when it is absent.
func loadTrace(t testing.TB) []Request {
	t.Helper()
	if _, err := os.Stat(tracePath); err != nil {
		t.Skipf("trace not available: %v", err)
	}
	reqs, err := LoadMooncake(tracePath)
	if err != nil {
		t.Fatal(err)
	}
	return reqs
}

func TestReadMooncake(t *testing.T) {
	in := `{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}

{"timestamp": 1500, "input_length": 512, "output_length": 1, "hash_ids": [0], "extra": true}
`
	got, err := ReadMooncake(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	want := []Request{
		{ID: 0, Arrival: 0, Blocks: []uint64{0, 1}, BlockTokens: 512, PromptTokens: 600, OutputTokens: 5},
		{ID: 1, Arrival: 1500 * time.Millisecond, Blocks: []uint64{0}, BlockTokens: 512, PromptTokens: 512, OutputTokens: 1},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ReadMooncake (-want +got):\n%s", diff)
	}
}

func TestReadMooncakeErrors(t *testing.T) {
	good := `{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [7]}` + "\n"
	tests := []struct {
		name, line, want string
	}{
		{"bad json", `{"timestamp": 0,`, "line 2: invalid JSON"},
		{"not an object", `[1,2]`, "line 2:"},
		{"missing timestamp", `{"input_length": 10, "output_length": 5, "hash_ids": [7]}`, "line 2: field timestamp: missing"},
		{"negative timestamp", `{"timestamp": -1, "input_length": 10, "output_length": 5, "hash_ids": [7]}`, "line 2: field timestamp"},
		{"missing input", `{"timestamp": 0, "output_length": 5, "hash_ids": [7]}`, "line 2: field input_length: missing"},
		{"zero input", `{"timestamp": 0, "input_length": 0, "output_length": 5, "hash_ids": []}`, "line 2: field input_length: 0"},
		{"negative output", `{"timestamp": 0, "input_length": 10, "output_length": -3, "hash_ids": [7]}`, "line 2: field output_length: -3"},
		{"missing output", `{"timestamp": 0, "input_length": 10, "hash_ids": [7]}`, "line 2: field output_length: missing"},
		{"missing hash_ids", `{"timestamp": 0, "input_length": 10, "output_length": 5}`, "line 2: field hash_ids: missing"},
		{"negative hash id", `{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [-1]}`, "line 2: field hash_ids"},
		{"string length", `{"timestamp": 0, "input_length": "10", "output_length": 5, "hash_ids": [7]}`, "line 2: field input_length"},
		{"too few blocks", `{"timestamp": 0, "input_length": 513, "output_length": 5, "hash_ids": [7]}`, "line 2: field hash_ids: 1 blocks for input_length 513"},
		{"too many blocks", `{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [7, 8]}`, "line 2: field hash_ids: 2 blocks"},
		{"hash comment", `# recorded on Tuesday`, "line 2: a comment, which JSON Lines do not have (want Mooncake JSON Lines, one object a line with timestamp"},
		{"slash comment", `// recorded on Tuesday`, "line 2: a comment, which JSON Lines do not have"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ReadMooncake(strings.NewReader(good + tt.line + "\n"))
			if err == nil || !strings.HasPrefix(err.Error(), tt.want) {
				t.Errorf("error = %v, want prefix %q", err, tt.want)
			}
		})
	}
}

// TestReadMooncakeNoRequests: a trace without a request is an error that wraps ErrNoRequests
// and says what a trace line is, whether the input is empty or only blank lines.
func TestReadMooncakeNoRequests(t *testing.T) {
	tests := []struct {
		name, in, want string
	}{
		{"empty", "", "no requests: the trace is empty (want Mooncake JSON Lines, one object a line with timestamp, input_length, output_length and hash_ids)"},
		{"blank lines", "\n  \n\t\n", "no requests: nothing but 3 blank line(s) (want Mooncake JSON Lines, one object a line with timestamp, input_length, output_length and hash_ids)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reqs, err := ReadMooncake(strings.NewReader(tt.in))
			if !errors.Is(err, ErrNoRequests) || err.Error() != tt.want || reqs != nil {
				t.Errorf("ReadMooncake(%q) = %v, %v; want no requests and %q", tt.in, reqs, err, tt.want)
			}
		})
	}
	// LoadMooncake names the file.
	path := t.TempDir() + "/empty.jsonl"
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := LoadMooncake(path)
	if !errors.Is(err, ErrNoRequests) || !strings.HasPrefix(err.Error(), path+": no requests: the trace is empty") {
		t.Errorf("LoadMooncake(empty file) = %v; want it to wrap ErrNoRequests and start with the path", err)
	}
}

type failingReader struct{}

func (failingReader) Read([]byte) (int, error) { return 0, errors.New("disk on fire") }

func TestReadMooncakeReadError(t *testing.T) {
	_, err := ReadMooncake(failingReader{})
	if err == nil || !strings.Contains(err.Error(), "disk on fire") {
		t.Errorf("error = %v, want the read error", err)
	}
}

func TestLoadMooncakeMissingFile(t *testing.T) {
	_, err := LoadMooncake(t.TempDir() + "/nope.jsonl")
	if !errors.Is(err, os.ErrNotExist) {
		t.Errorf("error = %v, want os.ErrNotExist", err)
	}
}

// TestTrace loads the real trace once and checks what is measured on it.
func TestTrace(t *testing.T) {
	reqs := loadTrace(t)
	t.Run("figures", func(t *testing.T) { checkTraceFigures(t, reqs) })
	t.Run("bounds", func(t *testing.T) { checkTraceBounds(t, reqs) })
	t.Run("analyze", func(t *testing.T) { checkTraceAnalyze(t, reqs) })
}

// checkTraceFigures checks the reader against the figures in the trace's README.
func checkTraceFigures(t *testing.T, reqs []Request) {
	if len(reqs) != 12031 {
		t.Fatalf("requests = %d, want 12031", len(reqs))
	}
	var tokens int64
	distinct := map[uint64]struct{}{}
	for i := range reqs {
		tokens += int64(reqs[i].PromptTokens)
		for _, b := range reqs[i].Blocks {
			distinct[b] = struct{}{}
		}
	}
	if tokens != 144793823 {
		t.Errorf("prompt tokens = %d, want 144793823", tokens)
	}
	if len(distinct) != 182790 {
		t.Errorf("distinct blocks = %d, want 182790", len(distinct))
	}
	if got := reqs[len(reqs)-1].Arrival; got != 3536999*time.Millisecond {
		t.Errorf("last arrival = %v, want 3536.999s", got)
	}
}

func FuzzParseMooncakeLine(f *testing.F) {
	f.Add([]byte(`{"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]}`))
	f.Add([]byte(`{"timestamp": 1e300, "input_length": 1, "output_length": 1, "hash_ids": [18446744073709551615]}`))
	f.Add([]byte(`{"timestamp": -0, "input_length": 9223372036854775807, "output_length": 1, "hash_ids": []}`))
	f.Add([]byte(`{"hash_ids": null}`))
	f.Add([]byte(``)) // found by the CI's fuzzing: the comment check read b[0]
	f.Add([]byte(`# a comment`))
	f.Fuzz(func(t *testing.T, b []byte) {
		req, _, err := parseMooncakeLine(b)
		if err != nil {
			if req.Blocks != nil || req.PromptTokens != 0 {
				t.Errorf("error %v with a non-zero request %+v", err, req)
			}
			return
		}
		if req.PromptTokens < 1 || req.OutputTokens < 1 || req.Arrival < 0 {
			t.Errorf("accepted invalid request %+v", req)
		}
		if want := (req.PromptTokens + 511) / 512; len(req.Blocks) != want {
			t.Errorf("accepted %d blocks for %d tokens", len(req.Blocks), req.PromptTokens)
		}
	})
}

func BenchmarkReadMooncake(b *testing.B) {
	var sb strings.Builder
	for i := 0; i < 1000; i++ {
		fmt.Fprintf(&sb, `{"timestamp": %d, "input_length": 6000, "output_length": 300, "hash_ids": [0`, i*300)
		for k := 1; k < 12; k++ {
			fmt.Fprintf(&sb, ", %d", i*12+k)
		}
		sb.WriteString("]}\n")
	}
	text := sb.String()
	b.ReportAllocs()
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		if _, err := ReadMooncake(strings.NewReader(text)); err != nil {
			b.Fatal(err)
		}
	}
}

// TestReadMooncakeRebases: arrivals are measured from the earliest timestamp, wherever it is
// in the file, so a trace in Unix milliseconds reads as one that starts at 0.
func TestReadMooncakeRebases(t *testing.T) {
	in := `{"timestamp": 1733500000100, "input_length": 10, "output_length": 5, "hash_ids": [7]}
{"timestamp": 1733500000000, "input_length": 10, "output_length": 5, "hash_ids": [8]}
{"timestamp": 1733500000250, "input_length": 10, "output_length": 5, "hash_ids": [9]}
`
	reqs, err := ReadMooncake(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	want := []time.Duration{100 * time.Millisecond, 0, 250 * time.Millisecond}
	if diff := cmp.Diff(want, arrivals(reqs)); diff != "" {
		t.Errorf("arrivals (-want +got):\n%s", diff)
	}
}
