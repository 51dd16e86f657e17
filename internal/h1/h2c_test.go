package h1

import (
	"bufio"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// h2Frame is an HTTP/2 frame as read off the wire.
type h2Frame struct {
	typ     byte
	stream  uint32
	payload []byte
}

// readH2Frame reads one frame (RFC 9113 section 4.1).
func readH2Frame(r io.Reader) (h2Frame, error) {
	var h [9]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return h2Frame{}, err
	}
	n := int(h[0])<<16 | int(h[1])<<8 | int(h[2])
	f := h2Frame{typ: h[3], stream: binary.BigEndian.Uint32(h[5:]) &^ (1 << 31), payload: make([]byte, n)}
	_, err := io.ReadFull(r, f.payload)
	return f, err
}

// TestHTTP2PriorKnowledgeRefused: a client that opens with HTTP/2's preface on the plain port
// gets what an HTTP/2 client understands, a SETTINGS frame then a GOAWAY with
// HTTP_1_1_REQUIRED, and then the connection's graceful close (EOF, not a reset), from both
// servers; the handler never sees it. Go's own HTTP/2 client reports the code.
func TestHTTP2PriorKnowledgeRefused(t *testing.T) {
	var calls atomic.Int32
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { calls.Add(1) })
	for _, srv := range bothServers(t, guard{}, h) {
		t.Run(srv.name, func(t *testing.T) {
			t.Run("raw", func(t *testing.T) {
				c, br := dialBuffered(t, srv.addr)
				// The preface, the client's SETTINGS and a HEADERS frame's header (a request on
				// its way that the server does not read).
				req := h2Preface + "\x00\x00\x00\x04\x00\x00\x00\x00\x00" + "\x00\x00\x10\x01\x05\x00\x00\x00\x01" + strings.Repeat("\x00", 16)
				if _, err := io.WriteString(c, req); err != nil {
					t.Fatal(err)
				}
				f, err := readH2Frame(br)
				if err != nil || f.typ != 0x4 || f.stream != 0 || len(f.payload) != 0 {
					t.Fatalf("first frame: type %d, stream %d, %d bytes, %v; want an empty SETTINGS", f.typ, f.stream, len(f.payload), err)
				}
				f, err = readH2Frame(br)
				if err != nil || f.typ != 0x7 || f.stream != 0 || len(f.payload) < 8 {
					t.Fatalf("second frame: type %d, stream %d, %d bytes, %v; want a GOAWAY", f.typ, f.stream, len(f.payload), err)
				}
				last, code, debug := binary.BigEndian.Uint32(f.payload), binary.BigEndian.Uint32(f.payload[4:]), string(f.payload[8:])
				if last != 0 || code != 0xd || !strings.Contains(debug, "HTTP/1.1") {
					t.Errorf("GOAWAY: last stream %d, code %#x, %q; want 0, HTTP_1_1_REQUIRED (0xd), a text naming HTTP/1.1", last, code, debug)
				}
				if rest, err := io.ReadAll(br); err != nil || len(rest) != 0 {
					t.Errorf("after the GOAWAY: %q, %v; want EOF (a graceful close)", rest, err)
				}
			})
			t.Run("Go's HTTP/2 client", func(t *testing.T) {
				var p http.Protocols
				p.SetUnencryptedHTTP2(true)
				tr := &http.Transport{Protocols: &p}
				defer tr.CloseIdleConnections()
				resp, err := (&http.Client{Transport: tr, Timeout: 5 * time.Second}).Get("http://" + srv.addr + "/")
				if err == nil {
					resp.Body.Close()
					t.Fatalf("got %s over HTTP/2, want an error", resp.Status)
				}
				var ne net.Error
				if !strings.Contains(err.Error(), "HTTP_1_1_REQUIRED") || errors.As(err, &ne) && ne.Timeout() {
					t.Errorf("error %v; want the server's GOAWAY, HTTP_1_1_REQUIRED", err)
				}
			})
			// HTTP/1.1 on the same server is served as ever.
			c, br := dialBuffered(t, srv.addr)
			if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
				t.Fatal(err)
			}
			if resp, err := http.ReadResponse(bufio.NewReader(br), nil); err != nil || resp.StatusCode != http.StatusOK {
				t.Errorf("HTTP/1.1 after: %v, %v; want 200", resp, err)
			}
		})
	}
	if n := calls.Load(); n != 2 {
		t.Errorf("the handler ran %d times, want 2 (the HTTP/1.1 requests)", n)
	}
}
