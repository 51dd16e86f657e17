package openai

import (
	"bytes"
	"encoding/json"
)

// Usage is a response's token usage. The Chat and Completions APIs fill PromptTokens,
// CompletionTokens and PromptTokensDetails; the Responses API fills InputTokens, OutputTokens
// and InputTokensDetails. Use Prompt, Completion and Cached to read either.
type Usage struct {
	PromptTokens        int           `json:"prompt_tokens"`
	CompletionTokens    int           `json:"completion_tokens"`
	TotalTokens         int           `json:"total_tokens"`
	PromptTokensDetails *TokenDetails `json:"prompt_tokens_details,omitempty"`
	InputTokens         int           `json:"input_tokens,omitempty"`
	OutputTokens        int           `json:"output_tokens,omitempty"`
	InputTokensDetails  *TokenDetails `json:"input_tokens_details,omitempty"`
}

// TokenDetails holds the cached part of the prompt.
type TokenDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

// Prompt returns the prompt (input) tokens.
func (u *Usage) Prompt() int { return max(u.PromptTokens, u.InputTokens) }

// Completion returns the completion (output) tokens.
func (u *Usage) Completion() int { return max(u.CompletionTokens, u.OutputTokens) }

// Cached returns the engine-reported cached prompt tokens, or -1 when not reported.
func (u *Usage) Cached() int {
	switch {
	case u.PromptTokensDetails != nil:
		return u.PromptTokensDetails.CachedTokens
	case u.InputTokensDetails != nil:
		return u.InputTokensDetails.CachedTokens
	}
	return -1
}

// FindUsage returns the usage of a response body or stream chunk: its top-level "usage", or
// the "usage" of its "response" (Responses API events such as response.completed). ok is false
// when there is none (or it is null).
func FindUsage(body []byte) (u Usage, ok bool) {
	var v struct {
		Usage    *Usage `json:"usage"`
		Response *struct {
			Usage *Usage `json:"usage"`
		} `json:"response"`
	}
	if json.Unmarshal(body, &v) != nil {
		return Usage{}, false
	}
	if v.Usage != nil {
		return *v.Usage, true
	}
	if v.Response != nil && v.Response.Usage != nil {
		return *v.Response.Usage, true
	}
	return Usage{}, false
}

// IsUsageOnlyChunk reports whether a chat or completion stream chunk is the final one that
// only carries usage (choices empty, usage set): the chunk a client gets because of
// stream_options.include_usage.
func IsUsageOnlyChunk(data []byte) bool {
	if !bytes.Contains(data, []byte(`"usage"`)) || hasChoices(data) {
		return false
	}
	return usageOnlyDecoded(data)
}

// usageOnlyDecoded is IsUsageOnlyChunk's answer by encoding/json.
func usageOnlyDecoded(data []byte) bool {
	var v struct {
		Choices []json.RawMessage `json:"choices"`
		Usage   *Usage            `json:"usage"`
	}
	if json.Unmarshal(data, &v) != nil {
		return false
	}
	return v.Usage != nil && len(v.Choices) == 0
}

// responseIDKeys are the keys ResponseID reads, at the top and (the first) in "response".
var responseIDKeys = [...]string{"id", "object", "response"}

// ResponseID returns the top-level "id" of a Responses API body, or of the "response" object of
// a Responses stream event; "" when none. It reads the body in one pass that decodes only those
// (by encoding/json, a 4,000-token answer took 133 µs); anything unusual is left to
// responseIDDecoded.
func ResponseID(body []byte) string {
	s := scanner{b: body}
	var id, object, inner string
	ok := s.fields(responseIDKeys[:], func(i int) bool {
		switch i {
		case 0:
			return s.plainField(&id)
		case 1:
			return s.plainField(&object)
		}
		return s.nullOrFields(responseIDKeys[:1], func(int) bool { return s.plainField(&inner) })
	})
	switch {
	case !ok || !s.end():
		return responseIDDecoded(body)
	case inner != "":
		return inner
	case object == "response":
		return id
	}
	return ""
}

