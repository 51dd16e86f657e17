package report

import (
	"fmt"
	"html"
	"html/template"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The HTML report draws its charts as inline SVG: it needs no script and no network, so the
// file opens offline, in any browser, without console errors. (go-echarts loads echarts.min.js
// from a CDN, which a self-contained report cannot do.)

// palette colours the runs, in order; it repeats after ten.
var palette = [...]string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"}

// Chart geometry, in SVG user units.
const (
	chartW, chartH         = 640, 320
	padL, padR, padT, padB = 64, 16, 16, 44
	plotW, plotH           = chartW - padL - padR, chartH - padT - padB
	overTimeBuckets        = 24
	cdfPoints              = 200
)

// HTMLOptions say what to put in the report beside the summary.
type HTMLOptions struct {
	// Title heads the page ("" means "kvroute report").
	Title string
	// Notes are extra lines shown under the scenario (for example how the times were scaled).
	Notes []string
	// Generated is shown as the report's time; zero hides it.
	Generated time.Time
}

// WriteHTML writes a self-contained HTML report of s: the summary table and four charts, TTFT
// CDF per run, TTFT over time (median per time bucket), request share per endpoint, and hit
// rate per run beside the workload's bounds. records[i] are the records of s.Results[i] (it may
// be shorter than s.Results, or nil: the record-based charts then show what they have).
func WriteHTML(w io.Writer, s *Summary, records [][]Record, opt HTMLOptions) error {
	if s == nil {
		return fmt.Errorf("write html report: nil summary")
	}
	title := opt.Title
	if title == "" {
		title = "kvroute report"
	}
	runs := make([]htmlRun, len(s.Results))
	for i := range s.Results {
		runs[i] = htmlRun{Result: &s.Results[i], Color: palette[i%len(palette)]}
		if i < len(records) {
			runs[i].Records = records[i]
		}
	}
	page := htmlPage{
		Title:    title,
		Scenario: scenarioLine(s),
		Notes:    opt.Notes,
		Runs:     runs,
		Charts: []htmlChart{
			{ID: "ttft-cdf", Title: "TTFT distribution (CDF)", SVG: template.HTML(ttftCDF(runs))},
			{ID: "ttft-time", Title: "TTFT over time (median per interval)", SVG: template.HTML(ttftOverTime(runs))},
			{ID: "endpoint-share", Title: "Request share per endpoint", SVG: template.HTML(endpointShare(runs))},
			{ID: "hit-rate", Title: "Prefix-cache hit rate", SVG: template.HTML(hitRate(runs, s.Bounds))},
		},
	}
	if !opt.Generated.IsZero() {
		page.Generated = opt.Generated.UTC().Format(time.RFC3339)
	}
	if err := pageTemplate.Execute(w, page); err != nil {
		return fmt.Errorf("write html report: %w", err)
	}
	return nil
}

type htmlRun struct {
	Result  *Result
	Records []Record
	Color   string
}

type htmlChart struct {
	ID, Title string
	SVG       template.HTML
}

type htmlPage struct {
	Title, Scenario, Generated string
	Notes                      []string
	Runs                       []htmlRun
	Charts                     []htmlChart
}

func scenarioLine(s *Summary) string {
	sc := s.Scenario
	line := fmt.Sprintf("workload %s: %d requests, %d instances", sc.Workload, sc.Requests, sc.Instances)
	if sc.Profile != "" {
		line += " of " + sc.Profile
	}
	if sc.Speedup > 0 || sc.Pacing != "" {
		line += ", " + pacing(&sc)
	}
	return line + fmt.Sprintf(", seed %d", sc.Seed)
}

// pageTemplate is the page. Its summary table reads as WriteTable's: a run that completed no
// request timed nothing, and its latencies and imbalance are "-", not a 0.00 that reads as
// instant.
var pageTemplate = template.Must(template.New("report").Funcs(template.FuncMap{
	"rate":      rate,
	"ms":        Millis,
	"imbalance": imbalance,
}).Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{.Title}}</title>
<link rel="icon" href="data:,">
<style>
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px; color: #222; max-width: 1360px; }
h1 { font-size: 22px; margin: 0 0 4px; }
p.meta { color: #555; margin: 2px 0; }
table { border-collapse: collapse; margin: 16px 0; font-variant-numeric: tabular-nums; }
th, td { padding: 4px 10px; border-bottom: 1px solid #ddd; text-align: right; }
th:first-child, td:first-child { text-align: left; }
.swatch { display: inline-block; width: 10px; height: 10px; margin-right: 6px; border-radius: 2px; }
.charts { display: grid; grid-template-columns: repeat(auto-fit, minmax(560px, 1fr)); gap: 16px; }
figure { margin: 0; border: 1px solid #e4e4e4; border-radius: 6px; padding: 8px; }
figcaption { font-weight: 600; margin-bottom: 4px; }
svg { width: 100%; height: auto; }
svg text { font-size: 11px; fill: #333; }
svg .grid { stroke: #eee; }
svg .axis { stroke: #999; }
</style>
</head>
<body>
<h1>{{.Title}}</h1>
<p class="meta">{{.Scenario}}</p>
{{range .Notes}}<p class="meta">{{.}}</p>
{{end}}{{if .Generated}}<p class="meta">generated {{.Generated}}</p>
{{end}}<table id="summary">
<thead><tr><th>policy</th><th>hit rate</th><th>TTFT p50 ms</th><th>p90</th><th>p99</th><th>TPOT p50 ms</th><th>tok/s</th><th>imbalance</th><th>completed</th><th>failed</th></tr></thead>
<tbody>
{{range .Runs}}<tr><td><span class="swatch" style="background:{{.Color}}"></span>{{.Result.Policy}}</td>{{with .Result}}<td>{{rate .HitRate .HitRateUnknown}}</td>{{if .Completed}}<td>{{ms .TTFT.P50}}</td><td>{{ms .TTFT.P90}}</td><td>{{ms .TTFT.P99}}</td><td>{{ms .TPOT.P50}}</td>{{else}}<td>-</td><td>-</td><td>-</td><td>-</td>{{end}}<td>{{printf "%.0f" .ThroughputTokensPerS}}</td><td>{{if .Completed}}{{imbalance .LoadImbalance}}{{else}}-{{end}}</td><td>{{.Completed}}</td><td>{{.Failed}}</td>{{end}}</tr>
{{end}}</tbody>
</table>
<div class="charts">
{{range .Charts}}<figure id="{{.ID}}"><figcaption>{{.Title}}</figcaption>
{{.SVG}}
</figure>
{{end}}</div>
</body>
</html>
`))

// svgOpen starts a chart of the standard size with an accessible label.
func svgOpen(b *strings.Builder, label string) {
	fmt.Fprintf(b, `<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 %d %d" role="img" aria-label="%s">`, chartW, chartH, html.EscapeString(label))
}

func noData(b *strings.Builder, label string) string {
	svgOpen(b, label)
	fmt.Fprintf(b, `<text x="%d" y="%d" text-anchor="middle">no data</text></svg>`, chartW/2, chartH/2)
	return b.String()
}

// axis draws the frame, horizontal grid lines at yTicks (fractions 0..1 of the plot height,
// labelled), x tick labels at xTicks (fractions, labelled) and the axis titles.
func axis(b *strings.Builder, xTicks, yTicks []tick, xTitle, yTitle string) {
	for _, t := range yTicks {
		y := padT + plotH*(1-t.at)
		fmt.Fprintf(b, `<line class="grid" x1="%d" y1="%.1f" x2="%d" y2="%.1f"/>`, padL, y, padL+plotW, y)
		fmt.Fprintf(b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`, padL-6, y+4, html.EscapeString(t.label))
	}
	for _, t := range xTicks {
		x := padL + plotW*t.at
		fmt.Fprintf(b, `<line class="grid" x1="%.1f" y1="%d" x2="%.1f" y2="%d"/>`, x, padT, x, padT+plotH)
		fmt.Fprintf(b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`, x, padT+plotH+16, html.EscapeString(t.label))
	}
	fmt.Fprintf(b, `<rect class="axis" x="%d" y="%d" width="%d" height="%d" fill="none"/>`, padL, padT, plotW, plotH)
	fmt.Fprintf(b, `<text x="%d" y="%d" text-anchor="middle">%s</text>`, padL+plotW/2, chartH-6, html.EscapeString(xTitle))
	fmt.Fprintf(b, `<text x="14" y="%d" text-anchor="middle" transform="rotate(-90 14 %d)">%s</text>`, padT+plotH/2, padT+plotH/2, html.EscapeString(yTitle))
}

type tick struct {
	at    float64 // 0..1 along the axis
	label string
}

// legend lists the runs in the top-left corner of the plot.
func legend(b *strings.Builder, runs []htmlRun) {
	for i, r := range runs {
		y := padT + 14 + 15*i
		fmt.Fprintf(b, `<rect x="%d" y="%d" width="10" height="10" fill="%s"/>`, padL+8, y-9, r.Color)
		fmt.Fprintf(b, `<text x="%d" y="%d">%s</text>`, padL+22, y, html.EscapeString(r.Result.Policy))
	}
}

// ttfts returns the sorted TTFTs in milliseconds of a run's completed requests.
func ttfts(recs []Record) []float64 {
	out := make([]float64, 0, len(recs))
	for i := range recs {
		if recs[i].OK() && recs[i].FirstToken > 0 {
			out = append(out, ms(recs[i].TTFT()))
		}
	}
	slices.Sort(out)
	return out
}

// logTicks returns decade ticks (1, 10, 100 ms...) between lo and hi on a log axis.
func logTicks(lo, hi float64) []tick {
	var out []tick
	for e := math.Floor(math.Log10(lo)); e <= math.Ceil(math.Log10(hi)); e++ {
		v := math.Pow(10, e)
		if v < lo || v > hi {
			continue
		}
		out = append(out, tick{at: (math.Log10(v) - math.Log10(lo)) / (math.Log10(hi) - math.Log10(lo)), label: Millis(v)})
	}
	return out
}

// linTicks returns about five round ticks from 0 to hi.
func linTicks(hi float64, format func(float64) string) []tick {
	if hi <= 0 {
		return []tick{{0, format(0)}}
	}
	step := math.Pow(10, math.Floor(math.Log10(hi/5)))
	for _, m := range []float64{1, 2, 5, 10} {
		if hi/(step*m) <= 6 {
			step *= m
			break
		}
	}
	var out []tick
	for v := 0.0; v <= hi*1.0001 && len(out) < 12; v += step {
		out = append(out, tick{at: v / hi, label: format(v)})
	}
	return out
}

func ttftCDF(runs []htmlRun) string {
	var b strings.Builder
	const label = "TTFT CDF per run"
	lo, hi := math.Inf(1), 0.0
	all := make([][]float64, len(runs))
	for i, r := range runs {
		all[i] = ttfts(r.Records)
		if n := len(all[i]); n > 0 {
			lo, hi = min(lo, all[i][0]), max(hi, all[i][n-1])
		}
	}
	if hi <= 0 {
		return noData(&b, label)
	}
	// A log axis: TTFTs of different policies often differ by orders of magnitude.
	lo = max(lo, 0.01)
	lo, hi = math.Pow(10, math.Floor(math.Log10(lo))), math.Pow(10, math.Ceil(math.Log10(hi)))
	if hi <= lo {
		hi = lo * 10
	}
	x := func(v float64) float64 {
		v = max(v, lo)
		return padL + plotW*(math.Log10(v)-math.Log10(lo))/(math.Log10(hi)-math.Log10(lo))
	}
	y := func(q float64) float64 { return padT + plotH*(1-q) }
	svgOpen(&b, label)
	axis(&b, logTicks(lo, hi), linTicks(1, func(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) }), "TTFT (ms, log scale)", "fraction of requests")
	for i, r := range runs {
		v := all[i]
		if len(v) == 0 {
			continue
		}
		fmt.Fprintf(&b, `<polyline class="series" data-run="%s" fill="none" stroke="%s" stroke-width="2" points="`, html.EscapeString(r.Result.Policy), r.Color)
		step := max(1, len(v)/cdfPoints)
		for j := 0; j < len(v); j += step {
			fmt.Fprintf(&b, "%.1f,%.1f ", x(v[j]), y(float64(j+1)/float64(len(v))))
		}
		fmt.Fprintf(&b, "%.1f,%.1f\"/>", x(v[len(v)-1]), y(1))
	}
	legend(&b, runs)
	b.WriteString("</svg>")
	return b.String()
}

func ttftOverTime(runs []htmlRun) string {
	var b strings.Builder
	const label = "median TTFT over time per run"
	var end time.Duration
	for _, r := range runs {
		for i := range r.Records {
			end = max(end, r.Records[i].Arrival)
		}
	}
	if end <= 0 {
		return noData(&b, label)
	}
	width := end/overTimeBuckets + 1
	series := make([][]float64, len(runs)) // median TTFT per bucket, NaN when empty
	ymax := 0.0
	for i, r := range runs {
		buckets := make([][]float64, overTimeBuckets+1)
		for j := range r.Records {
			rec := &r.Records[j]
			if !rec.OK() || rec.FirstToken <= 0 {
				continue
			}
			k := int(rec.Arrival / width)
			buckets[k] = append(buckets[k], ms(rec.TTFT()))
		}
		series[i] = make([]float64, len(buckets))
		for k, v := range buckets {
			if len(v) == 0 {
				series[i][k] = math.NaN()
				continue
			}
			slices.Sort(v)
			series[i][k] = Percentile(v, 50)
			ymax = max(ymax, series[i][k])
		}
	}
	if ymax <= 0 {
		return noData(&b, label)
	}
	top := ymax * 1.05
	yt := linTicks(top, Millis)
	endS := (width * time.Duration(overTimeBuckets+1)).Seconds()
	svgOpen(&b, label)
	axis(&b, linTicks(endS, func(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) + "s" }),
		yt, "arrival time (s)", "median TTFT (ms)")
	for i, r := range runs {
		fmt.Fprintf(&b, `<polyline class="series" data-run="%s" fill="none" stroke="%s" stroke-width="2" points="`, html.EscapeString(r.Result.Policy), r.Color)
		for k, v := range series[i] {
			if math.IsNaN(v) {
				continue
			}
			t := (time.Duration(k)*width + width/2).Seconds()
			fmt.Fprintf(&b, "%.1f,%.1f ", padL+plotW*t/endS, padT+plotH*(1-v/top))
		}
		b.WriteString(`"/>`)
	}
	legend(&b, runs)
	b.WriteString("</svg>")
	return b.String()
}

func endpointShare(runs []htmlRun) string {
	var b strings.Builder
	const label = "request share per endpoint, per run"
	n := 0
	for _, r := range runs {
		n = max(n, len(r.Result.InstanceRequests))
	}
	if n == 0 || len(runs) == 0 {
		return noData(&b, label)
	}
	svgOpen(&b, label)
	xt := make([]tick, n)
	for e := range n {
		xt[e] = tick{at: (float64(e) + 0.5) / float64(n), label: strconv.Itoa(e)}
	}
	// No vertical grid lines for categories: draw the frame and y grid, then the bars.
	axisNoXGrid(&b, xt, linTicks(1, func(v float64) string { return strconv.FormatFloat(v*100, 'f', 0, 64) + "%" }), "endpoint", "share of the run's requests")
	group := float64(plotW) / float64(n)
	bar := group * 0.8 / float64(len(runs))
	for i, r := range runs {
		total := 0
		for _, c := range r.Result.InstanceRequests {
			total += c
		}
		if total == 0 {
			continue
		}
		for e, c := range r.Result.InstanceRequests {
			share := float64(c) / float64(total)
			h := plotH * share
			x := padL + group*float64(e) + group*0.1 + bar*float64(i)
			fmt.Fprintf(&b, `<rect class="bar" data-run="%s" x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s, endpoint %d: %d requests (%.1f%%)</title></rect>`,
				html.EscapeString(r.Result.Policy), x, padT+plotH-h, max(bar-1, 1), h, r.Color, html.EscapeString(r.Result.Policy), e, c, share*100)
		}
	}
	legend(&b, runs)
	b.WriteString("</svg>")
	return b.String()
}

// axisNoXGrid is axis without vertical grid lines (category axes).
func axisNoXGrid(b *strings.Builder, xTicks, yTicks []tick, xTitle, yTitle string) {
	for _, t := range yTicks {
		y := padT + plotH*(1-t.at)
		fmt.Fprintf(b, `<line class="grid" x1="%d" y1="%.1f" x2="%d" y2="%.1f"/>`, padL, y, padL+plotW, y)
		fmt.Fprintf(b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`, padL-6, y+4, html.EscapeString(t.label))
	}
	for _, t := range xTicks {
		fmt.Fprintf(b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`, padL+plotW*t.at, padT+plotH+16, html.EscapeString(t.label))
	}
	fmt.Fprintf(b, `<rect class="axis" x="%d" y="%d" width="%d" height="%d" fill="none"/>`, padL, padT, plotW, plotH)
	fmt.Fprintf(b, `<text x="%d" y="%d" text-anchor="middle">%s</text>`, padL+plotW/2, chartH-6, html.EscapeString(xTitle))
	fmt.Fprintf(b, `<text x="14" y="%d" text-anchor="middle" transform="rotate(-90 14 %d)">%s</text>`, padT+plotH/2, padT+plotH/2, html.EscapeString(yTitle))
}

func hitRate(runs []htmlRun, bounds Bounds) string {
	var b strings.Builder
	const label = "prefix-cache hit rate per run"
	if len(runs) == 0 {
		return noData(&b, label)
	}
	svgOpen(&b, label)
	xt := make([]tick, len(runs))
	for i, r := range runs {
		xt[i] = tick{at: (float64(i) + 0.5) / float64(len(runs)), label: r.Result.Policy}
	}
	axisNoXGrid(&b, xt, linTicks(1, func(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) }), "policy", "hit rate (cached / prompt tokens)")
	group := float64(plotW) / float64(len(runs))
	for i, r := range runs {
		x := padL + group*float64(i) + group*0.2
		if r.Result.HitRateUnknown {
			// No bar: a zero-height bar would read as "no hits".
			fmt.Fprintf(&b, `<text class="unknown" data-run="%s" x="%.1f" y="%.1f" text-anchor="middle">unknown</text>`,
				html.EscapeString(r.Result.Policy), x+group*0.3, float64(padT+plotH-4))
			continue
		}
		h := plotH * min(max(r.Result.HitRate, 0), 1)
		fmt.Fprintf(&b, `<rect class="bar" data-run="%s" x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s: %.3f</title></rect>`,
			html.EscapeString(r.Result.Policy), x, padT+plotH-h, group*0.6, h, r.Color, html.EscapeString(r.Result.Policy), r.Result.HitRate)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%.3f</text>`, x+group*0.3, padT+plotH-h-4, r.Result.HitRate)
	}
	bds := []struct {
		v    float64
		name string
	}{{bounds.InfiniteCacheHitRate, "infinite cache"}, {bounds.PooledLRUHitRate, "pooled LRU"}}
	if bounds.PooledLRUUnknown {
		bds = bds[:1]
	} else if math.Abs(bds[0].v-bds[1].v) < 0.0005 {
		// Equal bounds (the whole working set fits): one line, one label.
		bds = bds[:1]
		bds[0].name = "infinite cache = pooled LRU"
	}
	for i, bd := range bds {
		if bd.v <= 0 {
			continue
		}
		y := padT + plotH*(1-min(bd.v, 1))
		fmt.Fprintf(&b, `<line class="bound" x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#444" stroke-dasharray="5,4"/>`, padL, y, padL+plotW, y)
		// The two labels sit at opposite ends so that close bounds do not overprint.
		if i == 0 {
			fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%s bound %.3f</text>`, padL+plotW-4, y-4, bd.name, bd.v)
		} else {
			fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="start">%s bound %.3f</text>`, padL+4, y+12, bd.name, bd.v)
		}
	}
	b.WriteString("</svg>")
	return b.String()
}
