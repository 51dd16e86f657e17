package scrape

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kvroute/kvroute/internal/endpoint"
)

// names maps one engine's metric names to the Snapshot's fields. Each list is tried in order
// (newer names first); counters are listed under both their _total and bare family names
// because exporters disagree on which one the TYPE line carries.
type names struct {
	running, waiting, kvUsage []string
	queries, hits             []string
	// prompted and generated are counters of the tokens the engine computed (Work).
	prompted, generated []string
	// steps is a counter of the engine's compute steps (Work; it makes the snapshot Stepwise
	// when present), tokensStepwise that the token counters grow at every step themselves.
	steps          []string
	tokensStepwise bool
	// cacheInfo is an info gauge whose labels carry the block size and block count.
	cacheInfo                   string
	blockSizeLabel, blocksLabel string
	// capacityTokens is a gauge of the KV capacity in tokens (used when cacheInfo is absent).
	capacityTokens string
	// ttft is a histogram of the engine's times to first token, read for its sum and count.
	ttft []string
}

// namesFor returns the metric names of an engine kind.
func namesFor(engine string) (names, bool) {
	n, ok := map[string]names{
		"vllm": {
			running: []string{"vllm:num_requests_running"},
			waiting: []string{"vllm:num_requests_waiting"},
			kvUsage: []string{"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"},
			queries: []string{"vllm:prefix_cache_queries_total", "vllm:prefix_cache_queries"},
			hits:    []string{"vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits"},

			prompted:       []string{"vllm:prompt_tokens_total", "vllm:prompt_tokens"},
			generated:      []string{"vllm:generation_tokens_total", "vllm:generation_tokens"},
			tokensStepwise: true, // counted per engine step (its iteration stats)

			cacheInfo: "vllm:cache_config_info", blockSizeLabel: "block_size", blocksLabel: "num_gpu_blocks",
			ttft: []string{"vllm:time_to_first_token_seconds"},
		},
		"sglang": {
			running: []string{"sglang:num_running_reqs"},
			waiting: []string{"sglang:num_queue_reqs"},
			kvUsage: []string{"sglang:token_usage"},
			queries: []string{"sglang:prompt_tokens_total", "sglang:prompt_tokens"},
			hits:    []string{"sglang:cached_tokens_total", "sglang:cached_tokens"},

			prompted:  []string{"sglang:prompt_tokens_total", "sglang:prompt_tokens"},
			generated: []string{"sglang:generation_tokens_total", "sglang:generation_tokens"},

			cacheInfo: "sglang:cache_config_info", blockSizeLabel: "page_size", blocksLabel: "num_pages",
			capacityTokens: "sglang:max_total_num_tokens",
			ttft:           []string{"sglang:time_to_first_token_seconds"},
		},
		"tgi": {
			running: []string{"tgi_batch_current_size"},
			waiting: []string{"tgi_queue_size"},
		},
		"llamacpp": {
			running: []string{"llamacpp:requests_processing"},
			waiting: []string{"llamacpp:requests_deferred"},
			kvUsage: []string{"llamacpp:kv_cache_usage_ratio"},

			prompted:  []string{"llamacpp:prompt_tokens_total", "llamacpp:prompt_tokens"},
			generated: []string{"llamacpp:tokens_predicted_total", "llamacpp:tokens_predicted"},
			// llama_decode calls, one per batch it computes (its token counters grow when a
			// prompt is done and when a request ends).
			steps: []string{"llamacpp:n_decode_total", "llamacpp:n_decode"},
		},
	}[engine]
	return n, ok
}

// wantedBy is, per engine, the families Parse reads (see readWanted).
var wantedBy = func() map[string]wanted {
	m := map[string]wanted{}
	for _, engine := range metricKinds() {
		n, _ := namesFor(engine)
		m[engine] = n.wanted()
	}
	return m
}()

// Supported reports whether Parse knows the engine's metric names.
func Supported(engine string) bool {
	_, ok := namesFor(engine)
	return ok
}

