package scrape

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Detection is what an endpoint's answers say about its engine kind.
type Detection struct {
	// Kind is vllm, sglang, tgi, llamacpp, ollama, or openai for a server that speaks the
	// OpenAI API and shows nothing more specific.
	Kind string `json:"kind"`
	// Evidence is the answer that decided, for logs and /debug/endpoints.
	Evidence string `json:"evidence"`
}

// statusError is a non-2xx answer: the server is there and speaks HTTP, but not this path.
type statusError struct {
	method string // lower case, as in the error's text
	url    string
	code   int
	body   string
}

func (e *statusError) Error() string {
	return fmt.Sprintf("%s %s: status %d: %s", e.method, e.url, e.code, e.body)
}

// clientError reports whether err is a 4xx answer (a path the server does not have), as
// opposed to a 5xx or a connection error, which say nothing about the engine kind.
func clientError(err error) bool {
	var se *statusError
	return errors.As(err, &se) && se.code >= 400 && se.code < 500
}

// metricKinds are the engines told apart by the names of their Prometheus metrics, the most
// specific sign there is: each prefixes every name it exports. In a fixed order, so that a
// page with names of two engines gives the same answer every time.
func metricKinds() []string { return []string{"vllm", "sglang", "llamacpp", "tgi"} }

// metricPrefix returns the prefix of an engine kind's metric names.
func metricPrefix(kind string) string {
	if kind == "tgi" {
		return "tgi_"
	}
	return kind + ":"
}

// Detect asks the server at base what engine it is, cheapest and most specific sign first:
//
//  1. GET /metrics: vllm:, sglang:, llamacpp: or tgi_ names (vLLM and TGI always export them,
//     SGLang and llama.cpp when started with metrics on);
//  2. GET /api/version answering {"version": ...}: ollama (which has neither /metrics nor
//     /health);
//  3. GET /health answering llama.cpp's {"status":"ok"}, or its 503 "Loading model" while the
//     model loads;
//  4. GET /v1/models: owned_by vllm, sglang or llamacpp; any other model list is a generic
//     OpenAI server (openai).
//
// Each GET is bounded by the health timeout. It returns an error naming what each probe got
// when none of them decides (the server is down, or is no OpenAI server at all).
func (p *Prober) Detect(ctx context.Context, base string) (Detection, error) {
	o := p.options()
	var tried []string
	probe := func(path string, limit int64, read func(io.Reader) error) error {
		ctx, cancel := context.WithTimeout(ctx, o.HealthTimeout)
		defer cancel()
		err := p.get(ctx, base+path, limit, read)
		if err != nil {
			tried = append(tried, err.Error())
		}
		return err
	}

	var kind string
	if probe("/metrics", o.MaxMetricsBytes, func(r io.Reader) error {
		tp := expfmt.NewTextParser(model.UTF8Validation)
		fams, err := tp.TextToMetricFamilies(r)
		if err != nil {
			return fmt.Errorf("not Prometheus text: %w", err)
		}
		for _, k := range metricKinds() {
			for name := range fams {
				if strings.HasPrefix(name, metricPrefix(k)) {
					kind = k
					return nil
				}
			}
		}
		return errors.New("no metric name of a known engine")
	}) == nil {
		return Detection{kind, fmt.Sprintf("GET /metrics exports %s* metrics", metricPrefix(kind))}, nil
	}

	var version struct {
		Version *string `json:"version"`
	}
	if probe("/api/version", 64<<10, jsonInto(&version, func() bool { return version.Version != nil })) == nil {
		return Detection{"ollama", fmt.Sprintf("GET /api/version answers version %q", *version.Version)}, nil
	}

	var health struct {
		Status string `json:"status"`
	}
	err := probe("/health", 64<<10, jsonInto(&health, func() bool { return health.Status == "ok" }))
	var se *statusError
	switch {
	case err == nil:
		return Detection{"llamacpp", `GET /health answers {"status":"ok"}`}, nil
	case errors.As(err, &se) && se.code == http.StatusServiceUnavailable && strings.Contains(se.body, "Loading model"):
		return Detection{"llamacpp", `GET /health answers 503 "Loading model"`}, nil
	}

	var models struct {
		Object *string `json:"object"`
		Data   []struct {
			OwnedBy string `json:"owned_by"`
		} `json:"data"`
	}
	if probe("/v1/models", 1<<20, jsonInto(&models, func() bool { return models.Object != nil || models.Data != nil })) == nil {
		for _, m := range models.Data {
			switch m.OwnedBy {
			case "vllm", "sglang", "llamacpp":
				return Detection{m.OwnedBy, fmt.Sprintf("GET /v1/models lists models owned_by %q", m.OwnedBy)}, nil
			}
		}
		return Detection{"openai", "GET /v1/models answers a model list and nothing names a known engine"}, nil
	}
	return Detection{}, fmt.Errorf("no answer tells the engine kind: %s", strings.Join(tried, "; "))
}

// jsonInto returns a reader that decodes one JSON value into v and asks ok whether it has
// what was looked for.
func jsonInto(v any, ok func() bool) func(io.Reader) error {
	return func(r io.Reader) error {
		if err := json.NewDecoder(r).Decode(v); err != nil {
			return fmt.Errorf("not JSON: %w", err)
		}
		if !ok() {
			return errors.New("not the expected fields")
		}
		return nil
	}
}
