package loadgen

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// maxEventLine bounds one SSE line, so that a broken server cannot make the reader buffer
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

// StreamReader reads OpenAI-style server-sent events ("data: {json}" lines ending with
// "data: [DONE]") one chunk at a time.
type StreamReader struct {
	r *bufio.Reader
}

// NewStreamReader reads events from r.
func NewStreamReader(r io.Reader) *StreamReader {
	return &StreamReader{r: bufio.NewReaderSize(r, 16<<10)}
}

// Next returns the next data chunk. It returns ErrDone after [DONE], io.EOF when the stream
// ends without it (the caller decides whether that is an error), and a parse error for a data
// line that is not a JSON object.
func (s *StreamReader) Next() (Chunk, error) {
	for {
		line, err := s.readLine()
		if err != nil {
			return Chunk{}, err
		}
		data, ok := bytes.CutPrefix(line, []byte("data:"))
		if !ok {
			continue // blank separators, comments (":"), event: and id: lines
		}
		data = bytes.TrimSpace(data)
		if len(data) == 0 {
			continue
		}
		if string(data) == "[DONE]" {
			return Chunk{}, ErrDone
		}
		return parseChunk(data)
	}
}

func (s *StreamReader) readLine() ([]byte, error) {
	var buf []byte
	for {
		part, isPrefix, err := s.r.ReadLine()
		if err != nil {
			if err == io.EOF && len(buf) > 0 {
				return buf, nil
			}
			return nil, err
		}
		if !isPrefix && buf == nil {
			return part, nil
		}
		buf = append(buf, part...)
		if len(buf) > maxEventLine {
			return nil, fmt.Errorf("sse line longer than %d bytes", maxEventLine)
		}
		if !isPrefix {
			return buf, nil
		}
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
