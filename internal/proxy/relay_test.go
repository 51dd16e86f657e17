package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestStreamRelayOneWritePerChunk: events that the engine sends in one chunk reach the client
// in one write (one HTTP chunk), not one write each; every event arrives, in order.
func TestStreamRelayOneWritePerChunk(t *testing.T) {
	const tokens = 6
	eng := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		var b strings.Builder
		for i := range tokens {
			fmt.Fprintf(&b, "data: {\"choices\":[{\"delta\":{\"content\":\"t%d\"}}]}\n\n", i)
		}
		b.WriteString("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":6}}\n\ndata: [DONE]\n\n")
		_, _ = io.WriteString(w, b.String()) // one write, one chunk
	}))
	defer eng.Close()
	f := newFixture(t, spec(eng.URL, "m"))
	conn, err := net.Dial("tcp", f.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	body := `{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}]}`
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	br := bufio.NewReader(conn)
	for { // the head
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if line == "\r\n" {
			break
		}
	}
	var chunks []string
	for range 100 {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		n, err := strconv.ParseInt(strings.TrimSpace(line), 16, 64)
		if err != nil {
			t.Fatalf("chunk size line %q: %v", line, err)
		}
		if n == 0 {
			break
		}
		b := make([]byte, n+2)
		if _, err := io.ReadFull(br, b); err != nil {
			t.Fatal(err)
		}
		chunks = append(chunks, string(b[:n]))
	}
	all := strings.Join(chunks, "")
	for i := range tokens {
		if !strings.Contains(all, fmt.Sprintf(`"t%d"`, i)) {
			t.Errorf("token %d missing from %q", i, all)
		}
	}
	if !strings.HasSuffix(all, "data: [DONE]\n\n") || strings.Contains(all, "usage") {
		t.Errorf("stream %q: want the tokens then [DONE], the usage chunk dropped", all)
	}
	// The first event goes out as soon as it is read (the time to first token); the others,
	// already received with it, together.
	if len(chunks) > 2 {
		t.Errorf("the client got %d writes for one engine chunk of %d events: %q", len(chunks), tokens+2, chunks)
	}
}
