package h1

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"testing"
)

// goRequest is where Go's parser finds one request in a stream: its start, the end of its head
// and the end of its body (-1: Go could not read the body).
type goRequest struct{ start, headEnd, end int }

// goRequests reads in as Go's server does, one request after the other, until a request or its
// body does not parse.
func goRequests(in []byte) []goRequest {
	src := bytes.NewReader(in)
	br := bufio.NewReader(src)
	var out []goRequest
	pos := func() int { return len(in) - src.Len() - br.Buffered() }
	for range 1000 {
		start := pos()
		req, err := http.ReadRequest(br)
		if err != nil {
			return out
		}
		r := goRequest{start: start, headEnd: pos(), end: -1}
		if _, err := io.Copy(io.Discard, req.Body); err == nil {
			r.end = pos()
		}
		out = append(out, r)
		if r.end < 0 {
			return out
		}
	}
	return out
}

// naiveSmuggling applies headScan's rules to a whole head, line by line.
func naiveSmuggling(head []byte) bool {
	lines := bytes.Split(head, []byte("\n"))
	v := bytes.TrimSuffix(lines[0], []byte("\r"))
	old := bytes.HasSuffix(v, []byte("HTTP/1.0")) || len(v) >= 8 && bytes.HasPrefix(v[len(v)-8:], []byte("HTTP/0."))
	var cl, te bool
	for _, l := range lines[1:] {
		l = bytes.TrimSuffix(l, []byte("\r"))
		if len(l) == 0 {
			break
		}
		if l[0] == ' ' || l[0] == '\t' {
			return true
		}
		name, _, _ := bytes.Cut(l, []byte(":"))
		if bytes.ContainsAny(name, " \t") {
			return true
		}
		switch string(bytes.ToLower(name)) {
		case "content-length":
			cl = true
		case "transfer-encoding":
			te = true
		}
	}
	return cl && te || te && old
}

// FuzzFramer checks the framer, which follows requests in the bytes net/http's server reads,
// against Go's own parser: fed any stream, in any pieces, it finds each request's end where
// Go does, refuses exactly the heads that a line-by-line reading of the same rules refuses, and
// never loses track of a stream that Go reads.
func FuzzFramer(f *testing.F) {
	for _, seed := range []string{
		"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabcGET / HTTP/1.1\r\nHost: x\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3;e=1\r\nabc\r\nA\r\n0123456789\r\n0\r\nX-T: 1\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: x\r\nContent-Length : 3\r\n\r\nabc",
		"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding:\r\n chunked\r\n\r\n0\r\n\r\n",
		"POST / HTTP/1.0\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
		"GET / HTTP/1.1\nHost: x\nContent-Length: 1\n\naGET / HTTP/1.1\nHost: x\n\n",
		"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\na",
		"POST / HTTP/1.1\r\nHost: x\r\ntransfer-encoding: CHUNKED\r\n\r\n0\r\n\r\n",
	} {
		f.Add([]byte(seed), uint8(0))
		f.Add([]byte(seed), uint8(7))
	}
	f.Fuzz(func(t *testing.T, in []byte, piece uint8) {
		reqs := goRequests(in)
		var fr framer
		fr.head.reset(false)
		fed := 0
		feedTo := func(end int) { // in pieces of 1 + piece%16 bytes
			for fed < end {
				n := min(end-fed, 1+int(piece%16))
				fr.feed(in[fed : fed+n])
				fed += n
			}
		}
		for i, r := range reqs {
			feedTo(r.headEnd)
			want := naiveSmuggling(in[r.start:r.headEnd])
			if b := fr.bad.Load(); (b != nil) != want || b != nil && b.index != int64(i) {
				t.Fatalf("request %d (head %q), which Go reads: framer refuses %+v; line by line: refuse %v", i, in[r.start:r.headEnd], b, want)
			}
			if want || r.end < 0 {
				return
			}
			feedTo(r.end)
			if fr.heads != int64(i+1) || fr.st != frHead || fr.head.st != hsRequestLine || fr.head.n != 0 {
				t.Fatalf("after request %d (%q) ended at %d: framer has %d heads, state %d, head state %d with %d bytes",
					i, in[r.start:r.end], r.end, fr.heads, fr.st, fr.head.st, fr.head.n)
			}
		}
	})
}
