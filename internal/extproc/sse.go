package extproc

import (
	"bytes"

	"github.com/kvroute/kvroute/internal/openai"
)

// eventSplitter cuts a streamed answer, arriving in chunks of any size, into whole server-sent
// events: each is read (openai.SSEReader) and passed on or dropped as a whole, and a partial
// event waits for the chunk that completes it. Events end with a blank line ("\n\n" or
// "\r\n\r\n"); a stream of lone "\r" line ends is held whole until its end.
type eventSplitter struct {
	pending []byte
	src     bytes.Reader
	rd      *openai.SSEReader
}

// An event's end is looked for from the last two bytes of what was pending, not from its start: a
// stream whose events never end (single line ends) was scanned again for every chunk, its cost
// growing with the square of its length (8 MiB of short lines took 2.6 s of CPU).
const rescan = 2

// feed appends chunk to what is pending and appends to dst the events to pass on, those for
// which take returns true, byte for byte as they came; at eos what is left, a partial event
// included, is read as one too. An event the reader cannot read (longer than maxEvent) is
// passed on unread.
func (s *eventSplitter) feed(dst, chunk []byte, eos bool, take func(openai.Event) bool) []byte {
	var b []byte
	from := 0 // where the first event's end may be: before it, pending holds none
	if len(s.pending) == 0 {
		b = chunk // the usual case: the chunk holds whole events, nothing to copy
	} else {
		from = max(len(s.pending)-rescan, 0)
		s.pending = append(s.pending, chunk...)
		b = s.pending
	}
	for len(b) > 0 {
		n := eventEndFrom(b, from)
		from = 0
		if n < 0 && len(b) > maxEvent {
			n = len(b) // longer than an event may be: passed on unread, not held
		}
		if n < 0 {
			if !eos {
				break
			}
			n = len(b)
		}
		ev := b[:n]
		b = b[n:]
		if s.read(ev, take) {
			dst = append(dst, ev...)
		}
	}
	// Keep the partial event, in pending's own memory (b may be the caller's chunk); when it is
	// all of pending already, nothing moves.
	if len(b) == 0 || len(s.pending) == 0 || &b[0] != &s.pending[0] {
		s.pending = append(s.pending[:0], b...)
	}
	return dst
}

// read reads one event's bytes and reports whether to pass them on.
func (s *eventSplitter) read(raw []byte, take func(openai.Event) bool) bool {
	s.src.Reset(raw)
	if s.rd == nil {
		s.rd = openai.NewSSEReader(&s.src, maxEvent)
	} else {
		s.rd.Reset(&s.src)
	}
	ev, err := s.rd.Next()
	if err != nil {
		return true // blank lines alone, or an event too long to read: passed as they are
	}
	return take(ev)
}

// eventEndFrom returns the length of the first whole event in b (through the blank line that
// ends it), or -1 when b holds none; b holds no event end before from.
func eventEndFrom(b []byte, from int) int {
	for i := from; i < len(b); {
		j := bytes.IndexByte(b[i:], '\n')
		if j < 0 {
			return -1
		}
		i += j + 1 // the start of the next line
		switch {
		case i < len(b) && b[i] == '\n':
			return i + 1
		case i+1 < len(b) && b[i] == '\r' && b[i+1] == '\n':
			return i + 2
		}
	}
	return -1
}
