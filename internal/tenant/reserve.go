package tenant

import "math"

// Demand is what one request may cost its tenant's tokens per minute, as the proxy reads it
// from the request before any engine has seen it (Gate.Take).
type Demand struct {
	// Prompt is the router's estimate of the request's prompt tokens, all its prompts.
	Prompt int
	// Seqs is how many sequences an engine generates for the request: for each of its prompts,
	// n choices, or best_of where that is more. 0: none (embeddings).
	Seqs int
	// MaxTokens bounds each sequence's completion tokens (max_tokens, max_completion_tokens,
	// max_output_tokens); 0: the request sets no bound.
	MaxTokens int
	// MaxTokensField is the body member MaxTokens was read from, for the tenant's
	// max_output_tokens: a request that names one is held to the cap, at least 1 and at most
	// the cap (a value below 1 is an engine's "no bound" for some: llama.cpp and ollama read
	// -1 as generate until the context is full). "": the request names none; MaxTokens 0 then
	// reserves the cap, which the caller writes into the body.
	MaxTokensField string
}

// What the token bucket reserves for a request's completion (limiter.reserve): the completion
// is charged when the request ends, and a reservation of its prompt alone let a tenant start
// as many long answers at once as it liked (against kvroute sim, 8 requests of max_tokens
// 4000, admitted together against a limit of 10,000 tokens a minute, generated 32,000 tokens
// in 3.2 s).
const (
	// MinReservedCompletion is the least completion reserved for each sequence of a request
	// that sets no max_tokens, whose engine may generate up to the model's context (which the
	// router does not know): what the tenant's answers have had (limiter.learn), at least this.
	MinReservedCompletion = 1024
	// expectDecay is how fast a tenant's expected completion comes down to shorter answers:
	// each answer shorter than it takes it this share of the way (about the last 20 answers
	// count); a longer answer raises it at once.
	expectDecay = 0.05
)

// reserve returns what a request of demand d takes from the token bucket at admission, whole
// tokens: its prompt's estimate and, for each sequence, its max_tokens, as hosted APIs count it
// (OpenAI and Azure OpenAI take a request's max_tokens from its tokens per minute when it
// arrives), or, without one, the completion the tenant's complete answers have had (learn: the
// longest of the recent ones, decaying slowly), at least MinReservedCompletion. Not the learnt
// completion where max_tokens is more than it: one short answer would then let the tenant's
// next requests reserve next to nothing, whatever they may generate (so reserving, a tenant of
// 10,000 tokens a minute that had had one answer of 10 tokens got 8 requests of max_tokens 4000
// admitted at once). The whole is at most the tenant's limit: a request whose completion
// alone may exceed a minute's tokens waits for a full bucket rather than never running (a
// prompt over the limit is refused before). The caller holds l.mu and has checked that the
// bucket has a limit.
func (l *limiter) reserve(d Demand) (total, completion int) {
	if d.Seqs > 0 {
		per := float64(d.MaxTokens)
		if d.MaxTokens <= 0 {
			per = max(MinReservedCompletion, l.expected)
		}
		completion = int(min(math.Ceil(per*float64(d.Seqs)), float64(math.MaxInt32)))
	}
	total = int(min(float64(d.Prompt)+float64(completion), l.tok.limit))
	return total, max(total-d.Prompt, 0)
}

// learn folds a complete answer's completion tokens per sequence into the tenant's expected
// completion, what its requests without max_tokens reserve: a longer answer sets it, a shorter
// one brings it down by expectDecay of the difference. A peak that decays rather than a mean:
// the reservation errs on the side of the answers the tenant can have. The caller holds l.mu.
func (l *limiter) learn(perSeq float64) {
	if !(perSeq >= 0) {
		return // NaN too
	}
	if !l.tok.unlimited() {
		// More than a minute's tokens reserves the whole limit all the same (reserve), and
		// would only take longer to come down from: one answer whose engine said 9e18 made
		// every later request without max_tokens reserve the whole limit for some 700 answers.
		perSeq = min(perSeq, l.tok.limit)
	}
	if perSeq >= l.expected {
		l.expected = perSeq
		return
	}
	l.expected += expectDecay * (perSeq - l.expected)
}

// Learn tells the tenant's expected completion (what Take reserves for the completions of its
// next requests that set no max_tokens) what an answer read to its end generated: its engine's
// completion tokens per sequence it returned. Call it before End, only for a complete answer
// with the engine's usage: a cut one says less than its request would have had.
func (t *Ticket) Learn(perSeq float64) {
	if t == nil || t.ended.Load() {
		return
	}
	t.s.mu.Lock()
	t.s.learn(perSeq)
	t.s.mu.Unlock()
}
