package proxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/h1"
	"github.com/kvroute/kvroute/internal/openai"
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
	conn := f.rawPost(t, `{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}]}`)
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

// TestRelayHopByHopHeaders: the headers that belong to one connection, and those its
// Connection header names, are not passed on in either direction; the others are, and so is a
// client's Te: trailers (as httputil.ReverseProxy did); a client's X-Forwarded-For is not.
func TestRelayHopByHopHeaders(t *testing.T) {
	got := make(chan http.Header, 1)
	eng := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		got <- r.Header.Clone()
		w.Header().Set("Connection", "X-Engine-Hop")
		w.Header().Set("X-Engine-Hop", "1")
		w.Header().Set("X-Engine-Kept", "1")
		w.Header().Set("Proxy-Authenticate", "Basic")
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":1,"completion_tokens":1}}`)
	}))
	defer eng.Close()
	f := newFixture(t, spec(eng.URL, "m"))
	resp, body := f.post(t, "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"x"}]}`,
		"Connection", "X-Client-Hop", "X-Client-Hop", "1", "X-Client-Kept", "1", "Keep-Alive", "timeout=5",
		"Proxy-Authorization", "Basic eDp5", "Te", "trailers", "X-Forwarded-For", "10.0.0.1")
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"hi"`) {
		t.Fatalf("answer %d %q", resp.StatusCode, body)
	}
	in := <-got
	for _, k := range []string{"X-Client-Hop", "Keep-Alive", "Proxy-Authorization", "X-Forwarded-For"} {
		if v := in.Get(k); v != "" {
			t.Errorf("the engine got %s: %q", k, v)
		}
	}
	if in.Get("X-Client-Kept") != "1" || in.Get("Te") != "trailers" {
		t.Errorf("the engine got X-Client-Kept %q and Te %q, want 1 and trailers", in.Get("X-Client-Kept"), in.Get("Te"))
	}
	for _, k := range []string{"X-Engine-Hop", "Proxy-Authenticate"} {
		if v := resp.Header.Get(k); v != "" {
			t.Errorf("the client got %s: %q", k, v)
		}
	}
	if resp.Header.Get("X-Engine-Kept") != "1" {
		t.Errorf("the client got X-Engine-Kept %q, want 1", resp.Header.Get("X-Engine-Kept"))
	}
}

// TestStreamEndsAtDone: the client's stream ends (its chunked body's end) as soon as the
// engine's [DONE] is relayed, without waiting for the engine to end its own body.
func TestStreamEndsAtDone(t *testing.T) {
	// Whatever the engine's line ends (WHATWG HTML allows "\n", "\r\n" and a lone "\r"): a
	// stream whose "\r" line ends are read as a line's end only with the byte after them would
	// hold [DONE] until the engine's body ends.
	for _, nl := range []string{"\n", "\r\n", "\r"} {
		t.Run(fmt.Sprintf("%q", nl), func(t *testing.T) { streamEndsAtDone(t, nl) })
	}
}

func streamEndsAtDone(t *testing.T, nl string) {
	release := make(chan struct{})
	done := "data: [DONE]" + nl + nl
	eng := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}"+nl+nl+done)
		w.(http.Flusher).Flush()
		select { // the body's end only once the client has had its own, or after 5 s
		case <-release:
		case <-time.After(5 * time.Second):
		}
	}))
	defer eng.Close()
	f := newFixture(t, spec(eng.URL, "m"))
	// h1.Server, whose EndBody lets a handler end the body before it returns.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &h1.Server{Handler: f.h}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	defer func() {
		close(release)
		srv.Close()
		<-served
	}()
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	start := time.Now()
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Post("http://"+ln.Addr().String()+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	took := time.Since(start)
	if err != nil || resp.StatusCode != http.StatusOK || !strings.HasSuffix(string(body), done) || strings.Contains(string(body), "error") {
		t.Fatalf("answer %d %q, err %v", resp.StatusCode, body, err)
	}
	if took > 4*time.Second {
		t.Errorf("the client's stream ended after %v: it waited for the engine's body to end", took)
	}
}

// TestSSEBodySmallReads: an sseBody read into buffers smaller than what is pending (so that the
// next events are queued behind a part already sent) passes every byte on, in order, and ends
// at [DONE]; the usage chunk the router asked for is dropped. It covers queue's moving what is
// pending back to the start of its buffer.
func TestSSEBodySmallReads(t *testing.T) {
	evs := streamAnswer(300, false)
	var want strings.Builder
	for i, ev := range evs {
		if i != len(evs)-2 { // the usage chunk
			want.WriteString(ev)
		}
	}
	for _, size := range []int{1, 7, 100, 333, copyBufSize - 1, copyBufSize, 3 * copyBufSize} {
		c := &call{dropUsage: true}
		ctx, cancel := context.WithCancelCause(context.Background())
		r := openai.NewSSEReader(strings.NewReader(strings.Join(evs, "")), maxEvent)
		s := &sseBody{c: c, up: io.NopCloser(strings.NewReader("")), r: r, ctx: ctx, cancel: cancel, idle: time.Hour}
		s.timer = time.AfterFunc(time.Hour, func() {})
		var got strings.Builder
		p := make([]byte, size)
		for range 1 << 20 {
			// Vary the read size, so that what is left pending varies too.
			n, err := s.Read(p[:1+got.Len()%size])
			got.Write(p[:n])
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("size %d: %v", size, err)
			}
		}
		_ = s.Close()
		if got.String() != want.String() {
			t.Errorf("size %d: got %d bytes, want %d (first difference at %d)", size, got.Len(), want.Len(), firstDiff(got.String(), want.String()))
		}
		if !c.complete || c.cut || !c.haveUsage {
			t.Errorf("size %d: complete %v, cut %v, usage %v: want complete with usage", size, c.complete, c.cut, c.haveUsage)
		}
	}
}

func firstDiff(a, b string) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// TestSSEBodyAllocs: reading a 300-token stream that arrives at once (several events per read)
// allocates per stream, not per token or per read: the pending buffer, once grown, is reused.
func TestSSEBodyAllocs(t *testing.T) {
	stream := strings.Join(streamAnswer(300, false), "")
	r := openai.NewSSEReader(nil, maxEvent)
	up := strings.NewReader(stream)
	p := make([]byte, copyBufSize)
	allocs := testing.AllocsPerRun(10, func() {
		up.Reset(stream)
		r.Reset(up)
		c := &call{dropUsage: true}
		s := &sseBody{c: c, up: io.NopCloser(up), r: r, cancel: func(error) {}, idle: time.Hour}
		s.timer = time.AfterFunc(time.Hour, func() {})
		for range 1 << 20 {
			if _, err := s.Read(p); err != nil {
				break
			}
		}
		s.timer.Stop()
		if !c.complete {
			t.Fatal("the stream did not complete")
		}
	})
	// The sseBody, the call, the timer and the pending buffer's growth to ~4 kB (a handful);
	// a buffer grown afresh for each read of ~16 events was ~90 allocations.
	if allocs > 40 {
		t.Errorf("%v allocations reading a 300-token stream, want at most 40", allocs)
	}
}
