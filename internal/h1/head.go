package h1

import "bytes"

// headScan reads a request head as it streams past, for the framing that http.ReadRequest
// accepts but RFC 9112 tells a server to refuse, because a proxy in front of it may have framed
// the same bytes differently (request smuggling): both Content-Length and Transfer-Encoding
// (Go drops the length and reads chunks, §6.1), whitespace between a field name and its colon
// (Go keeps "Content-Length " as another field and reads no body, §5.1), a line folded onto the
// previous field (obs-fold: Go joins it, §5.2), and Transfer-Encoding below HTTP/1.1 (Go
// ignores it and reads the Content-Length, §6.1). Go's parser decides everything else; the scan
// only needs to find where the head ends and what its framing fields say.
//
// It keeps no more than a few bytes of the request line and of a field name, so it costs no
// allocation, whatever the head's size.
type headScan struct {
	st    uint8
	field uint8 // the framing field on the current line, when it is one
	vst   uint8 // where in that field's value the scan is
	match uint8 // bytes of "chunked" matched in a Transfer-Encoding value
	n     uint8 // bytes in buf
	// buf holds the field name read so far (lower-cased) or, on the request line, its last bytes
	// (for the version).
	buf  [24]byte
	seen uint16
	num  int64 // the Content-Length value being read
	cl   int64 // the Content-Length, when one was seen and valid
}

// States of headScan.
const (
	hsRequestLine = iota // in the request line
	hsLineStart          // at the start of a field line (or of the blank line that ends the head)
	hsBlankCR            // after a CR at a line's start: LF ends the head
	hsName               // in a field name
	hsValue              // in a field value, to the end of the line
	hsDone               // the head has ended
)

// Framing fields.
const (
	fieldOther = iota
	fieldCL
	fieldTE
)

// Where the scan is in a framing field's value (Go trims the whitespace around it).
const (
	valBefore = iota // whitespace before it
	valIn            // in it
	valAfter         // whitespace after it
	valBad           // not a valid value
)

// What a headScan saw: bits of seen.
const (
	sawCL        = 1 << iota // a Content-Length field
	sawTE                    // a Transfer-Encoding field
	sawSpaceName             // whitespace between a field name and its colon
	sawFold                  // a field line folded onto the previous one
	sawOldHTTP               // the request line's version is below HTTP/1.1
	sawChunked               // one Transfer-Encoding field, exactly "chunked"
	// sawOddFraming: a Content-Length that is not a number or differs from another, several
	// Transfer-Encodings, or a stray CR where the head should end. Go refuses these itself.
	sawOddFraming
)

// reset prepares h for the next head (or, with trailers set, for a chunked body's trailer
// section, which has field lines but no request line).
func (h *headScan) reset(trailers bool) {
	*h = headScan{}
	if trailers {
		h.st = hsLineStart
	}
}

func (h *headScan) done() bool { return h.st == hsDone }

// smuggling says why the head must be refused, or "" when it need not be.
func (h *headScan) smuggling() string {
	switch s := h.seen; {
	case s&sawSpaceName != 0:
		return "whitespace between a header field name and its colon"
	case s&sawFold != 0:
		return "a header field folded over lines (obs-fold)"
	case s&(sawCL|sawTE) == sawCL|sawTE:
		return "both Content-Length and Transfer-Encoding"
	case s&(sawTE|sawOldHTTP) == sawTE|sawOldHTTP:
		return "Transfer-Encoding in an HTTP/1.0 request"
	}
	return ""
}

