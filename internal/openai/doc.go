// Package openai holds what the router needs of the OpenAI HTTP API: the request fields it
// reads (model, messages, prompt, input, stream, user, cache_salt, prompt_cache_key,
// previous_response_id, ...), the canonical prompt text the router hashes into prefix blocks,
// in-place patching of a request body that keeps every field the router does not know, the
// error body every client understands, the usage object, and an incremental, bounded reader
// and a writer of server-sent events.
//
// Bodies come from untrusted clients and engines: every parser here returns an error, never
// panics, and bounds what it buffers.
//
// Hand-written JSON, and why. encoding/json decides every error and every unusual body; the
// usual ones are read by hand, because encoding/json's cost per request was most of the
// router's own (each is fuzzed against encoding/json's answer):
//   - request bodies, one pass that decodes only what is routed on (scanBody, FuzzScanChat): a
//     4 KB chat 5.0 µs against 20.4 (2.3 to 3.5 since contents are views); at 100k tokens (docs/results.md, "Other shapes of a long
//     request") a completion prompt 0.2 ms against 3.4 to 3.9, an agent's session of 550
//     messages with tool calls 0.4 to 0.6 ms against 1.1 to 1.6 (as text parts 5.1 to 6.7, as
//     Responses input items 7.6 to 8.8), a 2 MB image part 0.8 to 1.1 ms against 32 to 36;
//   - usage in responses and stream chunks (ScanUsage, FuzzScanUsage): a token's chunk 0.7 µs
//     and no allocation against 5.7 µs and 12; a Responses answer's id and usage (ResponseID,
//     FuzzEngineBodies): 4 to 8 µs against 93 to 132 for 4,000 tokens;
//   - the tool list's compaction (compact, FuzzCompact): 40 tools in 36 KB parsed in 46 to 58 µs
//     against 193 to 213 with json.Compact.
package openai
