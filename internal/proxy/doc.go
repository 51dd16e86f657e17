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
// (policy.Pick) -> the relay (relay.go), whose transport walks the ranked list through the
// lifecycle (connection errors and 503s) -> SSE passed through event by event, the first token
// and usage seen as they pass, the stream's end noticed -> route.Call.Finish (endpoint
// counters, the policy's Done), the tenant's ticket, metrics, one access log line.
//
// The relay replaces httputil.ReverseProxy, which did the same steps until December 2026, for
// a measured reason (docs/results.md, "Long contexts", 5 December 2026): for every streamed
// answer the reverse proxy armed a time.AfterFunc that flushed the response headers from the
// timer's own goroutine (a goroutine started, and a lock taken against the copy loop, per
// request), and its copy loop flushed each write on its own, so the chunked end left in a write
// of its own after the last events. The relay writes the headers with the first events and
// ends the body with the last ones: under strace (100k-token streamed requests from the
// instant simulator), one write to the client per request where there were two. What it
// leaves out of the reverse proxy is what the API paths do not use: protocol upgrades (101)
// and relaying 1xx answers. Hop-by-hop headers, forwarding headers, trailers and the
// ErrAbortHandler panic on a broken copy are kept as the reverse proxy had them.
//
// The steps that do not depend on HTTP (authentication, parse to pick, reading the answer's
// events, settling) are in exchange.go; Exchange exports them to the other front end, the
// Envoy ext_proc endpoint picker (internal/extproc), so that both run the same code.
package proxy
