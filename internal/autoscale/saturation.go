package autoscale

import (
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/policy"
)

// DefaultWindow is the time constant over which the load is averaged: long enough
// that a burst of a few seconds does not add an engine, short next to the minutes an engine
// takes to start.
const DefaultWindow = time.Minute

// Saturation follows what each engine's scraped metrics say of its load, as moving averages:
// the prefill work it computes (prefix-cache queries less hits: the prompt tokens it did not
// find cached) and its KV-cache usage (the memory its running requests hold), and gives each
// model's load over its capacity (Figures). It counts every request the engines served,
// whichever router replica or client sent it, and whatever the policy. It is safe for
// concurrent use.
type Saturation struct {
	window float64 // seconds

	mu  sync.Mutex
	eps map[*endpoint.Endpoint]*demand
	gen uint64
}

// demand is what one engine's metrics say of its load.
type demand struct {
	at       time.Time // the time of the snapshot last folded in
	computed float64   // its queries less hits
	// mean is the exponentially weighted average of the rate (tokens/s), started at 0;
	// weight is the share of it that observations make up (1 - exp(-observed time / window)),
	// so mean / weight is the average of what was observed, unbiased from the first interval.
	mean, weight float64
	// kv and kvWeight are the same for the engine's KV-cache usage (0..1).
	kv, kvWeight float64
	reported     bool   // the engine has reported prefix-cache queries
	kvReported   bool   // the engine has reported a KV-cache usage above 0
	stale        bool   // its last snapshot is older than two windows: its figures are not counted
	gen          uint64 // the last Sample that saw the endpoint
}

// NewSaturation returns a Saturation averaging over window (0 or less: DefaultWindow).
func NewSaturation(window time.Duration) *Saturation {
	if window <= 0 {
		window = DefaultWindow
	}
	return &Saturation{window: window.Seconds(), eps: map[*endpoint.Endpoint]*demand{}}
}

// Sample folds in every endpoint's latest snapshot as of now (a snapshot already seen changes
// nothing) and forgets the endpoints that are not in eps. An endpoint whose last snapshot is
// more than two windows old (its engine no longer answers scrapes) counts no load until a new
// one comes: what it last said is no longer true. Call it at least once per window: the
// router does at every scrape of its metrics, the simulator at every control period.
func (s *Saturation) Sample(now time.Time, eps []*endpoint.Endpoint) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gen++
	for _, e := range eps {
		d := s.eps[e]
		if d == nil {
			d = &demand{}
			s.eps[e] = d
		}
		d.gen = s.gen
		sn := e.Snapshot()
		if sn == nil || sn.At.IsZero() {
			continue
		}
		d.stale = now.Sub(sn.At).Seconds() > 2*s.window
		if !sn.At.After(d.at) {
			continue // nothing new (or an older snapshot than the last)
		}
		c := sn.PrefixQueries - sn.PrefixHits
		d.reported = d.reported || sn.PrefixQueries > 0
		d.kvReported = d.kvReported || sn.KVUsage > 0
		if !d.at.IsZero() {
			dt := sn.At.Sub(d.at).Seconds()
			a := -math.Expm1(-dt / s.window)
			d.kv += a * (sn.KVUsage - d.kv)
			d.kvWeight += a * (1 - d.kvWeight)
			// Counters that went back: the engine restarted, and this interval is no
			// measurement of its rate.
			if c >= d.computed {
				d.mean += a * ((c-d.computed)/dt - d.mean)
				d.weight += a * (1 - d.weight)
			}
		}
		d.at, d.computed = sn.At, c
	}
	for e, d := range s.eps {
		if d.gen != s.gen {
			delete(s.eps, e)
		}
	}
}

// Figures is the load on one model's engines.
type Figures struct {
	// Model is the model (FiguresBy: the label), "" for the endpoints whose models are not
	// known: no endpoints[].models, and no list from their engine yet (they may take any).
	Model string `json:"model"`
	// Engines is the model's endpoints available for new requests: the capacity.
	Engines int `json:"engines"`
	// Reporting is the model's endpoints with a measure of their load: a prefill demand
	// (prefix-cache counters) with a prefill rate, or a KV-cache usage. vLLM and SGLang
	// report both; TGI and llama.cpp neither, and a model served only by those has no load
	// known.
	Reporting int `json:"reporting"`
	// Counted is the endpoints among them whose engines report prefix-cache counters: Demand
	// is theirs.
	Counted int `json:"counted"`
	// Demand is the prompt tokens per second its engines computed (not served from their
	// caches), averaged over the window.
	Demand float64 `json:"demand_tokens_per_s"`
	// Rate is one available engine's prefill rate (tokens per second), the mean of what
	// rate gave for each; 0 when unknown.
	Rate float64 `json:"rate_tokens_per_s"`
	// Prefill is the engines' prefill utilisations summed: each one's demand over its rate,
	// the engines it would keep computing prefill all the time (0 when no rate is known).
	Prefill float64 `json:"prefill"`
	// KVUsage is the mean KV-cache usage (0..1, averaged over the window) of the endpoints
	// whose engines report it: the memory their running requests hold.
	KVUsage float64 `json:"kv_usage"`
	// Load is the engines' worth of work: the sum over the endpoints of the larger of their
	// prefill utilisation and their KV-cache usage, whichever limits it first. Saturation
	// is Load / Engines. Both are 0 unless Known.
	Load       float64 `json:"load"`
	Saturation float64 `json:"saturation"`
}

