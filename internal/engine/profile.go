package engine

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Profile is a model on a hardware setup: its KV capacity, its scheduler limits and the step-time
// constants. The time of one batch step is
//
//	StepOverhead
//	+ prefill tokens x PrefillPerToken
//	+ attention pairs / 1e6 x AttentionPerMPairs
//	+ decode sequences x DecodePerSeq
//	+ decode context tokens x DecodePerCtxToken
//
// where a prefill chunk of c tokens that starts after s tokens already in the KV cache counts
// c*s + c*(c+1)/2 attention pairs (each new token attends to every earlier one and itself), so a
// prompt's attention cost is the same however it is chunked, and a decode's context is the number
// of tokens it attends to.
type Profile struct {
	Name, Description string
	// BlockSize is the number of tokens in one KV block; NumBlocks the number of blocks.
	BlockSize, NumBlocks int
	// MaxNumSeqs bounds the running requests (vLLM max_num_seqs); MaxBatchedTokens the tokens
	// computed in one step (vLLM max_num_batched_tokens with chunked prefill).
	MaxNumSeqs, MaxBatchedTokens int
	// CacheSlots, when above 0, makes the KV cache that many sequence slots instead of a block
	// cache: each slot holds the whole of one sequence (prompt and output) in NumBlocks /
	// CacheSlots blocks, a request takes the free slot holding the longest prefix of its prompt
	// or else the one loaded least recently with that prefix copied in, and a shared prefix is
	// stored once per slot that uses it (ollama's cache; slots.go has the rule). It must be at
	// least MaxNumSeqs. 0 is a block cache (vLLM's).
	CacheSlots int

	// StepOverhead is the fixed cost of every step: reading the weights once from HBM plus kernel
	// launches and tensor-parallel all-reduces. It is the inter-token latency of a lone decode.
	StepOverhead time.Duration
	// PrefillPerToken is the linear (non-attention) cost of one prefill token: the dense FLOPs of
	// the weight matrices at the achieved utilisation.
	PrefillPerToken time.Duration
	// AttentionPerMPairs is the cost of one million (new token, context token) attention pairs
	// during prefill: the n^2 term of the prefill FLOPs.
	AttentionPerMPairs time.Duration
	// DecodePerSeq is the linear cost of one decode token (one sequence in the batch).
	DecodePerSeq time.Duration
	// DecodePerCtxToken is the cost of reading one context token's KV during decode (HBM bound).
	DecodePerCtxToken time.Duration
}

// KVTokens is the KV capacity in tokens: BlockSize * NumBlocks.
func (p Profile) KVTokens() int { return p.BlockSize * p.NumBlocks }

// WithBlockSize returns p with blocks of blockSize tokens and as many blocks as keep its KV
// capacity (rounded down). A simulator replaying a trace whose prompts are only known in
// coarse blocks (the Mooncake trace: 512 tokens) loses little by using that block size (a hit
// ends where the trace's content does anyway; only a fully cached prompt recomputes up to a
// block, and a partial last block wastes more KV), while the engine's work per request falls
// with the block count: on the whole Mooncake trace over
// 8 engines, 512-token blocks gave the same hit rate (0.106 vs 0.107) and TTFT (mean 1.181 s
// vs 1.179 s, p99 equal) as 16-token blocks in a twentieth of the time. A blockSize below 1
// returns p unchanged.
func (p Profile) WithBlockSize(blockSize int) Profile {
	if blockSize < 1 || p.BlockSize < 1 {
		return p
	}
	p.NumBlocks = p.KVTokens() / blockSize
	p.BlockSize = blockSize
	return p
}

// UnloadedTTFT is the time to first token of a lone request of promptTokens tokens, of which
// cachedTokens are already in the prefix cache, on an idle engine configured with p: exactly what
// Engine.Step produces for it. The cached tokens are capped the way the engine caps a hit (at
// most promptTokens-1, whole blocks only), and the prompt is computed in chunks of
// MaxBatchedTokens, one step each. It returns 0 for promptTokens < 1.
func (p Profile) UnloadedTTFT(promptTokens, cachedTokens int) time.Duration {
	if promptTokens < 1 || p.MaxBatchedTokens < 1 || p.BlockSize < 1 {
		return 0
	}
	hit := capHit(cachedTokens, promptTokens, p.BlockSize)
	var total time.Duration
	done := hit
	for done < promptTokens {
		c := min(promptTokens-done, p.MaxBatchedTokens)
		total += p.stepTime(int64(c), attentionPairs(done, c), 0, 0)
		done += c
	}
	return total
}

