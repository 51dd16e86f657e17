package scrape

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kvroute/kvroute/internal/endpoint"
)

var update = flag.Bool("update", false, "rewrite the golden files")

var at = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// TestParse_Golden parses each engine's fixture and compares the snapshot with its golden file.
// The fixtures are written by hand from the metric names each engine documents.
func TestParse_Golden(t *testing.T) {
	for _, engine := range []string{"vllm", "sglang", "tgi", "llamacpp"} {
		t.Run(engine, func(t *testing.T) {
			in, err := os.ReadFile(filepath.Join("testdata", engine+".txt"))
			if err != nil {
				t.Fatal(err)
			}
			snap, err := Parse(engine, bytes.NewReader(in), at)
			if err != nil {
				t.Fatal(err)
			}
			got, err := json.MarshalIndent(snap, "", "  ")
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, '\n')
			golden := filepath.Join("testdata", engine+".golden.json")
			if *update {
				if err := os.WriteFile(golden, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test -update to create it)", err)
			}
			if diff := cmp.Diff(string(want), string(got)); diff != "" {
				t.Errorf("snapshot (-want +got):\n%s", diff)
			}
		})
	}
}

// TestParse_Values states the expected figures by hand, so the golden files cannot drift
// unnoticed.
func TestParse_Values(t *testing.T) {
	read := func(engine string) *endpoint.Snapshot {
		t.Helper()
		in, err := os.ReadFile(filepath.Join("testdata", engine+".txt"))
		if err != nil {
			t.Fatal(err)
		}
		s, err := Parse(engine, bytes.NewReader(in), at)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	tests := map[string]endpoint.Snapshot{
		// two data-parallel engines: load and counters summed, usage averaged, blocks summed
		"vllm": {At: at, Running: 21, Waiting: 3, KVUsage: 0.5, BlockSize: 16, NumGPUBlocks: 57672,
			PrefixQueries: 1572864, PrefixHits: 1048576, Work: 1.1e6, Stepwise: true, TTFTSum: 143.27, TTFTCount: 852},
		"sglang": {At: at, Running: 37, Waiting: 5, KVUsage: 0.28, BlockSize: 1, NumGPUBlocks: 161721,
			PrefixQueries: 8.128902e+06, PrefixHits: 5.2e+06, Work: 8.128902e+06 + 7.557572e+06, TTFTSum: 3.4, TTFTCount: 20},
		"tgi": {At: at, Running: 16, Waiting: 4},
		// tokens, and decode calls: stepwise (its token counters alone are not)
		"llamacpp": {At: at, Running: 2, Waiting: 1, KVUsage: 0.25, Work: 73512 + 10231 + 2741, Stepwise: true},
	}
	for engine, want := range tests {
		got := read(engine)
		if diff := cmp.Diff(want, *got, cmp.Comparer(func(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 })); diff != "" {
			t.Errorf("%s (-want +got):\n%s", engine, diff)
		}
	}
	// A llama.cpp without n_decode_total (older builds): its token counters grow only when a
	// prompt is done or a request ends, so its Work is not stepwise.
	in, err := os.ReadFile(filepath.Join("testdata", "llamacpp.txt"))
	if err != nil {
		t.Fatal(err)
	}
	var older bytes.Buffer
	for line := range strings.Lines(string(in)) {
		if !strings.Contains(line, "n_decode") {
			older.WriteString(line)
		}
	}
	if s, err := Parse("llamacpp", &older, at); err != nil || s.Stepwise || s.Work != 73512+10231 {
		t.Errorf("llama.cpp without n_decode_total: %+v, %v; want Work 83743, not stepwise", s, err)
	}
	ep := &endpoint.Endpoint{KVCapacityTokens: 1000}
	ep.SetSnapshot(read("vllm"))
	if got := ep.KVTokens(); got != 16*57672 {
		t.Errorf("KVTokens = %d, want the scraped capacity %d", got, 16*57672)
	}
}

func TestParse_Fallbacks(t *testing.T) {
	// An older vLLM (gpu_cache_usage_perc) and an SGLang without cache_config_info.
	s, err := Parse("vllm", strings.NewReader("vllm:gpu_cache_usage_perc{model_name=\"m\"} 0.75\n"), at)
	if err != nil || s.KVUsage != 0.75 {
		t.Errorf("old vLLM usage = %v, %v; want 0.75", s, err)
	}
	s, err = Parse("sglang", strings.NewReader("sglang:max_total_num_tokens{model_name=\"m\"} 4096\n"), at)
	if err != nil || s.BlockSize != 1 || s.NumGPUBlocks != 4096 {
		t.Errorf("sglang capacity = %+v, %v; want 1 x 4096", s, err)
	}
	s, err = Parse("vllm", strings.NewReader(`vllm:cache_config_info{block_size="x",num_gpu_blocks="10"} 1`+"\n"), at)
	if err != nil || s.BlockSize != 0 || s.NumGPUBlocks != 0 {
		t.Errorf("bad cache_config_info = %+v, %v; want no capacity", s, err)
	}
	// A block size no engine has (whose product with the blocks overflowed to 4 tokens) is
	// no capacity either.
	s, err = Parse("vllm", strings.NewReader(`vllm:cache_config_info{block_size="4611686018427387905",num_gpu_blocks="4"} 1`+"\n"), at)
	if err != nil || s.BlockSize != 0 || s.NumGPUBlocks != 0 {
		t.Errorf("absurd block size = %+v, %v; want no capacity", s, err)
	}
}

func TestParse_Errors(t *testing.T) {
	if _, err := Parse("ollama", strings.NewReader(""), at); err == nil || !strings.Contains(err.Error(), `engine "ollama"`) {
		t.Errorf("unknown engine: err = %v", err)
	}
	if _, err := Parse("vllm", strings.NewReader("vllm:num_requests_running{ 3\n"), at); err == nil || !strings.Contains(err.Error(), "parse vllm metrics") {
		t.Errorf("malformed text: err = %v", err)
	}
}

func FuzzParse(f *testing.F) {
	for _, engine := range []string{"vllm", "sglang", "tgi", "llamacpp"} {
		in, err := os.ReadFile(filepath.Join("testdata", engine+".txt"))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(engine, in)
	}
	f.Add("vllm", []byte("vllm:num_requests_running NaN\nvllm:kv_cache_usage_perc +Inf\n"))
	f.Fuzz(func(t *testing.T, engine string, data []byte) {
		s, err := Parse(engine, bytes.NewReader(data), at)
		if err != nil {
			return
		}
		if s.Running < 0 || s.Waiting < 0 || s.KVUsage < 0 || s.KVUsage > 1 || s.BlockSize < 0 || s.NumGPUBlocks < 0 {
			t.Fatalf("snapshot out of range: %+v", s)
		}
	})
}

// FuzzParseFiltered checks the cut of readWanted: wherever the whole page parses, the cut page
// parses too, and its snapshot is the same, unless the page is refused (errRefused).
func FuzzParseFiltered(f *testing.F) {
	for _, engine := range []string{"vllm", "sglang", "tgi", "llamacpp"} {
		in, err := os.ReadFile(filepath.Join("testdata", engine+".txt"))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(engine, in)
	}
	full, err := os.ReadFile(filepath.Join("testdata", "vllm-full.txt"))
	if err != nil {
		f.Fatal(err)
	}
	f.Add("vllm", full)
	f.Add("vllm", []byte("# TYPE vllm:prefix_cache_hits counter\nvllm:prefix_cache_hits_total 3\n# TYPE x histogram\nx_bucket{le=\"+Inf\"} 1\nx_count 1\nx_sum 2\n"))
	f.Add("sglang", []byte("  sglang:num_running_reqs{a=\"b\"} 2\n\n# a comment\n{\"sglang:num_queue_reqs\"} 4\n"))
	f.Fuzz(func(t *testing.T, engine string, data []byte) {
		n, ok := namesFor(engine)
		if !ok {
			return
		}
		tp := expfmt.NewTextParser(model.UTF8Validation)
		fams, err := tp.TextToMetricFamilies(bytes.NewReader(data))
		if err != nil {
			return
		}
		got, err := Parse(engine, bytes.NewReader(data), at)
		if errors.Is(err, errRefused) {
			return // a page the whole parses too, but that the router will not read
		}
		if err != nil {
			t.Fatalf("the whole page parses, the cut one does not: %v", err)
		}
		if diff := cmp.Diff(snapshotOf(n, fams, at), got); diff != "" {
			t.Fatalf("snapshot of the cut page differs (-whole +cut):\n%s", diff)
		}
	})
}

// TestReadWanted_Cut checks what the cut keeps of a full vLLM page: the families Parse reads,
// and nothing else (of the TTFT histogram, its sum and count).
func TestReadWanted_Cut(t *testing.T) {
	in, err := os.ReadFile(filepath.Join("testdata", "vllm-full.txt"))
	if err != nil {
		t.Fatal(err)
	}
	page, err := readWanted(bytes.NewReader(in), wantedBy["vllm"])
	if err != nil {
		t.Fatal(err)
	}
	defer putPage(page)
	tp := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := tp.TextToMetricFamilies(bytes.NewReader(page.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for name := range fams {
		got = append(got, name)
	}
	slices.Sort(got)
	want := []string{"vllm:cache_config_info", "vllm:generation_tokens_total", "vllm:kv_cache_usage_perc", "vllm:num_requests_running",
		"vllm:num_requests_waiting", "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total", "vllm:prompt_tokens_total",
		"vllm:time_to_first_token_seconds"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("families kept (-want +got):\n%s", diff)
	}
	if bytes.Contains(page.Bytes(), []byte("_bucket")) {
		t.Errorf("the cut page keeps histogram buckets:\n%s", page)
	}
	if page.Len() > len(in)/10 {
		t.Errorf("the cut page is %d of %d bytes; want under a tenth", page.Len(), len(in))
	}
}

// BenchmarkParse_vLLM parses the hand-written vLLM fixture (short) and a whole vLLM-shaped
// page (full: kvroute sim's, 22 KB, seven histograms of 20-odd buckets beside the six samples
// the router reads), as every scrape does.
func BenchmarkParse_vLLM(b *testing.B) {
	for _, page := range []struct{ name, file string }{{"short", "vllm.txt"}, {"full", "vllm-full.txt"}} {
		in, err := os.ReadFile(filepath.Join("testdata", page.file))
		if err != nil {
			b.Fatal(err)
		}
		b.Run(page.name, func(b *testing.B) {
			b.SetBytes(int64(len(in)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Parse("vllm", bytes.NewReader(in), at); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
