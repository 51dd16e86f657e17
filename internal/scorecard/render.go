package scorecard

import (
	"encoding/json"
	"fmt"
	"html/template"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/kvroute/kvroute/internal/report"
)

// WriteJSON writes the scorecard as indented JSON.
func (sc *Scorecard) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(sc); err != nil {
		return fmt.Errorf("write scorecard json: %w", err)
	}
	return nil
}

// targetsLine states the subject's targets.
func (sc *Scorecard) targetsLine() string {
	return fmt.Sprintf("targets for %s: hit rate >= %.2f x the pooled-LRU bound, or within %.3f of the best where no policy reaches that; "+
		"TTFT mean and p99 <= %.2f x the best other policy's (%s's where nothing is shared); imbalance <= %.1f; no failed request",
		sc.Subject, HitTarget, HitSlack, TTFTTarget, baseline, ImbalanceTarget)
}

// WriteTable writes every cell as a table, one row per policy, with the subject's verdict
// under it, and then the verdicts of every cell and seed side by side.
func (sc *Scorecard) WriteTable(w io.Writer) error {
	ew := &errWriter{w: w}
	if sc.Quick {
		ew.printf("%s\n\n", sc.quickLine())
	}
	if sc.NonStreamed > 0 {
		ew.printf("(%g of every cell's requests not streamed: the router sees their end only)\n\n", sc.NonStreamed)
	}
	for i := range sc.Cells {
		c := &sc.Cells[i]
		if i == 0 || c.Scenario != sc.Cells[i-1].Scenario || c.Seed != sc.Cells[i-1].Seed {
			ew.printf("== %s: %s on %s\n", c.Scenario, c.Workload, c.Fleet)
		}
		if c.Skipped != "" {
			ew.printf("load %.1f, seed %d: skipped: %s\n\n", c.Load, c.Seed, c.Skipped)
			continue
		}
		ew.printf("load %.1f, seed %d: %s, speed-up %.3g (offered load %.2f), hit-rate bounds: infinite cache %.3f, pooled LRU %.3f\n",
			c.Load, c.Seed, requestsText(c), c.Speedup, c.OfferedLoad, c.Bounds.InfiniteCacheHitRate, c.Bounds.PooledLRUHitRate)
		writeCell(ew, c)
		if v := c.Verdict; v != nil {
			quick := ""
			if v.Quick {
				quick = " (quick run: indicative only)"
			}
			if v.Met {
				ew.printf("%s: met%s\n", sc.Subject, quick)
			} else {
				ew.printf("%s: MISSED%s: %s\n", sc.Subject, quick, strings.Join(v.Misses, "; "))
			}
		}
		ew.printf("\n")
	}
	sc.writeVerdicts(ew)
	ew.printf("%d cells x %d policies in %.0f s wall (simulations %.0f s in all)\n", len(sc.Cells), policies(sc), sc.WallSeconds, sc.RunSeconds)
	return ew.err
}

// quickLine says what a quick run left out, and what its verdicts are worth.
func (sc *Scorecard) quickLine() string {
	cut := ""
	if sc.MaxRequests > 0 {
		cut = fmt.Sprintf(", each cell cut to its first %d requests", sc.MaxRequests)
	}
	return fmt.Sprintf("QUICK RUN (--quick): seed %d only, one load%s: the verdicts are indicative only; "+
		"the full scorecard (without --quick: three loads, whole workloads, about 9-10 minutes a seed on 2 cores) decides",
		sc.Seeds[0], cut)
}

// requestsText is "750 requests", or "2000 of the workload's 12031 requests (the first)".
func requestsText(c *Cell) string {
	if c.WorkloadRequests > 0 {
		return fmt.Sprintf("%d of the workload's %d requests (the first)", c.Requests, c.WorkloadRequests)
	}
	return fmt.Sprintf("%d requests", c.Requests)
}

// policies is the number of policies per cell.
func policies(sc *Scorecard) int {
	for i := range sc.Cells {
		if n := len(sc.Cells[i].Scores); n > 0 {
			return n
		}
	}
	return 0
}

