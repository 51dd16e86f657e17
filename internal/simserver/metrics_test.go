package simserver

import (
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	fams, err := parseMetrics(resp.Body)
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return fams
}

func parseMetrics(r io.Reader) (map[string]*dto.MetricFamily, error) {
	p := expfmt.NewTextParser(model.LegacyValidation)
	return p.TextToMetricFamilies(r)
}

// describe renders the shape of the metric families: name, type, label names and, for
// histograms, the bucket bounds. Values are left out so that the golden file is deterministic.
func describe(fams map[string]*dto.MetricFamily) string {
	var lines []string
	for name, f := range fams {
		m := f.GetMetric()[0]
		var labels []string
		for _, l := range m.GetLabel() {
			labels = append(labels, l.GetName())
		}
		slices.Sort(labels)
		line := fmt.Sprintf("%s %s {%s}", name, strings.ToLower(f.GetType().String()), strings.Join(labels, ","))
		if h := m.GetHistogram(); h != nil {
			var bs []string
			for _, b := range h.GetBucket() {
				bs = append(bs, fmt.Sprint(b.GetUpperBound()))
			}
			line += " buckets=" + strings.Join(bs, ",")
		}
		lines = append(lines, line)
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n") + "\n"
}

func TestMetricsGolden(t *testing.T) {
	f := startFleet(t, Options{Profile: "instant"}, 1)
	url := f.URLs()[0]
	streamCall(t, url, "/v1/completions", fmt.Sprintf(`{"model":%q,"prompt":"hello","stream":true,"max_tokens":3}`, DefaultModel))
	// The driver counts a request's end after the handler may have seen it (and written
	// [DONE]): under load the scrape came first (request_success_total 0, want 1).
	waitFinished(t, f.Instances()[0], 1)
	fams := scrape(t, url)
	got := describe(fams)
	golden := filepath.Join("testdata", "metrics.golden")
	if *update {
		if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run go test -run TestMetricsGolden -update to create it)", err)
	}
	if diff := cmp.Diff(string(want), got); diff != "" {
		t.Errorf("metrics shape (-golden +got):\n%s", diff)
	}
	// Every name REFERENCE.md section 3 lists, whatever the golden file says.
	for _, name := range []string{
		"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
		"vllm:cache_config_info", "vllm:lora_requests_info",
		"vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:prompt_tokens_total",
		"vllm:generation_tokens_total", "vllm:num_preemptions_total", "vllm:request_success_total",
		"vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds", "vllm:e2e_request_latency_seconds",
		"vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds",
		"vllm:request_decode_time_seconds", "vllm:request_inference_time_seconds",
	} {
		if fams[name] == nil {
			t.Errorf("/metrics lacks %s", name)
		}
	}
	info := map[string]string{}
	for _, l := range fams["vllm:cache_config_info"].GetMetric()[0].GetLabel() {
		info[l.GetName()] = l.GetValue()
	}
	if info["block_size"] != "16" || info["num_gpu_blocks"] != fmt.Sprint(1<<18) || info["model_name"] != DefaultModel || info["engine"] != "0" {
		t.Errorf("cache_config_info labels = %v", info)
	}
	var length float64
	for _, m := range fams["vllm:request_success_total"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "finished_reason" && l.GetValue() == "length" {
				length = m.GetCounter().GetValue()
			}
		}
	}
	if length != 1 {
		t.Errorf(`request_success_total{finished_reason="length"} = %v, want 1`, length)
	}
}
