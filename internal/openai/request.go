package openai

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"unicode/utf8"

	"github.com/cespare/xxhash/v2"
)

// Kind is the API a request is for.
type Kind int

// The APIs the router forwards.
const (
	KindChat Kind = iota + 1
	KindCompletion
	KindEmbedding
	KindResponse
)

// String returns the kind's path-like name.
func (k Kind) String() string {
	switch k {
	case KindChat:
		return "chat"
	case KindCompletion:
		return "completions"
	case KindEmbedding:
		return "embeddings"
	case KindResponse:
		return "responses"
	}
	return "kind(" + strconv.Itoa(int(k)) + ")"
}

// KindForPath maps a request path to its Kind; ok is false for paths the router does not route.
func KindForPath(path string) (Kind, bool) {
	switch path {
	case "/v1/chat/completions":
		return KindChat, true
	case "/v1/completions":
		return KindCompletion, true
	case "/v1/embeddings":
		return KindEmbedding, true
	case "/v1/responses":
		return KindResponse, true
	}
	return 0, false
}

// Request holds the fields of a request body the router reads. Raw is the body as received:
// the router forwards Raw (or a Patch of it), never a re-encoding of this struct, so fields it
// does not know pass through unchanged.
type Request struct {
	Kind  Kind
	Model string
	// Messages of a chat request, or the input items of a Responses request.
	Messages []Message
	// Tools is the compacted "tools" array of a chat or Responses request, nil when absent: it
	// is part of the prompt the engine sees, before the messages.
	Tools []byte
	// Prompt is a completion's prompt, or an embeddings / Responses request's string input.
	Prompt Prompt
	// Instructions is a Responses request's system text.
	Instructions       string
	Stream             bool
	IncludeUsage       bool // stream_options.include_usage
	HasStreamOptions   bool // the body has a stream_options object
	MaxTokens          int  // max_tokens, max_completion_tokens or max_output_tokens, 0 when absent
	User               string
	CacheSalt          string
	PromptCacheKey     string
	PreviousResponseID string
	Raw                []byte
}

// Message is one chat message or Responses input item, reduced to what reaches the prompt.
type Message struct {
	Role string
	Name string
	// Parts are the text parts of the content in order; a non-text part (an image, audio) is
	// kept as a short stand-in naming its type and a hash of its JSON, so that two prompts
	// with different images never look alike.
	Parts     []string
	ToolCalls []ToolCall
	// ToolCallID is the call a tool message answers.
	ToolCallID string
}

// ToolCall is a function call made by the assistant.
type ToolCall struct {
	Name      string
	Arguments string
}

// Prompt is a completion prompt or embeddings input: texts, or token arrays.
type Prompt struct {
	Texts  []string
	Tokens [][]int64
}

// Empty reports whether the prompt holds nothing.
func (p Prompt) Empty() bool { return len(p.Texts) == 0 && len(p.Tokens) == 0 }

