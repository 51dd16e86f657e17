package extproc

import (
	"bytes"

	"github.com/kvroute/kvroute/internal/openai"
)

// eventSplitter cuts a streamed answer, arriving in chunks of any size, into whole server-sent
// events: each is read (openai.SSEReader) and passed on or dropped as a whole, and a partial
// event waits for the chunk that completes it. Events end with a blank line, lines with "\n",
// "\r\n" or a lone "\r" (WHATWG HTML, "Parsing an event stream"), as openai.SSEReader reads
// them: a "\r" that is the last byte so far ends the event at once where it is a blank line
// after a line that ended in a lone "\r" (the engine ends its lines so, and the event is not
// held for a byte that may not come for a long time); elsewhere the next chunk decides whether
// a "\n" follows it.
type eventSplitter struct {
	pending []byte
	src     bytes.Reader
	rd      *openai.SSEReader
}

// An event's end is looked for from the last two bytes of what was pending, not from its start: a
// stream whose events never end (single line ends) was scanned again for every chunk, its cost
// growing with the square of its length (8 MiB of short lines took 2.6 s of CPU).
const rescan = 2

// takeFunc reads one whole event and says what of it to pass on: nothing (pass false), or its
// bytes as they came but for those of ev.Data[omitFrom:omitTo] (none when omitFrom >= omitTo):
// proxy.Exchange.Event's answer.
type takeFunc func(ev openai.Event) (pass bool, omitFrom, omitTo int)

// feed appends chunk to what is pending and appends to dst the events to pass on, as take
// says, byte for byte as they came (less what take omits); at eos what is left, a partial event
// included, is read as one too. An event the reader cannot read (longer than maxEvent) is
// passed on unread.
func (s *eventSplitter) feed(dst, chunk []byte, eos bool, take takeFunc) []byte {
	var b []byte
	from := 0 // where the first event's end may be: before it, pending holds none
	if len(s.pending) == 0 {
		b = chunk // the usual case: the chunk holds whole events, nothing to copy
	} else {
		from = max(len(s.pending)-rescan, 0)
		s.pending = append(s.pending, chunk...)
		b = s.pending
	}
	found := lineScan{-1, -1}
	for len(b) > 0 {
		n := eventEndFrom(b, from, &found)
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
		found.lf, found.cr = found.lf-n, found.cr-n // negative (unknown) when within the event
		dst = s.read(dst, ev, take)
	}
	// Keep the partial event, in pending's own memory (b may be the caller's chunk); when it is
	// all of pending already, nothing moves.
	if len(b) == 0 || len(s.pending) == 0 || &b[0] != &s.pending[0] {
		s.pending = append(s.pending[:0], b...)
	}
	return dst
}

// read reads one event's bytes and appends to dst what take says to pass on of them.
func (s *eventSplitter) read(dst, raw []byte, take takeFunc) []byte {
	s.src.Reset(raw)
	if s.rd == nil {
		s.rd = openai.NewSSEReader(&s.src, maxEvent)
	} else {
		s.rd.Reset(&s.src)
	}
	ev, err := s.rd.Next()
	if err != nil {
		return append(dst, raw...) // blank lines alone, or an event too long to read: passed as they are
	}
	pass, from, to := take(ev)
	switch {
	case !pass:
		return dst
	case from < to && to <= len(ev.Data) && bytes.IndexByte(ev.Data, '\n') < 0:
		// The omitted part goes: the event's data is one line, a part of raw (only chunks
		// that carry a "usage" the router asked for pay for the search).
		if at := bytes.Index(raw, ev.Data); at >= 0 {
			dst = append(dst, raw[:at+from]...)
			return append(dst, raw[at+to:]...)
		}
	}
	return append(dst, raw...)
}

// lineScan is where eventEndFrom's searches for "\n" and "\r" in b stopped: the index of the
// byte found, len(b) when b holds none, negative when not searched. Given again for what
// follows an event, it has each byte of a chunk searched once for each: a chunk of many events
// whose lines end in "\n" is searched for "\r" once, not once a line, and one of lone "\r"
// line ends for "\n".
type lineScan struct{ lf, cr int }

// eventEndFrom returns the length of the first whole event in b (through the blank line that
// ends it), or -1 when b holds none; b holds no event end before from. found is where earlier
// searches stopped, and is kept up to date.
func eventEndFrom(b []byte, from int, found *lineScan) int {
	loneCR := false // the last line end seen was a lone "\r"
	for i := from; i < len(b); {
		if found.lf < i { // not searched, or passed
			found.lf = len(b)
			if j := bytes.IndexByte(b[i:], '\n'); j >= 0 {
				found.lf = i + j
			}
		}
		if found.cr < i {
			found.cr = len(b)
			if j := bytes.IndexByte(b[i:], '\r'); j >= 0 {
				found.cr = i + j
			}
		}
		// The end of the line i is in: a "\r" before the "\n", or the "\n".
		switch cr := found.cr; {
		case cr < found.lf && cr+1 == len(b):
			return -1 // the next byte says whether this "\r" is half of a "\r\n"
		case cr < found.lf:
			i = cr + 1
			loneCR = b[i] != '\n'
			if !loneCR {
				i++
			}
		case found.lf < len(b):
			i, loneCR = found.lf+1, false
		default:
			return -1
		}
		// i starts a line: a blank one ends the event.
		switch {
		case i == len(b):
			return -1
		case b[i] == '\n':
			return i + 1
		case b[i] != '\r':
		case i+1 < len(b) && b[i+1] == '\n':
			return i + 2
		case i+1 < len(b) || loneCR:
			return i + 1
		default:
			return -1 // after "\n" line ends, this "\r" is most likely half of a "\r\n"
		}
	}
	return -1
}
