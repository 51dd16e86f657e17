// Package proxy is the router itself: an http.Handler that speaks the OpenAI API to clients
// and forwards each request to the endpoint its policy ranks first, and the Router that
// assembles it from a config (endpoint pool, policy, metrics, admin endpoints) and applies new
// configs to a running router.
//
// One request goes: read the body once (bounded) -> parse the fields we route on -> candidate
// endpoints for the model (and tenant) -> canonical prompt text -> normalise -> prefix blocks
// -> policy.Pick -> httputil.ReverseProxy, whose transport walks the ranked list on connection
// errors and 503s -> SSE passed through event by event, TTFT measured at the first event,
// usage read from the response -> policy.Observer, endpoint counters, metrics, one access log
// line.
package proxy
