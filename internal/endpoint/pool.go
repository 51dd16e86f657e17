package endpoint

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Spec describes an endpoint to the Pool: what the config or discovery says of it.
type Spec struct {
	// Name is the endpoint's address (its base URL); the pool diffs by it.
	Name             string
	Models           []string
	Labels           map[string]string
	Engine           string
	KVCapacityTokens int
	// StepTokens is the engine's step budget under chunked prefill, in its tokens (0: unset).
	StepTokens int
	// CacheSalt says whether the router injects the tenant's cache_salt into its requests;
	// CacheSaltAuto, whether it does once the engine is found to be vLLM (engine auto, no
	// cache_salt in the config).
	CacheSalt, CacheSaltAuto bool
	// HealthPath overrides the engine's health check path ("" for the engine's default).
	HealthPath string
	// MetricsPath is the metrics path to scrape ("" for none).
	MetricsPath string
	// FirstTokenTimeout and ResponseTimeout override the router's attempt timeouts (0: none).
	FirstTokenTimeout, ResponseTimeout time.Duration
	// KVEvents is the engine's KV-event publisher (tcp://host:port), as discovery found it
	// (Kubernetes: the pod's kvroute.io/kv-events); "" for none. Carried for the precise
	// (KV-event) mode; routing does not read it yet.
	KVEvents string
}

func (s *Spec) equal(o *Spec) bool {
	return s.Name == o.Name && slices.Equal(s.Models, o.Models) && maps.Equal(s.Labels, o.Labels) &&
		s.Engine == o.Engine && s.KVCapacityTokens == o.KVCapacityTokens && s.StepTokens == o.StepTokens && s.CacheSalt == o.CacheSalt && s.CacheSaltAuto == o.CacheSaltAuto &&
		s.HealthPath == o.HealthPath && s.MetricsPath == o.MetricsPath &&
		s.FirstTokenTimeout == o.FirstTokenTimeout && s.ResponseTimeout == o.ResponseTimeout &&
		s.KVEvents == o.KVEvents
}

// Diff is what an Update changed.
type Diff struct {
	// Added endpoints are new, with fresh IDs.
	Added []*Endpoint
	// Removed endpoints left the pool and are marked draining; requests in flight on them go
	// on. The router tells the policy (Observer.Removed).
	Removed []*Endpoint
	// Kept endpoints are unchanged: same object, same ID, same counters.
	Kept []*Endpoint
}

// member is one endpoint of the pool with the spec it was made from.
type member struct {
	ep   *Endpoint
	spec Spec
}

// poolState is an immutable view of the pool, replaced whole by Update.
type poolState struct {
	eps     []*Endpoint // by ID
	byName  map[string]*member
	models  []string      // sorted, unique
	changed chan struct{} // closed when this state is replaced
}

// Pool is the current set of endpoints. Reads (Candidates, All, ByName) are lock-free and
// allocation-free on a copy-on-write state; Update serialises writers. IDs are handed out in
// order and never reused: an ID is one Endpoint object for good, but the highest grows with
// every endpoint the pool has ever had, so a slice indexed by ID grows with the churn, not
// the fleet.
type Pool struct {
	mu     sync.Mutex // serialises Update
	nextID int
	st     atomic.Pointer[poolState]
}

// NewPool returns an empty pool.
func NewPool() *Pool {
	p := &Pool{}
	p.st.Store(&poolState{byName: map[string]*member{}, changed: make(chan struct{})})
	return p
}

// Update replaces the pool's endpoints by specs, diffing by Name: an endpoint whose spec is
// unchanged keeps its object, ID and counters; a new name, or a known name whose spec changed,
// gets a new Endpoint with a fresh ID; endpoints no longer listed (and the old objects of changed
// ones) are marked draining and returned in Removed. Invalid specs (empty or duplicate names)
// leave the pool unchanged and return an error naming them.
func (p *Pool) Update(specs []Spec) (Diff, error) {
	var errs []error
	seen := make(map[string]bool, len(specs))
	for i := range specs {
		switch n := specs[i].Name; {
		case n == "":
			errs = append(errs, fmt.Errorf("endpoint %d: empty name", i))
		case seen[n]:
			errs = append(errs, fmt.Errorf("endpoint %d: name %q is listed twice", i, n))
		default:
			seen[n] = true
		}
	}
	if len(errs) > 0 {
		return Diff{}, fmt.Errorf("pool update: %w", errors.Join(errs...))
	}

	p.mu.Lock()
	defer p.mu.Unlock()
	old := p.st.Load()
	next := &poolState{
		eps:     make([]*Endpoint, 0, len(specs)),
		byName:  make(map[string]*member, len(specs)),
		changed: make(chan struct{}),
	}
	var d Diff
	models := map[string]bool{}
	for i := range specs {
		s := cloneSpec(&specs[i])
		m, ok := old.byName[s.Name]
		if ok && m.spec.equal(&s) {
			d.Kept = append(d.Kept, m.ep)
		} else {
			m = &member{ep: newEndpoint(p.nextID, &s), spec: s}
			p.nextID++
			d.Added = append(d.Added, m.ep)
		}
		next.byName[s.Name] = m
		next.eps = append(next.eps, m.ep)
		for _, mo := range s.Models {
			models[mo] = true
		}
	}
	for _, m := range old.eps {
		if cur, ok := next.byName[m.Name]; !ok || cur.ep != m {
			m.SetDraining(true)
			d.Removed = append(d.Removed, m)
		}
	}
	slices.SortFunc(next.eps, func(a, b *Endpoint) int { return a.ID - b.ID })
	next.models = slices.Sorted(maps.Keys(models))
	p.st.Store(next)
	close(old.changed)
	return d, nil
}

