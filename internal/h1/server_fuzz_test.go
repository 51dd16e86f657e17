package h1

import (
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// FuzzServer feeds arbitrary bytes to a connection of the server: whatever comes, serving it
// must end (the input ends with the connection) without a panic or a hang.
func FuzzServer(f *testing.F) {
	for _, seed := range []string{
		"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
		"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}GET /b HTTP/1.1\r\nHost: x\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\nz",
		"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET / HTTP/1.0\r\n\r\n",
		"HEAD /stream HTTP/1.1\r\nHost: x\r\n\r\n",
		"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: x\r\nContent-Length : 3\r\n\r\nabc",
		"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding:\r\n chunked\r\n\r\n0\r\n\r\n",
		"POST / HTTP/1.0\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000000\r\n\r\nabc",
		"POST /slow HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nab",
	} {
		f.Add([]byte(seed))
	}
	// Short timeouts, so that the body and write timing runs on what the fuzzer sends (a body
	// cut short by the end of the input, a stream the pipe holds).
	s := &Server{WatchAfter: time.Millisecond, BodyReadTimeout: 5 * time.Millisecond, BodyMinRate: 1000,
		WriteStallTimeout: 50 * time.Millisecond, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.ContentLength > 1<<16 {
				w.WriteHeader(http.StatusRequestEntityTooLarge)
				return
			}
			b, _ := io.ReadAll(io.LimitReader(r.Body, 1<<16))
			if r.URL.Path == "/stream" {
				w.(http.Flusher).Flush()
			}
			_, _ = w.Write(b)
		})}
	f.Cleanup(func() {
		s.Close()
		s.wg.Wait()
	})
	f.Fuzz(func(t *testing.T, in []byte) {
		server, client := net.Pipe()
		c, _ := s.newConn(server, s.base(nil))
		if c == nil {
			t.Fatal("server closed")
		}
		served := make(chan struct{})
		go func() {
			defer close(served)
			c.serve()
		}()
		go func() { _, _ = io.Copy(io.Discard, client) }()
		_ = client.SetWriteDeadline(time.Now().Add(2 * time.Second))
		_, _ = client.Write(in)
		client.Close()
		select {
		case <-served:
		case <-time.After(5 * time.Second):
			t.Fatalf("serving %q did not end within 5 s of the connection closing", in)
		}
	})
}