// scan reads p, the next bytes of the stream, and returns how many of them belong to the head:
// all of them until the line that ends it.
func (h *headScan) scan(p []byte) int {
	i := 0
	for i < len(p) && h.st != hsDone {
		b := p[i]
		switch h.st {
		case hsRequestLine, hsValue:
			if h.st == hsValue && h.field != fieldOther {
				if b == '\n' {
					h.endField()
					h.st = hsLineStart
				} else {
					h.valueByte(b)
				}
				break
			}
			j := bytes.IndexByte(p[i:], '\n')
			if j < 0 {
				if h.st == hsRequestLine {
					h.keepTail(p[i:])
				}
				return len(p)
			}
			if h.st == hsRequestLine {
				h.keepTail(p[i : i+j])
				v := bytes.TrimSuffix(h.buf[:h.n], []byte("\r"))
				if bytes.HasSuffix(v, []byte("HTTP/1.0")) || len(v) >= 8 && string(v[len(v)-8:len(v)-1]) == "HTTP/0." {
					h.seen |= sawOldHTTP // Go ignores Transfer-Encoding below HTTP/1.1
				}
			}
			h.st = hsLineStart
			i += j
		case hsLineStart:
			switch b {
			case '\r':
				h.st = hsBlankCR
			case '\n':
				h.st = hsDone
			case ' ', '\t':
				h.seen |= sawFold
				h.field = fieldOther
				h.st = hsValue
			default:
				h.n = 0
				h.st = hsName
				continue // the byte is the name's first
			}
		case hsBlankCR:
			if b != '\n' {
				h.seen |= sawOddFraming
			}
			h.st = hsDone
		case hsName:
			switch {
			case b == ':':
				h.field = fieldOf(h.buf[:h.n])
				h.vst, h.match, h.num = valBefore, 0, 0
				h.st = hsValue
			case b == ' ' || b == '\t':
				h.seen |= sawSpaceName
				h.n = uint8(len(h.buf)) // the name is no framing field's any more
			case b == '\n':
				h.st = hsLineStart // no colon: Go refuses the line
			case int(h.n) < len(h.buf):
				h.buf[h.n] = lower(b)
				h.n++
			}
		}
		i++
	}
	return i
}

// keepTail keeps the last bytes of the request line in buf.
func (h *headScan) keepTail(q []byte) {
	if len(q) >= len(h.buf) {
		h.n = uint8(copy(h.buf[:], q[len(q)-len(h.buf):]))
		return
	}
	if over := int(h.n) + len(q) - len(h.buf); over > 0 {
		copy(h.buf[:], h.buf[over:h.n])
		h.n -= uint8(over)
	}
	h.n += uint8(copy(h.buf[h.n:], q))
}

// valueByte reads a byte of a framing field's value: a Content-Length is decimal digits (at
// most 2^63-1), a Transfer-Encoding we follow is "chunked" in any case, each with whitespace
// around it (a CR ends the line; one inside a value Go refuses).
func (h *headScan) valueByte(b byte) {
	if b == ' ' || b == '\t' || b == '\r' {
		if h.vst == valIn {
			h.vst = valAfter
		}
		return
	}
	if h.vst > valIn {
		h.vst = valBad
		return
	}
	h.vst = valBad
	switch h.field {
	case fieldCL:
		if d := int64(b) - '0'; 0 <= d && d <= 9 && h.num <= (unbounded-d)/10 {
			h.num = h.num*10 + d
			h.vst = valIn
		}
	case fieldTE:
		if int(h.match) < len("chunked") && lower(b) == "chunked"[h.match] {
			h.match++
			h.vst = valIn
		}
	}
}

// endField records the framing field whose value was just read.
func (h *headScan) endField() {
	valid := h.vst == valIn || h.vst == valAfter
	switch h.field {
	case fieldCL:
		switch {
		case !valid:
			h.seen |= sawOddFraming
		case h.seen&sawCL != 0 && h.num != h.cl:
			h.seen |= sawOddFraming
		}
		h.cl = h.num
		h.seen |= sawCL
	case fieldTE:
		if h.seen&sawTE != 0 {
			h.seen |= sawOddFraming
			h.seen &^= sawChunked
		} else if valid && int(h.match) == len("chunked") {
			h.seen |= sawChunked
		}
		h.seen |= sawTE
	}
	h.field = fieldOther
}

func fieldOf(name []byte) uint8 {
	switch string(name) {
	case "content-length":
		return fieldCL
	case "transfer-encoding":
		return fieldTE
	}
	return fieldOther
}

func lower(b byte) byte {
	if 'A' <= b && b <= 'Z' {
		return b + 'a' - 'A'
	}
	return b
}
