// Package kvevents is vLLM's KV-cache event wire format and its ZMQ transport: an engine tells
// whoever listens which prefix-cache blocks it stored and removed, so that a router can keep an
// exact picture of each engine's cache instead of guessing.
//
// A message is three ZMQ frames, [topic, sequence number (8 bytes, big-endian), msgpack batch].
// A batch is [ts, events] or [ts, events, data_parallel_rank]; each event is tagged by its class
// name, either as an array ["BlockStored", hashes, parent, token_ids, block_size, lora_id,
// medium, ...] (what vLLM sends) or as a map with a "type" key (what some newer senders use).
// The encoder writes the array form; the decoder reads both and ignores extra trailing fields.
//
// A Publisher sends batches on a PUB socket and keeps the last ones for a ROUTER replay socket
// that answers [identity, "", start_seq] with every buffered message from start_seq on and an
// end marker of sequence -1. Subscriber and Replay are the client side, for routers and tests.
package kvevents
