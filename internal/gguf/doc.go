// Package gguf writes GGUF files (version 3: the model format of llama.cpp and ollama) and
// builds one model in it: a tiny llama with random weights and a byte-level BPE vocabulary in
// which chosen words are single tokens. That model lets the real-engine suite (test/realengine)
// put a real inference engine, with a real KV cache, behind kvroute on a CPU without
// downloading anything: its outputs are noise, its timings and cache behaviour are real.
package gguf
