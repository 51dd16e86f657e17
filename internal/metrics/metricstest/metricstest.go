// Package metricstest reads what a Prometheus registry holds, for tests that compare series
// by value with go-cmp.
package metricstest

import (
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// Values gathers g's series whose family name starts with prefix as
// "name{label=value,...}" (labels sorted, values unquoted) -> value: counters, gauges and
// untyped values as they are, histograms as name_count and name_sum.
func Values(t testing.TB, g prometheus.Gatherer, prefix string) map[string]float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		name := mf.GetName()
		if !strings.HasPrefix(name, prefix) {
			continue
		}
		for _, m := range mf.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, l.GetName()+"="+l.GetValue())
			}
			sort.Strings(ls)
			labels := "{" + strings.Join(ls, ",") + "}"
			switch {
			case m.Counter != nil:
				out[name+labels] = m.GetCounter().GetValue()
			case m.Gauge != nil:
				out[name+labels] = m.GetGauge().GetValue()
			case m.Untyped != nil:
				out[name+labels] = m.GetUntyped().GetValue()
			case m.Histogram != nil:
				out[name+"_count"+labels] = float64(m.GetHistogram().GetSampleCount())
				out[name+"_sum"+labels] = m.GetHistogram().GetSampleSum()
			}
		}
	}
	return out
}
