package workload

import (
	"errors"
	"fmt"
	"os"
	"slices"
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

// A directory opens as a file does, and failed the first read as "read trace after line 0:
// ... is a directory", which is not ErrBadTrace (exit 1, as a disk failing): it is a path that
// names no trace.
func TestLoadMooncakeDirectory(t *testing.T) {
	dir := t.TempDir()
	_, err := LoadMooncake(dir)
	if want := "open trace: " + dir + " is a directory: give the path of the trace file in it"; !errors.Is(err, ErrBadTrace) || err == nil || err.Error() != want {
		t.Errorf("error = %v, want ErrBadTrace %q", err, want)
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

// moonLine is one Mooncake line at ms with a prompt of input tokens and its own ids from id.
func moonLine(ms string, input int, id int) string {
	ids := make([]string, (input+511)/512)
	for i := range ids {
		ids[i] = fmt.Sprint(id + i)
	}
	return fmt.Sprintf(`{"timestamp": %s, "input_length": %d, "output_length": 10, "hash_ids": [%s]}`+"\n", ms, input, strings.Join(ids, ", "))
}

// moonTrace is n lines, request i at stamp(i) with a prompt of input tokens.
func moonTrace(n, input int, stamp func(i int) string) string {
	var b strings.Builder
	for i := range n {
		b.WriteString(moonLine(stamp(i), input, i*1000))
	}
	return b.String()
}

// TestReadMooncakeTimeUnit: timestamps that are not milliseconds by the look of them are a bad
// trace, with a message that says why and names the conversion; milliseconds, however large or
// dense within reason, are read.
func TestReadMooncakeTimeUnit(t *testing.T) {
	tests := []struct {
		name  string
		trace string
		want  []string // substrings of the error; none: read
	}{
		{"fractional seconds", moonTrace(200, 14000, func(i int) string { return fmt.Sprintf("%.3f", float64(i)*0.36) }), []string{
			"line 2: timestamp 0.36 has a fraction of a millisecond: the timestamps look like seconds",
			"its 200 requests of 14000 prompt tokens on average arrive within 71.64ms, 2791.74 requests/s",
			"kvroute trace convert --time-unit s FILE > trace.jsonl (if they are milliseconds, --time-unit ms rounds them)"}},
		{"one fraction", moonTrace(3, 100, func(i int) string { return []string{"0", "1000", "2000.5"}[i] }), []string{
			"line 3: timestamp 2000.5 has a fraction of a millisecond"}},
		{"unix seconds", moonTrace(3, 100, func(i int) string { return fmt.Sprint(1733500000 + i*7) }), []string{
			"timestamps from 1733500000 to 1733500014 look like Unix time in seconds (2024-12-06 to 2024-12-06 UTC)", "--time-unit s"}},
		{"unix microseconds", moonTrace(3, 100, func(i int) string { return fmt.Sprint(1733500000000000 + i*7000) }), []string{
			"line 1: field timestamp: 1.7335e+15 out of range for milliseconds: it looks like Unix time in microseconds", "--time-unit us"}},
		{"unix nanoseconds", moonTrace(3, 100, func(i int) string { return fmt.Sprint(int64(1733500000000000000) + int64(i)*7000) }), []string{
			"line 1: field timestamp: 1.7335e+18 out of range for milliseconds: it looks like Unix time in nanoseconds", "--time-unit ns"}},
		{"whole seconds, too fast", moonTrace(100, 14000, func(i int) string { return fmt.Sprint(i) }), []string{
			"the timestamps look like seconds: kvroute reads milliseconds, and as milliseconds, its 100 requests of 14000 prompt tokens on average arrive within 99ms, 1010.10 requests/s: 14141414 prompt tokens a second",
			"--time-unit s"}},
		// Read as they are:
		{"milliseconds", moonTrace(200, 14000, func(i int) string { return fmt.Sprint(i * 360) }), nil},
		{"unix milliseconds", moonTrace(3, 100, func(i int) string { return fmt.Sprint(1733500000000 + i*7) }), nil},
		{"seconds times 1000", moonTrace(3, 100, func(i int) string { return []string{"0", "700.0000000000001", "1100.0000000000002"}[i] }), nil},
		{"a burst", moonTrace(500, 14000, func(int) string { return "0" }), nil},
		{"dense but few", moonTrace(99, 14000, func(i int) string { return fmt.Sprint(i) }), nil},
		{"dense, short prompts", moonTrace(1000, 100, func(i int) string { return fmt.Sprint(i) }), nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reqs, err := ReadMooncake(strings.NewReader(tt.trace))
			if tt.want == nil {
				if err != nil {
					t.Fatalf("error %v, want the trace read", err)
				}
				return
			}
			if err == nil || !errors.Is(err, ErrBadTrace) || reqs != nil {
				t.Fatalf("ReadMooncake = %d requests, %v; want a bad trace error", len(reqs), err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

// TestReadMooncakeTypeErrors: a value of the wrong type is named in JSON's words, never Go's.
func TestReadMooncakeTypeErrors(t *testing.T) {
	const good = `{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [7]}` + "\n"
	for line, want := range map[string]string{
		`{"timestamp": "0", "input_length": 10, "output_length": 5, "hash_ids": [7]}`:  "line 1: field timestamp: want a number, got JSON string",
		`{"timestamp": 0, "input_length": 1.5, "output_length": 5, "hash_ids": [7]}`:   "line 1: field input_length: want a whole number, got JSON number 1.5",
		`{"timestamp": 0, "input_length": 10, "output_length": true, "hash_ids": [7]}`: "line 1: field output_length: want a whole number, got JSON bool",
		`{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": "7"}`:    "line 1: field hash_ids: want an array of whole numbers from 0 to 18446744073709551615, got JSON string",
		`{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [-7]}`:   "line 1: field hash_ids: want a whole number from 0 to 18446744073709551615, got JSON number -7",
		good + `[1, 2]`: "line 2: want a JSON object, got JSON array",
		good + `"a"`:    "line 2: want a JSON object, got JSON string",
	} {
		_, err := ReadMooncake(strings.NewReader(line + "\n"))
		if err == nil || err.Error() != want && !strings.HasPrefix(err.Error(), want+" (") {
			t.Errorf("%s: error %v, want %q", line, err, want)
		}
		if err != nil && (strings.Contains(err.Error(), "float64") || strings.Contains(err.Error(), "Go ") || strings.Contains(err.Error(), "uint64")) {
			t.Errorf("%s: error %q names Go types", line, err)
		}
	}
}

// TestReadMooncakeBlockSizeHint: a trace of 64-token blocks is refused with the block size it
// has and the conversion that regroups it.
func TestReadMooncakeBlockSizeHint(t *testing.T) {
	ids := make([]string, 106)
	for i := range ids {
		ids[i] = fmt.Sprint(i)
	}
	line := `{"timestamp": 0, "input_length": 6758, "output_length": 5, "hash_ids": [` + strings.Join(ids, ", ") + "]}\n"
	_, err := ReadMooncake(strings.NewReader(line))
	want := "line 1: field hash_ids: 106 blocks for input_length 6758, want ceil(6758/512) = 14 (if the trace's blocks are 64 tokens, convert it to 512-token blocks: kvroute trace convert --block-tokens 64 FILE > trace.jsonl)"
	if err == nil || err.Error() != want {
		t.Errorf("error %v\nwant %s", err, want)
	}
}

// TestReadMooncakeExactBlocks: every request's ids take exactly their length (a slice decoded
// line by line kept up to half again as much), and appending to one request's ids leaves its
// neighbours' alone although they share memory.
func TestReadMooncakeExactBlocks(t *testing.T) {
	var b strings.Builder
	for i := range 300 {
		b.WriteString(moonLine(fmt.Sprint(i*100), 512*(1+i%40), i*100))
	}
	reqs, err := ReadMooncake(strings.NewReader(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	for i := range reqs {
		if got := cap(reqs[i].Blocks); got != len(reqs[i].Blocks) || len(reqs[i].Blocks) != 1+i%40 {
			t.Fatalf("request %d: %d ids, capacity %d; want %d and as much", i, len(reqs[i].Blocks), got, 1+i%40)
		}
	}
	before := slices.Clone(reqs[1].Blocks)
	_ = append(reqs[0].Blocks, 99, 99, 99)
	if diff := cmp.Diff(before, reqs[1].Blocks); diff != "" {
		t.Errorf("appending to request 0's ids changed request 1's (-want +got):\n%s", diff)
	}
}

// FuzzParseUsual: a line that the hand-written reader takes, encoding/json reads the same.
func FuzzParseUsual(f *testing.F) {
	f.Add([]byte(`{"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]}`))
	f.Add([]byte(`{"hash_ids":[9999999999999999999],"output_length":1,"input_length":1,"timestamp":1.5e3}`))
	f.Add([]byte(` { "timestamp" : 0.25 , "input_length" : 0 , "output_length" : 0 , "hash_ids" : [ ] } `))
	f.Add([]byte(`{"timestamp": 01, "input_length": 1, "output_length": 1, "hash_ids": []}`))
	f.Add([]byte(`{"timestamp": 1, "input_length": 1, "output_length": 1, "hash_ids": [], "timestamp": 2}`))
	f.Add([]byte(`{"Timestamp": 1, "input_length": 1e2, "output_length": 1, "hash_ids": [1.0]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var fast, slow mooncakeRecord
		if !fast.parseUsual(b) {
			return
		}
		if err := slow.parseJSON(b); err != nil {
			t.Fatalf("parseUsual took %q, encoding/json: %v", b, err)
		}
		if len(slow.ids) == 0 {
			slow.ids = nil
		}
		if len(fast.ids) == 0 {
			fast.ids = nil
		}
		if fast.timestamp != slow.timestamp || fast.input != slow.input || fast.output != slow.output || !slices.Equal(fast.ids, slow.ids) {
			t.Fatalf("%q: parseUsual %+v, encoding/json %+v", b, fast, slow)
		}
	})
}