// Parse reads an engine's Prometheus text exposition into a Snapshot taken at at. Load and
// counter values are summed over label sets (data-parallel ranks, LoRA adapters); usage ratios
// are averaged. A metric the engine does not expose leaves its field 0. KV capacity comes from
// the cache_config_info labels (vLLM block_size x num_gpu_blocks, SGLang page_size x
// num_pages; summed over ranks). An engine without known names, or text that is not the
// Prometheus format, is an error, and so is a page the router will not read (errRefused): one
// with none of the engine's families (an empty page, another engine's), two samples of one
// label set, or more than the cut keeps (see readWanted).
func Parse(engine string, r io.Reader, at time.Time) (*endpoint.Snapshot, error) {
	n, ok := namesFor(engine)
	if !ok {
		return nil, fmt.Errorf("no metric names known for engine %q", engine)
	}
	page, err := readWanted(r, wantedBy[engine])
	if err != nil {
		return nil, fmt.Errorf("read %s metrics: %w", engine, err)
	}
	defer putPage(page)
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(page)
	if err != nil {
		return nil, fmt.Errorf("parse %s metrics: %w", engine, err)
	}
	if !page.declared && !anyFamily(fams, wantedBy[engine]) {
		// An empty page, or another engine's, would read as an idle engine.
		return nil, fmt.Errorf("%s metrics: %w: %w for %s (such as %s); is the endpoint's engine kind right?",
			engine, errRefused, errNoFamilies, engine, n.running[0])
	}
	if err := duplicates(fams, wantedBy[engine]); err != nil {
		return nil, fmt.Errorf("%s metrics: %w", engine, err)
	}
	return snapshotOf(n, fams, at), nil
}

// anyFamily reports whether fams has a family of w (one the cut kept without reading its
// name: a quoted one).
func anyFamily(fams map[string]*dto.MetricFamily, w wanted) bool {
	for name := range w {
		if fams[name] != nil {
			return true
		}
	}
	return false
}

// duplicates refuses a page where a wanted family has two samples of one label set.
//
// The router sums samples over label sets, so a repeated line (an exporter registered twice,
// pages of two processes concatenated) would count its value twice. Which of the copies is
// true cannot be known, so the page is refused, as a Prometheus server refuses such samples,
// rather than read with one of them picked: the error shows in /debug/endpoints and the last
// snapshot ages instead of a wrong one being taken. expfmt merges a histogram's samples of one
// label set already, so only the other types are checked.
func duplicates(fams map[string]*dto.MetricFamily, w wanted) error {
	for name := range w {
		f := fams[name]
		if f == nil || f.GetType() == dto.MetricType_HISTOGRAM || f.GetType() == dto.MetricType_GAUGE_HISTOGRAM {
			continue
		}
		ms := f.GetMetric()
		if len(ms) > 16 {
			// Many series (up to maxSeries): by key, not pair by pair.
			seen := make(map[string]bool, len(ms))
			for _, m := range ms {
				k := labelKey(m.GetLabel())
				if seen[k] {
					return fmt.Errorf("%w: duplicate sample of %s%s", errRefused, name, labelText(m.GetLabel()))
				}
				seen[k] = true
			}
			continue
		}
		for i := 1; i < len(ms); i++ {
			for j := range i {
				if sameLabels(ms[i].GetLabel(), ms[j].GetLabel()) {
					return fmt.Errorf("%w: duplicate sample of %s%s", errRefused, name, labelText(ms[i].GetLabel()))
				}
			}
		}
	}
	return nil
}

