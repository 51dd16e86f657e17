package scrape

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

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
			PrefixQueries: 1572864, PrefixHits: 1048576},
		"sglang": {At: at, Running: 37, Waiting: 5, KVUsage: 0.28, BlockSize: 1, NumGPUBlocks: 161721,
			PrefixQueries: 8.128902e+06, PrefixHits: 5.2e+06},
		"tgi":      {At: at, Running: 16, Waiting: 4},
		"llamacpp": {At: at, Running: 2, Waiting: 1, KVUsage: 0.25},
	}
	for engine, want := range tests {
		got := read(engine)
		if diff := cmp.Diff(want, *got, cmp.Comparer(func(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 })); diff != "" {
			t.Errorf("%s (-want +got):\n%s", engine, diff)
		}
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

func BenchmarkParse_vLLM(b *testing.B) {
	in, err := os.ReadFile(filepath.Join("testdata", "vllm.txt"))
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(in)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Parse("vllm", bytes.NewReader(in), at); err != nil {
			b.Fatal(err)
		}
	}
}
