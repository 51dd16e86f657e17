// Package prefix turns prompts into routing keys and remembers where they went: prompt
// normalisation, a tokenizer-free token estimate, chunking into fixed-size blocks with chained
// 64-bit hashes seeded with the model and the tenant's salt, and the approximate index of which
// endpoint probably still holds which blocks. It imports neither net/http nor Prometheus.
//
// Block keys are xxHash64 (github.com/cespare/xxhash/v2), but the two inputs hashed most, a
// 16-token block's 64 bytes and Next's 16, are hashed by our own Go (blockhash.go), which the
// compiler compiles into the chain's loop: a 100k-token prompt is 6,250 blocks and 12,500 calls
// of the library's assembly, whose call and setup cost more than the hashing of so few bytes.
// `go test -c -o prefix.test ./internal/prefix` then `./prefix.test -test.run XXX -test.bench
// 'Chunk/bytes=131072' -test.benchtime 2000x`, the library's build and ours alternating, three
// runs each (5 December 2026): 44.7-65.8 µs per 128 KB before, 30.9-35.5 µs after. The results
// are the library's, bit for bit (TestBlockHash, FuzzBlockHash); everything else (the chains'
// digests, other block sizes) still uses the library.
package prefix
