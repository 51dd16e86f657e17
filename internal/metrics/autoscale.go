package metrics

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/internal/autoscale"
	"github.com/kvroute/kvroute/internal/endpoint"
)

var (
	descModelDemand = prometheus.NewDesc("kvroute_model_prefill_demand_tokens_per_second",
		"Prompt tokens the model's engines computed per second (prefix-cache queries less hits, scraped from the engines, so every router's and client's requests count), averaged over autoscale.window.",
		[]string{"model"}, nil)
	descModelLoad = prometheus.NewDesc("kvroute_model_load",
		"Engines' worth of work on the model's engines: the sum over them of the larger of their prefill utilisation (prompt tokens computed per second over their calibrated prefill rate) and their KV-cache usage, averaged over autoscale.window. Scale engines on it: replicas = load / target per engine (docs/kubernetes.md).",
		[]string{"model"}, nil)
	descModelSaturation = prometheus.NewDesc("kvroute_model_saturation",
		"kvroute_model_load over the model's endpoints available for new requests: the share of the fleet in use (0 to 1).",
		[]string{"model"}, nil)
	descCacheValue = prometheus.NewDesc("kvroute_endpoint_cache_value_tokens",
		"Prompt tokens of prefix the router's index says the endpoint alone holds, each weighted by how recently a request used it (1/e after 5 minutes): what removing it would cost to recompute. Scale-in removes the lowest first (pod-deletion-cost).",
		[]string{"endpoint"}, nil)
)

// Autoscale exports what an autoscaler reads: each model's load and saturation (KEDA or a
// HorizontalPodAutoscaler sizes the engines on kvroute_model_load), and each endpoint's cache
// value (cache-aware scale-in). Everything is computed at scrape time; each scrape also
// samples the engines' snapshots into the moving averages, so the figures need a scraper
// (every Prometheus scrape interval is fine: the averages weigh the time between samples).
type Autoscale struct {
	sat       *autoscale.Saturation
	endpoints atomic.Pointer[func() []*endpoint.Endpoint]
	rate      atomic.Pointer[func(*endpoint.Endpoint) float64]
	value     atomic.Pointer[func(*endpoint.Endpoint) (tokens float64, ok bool)]
	label     atomic.Pointer[func(model string) string]
	now       func() time.Time
}

// NewAutoscale builds the autoscaling collectors, averaging over window
// (autoscale.DefaultWindow when 0), and registers them with reg. Nothing is exported until
// Watch is called.
func NewAutoscale(reg prometheus.Registerer, window time.Duration) *Autoscale {
	a := &Autoscale{sat: autoscale.NewSaturation(window), now: time.Now}
	reg.MustRegister((*autoscaleCollector)(a))
	return a
}

// Watch sets where the figures come from: the endpoints (the pool's), and each endpoint's
// prefill rate in the engine's tokens per second (autoscale.EngineRate; 0 unknown).
func (a *Autoscale) Watch(endpoints func() []*endpoint.Endpoint, rate func(*endpoint.Endpoint) float64) {
	a.rate.Store(&rate)
	a.endpoints.Store(&endpoints)
}

// WatchCacheValue sets the function that gives an endpoint's cache value in tokens, ok false
// when the policy cannot tell (kvroute_endpoint_cache_value_tokens is then not exported).
func (a *Autoscale) WatchCacheValue(f func(*endpoint.Endpoint) (tokens float64, ok bool)) {
	a.value.Store(&f)
}

// WatchLabels sets the function that gives a model's label (Metrics.ModelLabel), so that the
// figures carry kvroute_requests_total's model labels, bounded as those are: the models the
// engines list past those given labels (MaxLearntModels, MaxLearntPerEngine) count as
// OtherModel, with the endpoints whose models are not known yet. Unset, each model is its own
// label (as many as the engines list), and those endpoints count as OtherModel.
func (a *Autoscale) WatchLabels(f func(model string) string) { a.label.Store(&f) }

// Figures samples the endpoints' snapshots and returns each model label's figures (nil before
// Watch). An endpoint without endpoints[].models counts for the models its engine lists
// (autoscale.Models), as the proxy routes them, and under OtherModel until its engine has
// listed them.
func (a *Autoscale) Figures() []autoscale.Figures {
	f := a.endpoints.Load()
	if f == nil {
		return nil
	}
	eps := (*f)()
	a.sat.Sample(a.now(), eps)
	return a.sat.FiguresBy(eps, *a.rate.Load(), a.modelLabel)
}

// modelLabel is model's label in the autoscaling series ("" is the endpoints whose models are
// not known).
func (a *Autoscale) modelLabel(model string) string {
	if f := a.label.Load(); f != nil {
		if l := (*f)(model); l != "" {
			return l
		}
		return OtherModel
	}
	if model == "" {
		return OtherModel
	}
	return model
}

// autoscaleCollector reads the figures at scrape time.
type autoscaleCollector Autoscale

func (c *autoscaleCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descModelDemand, descModelLoad, descModelSaturation, descCacheValue} {
		ch <- d
	}
}

func (c *autoscaleCollector) Collect(ch chan<- prometheus.Metric) {
	a := (*Autoscale)(c)
	for _, f := range a.Figures() {
		model := f.Model // a label already: never "", and one Figures for each
		if f.Counted > 0 {
			ch <- prometheus.MustNewConstMetric(descModelDemand, prometheus.GaugeValue, f.Demand, model)
		}
		if f.Known() {
			ch <- prometheus.MustNewConstMetric(descModelLoad, prometheus.GaugeValue, f.Load, model)
			ch <- prometheus.MustNewConstMetric(descModelSaturation, prometheus.GaugeValue, f.Saturation, model)
		}
	}
	value, eps := a.value.Load(), a.endpoints.Load()
	if value == nil || eps == nil {
		return
	}
	for _, e := range (*eps)() {
		if v, ok := (*value)(e); ok {
			ch <- prometheus.MustNewConstMetric(descCacheValue, prometheus.GaugeValue, v, e.Name)
		}
	}
}
