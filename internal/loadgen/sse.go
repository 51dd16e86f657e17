package loadgen

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/kvroute/kvroute/internal/openai"
)

// maxEventLine bounds one SSE event, so that a broken server cannot make the reader buffer
// without limit.
const maxEventLine = 4 << 20

// Chunk is what the generator reads from one streamed completion chunk.
type Chunk struct {
	// Content is the text the chunk carries (chat delta content, or completions text).
	Content string
	// Usage is set on the chunk that carries usage (the last one with include_usage).
	Usage *Usage
	// Error is set when the server sent an error object inside the stream.
	Error string
}

// Usage is the OpenAI usage object, as far as the generator reads it.
type Usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	Details          *struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

// CachedTokens returns usage.prompt_tokens_details.cached_tokens, or -1 when absent.
func (u *Usage) CachedTokens() int {
	if u == nil || u.Details == nil {
		return -1
	}
	return u.Details.CachedTokens
}

type wireChunk struct {
	Choices []struct {
		Text  string `json:"text"`
		Delta struct {
			Content string `json:"content"`
		} `json:"delta"`
		Message struct {
			Content string `json:"content"`
		} `json:"message"`
	} `json:"choices"`
	Usage *Usage `json:"usage"`
	Error *struct {
		Message string `json:"message"`
	} `json:"error"`
}

// ErrDone is returned by StreamReader.Next after the [DONE] sentinel.
var ErrDone = errors.New("stream done")

// StreamReader reads OpenAI-style server-sent events ("data: {json}" events ending with
// "data: [DONE]") one completion chunk at a time. The event framing is package openai's.
type StreamReader struct {
	r *openai.SSEReader
}

// NewStreamReader reads events from r.
func NewStreamReader(r io.Reader) *StreamReader {
	return &StreamReader{r: openai.NewSSEReader(r, maxEventLine)}
}

// Next returns the next data chunk. It returns ErrDone after [DONE], io.EOF when the stream
// ends without it (the caller decides whether that is an error), and a parse error for data
// that is not a JSON object.
func (s *StreamReader) Next() (Chunk, error) {
	for {
		ev, err := s.r.Next()
		if err != nil {
			return Chunk{}, err
		}
		if ev.IsDone() {
			return Chunk{}, ErrDone
		}
		data := bytes.TrimSpace(ev.Data)
		if len(data) == 0 {
			continue // comments, keep-alives, events without data
		}
		return parseChunk(data)
	}
}

func parseChunk(data []byte) (Chunk, error) {
	var w wireChunk
	if err := json.Unmarshal(data, &w); err != nil {
		return Chunk{}, fmt.Errorf("sse data is not a completion chunk: %w", err)
	}
	var c Chunk
	for _, ch := range w.Choices {
		c.Content += ch.Delta.Content + ch.Text + ch.Message.Content
	}
	c.Usage = w.Usage
	if w.Error != nil {
		c.Error = w.Error.Message
		if c.Error == "" {
			c.Error = "error object without message"
		}
	}
	return c, nil
}
