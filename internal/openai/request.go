package openai

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
	"unsafe"

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
	StreamOptionsField bool // the body names stream_options, even as null (as encoding/json matches names)
	MaxTokens          int  // the completion's bound per sequence, as the kind's engines read it (outputBound), 0 when absent
	N                  int  // n, the choices to generate for each prompt, 0 when absent (one)
	User               string
	CacheSalt          string
	// CacheSaltField: the body names cache_salt, even as null (as encoding/json matches
	// names: in any case, escaped).
	CacheSaltField bool
	// CacheSaltAt and CacheSaltEnd are where cache_salt's value lies in Raw when the one-pass
	// scanner read the body and found the name once, spelled exactly, and no other name
	// encoding/json could take for it; both 0 otherwise.
	CacheSaltAt, CacheSaltEnd int
	PromptCacheKey            string
	PreviousResponseID        string
	Raw                       []byte
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
	N                   *int            `json:"n"`
	User                *string         `json:"user"`
	CacheSalt           namedString     `json:"cache_salt"`
	PromptCacheKey      *string         `json:"prompt_cache_key"`
	PreviousResponseID  *string         `json:"previous_response_id"`

	cacheSaltAt, cacheSaltEnd int // set by scanBody
}

// namedString decodes as a *string does, and remembers that its name was there, even as null:
// a body that names cache_salt cannot take a second one spliced in.
type namedString struct {
	v     *string
	named bool
}

func (n *namedString) UnmarshalJSON(b []byte) error {
	n.named = true
	if string(b) == "null" {
		n.v = nil
		return nil
	}
	var v string
	if err := json.Unmarshal(b, &v); err != nil {
		return &json.UnmarshalTypeError{Value: jsonValueKind(b), Type: reflect.TypeFor[string]()}
	}
	n.v = &v
	return nil
}

// jsonKindName is a JSON kind as encoding/json's errors name it ("bool", "number"...) in the
// words of JSON itself, for the client: "boolean" rather than Go's "bool".
func jsonKindName(kind string) string {
	if kind == "bool" {
		return "boolean"
	}
	return kind
}

// jsonValueKind names the kind of the JSON value b as encoding/json's errors do.
func jsonValueKind(b []byte) string {
	switch t := bytes.TrimSpace(b); {
	case len(t) == 0:
		return "value"
	case t[0] == '{':
		return "object"
	case t[0] == '[':
		return "array"
	case t[0] == 't' || t[0] == 'f':
		return "bool"
	case t[0] == '"':
		return "string"
	}
	return "number"
}

// wireFast decodes a chat request's messages in the same pass as the other fields: one scan
// of the body instead of one per nesting level. Any error falls back to the precise path.
type wireFast struct {
	wire
	Messages []wireMessage `json:"messages"`
}

// Parse reads body as a request of the given kind. A malformed body or a missing or mistyped
// field gives an *Error (400) naming the field; Parse never panics. body is kept as Raw
// without copying, and long prompt strings may be views of it: body must not change while the
// Request is in use.
func Parse(kind Kind, body []byte) (*Request, error) { return ParseScratch(kind, body, nil) }

// NamedModel returns the model that body, a request body, names in its top-level "model"
// member: the first one, read as Parse's fast path reads objects, up to the first thing in the
// body that is not JSON; "" when none is found before it, or it is not a string. It is for
// counting a request that Parse refused under its model, never for routing one: Parse alone
// judges a body.
func NamedModel(body []byte) string {
	s := scanner{b: body}
	var model string
	s.object(func(key []byte) bool {
		if string(key) != "model" {
			return s.skip()
		}
		if v, isNull, ok := s.stringOrNull(); ok && !isNull {
			model = v
		}
		return false // found, or not a string: the rest is not read
	})
	return model
}

// Scratch is memory that ParseScratch decodes long message contents with escapes into (a
// 100k-token prompt with line breaks is a 400 KB copy), reused from one request to the next
// instead of allocated for each: the router pools them. Its zero value is ready to use.
type Scratch struct {
	buf []byte
}

// Reset makes the memory of every string decoded into s free for the next ParseScratch: call it
// only when no Request parsed with s, and no string taken from one, is in use any more.
func (s *Scratch) Reset() { s.buf = s.buf[:0] }

// Cap is how many bytes s holds.
func (s *Scratch) Cap() int { return cap(s.buf) }

// take returns room for n bytes after what s holds, as an empty slice of that capacity, which
// stays valid until Reset (when s is full, the room is new memory, and s holds that from then
// on: strings in the old memory keep it).
func (s *Scratch) take(n int) []byte {
	if cap(s.buf)-len(s.buf) < n {
		s.buf = make([]byte, 0, max(n, 2*cap(s.buf)))
	}
	return s.buf[len(s.buf):len(s.buf):cap(s.buf)]
}

// ParseScratch is Parse, with the message contents and prompt texts (Messages' Parts,
// Prompt.Texts) that have escapes decoded into sc (nil: new memory), where they stay until
// sc.Reset. Only those are decoded or viewed in place (of body or sc, from minShared bytes):
// every other string (the model, the user, the cache key, names, tool calls) is a copy of its
// own, which may be kept after the request; a content or prompt text must be copied to be kept.
func ParseScratch(kind Kind, body []byte, sc *Scratch) (*Request, error) {
	// One hand-written pass over the body: it reads only the fields we route on and validates
	// the rest, and gives up (ok false) on anything unusual, which then takes the encoding/json
	// paths below with their precise errors.
	// An empty messages array too, so that its refusal is worded in one place.
	if sb, ok := scanBody(kind, body, sc); ok && (kind != KindChat || len(sb.msgs) > 0) {
		r, err := fromWire(kind, body, &sb.w)
		if err != nil {
			return nil, err
		}
		r.Messages, r.Prompt = sb.msgs, sb.prompt
		return r, nil
	}
	return parseDecoded(kind, body)
}

