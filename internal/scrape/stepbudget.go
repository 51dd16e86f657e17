package scrape

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/kvroute/kvroute/internal/endpoint"
)

// What an engine says of its own step budget (the tokens it computes in one step under chunked
// prefill), where it says it at all; docs/router.md ("Step budget reported by the engine")
// gives the sources:
//
//   - SGLang: GET /server_info (GET /get_server_info before it was renamed) answers its server
//     arguments, chunked_prefill_size among them, already resolved from the GPU's memory when it
//     was not given; -1 or null means chunked prefill is off.
//   - ollama: POST /api/show {"model": ..., "name": ...} answers the model's parameters as
//     text, one "name value" a line; num_batch is there when the model's Modelfile sets it,
//     and a model that does not set it runs with the default of 512.
//   - vLLM, TGI and llama.cpp report nothing of it: vLLM's /server_info exists only in its
//     development mode, TGI's /info has not carried its max_batch_prefill_tokens in any
//     release, and llama-server's /props has no n_batch. Nothing is asked of them.

// stepLimit bounds an answer about the step budget (SGLang's server arguments run to tens of
// kilobytes; an ollama model's license can be long).
const stepLimit = 1 << 20

// maxStepTokens is the largest budget taken from an engine; a larger one is a wrong answer.
const maxStepTokens = 1 << 22

// stepModels bounds the models of an ollama endpoint asked about their num_batch.
const stepModels = 8

// errNoStepReport is an answer that says nothing usable of the budget (a field missing, a
// value that is not one); it changes nothing.
var errNoStepReport = errors.New("no step budget in the answer")

// stepAnswer is what one engine said of its step budget: tokens, or 0 when it said it has none
// (chunked prefill off), and evidence for logs and /debug/endpoints.
type stepAnswer struct {
	tokens   int
	evidence string
}

// asksStep reports whether the prober asks an engine kind for its step budget.
func asksStep(kind string) bool { return kind == "sglang" || kind == "ollama" }

// learnStep asks ep's engine for its step budget, once on first contact and again after a
// failed health check (the engine may have restarted with other flags) or a change of kind,
// and records what it reports on the endpoint (Endpoint.SetReportedStepTokens). Its requests
// together are bounded by the health timeout, each answer by stepLimit. An answer that says
// nothing usable, an error or a timeout changes nothing, and is asked again only after the
// next failed check. It runs after the health check's outcome is recorded, so it never fails
// one.
func (p *Prober) learnStep(ctx context.Context, ep *endpoint.Endpoint, o Options) {
	kind := ep.Kind()
	p.mu.Lock()
	s := p.st(ep)
	due := !s.stepAsked || s.stepKind != kind
	changed := s.stepKind != "" && s.stepKind != kind
	s.stepAsked, s.stepKind = true, kind
	p.mu.Unlock()
	if !due {
		return
	}
	if changed {
		// What another kind of engine reported says nothing of this one.
		ep.SetReportedStepTokens(0)
	}
	if !asksStep(kind) {
		return
	}
	// One health timeout for all of it (SGLang's two names, ollama's models), so that the
	// endpoint's next check is never pushed back by more than one of its own timeouts.
	ctx, cancel := context.WithTimeout(ctx, o.HealthTimeout)
	defer cancel()
	var a stepAnswer
	var err error
	switch kind {
	case "sglang":
		a, err = p.sglangStep(ctx, ep.Name)
	case "ollama":
		models := ep.Models
		if len(models) == 0 {
			models = ep.ServedModels()
		}
		if len(models) == 0 {
			// Not known yet (GET /v1/models failed): ask at the next check.
			p.mu.Lock()
			p.st(ep).stepAsked = false
			p.mu.Unlock()
			return
		}
		a, err = p.ollamaStep(ctx, ep.Name, models)
	}
	p.mu.Lock()
	if err != nil {
		p.st(ep).status.StepReport = err.Error()
	} else {
		p.st(ep).status.StepReport = a.evidence
	}
	p.mu.Unlock()
	if err != nil {
		p.log.Debug("asking the engine for its step budget failed", "endpoint", ep.Name, "err", err)
		return
	}
	if old := ep.SetReportedStepTokens(a.tokens); old != a.tokens {
		msg := "engine reports its step budget"
		if a.tokens == 0 {
			msg = "engine reports no step budget any more"
		}
		p.log.Info(msg, "endpoint", ep.Name, "engine", kind, "step_tokens", a.tokens, "evidence", a.evidence)
	}
}

