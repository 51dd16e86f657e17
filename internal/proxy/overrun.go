package proxy

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"math"
	"net/http"
	"strconv"

	"github.com/kvroute/kvroute/internal/openai"
)

// An engine that ignores max_tokens (a bug, a server that is not what it says, an endless
// stream) would otherwise be relayed without end and its output charged to the tenant: the
// QA's endless engine sent a tenant with max_tokens 5 some 558 MB in 5 s, charged it 3.6
// million completion tokens, and locked it out for an hour. What a request was allowed bounds
// three things here: its charge (completionAllowed), a stream's content events (maxEvents) and
// a whole answer's bytes (maxAnswerBytes). Without max_tokens, and without a tenant's
// max_output_tokens (which the router writes into the body: prepare), none applies.

// completionAllowed is the most completion tokens the request allows its engine: max_tokens
// (or the tenant's max_output_tokens the router wrote into the body) for each sequence the
// engine generates; 0 where no bound is known (no max_tokens, or an embedding).
func (c *call) completionAllowed() int {
	if c.req == nil || c.req.MaxTokens <= 0 || c.req.Kind == openai.KindEmbedding {
		return 0
	}
	return clampTokens(float64(c.req.MaxTokens) * float64(max(c.seqs, 1)))
}

// maxEvents is how many content events (contentEvent) a stream may carry before it is cut as
// an engine's overrun; 0: no bound. Twice what the request allows and 16 more: an engine may
// send a token per event and, around them, events with a role, a tool call's name or a
// reasoning part that the count takes for content; one that sends several tokens an event
// sends fewer events. Twice max_tokens is past anything an engine that honours max_tokens
// sends.
func (c *call) maxEvents() int {
	allowed := c.completionAllowed()
	if allowed <= 0 {
		return 0
	}
	return int(min(2*float64(allowed)+16, math.MaxInt32))
}

// Bounds of a whole (not streamed) answer's bytes (maxAnswerBytes).
const (
	// answerBaseBytes is what an answer may hold besides its generated tokens: ids, the
	// usage, a finish reason, a tool call's frame.
	answerBaseBytes = 1 << 20
	// answerTokenBytes is what one generated token may take in an answer: its text escaped as
	// JSON (up to 6 bytes a byte) and its logprobs with 20 alternatives, each with its bytes
	// listed (OpenAI's top_logprobs at most), some 2 to 3 KB for ordinary tokens; 32 KiB
	// leaves room for the longest tokens of any vocabulary.
	answerTokenBytes = 32 << 10
)

// maxAnswerBytes is how many bytes a whole answer may have before it is taken for an engine
// that ignores max_tokens; 0: no bound. answerBaseBytes, the request's own body (a Responses
// API answer repeats the request's instructions and tools) and answerTokenBytes for each token
// allowed (completionAllowed). Not for a request that asks for its prompt back (echo) or its
// prompt's logprobs (vLLM's prompt_logprobs), whose answer grows with the prompt (asksPrompt).
func (c *call) maxAnswerBytes() int64 {
	allowed := c.completionAllowed()
	if allowed <= 0 || asksPrompt(c.body) {
		return 0
	}
	return int64(min(answerBaseBytes+float64(len(c.body))+answerTokenBytes*float64(allowed), math.MaxInt64/2))
}

// asksPrompt reports whether a request body asks for its prompt in the answer: a top-level
// echo that is not false, or a prompt_logprobs that is not null (vLLM's), found as an engine
// reads the body (names unescaped; each member where one is repeated). The names elsewhere (a
// property "echo" of a tool's schema, a prompt's text) ask nothing: they turned the bound off
// while any "echo" in the body did. A body without an escape is searched once, quote to quote,
// for either name (quoted), and read member by member only where one is.
func asksPrompt(body []byte) bool {
	if bytes.IndexByte(body, '\\') < 0 && !quoted(body, "echo", "prompt_logprobs") {
		return false
	}
	asks := false
	topLevel(body, func(key, v []byte) {
		switch string(key) {
		case "echo":
			asks = asks || string(v) != "false" && string(v) != "null"
		case "prompt_logprobs":
			asks = asks || string(v) != "null"
		}
	})
	return asks // a body topLevel cannot read the parser refused before
}

// errOverrun ends an attempt whose engine sent more than the request allows (an overrun).
var errOverrun = errors.New("the engine sent more than max_tokens allows")

// overrunMessage says to the client what the engine did: what it sent (what), and what the
// request allowed.
func (c *call) overrunMessage(what string) string {
	return "the engine ignored max_tokens (" + strconv.Itoa(c.req.MaxTokens) + " for " + count(max(c.seqs, 1), "sequence") +
		"): it sent " + what + "; the answer was cut there (request id " + c.rid + ")"
}

// overrun records that the engine sent more than the request allows (what says what it sent),
// logs it at WARN, and returns the error the client is told: a 502 upstream_bad_answer,
// counted against the endpoint as a bad answer is (the status settles it: failure).
func (c *call) overrun(what string) *openai.Error {
	c.overran = true
	c.errType, c.errCode = openai.TypeUpstream, codeBadAnswer
	name := ""
	if c.rc != nil {
		if ep := c.rc.Endpoint(); ep != nil {
			name = ep.Name
		}
	}
	c.h.Logger.LogAttrs(context.Background(), slog.LevelWarn, "the engine ignored max_tokens: its answer was cut, counted as a failure of the endpoint",
		slog.String("request_id", c.rid), slog.String("endpoint", name), slog.String("sent", what),
		slog.Int("max_tokens", c.req.MaxTokens), slog.Int("sequences", max(c.seqs, 1)))
	return openai.NewError(http.StatusBadGateway, openai.TypeUpstream, "", codeBadAnswer, c.overrunMessage(what))
}
