// Package peer connects router replicas so that each knows what the others route: every
// replica's lifecycle events (route.Event: an attempt routed, its first token, its end, an
// endpoint removed) reach the others within milliseconds and are replayed there
// (route.Lifecycle.Apply), so that every replica's policy sees the whole fleet's traffic; a new
// replica starts from a running one's snapshot (the policy's index and the requests in
// flight) before it reports ready.
//
// Proven parts, nothing invented but the message schema: hashicorp/memberlist (SWIM gossip,
// as Consul, Loki, Mimir and Tempo use it) finds the replicas and detects failures; each
// replica streams its events to every peer that asks, as one long HTTP response (net/http;
// HTTP/1.1 chunked, which cost less CPU than an h2c stream when measured: docs/replicas.md)
// in batches encoded with msgpack; every message carries an HMAC-SHA256 under a key derived
// from the shared secret, the receiver's nonce and a sequence number, so that a forged, cut,
// replayed or oversized message is refused and counted, never applied. Peers are found as
// endpoints are (a static list, DNS names; Source is the seam for Kubernetes).
//
// Nothing here is on a request's path but Node.Publish, which encodes an event into the
// pending batch and never blocks: queues are bounded and what does not fit is dropped and
// counted (the peer's stream is then restarted, and it reconciles what is in flight). A peer
// that is down, slow, partitioned, of another version or sending garbage costs no request: the
// replica routes on what it knows and converges again when the peer returns.
package peer