// parseDecoded is Parse with encoding/json: the precise path, and the one that words the errors.
func parseDecoded(kind Kind, body []byte) (*Request, error) {
	if err := foldedKey(body); err != nil {
		return nil, err
	}
	if string(bytes.TrimSpace(body)) == "null" {
		// encoding/json decodes null into a struct as nothing at all: said as for the other
		// kinds, not as a body without its model.
		return nil, BadRequest("", "the request body must be a JSON object, not JSON null")
	}
	if kind == KindChat {
		var f wireFast
		if json.Unmarshal(body, &f) == nil && f.Model != nil && *f.Model != "" && len(f.Messages) > 0 {
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
			return nil, typeError(te)
		}
		if te != nil {
			// The body itself is of another JSON kind (an array, a string): said so, without
			// encoding/json's words for it, which name a Go type.
			return nil, BadRequest("", "the request body must be a JSON object, not a JSON %s", jsonKindName(te.Value))
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
		if err == nil && len(r.Messages) == 0 {
			// OpenAI's API refuses it too; an engine would answer a prompt of nothing.
			return nil, BadRequest("messages", "messages is an empty array: give at least one message")
		}
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
	r.StreamOptionsField = w.StreamOptions != nil
	if isPresent(w.StreamOptions) {
		if err := foldedIn(w.StreamOptions, levelStreamOptions); err != nil {
			return nil, err
		}
		var so struct {
			IncludeUsage *bool `json:"include_usage"`
		}
		if err := json.Unmarshal(w.StreamOptions, &so); err != nil {
			return nil, BadRequest("stream_options", "stream_options must be an object with a boolean include_usage")
		}
		r.HasStreamOptions = true
		r.IncludeUsage = so.IncludeUsage != nil && *so.IncludeUsage
	}
	bounds := [...]struct {
		name string
		v    *int
	}{{"max_tokens", w.MaxTokens}, {"max_completion_tokens", w.MaxCompletionTokens}, {"max_output_tokens", w.MaxOutputTokens}}
	for _, b := range bounds {
		if b.v != nil && *b.v < 1 {
			// OpenAI refuses below 1 too (integer_below_min_value); engines do not all:
			// llama.cpp and ollama read -1 as "until the context is full", and the peers
			// drop a routed event whose max_tokens is negative as malformed.
			return nil, BelowMin(b.name, strconv.Itoa(*b.v), "leave it out to set no bound")
		}
	}
	r.MaxTokens = outputBound(kind, w)
	if w.N != nil {
		if *w.N < 1 {
			return nil, BelowMin("n", strconv.Itoa(*w.N), "leave it out for one choice")
		}
		r.N = *w.N
	}
	r.User = deref(w.User)
	r.CacheSalt = deref(w.CacheSalt.v)
	r.CacheSaltField = w.CacheSalt.named
	r.CacheSaltAt, r.CacheSaltEnd = w.cacheSaltAt, w.cacheSaltEnd
	r.PromptCacheKey = deref(w.PromptCacheKey)
	r.PreviousResponseID = deref(w.PreviousResponseID)
	r.Instructions = deref(w.Instructions)
	if isPresent(w.Tools) {
		r.Tools = compact(w.Tools)
	}
	return r, nil
}

// outputBound is the most completion tokens a request of kind lets each sequence have, as its
// engines read the body (Request.MaxTokens): a chat request's max_tokens or
// max_completion_tokens, the larger where both are set (vLLM and SGLang take
// max_completion_tokens then, llama.cpp and ollama have read max_tokens alone); a
// completion's max_tokens alone (vLLM's and SGLang's completion requests declare no
// max_completion_tokens and ignore one sent); a Responses request's max_output_tokens. A
// member its kind's engines do not read bounds nothing: a chat request's max_output_tokens of
// 1 would otherwise have reserved 1 token per sequence of a tenant's limit for an answer its
// engine did not cut. 0: none.
func outputBound(kind Kind, w *wire) int {
	v := func(p *int) int {
		if p == nil {
			return 0
		}
		return *p
	}
	switch kind {
	case KindChat:
		return max(v(w.MaxTokens), v(w.MaxCompletionTokens))
	case KindCompletion:
		return v(w.MaxTokens)
	case KindResponse:
		return v(w.MaxOutputTokens)
	}
	return 0
}

// compact returns raw, valid JSON (the scanner or encoding/json read it), with the spaces
// outside its strings left out, as json.Compact writes it; nil when raw is not valid JSON. An
// agent's tool list is tens of kilobytes with every request, mostly long descriptions, which
// json.Compact read a byte at a time: 40 tools, 36 KB, 150 µs of a 180 µs parse.
func compact(raw []byte) []byte {
	out := make([]byte, 0, len(raw))
	for i := 0; i < len(raw); {
		switch c := raw[i]; c {
		case ' ', '\t', '\n', '\r':
			i++
		case '"':
			// The string through its closing quote, as it is.
			j := i + 1
			for {
				q := bytes.IndexByte(raw[j:], '"')
				if q < 0 {
					return compactChecked(raw)
				}
				e := bytes.IndexByte(raw[j:j+q], '\\')
				if e < 0 {
					j += q
					break
				}
				j += e + 2 // an escape: the byte after the backslash cannot close the string
			}
			out = append(out, raw[i:j+1]...)
			i = j + 1
		default:
			out = append(out, c)
			i++
		}
	}
	return out
}

// compactChecked is json.Compact's answer, for JSON compact did not expect.
func compactChecked(raw []byte) []byte {
	var buf bytes.Buffer
	if json.Compact(&buf, raw) != nil {
		return nil
	}
	return buf.Bytes()
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

// typeError is the 400 for a field whose JSON value encoding/json could not store (te names
// the field): code invalid_type, as OpenAI's API answers a value of the wrong type. An integer
// field's is NotInteger's answer: te.Value is "number " and the number's text, or the value's
// JSON kind.
func typeError(te *json.UnmarshalTypeError) *Error {
	switch te.Type.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		if kind, num, _ := strings.Cut(te.Value, " "); kind == "number" && num != "" {
			return notIntegerNumber(te.Field, num)
		}
		return notIntegerKind(te.Field, te.Value)
	}
	return NewError(http.StatusBadRequest, TypeInvalidRequest, te.Field, CodeInvalidType,
		fmt.Sprintf("field %s must be %s, not a JSON %s", te.Field, jsonKind(te.Type.Kind().String()), jsonKindName(te.Value)))
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

	// dec is Content and out is Output decoded, when the scanner read them.
	dec, out decoded
}

// decoded is a content as the scanner decoded it: its text when a string (hasText), its parts
// as parseContent returns them when an array (hasParts).
type decoded struct {
	text     string
	hasText  bool
	parts    []string
	hasParts bool
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
			// Said without encoding/json's words, which name Go types (openai.wireMessage).
			var te *json.UnmarshalTypeError
			if errors.As(err, &te) && te.Field != "" {
				in := *te
				in.Field = p + "." + te.Field
				return nil, typeError(&in)
			}
			return nil, BadRequest(p, "%s must be a message object with string role and content, not a JSON %s", p, jsonKindName(jsonValueKind(one)))
		}
	}
	return convertMessages(typed, field)
}

