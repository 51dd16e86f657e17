package route

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/internal/endpoint"
)

// Audit compares, per endpoint, the prompt tokens the policy predicted a request would find
// cached there with what the engine then reported, and notices when an endpoint's reports stay
// far below the predictions: a silent zero hit (the engine's cache salt, tokenizer or block
// size differ from what the router assumes, prefix caching is off, or the engine restarted and
// keeps losing what it is sent). While that lasts the endpoint is "blind": the lifecycle
// reports its predictions as 0, and a policy that implements policy.CacheBlind ranks it on
// load alone, until its reports agree with the predictions again. Safe for concurrent use.
type Audit struct {
	cfg AuditConfig

	nblind atomic.Int32 // endpoints blind now: the request path asks nothing more while 0

	mu sync.Mutex
	st map[*endpoint.Endpoint]*auditState
}

// AuditConfig configures an Audit. The zero value takes every default.
type AuditConfig struct {
	// Weight of one request in the decayed sums (0: 0.05, about the last 20 requests).
	Weight float64
	// MinSamples is how many (decayed) requests with a prediction must be seen before a
	// verdict (0: 8, reached after 10 requests at the default weight).
	MinSamples float64
	// Silent: reported below this share of the predicted makes the endpoint blind (0: 0.1);
	// Agree: above this share makes it see again (0: 0.5).
	Silent, Agree float64
	// ProbeEvery is how often, at most, a blind endpoint is sent a request whose prompt the
	// index says it holds, ahead of the policy's pick (0: 250 ms; negative: never). Ranked on
	// load alone, a blind endpoint may otherwise never receive such a prompt again (with room
	// elsewhere every conversation moves away from it), and its reports could never agree
	// with the predictions again. A probe by a request whose pick is predicted to hold none of
	// its prompt costs it no cached prefix if the engine is still blind (a conversation's first
	// request away from the blind endpoint, say: it would compute its whole prompt at its pick
	// too): at most four a second; one by a request that its pick would hit, at most one in
	// costlyProbeEvery (30 s). Each request in a row that finds there what was predicted halves
	// the wait for the next probe, down to an eighth (agreeProbeShift): once the engine is
	// fixed, the evidence that it sees again comes in about a second, and a probe that still
	// finds it blind is again one in ProbeEvery.
	ProbeEvery time.Duration
	// OnChange, when set, is told of each verdict change: blind true when the endpoint's
	// reports stay far below the predictions, false when they agree again; found and
	// predicted are the decayed sums behind the verdict.
	OnChange func(ep *endpoint.Endpoint, blind bool, found, predicted float64)
}

type auditState struct {
	n, predicted, found float64 // decayed sums
	blind               bool
	since               time.Time
	probed              time.Time // the last probe sent while blind
	probedCostly        time.Time // the last probe by a request its pick was predicted to hit
	// agreeing counts the requests in a row, while blind, whose reports agreed with the
	// prediction (above Agree of it): each halves the wait for the next probe.
	agreeing int
}

// agreeProbeShift bounds how far agreeing reports shorten the wait between probes: to
// ProbeEvery/8. A verdict of seeing again needs about 14 agreeing requests in a row at the
// default weight (share above 0.5 from about 0), which then take about a second instead of
// 3.5 s at one probe in 250 ms; an engine that agrees only now and then is probed at most
// twice as often as one that never does.
const agreeProbeShift = 3

// costlyProbeEvery is how often, at most, a blind endpoint is probed by a request that its
// pick is predicted to hit (times the replicas whose probes the audit hears): such a probe
// costs that request its cached prefix if the engine is still blind, and an engine put right
// finds nothing of what it was sent while blind, so it loses it then too. Probes by requests
// whose pick holds none of their prompt cost nothing and go every ProbeEvery; these few keep
// the evidence coming when all of the blind endpoint's traffic has found a home elsewhere. At
// one in 30 s, the Mooncake trace with an instance blind for a quarter of the run (docs/
// results.md) lost no TTFT to them; at one in 250 ms, 4.9 % of its mean. After a report that
// agreed with its prediction the next such probe is expected to find its prefix too, so the
// limit holds only while the last report disagreed (agreeing 0): an engine put right whose
// only evidence is these probes sees again within a second of the first one that agrees, not
// after several of them 30 s apart (TestAuditSeesAgainByCostlyProbes: 0.8 s and 7 probes, 3
// minutes without this rule).
const costlyProbeEvery = 30 * time.Second

// NewAudit returns an Audit with cfg (zero fields take the defaults).
func NewAudit(cfg AuditConfig) *Audit {
	if cfg.Weight <= 0 || cfg.Weight >= 1 {
		cfg.Weight = 0.05
	}
	if cfg.MinSamples <= 0 {
		cfg.MinSamples = 8
	}
	if cfg.Silent <= 0 {
		cfg.Silent = 0.1
	}
	if cfg.Agree <= 0 {
		cfg.Agree = 0.5
	}
	if cfg.ProbeEvery == 0 {
		cfg.ProbeEvery = 250 * time.Millisecond
	}
	return &Audit{cfg: cfg, st: map[*endpoint.Endpoint]*auditState{}}
}

