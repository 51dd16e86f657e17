package proxy

import (
	"bytes"
	"errors"
	"io"
	"strconv"

	"github.com/kvroute/kvroute/internal/openai"
)

// otherStream passes on an answer to a stream request that came without the event stream's
// Content-Type (text/plain, application/json): as it comes, chunk by chunk, not event by event
// as sseBody does. Its first bytes are taken for the first token (the request's TTFT, the end
// of its prefill for the policy), as sseBody takes its first event. Where it begins as an event
// stream does (eventsIn), its events are read as they pass (takeEvent: the usage, the
// terminator, the content events the tenant is charged for), and it is cut where they pass the
// request's bound (call.maxEvents), as an event stream is: before, such a stream was read for
// its events only at its end and only within maxCapture, so that an engine ignoring max_tokens
// under text/plain was relayed without end (12.8 MB for a max_tokens of 5) and charged nothing.
// An answer that begins otherwise (a JSON object: an engine that ignored "stream") is left to
// the captureBody below it, read whole at its end (takeBody).
type otherStream struct {
	io.ReadCloser
	c  *call
	cb *captureBody // the body below (nil: none): it keeps nothing once the events are read here
	// maxEvents is the most content events the stream may carry (call.maxEvents; 0: no bound).
	maxEvents int
	seen      bool // its first bytes came
	decided   bool // its first bytes other than white space came: events says what they began
	events    bool // it began as an event stream: its events are read here
	malformed int  // its events that are no events of the API (openai.Event.Malformed)
	st        *sseState
	src       bytes.Reader
	// acc holds the stream's bytes from offset accAt on that are not yet read as whole events:
	// the part of an event that has begun (at most maxEvent bytes), or, before it is decided,
	// its first bytes past white space.
	acc   []byte
	accAt int64
	// passed counts the bytes handed on (Read's), the offset of the next.
	passed int64
	// Once cut (the overrun, an event over maxEvent): rest is still to be handed on (the error
	// event), then err.
	rest []byte
	err  error
}

func newOtherStream(body io.ReadCloser, c *call) *otherStream {
	cb, _ := body.(*captureBody) // a 2xx answer's (modifyResponse)
	return &otherStream{ReadCloser: body, c: c, cb: cb, maxEvents: c.maxEvents()}
}

func (s *otherStream) Read(p []byte) (int, error) {
	if s.err != nil {
		if len(s.rest) > 0 {
			n := copy(p, s.rest)
			s.rest = s.rest[n:]
			return n, nil
		}
		return 0, s.err
	}
	n, err := s.ReadCloser.Read(p)
	if n > 0 && !s.seen {
		s.seen = true
		if s.c.rc != nil {
			s.c.rc.FirstToken()
		}
	}
	if n > 0 && (!s.decided || s.events) {
		n = s.tap(p[:n])
	}
	s.passed += int64(n)
	if s.err != nil {
		if n == 0 {
			return s.Read(p) // the error event, or the error
		}
		return n, nil
	}
	if err == io.EOF && s.events {
		s.end()
	}
	return n, err
}

// tap reads the chunk b, which begins at offset passed, and returns how much of it to hand on:
// all of it but where the stream is cut inside it.
func (s *otherStream) tap(b []byte) int {
	n := len(b)
	if !s.decided {
		if len(s.acc) == 0 {
			i := skipSpace(b, skipBOM(b, s.passed))
			s.accAt = s.passed + int64(i)
			b = b[i:]
		}
		s.acc = append(s.acc, b...)
		events, sure := eventsBegin(s.acc)
		if !sure {
			return n
		}
		s.decided, s.events = true, events
		if !events {
			s.acc = nil
			return n
		}
		if s.cb != nil {
			s.cb.passOn()
		}
		s.st = sseStates.Get().(*sseState)
		s.acc = append(s.st.buf[:0], s.acc...)
		return s.readEvents(false, n)
	}
	// An event ends at a blank line: a line end just after another. Without one in what came
	// (with the byte before it), no event ended, and the event that began is not read again.
	from := max(len(s.acc)-1, 0)
	s.acc = append(s.acc, b...)
	if !blankLineIn(s.acc[from:]) {
		if len(s.acc) > maxEvent {
			s.tooLarge()
			return 0
		}
		return n
	}
	return s.readEvents(false, n)
}

// skipBOM returns where the stream's bytes b, which begin at offset at, begin past a byte order
// mark at the stream's start (the event-stream format takes one off): 3 where b begins with
// one, else 0.
func skipBOM(b []byte, at int64) int {
	if at == 0 && bytes.HasPrefix(b, []byte("\xef\xbb\xbf")) {
		return 3
	}
	return 0
}

// blankLineIn reports whether b holds a line end just after another ("\n\n", "\n\r", "\r\r";
// "\r\n\r\n" holds "\n\r"), where an event may end.
func blankLineIn(b []byte) bool {
	return bytes.Contains(b, []byte("\n\n")) || bytes.Contains(b, []byte("\n\r")) || bytes.Contains(b, []byte("\r\r"))
}

