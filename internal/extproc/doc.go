// Package extproc is kvroute as the endpoint picker of the Kubernetes Gateway API Inference
// Extension: an Envoy external processing (ext_proc v3) gRPC server. Envoy carries the
// request; kvroute reads its headers and body, picks, and tells Envoy where to send it, with
// the same steps as `kvroute serve` (internal/proxy's Exchange: tenant gate, routing keys,
// admission, route.Lifecycle) on the same pool, policy and gate.
//
// One ext_proc stream is one HTTP request. Envoy sends, in order, the request headers, the
// request body (whole in BUFFERED mode, in chunks with end_of_stream on the last in
// FULL_DUPLEX_STREAMED mode), then the response headers and the response body. kvroute answers:
//
//   - with the pick, once the whole body is in: header x-gateway-destination-endpoint and
//     dynamic metadata envoy.lb/x-gateway-destination-endpoint, both "ip:port,ip:port,..."
//     (the ranked list: first choice, then the fallbacks Envoy may retry on), in the response
//     to the request headers (FULL_DUPLEX_STREAMED: deferred until the body's end, the body
//     then streamed back) or to the request body (BUFFERED);
//   - with an ImmediateResponse carrying an OpenAI error body when the request is refused:
//     401, 404, 413, 429 (tenant limits, and requests shed because the fleet is overloaded,
//     which `kvroute serve` answers with 503), 503 (no eligible endpoint), 400 for a malformed
//     body, 500 for messages out of the protocol's order;
//   - to the response headers and body by passing them on (streams event by event, the
//     usage the router asked for left out: the usage-only chunk, and the usage member of
//     other chunks), learning the first token time (the first event other than a comment),
//     the usage and the cached tokens, and, from envoy.lb/x-gateway-destination-endpoint-served
//     and Envoy's attempt count, which endpoint answered and which of the list Envoy tried
//     before it, and, from response.code_details and response.flags, whether the answer is
//     Envoy's own, and what it says of the attempt (stream.follow: an answer from an address
//     kvroute did not pick, or Envoy's own, is no endpoint's, Exchange.AnsweredElsewhere; an
//     attempt Envoy made before its last failed for a reason it does not tell, route.FailUnknown);
//     an answer whose head comes before the pick (Envoy's own while the body was coming: a
//     408, a 413) is passed on unread and settled as a refusal before the pick
//     (stream.unroutedHead);
//     an engine's Retry-After is written again as `kvroute serve` writes it. A stream is read
//     as `kvroute serve` reads it (stream.event): an event the stream ended inside, and what
//     follows the terminator, are neither read nor passed on, and a cut stream ends with
//     serve's stream_cut error event. A stream that the engine ended without its terminator,
//     cut, or failed with an error event is settled as `kvroute serve` settles it
//     (stream.finishAnswer). So is a 2xx to a stream request under another Content-Type
//     (text/plain, application/json) whose first bytes are events (stream.decide): read as
//     it passes, passed on as it came, and settled as serve settles such a stream
//     (stream.otherEvents).
//
// The endpoint subset hint (filter metadata envoy.lb.subset_hint /
// x-gateway-destination-endpoint-subset) narrows the candidates. The end of the stream ends the
// request: a client that went away does not count against its endpoint (but for one that left
// a stalled engine before its first token, as in `kvroute serve`). Serve shuts down as `kvroute
// serve` does: health not serving at once (liveness excepted), new streams taken for a drain
// delay, then a drain, and the streams still open at its end answered 503 shutting_down and
// settled so.
// docs/kubernetes.md ("Endpoint-picker mode") says how to configure Envoy.
package extproc