// Observe records one request that ended on ep: predicted and reported cached tokens, both in
// the router's units (reported < 0: the engine did not say; nothing to learn). It reports
// whether ep's verdict changed, and the verdict.
func (a *Audit) Observe(ep *endpoint.Endpoint, predicted, reported int, now time.Time) (changed, blind bool) {
	if a == nil || predicted <= 0 || reported < 0 {
		return false, false
	}
	a.mu.Lock()
	s := a.st[ep]
	if s == nil {
		if ep.Draining() {
			// It left the pool (Forget): a request that ended there since brings nothing back.
			a.mu.Unlock()
			return false, false
		}
		s = &auditState{}
		a.st[ep] = s
	}
	w := a.cfg.Weight
	s.n = s.n*(1-w) + 1
	s.predicted = s.predicted*(1-w) + float64(predicted)
	s.found = s.found*(1-w) + float64(min(reported, predicted))
	if s.blind && float64(min(reported, predicted)) > a.cfg.Agree*float64(predicted) {
		s.agreeing++
	} else {
		s.agreeing = 0
	}
	if s.n >= a.cfg.MinSamples || s.blind {
		share := s.found / s.predicted
		switch {
		case !s.blind && s.n >= a.cfg.MinSamples && share < a.cfg.Silent:
			s.blind, s.since, changed = true, now, true
			a.nblind.Add(1)
		case s.blind && share > a.cfg.Agree:
			s.blind, s.since, changed, s.agreeing = false, now, true, 0
			a.nblind.Add(-1)
		}
	}
	blind = s.blind
	found, pred := s.found, s.predicted
	a.mu.Unlock()
	if changed && a.cfg.OnChange != nil {
		a.cfg.OnChange(ep, blind, found, pred)
	}
	return changed, blind
}

// blindOnes returns the endpoints that are blind now.
func (a *Audit) blindOnes() []*endpoint.Endpoint {
	if a == nil {
		return nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []*endpoint.Endpoint
	for ep, s := range a.st {
		if s.blind {
			out = append(out, ep)
		}
	}
	return out
}

// Blind reports whether ep's cache reports disagree with the predictions (see Audit).
func (a *Audit) Blind(ep *endpoint.Endpoint) bool {
	if a == nil {
		return false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	s := a.st[ep]
	return s != nil && s.blind
}

// AuditStatus is an endpoint's audit, for /debug/endpoints.
type AuditStatus struct {
	// Blind is true while the engine's reported hits stay far below the predictions.
	Blind bool `json:"blind"`
	// Since is when the verdict last changed.
	Since time.Time `json:"since,omitzero"`
	// FoundShare is the share of predicted cached tokens the engine reported (decayed), -1
	// before any request with a prediction.
	FoundShare float64 `json:"found_share"`
}

// Status returns ep's audit.
func (a *Audit) Status(ep *endpoint.Endpoint) AuditStatus {
	st := AuditStatus{FoundShare: -1}
	if a == nil {
		return st
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if s := a.st[ep]; s != nil && s.predicted > 0 {
		st.Blind, st.Since, st.FoundShare = s.blind, s.since, s.found/s.predicted
	}
	return st
}

// Forget drops ep's audit.
func (a *Audit) Forget(ep *endpoint.Endpoint) {
	if a == nil {
		return
	}
	a.mu.Lock()
	if s := a.st[ep]; s != nil && s.blind {
		a.nblind.Add(-1)
	}
	delete(a.st, ep)
	a.mu.Unlock()
}

// probe returns the first endpoint of ranked after the first that is blind, due a probe
// (AuditConfig.ProbeEvery, times replicas: the router replicas whose probes this audit hears;
// shorter while its reports agree again; costlyProbeEvery when the first, the policy's pick,
// is predicted to hold some of the prompt, unless the last report agreed), predicted to hold some of the prompt and with no
// more requests in flight than the pick (a probe never waits behind more work than the
// request would have at its pick), and records the probe; -1 when there is none. The pick
// stands when it is blind itself.
func (a *Audit) probe(ranked []*endpoint.Endpoint, predict func(*endpoint.Endpoint) int, now time.Time, replicas int) int {
	if a == nil || a.cfg.ProbeEvery < 0 || a.nblind.Load() == 0 || len(ranked) < 2 {
		return -1
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if s := a.st[ranked[0]]; s != nil && s.blind {
		return -1
	}
	every := a.cfg.ProbeEvery * time.Duration(max(replicas, 1))
	asked, costly := false, false
	for i, ep := range ranked[1:] {
		s := a.st[ep]
		if s == nil || !s.blind || now.Sub(s.probed) < every>>min(s.agreeing, agreeProbeShift) ||
			ep.InFlight() > ranked[0].InFlight() || predict(ep) <= 0 {
			continue
		}
		if !asked {
			costly = predict(ranked[0]) > 0
			asked = true
		}
		if costly && s.agreeing == 0 && now.Sub(s.probedCostly) < costlyProbeEvery*time.Duration(max(replicas, 1)) {
			continue
		}
		s.probed = now
		if costly {
			s.probedCostly = now
		}
		return i + 1
	}
	return -1
}