// capHit applies the engine's hit rules to a cached-token count: never negative, at most
// prompt-1 tokens (the last prompt token is always computed), whole blocks only.
func capHit(cached, prompt, blockSize int) int {
	cached = min(max(cached, 0), prompt-1)
	return cached / blockSize * blockSize
}

// attentionPairs counts the (new token, context token) pairs of a prefill chunk of c tokens that
// starts after s tokens: sum over i in 1..c of s+i.
func attentionPairs(s, c int) int64 {
	return int64(c)*int64(s) + int64(c)*int64(c+1)/2
}

// stepTime is the duration of one step computing prefillTokens prefill tokens with pairs
// attention pairs and decodeSeqs decodes attending to decodeCtx context tokens in all.
func (p Profile) stepTime(prefillTokens, pairs, decodeSeqs, decodeCtx int64) time.Duration {
	// Kept as separate statements so that no fused multiply-add can make two calls with the
	// same arguments differ.
	attn := float64(pairs) * float64(p.AttentionPerMPairs)
	attn /= 1e6
	return p.StepOverhead +
		time.Duration(prefillTokens)*p.PrefillPerToken +
		time.Duration(attn) +
		time.Duration(decodeSeqs)*p.DecodePerSeq +
		time.Duration(decodeCtx)*p.DecodePerCtxToken
}

