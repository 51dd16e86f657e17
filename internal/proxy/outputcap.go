package proxy

import (
	"bytes"
	"slices"
	"strconv"

	"github.com/kvroute/kvroute/internal/openai"
)

// A tenant's limits.max_output_tokens caps each sequence's completion tokens. A request
// without max_tokens would otherwise generate what its engine allows (vLLM: the rest of the
// context; llama.cpp and ollama: their num_predict), while tokens_per_minute reserved a learnt
// length for it and learnt the rest only when it ended (8 workers without max_tokens against
// kvroute sim answering 4,000 tokens each: 3.21 times the limit in one minute). With the cap,
// the body that reaches the engine always bounds the answer, and the reservation is the cap.

// outputFields are the body members that bound a request's completion, by kind, as the
// engines read them (by their exact, decoded names): chat completions take max_tokens and the
// newer max_completion_tokens (vLLM and SGLang use max_completion_tokens where both are set;
// llama.cpp and ollama have read max_tokens alone), completions max_tokens alone, Responses
// max_output_tokens. A completion's max_completion_tokens bounds nothing, so it is neither
// held to the cap nor written: vLLM's CompletionRequest (completion/protocol.py) and SGLang's
// (entrypoints/openai/protocol.py) declare max_tokens only, vLLM logging any other member as
// ignored and SGLang dropping it, and OpenAI's completions API has none either (kvroute sim
// ignores it there too, through openai.Parse). The first is the one written where the client
// sets none.
func outputFields(kind openai.Kind) []string {
	switch kind {
	case openai.KindChat:
		return []string{"max_tokens", "max_completion_tokens"}
	case openai.KindCompletion:
		return []string{"max_tokens"}
	case openai.KindResponse:
		return []string{"max_output_tokens"}
	}
	return nil
}

// outputBound is what a request body asks of its completion's length, for a tenant's cap.
type outputBound struct {
	// field and value are the member held to the cap (tenant.Demand's MaxTokensField and
	// MaxTokens): the first below 1 where one is, else the largest; "" and 0 when the body
	// names none with a value. Every member is held to the cap, where both are set and where
	// one is repeated, whichever of them an engine reads.
	field string
	value int
	// write is the member to set (outputFields' first) when the body does not name it with a
	// value, or names it null too: "" when nothing is written. null says it is named (null):
	// patched in place then, else added before the closing brace.
	write string
	null  bool
}

// readOutputBound reads the members of outputFields(kind) from body, as an engine would: a
// member named more than once counts each time, null counts as absent. An error for a value
// that is no integer (the parser refused those before: this is its second line).
func readOutputBound(kind openai.Kind, body []byte) (outputBound, *openai.Error) {
	fields := outputFields(kind)
	var b outputBound
	if len(fields) == 0 {
		return b, nil
	}
	var oe *openai.Error
	var valued, nulled bool // for fields[0]
	low := false
	ok := topLevel(body, func(key, v []byte) {
		i := slices.Index(fields, string(key))
		if i < 0 || oe != nil {
			return
		}
		if string(v) == "null" {
			nulled = nulled || i == 0
			return
		}
		n, err := strconv.Atoi(string(v))
		if err != nil {
			oe = openai.NotInteger(fields[i], v)
			return
		}
		valued = valued || i == 0
		switch {
		case low:
		case n < 1:
			b.field, b.value, low = fields[i], n, true
		case b.field == "" || n > b.value:
			b.field, b.value = fields[i], n
		}
	})
	if oe != nil {
		return outputBound{}, oe
	}
	if !ok {
		return outputBound{}, openai.BadRequest("", "the request body cannot be read for %s; send one JSON object", fields[0])
	}
	if !valued || nulled {
		b.write, b.null = fields[0], nulled
	}
	return b, nil
}

// writeOutputBound sets b.write to per, the completion tokens each sequence may have, in the
// body to forward: before the object's closing brace (a splice, with stream_options' where
// that is spliced too: the body is not copied), or in place of the null it was sent as (a
// Patch). false when the body cannot be patched: the caller refuses the request, never sends it
// without the bound. Called after the other changes to the body (dropEngineFields, the usage
// splice), before the cache salt's.
func (c *call) writeOutputBound(b outputBound, per int) bool {
	if b.write == "" {
		return true
	}
	v := []byte(strconv.Itoa(per))
	if !b.null {
		at := c.spliceAt
		if c.splice == nil {
			var ok bool
			if at, ok = closingBrace(c.body); !ok {
				return false
			}
		}
		// A new slice: the usage splice's bytes are shared by every request.
		c.splice = slices.Concat(c.splice, []byte(`,"`+b.write+`":`), v)
		c.spliceAt = at
		return true
	}
	body := c.body
	if c.splice != nil {
		body = slices.Concat(c.body[:c.spliceAt], c.splice, c.body[c.spliceAt:])
	}
	nb, err := openai.Patch(body, openai.Set{Key: b.write, Value: v})
	if err != nil {
		return false
	}
	c.body, c.splice, c.spliceAt = nb, nil, 0
	return true
}

// closingBrace returns the offset of the closing brace of body, an object with at least one
// member and nothing but white space after it (a body the parser took).
func closingBrace(body []byte) (int, bool) {
	t := bytes.TrimRight(body, " \t\r\n")
	i := len(t) - 1
	if i < 1 || t[i] != '}' {
		return 0, false
	}
	if inner := bytes.TrimRight(t[:i], " \t\r\n"); len(inner) == 0 || inner[len(inner)-1] == '{' {
		return 0, false // an empty object: no member to follow
	}
	return i, true
}
