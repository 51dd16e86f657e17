package h1

import (
	"bytes"
	"io"
	"net"
	"net/http"
)

// MemBody is a request body held whole in memory (a proxy has read it already), in one piece or
// a few (a proxy's body with bytes spliced in, sent without joining them). The Transport sends
// it with the request's head in one system call (writev), straight from where it lies: copied
// through the connection's 8 KB buffer, a 400 KB body took thirteen writes. Any other
// transport reads it as it reads any body.
type MemBody struct {
	parts   [][]byte // what is still to read, in order, without empty parts
	arr     [3][]byte
	start   [][]byte // the parts as made, for rewind (a request the Transport sends again)
	sarr    [3][]byte
	release func() // see OnSent; nil once called
}

// NewMemBody returns a body that reads b, which must not change while it is sent.
func NewMemBody(b []byte) *MemBody { return NewMemBodyParts(b) }

// NewMemBodyParts returns a body that reads the parts one after the other, as if joined; they
// must not change while it is sent.
func NewMemBodyParts(parts ...[]byte) *MemBody {
	m := &MemBody{}
	m.parts = m.arr[:0]
	for _, p := range parts {
		if len(p) > 0 {
			m.parts = append(m.parts, p)
		}
	}
	m.start = append(m.sarr[:0], m.parts...)
	return m
}

// rewind makes m read from its start again.
func (m *MemBody) rewind() { m.parts = append(m.arr[:0], m.start...) }

// Len is the number of bytes still to read.
func (m *MemBody) Len() int {
	n := 0
	for _, p := range m.parts {
		n += len(p)
	}
	return n
}

func (m *MemBody) Read(p []byte) (int, error) {
	if len(m.parts) == 0 {
		return 0, io.EOF
	}
	n := copy(p, m.parts[0])
	if m.parts[0] = m.parts[0][n:]; len(m.parts[0]) == 0 {
		m.parts = m.parts[1:]
	}
	return n, nil
}

// Close does nothing: the bytes are the caller's. (http.Request.Write closes a body when it
// has handed it on, which for the Transport is before the bytes are sent.)
func (m *MemBody) Close() error { return nil }

// OnSent sets f to be called once the transport no longer needs m's bytes. This package's
// Transport calls it (through Sent) when the RoundTrip that sent m returns (the body is
// written, or will not be, by then), but not for the requests it hands to Fallback, which may
// read the body after its RoundTrip returns; a body sent any other way never calls f, and its
// bytes are left to the garbage collector. Once f is called, the caller may reuse the memory
// (a pooled buffer), as long as nothing else of its own reads it.
func (m *MemBody) OnSent(f func()) { m.release = f }

// Sent calls the OnSent function, the first time only. A RoundTripper calls it when it will
// not read m any more (this package's Transport, a test's).
func (m *MemBody) Sent() {
	if f := m.release; f != nil {
		m.release = nil
		f()
	}
}

// headWriter is what http.Request.Write writes a request with a MemBody to: it keeps the head
// (as net/http frames it) in head, and takes the body's parts as they are, without copying
// them, when Write hands it the body as a reader (io.Copy asks its ReaderFrom).
type headWriter struct {
	head []byte
	body [][]byte // the MemBody's unread parts, once Write reached the body
	took bool     // Write reached the body
}

// newHeadWriter returns a headWriter that appends the head to head.
func newHeadWriter(head []byte) headWriter { return headWriter{head: head} }

func (w *headWriter) Write(p []byte) (int, error) {
	w.head = append(w.head, p...)
	return len(p), nil
}

// WriteString and WriteByte keep http.Request.Write from wrapping the writer in a
// bufio.Writer of its own (it does that to writers that are not io.ByteWriters).
func (w *headWriter) WriteString(s string) (int, error) {
	w.head = append(w.head, s...)
	return len(s), nil
}

func (w *headWriter) WriteByte(b byte) error {
	w.head = append(w.head, b)
	return nil
}

// ReadFrom takes the body. net/http passes the MemBody wrapped in an io.LimitedReader of the
// declared length; anything else (a later Go that wraps it otherwise) is copied after the head,
// which is right, only slower.
func (w *headWriter) ReadFrom(r io.Reader) (int64, error) {
	if lr, ok := r.(*io.LimitedReader); ok && !w.took {
		if mb, ok := lr.R.(*MemBody); ok && int64(mb.Len()) <= lr.N {
			n := int64(mb.Len())
			w.body = append(w.body, mb.parts...)
			w.took = true
			mb.parts = nil
			lr.N -= n
			return n, nil
		}
	}
	var b bytes.Buffer
	n, err := b.ReadFrom(r)
	if w.took { // bytes after the body (a chunked body's end): they follow it
		w.body = append(w.body, b.Bytes())
		return n, err
	}
	w.head = append(w.head, b.Bytes()...)
	return n, err
}

// writeMem writes req, whose body is a MemBody, to c: head and body in one writev.
func writeMem(c *conn, req *http.Request) error {
	w := newHeadWriter(c.head[:0])
	err := req.Write(&w)
	if cap(w.head) <= 16<<10 {
		c.head = w.head[:0] // kept for the next request on the connection
	}
	if err != nil {
		return err
	}
	bufs := make(net.Buffers, 0, 1+len(w.body))
	bufs = append(append(bufs, w.head), w.body...)
	if bw, ok := c.nc.(buffersWriter); ok {
		_, err = bw.writeBuffers(bufs)
		return err
	}
	_, err = bufs.WriteTo(c.nc)
	return err
}

// buffersWriter writes several buffers with one system call (rawConn's writev).
type buffersWriter interface {
	writeBuffers(bufs [][]byte) (int64, error)
}