// convertMessages turns decoded messages into Messages, checking them.
func convertMessages(wms []wireMessage, field string) ([]Message, error) {
	out := make([]Message, 0, len(wms))
	c := converter{field: field}
	for i := range wms {
		m, err := c.convert(&wms[i], i)
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	return out, nil
}

// converter makes Messages of wire messages one at a time: convertMessages, and the scanner as
// it reads each (it keeps no list of wire messages, 280 bytes each: a 16 MB body of one-word
// messages would be 150 MB of them).
type converter struct {
	field  string
	single []string // room for string contents' one-part lists, allocated a few at a time
	chunk  int
}

// convert makes the Message of wm, the i-th of the list.
func (c *converter) convert(wm *wireMessage, i int) (Message, error) {
	// A message's path in errors (messages[3]), built only for one.
	at := func() string { return c.field + "[" + strconv.Itoa(i) + "]" }
	m := Message{Role: wm.Role, Name: wm.Name, ToolCallID: wm.ToolCallID}
	content, dec := wm.Content, wm.dec
	switch wm.Type {
	case "function_call":
		m.Role = "assistant"
		m.ToolCalls = []ToolCall{{Name: wm.Name, Arguments: wm.Arguments}}
		m.Name = ""
	case "function_call_output":
		m.Role = "tool"
		m.ToolCallID = wm.CallID
		// The output is the item's text, whatever its content says.
		content, dec = wm.Output, wm.out
	default:
		if m.Role == "" {
			p := at()
			return Message{}, BadRequest(p+".role", "missing required field %s.role", p)
		}
	}
	switch {
	case dec.hasText:
		if len(c.single) == 0 {
			c.chunk = min(max(2*c.chunk, 8), 1024)
			c.single = make([]string, c.chunk)
		}
		c.single[0] = dec.text
		m.Parts, c.single = c.single[:1:1], c.single[1:]
	case dec.hasParts:
		m.Parts = dec.parts
	default:
		parts, err := parseContent(content, at()+".content")
		if err != nil {
			return Message{}, err
		}
		m.Parts = parts
	}
	for _, tc := range wm.ToolCalls {
		m.ToolCalls = append(m.ToolCalls, ToolCall{Name: tc.Function.Name, Arguments: tc.Function.Arguments})
	}
	return m, nil
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

// AppendCanonical appends the request's canonical prompt text to dst, which it grows once, to
// the text's length (canonicalLen), where it lacks the room: a long conversation's text grown
// by append was allocated and copied over again and again (its thousands of messages took five
// times the text's size in allocations: BenchmarkAppendCanonical).
func (r *Request) AppendCanonical(dst []byte) []byte {
	dst = slices.Grow(dst, r.canonicalLen())
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

// Prompts returns how many prompts a completions request carries: more than one when its
// prompt is a list of strings or of token arrays (the engine serves each as a request of its
// own), 1 for one prompt, 0 for a chat.
func (r *Request) Prompts() int { return max(len(r.Prompt.Texts), len(r.Prompt.Tokens)) }

// AppendPrompt appends the canonical text of prompt i of the list alone (its string, or its
// tokens as AppendCanonical writes them): what the engine caches for that prompt.
func (r *Request) AppendPrompt(dst []byte, i int) []byte {
	if i < len(r.Prompt.Texts) {
		return append(dst, r.Prompt.Texts[i]...)
	}
	if i < len(r.Prompt.Tokens) {
		for _, tk := range r.Prompt.Tokens[i] {
			dst = binary.LittleEndian.AppendUint32(dst, uint32(tk))
		}
	}
	return dst
}

// CanonicalPrompt returns the canonical prompt text (see AppendCanonical).
func (r *Request) CanonicalPrompt() string { return string(r.AppendCanonical(nil)) }

// canonicalLen is the length of the request's canonical prompt text (AppendCanonical).
func (r *Request) canonicalLen() int {
	n := 0
	if len(r.Tools) > 0 {
		n += len("<|tools|>") + len(r.Tools) + 1
	}
	if r.Instructions != "" {
		n += messageLen(Message{Role: "system", Parts: []string{r.Instructions}})
	}
	for i := range r.Messages {
		n += messageLen(r.Messages[i])
	}
	for i, t := range r.Prompt.Texts {
		if i > 0 {
			n += len("\n<|prompt|>\n")
		}
		n += len(t)
	}
	if k := len(r.Prompt.Tokens); k > 0 {
		n += 4 * (k - 1) // the separators
		for _, toks := range r.Prompt.Tokens {
			n += 4 * len(toks)
		}
	}
	return n
}

// messageLen is the length of m's canonical text (appendMessage).
func messageLen(m Message) int {
	n := len(tagOpen) + len(m.Role) + len(tagClose) + 1
	if m.Name != "" {
		n += 1 + len(m.Name)
	}
	if m.ToolCallID != "" {
		n += 2 + len(m.ToolCallID)
	}
	for _, p := range m.Parts {
		n += len(p) + 1
	}
	for _, tc := range m.ToolCalls {
		n += len("<|tool_call|>") + len(tc.Name) + 1 + len(tc.Arguments) + 2
	}
	return n
}

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

// The fast path of every body. scanBody fills the same wire shapes that encoding/json would,
// from one pass over the body, without copying raw values (they stay sub-slices of body): a
// chat's messages or a Responses request's input items (made Messages as they are read), or a
// completion's prompt, an embeddings or Responses request's string input (a Prompt). A body
// without them (a Responses request with only previous_response_id) takes the encoding/json
// path. It gives up (ok false) wherever its result could differ from encoding/json's: invalid JSON, a mistyped or null
// required field, a duplicate or case-folded key, an escaped key, a string that is not valid
// UTF-8 or holds a lone surrogate, deep nesting. Parse then takes the encoding/json path, so
// scanBody never decides an error.

// bodyKeys are the top-level keys encoding/json would match (case-insensitively) into wire.
var bodyKeys = [...]string{"model", "messages", "tools", "prompt", "input", "instructions", "stream",
	"stream_options", "max_tokens", "max_completion_tokens", "max_output_tokens", "user", "cache_salt",
	"prompt_cache_key", "previous_response_id", "n"}

// messageKeys are the keys encoding/json would match into wireMessage.
var messageKeys = [...]string{"type", "role", "name", "content", "tool_calls", "tool_call_id", "arguments", "call_id", "output"}

// maxScanDepth bounds the scanner's recursion; deeper bodies take the encoding/json path.
const maxScanDepth = 512

func scanBody(kind Kind, body []byte, sc *Scratch) (sb scanned, ok bool) {
	// The key that holds the prompt: the others are only checked.
	target := "messages"
	switch kind {
	case KindCompletion:
		target = "prompt"
	case KindResponse, KindEmbedding:
		target = "input"
	}
	w, msgs, prompt := &sb.w, &sb.msgs, &sb.prompt
	s := scanner{b: body, sc: sc}
	var maxOut, maxTok, maxComp, n int
	var haveOut, haveTok, haveComp, haveN bool
	ok = s.fields(bodyKeys[:], func(i int) bool {
		switch bodyKeys[i] {
		case "model":
			v, isNull, ok := s.stringOrNull()
			if !ok || isNull || v == "" {
				return false
			}
			w.Model = &v
		case "messages", "input", "prompt":
			if bodyKeys[i] != target {
				return s.skip()
			}
			switch c := s.peek(); {
			case c == '[' && (kind == KindChat || kind == KindResponse):
				// Each message made a Message as it is read; one that convertMessages
				// refuses leaves the body to encoding/json, which words the error.
				*msgs = make([]Message, 0, 4)
				conv := converter{field: target}
				var wm wireMessage
				return s.array(func() bool {
					wm = wireMessage{}
					if !s.message(&wm) {
						return false
					}
					m, err := conv.convert(&wm, len(*msgs))
					*msgs = append(*msgs, m)
					return err == nil
				})
			case c == '"' && kind != KindChat:
				v, _, ok := s.contentString()
				*prompt, sb.hasPrompt = Prompt{Texts: []string{v}}, true
				return ok
			case c == '[':
				sb.hasPrompt = true
				return s.promptArray(prompt)
			}
			return false // null, or what parsePrompt rejects
		case "tools":
			w.Tools = s.raw()
			return w.Tools != nil
		case "instructions":
			return s.optString(&w.Instructions)
		case "user":
			return s.optString(&w.User)
		case "cache_salt":
			s.ws()
			at := s.i
			if !s.optString(&w.CacheSalt.v) {
				return false
			}
			w.CacheSalt.named, w.cacheSaltAt, w.cacheSaltEnd = true, at, s.i
		case "prompt_cache_key":
			return s.optString(&w.PromptCacheKey)
		case "previous_response_id":
			return s.optString(&w.PreviousResponseID)
		case "stream":
			switch {
			case s.literal("true"):
				w.Stream = new(true)
			case s.literal("false"):
				w.Stream = new(false)
			default:
				return s.literal("null")
			}
		case "stream_options":
			w.StreamOptions = s.raw()
			return w.StreamOptions != nil
		case "max_tokens":
			return s.optInt(&maxTok, &haveTok)
		case "max_completion_tokens":
			return s.optInt(&maxComp, &haveComp)
		case "max_output_tokens":
			return s.optInt(&maxOut, &haveOut)
		case "n":
			return s.optInt(&n, &haveN)
		}
		return true
	})
	if !ok || !s.end() || w.Model == nil || (*msgs == nil && !sb.hasPrompt) {
		return scanned{}, false
	}
	if haveTok {
		w.MaxTokens = &maxTok
	}
	if haveComp {
		w.MaxCompletionTokens = &maxComp
	}
	if haveOut {
		w.MaxOutputTokens = &maxOut
	}
	if haveN {
		w.N = &n
	}
	return sb, true
}

// scanned is what scanBody read: the fields, and the prompt as a chat's messages or a
// Responses request's input items (msgs) or as a completion's prompt, an embeddings or
// Responses request's string input (prompt).
type scanned struct {
	w         wire
	msgs      []Message
	prompt    Prompt
	hasPrompt bool
}

// promptArray reads a prompt that is an array, as parsePrompt does: of strings, of token ids,
// or of token-id arrays, by its first element. ok is false for anything else (an empty array,
// mixed or null elements, a token id that is not an int64), which the caller leaves to
// parsePrompt.
func (s *scanner) promptArray(p *Prompt) bool {
	n := 0
	var first byte // the first element's first byte: '"' strings, '[' token-id arrays, else token ids
	ok := s.array(func() bool {
		c := s.peek()
		if n == 0 {
			first = c
			switch first {
			case '"':
			case '[':
				p.Tokens = [][]int64{}
			default:
				p.Tokens = [][]int64{make([]int64, 0, s.flatLen(s.i))}
			}
		}
		n++
		switch first {
		case '"':
			if c != '"' {
				return false
			}
			v, _, ok := s.contentString()
			p.Texts = append(p.Texts, v)
			return ok
		case '[':
			s.ws()
			ids := make([]int64, 0, s.flatLen(s.i+1))
			ok := s.array(func() bool {
				id, ok := s.tokenID()
				ids = append(ids, id)
				return ok
			})
			p.Tokens = append(p.Tokens, ids)
			return ok
		}
		id, ok := s.tokenID()
		p.Tokens[0] = append(p.Tokens[0], id)
		return ok
	})
	return ok && n > 0
}

// flatLen returns how many elements the array whose first element is at i holds, when it is
// an array of numbers (no nested array, object or string before its end): one more than its
// commas. Token-id slices are sized with it (a 100,000-token prompt otherwise grew through
// doubling to 5 times its final 800 KB); 0 when it cannot tell.
func (s *scanner) flatLen(i int) int {
	if i >= len(s.b) {
		return 0 // the body ends there: the array's own read fails
	}
	end := bytes.IndexByte(s.b[i:], ']')
	if end < 0 || bytes.ContainsAny(s.b[i:i+end], "[{\"") {
		return 0
	}
	return bytes.Count(s.b[i:i+end], []byte{','}) + 1
}

// tokenID reads an integer as encoding/json reads an int64 (no fraction, no exponent, no null).
// The digits are read here: by strconv, a 100,000-token prompt's ids took 5 ms.
func (s *scanner) tokenID() (int64, bool) {
	s.ws()
	i := s.i
	neg := i < len(s.b) && s.b[i] == '-'
	if neg {
		i++
	}
	start := i
	var n uint64
	for ; i < len(s.b) && s.b[i] >= '0' && s.b[i] <= '9' && i-start < 20; i++ {
		n = n*10 + uint64(s.b[i]-'0')
	}
	digits := i - start
	if digits == 0 || digits > 19 || digits > 1 && s.b[start] == '0' {
		return 0, false // none, too many for an int64 (or a uint64 to hold), a leading zero
	}
	if i < len(s.b) && (s.b[i] == '.' || s.b[i] == 'e' || s.b[i] == 'E' || s.b[i] >= '0' && s.b[i] <= '9') {
		return 0, false
	}
	if n > math.MaxInt64 && !(neg && n == 1<<63) {
		return 0, false
	}
	s.i = i
	if neg {
		return -int64(n), true
	}
	return int64(n), true
}

// keyIndex returns the index of key in names; -1 when key matches none, not even ignoring
// case; -2 when encoding/json might still match it (escaped, non-ASCII or case-folded).
func keyIndex(key []byte, names []string) int {
	for i, n := range names {
		if string(key) == n {
			return i
		}
	}
	for _, c := range key {
		if c == '\\' || c >= utf8.RuneSelf {
			return -2
		}
	}
	for _, n := range names {
		if bytes.EqualFold(key, []byte(n)) {
			return -2
		}
	}
	return -1
}

// message reads one messages[] object into m.
func (s *scanner) message(m *wireMessage) bool {
	return s.fields(messageKeys[:], func(i int) bool {
		switch messageKeys[i] {
		case "type":
			return s.plainField(&m.Type)
		case "role":
			return s.plainField(&m.Role)
		case "name":
			return s.plainField(&m.Name)
		case "tool_call_id":
			return s.plainField(&m.ToolCallID)
		case "arguments":
			return s.plainField(&m.Arguments)
		case "call_id":
			return s.plainField(&m.CallID)
		case "content":
			return s.content(&m.Content, &m.dec)
		case "output":
			return s.content(&m.Output, &m.out) // a function_call_output item's text
		case "tool_calls":
			// Every step of an agent's session has one: read here, and by encoding/json only
			// where the scanner is unsure (null included), from where it started.
			s.ws()
			start := s.i
			if calls, ok := s.toolCalls(); ok {
				m.ToolCalls = calls
				return true
			}
			s.i = start // depth is as it was: every level restores it
			raw := s.raw()
			if raw == nil {
				return false
			}
			if bytes.Equal(raw, []byte("null")) {
				return true
			}
			if foldedIn(raw, levelToolCall) != nil {
				return false // refused by parseDecoded
			}
			return json.Unmarshal(raw, &m.ToolCalls) == nil
		}
		return true
	})
}

// content reads a message's content (or an item's output) into raw, with its text (a string)
// or parts (an array) decoded into d, so that convertMessages need not scan them again.
func (s *scanner) content(raw *json.RawMessage, d *decoded) bool {
	switch s.peek() {
	case '"':
		start := s.i
		v, _, ok := s.contentString()
		*raw, d.text, d.hasText = s.b[start:s.i], v, true
		return ok
	case '[':
		// Content parts, as many SDKs send even plain text: read here too, where parseContent
		// would decode a long conversation's text with encoding/json three times over (the
		// array, each part, its text).
		start := s.i
		parts, ok := s.contentParts()
		*raw, d.parts, d.hasParts = s.b[start:s.i], parts, ok
		return ok
	}
	*raw = s.raw()
	return *raw != nil
}

// partKeys and toolCallKeys, functionKeys are the keys parseContent reads in a content part and
// encoding/json in a tool call.
var (
	partKeys     = [...]string{"type", "text"}
	toolCallKeys = [...]string{"function"}
	functionKeys = [...]string{"name", "arguments"}
)

// contentParts reads an array of content parts into what parseContent makes of it: a text
// part's text (a view of the body, as a string content is), any other part a stand-in of its
// type and a hash of its JSON. ok is false on whatever parseContent rejects or encoding/json
// might read otherwise (a part that is not an object, a duplicate or case-folded key, a
// mistyped field), which the caller then leaves to them.
func (s *scanner) contentParts() ([]string, bool) {
	parts := []string{} // [] is no parts, not no content
	ok := s.array(func() bool {
		start := s.i
		var typ, text string
		var hasText bool
		ok := s.fields(partKeys[:], func(i int) bool {
			if i == 0 {
				return s.plainField(&typ)
			}
			v, isNull, ok := s.contentString()
			text, hasText = v, !isNull
			return ok
		})
		if !ok {
			return false
		}
		if hasText {
			parts = append(parts, text)
		} else {
			parts = append(parts, "["+typ+" "+hashHex(s.b[start:s.i])+"]")
		}
		return true
	})
	return parts, ok
}

// toolCalls reads a tool_calls array as encoding/json reads it into []wireToolCall (each call's
// function name and arguments; the rest skipped). ok is false when unsure (an element or a
// function that is not an object, a duplicate or case-folded key, a mistyped field), and the
// caller decodes it with encoding/json.
func (s *scanner) toolCalls() ([]wireToolCall, bool) {
	calls := []wireToolCall{}
	ok := s.array(func() bool {
		var tc wireToolCall
		ok := s.fields(toolCallKeys[:], func(int) bool { // "function"
			return s.fields(functionKeys[:], func(i int) bool {
				if i == 0 {
					return s.plainField(&tc.Function.Name)
				}
				return s.plainField(&tc.Function.Arguments)
			})
		})
		calls = append(calls, tc)
		return ok
	})
	return calls, ok
}

// scanner reads JSON from b at i. Every method skips leading whitespace and returns false on
// anything it does not accept; the scanner is then abandoned.
type scanner struct {
	b     []byte
	i     int
	depth int
	ascii bool // the last string literal read had only ASCII bytes
	// inContent is set while a message's content is read: a long one is a view of the body,
	// or decoded into sc (when not nil); any other string is copied.
	inContent bool
	sc        *Scratch
}

func (s *scanner) ws() {
	for s.i < len(s.b) && isSpace(s.b[s.i]) {
		s.i++
	}
}

// peek returns the next non-space byte, 0 at the end.
func (s *scanner) peek() byte {
	s.ws()
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

func (s *scanner) eat(c byte) bool {
	if s.peek() == c {
		s.i++
		return true
	}
	return false
}

// end reports whether only whitespace is left.
func (s *scanner) end() bool { s.ws(); return s.i == len(s.b) }

// object reads an object, calling member with each raw key (escapes not decoded) positioned
// at its value; member must consume the value.
func (s *scanner) object(member func(key []byte) bool) bool {
	if !s.eat('{') {
		return false
	}
	if s.eat('}') {
		return true
	}
	for {
		if s.peek() != '"' {
			return false
		}
		key, _, ok := s.stringSpan()
		if !ok || !s.eat(':') || !member(key) {
			return false
		}
		if s.eat(',') {
			continue
		}
		return s.eat('}')
	}
}

// fields reads an object as encoding/json reads one into a struct with these fields (at most
// 32): member is called positioned at the value of each, with its index in keys; any other key's
// value is checked and skipped. false on a duplicate (encoding/json's merging rules are not worth
// copying) or a key encoding/json might fold into one of keys.
func (s *scanner) fields(keys []string, member func(i int) bool) bool {
	var seen uint32
	return s.object(func(key []byte) bool {
		i := keyIndex(key, keys)
		if i < 0 {
			return i == -1 && s.skip()
		}
		if seen&(1<<i) != 0 {
			return false
		}
		seen |= 1 << i
		return member(i)
	})
}

// nullOrFields reads null, or an object as fields does.
func (s *scanner) nullOrFields(keys []string, member func(i int) bool) bool {
	return s.literal("null") || s.peek() == '{' && s.fields(keys, member)
}

// contentString is stringOrNull for a message content or a prompt: one from minShared bytes is a
// view of the body or of the scratch, not a copy.
func (s *scanner) contentString() (v string, isNull, ok bool) {
	s.inContent = true
	v, isNull, ok = s.stringOrNull()
	s.inContent = false
	return v, isNull, ok
}

// array reads an array, calling elem positioned at each element.
func (s *scanner) array(elem func() bool) bool {
	if !s.eat('[') {
		return false
	}
	if s.eat(']') {
		return true
	}
	for {
		s.ws()
		if !elem() {
			return false
		}
		if s.eat(',') {
			continue
		}
		return s.eat(']')
	}
}

// stringSpan reads a string literal at s.i and returns its contents between the quotes, and
// whether it holds escapes. It checks the escapes and rejects control characters, as JSON does.
// It notes in s.ascii whether the literal's bytes are all ASCII (then they are valid UTF-8, and
// unquote need not check them again: a second pass over a 400 KB prompt).
func (s *scanner) stringSpan() (in []byte, escaped, ok bool) {
	if s.i >= len(s.b) || s.b[s.i] != '"' {
		return nil, false, false
	}
	s.ascii = true
	start := s.i + 1
	for i := start; i < len(s.b); i++ {
		// The common case, plain ASCII text: sixteen bytes at a time, one test per word.
		for i+16 <= len(s.b) && special(binary.LittleEndian.Uint64(s.b[i:]))|
			special(binary.LittleEndian.Uint64(s.b[i+8:])) == 0 {
			i += 16
		}
		for i+8 <= len(s.b) && special(binary.LittleEndian.Uint64(s.b[i:])) == 0 {
			i += 8
		}
		for i < len(s.b) && !strSpecial[s.b[i]] {
			i++
		}
		if i == len(s.b) {
			break
		}
		switch c := s.b[i]; {
		case c == '"':
			s.i = i + 1
			return s.b[start:i], escaped, true
		case c == '\\':
			escaped = true
			if i+1 >= len(s.b) {
				return nil, false, false
			}
			switch s.b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i++
			case 'u':
				if i+5 >= len(s.b) {
					return nil, false, false
				}
				for _, h := range s.b[i+2 : i+6] {
					if hexVal(h) < 0 {
						return nil, false, false
					}
				}
				i += 5
			default:
				return nil, false, false
			}
		case c < 0x20:
			return nil, false, false
		default: // c >= 0x80: back to the words after it
			s.ascii = false
		}
	}
	return nil, false, false
}

// strSpecial marks the bytes a string literal's scan must stop at: the quote, the backslash,
// the control characters JSON does not allow unescaped, and the non-ASCII bytes (noted, then
// the scan goes on a word at a time).
var strSpecial = func() (t [256]bool) {
	for c := range 0x20 {
		t[c] = true
	}
	for c := 0x80; c < 0x100; c++ {
		t[c] = true
	}
	t['"'], t['\\'] = true, true
	return t
}()

// Eight-bytes-at-a-time tests (bytes packed in a uint64): "has a byte below n" is exact
// for n <= 128; a word that answers true is rescanned a byte at a time.
const (
	ones  = 0x0101010101010101
	highs = 0x8080808080808080
)

// special is not zero when the word may hold a quote, a backslash, a control character or a
// non-ASCII byte, in one test without branches: a non-ASCII byte shows its own high bit; in an
// ASCII byte, a high bit comes only from a subtraction that went below zero (the byte is below
// 0x20, or equal to the quote or the backslash) or from the borrow of such a byte below it.
func special(x uint64) uint64 {
	return ((x - 0x20*ones) | ((x ^ '"'*ones) - ones) | ((x ^ '\\'*ones) - ones) | x) & highs
}

func hexVal(c byte) int {
	switch {
	case '0' <= c && c <= '9':
		return int(c - '0')
	case 'a' <= c && c <= 'f':
		return int(c-'a') + 10
	case 'A' <= c && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}

// stringOrNull reads a string (decoded) or null.
func (s *scanner) stringOrNull() (v string, isNull, ok bool) {
	if s.peek() != '"' {
		return "", true, s.literal("null")
	}
	in, escaped, ok := s.stringSpan()
	if !ok {
		return "", false, false
	}
	v, ok = s.unquote(in, escaped)
	return v, false, ok
}

// optString reads a string or null into a *string field, as encoding/json does.
func (s *scanner) optString(dst **string) bool {
	v, isNull, ok := s.stringOrNull()
	if ok && !isNull {
		*dst = &v
	}
	return ok
}

// plainField reads a string or null into a string field (null leaves it as it is).
func (s *scanner) plainField(dst *string) bool {
	v, isNull, ok := s.stringOrNull()
	if ok && !isNull {
		*dst = v
	}
	return ok
}

// optInt reads an integer or null, as encoding/json reads an *int (no fraction, no exponent).
func (s *scanner) optInt(dst *int, have *bool) bool {
	if s.literal("null") {
		return true
	}
	start := s.i
	if !s.number() {
		return false
	}
	n, err := strconv.Atoi(string(s.b[start:s.i]))
	if err != nil {
		return false
	}
	*dst, *have = n, true
	return true
}

// unquote decodes the contents of the string literal just read. ok is false for invalid UTF-8
// and lone surrogates, which encoding/json would replace with U+FFFD.
//
// A long message content without escapes is not copied: the string is a view of the body,
// which Parse keeps as Raw and its caller must not change. (A 100k-token prompt is 400 KB: a
// copy of it was a tenth of the router's CPU per request.) One with escapes is decoded into the
// scanner's Scratch when it has one. Every other string, such as the model name, is copied, so
// that one kept for longer than the request (a map key, a label) holds neither the body nor
// memory that the next request will reuse.
func (s *scanner) unquote(in []byte, escaped bool) (string, bool) {
	ascii, shared := s.ascii, s.inContent && len(in) >= minShared
	if !escaped {
		if !ascii && !utf8.Valid(in) {
			return "", false
		}
		if shared {
			return unsafe.String(unsafe.SliceData(in), len(in)), true
		}
		return string(in), true
	}
	var out []byte
	if shared && s.sc != nil {
		out = s.sc.take(len(in)) // what escapes decode to is never longer than they are
	} else {
		out = make([]byte, 0, len(in))
	}
	for i := 0; i < len(in); i++ {
		// The text up to the next escape in one copy (a byte at a time, the line breaks of a
		// 400 KB prompt made this loop cost five times the scan).
		j := bytes.IndexByte(in[i:], '\\')
		if j < 0 {
			out = append(out, in[i:]...)
			break
		}
		out = append(out, in[i:i+j]...)
		i += j + 1
		switch in[i] {
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			r := hex4(in[i+1:])
			i += 4
			if utf16.IsSurrogate(r) {
				if i+6 >= len(in) || in[i+1] != '\\' || in[i+2] != 'u' {
					return "", false
				}
				r = utf16.DecodeRune(r, hex4(in[i+3:]))
				if r == utf8.RuneError {
					return "", false
				}
				i += 6
			}
			out = utf8.AppendRune(out, r)
		default: // '"', '\\', '/'
			out = append(out, in[i])
		}
	}
	if !ascii && !utf8.Valid(out) { // what escapes decode to is valid UTF-8
		return "", false
	}
	if shared && s.sc != nil {
		s.sc.buf = s.sc.buf[:len(s.sc.buf)+len(out)] // out is s.sc.buf's next bytes
	}
	return unsafe.String(unsafe.SliceData(out), len(out)), true // never written again (until Reset)
}

// minShared is the length from which a decoded content string shares memory (the body's, or
// the scratch's) rather than being copied. Until 6 December it was 4 KB: a 4 KB chat's system
// prompt of 3.9 KB, and every turn of an agent's session, were copies (BenchmarkHandlerOnly4K
// 21.1 KB allocated per request, now 16.8; an agent's 100k-token session 827 KB, now 412, and
// 12 % less CPU). Shorter ones, a few hundred bytes, are copied: they cost little either way.
const minShared = 256

// hex4 decodes four hex digits already checked by stringSpan.
func hex4(b []byte) rune {
	return rune(hexVal(b[0])<<12 | hexVal(b[1])<<8 | hexVal(b[2])<<4 | hexVal(b[3]))
}

// literal consumes word (true, false, null) when it comes next.
func (s *scanner) literal(word string) bool {
	s.ws()
	if !bytes.HasPrefix(s.b[s.i:], []byte(word)) {
		return false
	}
	s.i += len(word)
	return true
}

// number consumes a JSON number.
func (s *scanner) number() bool {
	s.ws()
	b, i := s.b, s.i
	digits := func() bool {
		j := i
		for i < len(b) && '0' <= b[i] && b[i] <= '9' {
			i++
		}
		return i > j
	}
	if i < len(b) && b[i] == '-' {
		i++
	}
	if i < len(b) && b[i] == '0' {
		i++
	} else if !digits() {
		return false
	}
	if i < len(b) && b[i] == '.' {
		i++
		if !digits() {
			return false
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if !digits() {
			return false
		}
	}
	s.i = i
	return true
}

// raw consumes one value and returns its bytes, nil when it is not valid JSON.
func (s *scanner) raw() []byte {
	s.ws()
	start := s.i
	if !s.skip() {
		return nil
	}
	return s.b[start:s.i]
}

// skip consumes one value, checking that it is valid JSON.
func (s *scanner) skip() bool {
	switch s.peek() {
	case '"':
		_, _, ok := s.stringSpan()
		return ok
	case '{', '[':
		if s.depth >= maxScanDepth {
			return false
		}
		s.depth++
		defer func() { s.depth-- }()
		if s.b[s.i] == '{' {
			return s.object(func([]byte) bool { return s.skip() })
		}
		return s.array(func() bool { return s.skip() })
	case 't':
		return s.literal("true")
	case 'f':
		return s.literal("false")
	case 'n':
		return s.literal("null")
	}
	return s.number()
}

// usageKeys are the top-level keys FindUsage decodes.
var usageKeys = [...]string{"usage", "response"}

// ScanUsage returns what FindUsage returns, but reads a body in one pass that decodes only its
// top-level "usage" object, or the one in its "response" object (a Responses API stream event),
// not the choices or the output and their text: a Responses answer of 4,000 tokens took
// FindUsage 138 µs, ScanUsage 7. Anything unusual is left to FindUsage.
func ScanUsage(body []byte) (Usage, bool) {
	s := scanner{b: body}
	var usage, inner []byte
	ok := s.fields(usageKeys[:], func(i int) bool {
		if i == 0 {
			usage = s.raw()
			return usage != nil
		}
		return s.nullOrFields(usageKeys[:1], func(int) bool {
			inner = s.raw()
			return inner != nil
		})
	})
	if !ok || !s.end() {
		return FindUsage(body)
	}
	// encoding/json decodes both, and fails on either.
	top, topSet, ok1 := usageValue(usage)
	in, inSet, ok2 := usageValue(inner)
	switch {
	case !ok1 || !ok2:
		return Usage{}, false
	case topSet:
		return top, true
	}
	return in, inSet
}

// TailUsage finds the usage in the end of an answer too long to keep whole: the last "usage"
// key in tail whose value is an object that decodes as usage. Engines write usage after the
// choices (vLLM, SGLang, llama.cpp), so an answer's last bytes hold it; a "usage" inside the
// generated text is escaped (\"usage\") and cannot match.
func TailUsage(tail []byte) (Usage, bool) {
	key := []byte(`"usage"`)
	for end := len(tail); ; {
		i := bytes.LastIndex(tail[:end], key)
		if i < 0 {
			return Usage{}, false
		}
		end = i
		rest := bytes.TrimLeft(tail[i+len(key):], " \t\r\n")
		if len(rest) == 0 || rest[0] != ':' {
			continue
		}
		rest = bytes.TrimLeft(rest[1:], " \t\r\n")
		if len(rest) == 0 || rest[0] != '{' {
			continue
		}
		var raw json.RawMessage
		if json.NewDecoder(bytes.NewReader(rest)).Decode(&raw) != nil {
			continue
		}
		if u, set, ok := usageValue(raw); ok && set {
			return u, true
		}
	}
}

// usageValue decodes a usage object's JSON as encoding/json decodes it into a *Usage: set is
// false for none or null, ok false where encoding/json fails.
func usageValue(raw []byte) (_ Usage, set, ok bool) {
	if raw == nil || bytes.Equal(raw, []byte("null")) {
		return Usage{}, false, true
	}
	if u, ok := scanUsageObject(raw); ok {
		return u, true, true
	}
	var d Usage // on the heap (json.Unmarshal): only here
	if json.Unmarshal(raw, &d) != nil {
		return Usage{}, false, false
	}
	return d, true, true
}

// usageObjectKeys are the keys encoding/json would match into Usage.
var usageObjectKeys = [...]string{"prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details",
	"input_tokens", "output_tokens", "input_tokens_details"}

// scanUsageObject decodes a usage object as encoding/json would into Usage; ok is false when it
// cannot be sure (a mistyped field, a duplicate or case-folded key), and the caller decodes it
// with encoding/json.
func scanUsageObject(raw []byte) (u Usage, ok bool) {
	s := scanner{b: raw}
	var have bool
	ok = s.fields(usageObjectKeys[:], func(i int) bool {
		switch usageObjectKeys[i] {
		case "prompt_tokens":
			return s.optInt(&u.PromptTokens, &have)
		case "completion_tokens":
			return s.optInt(&u.CompletionTokens, &have)
		case "total_tokens":
			return s.optInt(&u.TotalTokens, &have)
		case "input_tokens":
			return s.optInt(&u.InputTokens, &have)
		case "output_tokens":
			return s.optInt(&u.OutputTokens, &have)
		case "prompt_tokens_details":
			return s.tokenDetails(&u.PromptTokensDetails)
		case "input_tokens_details":
			return s.tokenDetails(&u.InputTokensDetails)
		}
		return true
	})
	return u, ok && s.end()
}

// tokenDetails reads a TokenDetails object or null.
func (s *scanner) tokenDetails(dst **TokenDetails) bool {
	if s.literal("null") {
		*dst = nil
		return true
	}
	d := new(TokenDetails)
	var seen, have bool
	ok := s.object(func(key []byte) bool {
		switch keyIndex(key, []string{"cached_tokens"}) {
		case 0:
			if seen {
				return false
			}
			seen = true
			return s.optInt(&d.CachedTokens, &have)
		case -1:
			return s.skip()
		}
		return false
	})
	*dst = d
	return ok
}