// sglangStep asks SGLang for its server arguments: GET /server_info, or GET /get_server_info
// where the server has only the older name.
func (p *Prober) sglangStep(ctx context.Context, base string) (stepAnswer, error) {
	var info struct {
		ChunkedPrefillSize json.RawMessage `json:"chunked_prefill_size"`
	}
	// Any JSON object will do: a missing field is chunkedPrefill's to report.
	read := jsonInto(&info, func() bool { return true })
	path := "/server_info"
	err := p.do(ctx, http.MethodGet, base+path, nil, stepLimit, read)
	if err != nil && clientError(err) {
		path = "/get_server_info"
		err = p.do(ctx, http.MethodGet, base+path, nil, stepLimit, read)
	}
	if err != nil {
		return stepAnswer{}, err
	}
	return chunkedPrefill("GET "+path, info.ChunkedPrefillSize)
}

// chunkedPrefill reads SGLang's chunked_prefill_size as it came in the answer to req (raw is
// nil when the field was missing).
func chunkedPrefill(req string, raw json.RawMessage) (stepAnswer, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return stepAnswer{}, fmt.Errorf("%s: %w: no chunked_prefill_size", req, errNoStepReport)
	}
	if string(raw) == "null" {
		return stepAnswer{0, req + ": chunked_prefill_size null (chunked prefill off)"}, nil
	}
	n, err := strconv.ParseInt(string(raw), 10, 64)
	switch {
	case err != nil || n > maxStepTokens || n == 0 || n < -1:
		return stepAnswer{}, fmt.Errorf("%s: %w: chunked_prefill_size %.40s", req, errNoStepReport, raw)
	case n == -1:
		return stepAnswer{0, req + ": chunked_prefill_size -1 (chunked prefill off)"}, nil
	}
	return stepAnswer{int(n), fmt.Sprintf("%s: chunked_prefill_size %d", req, n)}, nil
}

// ollamaStep asks ollama for the parameters of each of models (at most stepModels): the
// budget is the num_batch they share, set by at least one of them; models without it run with
// ollama's default. Models that differ report no single budget: the kind's default stands.
func (p *Prober) ollamaStep(ctx context.Context, base string, models []string) (stepAnswer, error) {
	models = models[:min(len(models), stepModels)]
	shared, set := -1, false
	for _, m := range models {
		// "name" for the releases before "model" (v0.1.20); later ones read either.
		body, err := json.Marshal(map[string]string{"model": m, "name": m})
		if err != nil {
			return stepAnswer{}, err
		}
		// Every answer has the model's modelfile (since parameters came, v0.0.18) or its
		// model_info (always there since); parameters is left out when the model has none.
		var show struct {
			Parameters *string         `json:"parameters"`
			Modelfile  *string         `json:"modelfile"`
			ModelInfo  json.RawMessage `json:"model_info"`
		}
		err = p.do(ctx, http.MethodPost, base+"/api/show", body, stepLimit,
			jsonInto(&show, func() bool { return show.Modelfile != nil || show.ModelInfo != nil }))
		if err != nil {
			return stepAnswer{}, err
		}
		n, err := numBatch(show.Parameters)
		if err != nil {
			return stepAnswer{}, fmt.Errorf("POST /api/show %q: %w", m, err)
		}
		if n > 0 {
			set = true
		} else {
			n = endpoint.EngineStepTokens("ollama")
		}
		switch {
		case shared == -1:
			shared = n
		case shared != n:
			return stepAnswer{0, fmt.Sprintf("POST /api/show: the models' num_batch differ (%d, %d)", shared, n)}, nil
		}
	}
	if !set {
		return stepAnswer{0, "POST /api/show: no model sets num_batch"}, nil
	}
	return stepAnswer{shared, fmt.Sprintf("POST /api/show: num_batch %d", shared)}, nil
}

// numBatch reads num_batch from an ollama model's parameters text ("num_batch   1024" a
// line); 0 when it is not there.
func numBatch(params *string) (int, error) {
	if params == nil {
		return 0, nil
	}
	for line := range strings.Lines(*params) {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != "num_batch" {
			continue
		}
		if len(f) != 2 {
			return 0, fmt.Errorf("%w: %.60q", errNoStepReport, line)
		}
		n, err := strconv.Atoi(f[1])
		if err != nil || n < 1 || n > maxStepTokens {
			return 0, fmt.Errorf("%w: num_batch %.40q", errNoStepReport, f[1])
		}
		return n, nil
	}
	return 0, nil
}
