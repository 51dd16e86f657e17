package h1

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// A request with a MemBody reaches the server byte for byte as http.Request.Write frames it,
// and its body is taken as it lies (no copy), over a connection that is then reused.
func TestMemBodyBytesOnTheWire(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	body := bytes.Repeat([]byte("0123456789abcdef"), 40<<10) // 640 KB: many socket buffers
	mk := func(b io.ReadCloser) *http.Request {
		req, err := http.NewRequest(http.MethodPost, "http://"+ln.Addr().String()+"/v1/chat/completions?a=1", b)
		if err != nil {
			t.Fatal(err)
		}
		req.ContentLength = int64(len(body))
		req.Header.Set("X-Request-Id", "r1")
		req.Header.Set("Content-Type", "application/json")
		return req
	}
	var want bytes.Buffer
	if err := mk(io.NopCloser(bytes.NewReader(body))).Write(&want); err != nil {
		t.Fatal(err)
	}
	got := make(chan []byte, 2)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- nil
			return
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		br := bufio.NewReader(c)
		for range 2 { // two requests on the one connection
			b := make([]byte, want.Len())
			if _, err := io.ReadFull(br, b); err != nil {
				got <- nil
				return
			}
			got <- b
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	}()
	tr := newTransport(t)
	for i := range 2 {
		mb := NewMemBody(body)
		if i == 1 { // the second in three parts, as a proxy splices a field in: the same bytes
			mb = NewMemBodyParts(body[:1000], body[1000:1001], nil, body[1001:])
		}
		resp, err := tr.RoundTrip(mk(mb))
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if s := readAll(t, resp); s != "ok" {
			t.Fatalf("request %d: answer %q", i, s)
		}
		b := <-got
		if !bytes.Equal(b, want.Bytes()) {
			t.Fatalf("request %d: the server got %d bytes unlike http.Request.Write's %d (head %q)", i, len(b), want.Len(), b[:min(len(b), 300)])
		}
	}
}

// A MemBody in parts reads as the parts joined, through any buffer size.
func TestMemBodyPartsRead(t *testing.T) {
	parts := [][]byte{[]byte(`{"model":"m"`), nil, []byte(`,"stream_options":{"include_usage":true}`), []byte(`}`)}
	want := string(bytes.Join(parts, nil))
	for _, size := range []int{1, 3, 7, 64} {
		mb := NewMemBodyParts(parts...)
		if mb.Len() != len(want) {
			t.Errorf("Len %d, want %d", mb.Len(), len(want))
		}
		var got []byte
		buf := make([]byte, size)
		for range 1000 {
			n, err := mb.Read(buf)
			got = append(got, buf[:n]...)
			if err == io.EOF {
				break
			}
		}
		if string(got) != want {
			t.Errorf("read %d bytes at a time: %q, want %q", size, got, want)
		}
	}
}

