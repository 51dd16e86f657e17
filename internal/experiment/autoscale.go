package experiment

import (
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kvroute/kvroute/internal/autoscale"
	"github.com/kvroute/kvroute/internal/des"
	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/report"
	"github.com/kvroute/kvroute/internal/workload"
)

// ScaleSpec is kvroute simulate's --autoscale: an autoscaler that reads the load the router
// exports (kvroute_model_load) and sizes the fleet as KEDA and a
// HorizontalPodAutoscaler would, or, with no target, only watches it beside the TTFT.
type ScaleSpec struct {
	// Start is how many instances there are at the start; --instances is the most.
	Start int
	// Target is the ScaledObject's threshold: load per engine (0: watch only).
	Target float64
	// Interval is KEDA's pollingInterval; Delay the time an engine takes to join once asked
	// for; Window the signal's averaging time (autoscale.window).
	Interval, Delay, Window time.Duration
	// Rate, when above 0, is a fixed engine prefill rate (autoscale.prefill_rate), tokens/s;
	// 0: the policy's calibrated rate.
	Rate float64
	// Every is the time between two rows of the timeline (0: Interval).
	Every time.Duration
}

// scaleKeys documents --autoscale's keys, for errors and help.
const scaleKeys = "start=N (instances at the start; default --instances), target=X (threshold on kvroute_model_load per engine; 0, the default: watch only), " +
	"interval=30s (KEDA polling), delay=2m (from asking to serving), window=1m (signal averaging), rate=0 (engine prefill tokens/s; 0: the policy's calibrated rate), every=D (a row every D; default interval)"

// ParseScale reads an --autoscale value, "key=value,..." (scaleKeys), for a fleet of at most
// instances.
func ParseScale(spec string, instances int) (ScaleSpec, error) {
	s := ScaleSpec{Start: instances, Interval: 30 * time.Second, Delay: 2 * time.Minute, Window: autoscale.DefaultWindow}
	var errs []error
	for kv := range strings.SplitSeq(spec, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok {
			errs = append(errs, fmt.Errorf("--autoscale %q: %q is not key=value; keys: %s", spec, kv, scaleKeys))
			continue
		}
		var err error
		switch k {
		case "start":
			s.Start, err = strconv.Atoi(v)
			if err == nil && (s.Start < 1 || s.Start > instances) {
				err = fmt.Errorf("want 1..%d (--instances is the most)", instances)
			}
		case "target":
			s.Target, err = strconv.ParseFloat(v, 64)
			if err == nil && (s.Target < 0 || math.IsInf(s.Target, 0) || math.IsNaN(s.Target)) {
				err = errors.New("want a load per engine such as 0.7, or 0 to watch only")
			}
		case "rate":
			s.Rate, err = strconv.ParseFloat(v, 64)
			if err == nil && (s.Rate < 0 || math.IsInf(s.Rate, 0) || math.IsNaN(s.Rate)) {
				err = errors.New("want prefill tokens per second of one engine, or 0 for the policy's calibrated rate")
			}
		case "interval", "delay", "window", "every":
			var d time.Duration
			d, err = time.ParseDuration(v)
			switch {
			case err != nil:
			case d < 0 || (d == 0 && k != "delay" && k != "every"):
				err = errors.New("want a positive duration such as 30s")
			case k == "interval":
				s.Interval = d
			case k == "delay":
				s.Delay = d
			case k == "window":
				s.Window = d
			default:
				s.Every = d
			}
		default:
			err = fmt.Errorf("unknown key; keys: %s", scaleKeys)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("--autoscale %s: %w", kv, err))
		}
	}
	if s.Every == 0 {
		s.Every = s.Interval
	}
	if s.Every%s.Interval != 0 {
		errs = append(errs, fmt.Errorf("--autoscale every=%v: want a multiple of interval=%v", s.Every, s.Interval))
	}
	return s, errors.Join(errs...)
}

// ParseRamp reads a --ramp value, "FROM-TO": the arrival rate goes from FROM to TO times the
// workload's mean over the run (workload.Ramp).
func ParseRamp(spec string) (from, to float64, err error) {
	a, b, ok := strings.Cut(spec, "-")
	from, err1 := strconv.ParseFloat(strings.TrimSpace(a), 64)
	to, err2 := strconv.ParseFloat(strings.TrimSpace(b), 64)
	if !ok || err1 != nil || err2 != nil || !(from > 0) || !(to > 0) || math.IsInf(from+to, 0) {
		return 0, 0, fmt.Errorf("--ramp %q: want FROM-TO, two rates relative to the mean above 0, such as 0.4-1.6", spec)
	}
	return from, to, nil
}

// look is what the autoscaler saw and did at one of its looks.
type look struct {
	At      time.Duration `json:"at_s"`
	Engines int           `json:"engines"`
	Asked   int           `json:"asked"`
	autoscale.Figures
	Wanted int `json:"wanted"`
}

// scaler is the autoscaler of one run: the router's saturation signal through an HPA's rule.
type scaler struct {
	spec  ScaleSpec
	sat   *autoscale.Saturation
	hpa   autoscale.HPA
	looks []look
}

