// Package e2e holds the end-to-end tests: the router (built as `kvroute serve` builds it) in
// front of simulated vLLM instances, driven by the official openai npm client (client.mjs,
// installed by `npm ci` in this directory, which make test runs) and by Go clients. Tests that
// need node skip when node or node_modules is missing.
package e2e