func writeCell(ew *errWriter, c *Cell) {
	width := len("policy")
	for i := range c.Scores {
		width = max(width, len(c.Scores[i].Policy))
	}
	tw := tabwriter.NewWriter(ew, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "  %-*s\thit rate\tof bound\tTTFT mean ms\tp50\tp99\tmean/best\tp50/best\tp99/best\timbalance\tfailed\t\n", width, "policy")
	for i := range c.Scores {
		s := &c.Scores[i]
		f := s.figures()
		fmt.Fprintf(tw, "  %-*s\t%.3f\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t\n", width, s.Policy, s.HitRate, ofBound(s.HitOfBound),
			f.Mean, f.P50, f.P99, f.MeanRatio, f.P50Ratio, f.P99Ratio, f.Imbalance, s.Failed)
	}
	if err := tw.Flush(); err != nil && ew.err == nil {
		ew.err = err
	}
}

// figures are a score's TTFT mean, p50 and p99 in milliseconds, their ratios to the best other
// policy's, and its imbalance, as the table and the page show them.
type figures struct{ Mean, P50, P99, MeanRatio, P50Ratio, P99Ratio, Imbalance string }

// figures formats s's timed figures. A policy that completed no request timed nothing, nor
// spread any work: each is "-", as in kvroute simulate's table, not a 0.00 that reads as
// instant. A ratio of 0 is none (no other policy completed a request): "-" too.
func (s *Score) figures() figures {
	if s.Completed == 0 {
		return figures{"-", "-", "-", "-", "-", "-", "-"}
	}
	return figures{
		Mean: report.Millis(s.TTFT.Mean), P50: report.Millis(s.TTFT.P50), P99: report.Millis(s.TTFT.P99),
		MeanRatio: ratioText(s.MeanRatio), P50Ratio: ratioText(s.P50Ratio), P99Ratio: ratioText(s.P99Ratio),
		Imbalance: strconv.FormatFloat(s.Imbalance, 'f', 2, 64),
	}
}

// ratioText is a ratio with two decimals, or "-" for 0 (no ratio).
func ratioText(x float64) string {
	if x == 0 {
		return "-"
	}
	return strconv.FormatFloat(x, 'f', 2, 64)
}

func ofBound(x float64) string {
	if x == 0 {
		return "-"
	}
	return strconv.FormatFloat(x, 'f', 3, 64)
}

// writeVerdicts writes one line per scenario and load with the subject's verdict per seed.
func (sc *Scorecard) writeVerdicts(ew *errWriter) {
	type row struct {
		scenario string
		load     float64
	}
	var rows []row
	verdicts := map[row]map[uint64]string{}
	met, judged := 0, 0
	for i := range sc.Cells {
		c := &sc.Cells[i]
		r := row{c.Scenario, c.Load}
		if verdicts[r] == nil {
			rows = append(rows, r)
			verdicts[r] = map[uint64]string{}
		}
		switch {
		case c.Skipped != "":
			verdicts[r][c.Seed] = "skipped"
		case c.Verdict == nil:
			verdicts[r][c.Seed] = "-"
		case c.Verdict.Met:
			verdicts[r][c.Seed] = "met"
			met++
			judged++
		default:
			verdicts[r][c.Seed] = "missed"
			judged++
		}
	}
	ew.printf("%s\n", sc.targetsLine())
	tw := tabwriter.NewWriter(ew, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "  scenario\tload")
	for _, s := range sc.Seeds {
		fmt.Fprintf(tw, "\tseed %d", s)
	}
	fmt.Fprintf(tw, "\t\n")
	for _, r := range rows {
		fmt.Fprintf(tw, "  %s\t%.1f", r.scenario, r.load)
		for _, s := range sc.Seeds {
			fmt.Fprintf(tw, "\t%s", verdicts[r][s])
		}
		fmt.Fprintf(tw, "\t\n")
	}
	if err := tw.Flush(); err != nil && ew.err == nil {
		ew.err = err
	}
	quick := ""
	if sc.Quick {
		quick = " of a quick run (indicative only: run without --quick to decide)"
	}
	ew.printf("%s met its targets in %d of %d cells%s\n", sc.Subject, met, judged, quick)
}

// errWriter keeps the first write error, so that a table can be written without checking
// every line.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(p []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	n, err := e.w.Write(p)
	e.err = err
	return n, err
}

func (e *errWriter) printf(format string, args ...any) { fmt.Fprintf(e, format, args...) }

// WriteHTML writes the scorecard as a self-contained page: the verdicts, then one table per
// cell with each figure coloured by how it compares.
func (sc *Scorecard) WriteHTML(w io.Writer) error {
	if err := htmlPage.Execute(w, sc); err != nil {
		return fmt.Errorf("write scorecard html: %w", err)
	}
	return nil
}

