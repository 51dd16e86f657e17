package proxy

import (
	"encoding/json"
	"net/http"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/policy"
)

// Explanation is the answer of ServeExplain: how the router would rank the endpoints for one
// request now, and why.
type Explanation struct {
	Model        string `json:"model"`
	Tenant       string `json:"tenant,omitempty"`
	PromptTokens int    `json:"prompt_tokens"`
	Blocks       int    `json:"blocks"`
	// Explained is false when the policy cannot say why (only its order is shown).
	Explained  bool                   `json:"explained"`
	Candidates []CandidateExplanation `json:"candidates"`
}

// CandidateExplanation is one endpoint of an Explanation, in the policy's order.
type CandidateExplanation struct {
	Endpoint string `json:"endpoint"`
	InFlight int    `json:"in_flight"`
	// CachedTokens is the prompt tokens the policy believes the endpoint holds (0 while the
	// endpoint is cache-blind); -1 when the policy does not say.
	CachedTokens    int      `json:"cached_tokens"`
	PredictedTTFTms *float64 `json:"predicted_ttft_ms,omitempty"`
	Cost            *float64 `json:"cost,omitempty"`
	WithinBound     *bool    `json:"within_bound,omitempty"`
	CacheBlind      bool     `json:"cache_blind"`
}

// ServeExplain answers POST /debug/explain (on the admin port) with an Explanation: the body
// is an API request as a client would send it (chat by default; ?path=/v1/completions or
// /v1/responses for the others) and its headers carry the client's API key where tenancy is
// on, since the tenant's salt and endpoint labels change the answer. Nothing is routed,
// counted or charged to the tenant's limits.
func (h *Handler) ServeExplain(w http.ResponseWriter, r *http.Request) {
	h.once.Do(h.init)
	c := &call{h: h, cached: -1, timingsCached: -1}
	fail := func(oe *openai.Error) { openai.WriteError(w, oe) }
	if oe := c.identify(r.Header, w.Header(), false); oe != nil { // the API's metrics are not the admin port's
		fail(oe)
		return
	}
	path := r.URL.Query().Get("path")
	if path == "" {
		path = "/v1/chat/completions"
	}
	kind, models, oe := resolve(http.MethodPost, path)
	if oe != nil || models {
		fail(openai.BadRequest("path", "path=%s: explain takes the path of an API request: /v1/chat/completions (the default), /v1/completions or /v1/responses", path))
		return
	}
	if oe := contentEncoding(r.Header); oe != nil {
		w.Header().Set("Accept-Encoding", "identity")
		fail(oe)
		return
	}
	body, oe := readBody(r, h.MaxBodyBytes)
	if oe != nil {
		fail(oe)
		return
	}
	req, oe := parse(kind, body, nil)
	if oe != nil {
		fail(oe)
		return
	}
	c.keys(req, r.Header)
	cands := h.Pool.Candidates(nil, req.Model, c.labels())
	if len(cands) == 0 {
		fail(h.noCandidate(req.Model, c.labels(), w.Header()))
		return
	}
	pk := h.Lifecycle.Picker()
	out := Explanation{Model: req.Model, Tenant: c.preq.Tenant,
		PromptTokens: c.preq.PromptTokens, Blocks: len(c.preq.Blocks), Candidates: []CandidateExplanation{}}
	if ex, ok := pk.(policy.Explainer); ok {
		out.Explained = true
		for _, x := range ex.Explain(&c.preq, cands) {
			ttft := float64(x.PredictedTTFT.Microseconds()) / 1000
			cost, within := x.Cost, x.WithinBound
			out.Candidates = append(out.Candidates, CandidateExplanation{
				Endpoint: x.Endpoint.Name, InFlight: x.Endpoint.InFlight(), CachedTokens: x.CachedTokens,
				PredictedTTFTms: &ttft, Cost: &cost, WithinBound: &within, CacheBlind: x.CacheBlind,
			})
		}
	} else {
		ranked, err := pk.Pick(&c.preq, cands)
		if err != nil {
			fail(openai.NewError(http.StatusServiceUnavailable, openai.TypeUnavailable, "", "no_healthy_endpoint", err.Error()))
			return
		}
		for _, e := range ranked {
			out.Candidates = append(out.Candidates, CandidateExplanation{
				Endpoint: e.Name, InFlight: e.InFlight(), CachedTokens: predicted(pk, &c.preq, e)})
		}
	}
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(out)
}

// predicted is what pk says req would find cached on e, or -1 when it does not say.
func predicted(pk policy.Picker, req *policy.Request, e *endpoint.Endpoint) int {
	if p, ok := pk.(policy.Predictor); ok {
		return p.PredictCached(req, e)
	}
	return -1
}
