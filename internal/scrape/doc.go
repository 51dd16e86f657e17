// Package scrape watches the engines behind the router: it parses their Prometheus metrics
// (vLLM, SGLang, TGI and llama.cpp names) into an endpoint.Snapshot with its age, and its Prober
// runs each endpoint's health check and metrics scrape on an interval, with thresholds, plus
// passive ejection after consecutive connection errors reported by the proxy. Where an engine
// says its step budget under chunked prefill (SGLang, ollama), the prober asks for it once per
// contact and records it on the endpoint.
package scrape