// wire is the decoding shape; polymorphic fields stay raw and are decoded by hand.
type wire struct {
	Model               *string         `json:"model"`
	Messages            json.RawMessage `json:"messages"`
	Tools               json.RawMessage `json:"tools"`
	Prompt              json.RawMessage `json:"prompt"`
	Input               json.RawMessage `json:"input"`
	Instructions        *string         `json:"instructions"`
	Stream              *bool           `json:"stream"`
	StreamOptions       json.RawMessage `json:"stream_options"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	MaxOutputTokens     *int            `json:"max_output_tokens"`
	User                *string         `json:"user"`
	CacheSalt           *string         `json:"cache_salt"`
	PromptCacheKey      *string         `json:"prompt_cache_key"`
	PreviousResponseID  *string         `json:"previous_response_id"`
}

// wireFast decodes a chat request's messages in the same pass as the other fields: one scan
// of the body instead of one per nesting level. Any error falls back to the precise path.
type wireFast struct {
	wire
	Messages []wireMessage `json:"messages"`
}

// Parse reads body as a request of the given kind. A malformed body or a missing or mistyped
// field gives an *Error (400) naming the field; Parse never panics. body is kept as Raw
// without copying.
func Parse(kind Kind, body []byte) (*Request, error) {
	if kind == KindChat {
		var f wireFast
		if json.Unmarshal(body, &f) == nil && f.Model != nil && *f.Model != "" && f.Messages != nil {
			if msgs, err := convertMessages(f.Messages, "messages"); err == nil {
				r, err := fromWire(kind, body, &f.wire)
				if err != nil {
					return nil, err
				}
				r.Messages = msgs
				return r, nil
			}
		}
	}
	var w wire
	if err := json.Unmarshal(body, &w); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return nil, BadRequest(te.Field, "field %s must be %s, not a JSON %s", te.Field, jsonKind(te.Type.Kind().String()), te.Value)
		}
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return nil, BadRequest("", "request body is not valid JSON: %v (at byte %d)", se, se.Offset)
		}
		return nil, BadRequest("", "request body is not a JSON object: %v", err)
	}
	r, err := fromWire(kind, body, &w)
	if err != nil {
		return nil, err
	}
	switch kind {
	case KindChat:
		if !isPresent(w.Messages) {
			return nil, BadRequest("messages", "missing required field messages")
		}
		r.Messages, err = parseMessages(w.Messages, "messages")
	case KindCompletion:
		if !isPresent(w.Prompt) {
			return nil, BadRequest("prompt", "missing required field prompt")
		}
		r.Prompt, err = parsePrompt(w.Prompt, "prompt")
	case KindEmbedding:
		if !isPresent(w.Input) {
			return nil, BadRequest("input", "missing required field input")
		}
		r.Prompt, err = parsePrompt(w.Input, "input")
	case KindResponse:
		if isPresent(w.Input) {
			if trimmed := bytes.TrimSpace(w.Input); len(trimmed) > 0 && trimmed[0] == '[' {
				r.Messages, err = parseMessages(w.Input, "input")
			} else {
				r.Prompt, err = parsePrompt(w.Input, "input")
			}
		} else if r.PreviousResponseID == "" {
			return nil, BadRequest("input", "missing required field input")
		}
	default:
		return nil, BadRequest("", "unsupported request kind %v", kind)
	}
	if err != nil {
		return nil, err
	}
	return r, nil
}

// fromWire fills the scalar fields shared by every kind.
func fromWire(kind Kind, body []byte, w *wire) (*Request, error) {
	r := &Request{Kind: kind, Raw: body}
	if w.Model == nil || *w.Model == "" {
		return nil, BadRequest("model", "missing required field model")
	}
	r.Model = *w.Model
	r.Stream = w.Stream != nil && *w.Stream
	if isPresent(w.StreamOptions) {
		var so struct {
			IncludeUsage *bool `json:"include_usage"`
		}
		if err := json.Unmarshal(w.StreamOptions, &so); err != nil {
			return nil, BadRequest("stream_options", "stream_options must be an object with a boolean include_usage")
		}
		r.HasStreamOptions = true
		r.IncludeUsage = so.IncludeUsage != nil && *so.IncludeUsage
	}
	for _, p := range []*int{w.MaxOutputTokens, w.MaxTokens, w.MaxCompletionTokens} {
		if p != nil {
			r.MaxTokens = *p
		}
	}
	r.User = deref(w.User)
	r.CacheSalt = deref(w.CacheSalt)
	r.PromptCacheKey = deref(w.PromptCacheKey)
	r.PreviousResponseID = deref(w.PreviousResponseID)
	r.Instructions = deref(w.Instructions)
	if isPresent(w.Tools) {
		var buf bytes.Buffer
		if err := json.Compact(&buf, w.Tools); err == nil {
			r.Tools = buf.Bytes()
		}
	}
	return r, nil
}

func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

func isPresent(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) > 0 && !bytes.Equal(t, []byte("null"))
}

func jsonKind(goKind string) string {
	switch goKind {
	case "string":
		return "a string"
	case "bool":
		return "true or false"
	case "int", "int64", "float64":
		return "a number"
	case "ptr":
		return "of another type"
	}
	return "a " + goKind
}

type wireMessage struct {
	Type       string          `json:"type"` // Responses items: message, function_call, function_call_output
	Role       string          `json:"role"`
	Name       string          `json:"name"`
	Content    json.RawMessage `json:"content"`
	ToolCalls  []wireToolCall  `json:"tool_calls"`
	ToolCallID string          `json:"tool_call_id"`
	// Responses function_call / function_call_output items.
	Arguments string          `json:"arguments"`
	CallID    string          `json:"call_id"`
	Output    json.RawMessage `json:"output"`
}

type wireToolCall struct {
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

func parseMessages(raw json.RawMessage, field string) ([]Message, error) {
	var wms []json.RawMessage
	if err := json.Unmarshal(raw, &wms); err != nil {
		return nil, BadRequest(field, "%s must be an array of message objects", field)
	}
	typed := make([]wireMessage, len(wms))
	for i, one := range wms {
		p := field + "[" + strconv.Itoa(i) + "]"
		if err := json.Unmarshal(one, &typed[i]); err != nil {
			return nil, BadRequest(p, "%s must be a message object with string role and content: %v", p, err)
		}
	}
	return convertMessages(typed, field)
}

// convertMessages turns decoded messages into Messages, checking them.
func convertMessages(wms []wireMessage, field string) ([]Message, error) {
	out := make([]Message, 0, len(wms))
	for i, wm := range wms {
		p := field + "[" + strconv.Itoa(i) + "]"
		m := Message{Role: wm.Role, Name: wm.Name, ToolCallID: wm.ToolCallID}
		switch wm.Type {
		case "function_call":
			m.Role = "assistant"
			m.ToolCalls = []ToolCall{{Name: wm.Name, Arguments: wm.Arguments}}
			m.Name = ""
		case "function_call_output":
			m.Role = "tool"
			m.ToolCallID = wm.CallID
			wm.Content = wm.Output
		default:
			if m.Role == "" {
				return nil, BadRequest(p+".role", "missing required field %s.role", p)
			}
		}
		parts, err := parseContent(wm.Content, p+".content")
		if err != nil {
			return nil, err
		}
		m.Parts = parts
		for _, tc := range wm.ToolCalls {
			m.ToolCalls = append(m.ToolCalls, ToolCall{Name: tc.Function.Name, Arguments: tc.Function.Arguments})
		}
		out = append(out, m)
	}
	return out, nil
}

// parseContent reads a message content: null, a string, or an array of parts.
func parseContent(raw json.RawMessage, field string) ([]string, error) {
	if !isPresent(raw) {
		return nil, nil
	}
	t := bytes.TrimSpace(raw)
	switch t[0] {
	case '"':
		if s, ok := plainString(t); ok {
			return []string{s}, nil
		}
		var s string
		if err := json.Unmarshal(t, &s); err != nil {
			return nil, BadRequest(field, "%s is not a valid string", field)
		}
		return []string{s}, nil
	case '[':
		var parts []json.RawMessage
		if err := json.Unmarshal(t, &parts); err != nil {
			return nil, BadRequest(field, "%s must be a string or an array of content parts", field)
		}
		out := make([]string, 0, len(parts))
		for i, part := range parts {
			var p struct {
				Type string  `json:"type"`
				Text *string `json:"text"`
			}
			if err := json.Unmarshal(part, &p); err != nil {
				return nil, BadRequest(fmt.Sprintf("%s[%d]", field, i), "%s[%d] must be a content part object with a type", field, i)
			}
			if p.Text != nil {
				out = append(out, *p.Text)
				continue
			}
			out = append(out, "["+p.Type+" "+hashHex(part)+"]")
		}
		return out, nil
	}
	return nil, BadRequest(field, "%s must be a string or an array of content parts", field)
}

// plainString decodes a JSON string literal that has no escapes and is valid UTF-8 (most
// prompt text) without a second validation pass; ok is false for anything else.
func plainString(t []byte) (string, bool) {
	if len(t) < 2 || t[0] != '"' || t[len(t)-1] != '"' {
		return "", false
	}
	in := t[1 : len(t)-1]
	for _, c := range in {
		if c == '\\' || c == '"' || c < 0x20 {
			return "", false
		}
	}
	if !utf8.Valid(in) {
		return "", false
	}
	return string(in), true
}

func hashHex(b []byte) string {
	var s [8]byte
	binary.BigEndian.PutUint64(s[:], xxhash.Sum64(b))
	return hex.EncodeToString(s[:])
}

// parsePrompt reads a prompt: a string, an array of strings, an array of token ids, or an
// array of token-id arrays.
func parsePrompt(raw json.RawMessage, field string) (Prompt, error) {
	t := bytes.TrimSpace(raw)
	bad := BadRequest(field, "%s must be a string, an array of strings, an array of token ids or an array of token-id arrays", field)
	if len(t) == 0 {
		return Prompt{}, bad
	}
	switch t[0] {
	case '"':
		var s string
		if json.Unmarshal(t, &s) != nil {
			return Prompt{}, bad
		}
		return Prompt{Texts: []string{s}}, nil
	case '[':
		var items []json.RawMessage
		if json.Unmarshal(t, &items) != nil {
			return Prompt{}, bad
		}
		if len(items) == 0 {
			return Prompt{}, BadRequest(field, "%s must not be empty", field)
		}
		first := bytes.TrimSpace(items[0])
		if len(first) == 0 {
			return Prompt{}, bad
		}
		switch {
		case first[0] == '"':
			var ss []string
			if json.Unmarshal(t, &ss) != nil {
				return Prompt{}, bad
			}
			return Prompt{Texts: ss}, nil
		case first[0] == '[':
			var tt [][]int64
			if json.Unmarshal(t, &tt) != nil {
				return Prompt{}, bad
			}
			return Prompt{Tokens: tt}, nil
		default:
			var tk []int64
			if json.Unmarshal(t, &tk) != nil {
				return Prompt{}, bad
			}
			return Prompt{Tokens: [][]int64{tk}}, nil
		}
	}
	return Prompt{}, bad
}

// Canonical prompt text. Each message renders as "<|role|>" [" " name] "\n", its text parts
// each followed by "\n", then one "<|tool_call|>name(arguments)\n" per call; tools render first
// as "<|tools|>" + compact JSON + "\n". A message's rendering depends on that message alone, so
// equal conversation prefixes give equal text prefixes. Token ids render as 4 little-endian
// bytes each (the router's estimate of 4 bytes per token then counts them exactly).
const (
	tagOpen  = "<|"
	tagClose = "|>"
)

// AppendCanonical appends the request's canonical prompt text to dst.
func (r *Request) AppendCanonical(dst []byte) []byte {
	if len(r.Tools) > 0 {
		dst = append(dst, "<|tools|>"...)
		dst = append(dst, r.Tools...)
		dst = append(dst, '\n')
	}
	if r.Instructions != "" {
		dst = appendMessage(dst, Message{Role: "system", Parts: []string{r.Instructions}})
	}
	for _, m := range r.Messages {
		dst = appendMessage(dst, m)
	}
	for i, t := range r.Prompt.Texts {
		if i > 0 {
			dst = append(dst, "\n<|prompt|>\n"...)
		}
		dst = append(dst, t...)
	}
	for i, toks := range r.Prompt.Tokens {
		if i > 0 {
			dst = binary.LittleEndian.AppendUint32(dst, 0xFFFFFFFF)
		}
		for _, tk := range toks {
			dst = binary.LittleEndian.AppendUint32(dst, uint32(tk))
		}
	}
	return dst
}

// CanonicalPrompt returns the canonical prompt text (see AppendCanonical).
func (r *Request) CanonicalPrompt() string { return string(r.AppendCanonical(nil)) }

func appendMessage(dst []byte, m Message) []byte {
	dst = append(dst, tagOpen...)
	dst = append(dst, m.Role...)
	dst = append(dst, tagClose...)
	if m.Name != "" {
		dst = append(dst, ' ')
		dst = append(dst, m.Name...)
	}
	if m.ToolCallID != "" {
		dst = append(dst, " @"...)
		dst = append(dst, m.ToolCallID...)
	}
	dst = append(dst, '\n')
	for _, p := range m.Parts {
		dst = append(dst, p...)
		dst = append(dst, '\n')
	}
	for _, tc := range m.ToolCalls {
		dst = append(dst, "<|tool_call|>"...)
		dst = append(dst, tc.Name...)
		dst = append(dst, '(')
		dst = append(dst, tc.Arguments...)
		dst = append(dst, ")\n"...)
	}
	return dst
}

// SessionKey returns the client's affinity hint: prompt_cache_key, else user, else "".
func (r *Request) SessionKey() string {
	if r.PromptCacheKey != "" {
		return r.PromptCacheKey
	}
	return r.User
}