// responseIDDecoded is ResponseID by encoding/json.
func responseIDDecoded(body []byte) string {
	var v struct {
		ID       string `json:"id"`
		Object   string `json:"object"`
		Response *struct {
			ID string `json:"id"`
		} `json:"response"`
	}
	if json.Unmarshal(body, &v) != nil {
		return ""
	}
	if v.Response != nil && v.Response.ID != "" {
		return v.Response.ID
	}
	if v.Object == "response" {
		return v.ID
	}
	return ""
}

// TimingsCached returns the prompt tokens llama.cpp's server (llama-server) took from its
// cache, as it reports them in the "timings" object of a response or of a stream's last chunk
// ("cache_n"), for servers that leave usage.prompt_tokens_details out. ok is false when the
// body has no such field.
func TimingsCached(body []byte) (n int, ok bool) {
	if !bytes.Contains(body, []byte(`"timings"`)) {
		return 0, false
	}
	var v struct {
		Timings *struct {
			CacheN *int `json:"cache_n"`
		} `json:"timings"`
	}
	if json.Unmarshal(body, &v) != nil || v.Timings == nil || v.Timings.CacheN == nil || *v.Timings.CacheN < 0 {
		return 0, false
	}
	return *v.Timings.CacheN, true
}

// choicesKeys are the top-level keys hasChoices looks for.
var choicesKeys = [...]string{"choices"}

// hasChoices reports whether a stream chunk's top-level "choices" is sure to decode into a
// non-empty list or to fail to decode, so that IsUsageOnlyChunk can say false without
// encoding/json. An engine that sends usage in every chunk (vLLM's
// stream_options.continuous_usage_stats) would otherwise cost a full decode of every token's
// chunk (11 allocations each). false when unsure: a key encoding/json might fold into
// "choices", or JSON the scanner does not take.
func hasChoices(data []byte) bool {
	s := scanner{b: data}
	var last []byte
	ok := s.object(func(key []byte) bool {
		switch keyIndex(key, choicesKeys[:]) {
		case 0:
			last = s.raw()
			return last != nil
		case -1:
			return s.skip()
		}
		return false
	})
	if !ok || !s.end() || last == nil || bytes.Equal(last, []byte("null")) {
		return false
	}
	if last[0] != '[' {
		return true // not a list: encoding/json fails on it
	}
	inner := scanner{b: last[1:]}
	return inner.peek() != ']'
}

// UsageMember returns where a chunk's top-level "usage" member lies in data, with the comma
// that joins it to its neighbour, so that data[:start] followed by data[end:] is the chunk
// without it: what a client that did not ask for usage gets from an engine that puts it in
// every chunk once asked (ollama's completions: zeros in every token's chunk). ok is false when
// data has no such member, or is anything the scan is not sure of (a duplicate key, one that
// encoding/json might fold into "usage", JSON that does not scan): the chunk is then passed on
// as it is.
func UsageMember(data []byte) (start, end int, ok bool) {
	s := scanner{b: data}
	if !s.eat('{') || s.eat('}') {
		return 0, 0, false
	}
	prev := -1 // where the previous member's value ends
	for {
		if s.peek() != '"' {
			return 0, 0, false
		}
		at := s.i
		key, _, kok := s.stringSpan()
		if !kok || !s.eat(':') {
			return 0, 0, false
		}
		i := keyIndex(key, usageKeys[:1])
		if i == -2 || i == 0 && ok {
			return 0, 0, false
		}
		if !s.skip() {
			return 0, 0, false
		}
		valueEnd := s.i
		if i == 0 {
			ok = true
			start, end = at, valueEnd
			if prev >= 0 {
				start = prev // the comma before it goes with it
			}
		}
		more := s.eat(',')
		if i == 0 && prev < 0 && more {
			end = s.i // the first member: the comma after it goes with it
		}
		if !more {
			if !s.eat('}') || !s.end() {
				return 0, 0, false
			}
			return start, end, ok
		}
		prev = valueEnd
	}
}
