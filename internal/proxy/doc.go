// Package proxy is the router's data plane, a library in the manner of net/http/httputil: an
// http.Handler that speaks the OpenAI API to clients and forwards each request to the endpoint
// its policy ranks first, falling back along the ranked list where that is safe. What it is
// wired to (the endpoint pool, the policy's lifecycle, the tenant gate, metrics) comes in its
// fields; internal/app assembles it from a config.
//
// One request goes, as plain calls: authenticate (tenant.Gate) -> read the body once (bounded;
// a body announced too large is refused unread) -> parse the fields we route on -> routing
// keys (route.Keys: canonical prompt, normalised, chained block hashes) -> the tenant's limits
// -> candidate endpoints for the model (and tenant) -> admission -> route.Lifecycle.Begin
// (policy.Pick) -> httputil.ReverseProxy, whose transport walks the ranked list through the
// lifecycle (connection errors and 503s) -> SSE passed through event by event, the first token
// and usage seen as they pass, the stream's end noticed -> route.Call.Finish (endpoint
// counters, the policy's Done), the tenant's ticket, metrics, one access log line.
//
// The steps that do not depend on HTTP (authentication, parse to pick, reading the answer's
// events, settling) are in exchange.go; Exchange exports them to the other front end, the
// Envoy ext_proc endpoint picker (internal/extproc), so that both run the same code.
package proxy
