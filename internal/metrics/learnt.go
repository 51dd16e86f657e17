package metrics

import (
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// MaxLearntModels bounds the model labels learnt from engines (EndpointServes): an engine that
// lists 10,000 models would otherwise make 10,000 times the statuses of series per endpoint.
// An engine's list gives labels to its first MaxLearntPerEngine models at most (sorted), so
// that one long list does not take every place. The models past them count as OtherModel
// (ModelLabel).
const (
	MaxLearntModels    = 64
	MaxLearntPerEngine = 16
)

// EndpointServes records the models that the engine of an endpoint without a model list says
// it serves (GET /v1/models; the router then routes only those to it) and makes their series at
// 0, as EndpointAdded does for a configured model, so that the first request of a model learnt
// this way shows in rate() and increase() too. It may be called after every reading of the
// list: an unchanged list costs a comparison.
//
// A learnt model gets series on the endpoints whose engine lists it and on those without a
// model list whose engine has not answered yet (they take any model); it loses them on an
// endpoint whose engine stops listing it, and everywhere once no engine lists it (the endpoints
// that list it forgotten). At most MaxLearntModels models that no endpoint configures get
// labels, the first MaxLearntPerEngine of each engine's sorted list at most, taken in turn from
// each list; a label keeps its place while an engine lists it, and a place freed is taken by
// the next. An endpoint that has a model list, or has left, is ignored: its config decides.
func (m *Metrics) EndpointServes(name string, models []string) {
	list := slices.DeleteFunc(slices.Clone(models), func(model string) bool {
		return model == "" || model == OtherModel || model == UnknownModel // not a model's own label
	})
	slices.Sort(list)
	list = slices.Compact(list)
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.anyModel[name] {
		return
	}
	if old, ok := m.lists[name]; ok && slices.Equal(old, list) {
		return
	}
	m.lists[name] = list
	m.syncLearntLocked(name)
	m.labels.Store(nil)
}

// syncLearntLocked brings the learnt labels and their series in line with the engines' lists
// (m.lists) and the configured models: see EndpointServes. When the labels learnt stay the
// same, only the series of endpoint changed (none: "") are made again, so that a fleet of
// engines answering one after another costs each its own.
func (m *Metrics) syncLearntLocked(changed string) {
	configured := map[string]bool{}
	for e, ls := range m.served {
		if !m.anyModel[e] {
			for _, model := range ls {
				configured[model] = true
			}
		}
	}
	listed := map[string]bool{}
	for _, ls := range m.lists {
		for _, model := range ls[:min(len(ls), MaxLearntPerEngine)] {
			listed[model] = true
		}
	}
	// The labels learnt already keep their place while an engine lists them; configured
	// since, they need none.
	learnt := make([]string, 0, MaxLearntModels)
	isLearnt := map[string]bool{}
	var gone []string
	for _, model := range m.learnt {
		if listed[model] && !configured[model] {
			learnt = append(learnt, model)
			isLearnt[model] = true
		} else if !configured[model] {
			gone = append(gone, model)
		}
	}
	names := make([]string, 0, len(m.lists))
	for e := range m.lists {
		names = append(names, e)
	}
	slices.Sort(names)
	for i := 0; i < MaxLearntPerEngine && len(learnt) < MaxLearntModels; i++ {
		more := false
		for _, e := range names {
			ls := m.lists[e]
			if i >= len(ls) {
				continue
			}
			more = true
			if model := ls[i]; !configured[model] && !isLearnt[model] && len(learnt) < MaxLearntModels {
				learnt = append(learnt, model)
				isLearnt[model] = true
			}
		}
		if !more {
			break
		}
	}
	eps := map[string]bool{changed: m.anyModel[changed]}
	if !slices.Equal(learnt, m.learnt) {
		eps = m.anyModel
	}
	m.learnt = learnt
	// Models no longer learnt leave every endpoint (dropModelsLocked deletes all their series
	// once no endpoint holds them); one still learnt leaves the endpoints whose engine answered
	// without it.
	for e, ok := range eps {
		if !ok {
			continue
		}
		ls, answered := m.lists[e]
		m.served[e] = slices.DeleteFunc(m.served[e], func(model string) bool {
			if slices.Contains(gone, model) {
				return true
			}
			if !isLearnt[model] || !answered {
				return false
			}
			if _, ok := slices.BinarySearch(ls, model); ok {
				return false
			}
			m.Requests.DeletePartialMatch(prometheus.Labels{"model": model, "endpoint": e})
			return true
		})
		if !answered {
			m.serveLocked(e, learnt)
			continue
		}
		for _, model := range ls {
			if isLearnt[model] {
				m.serveLocked(e, []string{model})
			}
		}
	}
	m.dropModelsLocked(gone)
}

// latest is the tag that ollama adds to a model's name by default: "tiny" and "tiny:latest" are
// one model (endpoint.SameModel).
const latest = ":latest"

// ModelLabel is the model label of a request for model, a model that some endpoint serves:
// model itself where its series were made (a configured model, or a learnt one within
// MaxLearntModels), else OtherModel, so that the labels stay bounded whatever the engines list.
// It takes no lock but after a change of the endpoints or their lists.
func (m *Metrics) ModelLabel(model string) string {
	var labels map[string]bool
	if l := m.labels.Load(); l != nil {
		labels = *l
	} else {
		m.mu.RLock()
		labels = m.labelsLocked()
		m.mu.RUnlock()
	}
	switch {
	case labels[model]:
		return model
	case strings.HasSuffix(model, latest) && labels[model[:len(model)-len(latest)]]:
		return model[:len(model)-len(latest)] // one model, one label (endpoint.SameModel)
	case labels[model+latest]:
		return model + latest
	}
	return OtherModel
}