// shade colours a ratio to the best other policy: green at or below the target, amber up to
// 1.25, red beyond.
func shade(r float64) template.CSS {
	switch {
	case r == 0:
		return ""
	case r <= TTFTTarget:
		return "background:#dff0d8"
	case r <= 1.25:
		return "background:#fcf8e3"
	}
	return "background:#f2dede"
}

// shadeHit colours a hit rate over the bound.
func shadeHit(x float64) template.CSS {
	switch {
	case x == 0:
		return ""
	case x >= HitTarget:
		return "background:#dff0d8"
	case x >= 0.9:
		return "background:#fcf8e3"
	}
	return "background:#f2dede"
}

var htmlPage = template.Must(template.New("scorecard").Funcs(template.FuncMap{
	"figures":   func(s Score) figures { return s.figures() },
	"f3":        func(x float64) string { return strconv.FormatFloat(x, 'f', 3, 64) },
	"ofBound":   ofBound,
	"shade":     shade,
	"shadeHit":  shadeHit,
	"join":      strings.Join,
	"requests":  func(c Cell) string { return requestsText(&c) },
	"quickLine": (*Scorecard).quickLine,
}).Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>kvroute scorecard</title>
<link rel="icon" href="data:,">
<style>
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px; color: #222; max-width: 1360px; }
h1 { font-size: 22px; margin: 0 0 4px; }
h2 { font-size: 17px; margin: 24px 0 2px; }
p.meta { color: #555; margin: 2px 0; }
table { border-collapse: collapse; margin: 8px 0; font-variant-numeric: tabular-nums; }
th, td { padding: 3px 9px; border-bottom: 1px solid #ddd; text-align: right; }
th:first-child, td:first-child { text-align: left; }
.met { color: #2e7d32; font-weight: 600; }
.missed { color: #c62828; font-weight: 600; }
</style>
</head>
<body>
<h1>kvroute scorecard</h1>
<p class="meta">subject {{.Subject}}; seeds {{range $i, $s := .Seeds}}{{if $i}}, {{end}}{{$s}}{{end}}; {{len .Cells}} cells in {{printf "%.0f" .WallSeconds}} s</p>
{{if .Quick}}<p class="missed">{{quickLine .}}</p>{{end}}
{{range .Cells}}
<h2>{{.Scenario}}, load {{printf "%.1f" .Load}}, seed {{.Seed}}</h2>
<p class="meta">{{.Workload}} on {{.Fleet}}</p>
{{if .Skipped}}<p class="meta">skipped: {{.Skipped}}</p>{{else}}
<p class="meta">{{requests .}}, speed-up {{printf "%.3g" .Speedup}}, pooled-LRU bound {{f3 .Bounds.PooledLRUHitRate}}</p>
<table>
<thead><tr><th>policy</th><th>hit rate</th><th>of bound</th><th>TTFT mean ms</th><th>p50</th><th>p99</th><th>mean/best</th><th>p50/best</th><th>p99/best</th><th>imbalance</th><th>failed</th></tr></thead>
<tbody>
{{range .Scores}}{{$f := figures .}}<tr><td>{{.Policy}}</td><td>{{f3 .HitRate}}</td><td style="{{shadeHit .HitOfBound}}">{{ofBound .HitOfBound}}</td><td>{{$f.Mean}}</td><td>{{$f.P50}}</td><td>{{$f.P99}}</td><td style="{{shade .MeanRatio}}">{{$f.MeanRatio}}</td><td style="{{shade .P50Ratio}}">{{$f.P50Ratio}}</td><td style="{{shade .P99Ratio}}">{{$f.P99Ratio}}</td><td>{{$f.Imbalance}}</td><td>{{.Failed}}</td></tr>
{{end}}</tbody>
</table>
{{with .Verdict}}{{if .Met}}<p class="met">{{$.Subject}}: met{{if .Quick}} (quick run: indicative only){{end}}</p>{{else}}<p class="missed">{{$.Subject}}: missed{{if .Quick}} (quick run: indicative only){{end}}: {{join .Misses "; "}}</p>{{end}}{{end}}
{{end}}{{end}}
</body>
</html>
`))

// SaveHTML writes the HTML page to the file at path.
func (sc *Scorecard) SaveHTML(path string) (err error) {
	fh, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("--html: %w", err)
	}
	defer func() {
		if cerr := fh.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("--html: close %s: %w", path, cerr)
		}
	}()
	return sc.WriteHTML(fh)
}
