// Package realengine is the real-engine suite: kvroute in front of a real inference engine with
// a real KV cache, on a CPU, with nothing downloaded at test time. ollama (built from its Go
// module by scripts/ollama.sh; llama.cpp's kernels, prefix reuse across its parallel slots)
// serves a tiny random-weight llama written by internal/gguf; three instances sit behind
// `kvroute serve`, and `kvroute bench` sends a shared-prefix workload through it, once per
// policy, on fresh engines each time. TestRealEngineReplicas sends the same workload through
// one router, three replicas that share what they learn (peers:) behind HAProxy round-robin,
// and the same three without peers:, and checks the synced replicas' engine hits against one
// router's (docs/replicas.md, "On a real engine"; it skips where haproxy is not on PATH).
//
// The tests skip unless KVROUTE_OLLAMA names the ollama binary:
//
//	KVROUTE_OLLAMA=$(bash scripts/ollama.sh) go test -count=1 -v ./test/realengine/
//
// (`make realengine` does that; .ci/run runs it after `make test`). KVROUTE_REALENGINE_OUT,
// when set, names a folder that receives the figures as JSON and every process's log.
package realengine
