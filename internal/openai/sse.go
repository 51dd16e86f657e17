package openai

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
)

// ErrSSELineTooLong is returned by SSEReader.Next when a line or an event exceeds the reader's
// bound.
var ErrSSELineTooLong = errors.New("sse: line or event too long")

// Event is one server-sent event. Raw holds its exact bytes as received, including the blank
// line that ends it, so a proxy can pass it on unchanged.
type Event struct {
	Name string // the "event:" field, "" for the default "message"
	Data []byte // the "data:" lines joined by "\n"
	ID   string
	Raw  []byte
	// Cut: the stream ended inside this event, before the blank line that ends it (Raw holds
	// what came). Its data may be whole (an engine that ends with "data: [DONE]\n") or not.
	Cut bool
}

// IsDone reports whether the event is the OpenAI stream terminator "data: [DONE]".
func (e *Event) IsDone() bool { return bytes.Equal(e.Data, []byte("[DONE]")) }

// IsErrorData reports whether an event's data is an error object rather than a chunk: an
// engine that fails a stream after its head sends one (vLLM: {"error": {...}}, or its older
// {"object": "error", ...}), then usually [DONE].
func IsErrorData(data []byte) bool {
	d := bytes.TrimLeft(data, " \t")
	if len(d) == 0 || d[0] != '{' {
		return false
	}
	d = bytes.TrimLeft(d[1:], " \t\r\n")
	if bytes.HasPrefix(d, []byte(`"error"`)) {
		return true
	}
	if !bytes.HasPrefix(d, []byte(`"object"`)) {
		return false
	}
	d = bytes.TrimLeft(d[len(`"object"`):], " \t")
	if len(d) == 0 || d[0] != ':' {
		return false
	}
	return bytes.HasPrefix(bytes.TrimLeft(d[1:], " \t"), []byte(`"error"`))
}

// Empty reports whether the event carries neither data nor a name: comment lines only (a
// keep-alive such as ": ping"), or only id or retry fields. It is no token and no progress.
func (e *Event) Empty() bool { return len(e.Data) == 0 && e.Name == "" }

// SSEReader reads server-sent events incrementally. Lines end in "\n" or "\r\n". It buffers at
// most one event, of at most maxEvent bytes.
type SSEReader struct {
	r        *bufio.Reader
	maxEvent int
	raw      []byte // the event's bytes as received; Event.Raw
	data     []byte // the data lines joined, when there are several
	name, id string // the last event name and id, reused while they repeat
}

// NewSSEReader returns a reader of events from r, each at most maxEvent bytes (4 KiB when
// maxEvent < 4096). Its own buffer (sseBuffer) is as small as lets it hold, after one read, the
// several events an engine sends at once, so that a proxy can pass them on in one write
// (HasEvent); r, an HTTP body, is buffered already.
func NewSSEReader(r io.Reader, maxEvent int) *SSEReader {
	maxEvent = max(maxEvent, 4096)
	return &SSEReader{r: bufio.NewReaderSize(r, sseBuffer), maxEvent: maxEvent}
}

// sseBuffer is the SSEReader's own buffer: the size of an HTTP connection's read buffer, so
// that one read takes what the connection holds (a completion chunk is about 250 bytes).
const sseBuffer = 4 << 10

// HasEvent reports whether a whole event is buffered already, so that Next will return it
// without waiting for the stream. A proxy uses it to pass on together the events an engine
// sent together. It never reads.
func (s *SSEReader) HasEvent() bool {
	b, _ := s.r.Peek(s.r.Buffered())
	fields := false
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			return false // an unfinished line
		}
		blank := i == 0 || i == 1 && b[0] == '\r'
		if blank && fields {
			return true
		}
		fields = fields || !blank
		b = b[i+1:]
	}
	return false
}

// Reset makes s read from r, keeping its buffers (for a pool of readers).
func (s *SSEReader) Reset(r io.Reader) {
	s.r.Reset(r)
	s.raw, s.data = s.raw[:0], s.data[:0]
}

// Next returns the next event. At the end of the stream it returns io.EOF; a stream that ends
// in the middle of an event returns that event first (with the bytes received, Cut set), then
// io.EOF.
// Comment lines (": ping") count as an event without data, so a proxy passes them on.
//
// The returned Event's Data and Raw share the reader's buffers: they are valid until the next
// call to Next or Reset (copy them to keep them). Reading allocates nothing once the buffers
// have grown to the largest event, except a Name or ID that differs from the previous one.
func (s *SSEReader) Next() (Event, error) {
	s.raw = s.raw[:0]
	var ev Event
	dataLines := 0
	fields := 0
	finish := func(cut bool) Event {
		ev.Raw, ev.Cut = s.raw, cut
		return ev
	}
	for {
		start := len(s.raw)
		err := s.readLine()
		if err != nil && err != io.EOF {
			return Event{}, err
		}
		got := s.raw[start:]
		if err == io.EOF && len(got) == 0 {
			if fields == 0 {
				return Event{}, io.EOF
			}
			return finish(true), nil
		}
		line := bytes.TrimSuffix(bytes.TrimSuffix(got, []byte("\n")), []byte("\r"))
		if len(line) == 0 {
			if fields > 0 {
				return finish(false), nil
			}
			if err == io.EOF {
				return Event{}, io.EOF
			}
			continue // blank lines before an event stay in its Raw
		}
		fields++
		field, value, _ := bytes.Cut(line, []byte(":"))
		value = bytes.TrimPrefix(value, []byte(" "))
		switch string(field) {
		case "data":
			switch dataLines {
			case 0: // the common case: Data is the value inside Raw, capped so that appends copy
				ev.Data = value[:len(value):len(value)]
			case 1:
				s.data = append(append(append(s.data[:0], ev.Data...), '\n'), value...)
				ev.Data = s.data
			default:
				s.data = append(append(s.data, '\n'), value...)
				ev.Data = s.data
			}
			dataLines++
		case "event":
			if string(value) != s.name {
				s.name = string(value)
			}
			ev.Name = s.name
		case "id":
			if string(value) != s.id {
				s.id = string(value)
			}
			ev.ID = s.id
		}
		if err == io.EOF {
			return finish(true), nil
		}
	}
}

// readLine appends one line, with its "\n", to s.raw; io.EOF when the stream ends (the partial
// line, if any, is appended).
func (s *SSEReader) readLine() error {
	for {
		chunk, err := s.r.ReadSlice('\n')
		if len(s.raw)+len(chunk) > s.maxEvent {
			return fmt.Errorf("%w (limit %d bytes)", ErrSSELineTooLong, s.maxEvent)
		}
		s.raw = append(s.raw, chunk...)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		default:
			return err
		}
	}
}

// WriteEvent writes one event ("event: name" when name is set, then data split on "\n" into
// data lines, then a blank line) and flushes w when it can.
func WriteEvent(w io.Writer, name string, data []byte) error {
	var b bytes.Buffer
	if name != "" {
		b.WriteString("event: ")
		b.WriteString(name)
		b.WriteByte('\n')
	}
	for line := range bytes.SplitSeq(data, []byte("\n")) {
		b.WriteString("data: ")
		b.Write(line)
		b.WriteByte('\n')
	}
	b.WriteByte('\n')
	if _, err := w.Write(b.Bytes()); err != nil {
		return fmt.Errorf("sse write: %w", err)
	}
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
	return nil
}

// WriteDone writes the OpenAI stream terminator "data: [DONE]".
func WriteDone(w io.Writer) error { return WriteEvent(w, "", []byte("[DONE]")) }