func newScaler(s ScaleSpec, instances int) *scaler {
	return &scaler{spec: s, sat: autoscale.NewSaturation(s.Window), hpa: autoscale.HPA{Target: s.Target, Min: s.Start, Max: instances}}
}

// config is the des.Autoscale of the run.
func (c *scaler) config() *des.Autoscale {
	return &des.Autoscale{Start: c.spec.Start, Interval: c.spec.Interval, Delay: c.spec.Delay, Want: c.want}
}

func (c *scaler) want(v des.View) int {
	c.sat.Sample(des.Epoch().Add(v.Now), v.Endpoints)
	figs := c.sat.Figures(v.Endpoints, func(e *endpoint.Endpoint) float64 { return autoscale.EngineRate(v.Picker, c.spec.Rate, e) })
	l := look{At: v.Now, Engines: len(v.Endpoints), Asked: v.Current, Wanted: v.Current}
	if len(figs) > 0 {
		l.Figures = figs[0] // one model
	}
	if c.spec.Target > 0 && l.Known() {
		l.Wanted = c.hpa.Desired(v.Current, l.Load)
	}
	c.looks = append(c.looks, l)
	return l.Wanted
}

// scaling is one policy's run under the autoscaler, for the report.
type scaling struct {
	Policy string `json:"policy"`
	Looks  []look `json:"looks"`
	// Added are the instances the autoscaler added.
	Added []des.Scaled `json:"added"`
	// EngineShare is the engine time used (each engine from its joining to the last finish)
	// over what the largest fleet would have used.
	EngineShare float64 `json:"engine_share"`
	// MeanSaturation and MeanLoad average the looks after the first window.
	MeanSaturation float64 `json:"mean_saturation"`
	MeanLoad       float64 `json:"mean_load"`
	MeanPrefill    float64 `json:"mean_prefill"`
	MeanKVUsage    float64 `json:"mean_kv_usage"`
	rows           []scaleRow
}

// scaleRow is a row of the timeline: the last look of its period, and the requests that
// arrived in it.
type scaleRow struct {
	look
	requests, failed int
	p50, p90         float64 // TTFT, ms
}

func (c *scaler) result(label string, res *des.Result, instances int) scaling {
	out := scaling{Policy: label, Looks: c.looks, Added: res.Scaled}
	var end time.Duration
	for i := range res.Records {
		end = max(end, res.Records[i].Finish)
	}
	if end > 0 {
		used := float64(c.spec.Start) * end.Seconds()
		for _, s := range res.Scaled {
			used += max(end-s.Joined, 0).Seconds()
		}
		out.EngineShare = used / (float64(instances) * end.Seconds())
	}
	n := 0
	for _, l := range c.looks {
		if l.At >= c.spec.Window && l.Known() {
			out.MeanSaturation += l.Saturation
			out.MeanLoad += l.Load
			out.MeanKVUsage += l.KVUsage
			out.MeanPrefill += l.Prefill
			n++
		}
	}
	if n > 0 {
		out.MeanSaturation /= float64(n)
		out.MeanLoad /= float64(n)
		out.MeanKVUsage /= float64(n)
		out.MeanPrefill /= float64(n)
	}
	// One row per period, with the TTFTs of the requests that arrived in it.
	recs := slices.Clone(res.Records)
	slices.SortFunc(recs, func(a, b report.Record) int { return int(a.Arrival - b.Arrival) })
	k := 0
	for i, l := range c.looks {
		if l.At%c.spec.Every != 0 && i+1 < len(c.looks) {
			continue // looks fall on multiples of the interval, and every is one of them
		}
		row := scaleRow{look: l}
		var ttft []float64
		for ; k < len(recs) && recs[k].Arrival <= l.At; k++ {
			row.requests++
			if !recs[k].OK() {
				row.failed++
				continue
			}
			ttft = append(ttft, float64(recs[k].TTFT())/float64(time.Millisecond))
		}
		slices.Sort(ttft)
		row.p50, row.p90 = report.Percentile(ttft, 50), report.Percentile(ttft, 90)
		out.rows = append(out.rows, row)
	}
	return out
}

