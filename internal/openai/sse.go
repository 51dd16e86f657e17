package openai

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"unicode/utf8"
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
	// Foreign: a line of the event is neither a field of the event-stream format (data, event,
	// id, retry) nor a comment: bytes that are no event stream (an HTML page, a log line,
	// NULs). The format has a client ignore such a line; no engine that speaks it sends one.
	// The last line of a stream that ended without a line end after it is a fragment, which
	// may be a field cut short ("dat"): not Foreign.
	Foreign bool
	// ErrorLine is the value of an "error:" line that holds a JSON object: llama.cpp's server
	// sent a stream's error so, `error: {"code":400,"message":...,"type":...}`, then [DONE]
	// (later releases answer a first error with its status, and send a later one as data). No
	// field of the format, but the engine's own error, not bytes that are no event stream; an
	// "error:" line with another value is Foreign.
	ErrorLine []byte
}

// IsDone reports whether the event is the OpenAI stream terminator "data: [DONE]" (white
// space around [DONE] aside, as Malformed trims a chunk's).
func (e *Event) IsDone() bool { return bytes.Equal(bytes.TrimSpace(e.Data), []byte("[DONE]")) }

// EngineError returns the error object an engine sent as an event of its stream, nil when it
// sent none: an "error:" line's (ErrorLine), or data that IsErrorData says is an error
// (vLLM's, and newer llama.cpp's, `data: {"error": {...}}`).
func (e *Event) EngineError() []byte {
	if len(e.ErrorLine) > 0 {
		return e.ErrorLine
	}
	if IsErrorData(e.Data) {
		return e.Data
	}
	return nil
}

// Ends reports whether e ends its stream: the chat and completions APIs' [DONE], or a
// Responses API terminal event.
func (e *Event) Ends() bool {
	switch e.Name {
	case "response.completed", "response.incomplete", "response.failed":
		return true
	}
	return e.IsDone()
}

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

// Malformed reports whether e is no event of an OpenAI-compatible API stream, and so says that
// its stream is broken: a line that is no field (Foreign), a NUL or bytes that are not UTF-8,
// or data that is neither [DONE] nor shaped as the JSON object that every chat and completions
// chunk and every Responses API event is (it begins with '{' and ends with '}'; "{not json"
// does not). The data is not parsed: json.Valid took forty times as long as these checks (2.4
// µs against 60 ns for a 250-byte chunk, 38 µs against 0.4 µs for 4 KiB, on a 2-core test
// machine), on every event of every stream (BenchmarkEventMalformed).
func (e *Event) Malformed() bool {
	if e.Foreign || bytes.IndexByte(e.Raw, 0) >= 0 || !utf8.Valid(e.Raw) {
		return true
	}
	if len(e.Data) == 0 || e.IsDone() {
		return false
	}
	d := bytes.TrimSpace(e.Data)
	return len(d) < 2 || d[0] != '{' || d[len(d)-1] != '}'
}

// Empty reports whether the event carries neither data nor a name: comment lines only (a
// keep-alive such as ": ping"), or only id or retry fields. It is no token and no progress.
func (e *Event) Empty() bool { return len(e.Data) == 0 && e.Name == "" && len(e.ErrorLine) == 0 }

// SSEReader reads server-sent events incrementally. Lines end in "\n", "\r\n" or a lone "\r",
// as the event-stream format allows (WHATWG HTML, "Parsing an event stream"). It buffers at
// most one event, of at most maxEvent bytes.
//
// A "\r" that is the last byte received may be the first half of a "\r\n". Where it ends a
// line of fields the event is not over anyway, and the next byte decides. Where it ends a blank
// line (the event's end) after a line that ended in a lone "\r", the event ends there at once:
// the engine ends its lines so, and may send nothing more for a long time (a token's wait, or
// a model's thinking), so the event is not held for a "\n" that is not coming. After a line
// that ended in "\r\n" (or "\n") the next byte decides: that "\n" is on its way, split from
// its "\r" by the transport only, and waiting for it keeps every event's bytes whole. At the
// end of the stream a "\r" is a line end.
type SSEReader struct {
	src      io.Reader
	buf      []byte // sseBuffer bytes; buf[rd:wr] is what was read and not yet taken
	rd, wr   int
	err      error // what ended a read that also brought bytes, returned once they are taken
	maxEvent int
	raw      []byte // the event's bytes as received; Event.Raw
	data     []byte // the data lines joined, when there are several
	name, id string // the last event name and id, reused while they repeat
	// noLF and noCR are how many of the buffered bytes, from the first, are known to hold no
	// "\n" and no "\r": the search for one starts past them. A stream of "\n" line ends is then
	// searched for "\r" once a buffer, not once a line, and one of lone "\r" line ends for "\n".
	noLF, noCR int
	// loneCR: the last line read ended in a lone "\r".
	loneCR bool
	// begun: the stream's first bytes were read, and a byte order mark before them taken off.
	begun bool
}

