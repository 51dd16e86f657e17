package proxy

import (
	"errors"
	"io"
	"math/bits"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/kvroute/kvroute/internal/h1"
	"github.com/kvroute/kvroute/internal/openai"
)

// heldBody is a request body read into a pooled buffer. The buffer goes back to its pool when
// the last of its holders lets go: the handler, when it has finished the request (the parsed
// request's message contents may be views of the body until then), and each h1.MemBody made
// of it, once the transport that sent it says it is done with it (OnSent). A transport that
// never says so keeps the buffer out of the pool for good, and the garbage collector takes it:
// a buffer is never reused while something may read it.
//
// A 100k-token request's body is 400 KB, two thirds of what the request allocated: allocated
// anew for each request, it was cleared, and the heap it grew made the collector run every
// twenty or so such requests (docs/results.md, issue #16).
type heldBody struct {
	buf  *[]byte
	refs atomic.Int32
}

// pooledBody is the shortest announced body read into a pooled buffer; a shorter one is
// allocated as it was. It equals bodyStart, so that a pooled buffer (a larger power of two)
// is never taken for one of bodyChunks.
const pooledBody = bodyStart

// bodyClasses are the pools of body buffers: class k holds buffers of 1 << (k + minClass)
// bytes, from 128 KiB to 4 MiB: request bodies take the classes up to the smallest that holds
// exactBody + 1 as they are read (TestBodyClasses), and longer ones, up to 4 MiB, once read
// (readBodyHeld); whole answers (answerBuf) take those up to maxCapture. A longer body is
// allocated at its size: in classes up to 16 MiB, a 9 MiB body took 16 MiB, and a burst of 32
// of them left 513 MiB in the pools after a collection (288 MiB for the bodies themselves;
// sync.Pool lets go of what it holds only at the second), where a 15 MiB prompt's body saved
// a third of what its request allocated (BenchmarkHandlerHugePrompt: 37.9 against 53.6 MB).
const (
	minClass   = 17
	numClasses = 6
)

var bodyClasses [numClasses]sync.Pool

// maxClassBuf is the largest class's size.
const maxClassBuf = 1 << (minClass + numClasses - 1)

// classBuf returns a buffer of bodyClasses of at least n bytes, its length its class's size;
// past maxClassBuf, a buffer of n bytes, of no class. Whole answers are read into them too
// (readWhole).
func classBuf(n int) *[]byte {
	if n > maxClassBuf {
		s := make([]byte, n)
		return &s
	}
	k := max(bits.Len(uint(n-1)), minClass) - minClass
	if p, _ := bodyClasses[k].Get().(*[]byte); p != nil {
		return p
	}
	s := make([]byte, 1<<(k+minClass))
	return &s
}

// isClass reports whether a buffer of capacity c belongs in one of bodyClasses.
func isClass(c int) bool {
	return c >= 1<<minClass && c <= maxClassBuf && c&(c-1) == 0
}

// putClass gives a buffer back to its class, its length the class's size again; one of no
// class (isClass) is left to the garbage collector.
func putClass(p *[]byte) {
	if !isClass(cap(*p)) {
		return
	}
	*p = (*p)[:cap(*p)]
	bodyClasses[bits.Len(uint(cap(*p)-1))-minClass].Put(p)
}

// newHeldBody returns a body buffer of at least n bytes, held once (by the handler).
func newHeldBody(n int) *heldBody {
	b := &heldBody{buf: classBuf(n)}
	b.refs.Store(1)
	return b
}

// hold adds a holder.
func (b *heldBody) hold() { b.refs.Add(1) }

// release drops a holder; the last one puts the buffer back.
func (b *heldBody) release() {
	if b.refs.Add(-1) == 0 {
		putClass(b.buf)
		b.buf = nil
	}
}

// holdFor makes m one more holder of the call's pooled body, if it has one.
func (c *call) holdFor(m *h1.MemBody) *h1.MemBody {
	if b := c.held; b != nil {
		b.hold()
		m.OnSent(b.release)
	}
	return m
}

// scratches recycles the memory the chat parser decodes long message contents into
// (openai.Scratch): for a 100k-token prompt with line breaks, 400 KB a request.
var scratches = sync.Pool{New: func() any { return new(openai.Scratch) }}

// maxScratch is the largest scratch put back in the pool: one that a very long body grew is
// left to the garbage collector.
const maxScratch = 2 << 20

// releaseMemory gives back the call's pooled memory, when the request is finished: the body (if no
// transport still holds it) and the parser's scratch. The parsed request and what was taken
// from its message contents must not be used after it.
func (c *call) releaseMemory() {
	if c.held != nil || c.scratch != nil {
		c.req = nil // its message contents may be views of either
	}
	if c.held != nil {
		c.held.release()
		c.held = nil
	}
	if sc := c.scratch; sc != nil {
		c.scratch = nil
		if sc.Cap() <= maxScratch {
			sc.Reset()
			scratches.Put(sc)
		}
	}
}

// bodyReadError is the answer to a request whose body could not be read (err is neither nil,
// io.EOF nor the server's body timeout): 503 when the API server holds as many bytes of bodies
// being received as server.max_pending_body_bytes allows (h1.ErrBodyMemory: the server adds
// Retry-After and closes the connection); 499 client_gone when the client went away before
// its body ended, which is no malformed request of the client's (logged, and counted for its
// tenant, as 499, not 400); 400 otherwise (a malformed chunked body, say).
func bodyReadError(err error) *openai.Error {
	switch {
	case errors.Is(err, h1.ErrBodyMemory):
		return openai.NewError(http.StatusServiceUnavailable, openai.TypeUnavailable, "", "overloaded",
			"the router is receiving as many request bodies as it holds at once (server.max_pending_body_bytes): retry shortly")
	case clientGone(err):
		return openai.NewError(499, "client_gone", "", "client_gone", "the client went away before its request body ended")
	}
	return openai.BadRequest("", "reading request body: %v", err)
}

// clientGone reports whether a body read failed because its connection ended: closed before
// the body's end (both API servers' body readers say io.ErrUnexpectedEOF), reset or aborted.
func clientGone(err error) bool {
	return errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.ECONNABORTED) || errors.Is(err, net.ErrClosed)
}
