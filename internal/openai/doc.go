// Package openai holds what the router needs of the OpenAI HTTP API: the request fields it
// reads (model, messages, prompt, input, stream, user, cache_salt, prompt_cache_key,
// previous_response_id, ...), the canonical prompt text the router hashes into prefix blocks,
// in-place patching of a request body that keeps every field the router does not know, the
// error body every client understands, the usage object, and an incremental, bounded reader
// and a writer of server-sent events.
//
// Bodies come from untrusted clients and engines: every parser here returns an error, never
// panics, and bounds what it buffers.
package openai