// Known reports whether the load and the capacity are both known.
func (f *Figures) Known() bool { return f.Reporting > 0 && f.Engines > 0 }

// Models returns the models an endpoint's load and capacity count for, as the proxy routes: its
// configured models (endpoints[].models), else those its engine lists (GET /v1/models, learnt
// by probing), else nil: not known yet, and it may take any model.
func Models(e *endpoint.Endpoint) []string {
	if len(e.Models) > 0 {
		return e.Models
	}
	return e.ServedModels()
}

// Figures returns each model's figures, sorted by model, for the endpoints eps (those of the
// last Sample that are still in eps count). An endpoint's models are Models': an endpoint
// whose models are not known yet counts under "". rate gives an endpoint's prefill rate in the
// engine's tokens per second (0: unknown; an endpoint without one is taken at the mean of the
// others'); only available endpoints make the capacity, while every endpoint's load counts
// (one that drains still works). An endpoint serving several models counts its load and its
// capacity for each.
func (s *Saturation) Figures(eps []*endpoint.Endpoint, rate func(*endpoint.Endpoint) float64) []Figures {
	return s.FiguresBy(eps, rate, nil)
}

// FiguresBy is Figures with the models grouped by label (label(""): the endpoints whose models
// are not known), each Figures being one label's: the models of a metric's bounded label set
// that share a label make one, and an endpoint counts once for each of its models' labels. A
// nil label keeps each model apart. label is called without the Saturation's lock held.
func (s *Saturation) FiguresBy(eps []*endpoint.Endpoint, rate func(*endpoint.Endpoint) float64, label func(model string) string) []Figures {
	type one struct {
		models        []string
		avail         bool
		rate          float64
		demand, kv    float64
		hasDem, hasKV bool
	}
	ones := make([]one, len(eps))
	for i, e := range eps {
		o := one{models: Models(e), avail: e.Available()}
		if len(o.models) == 0 {
			o.models = []string{""}
		}
		if label != nil {
			ls := make([]string, len(o.models))
			for j, m := range o.models {
				ls[j] = label(m)
			}
			slices.Sort(ls)
			o.models = slices.Compact(ls)
		}
		if rate != nil {
			o.rate = rate(e)
		}
		ones[i] = o
	}
	s.mu.Lock()
	for i, e := range eps {
		o := &ones[i]
		if d := s.eps[e]; d != nil && !d.stale {
			if d.reported && d.weight > 0 {
				o.demand, o.hasDem = d.mean/d.weight, true
			}
			if d.kvReported && d.kvWeight > 0 {
				o.kv, o.hasKV = d.kv/d.kvWeight, true
			}
		}
	}
	s.mu.Unlock()

	byModel := map[string]*Figures{}
	rated, kvs := map[string]int{}, map[string]int{}
	for _, o := range ones {
		for _, m := range o.models {
			f := byModel[m]
			if f == nil {
				f = &Figures{Model: m}
				byModel[m] = f
			}
			if o.avail {
				f.Engines++
				if o.rate > 0 {
					f.Rate += o.rate
					rated[m]++
				}
			}
		}
	}
	for m, f := range byModel {
		if rated[m] > 0 {
			f.Rate /= float64(rated[m])
		}
	}
	for _, o := range ones {
		for _, m := range o.models {
			f := byModel[m]
			r := o.rate
			if r <= 0 {
				r = f.Rate
			}
			u, known := 0.0, false
			if o.hasDem {
				f.Counted++
				f.Demand += o.demand
				if r > 0 {
					f.Prefill += o.demand / r
					u, known = o.demand/r, true
				}
			}
			if o.hasKV {
				f.KVUsage += o.kv
				kvs[m]++
				u, known = max(u, o.kv), true
			}
			if known {
				f.Reporting++
				f.Load += u
			}
		}
	}
	out := make([]Figures, 0, len(byModel))
	for m, f := range byModel {
		if kvs[m] > 0 {
			f.KVUsage /= float64(kvs[m])
		}
		if f.Known() {
			f.Saturation = f.Load / float64(f.Engines)
		} else {
			f.Load = 0
		}
		out = append(out, *f)
	}
	slices.SortFunc(out, func(a, b Figures) int { return strings.Compare(a.Model, b.Model) })
	return out
}

// EngineRate is an endpoint's prefill rate in the engine's tokens per second, as Figures wants
// it: fixed when above 0 (a rate the operator measured, autoscale.prefill_rate), else the
// policy's calibrated rate (policies with a PrefillRate method: prefix-aware), which is in the
// router's token units and is converted by the endpoint's learned token scale; 0 when neither
// is known.
func EngineRate(p policy.Picker, fixed float64, e *endpoint.Endpoint) float64 {
	if fixed > 0 {
		return fixed
	}
	if r, ok := p.(interface{ PrefillRate(id int) float64 }); ok {
		return r.PrefillRate(e.ID) * e.TokenScale()
	}
	return 0
}