// NewSSEReader returns a reader of events from r, each at most maxEvent bytes (4 KiB when
// maxEvent < 4096). Its own buffer (sseBuffer) is as small as lets it hold, after one read, the
// several events an engine sends at once, so that a proxy can pass them on in one write
// (HasEvent); r, an HTTP body, is buffered already.
func NewSSEReader(r io.Reader, maxEvent int) *SSEReader {
	maxEvent = max(maxEvent, 4096)
	return &SSEReader{src: r, buf: make([]byte, sseBuffer), maxEvent: maxEvent}
}

// sseBuffer is the SSEReader's own buffer: the size of an HTTP connection's read buffer, so
// that one read takes what the connection holds (a completion chunk is about 250 bytes).
const sseBuffer = 4 << 10

// HasEvent reports whether a whole event is buffered already, so that Next will return it
// without waiting for the stream. A proxy uses it to pass on together the events an engine
// sent together. It never reads.
func (s *SSEReader) HasEvent() bool {
	b := s.buf[s.rd:s.wr]
	noLF, noCR, loneCR := s.noLF, s.noCR, s.loneCR
	fields := false
	for len(b) > 0 {
		n, lf, cr := lineEnd(b, noLF, noCR, loneCR)
		if n < 0 {
			return false // an unfinished line
		}
		blank := b[0] == '\n' || b[0] == '\r'
		if blank && fields {
			return true
		}
		fields = fields || !blank
		loneCR = b[n-1] == '\r'
		b = b[n:]
		noLF, noCR = max(lf-n, 0), max(cr-n, 0)
	}
	return false
}

// lineEnd returns the length of b's first line with its line end, or -1 when b holds no whole
// line yet. The first noLF bytes of b are known to hold no "\n", the first noCR no "\r"; lf and
// cr are where the searches for them stopped (the byte's index, or len(b) when b holds none),
// for the next line's searches to start from. A "\r" that is b's last byte waits for the next
// byte (-1), unless it is all of b's first line and loneCR says that the line before ended in
// a lone "\r" (see SSEReader).
func lineEnd(b []byte, noLF, noCR int, loneCR bool) (n, lf, cr int) {
	lf = len(b)
	if i := bytes.IndexByte(b[noLF:], '\n'); i >= 0 {
		lf = noLF + i
	}
	cr = noCR
	if cr < lf { // a "\r" may end the line: searched to the end of b, so that it is searched once
		cr = len(b)
		if i := bytes.IndexByte(b[noCR:], '\r'); i >= 0 {
			cr = noCR + i
		}
	}
	switch {
	case cr >= lf && lf < len(b): // no "\r" before the "\n"
		return lf + 1, lf, cr
	case cr >= lf:
		return -1, lf, cr
	case cr+1 < len(b) && b[cr+1] == '\n':
		return cr + 2, lf, cr
	case cr+1 < len(b) || cr == 0 && loneCR:
		return cr + 1, lf, cr
	}
	return -1, lf, cr
}

// Reset makes s read from r, keeping its buffers (for a pool of readers).
func (s *SSEReader) Reset(r io.Reader) {
	s.src, s.rd, s.wr, s.err = r, 0, 0, nil
	s.raw, s.data = s.raw[:0], s.data[:0]
	s.noLF, s.noCR, s.loneCR, s.begun = 0, 0, false, false
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
		case "", "retry": // a comment (the line begins with ':'), a reconnection delay
		case "error":
			if v := bytes.TrimSpace(value); len(v) >= 2 && v[0] == '{' && v[len(v)-1] == '}' {
				ev.ErrorLine = v[:len(v):len(v)]
			} else if err != io.EOF { // (a line that ended: see Foreign)
				ev.Foreign = true
			}
		default:
			if err != io.EOF {
				ev.Foreign = true
			}
		}
		if err == io.EOF {
			return finish(true), nil
		}
	}
}

