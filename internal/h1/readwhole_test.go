package h1

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestReadWhole: a large body sent in pieces with pauses between them is read whole, in order,
// with io.EOF at its end; the socket's threshold is back to one byte when ReadWhole returns (or
// the next request's short head, on the same connection, would never wake the server).
func TestReadWhole(t *testing.T) {
	const size = 400 << 10
	body := make([]byte, size)
	for i := range body {
		body[i] = byte('a' + i%26)
	}
	s := &Server{}
	type result struct {
		n      int
		err    error
		same   bool
		lowat  int // the socket's SO_RCVLOWAT after ReadWhole; -1 where it cannot be read
		viaAPI bool
	}
	results := make(chan result, 2)
	addr := startServer(t, s, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		wr, ok := r.Body.(interface{ ReadWhole([]byte) (int, error) })
		res := result{viaAPI: ok, lowat: -1}
		if ok && r.ContentLength > 0 {
			p := make([]byte, r.ContentLength)
			res.n, res.err = wr.ReadWhole(p)
			res.same = bytes.Equal(p, body)
			if c := s.connOf(r.RemoteAddr); c != nil {
				res.lowat = lowWater(c.rwc)
			}
		}
		results <- res
		_, _ = io.WriteString(w, "ok")
	}))
	c, br := dialBuffered(t, addr)
	go func() {
		// The head with the first bytes, then the rest in eight pieces 5 ms apart.
		_, _ = fmt.Fprintf(c, "POST /big HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n", size)
		piece := size / 8
		for i := 0; i < size; i += piece {
			if _, err := c.Write(body[i:min(i+piece, size)]); err != nil {
				return
			}
			time.Sleep(5 * time.Millisecond) // pacing the sender, not waiting for anything
		}
		_, _ = io.WriteString(c, "GET /small HTTP/1.1\r\nHost: x\r\n\r\n")
	}()
	for i, path := range []string{"/big", "/small"} {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("answer %d (%s): %v", i, path, err)
		}
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 || string(b) != "ok" {
			t.Errorf("answer %d (%s): %d %q", i, path, resp.StatusCode, b)
		}
	}
	big := <-results
	if !big.viaAPI || big.n != size || big.err != io.EOF || !big.same {
		t.Errorf("ReadWhole of %d bytes: offered %v, read %d, err %v, bytes equal %v; want %d, io.EOF, equal",
			size, big.viaAPI, big.n, big.err, big.same, size)
	}
	if big.lowat != -1 && big.lowat != 1 {
		t.Errorf("SO_RCVLOWAT after ReadWhole: %d, want 1", big.lowat)
	}
	<-results // the GET's
}

// TestReadWholeShortBody: a client that closes before the body it announced gets the
// error a read would give, not a wait.
func TestReadWholeShortBody(t *testing.T) {
	errs := make(chan error, 1)
	addr := startServer(t, &Server{}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := make([]byte, r.ContentLength)
		_, err := r.Body.(interface{ ReadWhole([]byte) (int, error) }).ReadWhole(p)
		errs <- err
	}))
	c, _ := dialBuffered(t, addr)
	const size = 200 << 10
	_, _ = io.WriteString(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: "+strconv.Itoa(size)+"\r\n\r\n"+strings.Repeat("x", size/2))
	_ = c.(interface{ CloseWrite() error }).CloseWrite()
	select {
	case err := <-errs:
		if err == nil || err == io.EOF {
			t.Errorf("ReadWhole of a body cut at half: err %v, want an unexpected EOF", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("ReadWhole still waits 5 s after the client closed")
	}
}
