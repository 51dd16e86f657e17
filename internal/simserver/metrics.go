package simserver

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// Histogram buckets exactly as vLLM defines them (REFERENCE.md section 3).
var (
	ttftBuckets    = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80, 160, 640, 2560}
	itlBuckets     = []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80}
	requestBuckets = []float64{0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960, 1920, 7680}
)

// engineLabel is vLLM's "engine" label: the engine core's index, "0" for a single engine.
const engineLabel = "0"

// metrics are one instance's vLLM metrics. Request histograms are observed by the driver in
// model time; gauges and counters of the engine are read from its last Stats snapshot at
// scrape time.
type metrics struct {
	ttft, itl, e2e, queue, prefill, decode, inference prometheus.Observer
	success                                           *prometheus.CounterVec
	// faults counts the requests each fault struck (not a vLLM metric: tests count with it,
	// for instance how many times a query of death was delivered).
	faults *prometheus.CounterVec
}

func newMetrics(reg *prometheus.Registry, in *Instance) *metrics {
	labels := prometheus.Labels{"model_name": in.opts.Model, "engine": engineLabel}
	hist := func(name, help string, buckets []float64) prometheus.Observer {
		h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets, ConstLabels: labels})
		reg.MustRegister(h)
		return h
	}
	m := &metrics{
		ttft:      hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", ttftBuckets),
		itl:       hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", itlBuckets),
		e2e:       hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", requestBuckets),
		queue:     hist("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", requestBuckets),
		prefill:   hist("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", requestBuckets),
		decode:    hist("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", requestBuckets),
		inference: hist("vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.", requestBuckets),
		success: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vllm:request_success_total", Help: "Count of successfully processed requests.", ConstLabels: labels,
		}, []string{"finished_reason"}),
	}
	m.faults = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvroute_sim_faults_total", Help: "Requests struck by an injected fault (kvroute sim only), by fault.",
	}, []string{"fault"})
	reg.MustRegister(m.success, m.faults)
	for _, r := range []string{"stop", "length", "abort"} {
		m.success.WithLabelValues(r) // present from the start, as vLLM does
	}
	for _, f := range faultNames {
		m.faults.WithLabelValues(f)
	}
	reg.MustRegister(&statsCollector{in: in, labels: labels})
	return m
}

func (m *metrics) finished(reason string) { m.success.WithLabelValues(reason).Inc() }

func (m *metrics) fault(name string) { m.faults.WithLabelValues(name).Inc() }

// requestDone records a finished request's latencies. Queue time is not reported by the engine
// model: it is estimated as the TTFT beyond the unloaded prefill time of the uncached prompt.
func (m *metrics) requestDone(j *job) {
	j.mu.Lock()
	ttft := j.firstAt - j.arrival
	e2e := j.doneAt - j.arrival
	decode := j.doneAt - j.firstAt
	predict := j.predict
	reason := j.finish
	j.mu.Unlock()
	queue := max(ttft-predict, 0)
	m.e2e.Observe(e2e.Seconds())
	m.queue.Observe(queue.Seconds())
	m.prefill.Observe((ttft - queue).Seconds())
	m.decode.Observe(decode.Seconds())
	m.inference.Observe((e2e - queue).Seconds())
	m.finished(reason)
}

type statsCollector struct {
	in     *Instance
	labels prometheus.Labels
}

func (c *statsCollector) desc(name, help string, extra ...string) *prometheus.Desc {
	return prometheus.NewDesc(name, help, extra, c.labels)
}

func (c *statsCollector) descs() []*prometheus.Desc {
	return []*prometheus.Desc{
		c.desc("vllm:num_requests_running", "Number of requests in model execution batches."),
		c.desc("vllm:num_requests_waiting", "Number of requests waiting to be processed."),
		c.desc("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."),
		c.desc("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens."),
		c.desc("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens."),
		c.desc("vllm:prompt_tokens_total", "Number of prefill tokens processed."),
		c.desc("vllm:generation_tokens_total", "Number of generation tokens processed."),
		c.desc("vllm:num_preemptions_total", "Cumulative number of preemption from the engine."),
		c.desc("vllm:cache_config_info", "Information of the LLMEngine CacheConfig.",
			"block_size", "num_gpu_blocks", "enable_prefix_caching", "cache_dtype", "gpu_memory_utilization"),
		c.desc("vllm:lora_requests_info", "Running stats on lora requests.",
			"max_lora", "running_lora_adapters", "waiting_lora_adapters"),
	}
}

// Describe implements prometheus.Collector.
func (c *statsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs() {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *statsCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.in.Stats()
	d := c.descs()
	usage := 0.0
	if st.TotalBlocks > 0 {
		usage = float64(st.UsedBlocks) / float64(st.TotalBlocks)
	}
	g, k := prometheus.GaugeValue, prometheus.CounterValue
	ch <- prometheus.MustNewConstMetric(d[0], g, float64(st.Running))
	ch <- prometheus.MustNewConstMetric(d[1], g, float64(st.Waiting))
	ch <- prometheus.MustNewConstMetric(d[2], g, usage)
	ch <- prometheus.MustNewConstMetric(d[3], k, float64(st.PrefixQueryTokens))
	ch <- prometheus.MustNewConstMetric(d[4], k, float64(st.PrefixHitTokens))
	ch <- prometheus.MustNewConstMetric(d[5], k, float64(st.PromptTokens))
	ch <- prometheus.MustNewConstMetric(d[6], k, float64(st.GenerationTokens))
	ch <- prometheus.MustNewConstMetric(d[7], k, float64(st.Preemptions))
	ch <- prometheus.MustNewConstMetric(d[8], g, 1,
		strconv.Itoa(c.in.cfg.BlockSize), strconv.Itoa(c.in.cfg.NumBlocks), "True", "auto", "0.9")
	ch <- prometheus.MustNewConstMetric(d[9], g, float64(c.in.created.Unix()), "0", "", "")
}