// headWriter takes a MemBody without copying it (in parts, each as it lies), and anything else
// after the head.
func TestHeadWriter(t *testing.T) {
	body := []byte(`{"model":"m"}`)
	req, _ := http.NewRequest(http.MethodPost, "http://x/v1", NewMemBody(body))
	req.ContentLength = int64(len(body))
	w := newHeadWriter(make([]byte, 0, 64)) // as writeMem makes it
	if err := req.Write(&w); err != nil {
		t.Fatal(err)
	}
	if len(w.body) != 1 || &w.body[0][0] != &body[0] {
		t.Errorf("the body was copied (or not taken): body %q", w.body)
	}
	if !strings.HasSuffix(string(w.head), "\r\n\r\n") || strings.Contains(string(w.head), "model") {
		t.Errorf("head %q: want the head alone", w.head)
	}
	ins := []byte(`,"x":1`)
	req, _ = http.NewRequest(http.MethodPost, "http://x/v1", NewMemBodyParts(body[:12], ins, body[12:]))
	req.ContentLength = int64(len(body) + len(ins))
	wp := newHeadWriter(nil)
	if err := req.Write(&wp); err != nil {
		t.Fatal(err)
	}
	if len(wp.body) != 3 || &wp.body[0][0] != &body[0] || &wp.body[1][0] != &ins[0] || &wp.body[2][0] != &body[12] {
		t.Errorf("the parts were copied (or not taken): %q", wp.body)
	}
	// Chunked (no length): net/http frames the body itself, all of it goes after the head.
	req, _ = http.NewRequest(http.MethodPost, "http://x/v1", NewMemBody(body))
	req.ContentLength = -1
	w2 := newHeadWriter(nil)
	if err := req.Write(&w2); err != nil {
		t.Fatal(err)
	}
	var want bytes.Buffer
	req, _ = http.NewRequest(http.MethodPost, "http://x/v1", io.NopCloser(bytes.NewReader(body)))
	req.ContentLength = -1
	_ = req.Write(&want)
	if diff := cmp.Diff(want.String(), string(w2.head)+string(bytes.Join(w2.body, nil))); diff != "" {
		t.Errorf("chunked request (-net/http +headWriter):\n%s", diff)
	}
}

// OnSent's function is called once, by the time RoundTrip returns, for the body the Transport
// sent and for each one GetBody made (a request sent again on a new connection), on success
// and on failure; never for a request handed to Fallback, which may still be reading it.
func TestMemBodyOnSent(t *testing.T) {
	post := func(tr *Transport, url string, withGetBody bool) (calls []int, err error) {
		made := 0
		mk := func() *MemBody {
			i := made
			made++
			m := NewMemBody([]byte("{}"))
			m.OnSent(func() { calls = append(calls, i) })
			return m
		}
		req, err := http.NewRequest(http.MethodPost, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Body, req.ContentLength = mk(), 2
		if withGetBody {
			req.GetBody = func() (io.ReadCloser, error) { return mk(), nil }
		}
		resp, err := tr.RoundTrip(req)
		if err == nil {
			if got := readAll(t, resp); got != "ok" && got != "tls" {
				t.Errorf("answer %q", got)
			}
		}
		return calls, err
	}

	ok := okServer(t)
	if calls, err := post(newTransport(t), ok.URL, false); err != nil || !slices.Equal(calls, []int{0}) {
		t.Errorf("a request sent: OnSent calls %v (error %v), want [0]", calls, err)
	}

	// The server answers the first request on its first connection, reads the second and closes
	// that connection without an answer: the Transport sends it again on a new one, with
	// GetBody's body.
	var conns atomic.Int64
	url := rawServer(t, func(c net.Conn) {
		n := conns.Add(1)
		br := bufio.NewReader(c)
		for k := range 2 {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			_, _ = io.Copy(io.Discard, req.Body)
			if k == 1 && n == 1 {
				return
			}
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	})
	tr := newTransport(t)
	tr.ResendAfterIdle = time.Nanosecond
	if calls, err := post(tr, url, true); err != nil || !slices.Equal(calls, []int{0}) {
		t.Errorf("first request: OnSent calls %v (error %v), want [0]", calls, err)
	}
	if calls, err := post(tr, url, true); err != nil || len(calls) != 2 || calls[0]+calls[1] != 1 {
		t.Errorf("a request sent again: OnSent calls %v (error %v), want 0 and 1 once each", calls, err)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	if calls, err := post(newTransport(t), "http://"+addr, false); err == nil || !slices.Equal(calls, []int{0}) {
		t.Errorf("a request that failed: OnSent calls %v (error %v), want [0] and an error", calls, err)
	}

	tls := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "tls") }))
	defer tls.Close()
	ftr := New(tls.Client().Transport.(*http.Transport))
	defer ftr.CloseIdleConnections()
	if calls, err := post(ftr, tls.URL, false); err != nil || len(calls) != 0 {
		t.Errorf("a request through Fallback: OnSent calls %v (error %v), want none", calls, err)
	}
}