func cloneSpec(s *Spec) Spec {
	c := *s
	c.Models = slices.Clone(s.Models)
	if s.Labels != nil {
		c.Labels = maps.Clone(s.Labels)
	}
	return c
}

// newEndpoint makes the endpoint of spec s. It starts healthy (its first health check decides
// at once), except one whose cache salt waits for its kind (CacheSaltAuto): until the first
// check has found out what it is, a tenant's request sent to it would go without its salt and
// share the engine's prefix cache with every other tenant's. Requests that find no other
// endpoint can wait for that check (Endpoint.FirstCheck, Pool.FirstCheck).
func newEndpoint(id int, s *Spec) *Endpoint {
	e := &Endpoint{
		ID:                id,
		Name:              s.Name,
		Models:            slices.Clone(s.Models),
		Labels:            maps.Clone(s.Labels),
		Engine:            s.Engine,
		KVCapacityTokens:  s.KVCapacityTokens,
		StepTokens:        s.StepTokens,
		FirstTokenTimeout: s.FirstTokenTimeout,
		ResponseTimeout:   s.ResponseTimeout,
	}
	if s.CacheSaltAuto {
		e.unhealthy.Store(true)
		e.firstCheck = make(chan struct{})
	}
	return e
}

// Candidates appends to dst[:0] the available endpoints (healthy, not draining) that serve
// model and carry every label in labels, sorted by ID. It allocates nothing when dst has the
// capacity.
func (p *Pool) Candidates(dst []*Endpoint, model string, labels map[string]string) []*Endpoint {
	dst = dst[:0]
	for _, e := range p.st.Load().eps {
		if !e.Available() || !e.Serves(model) || !hasLabels(e.Labels, labels) {
			continue
		}
		dst = append(dst, e)
	}
	return dst
}

// FirstCheck returns the Endpoint.FirstCheck channel of an endpoint that serves model and
// carries every label in labels, is not draining, and is out of rotation only until its first
// health check: one that would be among the Candidates once that check passes. nil when there
// is none.
func (p *Pool) FirstCheck(model string, labels map[string]string) <-chan struct{} {
	for _, e := range p.st.Load().eps {
		if ch := e.FirstCheck(); ch != nil && !e.Draining() && e.Serves(model) && hasLabels(e.Labels, labels) {
			return ch
		}
	}
	return nil
}

func hasLabels(have, want map[string]string) bool {
	for k, v := range want {
		if hv, ok := have[k]; !ok || hv != v {
			return false
		}
	}
	return true
}

// All returns a copy of the pool's endpoints, available or not, sorted by ID.
func (p *Pool) All() []*Endpoint { return slices.Clone(p.st.Load().eps) }

// Len is the number of endpoints in the pool.
func (p *Pool) Len() int { return len(p.st.Load().eps) }

// ByName returns the endpoint named name (its URL), or nil.
func (p *Pool) ByName(name string) *Endpoint {
	if m, ok := p.st.Load().byName[name]; ok {
		return m.ep
	}
	return nil
}

// Spec returns the spec ep was made from, if ep is still in the pool.
func (p *Pool) Spec(ep *Endpoint) (Spec, bool) {
	m, ok := p.st.Load().byName[ep.Name]
	if !ok || m.ep != ep {
		return Spec{}, false
	}
	return cloneSpec(&m.spec), true
}

// CacheSalt reports whether the router injects cache_salt into requests to ep: as its spec
// says, or, with CacheSaltAuto, once the engine was found to be vLLM (before, an engine of
// unknown kind might refuse the field).
func (p *Pool) CacheSalt(ep *Endpoint) bool {
	m, ok := p.st.Load().byName[ep.Name]
	return ok && m.ep == ep && (m.spec.CacheSalt || m.spec.CacheSaltAuto && ep.Kind() == "vllm")
}

// Models returns the models named by the pool's endpoints, sorted (for /v1/models): the
// configured ones, and those that endpoints without a configured list say they serve.
func (p *Pool) Models() []string {
	st := p.st.Load()
	out := slices.Clone(st.models)
	for _, e := range st.eps {
		if len(e.Models) == 0 {
			out = append(out, e.ServedModels()...)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// HasModel reports whether some endpoint of the pool names model, in its config or (without
// one) in the list its engine gave, ":latest" or not (SameModel).
func (p *Pool) HasModel(model string) bool {
	st := p.st.Load()
	for _, m := range st.models {
		if SameModel(m, model) {
			return true
		}
	}
	for _, e := range st.eps {
		if len(e.Models) == 0 && slices.ContainsFunc(e.ServedModels(), func(m string) bool { return SameModel(m, model) }) {
			return true
		}
	}
	return false
}

// Configured reports whether an endpoint's config names model (not only an engine's list),
// and its name as the config spells it (model may add or drop ":latest", as SameModel allows).
func (p *Pool) Configured(model string) (name string, ok bool) {
	models := p.st.Load().models
	if i := slices.IndexFunc(models, func(m string) bool { return SameModel(m, model) }); i >= 0 {
		return models[i], true
	}
	return "", false
}

// Changed returns a channel that is closed at the next Update: wait on it, then call Changed
// again.
func (p *Pool) Changed() <-chan struct{} { return p.st.Load().changed }