// Calibration (REFERENCE.md section 2, Llama 3.1 70B): dense prefill costs about 1.18e11 FLOP
// per token (Mooncake Eq. 1, l=80, d=8192, b=22) and attention about 2.6e6 FLOP per n^2
// (a=4); 8 x H100/H200 at 40-50 % MFU gives 25-33k prefill tokens/s. The published unloaded
// TTFT ranges for TP8 are 2k: 65-80 ms, 8k: 0.3-0.4 s, 32k: 1.7-2.1 s; with chunks of 8192
// tokens (a 32k prompt takes four steps) the constants below give about 77 ms, 0.31 s and
// 1.82 s (the calibration test checks them). Decode reads the weights once per step (a 4 ms
// floor on 8 x H200) but measured small-batch inter-token latency is 12-25 ms, so the step
// overhead is 12 ms; each context token's KV (320 KiB / 8 GPUs) costs about 12 ns to read.
func profiles() []Profile {
	return []Profile{
		{
			Name:        "instant",
			Description: "zero compute time, 4M tokens of KV: for proxy-overhead tests",
			BlockSize:   16, NumBlocks: 1 << 18,
			MaxNumSeqs: 1024, MaxBatchedTokens: 1 << 20,
		},
		{
			// As instant, but every step takes 100 ms (scaled by --time-scale): a request's
			// first token comes one or two steps after it arrives and each later token a step
			// after the one before, as from a real engine, while simulating it costs no more CPU
			// than instant (fewer steps, each for the whole batch). TestSyncOverhead uses it to
			// measure replica sync on requests that span several of its batches.
			Name:        "fixed-step",
			Description: "every step 100 ms whatever its batch, 4M tokens of KV: for overhead tests with requests that last",
			BlockSize:   16, NumBlocks: 1 << 18,
			MaxNumSeqs: 1024, MaxBatchedTokens: 1 << 20,
			StepOverhead: 100 * time.Millisecond,
		},
		{
			// KV measured with vLLM (llm-d 37-capacity): 461,376 tokens = 28,836 blocks of 16.
			// Half the GPUs of TP8: every compute term doubles; the weights floor is 141 GB /
			// 4 GPUs / 3.35 TB/s = 10.5 ms, so 16 ms of overhead; KV reads 80 KiB per GPU per
			// token, about 24 ns. Unloaded TTFT about 0.15 s / 0.61 s / 3.6 s at 2k / 8k / 32k.
			Name:        "llama3-70b-h100-tp4",
			Description: "Llama 3.1 70B on 4 x H100 (TP4), 461,376 KV tokens",
			BlockSize:   16, NumBlocks: 28836,
			MaxNumSeqs: 256, MaxBatchedTokens: 8192,
			StepOverhead:       16 * time.Millisecond,
			PrefillPerToken:    61 * time.Microsecond,
			AttentionPerMPairs: 2880 * time.Microsecond,
			DecodePerSeq:       60 * time.Microsecond,
			DecodePerCtxToken:  24 * time.Nanosecond,
		},
		{
			// Fitted to the real-engine suite's engine (test/realengine, docs/fidelity.md):
			// ollama v0.17.4 on one CPU thread of the project's 2-core machines, serving the
			// tiny random-weight llama of internal/gguf. Token counts are the workload's (4
			// bytes of text; the engine's tokenizer makes 0.677 of its tokens of one), so a
			// workload runs on it unchanged. Least squares over 64 lone requests of four
			// calibration rounds on an idle machine (load average under 1; fits made at load 5
			// put every cold prefill 20-30 % too slow): prefill 30.5 us per token plus 192 ms
			// per million attention pairs (cold 1,792 tokens about 0.36 s, 2,560 tokens about
			// 0.72 s), decode 0.72 ms per sequence plus 262 ns per context token; no step
			// overhead (a CPU step has no launches or all-reduce); the 18 ms each request
			// spends outside the engine's steps (HTTP, chat template, tokenizer) is kvroute
			// simulate --network-latency 9ms. Scheduler: OLLAMA_NUM_PARALLEL=4 sequences, a batch of 512 engine tokens
			// (756 workload tokens). Cache: ollama keeps sequences, not blocks: 4 slots
			// (OLLAMA_NUM_PARALLEL), each one sequence of up to num_ctx 4,096 engine tokens
			// (6,048 workload tokens, 378 blocks), a shared prefix copied into every slot that
			// uses it and a slot reused whole, least recently used first (CacheSlots; a block
			// cache of four sequences' tokens kept one copy of a prefix where ollama keeps
			// several, and put prefix-aware's hit rate 0.06-0.07 above the real one).
			Name:        "ollama-tiny-cpu",
			Description: "ollama v0.17.4 on one CPU thread, tiny random llama (test/realengine): 4 sequence slots of 6,048 tokens",
			BlockSize:   16, NumBlocks: 4 * 378, CacheSlots: 4,
			MaxNumSeqs: 4, MaxBatchedTokens: 756,
			PrefillPerToken:    30500 * time.Nanosecond,
			AttentionPerMPairs: 192 * time.Millisecond,
			DecodePerSeq:       715 * time.Microsecond,
			DecodePerCtxToken:  262 * time.Nanosecond,
		},
		{
			// About 2.5M KV tokens: 8 x 141 GB at 0.9 utilisation minus 141 GB of weights and
			// activations, at 320 KiB per token: 156,250 blocks of 16.
			Name:        "llama3-70b-h200-tp8",
			Description: "Llama 3.1 70B on 8 x H200 (TP8), 2.5M KV tokens",
			BlockSize:   16, NumBlocks: 156250,
			MaxNumSeqs: 256, MaxBatchedTokens: 8192,
			StepOverhead:       12 * time.Millisecond,
			PrefillPerToken:    30480 * time.Nanosecond,
			AttentionPerMPairs: 1440 * time.Microsecond,
			DecodePerSeq:       30 * time.Microsecond,
			DecodePerCtxToken:  12 * time.Nanosecond,
		},
		{
			// Derived from the same FLOP model: 8B has l=32, d=4096, so 1.18e10 dense FLOP per
			// token on one GPU (about the 70B's per-GPU share on TP8: 1.47e10) and an attention
			// term per GPU 1.6 x the 70B TP8 one; one H100 at 45 % MFU gives 26.5 us per token.
			// Weights 16 GB / 3.35 TB/s = 4.8 ms, so 7 ms of overhead; KV 128 KiB per token
			// (32 layers x 8 heads x 128 x 2 x 2 B), 39 ns to read; 80 GB x 0.9 - 16 GB of
			// weights - activations leaves about 400,000 tokens = 25,000 blocks.
			Name:        "llama3-8b-h100-tp1",
			Description: "Llama 3.1 8B on 1 x H100, 400k KV tokens",
			BlockSize:   16, NumBlocks: 25000,
			MaxNumSeqs: 256, MaxBatchedTokens: 8192,
			StepOverhead:       7 * time.Millisecond,
			PrefillPerToken:    26500 * time.Nanosecond,
			AttentionPerMPairs: 2360 * time.Microsecond,
			DecodePerSeq:       27 * time.Microsecond,
			DecodePerCtxToken:  40 * time.Nanosecond,
		},
	}
}

// Profiles returns the built-in profiles, sorted by name. The slice is the caller's.
func Profiles() []Profile {
	ps := profiles()
	slices.SortFunc(ps, func(a, b Profile) int { return strings.Compare(a.Name, b.Name) })
	return ps
}

// LookupProfile returns the built-in profile called name, or an error listing the valid names.
func LookupProfile(name string) (Profile, error) {
	ps := Profiles()
	names := make([]string, 0, len(ps))
	for _, p := range ps {
		if p.Name == name {
			return p, nil
		}
		names = append(names, p.Name)
	}
	return Profile{}, fmt.Errorf("engine: unknown profile %q: use one of %s", name, strings.Join(names, ", "))
}
