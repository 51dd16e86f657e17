package h1

import (
	"bytes"
	"io"
	"net"
	"net/http"
)

// MemBody is a request body held whole in memory (a proxy has read it already). The Transport
// sends it with the request's head in one system call (writev), straight from where it lies:
// copied through the connection's 8 KB buffer, a 400 KB body took thirteen writes. Any other
// transport reads it as it reads any body.
type MemBody struct {
	b   []byte
	off int
}

// NewMemBody returns a body that reads b, which must not change while it is sent.
func NewMemBody(b []byte) *MemBody { return &MemBody{b: b} }

func (m *MemBody) Read(p []byte) (int, error) {
	if m.off >= len(m.b) {
		return 0, io.EOF
	}
	n := copy(p, m.b[m.off:])
	m.off += n
	return n, nil
}

// Close does nothing: the bytes are the caller's.
func (m *MemBody) Close() error { return nil }

// headWriter is what http.Request.Write writes a request with a MemBody to: it keeps the head
// (as net/http frames it) in head, and takes the body's bytes as they are, without copying
// them, when Write hands it the body as a reader (io.Copy asks its ReaderFrom).
type headWriter struct {
	head []byte
	body []byte // the MemBody's unread bytes, once Write reached the body
}

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
	if lr, ok := r.(*io.LimitedReader); ok && w.body == nil {
		if mb, ok := lr.R.(*MemBody); ok && int64(len(mb.b)-mb.off) <= lr.N {
			w.body = mb.b[mb.off:]
			mb.off = len(mb.b)
			lr.N -= int64(len(w.body))
			return int64(len(w.body)), nil
		}
	}
	if w.body != nil { // bytes after the body (a chunked body's end): they follow it
		var b bytes.Buffer
		n, err := b.ReadFrom(r)
		w.body = append(w.body[:len(w.body):len(w.body)], b.Bytes()...)
		return n, err
	}
	var b bytes.Buffer
	n, err := b.ReadFrom(r)
	w.head = append(w.head, b.Bytes()...)
	return n, err
}

// writeMem writes req, whose body is a MemBody, to c: head and body in one writev.
func writeMem(c *conn, req *http.Request) error {
	w := headWriter{head: c.head[:0]}
	err := req.Write(&w)
	if cap(w.head) <= 16<<10 {
		c.head = w.head[:0] // kept for the next request on the connection
	}
	if err != nil {
		return err
	}
	bufs := net.Buffers{w.head, w.body}
	_, err = bufs.WriteTo(c.nc)
	return err
}
