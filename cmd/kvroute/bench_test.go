package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"github.com/kvroute/kvroute/internal/experiment"
	"github.com/kvroute/kvroute/internal/report"
)

// fakeStream is an OpenAI-compatible server that streams two tokens and reports half the
// prompt as cached; every fifth request fails with 503. It names itself in X-Backend.
func fakeStream(t *testing.T) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		i := n.Add(1)
		w.Header().Set("X-Backend", fmt.Sprintf("b%d", i%2))
		if i%5 == 0 {
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n")
		fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\n\n")
		fmt.Fprint(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":100,\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":50}}}\n\n")
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	t.Cleanup(srv.Close)
	return srv, &n
}

// checkLeaks verifies, after every other cleanup of t, that t left no goroutine running.
func checkLeaks(t *testing.T) {
	t.Helper()
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
}

// jsonKeys returns the sorted keys of a JSON object.
func jsonKeys(t *testing.T, raw json.RawMessage) []string {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func TestBenchJSON(t *testing.T) {
	checkLeaks(t)
	srv, n := fakeStream(t)
	html := filepath.Join(t.TempDir(), "r.html")
	code, out, errOut := runVerb("bench", "--target", srv.URL, "--workload", "shared-prefix:groups=2,prompts=5",
		"--rate", "500", "--arrival", "constant", "--json", "--quiet", "--endpoint-header", "X-Backend", "--html", html)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if got := n.Load(); got != 10 {
		t.Errorf("server saw %d requests, want 10", got)
	}
	if strings.Contains(errOut, "requests,") {
		t.Errorf("--quiet printed progress: %q", errOut)
	}
	var doc struct {
		Scenario report.Scenario
		Results  []json.RawMessage
		Bench    []experiment.BenchExtra
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("bad JSON: %v\n%s", err, out)
	}
	if len(doc.Results) != 1 || len(doc.Bench) != 1 {
		t.Fatalf("got %d results and %d bench entries, want 1 and 1", len(doc.Results), len(doc.Bench))
	}
	// The results entry has exactly the shape of kvroute simulate --json.
	want, _ := json.Marshal(report.Result{})
	if diff := cmp.Diff(jsonKeys(t, want), jsonKeys(t, doc.Results[0])); diff != "" {
		t.Errorf("results entry keys (-simulate +bench):\n%s", diff)
	}
	var r report.Result
	if err := json.Unmarshal(doc.Results[0], &r); err != nil {
		t.Fatal(err)
	}
	if r.Completed != 8 || r.Failed != 2 || r.HitRate != 0.5 || r.Policy != "bench" {
		t.Errorf("completed %d failed %d hit rate %v policy %q: want 8, 2, 0.5, bench", r.Completed, r.Failed, r.HitRate, r.Policy)
	}
	if diff := cmp.Diff([]int{5, 5}, r.InstanceRequests); diff != "" {
		t.Errorf("per-endpoint requests (-want +got):\n%s", diff)
	}
	b := doc.Bench[0]
	if diff := cmp.Diff(map[string]int{"http_503": 2}, b.Errors); diff != "" {
		t.Errorf("errors (-want +got):\n%s", diff)
	}
	if b.AskedRate < 499 || b.AskedRate > 501 || b.AchievedRate <= 0 || !b.CachedTokensReported {
		t.Errorf("asked %v achieved %v cached reported %v", b.AskedRate, b.AchievedRate, b.CachedTokensReported)
	}
	if b.RequestedRate != 500 {
		t.Errorf("requested rate %v, want --rate's 500", b.RequestedRate)
	}
	if doc.Scenario.Requests != 10 || doc.Scenario.Instances != 2 {
		t.Errorf("scenario %+v: want 10 requests on 2 endpoints", doc.Scenario)
	}
	page, err := os.ReadFile(html)
	if err != nil {
		t.Fatal(err)
	}
	if c := strings.Count(string(page), "<svg"); c != 4 {
		t.Errorf("report has %d charts, want 4", c)
	}
	if !strings.Contains(string(page), "errors: http_503 2") {
		t.Error("report does not show the errors by class")
	}
}

func TestBenchTableAndProgressLines(t *testing.T) {
	checkLeaks(t)
	srv, _ := fakeStream(t)
	code, out, errOut := runVerb("bench", "--target", srv.URL, "--workload", "prefix-repetition:n=6", "--concurrency", "2")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{"policy", "bench", "0.500", "errors: http_503 1", "ITL ms"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	// stderr is not a terminal: plain lines, ending with the final count.
	if !strings.Contains(errOut, "bench: 6/6 requests, 1 errors") {
		t.Errorf("progress lines %q lack the final line", errOut)
	}
	// No answer named its backend (the target's header is X-Backend, not the default): the
	// imbalance is unknown, "-", not an even 1.00.
	if row := regexp.MustCompile(`(?m)^  bench .*$`).FindString(out); len(strings.Fields(row)) != 11 || strings.Fields(row)[8] != "-" {
		t.Errorf("row %q: want - in the imbalance column", row)
	}
	code, out, errOut = runVerb("bench", "--target", srv.URL, "--workload", "prefix-repetition:n=6", "--concurrency", "2", "--quiet", "--endpoint-header", "X-Backend")
	if row := regexp.MustCompile(`(?m)^  bench .*$`).FindString(out); code != 0 || len(strings.Fields(row)) != 11 || strings.Fields(row)[8] == "-" {
		t.Errorf("--endpoint-header X-Backend: exit %d (%s), row %q: want an imbalance", code, errOut, row)
	}
}

// A target that reports no cached tokens (ollama's usage has no prompt_tokens_details): the
// hit rate and the pooled LRU bound are unknown in the table, null in JSON, and the HTML says
// unknown instead of drawing a zero bar.
func TestBenchUnknownHitRate(t *testing.T) {
	checkLeaks(t)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n")
		fmt.Fprint(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":100,\"completion_tokens\":1}}\n\n")
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	t.Cleanup(srv.Close)
	args := []string{"--target", srv.URL, "--workload", "prefix-repetition:n=4", "--concurrency", "1", "--quiet"}
	code, out, errOut := runVerb("bench", args...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{"pooled LRU unknown", "hit rate unknown"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if !regexp.MustCompile(`(?m)^\s+bench\s+unknown\s+[0-9.]+\s`).MatchString(out) {
		t.Errorf("the table's row does not say unknown in the hit rate column:\n%s", out)
	}

	html := filepath.Join(t.TempDir(), "r.html")
	code, out, errOut = runVerb("bench", append(args, "--json", "--html", html)...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var doc struct {
		Bounds  map[string]json.RawMessage
		Results []map[string]json.RawMessage
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("bad JSON: %v\n%s", err, out)
	}
	if got := string(doc.Results[0]["hit_rate"]); got != "null" {
		t.Errorf("hit_rate = %s, want null", got)
	}
	if got := string(doc.Bounds["pooled_lru_hit_rate"]); got != "null" {
		t.Errorf("pooled_lru_hit_rate = %s, want null", got)
	}
	if got := string(doc.Bounds["infinite_cache_hit_rate"]); got == "null" || got == "" {
		t.Errorf("infinite_cache_hit_rate = %q: the workload's own bound is known", got)
	}
	page, err := os.ReadFile(html)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(page), "<td>unknown</td>") || !strings.Contains(string(page), `class="unknown"`) {
		t.Error("the HTML report does not say the hit rate is unknown")
	}
}

func TestBenchErrors(t *testing.T) {
	// One token more than a 16 MiB body holds at 4 bytes a token: refused before anything is
	// rendered, naming the line.
	huge := filepath.Join(t.TempDir(), "huge.jsonl")
	ids := strings.Repeat("7, ", (4<<20)/512) + "7"
	lines := `{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [7]}` + "\n" +
		`{"timestamp": 5, "input_length": 4194305, "output_length": 1, "hash_ids": [` + ids + `]}` + "\n"
	if err := os.WriteFile(huge, []byte(lines), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		args     []string
		code     int
		contains []string
	}{
		{"no target", nil, 2, []string{"--target"}},
		{"two pacings", []string{"--target", "http://127.0.0.1:1", "--rate", "1", "--concurrency", "2"}, 2, []string{"at most one"}},
		{"bad workload", []string{"--target", "http://127.0.0.1:1", "--workload", "nope"}, 2, []string{"--workload", "nope"}},
		{"bad arrival", []string{"--target", "http://127.0.0.1:1", "--arrival", "bursty"}, 2, []string{"--arrival"}},
		// What the load generator would refuse only once started is refused first, one line
		// naming the flag, no progress line before it.
		{"bad target", []string{"--target", "ftp://x", "--requests", "1"}, 2, []string{`--target "ftp://x": want an http(s) URL`}},
		{"target without scheme", []string{"--target", "127.0.0.1:8000", "--requests", "1"}, 2, []string{`--target "127.0.0.1:8000"`}},
		{"bad api", []string{"--target", "http://127.0.0.1:1", "--api", "responses"}, 2, []string{`--api "responses": want chat or completions`}},
		{"empty model", []string{"--target", "http://127.0.0.1:1", "--model", ""}, 2, []string{"--model: empty"}},
		{"all at once", []string{"--target", "x", "--api", "y", "--model", " "}, 2, []string{"--target", "--api", "--model"}},
		// Each number out of range is named by its flag.
		{"negative rate", []string{"--target", "http://127.0.0.1:1", "--rate", "-1"}, 2, []string{"--rate -1: want requests/s above 0"}},
		// 0 is the default (the workload's arrival times); given, it is a mistake.
		{"zero rate", []string{"--target", "http://127.0.0.1:1", "--rate", "0"}, 2, []string{"--rate 0: want requests/s above 0, such as 10 (leave it out to keep the workload's arrival times)"}},
		{"infinite rate", []string{"--target", "http://127.0.0.1:1", "--rate", "Inf"}, 2, []string{"--rate +Inf: want requests/s above 0"}},
		// A closed loop starts a worker per slot before it sends anything: 10^11 spun for minutes.
		{"too much concurrency", []string{"--target", "http://127.0.0.1:1", "--concurrency", "99999999999"}, 2, []string{"--concurrency 99999999999: want 0 (open loop) to 100000"}},
		{"too many in flight", []string{"--target", "http://127.0.0.1:1", "--max-in-flight", "99999999999"}, 2, []string{"--max-in-flight 99999999999: want 1 to 100000"}},
		{"no progress interval", []string{"--target", "http://127.0.0.1:1", "--progress-interval", "0s"}, 2, []string{"--progress-interval 0s: want a positive interval"}},
		{"negative speedup", []string{"--target", "http://127.0.0.1:1", "--speedup", "-2"}, 2, []string{"--speedup -2: want a positive finite factor"}},
		{"zero speedup", []string{"--target", "http://127.0.0.1:1", "--speedup", "0"}, 2, []string{"--speedup 0: want a positive finite factor"}},
		{"infinite speedup", []string{"--target", "http://127.0.0.1:1", "--speedup", "Inf"}, 2, []string{"--speedup +Inf: want a positive finite factor"}},
		{"NaN speedup", []string{"--target", "http://127.0.0.1:1", "--speedup", "NaN"}, 2, []string{"--speedup NaN: want a positive finite factor"}},
		{"negative concurrency", []string{"--target", "http://127.0.0.1:1", "--concurrency", "-2"}, 2, []string{"--concurrency -2: must not be negative"}},
		{"negative requests", []string{"--target", "http://127.0.0.1:1", "--requests", "-1"}, 2, []string{"--requests -1: must not be negative"}},
		{"negative duration", []string{"--target", "http://127.0.0.1:1", "--duration", "-1s"}, 2, []string{"--duration -1s: must not be negative"}},
		{"no in flight", []string{"--target", "http://127.0.0.1:1", "--max-in-flight", "0"}, 2, []string{"--max-in-flight 0: want 1 to 100000"}},
		{"zero timeout", []string{"--target", "http://127.0.0.1:1", "--timeout", "0s"}, 2, []string{"--timeout 0s: must be positive"}},
		{"missing trace", []string{"--target", "http://127.0.0.1:1", "--trace", "/nonexistent/t.jsonl"}, 2, []string{"--trace"}},
		{"huge prompt", []string{"--target", "http://127.0.0.1:1", "--trace", huge}, 1, []string{"request 1 (non-blank line 2): input_length 4194305 is more than the 4194304 tokens"}},
		{"stray argument", []string{"--target", "http://127.0.0.1:1", "extra"}, 2, []string{`"extra"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, _, errOut := runVerb("bench", tt.args...)
			if code != tt.code {
				t.Errorf("exit %d, want %d (%s)", code, tt.code, errOut)
			}
			if code == 2 && strings.Count(errOut, "\n") != 1 {
				t.Errorf("stderr %q, want one line", errOut)
			}
			for _, c := range tt.contains {
				if !strings.Contains(errOut, c) {
					t.Errorf("stderr %q lacks %q", errOut, c)
				}
			}
		})
	}
}

// An --html file that cannot be written fails the command before the first request, not after
// the run.
func TestBenchUnwritableHTMLFailsFirst(t *testing.T) {
	checkLeaks(t)
	srv, n := fakeStream(t)
	for _, path := range []string{filepath.Join(t.TempDir(), "no", "such", "report.html"), t.TempDir()} {
		code, out, errOut := runVerb("bench", "--target", srv.URL, "--workload", "prefix-repetition:n=3", "--concurrency", "1", "--quiet", "--html", path)
		if code != 2 || out != "" || !strings.HasPrefix(errOut, "kvroute bench: --html: ") || strings.Count(errOut, "\n") != 1 {
			t.Errorf("--html %s: exit %d, stdout %q, stderr %q; want 2, nothing and one line about --html", path, code, out, errOut)
		}
	}
	if got := n.Load(); got != 0 {
		t.Errorf("the target got %d requests, want none", got)
	}
}

// A target that refuses every request: the table and the JSON give, per error class, what the
// target said the first time, not only the count.
func TestBenchShowsFirstErrorMessage(t *testing.T) {
	checkLeaks(t)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprint(w, `{"error":{"message":"the model \"x\" does not exist (GET /v1/models lists them)","code":"model_not_found"}}`)
	}))
	t.Cleanup(srv.Close)
	args := []string{"--target", srv.URL, "--model", "x", "--workload", "prefix-repetition:n=3", "--concurrency", "1", "--quiet"}
	code, out, _ := runVerb("bench", args...)
	if want := `errors: http_404 3 (first: "the model \"x\" does not exist (GET /v1/models lists them)")`; code != 1 || !strings.Contains(out, want) {
		t.Errorf("exit %d, table lacks %s:\n%s", code, want, out)
	}
	code, out, _ = runVerb("bench", append(args, "--json")...)
	var doc struct{ Bench []experiment.BenchExtra }
	if err := json.Unmarshal([]byte(out), &doc); err != nil || len(doc.Bench) != 1 {
		t.Fatalf("exit %d, bad JSON (%v):\n%s", code, err, out)
	}
	want := map[string]string{"http_404": `the model "x" does not exist (GET /v1/models lists them)`}
	if diff := cmp.Diff(want, doc.Bench[0].FirstErrors); diff != "" {
		t.Errorf("first_errors (-want +got):\n%s", diff)
	}
}

func TestBenchConnectionErrorsAreCounted(t *testing.T) {
	checkLeaks(t)
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	code, out, errOut := runVerb("bench", "--target", url, "--workload", "prefix-repetition:n=3", "--concurrency", "1", "--quiet")
	// The report is written, and the run fails: nothing succeeded, with what to do about it.
	want := "kvroute bench: none of 3 requests succeeded: is a server listening at --target " + url + "? (start it, or fix the URL)\n"
	if code != 1 || errOut != want {
		t.Errorf("exit %d, stderr %q; want 1 and %q", code, errOut, want)
	}
	if !strings.Contains(out, "errors: connection 3") || !strings.Contains(out, "unknown") {
		t.Errorf("table does not count 3 connection errors, or gives a hit rate:\n%s", out)
	}
}

// TestBenchMooncakeSlice replays the first requests of the real trace, rendered into text:
// each prompt is about input_length x 4 bytes.
func TestBenchMooncakeSlice(t *testing.T) {
	const trace = "../../../shared/traces/mooncake/conversation_trace.jsonl"
	if _, err := os.Stat(trace); err != nil {
		t.Skip("Mooncake trace not available")
	}
	checkLeaks(t)
	var sizes []int
	var mu sync.Mutex
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			Messages []struct{ Content string }
		}
		_ = json.NewDecoder(r.Body).Decode(&body)
		mu.Lock()
		sizes = append(sizes, len(body.Messages[0].Content))
		mu.Unlock()
		fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: [DONE]\n\n")
	}))
	t.Cleanup(srv.Close)
	code, out, errOut := runVerb("bench", "--target", srv.URL, "--trace", trace, "--requests", "5", "--speedup", "100000", "--json", "--quiet")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var doc struct{ Results []report.Result }
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatal(err)
	}
	if doc.Results[0].Completed != 5 {
		t.Errorf("completed %d, want 5", doc.Results[0].Completed)
	}
	// The renderer writes 4 bytes per token: the first five lines' input_length x 4.
	want := readInputLengths(t, trace, 5)
	for i := range want {
		want[i] *= 4
	}
	slices.Sort(want)
	slices.Sort(sizes)
	if diff := cmp.Diff(want, sizes); diff != "" {
		t.Errorf("prompt sizes in bytes (-want +got):\n%s", diff)
	}
}

// readInputLengths returns the input_length of the first n lines of a Mooncake trace.
func readInputLengths(t *testing.T, path string, n int) []int {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for line := range strings.Lines(string(data)) {
		if len(out) == n {
			break
		}
		var l struct {
			InputLength int `json:"input_length"`
		}
		if err := json.Unmarshal([]byte(line), &l); err != nil {
			t.Fatal(err)
		}
		out = append(out, l.InputLength)
	}
	return out
}

// Ctrl-C during a run: bench prints the report of the requests that finished, leaves out the
// one cancelled in flight, says so on one line, and exits 130. Before, it printed only
// "loadgen: run cancelled: context canceled" and exited 1, the minutes measured lost.
func TestBenchInterruptReportsWhatFinished(t *testing.T) {
	checkLeaks(t)
	var cancel context.CancelFunc // the current run's: the handler presses Ctrl-C through it
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if n.Add(1) == 4 {
			// The fourth request is in flight when the user presses Ctrl-C.
			cancel()
			<-r.Context().Done()
			return
		}
		fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n")
		fmt.Fprint(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":100,\"completion_tokens\":1,\"prompt_tokens_details\":{\"cached_tokens\":50}}}\n\n")
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	t.Cleanup(srv.Close)
	for _, asJSON := range []bool{false, true} {
		n.Store(0)
		var ctx context.Context
		ctx, cancel = context.WithCancel(context.Background())
		args := []string{"--target", srv.URL, "--workload", "prefix-repetition:n=6", "--concurrency", "1", "--quiet"}
		if asJSON {
			args = append(args, "--json")
		}
		var out, errOut strings.Builder
		code := benchMain(ctx, args, strings.NewReader(""), &out, &errOut)
		cancel()
		wantErr := "kvroute bench: interrupted after sending 4 of 6 requests: the report covers the 3 that finished (1 cancelled in flight)\n"
		if code != 130 || errOut.String() != wantErr {
			t.Errorf("json %v: exit %d, stderr %q; want 130 and %q", asJSON, code, errOut.String(), wantErr)
		}
		if !asJSON {
			if !regexp.MustCompile(`(?m)^\s+bench\s+0\.500\s.*\s3\s+0\s*$`).MatchString(out.String()) {
				t.Errorf("table does not show 3 completed, 0 failed:\n%s", out.String())
			}
			continue
		}
		var doc struct {
			Results []report.Result
			Stopped *experiment.BenchStopped
		}
		if err := json.Unmarshal([]byte(out.String()), &doc); err != nil {
			t.Fatalf("bad JSON: %v\n%s", err, out.String())
		}
		want := &experiment.BenchStopped{Interrupted: true, Planned: 6, Sent: 4, Canceled: 1}
		if diff := cmp.Diff(want, doc.Stopped); diff != "" {
			t.Errorf("stopped (-want +got):\n%s", diff)
		}
		if len(doc.Results) != 1 || doc.Results[0].Completed != 3 || doc.Results[0].Failed != 0 {
			t.Errorf("results %+v: want 3 completed, none failed", doc.Results)
		}
	}
}

// Interrupted before any request finished: one line, exit 130, no table of zeros.
func TestBenchInterruptBeforeAnyFinished(t *testing.T) {
	checkLeaks(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		cancel()
		<-r.Context().Done()
	}))
	t.Cleanup(srv.Close)
	var out, errOut strings.Builder
	code := benchMain(ctx, []string{"--target", srv.URL, "--workload", "prefix-repetition:n=3", "--concurrency", "1", "--quiet"}, strings.NewReader(""), &out, &errOut)
	if want := "kvroute bench: interrupted before any request finished (1 sent, cancelled in flight)\n"; code != 130 || out.String() != "" || errOut.String() != want {
		t.Errorf("exit %d, stdout %q, stderr %q; want 130, nothing and %q", code, out.String(), errOut.String(), want)
	}
}

// A target that refuses every request alike (nothing listening, a wrong key, no such model)
// stops the run after its first requests, with what to do; before, a default run (1,024
// requests at 10/s) failed for 100 s and ended with "none of 1024 requests succeeded". A
// target shedding load (429) is measured to the end.
func TestBenchStopsWhenEveryRequestIsRefused(t *testing.T) {
	checkLeaks(t)
	const n = 200
	type tc struct {
		name, target string
		seen         *atomic.Int64 // requests the target got; nil: none can
		stderr       string        // a regular expression
	}
	closed := httptest.NewServer(http.NotFoundHandler())
	closed.Close()
	tests := []tc{{name: "nothing listening", target: closed.URL,
		stderr: `^kvroute bench: stopped early, [0-9]+ of 200 requests sent: the first 10 all failed \(connection\): is a server listening at --target http://127\.0\.0\.1:[0-9]+\? \(start it, or fix the URL\)\n$`}}
	for status, want := range map[int]string{
		401: `stopped early, [0-9]+ of 200 requests sent: the first 10 all failed \(http_401\): the target refused the API key: give the right one with --api-key or \$OPENAI_API_KEY`,
		404: `stopped early, [0-9]+ of 200 requests sent: the first 10 all failed \(http_404\): the target has no such model or path: check --model "m" \(GET /v1/models lists the models\) and --target's path`,
		429: `none of 200 requests succeeded: the target refused them for load or quota: lower --rate or --concurrency, or raise the target's limits`,
	} {
		var seen atomic.Int64
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			seen.Add(1)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			fmt.Fprintf(w, `{"error":{"message":"no (%d)"}}`, status)
		}))
		t.Cleanup(srv.Close)
		tests = append(tests, tc{fmt.Sprint(status), srv.URL, &seen, "^kvroute bench: " + want + "\n$"})
	}
	// Exactly 10 requests, the 10th the one that tells: a run that ended, not one stopped.
	code, _, errOut := runVerb("bench", "--target", closed.URL, "--workload", "prefix-repetition:n=10", "--concurrency", "1", "--quiet")
	if want := "kvroute bench: none of 10 requests succeeded: is a server listening at --target " + closed.URL + "? (start it, or fix the URL)\n"; code != 1 || errOut != want {
		t.Errorf("10 requests: exit %d, stderr %q; want 1 and %q", code, errOut, want)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out, errOut := runVerb("bench", "--target", tt.target, "--model", "m", "--workload", fmt.Sprintf("prefix-repetition:n=%d", n), "--concurrency", "2", "--quiet")
			if code != 1 || !regexp.MustCompile(tt.stderr).MatchString(errOut) {
				t.Errorf("exit %d, stderr %q; want 1 and to match %s", code, errOut, tt.stderr)
			}
			// Nothing completed: nothing was timed, and the table says so rather than 0.00.
			if !strings.Contains(out, "ITL ms - (no request completed)") || !regexp.MustCompile(`(?m)^\s+bench\s+unknown\s+-\s+-\s+-\s+-\s+-\s+0\s+-\s+0\s+[0-9]+\s*$`).MatchString(out) {
				t.Errorf("table does not say that nothing was timed:\n%s", out)
			}
			if tt.seen == nil {
				return
			}
			// Refused: the run stopped after the first 10 (and those sent while their records
			// were counted); shed (429): it ran to its end.
			if got := tt.seen.Load(); tt.name == "429" && got != n || tt.name != "429" && (got < 10 || got >= n) {
				t.Errorf("the target got %d of %d requests", got, n)
			}
		})
	}
}

// The header says what set the arrivals: a speed-up only where one applied. Before, a run
// paced by --rate or --concurrency said "speed-up 1", which nothing had applied.
func TestBenchHeaderSaysPacing(t *testing.T) {
	checkLeaks(t)
	srv, _ := fakeStream(t)
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--speedup", "4"}, ", speed-up 4, seed 1"},
		{nil, ", speed-up 1, seed 1"},
		{[]string{"--rate", "500"}, ", rate 500 req/s, Poisson arrivals, seed 1"},
		{[]string{"--rate", "500", "--arrival", "constant"}, ", rate 500 req/s, evenly spaced, seed 1"},
		{[]string{"--concurrency", "2"}, ", closed loop, 2 in flight, seed 1"},
	}
	for _, tt := range tests {
		args := append([]string{"--target", srv.URL, "--workload", "prefix-repetition:n=4,rate=200", "--quiet"}, tt.args...)
		code, out, errOut := runVerb("bench", args...)
		header, _, _ := strings.Cut(out, "\n")
		if code != 0 || !strings.HasPrefix(header, "workload prefix-repetition:n=4,rate=200: 4 requests, 1 x "+srv.URL+tt.want) {
			t.Errorf("%v: exit %d (%s), header %q; want it to end with %q", tt.args, code, errOut, header, tt.want)
		}
	}
	code, out, errOut := runVerb("bench", "--target", srv.URL, "--workload", "prefix-repetition:n=4", "--quiet", "--json", "--concurrency", "3")
	var doc struct {
		Scenario report.Scenario `json:"scenario"`
	}
	if err := json.Unmarshal([]byte(out), &doc); code != 0 || err != nil || doc.Scenario.Pacing != "closed loop, 3 in flight" {
		t.Errorf("--json: exit %d (%s), pacing %q (%v); want closed loop, 3 in flight", code, errOut, doc.Scenario.Pacing, err)
	}
}