// readLine appends one line, with its line end, to s.raw; io.EOF when the stream ends (the
// partial line, if any, is appended).
func (s *SSEReader) readLine() error {
	start := len(s.raw)
	for {
		if s.rd == s.wr {
			if err := s.fill(); err != nil {
				if err == io.EOF && len(s.raw) > start && s.raw[len(s.raw)-1] == '\r' {
					s.loneCR = true
					return nil // a "\r" at the end of the stream ends its line
				}
				return err
			}
		}
		b := s.buf[s.rd:s.wr]
		if len(s.raw) > start && s.raw[len(s.raw)-1] == '\r' {
			// The line's "\r" was the last byte buffered: this byte says whether a "\n" is its
			// second half. (A "\r" ends a line wherever it is, so it can only be the last.)
			s.loneCR = b[0] != '\n'
			if !s.loneCR {
				if len(s.raw) >= s.maxEvent {
					return fmt.Errorf("%w (limit %d bytes)", ErrSSELineTooLong, s.maxEvent)
				}
				s.raw = append(s.raw, '\n')
				s.rd++
			}
			return nil
		}
		var n, lf, cr int
		if i := bytes.IndexByte(b[s.noLF:], '\n'); i >= 0 && s.noLF+i < s.noCR {
			// The usual line: it ends in "\n", and no "\r" is before it (known since the first
			// line of this buffer was read).
			lf = s.noLF + i
			n, cr = lf+1, s.noCR
		} else {
			n, lf, cr = lineEnd(b, s.noLF, s.noCR, s.loneCR && len(s.raw) == start)
		}
		take := n
		if n < 0 {
			take = len(b)
		}
		if len(s.raw)+take > s.maxEvent {
			return fmt.Errorf("%w (limit %d bytes)", ErrSSELineTooLong, s.maxEvent)
		}
		s.raw = append(s.raw, b[:take]...)
		s.rd += take
		s.noLF, s.noCR = max(lf-take, 0), max(cr-take, 0)
		if n >= 0 {
			s.loneCR = b[n-1] == '\r'
			return nil
		}
	}
}

// fill reads into the buffer, which the reader has emptied: at least a byte, or an error
// (io.EOF at the end of the stream). An error that comes with bytes is returned at the next
// fill, as bufio.Reader does.
func (s *SSEReader) fill() error {
	s.rd, s.wr = 0, 0
	if err := s.err; err != nil {
		s.err = nil
		return err
	}
	for range 100 { // a reader that keeps returning nothing, and no error, is broken
		n, err := s.src.Read(s.buf)
		s.wr = max(min(n, len(s.buf)), 0)
		switch {
		case s.wr > 0:
			s.err = err
			if !s.begun {
				return s.skipBOM()
			}
			return nil
		case err != nil:
			return err
		}
	}
	return io.ErrNoProgress
}

// bom is the UTF-8 byte order mark, which the event-stream format has a decoder take off the
// start of a stream: an engine (or a proxy before it) that sends one sends events all the same.
const bom = "\xef\xbb\xbf"

// skipBOM takes a byte order mark off the stream's first bytes (the first fill's), reading on
// while they are only the start of one.
func (s *SSEReader) skipBOM() error {
	for range 100 {
		if s.wr >= len(bom) || s.err != nil || !bytes.HasPrefix([]byte(bom), s.buf[:s.wr]) {
			break
		}
		n, err := s.src.Read(s.buf[s.wr:])
		s.wr += max(min(n, len(s.buf)-s.wr), 0)
		s.err = err
	}
	s.begun = true
	if !bytes.HasPrefix(s.buf[:s.wr], []byte(bom)) {
		return nil
	}
	s.rd = len(bom)
	if s.rd == s.wr {
		return s.fill() // the mark was all that came
	}
	return nil
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