// writeScaling writes the autoscaler's timeline of each policy.
func writeScaling(w io.Writer, s ScaleSpec, runs []scaling) error {
	what := "watching kvroute_model_load (no target: the fleet stays)"
	if s.Target > 0 {
		what = fmt.Sprintf("target %g per engine on kvroute_model_load (KEDA AverageValue, HPA tolerance %g)", s.Target, autoscale.DefaultTolerance)
	}
	rate := "each engine's prefill rate as the policy calibrated it"
	if s.Rate > 0 {
		rate = fmt.Sprintf("engine prefill rate fixed at %g tokens/s", s.Rate)
	}
	if _, err := fmt.Fprintf(w, "\nautoscale: %s; looks every %v, an engine asked for serves %v later; demand averaged over %v; %s\n",
		what, s.Interval, s.Delay, s.Window, rate); err != nil {
		return fmt.Errorf("write autoscale: %w", err)
	}
	for _, r := range runs {
		added := "none"
		if len(r.Added) > 0 {
			added = joinedText(r.Added)
		}
		fmt.Fprintf(w, "\n%s: mean saturation %.3f, load %.2f engines (prefill %.2f, KV usage %.3f), over the looks after the first window; engines added: %s; engine time %.0f %% of the largest fleet's\n",
			r.Policy, r.MeanSaturation, r.MeanLoad, r.MeanPrefill, r.MeanKVUsage, added, 100*r.EngineShare)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintf(tw, "time\tengines\tasked\tdemand tok/s\trate tok/s\tprefill\tKV usage\tload\tsaturation\twanted\trequests\tfailed\tTTFT p50 ms\tp90\t\n")
		for _, row := range r.rows {
			sat, load := "-", "-"
			if row.Known() {
				sat, load = strconv.FormatFloat(row.Saturation, 'f', 3, 64), strconv.FormatFloat(row.Load, 'f', 2, 64)
			}
			fmt.Fprintf(tw, "%s\t%d\t%d\t%.0f\t%.0f\t%.2f\t%.3f\t%s\t%s\t%d\t%d\t%d\t%s\t%s\t\n", clock(row.At), row.Engines, row.Asked,
				row.Demand, row.Rate, row.Prefill, row.KVUsage, load, sat, row.Wanted, row.requests, row.failed, msOrDash(row.p50), msOrDash(row.p90))
		}
		if err := tw.Flush(); err != nil {
			return fmt.Errorf("write autoscale: %w", err)
		}
		if late := joinedAfter(r); len(late) > 0 {
			// The autoscaler looks until the first look after the last arrival (des.Autoscale):
			// an engine asked for at one of the last looks joins after the table's last row.
			fmt.Fprintf(w, "  %s, after the last row (%s): the timeline ends at the first look after the last arrival, so every request had arrived before %s\n",
				joinedText(late), clock(r.rows[len(r.rows)-1].At), pronoun(len(late)))
		}
	}
	return nil
}

// joinedText says which engines joined when, and when they were asked for: "engine 4 joined
// at 3:30 (asked for at 1:30), engines 5 and 6 joined at 6:00 (asked for at 4:00)". Engines
// are numbered from 0 (as --kill and --add number them), so that "4" is not read as a count.
func joinedText(added []des.Scaled) string {
	var parts []string
	for i := 0; i < len(added); {
		j := i + 1
		for j < len(added) && added[j].Asked == added[i].Asked && added[j].Joined == added[i].Joined {
			j++
		}
		parts = append(parts, fmt.Sprintf("%s joined at %s (asked for at %s)", engineList(added[i:j]), clock(added[i].Joined), clock(added[i].Asked)))
		i = j
	}
	return strings.Join(parts, ", ")
}

// engineList names the engines of added, which one look asked for together: "engine 4",
// "engines 4 and 5", "engines 4, 5 and 6".
func engineList(added []des.Scaled) string {
	if len(added) == 1 {
		return fmt.Sprintf("engine %d", added[0].Instance)
	}
	ids := make([]string, len(added))
	for i, a := range added {
		ids[i] = strconv.Itoa(a.Instance)
	}
	return "engines " + strings.Join(ids[:len(ids)-1], ", ") + " and " + ids[len(ids)-1]
}

// joinedAfter is the engines of r that joined after the time of its timeline's last row.
func joinedAfter(r scaling) []des.Scaled {
	if len(r.rows) == 0 {
		return nil
	}
	last := r.rows[len(r.rows)-1].At
	var late []des.Scaled
	for _, a := range r.Added {
		if a.Joined > last {
			late = append(late, a)
		}
	}
	return late
}

// pronoun is "it joined" or "they joined", for n engines.
func pronoun(n int) string {
	if n == 1 {
		return "it joined"
	}
	return "they joined"
}

// clock formats a virtual time as m:ss.
func clock(d time.Duration) string {
	s := int(d.Round(time.Second) / time.Second)
	return fmt.Sprintf("%d:%02d", s/60, s%60)
}

func msOrDash(ms float64) string {
	if ms == 0 || math.IsNaN(ms) {
		return "-"
	}
	return strconv.FormatFloat(ms, 'f', 0, 64)
}

// checkScale checks --autoscale and --ramp, returning their problems.
func (o *SimulateOptions) checkScale() []error {
	var errs []error
	if o.Autoscale != "" {
		if _, err := ParseScale(o.Autoscale, o.Instances); err != nil {
			errs = append(errs, err)
		}
	}
	if o.Ramp != "" {
		if _, _, err := ParseRamp(o.Ramp); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// ramp re-times reqs by --ramp (checked already).
func (o *SimulateOptions) ramp(reqs []workload.Request) []workload.Request {
	if o.Ramp == "" {
		return reqs
	}
	from, to, _ := ParseRamp(o.Ramp)
	return workload.Ramp(reqs, from, to)
}