// eventsBegin reports whether b, an answer's first bytes past white space, begin as an event
// stream does (eventsIn: a "data:" or "event:" field, or a comment); sure is false while b is
// too short to say.
func eventsBegin(b []byte) (events, sure bool) {
	sure = true
	for _, f := range [...]string{"data:", "event:", ":"} {
		if len(b) >= len(f) {
			if string(b[:len(f)]) == f {
				return true, true
			}
		} else if string(b) == f[:len(b)] {
			sure = false
		}
	}
	return false, sure
}

// readEvents reads the whole events in acc and keeps the part of the one that has begun; at
// the stream's end (last) that part is read too, as takeEvents reads an answer's last bytes.
// n is the size of the chunk just read; it returns how much of it to hand on.
func (s *otherStream) readEvents(last bool, n int) int {
	s.src.Reset(s.acc)
	s.st.r.Reset(&s.src)
	read := 0 // bytes of acc read as whole events
	for {
		ev, err := s.st.r.Next()
		if err == io.EOF { // the rest was blank lines
			read = len(s.acc)
			break
		}
		if err != nil { // an event over maxEvent (openai.ErrSSELineTooLong)
			s.tooLarge()
			return int(max(s.accAt+int64(read)-s.passed, 0)) // the whole events before it
		}
		if ev.Cut && !last {
			read = len(s.acc) - len(ev.Raw) // an event that has begun: read when it ends
			break
		}
		at := s.accAt + int64(read)
		read += len(ev.Raw)
		if s.event(ev) {
			return s.overrun(at, n, last)
		}
	}
	s.acc = s.acc[:copy(s.acc, s.acc[read:])]
	s.accAt += int64(read)
	if len(s.acc) > maxEvent {
		s.tooLarge()
		return int(max(s.accAt-s.passed, 0)) // the whole events before it
	}
	return n
}

// event takes one event of the stream (takeEvent), as takeEvents does at an answer's end, and
// reports whether it takes the stream past its bound.
func (s *otherStream) event(ev openai.Event) (over bool) {
	if cutInside(ev) && !foreignCut(ev) {
		return false
	}
	if ev.Malformed() {
		// Relayed as it came: settled as a bad answer (call.status), not cut. It counts
		// towards the bound (not the charge): an engine's endless stream of such events is
		// cut as one of content events is.
		s.c.badEventPassed(ev)
		if s.malformed++; s.maxEvents > 0 && s.c.contentEvents+s.malformed > s.maxEvents {
			s.malformed-- // the event past the bound, not passed on
			return true
		}
		return false
	}
	s.c.takeEvent(ev)
	if s.maxEvents > 0 && s.c.contentEvents+s.malformed > s.maxEvents {
		s.c.contentEvents-- // the event past the bound, not passed on (nor charged)
		return true
	}
	return false
}

// end reads the last bytes of the stream, at its end.
func (s *otherStream) end() {
	if len(s.acc) > 0 {
		s.readEvents(true, 0)
	}
	s.release()
}

// overrun cuts the stream at the event past the bound, which begins at offset at, in the chunk
// of n bytes just read: the client gets the events before it, then an SSE error event, as from
// sseBody.overrun, and the call is settled as the engine's bad answer (call.overrun). Where
// that event began in an earlier chunk, already handed on, the stream cannot end cleanly: it
// is broken off there (the client's connection breaks). At the stream's end (last: the event
// is its last bytes, handed on already) there is nothing left to cut.
func (s *otherStream) overrun(at int64, n int, last bool) int {
	e := s.c.overrun("more than " + strconv.Itoa(s.maxEvents) + " stream events with text")
	s.release()
	if last {
		return n
	}
	if at < s.passed {
		s.err = errOverrun
		return 0
	}
	var b bytes.Buffer
	_ = openai.WriteEvent(&b, "error", e.Body())
	s.rest, s.err = b.Bytes(), io.EOF
	return int(at - s.passed)
}

// tooLarge cuts a stream whose event has grown past maxEvent, as sseBody's reader does
// (stream_event_too_large): the part of it that came in earlier chunks was handed on, so the
// client's connection breaks.
func (s *otherStream) tooLarge() {
	s.c.cut = true
	s.c.errType = "stream_event_too_large"
	name := ""
	if ep := s.c.ep(); ep != nil {
		name = ep.Name
	}
	s.c.h.Logger.Warn("stream cut: the engine sent an event over the limit", "request_id", s.c.rid, "endpoint", name, "limit_bytes", maxEvent)
	s.release()
	s.err = errEventTooLarge
}

var errEventTooLarge = errors.New("the engine sent an event larger than the router's limit")

// release gives the event reader back to the pool.
func (s *otherStream) release() {
	if s.st == nil {
		return
	}
	s.st.r.Reset(nil)
	if cap(s.acc) <= maxPooledPending {
		s.st.buf = s.acc[:0]
	}
	sseStates.Put(s.st)
	s.st, s.acc = nil, nil
}

func (s *otherStream) Close() error {
	s.release()
	return s.ReadCloser.Close()
}