// sameLabels reports whether a and b are one label set, in whatever order (expfmt keeps a
// line's order, and a label appears once per line).
func sameLabels(a, b []*dto.LabelPair) bool {
	if len(a) != len(b) {
		return false
	}
	for _, la := range a {
		found := false
		for _, lb := range b {
			if la.GetName() == lb.GetName() {
				found = la.GetValue() == lb.GetValue()
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// labelKey is a label set's key, the same in whatever order its labels come.
func labelKey(ls []*dto.LabelPair) string {
	ls = slices.Clone(ls)
	slices.SortFunc(ls, func(a, b *dto.LabelPair) int { return strings.Compare(a.GetName(), b.GetName()) })
	var b strings.Builder
	for _, l := range ls {
		// A label's name and value are valid UTF-8 (expfmt checks them), and 0xff never is.
		b.WriteString(l.GetName())
		b.WriteByte(0xff)
		b.WriteString(l.GetValue())
		b.WriteByte(0xff)
	}
	return b.String()
}

// labelText writes a label set as the exposition does, for error messages.
func labelText(ls []*dto.LabelPair) string {
	if len(ls) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteByte('{')
	for i, l := range ls {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%s=%q", l.GetName(), shortName([]byte(l.GetValue())))
	}
	b.WriteByte('}')
	return b.String()
}

// snapshotOf reads an engine's snapshot from its parsed families.
func snapshotOf(n names, fams map[string]*dto.MetricFamily, at time.Time) *endpoint.Snapshot {
	s := &endpoint.Snapshot{At: at}
	if v, ok := sum(fams, n.running); ok {
		s.Running = clampInt(v)
	}
	if v, ok := sum(fams, n.waiting); ok {
		s.Waiting = clampInt(v)
	}
	if v, ok := mean(fams, n.kvUsage); ok {
		s.KVUsage = min(max(v, 0), 1)
	}
	if v, ok := sum(fams, n.queries); ok {
		s.PrefixQueries = v
	}
	if v, ok := sum(fams, n.hits); ok {
		s.PrefixHits = v
	}
	for _, list := range [][]string{n.prompted, n.generated} {
		if v, ok := sum(fams, list); ok {
			s.Work += v
			s.Stepwise = s.Stepwise || n.tokensStepwise
		}
	}
	if v, ok := sum(fams, n.steps); ok {
		s.Work += v
		s.Stepwise = true
	}
	if sum, count, ok := histogram(fams, n.ttft); ok {
		s.TTFTSum, s.TTFTCount = sum, count
	}
	if n.cacheInfo != "" {
		s.BlockSize, s.NumGPUBlocks = cacheInfo(fams[n.cacheInfo], n.blockSizeLabel, n.blocksLabel)
	}
	if s.NumGPUBlocks == 0 && n.capacityTokens != "" {
		if v, ok := sum(fams, []string{n.capacityTokens}); ok && v >= 1 {
			s.BlockSize, s.NumGPUBlocks = 1, clampInt(v)
		}
	}
	return s
}

// value is a sample's value, whatever its type (histograms and summaries have none here).
func value(m *dto.Metric) (float64, bool) {
	switch {
	case m.Gauge != nil:
		return m.Gauge.GetValue(), true
	case m.Counter != nil:
		return m.Counter.GetValue(), true
	case m.Untyped != nil:
		return m.Untyped.GetValue(), true
	}
	return 0, false
}

// sum adds the finite values of the first family of names that has any.
func sum(fams map[string]*dto.MetricFamily, names []string) (float64, bool) {
	for _, name := range names {
		f := fams[name]
		if f == nil {
			continue
		}
		total, found := 0.0, false
		for _, m := range f.GetMetric() {
			if v, ok := value(m); ok && finite(v) {
				total += v
				found = true
			}
		}
		if found {
			return total, true
		}
	}
	return 0, false
}

// histogram adds the sums and counts of the first family of names that has a finite one.
func histogram(fams map[string]*dto.MetricFamily, names []string) (sum, count float64, ok bool) {
	for _, name := range names {
		for _, m := range fams[name].GetMetric() {
			h := m.GetHistogram()
			if h == nil {
				continue
			}
			c := float64(h.GetSampleCount())
			if h.SampleCountFloat != nil {
				c = h.GetSampleCountFloat()
			}
			if v := h.GetSampleSum(); finite(v) && finite(c) && c >= 0 {
				sum += v
				count += c
				ok = true
			}
		}
		if ok {
			return sum, count, true
		}
	}
	return 0, 0, false
}

// mean averages the finite values of the first family of names that has any.
func mean(fams map[string]*dto.MetricFamily, names []string) (float64, bool) {
	for _, name := range names {
		f := fams[name]
		if f == nil {
			continue
		}
		total, n := 0.0, 0
		for _, m := range f.GetMetric() {
			if v, ok := value(m); ok && finite(v) {
				total += v
				n++
			}
		}
		if n > 0 {
			return total / float64(n), true
		}
	}
	return 0, false
}

// maxBlockSize bounds a block size taken from an engine's cache_config_info (engines use 16 to
// a few hundred tokens): with the blocks bounded to 2^40, the capacity cannot overflow.
const maxBlockSize = 1 << 20

// cacheInfo reads the block size and the total block count from an info gauge's labels (a
// block size above maxBlockSize is none).
func cacheInfo(f *dto.MetricFamily, sizeLabel, blocksLabel string) (blockSize, blocks int) {
	for _, m := range f.GetMetric() {
		var size, num int
		for _, l := range m.GetLabel() {
			v, err := strconv.Atoi(l.GetValue())
			if err != nil || v < 0 {
				continue
			}
			switch l.GetName() {
			case sizeLabel:
				size = v
			case blocksLabel:
				num = v
			}
		}
		if size > 0 && size <= maxBlockSize && num > 0 {
			if blockSize == 0 {
				blockSize = size
			}
			if size == blockSize && blocks <= (1<<40)-num {
				blocks += num
			}
		}
	}
	if blocks == 0 {
		return 0, 0
	}
	return blockSize, blocks
}

func finite(v float64) bool { return v == v && v < 1e300 && v > -1e300 }

// clampInt converts a metric value to an int, clamped to [0, 1<<40].
func clampInt(v float64) int {
	switch {
	case v <= 0:
		return 0
	case v >= 1<<40:
		return 1 << 40
	}
	return int(v + 0.5)
}
